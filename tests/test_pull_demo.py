"""End to end on the embedded demo: local Spanner-protocol server -> unchanged client ->
Spark (local) -> DuckDB file, checked against the simulator's ground truth."""

from __future__ import annotations

import json

import pytest

from spark_backend import analysis
from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from spark_backend.jobs.pull import PullRequest, PullTuning, run_pull
from spark_backend.jobs.pull_sources import DemoSource
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # Spark in this process, or in the processes it starts

HEARTBEAT_MS = 10_000


def cached_records(cache: Cache, stream: str) -> set[tuple]:
    return set(cache.con.execute(
        """SELECT partition_token, 'data_change', epoch_ns(commit_timestamp),
                  server_transaction_id, record_sequence FROM data_change_records
           WHERE stream = $s
           UNION ALL SELECT partition_token, 'heartbeat', epoch_ns(timestamp), NULL, NULL
           FROM heartbeats WHERE stream = $s
           UNION ALL SELECT partition_token, 'child_partitions', epoch_ns(start_timestamp),
                  NULL, record_sequence FROM child_partitions_records
           WHERE stream = $s AND partition_token IS NOT NULL""",
        {"s": stream}).fetchall())


def truth_records(world, end_ns=None) -> set[tuple]:
    """What reading every partition from its start to the end returns, by the simulator."""
    from spark_backend.model.records import from_change_record

    out = set()
    end_ns = world.end if end_ns is None else end_ns
    for p in world.partitions:
        if p.start > end_ns:
            continue
        for record in world.query(p.token, p.start, end_ns, HEARTBEAT_MS):
            row = from_change_record(record, p.token)
            out.add((p.token, row["kind"], row["ts_ns"], row.get("server_transaction_id"),
                     row.get("record_sequence")))
    return out


def assert_equals_world(cache: Cache, stream: str, world, heartbeats: bool = True) -> None:
    """The cache holds exactly the world. Heartbeats depend on where each query started, so a
    range read in two pulls is compared without them."""
    got = cached_records(cache, stream)
    want = truth_records(world)
    if not heartbeats:
        got = {r for r in got if r[1] != "heartbeat"}
        want = {r for r in want if r[1] != "heartbeat"}
    assert got == want, f"missing {sorted(want - got)[:5]}, extra {sorted(got - want)[:5]}"
    edges = set(cache.con.execute(
        "SELECT parent, child FROM edges WHERE stream = ?", [stream]).fetchall())
    assert edges == set(world.edges)
    tokens = {r[0] for r in cache.con.execute(
        "SELECT token FROM partitions WHERE stream = ?", [stream]).fetchall()}
    assert tokens == {p.token for p in world.partitions}
    # One summary per transaction, agreeing with its records (after a SIGKILL too): none
    # missed, none counted twice.
    assert transaction_summaries(cache, stream) == (len(world.transactions), 0)
    assert analysis.duplicates(cache.con, stream) == 0


def transaction_summaries(cache: Cache, stream: str) -> tuple[int, int]:
    """(transactions, summaries that disagree with the records or have none, or no records)."""
    return cache.con.execute(
        """WITH r AS (SELECT server_transaction_id, count(*) AS n,
                             list_sort(list(DISTINCT partition_token)) AS parts
                      FROM data_change_records WHERE stream = $s GROUP BY 1),
                t AS (SELECT * FROM transactions WHERE stream = $s)
           SELECT count(*), count(*) FILTER (WHERE r.n IS DISTINCT FROM t.records_seen
                                               OR r.parts IS DISTINCT FROM t.partitions)
           FROM r FULL JOIN t USING (server_transaction_id)""", {"s": stream}).fetchone()


