"""Live refresh against the real Cloud Spanner emulator: one emulator and its workload kept
running across ticks, each tick reading only the new span through it (the dashboard's live
emulator), and a Cloud Spanner (``spanner`` source, SPANNER_EMULATOR_HOST) refresh reusing one
client per target in every process."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from app import live, pulling
from spark_backend import analysis
from spark_backend.cache.store import Cache
from spark_backend.model import config
from spark_backend.model.timestamps import format_ns, from_datetime
from spark_backend.spanner import connect
from tests.conftest import require_emulator
from tests.support.connect_usage import worker_usage
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


@pytest.fixture(scope="module")
def source():
    """A live emulator: partitions split and merge every 2..4 s, 20 transactions a second."""
    require_emulator()
    from spark_backend.demo.emulator import start_live_emulator

    src = start_live_emulator(churn_seconds=2, rate_per_s=20, seed=21)
    yield src
    src.stop()


def _runner(cache: Cache, src, stream: str, source: str = "emulator") -> live.LiveRunner:
    """A runner pulling exactly as the dashboard's (``resources.start_live_emulator``)."""

    def pull(form, progress):
        return pulling.pull(cache, form, progress, prepare=lambda f: src.host)

    return live.LiveRunner(str(cache.path), stream, src, src, pull, source=source,
                           heartbeat_ms=1000, every_s=1.0)


def _pulls(cache: Cache, stream: str) -> list[tuple[int, int, int, str]]:
    return cache.con.execute(
        "SELECT pull_id, epoch_ns(range_start), epoch_ns(range_end), status FROM pulls "
        "WHERE stream = ? ORDER BY pull_id", [stream]).fetchall()


def _committed_after(src, end_ns: int) -> bool:
    """The live workload committed a transaction after ``end_ns`` that a refresh may read now
    (its range ends LIVE_LAG_S before now)."""
    readable = src.end
    return any(end_ns < from_datetime(t.commit_timestamp) <= readable
               for t in reversed(src.workload.committed[-200:]))


def test_live_emulator_reads_only_new_spans_and_stop_ends_everything(spark, tmp_path):
    require_emulator()
    from spark_backend.demo.emulator import start_live_emulator

    src = start_live_emulator(churn_seconds=2, rate_per_s=20, seed=31)
    pid = src.pid
    cache = Cache(tmp_path / "live.duckdb")
    stream = live.new_stream_name(src.now, live.LIVE_EMULATOR_PREFIX)
    runner = _runner(cache, src, stream)
    try:
        runner.start()
        wait_until(lambda: runner.ticks >= 5 or not runner.running,
                   "five ticks of the live runner", hang_s=600)
        assert runner.ticks >= 5, runner.status()
    finally:
        runner.stop()
    # Stop ends the ticks, the workload and the emulator (its whole process group).
    assert not runner.running and src.finished
    assert src.workload._thread is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert runner.last_ok, runner.last

    pulls = _pulls(cache, stream)
    assert len(pulls) == runner.ticks and all(p[3] == "complete" for p in pulls), pulls
    # Each tick read only the new span: every record it landed is after the previous tick's
    # end, so open partitions continued where they were read to.
    for (_, _, before_end, _), (pull_id, _, end, _) in zip(pulls, pulls[1:], strict=False):
        (earliest, latest) = cache.con.execute(
            "SELECT min(t), max(t) FROM (SELECT epoch_ns(commit_timestamp) AS t FROM "
            "data_change_records WHERE stream = $s AND pull_id = $p UNION ALL SELECT "
            "epoch_ns(timestamp) FROM heartbeats WHERE stream = $s AND pull_id = $p)",
            {"s": stream, "p": pull_id}).fetchone()
        assert earliest is not None and before_end < earliest <= latest <= end, (
            pull_id, format_ns(before_end), format_ns(earliest))

    # Every transaction the workload committed up to the last tick's end is there, once.
    last_end = pulls[-1][2]
    committed = [t for t in src.workload.committed
                 if from_datetime(t.commit_timestamp) <= last_end]
    assert len(committed) > 40 and not src.workload.errors
    rows = cache.con.execute(
        "SELECT epoch_ns(d.commit_timestamp), m.table_name, d.mod_type, d.copies "
        "FROM data_change_records d JOIN mods m USING (stream, record_key) "
        "WHERE d.stream = ?", [stream]).fetchall()
    assert all(r[3] == 1 for r in rows), "a record was delivered twice"
    by_ts: dict[int, Counter] = {}
    for ts, table, mod_type, _ in rows:
        by_ts.setdefault(ts, Counter())[(table, mod_type)] += 1
    first_ns = runner.first_ns
    want = {from_datetime(t.commit_timestamp): Counter((w.table, w.mod_type) for w in t.writes)
            for t in committed if from_datetime(t.commit_timestamp) >= first_ns}
    assert by_ts == want

    # The DAG grew tick by tick, with splits; nothing was damaged by the refreshes.
    kinds = Counter(analysis.edges(cache.con, stream)["kind"])
    assert kinds["split"] > 0 and kinds["root"] > 0, kinds
    starts = cache.con.execute(
        "SELECT count(*) FROM partitions WHERE stream = ? AND start_ts > make_timestamp_ns(?)",
        [stream, pulls[0][2]]).fetchone()[0]
    assert starts > 0, "no partition began after the first tick"
    assert cache.partition_states(stream).get("incomplete", 0) == 0
    found = {a["kind"] for a in analysis.anomalies(cache.con, stream, 60.0)}
    assert not found & {"read_failed", "watermark_backwards", "child_never_read"}, found
    assert analysis.build_report(cache.con, stream)["duplicates"] == 0
    cache.close()


