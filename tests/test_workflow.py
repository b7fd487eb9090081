"""The doc's query workflow example (child_token_1..4, a merge) through the in-task workflow
and through the cache's scheduling of the next wave."""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
import pytest

from spark_backend.cache.store import Cache
from spark_backend.model.records import from_change_record, partition_end, to_arrow_batch
from spark_backend.model.timestamps import parse_ns
from spark_backend.spanner import workflow
from spark_backend.spanner.workflow import _Workflow
from tests.support.waiting import ThreadClock

T0 = parse_ns("2022-05-01T09:00:01Z")
T_MERGE = parse_ns("2022-05-01T09:30:15Z")
END = parse_ns("2022-05-01T10:00:00Z")

INITIAL = [
    {"child_partitions_record": {
        "start_timestamp": "2022-05-01T09:00:01Z", "record_sequence": "1000012389",
        "child_partitions": [{"token": "child_token_1", "parent_partition_tokens": [None]},
                             {"token": "child_token_2", "parent_partition_tokens": [None]}]}},
    {"child_partitions_record": {
        "start_timestamp": "2022-05-01T09:00:01Z", "record_sequence": "1000012390",
        "child_partitions": [{"token": "child_token_3", "parent_partition_tokens": [None]}]}},
]
MERGE_RECORD = {"child_partitions_record": {
    "start_timestamp": "2022-05-01T09:30:15Z", "record_sequence": "1000012389",
    "child_partitions": [{"token": "child_token_4",
                          "parent_partition_tokens": ["child_token_2", "child_token_3"]}]}}


def _heartbeat(ts: str) -> dict:
    return {"heartbeat_record": {"timestamp": ts}}


# What each partition returns (the doc: 2 and 3 both return the same merge record).
SERVED = {
    "child_token_1": [_heartbeat("2022-05-01T09:10:00Z")],
    "child_token_2": [_heartbeat("2022-05-01T09:20:00Z"), MERGE_RECORD],
    "child_token_3": [_heartbeat("2022-05-01T09:25:00Z"), MERGE_RECORD],
    "child_token_4": [_heartbeat("2022-05-01T09:40:00Z")],
}


class FakeSource:
    """Records every query (token, start) and which partitions had finished at that moment."""

    def __init__(self):
        self.queries: list[tuple[str, int, frozenset]] = []
        self.finished: set[str] = set()
        self.lock = threading.Lock()

    def read(self, token: str, start_ns: int):
        with self.lock:
            self.queries.append((token, start_ns, frozenset(self.finished)))
        child_start = None
        for record in SERVED[token]:
            row = from_change_record(record, token)
            if row["kind"] == "child_partitions":
                child_start = row["ts_ns"]
            yield row
        with self.lock:
            self.finished.add(token)
        if child_start is not None:
            yield partition_end(token, "finished", child_start, read_from=start_ns,
                                end=child_start)
        else:
            yield partition_end(token, "open", END, read_from=start_ns)


def test_merge_child_read_once_after_both_parents_in_one_task():
    source = FakeSource()
    roots = [("child_token_1", T0), ("child_token_2", T0), ("child_token_3", T0)]
    rows = list(_Workflow(source.read, threads=3, follow=True).rows(roots))
    reads = [q for q in source.queries if q[0] == "child_token_4"]
    assert len(reads) == 1, "child_token_4 must be queried exactly once"
    token, start, finished_then = reads[0]
    assert start == T_MERGE  # the child partitions record's start_timestamp
    assert {"child_token_2", "child_token_3"} <= finished_then
    assert sorted(q[0] for q in source.queries) == [
        "child_token_1", "child_token_2", "child_token_3", "child_token_4"]
    assert sum(r["kind"] == "child_partitions" for r in rows) == 2  # both parents returned it


