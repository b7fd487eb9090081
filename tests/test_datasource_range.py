"""``spark.read.format("spanner_change_stream")`` as a user calls it: a database, a stream,
start and end. The source runs the initial query, follows splits and merges in its tasks, and
gives every record of the range once, the same as reading each partition from its start."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spark_backend.demo.server import DemoServer
from spark_backend.demo.world import MUTABLE_KEY_RANGE, build_world
from spark_backend.model.stream_records import from_stream_record
from spark_backend.model.timestamps import format_ns
from spark_backend.spark.datasource import (
    SpannerChangeStreamDataSource,
    SpannerChangeStreamDataSourceReader,
)
from tests.test_pull_demo import HEARTBEAT_MS, truth_records

DATABASE = {"project": "demo-project", "instance": "demo-instance", "database": "demo-db"}


def options(world, host: str, **more) -> dict[str, str]:
    return {**DATABASE, "host": host, "stream": world.stream, "start": format_ns(world.start),
            "end": format_ns(world.end), "heartbeat_ms": str(HEARTBEAT_MS), **more}


def frame(spark, opts: dict):
    """As the README shows a user: register the source, then read."""
    spark.dataSource.register(SpannerChangeStreamDataSource)
    return spark.read.format("spanner_change_stream").options(**opts).load()


def read(spark, opts: dict):
    return frame(spark, opts).toArrow()


def records(table) -> list[tuple]:
    """(token, kind, ts, transaction, sequence) of the rows a change stream query returns
    for a partition (not the initial query's, nor the reader's own end rows)."""
    rows = table.filter(pc.and_(pc.is_valid(table["partition_token"]),
                                pc.is_in(table["kind"], pa.array(
                                    ["data_change", "heartbeat", "child_partitions"]))))
    return list(zip(*(rows[c].to_pylist() for c in (
        "partition_token", "kind", "ts_ns", "server_transaction_id", "record_sequence")),
        strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("dialect, given, tasks", [
    ("googlesql", "googlesql", ""),
    ("postgresql", "", ""),  # the database's own dialect, asked
    ("googlesql", "", "2"),  # merges whose parents other tasks read
])
def test_a_whole_range_is_every_record_once(spark, dialect, given, tasks):
    world = build_world(7, 0.1)
    with DemoServer(world, dialect=dialect) as server:
        table = read(spark, options(world, server.start(), dialect=given, tasks=tasks))
    got = records(table)
    assert len(got) == len(set(got)), "no record twice"
    assert set(got) == truth_records(world)
    kinds = table["kind"].to_pylist()
    initial = [t for t, k in zip(table["partition_token"].to_pylist(), kinds, strict=True)
               if k == "child_partitions" and t is None]
    assert initial, "the initial query's child partitions records come first-hand too"
    ends = table.filter(pc.equal(table["kind"], "partition_end"))
    assert ends.num_rows == len(world.partitions)
    assert set(ends["partition_token"].to_pylist()) == {p.token for p in world.partitions}
    assert "incomplete" not in str(ends["extra"].to_pylist())


def mutable_truth(world) -> set[tuple]:
    """The data change records of every partition of a MUTABLE_KEY_RANGE world, queried in
    windows of 30 minutes (the most such a query may span)."""
    out = set()
    for p in world.partitions:
        t, last = p.start, world.end if p.end is None else min(p.end, world.end)
        while t < last:
            upto = min(world.end, t + 30 * 60 * 10**9)
            for record in world.query(p.token, t, upto, HEARTBEAT_MS):
                row = from_stream_record(record, p.token)
                if row["kind"] == "data_change" and t <= row["ts_ns"] <= upto:
                    out.add((p.token, "data_change", row["ts_ns"],
                             row["server_transaction_id"], row["record_sequence"]))
            t = upto
    return out


@pytest.mark.slow
def test_a_mutable_key_range_stream_follows_its_moves(spark):
    world = build_world(7, 0.1, partition_mode=MUTABLE_KEY_RANGE)
    with DemoServer(world) as server:
        table = read(spark, options(world, server.start(), tasks="3"))
    tokens = set(table["partition_token"].drop_null().to_pylist())
    assert tokens == {p.token for p in world.partitions}
    # data change records (heartbeats depend on the reader's 30-minute windows in this mode)
    got = [r for r in records(table) if r[1] == "data_change"]
    assert len(got) == len(set(got))
    assert set(got) == mutable_truth(world)

@pytest.mark.parametrize("change, said", [
    ({"start": None}, "Option 'start' is required."),
    ({"end": "tomorrow"}, "Option 'end' is not a time"),
    ({"end": "2020-01-01T00:00:00Z"}, "is before 'start'"),
    ({"heartbeat_ms": "ten"}, "Option 'heartbeat_ms' must be an integer, not 'ten'."),
    ({"dialect": "mysql"}, "Unknown dialect 'mysql'"),
    ({"stream": "no such"}, "stream"),
])
def test_options_a_user_gets_wrong_are_named(change, said):
    opts = {**DATABASE, "stream": "S", "start": "2026-01-05T09:00:00Z",
            "end": "2026-01-05T10:00:00Z"}
    opts.update(change)
    opts = {k: v for k, v in opts.items() if v is not None}
    with pytest.raises(ValueError, match=None) as wrong:
        SpannerChangeStreamDataSourceReader(opts)
    assert said in str(wrong.value)


@pytest.mark.slow
def test_the_readmes_example_counts_the_data_changes_by_table(spark):
    world = build_world(7, 0.1)
    with DemoServer(world) as server:
        records = frame(spark, options(world, server.start()))
        by_table = records.where("kind = 'data_change'").groupBy("table_name",
                                                                 "mod_type").count().toArrow()
    want = {r for r in truth_records(world) if r[1] == "data_change"}
    assert sum(by_table["count"].to_pylist()) == len(want)
    assert set(by_table["table_name"].to_pylist()) == set(world.tables)