@pytest.fixture(scope="module", params=["googlesql", "postgresql"])
def demo_pull(request, spark, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "demo.duckdb"
    cache = Cache(path)
    progress = []
    result = run_pull(cache, PullRequest(DemoSource(dialect=request.param),
                                         heartbeat_ms=HEARTBEAT_MS), progress.append)
    yield cache, result, progress, build_world()
    cache.close()


def test_full_pull_equals_ground_truth(demo_pull):
    cache, result, progress, world = demo_pull
    assert result.status == "complete", result.error
    assert_equals_world(cache, "DemoStream", world)
    # The records the pull reports: every record read once (the initial query's included).
    assert result.records == len(truth_records(world)) + len(world.roots)
    # Every transaction complete, with the simulator's counts.
    counts = analysis.transactions(cache.con, "DemoStream")
    assert len(counts) == len(world.transactions)
    assert counts["complete"].all()
    multi = counts[counts["partitions_expected"] > 1]
    assert len(multi) > 100 and (multi["partitions_seen"] == multi["partitions_expected"]).all()
    assert progress and progress[-1].partitions_done == len(world.partitions)
    # Progress counts records as the result does: it never runs ahead of it, and ends on it.
    assert max(p.records for p in progress) == result.records == progress[-1].records
    # Read so far never goes down (a task's arrival counted only its own records beside what
    # had landed: 18,202 then 8,876), and what landed is never more than what was read.
    read = [p.records for p in progress]
    assert read == sorted(read), read
    assert all(p.landed is None or p.landed <= p.records for p in progress)


def test_dag_has_splits_merges_and_the_stall_is_found(demo_pull):
    cache, _, _, world = demo_pull
    kinds = analysis.edges(cache.con, "DemoStream")["kind"].value_counts().to_dict()
    assert kinds.get("split", 0) > 0 and kinds.get("merge", 0) > 0 and kinds.get("root", 0) > 0
    token, stall_from, stall_to = world.stall
    gaps = analysis.heartbeat_gaps(cache.con, "DemoStream")
    stall_gaps = gaps[gaps["partition"] == token]
    assert len(stall_gaps) == 1
    gap = stall_gaps.iloc[0]
    assert gap["from_ns"] <= stall_from and gap["to_ns"] >= stall_to
    # No other partition has a gap that long.
    assert (gaps[gaps["partition"] != token]["gap_s"] < gap["gap_s"]).all()
    report = analysis.build_report(cache.con, "DemoStream")
    assert any(a["kind"] == "heartbeat_gap" and a["partition"] == token
               for a in report["anomalies"])


def test_second_pull_adds_nothing(demo_pull):
    cache, _, _, _ = demo_pull
    before = cached_records(cache, "DemoStream")
    version = cache.version()
    result = run_pull(cache, PullRequest(DemoSource(dialect="googlesql")))
    assert result.status == "nothing-to-do"
    assert result.records == 0
    assert cached_records(cache, "DemoStream") == before
    assert cache.version() >= version


SMALL = 0.3


def test_extended_pull_reads_only_the_new_span(spark, tmp_path):
    world = build_world(scale=SMALL)
    mid = world.start + (world.end - world.start) // 2
    cache = Cache(tmp_path / "ext.duckdb")
    first = run_pull(cache, PullRequest(DemoSource(scale=SMALL), end=mid))
    assert first.status == "complete"
    assert cached_records(cache, "DemoStream") == truth_records(world, mid)
    second = run_pull(cache, PullRequest(DemoSource(scale=SMALL)))
    assert second.status == "complete"
    # The second pull stored nothing at or before the first pull's end.
    (old,) = cache.con.execute(
        "SELECT count(*) FROM data_change_records WHERE pull_id = ? "
        "AND commit_timestamp <= make_timestamp_ns(?)", [second.pull_id, mid]).fetchone()
    assert old == 0
    assert second.records < first.records + second.records
    data_now = {r for r in cached_records(cache, "DemoStream") if r[1] == "data_change"}
    assert data_now == {r for r in truth_records(world) if r[1] == "data_change"}
    info = cache.stream_info("DemoStream")
    assert int(info["range_end"].timestamp()) == world.end // 10**9
    cache.close()


def test_a_pull_that_summarizes_between_landings_ends_with_every_summary_right(
        spark, tmp_path, monkeypatch):
    """The lander summarizes what landed whenever a task slot idles (here at once, from the
    first record on, then at doubling counts): the pull still ends with exactly the world and
    one right summary per transaction (``test_cache`` checks what each summary rebuilds)."""
    from spark_backend.jobs import pull_landing

    monkeypatch.setattr(pull_landing, "EARLY_SUMMARY_IDLE_S", 0.0)
    monkeypatch.setattr(pull_landing, "EARLY_SUMMARY_RECORDS", 1)
    early: list[int] = []
    summarize_landed = Cache.summarize_landed

    def counted(self, stream):
        early.append(self.con.execute("SELECT count(*) FROM data_change_records").fetchone()[0])
        return summarize_landed(self, stream)

    monkeypatch.setattr(Cache, "summarize_landed", counted)
    world = build_world(scale=SMALL)
    cache = Cache(tmp_path / "early.duckdb")
    result = run_pull(cache, PullRequest(DemoSource(scale=SMALL),
                                         tuning=PullTuning(max_rows_per_task=2_000)))
    assert result.status == "complete", result.error
    assert early and min(early) > 0  # ran, each time with records landed
    assert_equals_world(cache, "DemoStream", world)
    cache.close()


def test_first_slice_read_here_then_spark_equals_ground_truth(spark, tmp_path):
    """The dashboard's first minute: a first slice read in this process (no Spark job), the
    rest by Spark into the same stream: the cache holds exactly the world."""
    world = build_world(scale=SMALL)
    first_end = world.start + (world.end - world.start) // 6
    cache = Cache(tmp_path / "here.duckdb")
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    first = run_pull(cache, PullRequest(DemoSource(scale=SMALL), end=first_end, reader="here"))
    assert first.status == "complete", first.error
    assert not set(spark.sparkContext.statusTracker().getJobIdsForGroup()) - set(jobs_before)
    assert cached_records(cache, "DemoStream") == truth_records(world, first_end)
    rest = run_pull(cache, PullRequest(DemoSource(scale=SMALL)))
    assert rest.status == "complete", rest.error
    assert_equals_world(cache, "DemoStream", world, heartbeats=False)
    cache.close()


def test_spark_keeps_its_record_of_at_most_100_finished_jobs(spark):
    """A long-lived process runs job after job (the dashboard pulls on every refresh): Spark
    keeps what it tracks of at most 100 finished jobs, not its default 1,000 (~23 KB of the
    JVM's heap each, benchmarks/MEMORY.md, stop 38)."""
    sc = spark.sparkContext
    sc.setJobGroup("retention-test", "jobs of this test")
    try:
        for _ in range(130):
            sc.parallelize([1], 1).count()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)
    tracker = sc.statusTracker()
    # Spark removes the oldest on a thread of its own: until it has.
    wait_until(lambda: len(tracker.getJobIdsForGroup("retention-test")) <= 100,
               "Spark kept at most 100 finished jobs")
    kept = tracker.getJobIdsForGroup("retention-test")
    assert 0 < len(kept) <= 100, len(kept)