def test_merge_across_tasks_is_left_to_the_next_wave(tmp_path):
    """Parents in different tasks: neither task reads the merge child; the cache schedules it
    once both parents are finished, from the record's start_timestamp, exactly once."""
    task_a, task_b = FakeSource(), FakeSource()
    rows_a = list(_Workflow(task_a.read, 2, True).rows([("child_token_1", T0),
                                                          ("child_token_2", T0)]))
    rows_b = list(_Workflow(task_b.read, 2, True).rows([("child_token_3", T0)]))
    assert all(q[0] != "child_token_4" for q in task_a.queries + task_b.queries)

    cache = Cache(tmp_path / "c.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull = cache.begin_pull("s", "test", T0, END, 10_000)
    initial = [from_change_record(r, None) for r in INITIAL]
    cache.ingest("s", pull, pa.Table.from_batches([to_arrow_batch(initial)]))
    assert cache.frontier("s", END) == [
        ("child_token_1", T0), ("child_token_2", T0), ("child_token_3", T0)]
    cache.ingest("s", pull, pa.Table.from_batches([to_arrow_batch(rows_a)]))
    # Only one parent of child_token_4 finished: it must wait.
    assert [t for t, _ in cache.frontier("s", END)] == ["child_token_3"]
    cache.ingest("s", pull, pa.Table.from_batches([to_arrow_batch(rows_b)]))
    assert cache.frontier("s", END) == [("child_token_4", T_MERGE)]

    edges = cache.con.execute(
        "SELECT parent, child FROM edges ORDER BY child, parent NULLS FIRST").fetchall()
    assert edges == [(None, "child_token_1"), (None, "child_token_2"), (None, "child_token_3"),
                     ("child_token_2", "child_token_4"), ("child_token_3", "child_token_4")]
    from spark_backend.analysis import edges as edge_kinds

    kinds = dict(((r.parent, r.child), r.kind) for r in edge_kinds(cache.con, "s").itertuples())
    assert kinds[("child_token_2", "child_token_4")] == "merge"
    assert kinds[(None, "child_token_1")] == "root"
    # The merge record came twice (once per parent) and is stored once per parent.
    assert cache.con.execute("SELECT count(*) FROM child_partitions_records "
                             "WHERE partition_token IS NOT NULL").fetchone()[0] == 2
    cache.close()


@pytest.mark.parametrize("split", [
    [["child_token_1", "child_token_2"], ["child_token_3"]],
    [["child_token_3"], ["child_token_1", "child_token_2"]],
    [["child_token_1"], ["child_token_2"], ["child_token_3"]],
    [["child_token_1", "child_token_2", "child_token_3"]],
])
def test_appointed_merges_read_each_child_once_by_its_first_parents_task(split):
    """A whole-range read (no driver between tasks): the task of the merge child's least
    parent token reads it, once, from the record's start, however the roots are dealt."""
    sources = [FakeSource() for _ in split]
    for source, roots in zip(sources, split, strict=True):
        list(_Workflow(source.read, 2, True, appoint_merges=True).rows(
            [(t, T0) for t in roots]))
    reads = [(i, q) for i, src in enumerate(sources) for q in src.queries
             if q[0] == "child_token_4"]
    assert len(reads) == 1, reads
    task, (_, start, finished_then) = reads[0]
    assert "child_token_2" in split[task] and start == T_MERGE
    assert "child_token_2" in finished_then
    assert sorted(q[0] for src in sources for q in src.queries) == [
        "child_token_1", "child_token_2", "child_token_3", "child_token_4"]


def _ts(minute: int) -> str:
    return f"2022-05-01T09:{minute:02d}:00Z"


def test_row_budget_stops_at_a_timestamp_and_the_next_wave_continues_right_after(tmp_path):
    """With ``max_rows`` a task stops each read at its next new timestamp (every row of the
    last one passed on), marks it ``open`` there, starts nothing new; the cache's frontier
    continues it right after, and the two waves together hold every record exactly once."""
    long = [_heartbeat(_ts(m)) for m in (10, 10, 20, 30, 40, 50)]
    served = {"p": long}

    def read(token, start_ns):
        for record in served[token]:
            row = from_change_record(record, token)
            if row["ts_ns"] >= start_ns:
                yield row
        yield partition_end(token, "open", END, read_from=start_ns)

    first = list(_Workflow(read, 1, True, max_rows=1).rows([("p", T0)]))
    ends = [r for r in first if r["kind"] == "partition_end"]
    assert len(ends) == 1 and '"stopped":"budget"' in ends[0]["extra"].replace(" ", "")
    # Both rows of 09:10 were passed on before stopping (a timestamp is never split).
    assert [r["ts_ns"] for r in first if r["kind"] == "heartbeat"] == [parse_ns(_ts(10))] * 2
    assert ends[0]["ts_ns"] == parse_ns(_ts(10))

    cache = Cache(tmp_path / "c.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull = cache.begin_pull("s", "test", T0, END, 10_000)
    cache.ingest("s", pull, pa.Table.from_batches([to_arrow_batch(first)]))
    assert cache.frontier("s", END) == [("p", parse_ns(_ts(10)) + 1)]
    second = list(_Workflow(read, 1, True).rows(cache.frontier("s", END)))
    assert [r["ts_ns"] for r in second if r["kind"] == "heartbeat"] == [
        parse_ns(_ts(m)) for m in (20, 30, 40, 50)]
    cache.close()


@pytest.fixture
def clock(monkeypatch) -> ThreadClock:
    """The workflow's clock, moved only by a test's row source: how long a row took to come is
    what the source says, whatever the machine's load."""
    clock = ThreadClock()
    monkeypatch.setattr(workflow, "time", clock)
    return clock


def _budget_runs_out_during_a_wait(flow_box: list, clock: ThreadClock, wait_s: float):
    """Heartbeats 09:01, 09:02, ...: the task's budget runs out while the read waits for the
    third (a large row in many responses, say); the rest come at once."""
    def read(token, start_ns):
        for m in range(1, 60):
            if m == 3:
                flow_box[0].stopping.set()
                clock.advance(wait_s)
            yield from_change_record(_heartbeat(_ts(m)), token)
        yield partition_end(token, "open", END, read_from=start_ns)
    return read


def _flow(read_for, **kw) -> list:
    box: list = []
    box.append(_Workflow(read_for(box), 1, True, **kw))
    return list(box[0].rows([("p", T0)]))


def test_a_read_keeps_the_row_it_waited_for_and_stops_at_one_that_came_with_another(
        monkeypatch, clock):
    """The budget ran out while the read waited for a row: that row is passed on (stopping
    there would have the source send it again, all of it), and the read stops at the next new
    timestamp, which came in the same response."""
    monkeypatch.setattr(workflow, "WAITED_S", 0.2)
    rows = _flow(lambda box: _budget_runs_out_during_a_wait(box, clock, 0.5), keep_seconds=30)
    assert [r["ts_ns"] for r in rows if r["kind"] == "heartbeat"] == [
        parse_ns(_ts(m)) for m in (1, 2, 3)]
    assert rows[-1]["kind"] == "partition_end" and rows[-1]["ts_ns"] == parse_ns(_ts(3))
    assert json.loads(rows[-1]["extra"]) == {"state": "open", "read_from": T0,
                                             "stopped": "budget", "arrival": 0}


def test_a_stopped_read_keeps_waited_rows_only_within_its_bounds(monkeypatch, clock):
    """No time to keep waited rows (``keep_seconds`` 0), or a row that took too long (a quiet
    partition): the read stops at the first new timestamp, as without the rule. A source whose
    every row makes the read wait cannot keep a stopped task going past an eighth over its row
    budget."""
    monkeypatch.setattr(workflow, "WAITED_S", 0.2)
    rows = _flow(lambda box: _budget_runs_out_during_a_wait(box, clock, 0.5), keep_seconds=0)
    assert [r["ts_ns"] for r in rows if r["kind"] == "heartbeat"] == [
        parse_ns(_ts(m)) for m in (1, 2)]
    assert json.loads(rows[-1]["extra"])["stopped"] == "budget"

    # A row that took WAITED_MAX_S or longer came from a quiet partition: not kept either.
    monkeypatch.setattr(workflow, "WAITED_MAX_S", 0.3)
    rows = _flow(lambda box: _budget_runs_out_during_a_wait(box, clock, 0.5), keep_seconds=30)
    assert [r["ts_ns"] for r in rows if r["kind"] == "heartbeat"] == [
        parse_ns(_ts(m)) for m in (1, 2)]

    monkeypatch.setattr(workflow, "WAITED_S", 0)  # every row counts as waited for
    monkeypatch.setattr(workflow, "WAITED_MAX_S", 60)

    def endless(token, start_ns):
        for s in range(1, 3600):
            yield from_change_record(_heartbeat(f"2022-05-01T09:{s // 60:02d}:{s % 60:02d}Z"),
                                     token)

    rows = list(_Workflow(endless, 1, True, max_rows=80, keep_seconds=30).rows([("p", T0)]))
    assert rows[-1]["kind"] == "partition_end"
    assert json.loads(rows[-1]["extra"])["stopped"] == "budget"
    assert len(rows) - 1 == 80 + 80 // 8


def _task_results(token_rows: dict[str, list[dict]], ends: list[dict]) -> list:
    rows = [from_change_record(r, t) for t, records in token_rows.items() for r in records]
    return [to_arrow_batch(rows + ends)]


def _task_a() -> list:
    """A task that read 1 (stopped for its budget at 09:10) and 2 (finished: announces the
    merge)."""
    return _task_results(
        {"child_token_1": [_heartbeat("2022-05-01T09:10:00Z")],
         "child_token_2": [_heartbeat("2022-05-01T09:20:00Z"), MERGE_RECORD]},
        [partition_end("child_token_1", "open", parse_ns("2022-05-01T09:10:00Z"),
                       read_from=T0, stopped="budget", arrival=1),
         partition_end("child_token_2", "finished", T_MERGE, read_from=T0, end=T_MERGE)])


def _arrived(batches: list) -> list:
    """A task's batches as the driver holds them: packed in the task, kept packed."""
    from spark_backend.spark.packing import packed, packed_rows

    return list(packed_rows([packed(b) for b in batches]))


def test_the_driver_plans_the_next_task_from_a_tasks_results_as_the_cache_would(tmp_path):
    """The driver starts the next task from a task's results before they land (``pull_plan.Plan``):
    a partition stopped for the budget continues right after its last timestamp (what the
    cache's frontier says once they landed), a root the task never started is read from its
    start, and a merge child whose parents two tasks read waits for both of them."""
    from spark_backend.jobs.pull_plan import Plan

    plan = Plan(finished=set())
    plan.offer([("child_token_1", T0), ("child_token_2", T0), ("child_token_3", T0)])
    first = plan.take()
    assert plan.reading == {"child_token_1", "child_token_2", "child_token_3"}
    # Task A read 1 (stopped for its budget at 09:10) and 2 (finished: announces the merge).
    a = _task_a()
    plan.task_ended([p for p in first if p[0] != "child_token_3"], _arrived(a))
    stopped_at = parse_ns("2022-05-01T09:10:00Z") + 1
    assert plan.ready == {"child_token_1": stopped_at}  # not the merge child: 3 still reads
    assert "child_token_4" in plan.waiting
    # The cache, once A landed, says the same of partition 1.
    cache = Cache(tmp_path / "plan.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull = cache.begin_pull("s", "test", T0, END, 10_000)
    cache.ingest("s", pull, pa.Table.from_batches(
        [to_arrow_batch([from_change_record(r, None) for r in INITIAL])]))
    cache.ingest("s", pull, pa.Table.from_batches(a))
    assert ("child_token_1", stopped_at) in cache.frontier("s", END)
    assert "child_token_4" not in dict(cache.frontier("s", END))
    # Its next query numbers its rows on after the one row read so far.
    assert plan.take() == [("child_token_1", stopped_at, 1)]
    # Task B (partition 3) stopped before it started it: 3 is read again from its start.
    plan.task_ended([("child_token_3", T0, 0)], _arrived([to_arrow_batch([])]))
    assert plan.ready == {"child_token_3": T0} and "child_token_4" in plan.waiting
    plan.take()
    # Task C finished 3: the merge child is ready at its start, once.
    c = _task_results({"child_token_3": [_heartbeat("2022-05-01T09:25:00Z"), MERGE_RECORD]},
                      [partition_end("child_token_3", "finished", T_MERGE, read_from=T0,
                                     end=T_MERGE)])
    plan.task_ended([("child_token_3", T0, 0)], _arrived(c))
    assert plan.ready == {"child_token_4": T_MERGE} and not plan.waiting
    cache.ingest("s", pull, pa.Table.from_batches(c))
    assert dict(cache.frontier("s", END))["child_token_4"] == T_MERGE
    # A frontier asked later offers nothing already being read or read.
    plan.take()
    plan.offer(cache.frontier("s", END))
    assert plan.ready == {}
    cache.close()


def test_results_that_arrive_during_a_landing_do_not_wait_for_it(tmp_path, monkeypatch):
    """The driver hands a task's results to the landing thread without waiting for the
    landing in progress (below the row bound); they land after it, each task's in a
    transaction of its own, in order; beyond the bound the driver waits."""
    import queue
    from types import SimpleNamespace

    from spark_backend.cache import ingest
    from spark_backend.jobs import pull_landing

    gate, landing, landings = threading.Event(), threading.Event(), []
    real = ingest.ingest_stream

    def slow_first(cache, stream, pull_id, batches, **kw):
        landings.append(sum(b.num_rows for b in batches))
        if len(landings) == 1:
            landing.set()
            assert gate.wait(60)
        return real(cache, stream, pull_id, batches, **kw)

    monkeypatch.setattr(pull_landing, "ingest_stream", slow_first)
    cache = Cache(tmp_path / "lander.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull_id = cache.begin_pull("s", "test", T0, END, 10_000)
    initial = _task_results({None: INITIAL}, [])
    stopped = parse_ns("2022-05-01T09:10:00Z")
    # b stops partition 1 for its budget, c continues it.
    b = _task_results({"child_token_1": SERVED["child_token_1"],
                       "child_token_2": SERVED["child_token_2"]},
                      [partition_end("child_token_1", "open", stopped, read_from=T0,
                                     stopped="budget"),
                       partition_end("child_token_2", "finished", T_MERGE, read_from=T0,
                                     end=T_MERGE)])
    c = _task_results({"child_token_3": SERVED["child_token_3"]},
                      [partition_end("child_token_1", "open", END, read_from=stopped + 1),
                       partition_end("child_token_3", "finished", T_MERGE, read_from=T0,
                                     end=T_MERGE)])
    a = _task_results({"child_token_4": SERVED["child_token_4"]},
                      [partition_end("child_token_4", "open", END, read_from=T_MERGE)])
    rows = {name: sum(x.num_rows for x in batches)
            for name, batches in (("initial", initial), ("b", b), ("c", c))}
    events: queue.Queue = queue.Queue()
    lander = pull_landing.Lander(cache, "s", pull_id, END, SimpleNamespace(started=1), events,
                                 max_rows=rows["initial"] + rows["b"] + rows["c"])
    lander.put(_arrived(initial))  # lands first, held at the gate
    assert landing.wait(30)
    putting = threading.Thread(target=lambda: (lander.put(_arrived(b)), lander.put(_arrived(c))))
    putting.start()
    putting.join(30)
    assert not putting.is_alive()  # the driver did not wait for the landing in progress
    beyond = threading.Thread(target=lambda: lander.put(_arrived(a)))
    beyond.start()
    beyond.join(0.5)
    assert beyond.is_alive()  # over the bound: it waits for a landing to end
    gate.set()
    beyond.join(30)
    lander.close()
    landed = [events.get_nowait()[1] for _ in range(events.qsize())]
    assert [item[0] for item in landed] == [pull_landing.LANDED] * 4
    assert landings == [rows["initial"], rows["b"], rows["c"], sum(x.num_rows for x in a)]
    assert cache.frontier("s", END) == []
    assert cache.con.execute(
        "SELECT token, state, epoch_ns(read_from), epoch_ns(read_to) FROM partitions "
        "WHERE token = 'child_token_1'").fetchall() == [("child_token_1", "open", T0, END)]
    cache.close()


def test_the_lander_summarizes_at_an_idle_slot_and_at_doubling_record_counts(tmp_path):
    """The lander's early summary (``_Lander._summary_due_in``) is due once a task slot idled
    ``EARLY_SUMMARY_IDLE_S`` and at least ``EARLY_SUMMARY_RECORDS`` records, and at least as
    many as at the last summary, landed since: a pull whose slots idle all along summarizes at
    doubling counts, so its summaries' scans of the pull's records stay linear in them."""
    import queue
    from types import SimpleNamespace

    from spark_backend.jobs import pull_landing

    cache = Cache(tmp_path / "due.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull_id = cache.begin_pull("s", "test", T0, END, 10_000)
    lander = pull_landing.Lander(cache, "s", pull_id, END, SimpleNamespace(started=1),
                                 queue.Queue(), max_rows=1_000)
    first = pull_landing.EARLY_SUMMARY_RECORDS
    try:
        lander.total.records = 10 * first
        assert lander._summary_due_in() is None  # no slot idle
        lander.idle_since = time.monotonic()
        assert 0 < lander._summary_due_in() <= pull_landing.EARLY_SUMMARY_IDLE_S
        lander.idle_since = time.monotonic() - pull_landing.EARLY_SUMMARY_IDLE_S
        for summarized_at, records, due in [
                (0, first - 1, False), (0, first, True),
                (first, 2 * first - 1, False), (first, 2 * first, True),
                (3 * first, 6 * first - 1, False), (3 * first, 6 * first, True)]:
            lander.summarized_at, lander.total.records = summarized_at, records
            assert (lander._summary_due_in() == 0) is due, (summarized_at, records)
    finally:
        lander.idle_since = None
        lander.close()
        cache.close()


def _demo_batches(n_batches: int = 2, rows: int = 2_000) -> list:
    """Record batches of the demo world's own records, as a task yields them."""
    import itertools

    from spark_backend.demo.world import build_world

    world = build_world(seed=7, scale=0.2)
    rows_of = (from_change_record(record, token)
               for token, record in world.all_data_change_records())
    return [to_arrow_batch(list(itertools.islice(rows_of, rows))) for _ in range(n_batches)]


def test_task_results_travel_with_repeated_values_once_and_land_the_same(tmp_path):
    from spark_backend.spark.packing import DICTIONARY_COLUMNS, packed, unpacked

    plain = _demo_batches()
    arrived = list(unpacked([packed(b) for b in plain]))

    assert len(arrived) == len(plain)
    for before, after in zip(plain, arrived, strict=True):
        encoded = [f.name for f in after.schema if pa.types.is_dictionary(f.type)]
        assert sorted(encoded) == sorted(DICTIONARY_COLUMNS)
        assert after.cast(before.schema).equals(before)
        # what the driver decodes when the batch lands: each repeated value once
        assert after.nbytes < before.nbytes / 2

    landed = {}
    for name, batches in (("plain", plain), ("packed", arrived)):
        with Cache(tmp_path / f"{name}.duckdb") as cache:
            for batch in batches:
                cache.ingest("demo", None, batch)
            landed[name] = cache.con.execute(
                "SELECT * FROM data_change_records ORDER BY record_key"
            ).fetchall()
    assert len(landed["plain"]) == sum(b.num_rows for b in plain)
    assert landed["packed"] == landed["plain"]


def test_the_driver_holds_a_tasks_results_compressed_with_what_its_plan_needs():
    """Until a task's results land the driver keeps them as they travelled (``Packed``: the
    compressed bytes, not decoded batches), with their row and record counts, the task's end
    marker, and the partition ends and children its plan reads, the same as from the rows."""
    from spark_backend.spark.packing import ends_and_children, packed, packed_rows, record_rows

    a = _task_a()
    batches = _demo_batches() + a
    outer = [packed(b) for b in batches] + [packed(None, task=3)]
    pieces = list(packed_rows([pa.RecordBatch.from_struct_array(
        pa.concat_arrays([b.to_struct_array() for b in outer]))]))  # as Spark hands them over

    assert [p.task for p in pieces] == [None] * len(batches) + [3]
    assert pieces[-1].data is None and pieces[-1].rows == 0 and not list(pieces[-1].batches())
    for piece, batch in zip(pieces[:-1], batches, strict=True):
        assert piece.rows == batch.num_rows and piece.records == record_rows(batch)
        ends, children = ends_and_children([batch])
        assert (piece.ends, piece.children) == (ends, children)
        (back,) = piece.batches()
        assert back.cast(batch.schema).equals(batch)
    for piece, batch in zip(pieces[:2], batches[:2], strict=True):  # 2,000 demo records each
        assert piece.data.size < batch.nbytes / 8  # held compressed: 0.11-0.14 MB of 1.9-2.1
    ends, children = ends_and_children(a)
    assert [e[0] for e in ends] == ["child_token_1", "child_token_2"]
    assert [c[0] for c in children] == ["child_token_4"]


def test_a_continued_partition_numbers_its_rows_on_from_the_rows_read_before():
    """The reader numbers each query's rows from 1; a partition continued after a budget stop
    numbers them on from the rows its earlier queries of the pull read, and a budget stop says
    how many that is now: the order check sees one sequence per partition and pull."""
    def read(token, start_ns):
        for line, m in enumerate(range(1, 60), start=1):
            if m == 4:
                flow.stopping.set()
            yield {**from_change_record(_heartbeat(_ts(m)), token), "line": line}
        yield partition_end(token, "open", END, read_from=start_ns)

    flow = _Workflow(read, 1, True, keep_seconds=0)
    rows = list(flow.rows([("p", T0, 40)]))
    assert [r["line"] for r in rows if r["kind"] == "heartbeat"] == [41, 42, 43]
    assert json.loads(rows[-1]["extra"])["arrival"] == 43
    flow = _Workflow(read, 1, True, keep_seconds=0)
    rows = list(flow.rows([("p", T0)]))  # a partition's first query in the pull
    assert [r["line"] for r in rows if r["kind"] == "heartbeat"] == [1, 2, 3]
    assert json.loads(rows[-1]["extra"])["arrival"] == 3


def _numbered(token, closed: list, n: int = 50, stop_at: int | None = None, flow=None):
    """Heartbeats numbered as the reader numbers them; ``closed`` notes the close."""
    try:
        for line in range(1, n + 1):
            if line == stop_at:
                flow[0].stopping.set()
            yield {**from_change_record(_heartbeat(_ts(line)), token), "line": line}
    finally:
        closed.append(token)


def test_a_read_stopped_at_its_budget_is_closed_and_nothing_is_kept_for_the_next_task():
    """A task is stateless (a data source reader's ``read()``): the read it stopped at its
    budget is closed, and the next task continues the partition with a query of its own."""
    closed: list = []
    box: list = []
    box.append(_Workflow(lambda t, s: _numbered(t, closed, stop_at=4, flow=box), 1, True,
                         keep_seconds=0))
    rows = list(box[0].rows([("p", T0)]))
    assert closed == ["p"]
    end = json.loads(rows[-1]["extra"])
    assert rows[-1]["kind"] == "partition_end" and end["stopped"] == "budget"
    assert not [name for name in vars(workflow) if "park" in name.lower()]


def test_reads_hand_their_rows_on_in_lists_in_order_each_ending_where_the_source_made_it_wait(
        monkeypatch, clock):
    """A task's consumer mostly waits for rows: a read hands them on in lists of at most
    ``HAND_ON_ROWS``, and what it gathered as soon as a row made it wait for the source, not
    one by one. Every row arrives once, each partition's in its order, its end row last."""
    monkeypatch.setattr(workflow, "WAITED_S", 0.05)

    def read(token, start_ns):
        for m in range(1, 41):
            if m == 8:  # a new response: the seven rows before go on as one list
                clock.advance(0.1)
            yield from_change_record(_heartbeat(_ts(m)), token)
        yield partition_end(token, "open", END, read_from=start_ns)

    flow = _Workflow(read, 3, True)
    handed: list[int] = []
    put = flow.out.put

    def counted(item, *a, **kw):
        if item is not workflow._DONE:
            handed.append(len(item))
        put(item, *a, **kw)

    flow.out.put = counted
    rows = list(flow.rows([("a", T0), ("b", T0), ("c", T0)]))
    assert len(rows) == 3 * 41
    for token in "abc":
        mine = [r for r in rows if r["partition_token"] == token]
        assert [r["ts_ns"] for r in mine[:-1]] == [parse_ns(_ts(m)) for m in range(1, 41)]
        assert mine[-1]["kind"] == "partition_end"
    # per read: 7 (before the wait), then 16, 16 and the last 2 rows with the end row
    assert sorted(handed) == sorted([7, 16, 16, 2] * 3)


def test_a_task_told_a_parent_finished_before_reads_the_merge_child_itself_once(tmp_path):
    """The driver tells each task the finished parents of the merges still waiting
    (``finished``): the task that finishes the last parent reads the merge child at once,
    exactly once, and the driver's plan and the cache then neither wait for it nor read it
    again. The task told nothing leaves it to the next wave (the test above)."""
    from spark_backend.jobs.pull_plan import Plan
    from spark_backend.spark.datasource import SpannerChangeStreamDataSourceReader

    plan = Plan(finished=set())
    plan.offer([("child_token_1", T0), ("child_token_2", T0), ("child_token_3", T0)])
    first = plan.take()
    a = _task_a()  # 1 stopped for its budget, 2 finished: the merge waits for 3
    plan.task_ended([p for p in first if p[0] != "child_token_3"], _arrived(a))
    told = plan.merge_parents_finished()
    assert told == ["child_token_2"]
    options = {"project": "p", "instance": "i", "database": "d", "stream": "S",
               "heartbeat_ms": "10000", "end_ns": str(END),
               "partitions": json.dumps([{"token": "child_token_3", "start_ns": T0}])}
    reader = SpannerChangeStreamDataSourceReader({**options, "finished": json.dumps(told)})
    assert reader.finished == ["child_token_2"]
    for bad in ("[1]", "{", '"child_token_2"'):
        with pytest.raises(ValueError, match='Option "finished" must be a JSON list of '
                                             'partition tokens'):
            SpannerChangeStreamDataSourceReader({**options, "finished": bad})
    source = FakeSource()
    rows_b = list(_Workflow(source.read, 2, True, finished=reader.finished)
                  .rows([("child_token_3", T0)]))
    assert [(q[0], q[1]) for q in source.queries] == [("child_token_3", T0),
                                                      ("child_token_4", T_MERGE)]
    assert plan.take() == [("child_token_1", parse_ns("2022-05-01T09:10:00Z") + 1, 1)]
    plan.task_ended([("child_token_3", T0, 0)], _arrived([to_arrow_batch(rows_b)]))
    assert plan.ready == {} and plan.waiting == {}
    assert {"child_token_2", "child_token_3", "child_token_4"} <= plan.done
    cache = Cache(tmp_path / "told.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull = cache.begin_pull("s", "test", T0, END, 10_000)
    for batch in ([to_arrow_batch([from_change_record(r, None) for r in INITIAL])], a,
                  [to_arrow_batch(rows_b)]):
        cache.ingest("s", pull, pa.Table.from_batches(batch))
    assert [t for t, _ in cache.frontier("s", END)] == ["child_token_1"]
    assert cache.con.execute("SELECT count(*) FROM heartbeats WHERE partition_token = "
                             "'child_token_4'").fetchone()[0] == 1
    cache.close()