def test_cloud_spanner_refresh_reuses_one_client(source, spark, tmp_path, monkeypatch):
    """The ``spanner`` source on SPANNER_EMULATOR_HOST, refreshed tick after tick as the
    Sources page's timer does: the driver and every Spark worker keep one client."""
    monkeypatch.setenv(config.EMULATOR_HOST_ENVVAR, source.host)
    cache = Cache(tmp_path / "cloud.duckdb")
    world = source.world
    wait_until(lambda: source.end >= source.start + 10**9, "a second of the workload")
    first = pulling.PullForm(
        source="spanner", stream="BankLive", source_stream=world.stream,
        project=world.project, instance=world.instance, database=world.database,
        start=format_ns(source.start), end=format_ns(source.end), heartbeat_ms=1000)
    outcome = pulling.pull(cache, first, lambda p: None)
    assert outcome.ok, outcome.message
    info = cache.con.execute(
        "SELECT * FROM streams WHERE stream = 'BankLive'").fetchdf().iloc[0].to_dict()
    assert live.refusal(info) is None
    driver_clients = connect.USAGE["clients"]
    before = worker_usage(spark)
    for _ in range(4):
        read_to = _pulls(cache, "BankLive")[-1][2]
        wait_until(lambda: _committed_after(source, read_to),
                   "a transaction committed after the last pull's end")
        outcome = pulling.pull(cache, pulling.refresh_form(info), lambda p: None)
        assert outcome.ok, outcome.message
    assert len([p for p in _pulls(cache, "BankLive") if p[3] == "complete"]) == 5
    after = worker_usage(spark)

    assert connect.USAGE["clients"] == driver_clients  # the driver made none on refresh
    reused = [pid for pid, (opened, clients, dbs) in after.items()
              if opened - before.get(pid, (0, 0, 0))[0] >= 2]
    # Some worker opened the target on several ticks, each worker made ONE client for it.
    assert reused, (before, after)
    assert all(clients <= dbs for opened, clients, dbs in after.values()), after
    assert all(after[pid][1] == before.get(pid, after[pid])[1] for pid in reused), \
        (before, after)
    assert cache.partition_states("BankLive").get("incomplete", 0) == 0
    cache.close()