def test_a_progress_callback_that_raises_at_the_end_still_ends_the_pull(tmp_path):
    """The dashboard's progress callback can raise (a rerun stops the script): the pull is
    still recorded as ended and its transactions summarized."""

    class Rerun(BaseException):
        pass

    def progress(p):
        if p.message == "summarizing the transactions":
            raise Rerun

    world = build_world(scale=SMALL)
    end = world.start + (world.end - world.start) // 6
    cache = Cache(tmp_path / "stop.duckdb")
    with pytest.raises(Rerun):
        run_pull(cache, PullRequest(DemoSource(scale=SMALL), end=end, reader="here"),
                 progress)
    assert cache.con.execute("SELECT status FROM pulls").fetchall() == [("complete",)]
    txns, wrong = transaction_summaries(cache, "DemoStream")
    assert txns > 0 and wrong == 0
    cache.close()


def test_unknown_reader_is_one_sentence(tmp_path):
    from spark_backend.model.errors import BadInput

    with Cache(tmp_path / "r.duckdb") as cache, pytest.raises(BadInput, match="accepted are"):
        run_pull(cache, PullRequest(DemoSource(), reader="threads"))


def test_faults_still_exact(spark, tmp_path):
    """Streams cut mid-partition, latency, a slow partition: still every record once."""
    world = build_world(scale=SMALL)
    cache = Cache(tmp_path / "faults.duckdb")
    slow = world.stall[0]
    result = run_pull(cache, PullRequest(DemoSource(
        scale=SMALL,
        faults={"cut_after": 3, "latency_ms": 1.0, "slow_partition": slow, "slow_ms": 5})))
    assert result.status == "complete", result.error
    assert_equals_world(cache, "DemoStream", world)
    cache.close()


