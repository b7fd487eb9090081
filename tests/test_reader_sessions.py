"""The reader's Spanner sessions, seen from the source (the demo server, through the unchanged
google-cloud-spanner client): partition reads reuse them, a read stopped by a task's budget
gives its session back, a session the source forgot is replaced."""

from __future__ import annotations

import json
import os

os.environ["SPANNER_DISABLE_BUILTIN_METRICS"] = "true"

import pytest

from spark_backend.demo.server import DemoServer
from spark_backend.jobs.pull_plan import Plan
from spark_backend.model.records import to_arrow_batch
from spark_backend.spanner.connect import SpannerTarget, open_database
from spark_backend.spanner.reader import read_partition_rows
from spark_backend.spanner.workflow import read_partitions
from spark_backend.spark.packing import packed, packed_rows
from tests.support.demo_cache import demo_world

HEARTBEAT_MS = 10_000


@pytest.fixture(scope="module")
def world():
    return demo_world(7)


def _roots(db, world) -> list[tuple[str, int]]:
    initial = list(read_partition_rows(db, "googlesql", world.stream, None, world.start,
                                       world.end, HEARTBEAT_MS))
    return [(c["token"], r["ts_ns"]) for r in initial if r["kind"] == "child_partitions"
            for c in json.loads(r["child_partitions"])]


def _live_sessions(db) -> list[str]:
    return [s.name for s in db.spanner_api.list_sessions(database=db.name)]


def _data(rows) -> set[tuple]:
    return {(r["partition_token"], r["ts_ns"], r["server_transaction_id"], r["record_sequence"])
            for r in rows if r["kind"] == "data_change"}


def _budget_rounds(world, db, budget: int = 2_000, **kw) -> tuple[list[dict], int]:
    plan = Plan(set())  # the driver's planning of the next task, as in a pull
    plan.offer(_roots(db, world))
    rows: list[dict] = []
    rounds = 0
    while plan.ready:
        rounds += 1
        parts = plan.take()
        got = list(read_partitions(db, "googlesql", world.stream, parts, world.end,
                                   HEARTBEAT_MS, threads=4, max_rows=budget, **kw))
        rows += got
        plan.task_ended(parts, list(packed_rows([packed(to_arrow_batch(got))])))
        assert rounds < 200
    return rows, rounds


@pytest.mark.slow  # integration-heavy: full-world reads from the demo server, ~11 s CPU
def test_partition_reads_reuse_sessions_one_per_read_in_progress(world):
    with DemoServer(world) as server:
        db = open_database(SpannerTarget("p", "i", "d", "googlesql", server.address))
        rows = list(read_partitions(db, "googlesql", world.stream, _roots(db, world),
                                    world.end, HEARTBEAT_MS, threads=4))
        counters = server.counters
        live = _live_sessions(db)
    assert len(_data(rows)) == world.num_data_change_records
    assert counters["queries"] > len(world.partitions)  # every partition, and the initial query
    # Without reuse: one session per query. With it: one per read running at once.
    assert counters["sessions_created"] <= 4
    assert len(live) == counters["sessions_created"]  # none deleted, none lost: all idle


@pytest.mark.slow  # integration-heavy: full-world reads from the demo server, ~11 s CPU
def test_reads_stopped_by_a_budget_give_their_sessions_back_and_continue(world):
    """Closed at the stop, a read gives its session back."""
    with DemoServer(world, latency_ms=1.0) as server:
        db = open_database(SpannerTarget("p", "i", "d", "googlesql", server.address))
        rows, rounds = _budget_rounds(world, db)
        counters = server.counters
    assert rounds > 3  # the budget stopped reads, which went on where they stopped
    assert any(r["kind"] == "partition_end" and '"budget"' in r["extra"] for r in rows)
    assert len(_data(rows)) == world.num_data_change_records
    assert counters["sessions_created"] <= 4


def test_a_session_the_source_forgot_is_replaced(world):
    root = world.roots[0]
    with DemoServer(world) as server:
        db = open_database(SpannerTarget("p", "i", "d", "googlesql", server.address))
        first = list(read_partition_rows(db, "googlesql", world.stream, root.token, root.start,
                                         world.end, HEARTBEAT_MS))
        for name in _live_sessions(db):  # as Spanner does with sessions idle for an hour
            db.spanner_api.delete_session(name=name)
        again = list(read_partition_rows(db, "googlesql", world.stream, root.token, root.start,
                                         world.end, HEARTBEAT_MS))
        live = _live_sessions(db)
    assert again == first
    assert json.loads(again[-1]["extra"])["state"] == "finished"
    assert len(live) == 1


def test_each_stop_is_continued_by_a_query_of_its_own_and_the_rows_number_on():
    """Tasks keep nothing for each other: the next task continues a stopped partition with a
    new query (the initial query, each partition once, then one more per stop); the rows are
    all there once, and a partition's rows are numbered on across the tasks."""
    world = demo_world(7, 0.3)  # 7,219 records: still more than 3 stops at 600 rows a task
    with DemoServer(world, latency_ms=1.0) as server:
        db = open_database(SpannerTarget("p", "i", "d", "googlesql", server.address))
        rows, rounds = _budget_rounds(world, db, budget=600)
        queries = server.counters["queries"]
    assert rounds > 3 and len(_data(rows)) == world.num_data_change_records
    stops = sum(1 for r in rows if r["kind"] == "partition_end" and '"budget"' in r["extra"])
    assert stops > 3 and queries == 1 + len(world.partitions) + stops
    lines: dict[str, list[int]] = {}  # one sequence per partition: 1, 2, 3, ...
    for r in rows:
        if r["kind"] in ("data_change", "heartbeat", "child_partitions"):
            lines.setdefault(r["partition_token"], []).append(r["line"])
    assert all(seq == list(range(1, len(seq) + 1)) for seq in lines.values())
