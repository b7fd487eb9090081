"""The Spanner path against the real Cloud Spanner emulator, with fast partition churn: a
workload of known transactions is pulled through Spark into the cache."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import replace

import pytest

from spark_backend import analysis
from spark_backend.cache.store import Cache
from spark_backend.jobs.pull import PullRequest, run_pull
from spark_backend.jobs.pull_sources import SpannerSource
from spark_backend.model import config
from spark_backend.model.timestamps import format_ns, from_datetime, now_ns
from tests.conftest import require_emulator

pytestmark = [pytest.mark.slow, pytest.mark.emulator]


@pytest.fixture(scope="module", params=["googlesql", "postgresql"])
def emulator(request):
    require_emulator()
    from spark_backend.demo.emulator import start_emulator_world

    world = start_emulator_world(dialect=request.param, churn_seconds=2)
    old = os.environ.get(config.EMULATOR_HOST_ENVVAR)
    os.environ[config.EMULATOR_HOST_ENVVAR] = world.host
    try:
        yield world
    finally:
        if old is None:
            os.environ.pop(config.EMULATOR_HOST_ENVVAR, None)
        else:
            os.environ[config.EMULATOR_HOST_ENVVAR] = old
        world.stop()


def _request(world, start_ns, end_ns):
    # no dialect: asked from the database
    source = SpannerSource(world.project, world.instance, world.database, world.stream)
    return PullRequest(source, start=start_ns, end=end_ns, heartbeat_ms=1000)


def _committed_in_cache(cache, stream):
    """commit timestamp -> list of (table, key JSON, mod_type) the cache holds for it."""
    rows = cache.con.execute(
        """SELECT epoch_ns(d.commit_timestamp), d.server_transaction_id, m.table_name,
                  m.keys, d.mod_type, d.copies
           FROM data_change_records d JOIN mods m USING (stream, record_key)
           WHERE d.stream = ?""", [stream]).fetchall()
    by_ts: dict[int, list] = {}
    for ts, txid, table, keys, mod_type, copies in rows:
        by_ts.setdefault(ts, []).append((txid, table, keys, mod_type, copies))
    return by_ts


def _check_exactly_once(cache, stream, committed):
    by_ts = _committed_in_cache(cache, stream)
    for txn in committed:
        ts = from_datetime(txn.commit_timestamp)
        seen = by_ts.get(ts)
        assert seen, f"transaction {txn.seq} ({txn.action}) committed at {format_ns(ts)} missing"
        assert len({s[0] for s in seen}) == 1, "one server_transaction_id per transaction"
        assert all(s[4] == 1 for s in seen), "no record stored twice"
        got = Counter((s[1], s[3]) for s in seen)
        want = Counter((w.table, w.mod_type) for w in txn.writes)
        assert got == want, f"transaction {txn.seq}: {got} != {want}"
    assert len({ts for ts in by_ts}) == len(committed)


def _pull_to_last_commit(cache, emulator, start, committed):
    """Pull ``start`` .. just after the last of ``committed``; the result of ``run_pull``."""
    # The range ends just after the last commit. Not clamped to this machine's clock: the
    # emulator's commit timestamps run up to ~1 ms ahead of it, and an end at "now" would leave
    # the newest transaction to the next span; the pull waits for the clock to pass it.
    end = max(from_datetime(t.commit_timestamp) for t in committed) + 1_000_000
    while now_ns() <= end:
        time.sleep(0.001)
    return end, run_pull(cache, _request(emulator, start, end))


def test_workload_pulled_exactly_once_with_splits_and_merges(emulator, spark, tmp_path):
    workload = emulator.workload(seed=11)
    workload.run_n(60)
    committed = workload.committed  # the seeding transaction too
    start = from_datetime(emulator.created_at)
    cache = Cache(tmp_path / "emu.duckdb")
    mid, result = _pull_to_last_commit(cache, emulator, start, committed)
    assert result.status == "complete", result.error
    stream = emulator.stream
    _check_exactly_once(cache, stream, committed)
    assert Counter(analysis.edges(cache.con, stream)["kind"])["root"] > 0
    report = analysis.build_report(cache.con, stream)
    assert report["transactions"]["incomplete"] == []
    assert report["duplicates"] == 0

    # Pulling the same range again adds nothing.
    again = run_pull(cache, _request(emulator, start, mid))
    assert again.status == "nothing-to-do"
    assert len(_committed_in_cache(cache, stream)) == len(committed)

    # More transactions, then extended pulls read only the new span, until the emulator has
    # split and merged partitions (each lives 2..4 s of its clock, churn_seconds=2: every round
    # of 30 transactions and a pull lets it churn; the rounds are counted, not timed).
    all_committed, read_to, kinds = list(committed), mid, Counter()
    for round_ in range(40):
        more = emulator.workload(seed=12 + round_)
        more.run_n(30)
        end, extended = _pull_to_last_commit(cache, emulator, start, more.committed)
        assert extended.status == "complete", extended.error
        all_committed += more.committed
        _check_exactly_once(cache, stream, all_committed)
        (old,) = cache.con.execute(
            "SELECT count(*) FROM data_change_records WHERE pull_id = ? "
            "AND commit_timestamp <= make_timestamp_ns(?)", [extended.pull_id, read_to]
        ).fetchone()
        assert old == 0
        read_to = end
        kinds = Counter(analysis.edges(cache.con, stream)["kind"])
        if kinds["merge"] and kinds["split"] + kinds["move"]:
            break
    assert kinds["split"] + kinds["move"] > 0, kinds
    assert kinds["merge"] > 0, kinds
    cache.close()


def test_unknown_stream_and_database_are_named(emulator, spark, tmp_path):
    cache = Cache(tmp_path / "bad.duckdb")
    start = from_datetime(emulator.created_at)
    bad_stream = _request(emulator, start, start + 10**9)
    bad_stream.source = replace(bad_stream.source, stream="NoSuchStream")
    result = run_pull(cache, bad_stream)
    assert result.status == "failed" and "NoSuchStream" in result.error
    bad_db = _request(emulator, start, start + 10**9)
    bad_db.source = replace(bad_db.source, database="nosuchdb")
    result = run_pull(cache, bad_db)
    assert result.status == "failed" and "nosuchdb" in result.error
    cache.close()


def test_emulator_source_starts_everything_itself(spark, tmp_path):
    """`pull --source emulator`: the emulator is found and started, provisioned, a live workload
    runs while its partitions are read, and everything is stopped afterwards."""
    require_emulator()
    from spark_backend.cli import main

    cache = tmp_path / "live.duckdb"
    assert main(["pull", "--source", "emulator", "--emulator-seconds", "6",
                 "--heartbeat-ms", "1000", "--cache", str(cache)]) == 0
    with Cache(cache) as c:
        report = analysis.build_report(c.con, "BankStream")
    assert report["records"]["data_change"] > 10
    assert report["transactions"]["incomplete"] == []
    assert len(report["partitions"]) > 2
    assert any(e["kind"] != "root" for e in report["edges"])


def test_missing_emulator_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    from spark_backend.cli import main

    monkeypatch.setenv("SPANNER_EMULATOR_BINARY", str(tmp_path / "no-emulator"))
    code = main(["pull", "--source", "emulator", "--cache", str(tmp_path / "c.duckdb")])
    err = capsys.readouterr().err
    assert code == 1
    assert "gcloud components install cloud-spanner-emulator" in err
    assert "Traceback" not in err


def test_beam_metadata_from_the_command_line(tmp_path, monkeypatch, capsys):
    """`pull --source beam-metadata` on a connector's metadata table in the emulator."""
    require_emulator()
    from spark_backend.cli import main
    from spark_backend.demo.emulator import EmulatorProcess
    from tests.support.beam import create_sample_metadata_table

    with EmulatorProcess() as proc:
        create_sample_metadata_table(
            emulator_host=proc.host, project="beam-project", instance="beam-instance",
            database="pipeline-db",
            table="PipelineMetadata")
        monkeypatch.setenv(config.EMULATOR_HOST_ENVVAR, proc.host)
        cache = tmp_path / "beam.duckdb"
        names = ["--project", "beam-project", "--instance", "beam-instance",
                 "--database", "pipeline-db"]
        code = main(["pull", "--source", "beam-metadata", *names, "--table", "PipelineMetadata",
                     "--cache", str(cache)])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert out.startswith("PipelineMetadata:")
        bad = main(["pull", "--source", "beam-metadata", *names, "--table", "x; DROP TABLE y",
                    "--cache", str(cache)])
        err = capsys.readouterr().err
        assert bad == 2 and "error:" in err and "Traceback" not in err
    with Cache(cache) as c:
        report = analysis.build_report(c.con, "PipelineMetadata")
    assert report["system"] == "beam" and report["partitions"]
    assert report["holding_back"] is not None


def test_a_wrong_dialect_is_answered_with_the_database_dialect(emulator, spark, tmp_path):
    """--dialect only overrides; when the database refuses it, one sentence names its own."""
    cache = Cache(tmp_path / "dialect.duckdb")
    start = from_datetime(emulator.created_at)
    wrong = "postgresql" if emulator.dialect == "googlesql" else "googlesql"
    request = _request(emulator, start, start + 10**9)
    request.source = replace(request.source, dialect=wrong)
    result = run_pull(cache, request)
    assert result.status == "failed"
    own = "PostgreSQL" if emulator.dialect == "postgresql" else "GoogleSQL"
    assert result.error.startswith(f"The database is {own}-dialect but it was queried as ")
    assert f"--dialect {emulator.dialect}" in result.error and "\n" not in result.error
    cache.close()