def test_short_tasks_are_continued_by_the_next_ones_and_equal_ground_truth(spark, tmp_path):
    """Tasks cut short (200 rows or half a second, the server 1 ms a response) are continued
    by tasks the driver starts from their results before they land: many jobs, and the cache
    holds exactly the world, every partition read to its end or the range end."""
    world = build_world(scale=SMALL)
    cache = Cache(tmp_path / "short.duckdb")
    result = run_pull(cache, PullRequest(
        DemoSource(scale=SMALL, faults={"latency_ms": 1.0}),
        tuning=PullTuning(max_rows_per_task=200, task_seconds=0.5)))
    assert result.status == "complete", result.error
    assert result.waves > 10
    assert_equals_world(cache, "DemoStream", world, heartbeats=False)
    states = cache.partition_states("DemoStream")
    assert set(states) <= {"finished", "open"} and sum(states.values()) == len(world.partitions)
    # A partition's records of one pull count on across the queries that continue it: the
    # order check ("watermark_backwards") sees one sequence per partition, not one per query.
    repeated = cache.con.execute(
        """SELECT partition_token, arrival, count(*) FROM (
             SELECT partition_token, pull_id, arrival FROM data_change_records
             UNION ALL SELECT partition_token, pull_id, arrival FROM heartbeats)
           WHERE arrival IS NOT NULL GROUP BY partition_token, pull_id, arrival
           HAVING count(*) > 1 LIMIT 3""").fetchall()
    assert repeated == []
    found = {a["kind"] for a in analysis.build_report(cache.con, "DemoStream")["anomalies"]}
    assert "watermark_backwards" not in found, found
    cache.close()


def test_interrupted_pull_leaves_a_consistent_cache_and_resumes(spark, tmp_path):
    world = build_world(scale=SMALL)
    mid = world.start + (world.end - world.start) // 2
    cache = Cache(tmp_path / "crash.duckdb")
    assert run_pull(cache, PullRequest(DemoSource(scale=SMALL), end=mid)).status == (
        "complete")
    at_mid = cached_records(cache, "DemoStream")

    def crash_while_reading(p):
        if p.message.endswith("reading") and p.records > 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_pull(cache, PullRequest(DemoSource(scale=SMALL)), crash_while_reading)
    # The wave being read had not landed: the cache is exactly what it was.
    assert cached_records(cache, "DemoStream") == at_mid
    status = cache.con.execute("SELECT status FROM pulls ORDER BY pull_id").fetchall()
    assert status == [("complete",), ("interrupted",)]
    result = run_pull(cache, PullRequest(DemoSource(scale=SMALL)))
    assert result.status == "complete"
    assert_equals_world(cache, "DemoStream", world, heartbeats=False)
    cache.close()


def test_partition_that_keeps_failing_is_named_and_what_was_read_is_kept(spark, tmp_path):
    world = build_world(scale=SMALL)
    bad = max(world.roots, key=lambda p: len(world.records_for(p.token))).token
    cache = Cache(tmp_path / "fail.duckdb")
    result = run_pull(cache, PullRequest(DemoSource(scale=SMALL, faults={"fail_partition": bad}),
                                         tuning=PullTuning(max_attempts=2)))
    assert result.status == "failed"
    assert result.failed_partition == bad
    assert bad in result.error and "keeps failing" in result.error
    state, n = cache.con.execute(
        "SELECT state, data_change_records FROM partitions WHERE token = ?", [bad]).fetchone()
    assert state == "incomplete" and n > 0  # the first responses were kept
    pull = cache.con.execute("SELECT status, failed_partition FROM pulls").fetchall()
    assert pull == [("failed", bad)]
    report = analysis.build_report(cache.con, "DemoStream")
    assert any(a["kind"] == "read_failed" and a["partition"] == bad for a in report["anomalies"])
    # The other partitions were read completely.
    others = {r for r in truth_records(world) if r[0] != bad and r[1] == "data_change"}
    got = {r for r in cached_records(cache, "DemoStream") if r[1] == "data_change"}
    assert others - got <= {r for r in others if r[0] in _descendants(world, bad)}
    cache.close()


@pytest.mark.parametrize(("memory", "doing"), [
    ("4MB", "while the pull wrote to it"),          # before any task's results
    ("12MB", "while landing a task's results"),     # at the first landing
])
def test_a_cache_duckdb_refuses_is_named_as_the_caches_and_the_next_pull_resumes(
        spark, tmp_path, monkeypatch, memory, doing):
    """DuckDB out of memory in a cache given too little: the pull fails with one sentence that
    names the cache and $CSI_DUCKDB_MEMORY (not a Spark job, no DuckDB hint list); with
    memory, the next pull completes the cache to the ground truth."""
    monkeypatch.delenv("CSI_DUCKDB_MEMORY", raising=False)
    world = build_world(scale=SMALL)
    path = tmp_path / "starved.duckdb"
    with Cache(path, memory_limit=memory) as cache:
        result = run_pull(cache, PullRequest(DemoSource(scale=SMALL)))
    assert result.status == "failed"
    assert result.error.startswith(f"The cache {path} failed {doing} (Out of Memory Error"), (
        result.error)
    assert result.error.endswith("give DuckDB more memory with $CSI_DUCKDB_MEMORY (e.g. "
                                 "CSI_DUCKDB_MEMORY=256MB) and pull again to resume.")
    assert "Spark" not in result.error and "\n" not in result.error
    with Cache(path) as cache:
        assert cache.con.execute("SELECT status FROM pulls").fetchall() == [("failed",)]
        assert run_pull(cache, PullRequest(DemoSource(scale=SMALL))).status == (
            "complete")
        assert_equals_world(cache, "DemoStream", world, heartbeats=False)


def test_a_summary_duckdb_refuses_is_one_sentence_and_the_next_open_rebuilds_it(
        spark, tmp_path, monkeypatch):
    """The transaction summary at a pull's end runs out of memory: the pull's records are
    kept and its end recorded, the pull answers with one sentence naming the cache and
    $CSI_DUCKDB_MEMORY (no traceback), and the next read-write open builds the summary."""
    import duckdb

    world = build_world(scale=SMALL)
    path = tmp_path / "summary.duckdb"

    def starved(self, stream):
        raise duckdb.OutOfMemoryException(
            "Out of Memory Error: failed to pin block of size 256.0 KiB (60.8 MiB/61.0 MiB used)")

    with monkeypatch.context() as m:
        m.setattr(Cache, "summarize_transactions", starved)
        with Cache(path) as cache:
            result = run_pull(cache, PullRequest(DemoSource(scale=SMALL)))
    assert result.status == "failed"
    assert result.error.startswith(f"The cache {path} failed while summarizing the pull's "
                                   "transactions (Out of Memory Error"), result.error
    assert result.error.endswith("$CSI_DUCKDB_MEMORY (e.g. CSI_DUCKDB_MEMORY=256MB) and pull "
                                 "again to resume.") and "\n" not in result.error
    with Cache(path) as cache:
        assert cache.con.execute("SELECT status FROM pulls").fetchall() == [("complete",)]
        assert_equals_world(cache, "DemoStream", world, heartbeats=False)


def test_a_summary_whose_cache_another_process_takes_meanwhile_is_one_sentence(
        spark, tmp_path, monkeypatch):
    """The summary does not fit in the pull's 64MB, and while the cache is closed to open it
    again with more memory another process takes the file (real DuckDB lock): the pull answers
    with one sentence naming the cache, the lock and what is kept, instead of raising; the
    records and the pull's end stay, and the next read-write open builds the summary."""
    import subprocess
    import sys

    import duckdb

    from spark_backend.cache import store
    from spark_backend.model.config import PULL_MEMORY_LIMIT

    monkeypatch.delenv("CSI_DUCKDB_MEMORY", raising=False)
    world = build_world(scale=SMALL)
    path = tmp_path / "taken.duckdb"
    refused = []

    def starved_once(self, stream):  # DuckDB's refusal at 64MB, as 1M single-record txns get
        if not refused:
            refused.append(stream)
            raise duckdb.OutOfMemoryException(
                "Out of Memory Error: failed to pin block of size 256.0 KiB (60.8/61.0 MiB used)")
        return summarize(self, stream)

    holder = []
    connect = store._connect

    def taken_meanwhile(*args, **kwargs):  # the reopen: another process holds the file now
        holder.append(subprocess.Popen(
            [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
             "print('held', flush=True); sys.stdin.read()", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        assert holder[0].stdout.readline().strip() == "held"
        return connect(*args, **kwargs)

    summarize = Cache.summarize_transactions
    try:
        with Cache(path, memory_limit=PULL_MEMORY_LIMIT) as cache:
            monkeypatch.setattr(Cache, "summarize_transactions", starved_once)
            monkeypatch.setattr(store, "_connect", taken_meanwhile)
            result = run_pull(cache, PullRequest(DemoSource(scale=SMALL)))
            monkeypatch.undo()
    finally:
        for proc in holder:
            proc.communicate("")
    assert refused == ["DemoStream"] and len(holder) == 1
    assert result.status == "failed"
    assert result.error.startswith(f"The cache {path} could not be opened again with 1GB to "
                                   "summarize the transactions just landed (IO Error: "), (
        result.error)
    assert "lock" in result.error and "\n" not in result.error
    assert result.error.endswith("the records and the end of the pull or import are kept, and "
                                 "the next read-write open of the cache summarizes them.")
    with Cache(path) as cache:
        assert cache.con.execute("SELECT status FROM pulls").fetchall() == [("complete",)]
        assert_equals_world(cache, "DemoStream", world, heartbeats=False)


def _descendants(world, token):
    out, todo = set(), [token]
    while todo:
        t = todo.pop()
        for parent, child in world.edges:
            if parent == t and child not in out:
                out.add(child)
                todo.append(child)
    return out


def test_report_json_keys(demo_pull):
    cache, _, _, world = demo_pull
    report = analysis.build_report(cache.con, "DemoStream")
    json.dumps(report)
    for key in ("partitions", "edges", "low_watermark", "holding_back", "records",
                "duplicates", "transactions", "anomalies"):
        assert key in report
    p = report["partitions"][0]
    assert set(p) >= {"token", "parents", "start", "end", "finished", "watermark",
                      "data_change_records", "heartbeats", "stalled"}
    assert set(report["edges"][0]) == {"parent", "child", "kind"}
    assert report["records"]["data_change"] == world.num_data_change_records
    assert report["transactions"]["total"] == len(world.transactions)
    assert report["holding_back"] in {q.token for q in world.partitions if q.end is None}
    assert report["low_watermark"].endswith("Z")


def test_each_task_is_stateless_and_every_stop_is_continued_by_a_query_of_its_own(
        spark, tmp_path, monkeypatch):
    """A task keeps nothing for the next one (a data source reader's ``read()`` is
    stateless): seen from the source, every read a task stopped at its budget is continued by a
    new query, and the pull still equals the world."""
    from spark_backend.demo.server import DemoServer
    from spark_backend.jobs import pull_plan

    stops = []
    task_ended = pull_plan.Plan.task_ended

    def counted(self, roots, results):
        stops.extend(e for piece in results for e in piece.ends if e[2])
        return task_ended(self, roots, results)

    monkeypatch.setattr(pull_plan.Plan, "task_ended", counted)
    world = build_world(seed=7, scale=SMALL)
    with DemoServer(world, latency_ms=1.0) as server:
        cache = Cache(tmp_path / "parked.duckdb")
        result = run_pull(cache, PullRequest(
            DemoSource(scale=SMALL, host=server.address),
            tuning=PullTuning(max_rows_per_task=200, task_seconds=0.5)))
        queries = server.counters["queries"]
    assert result.status == "complete", result.error
    assert_equals_world(cache, "DemoStream", world, heartbeats=False)
    again = queries - 1 - len(world.partitions)  # beyond the initial query and one each
    # Every stop costs a query (more only where a query was retried): nothing read ahead was
    # kept in a worker for the next task.
    assert len(stops) > 20 and again >= len(stops), (again, len(stops))
    cache.close()
