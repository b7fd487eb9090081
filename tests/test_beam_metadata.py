"""A Beam/Dataflow connector's partition metadata table on the Cloud Spanner emulator, read into
the cache as the same DAG with states, watermarks and time in each state.

Needs the emulator: skipped when it is not installed, except on CI (CI=true) where that fails."""

from __future__ import annotations

import json
import os

import pytest

from spark_backend.analysis import systems
from spark_backend.cache.store import Cache
from spark_backend.jobs import beam_metadata
from spark_backend.model import config
from spark_backend.model.errors import BadInput
from tests.support.beam import create_sample_metadata_table

pytestmark = [pytest.mark.slow, pytest.mark.emulator]
PROJECT, INSTANCE, DATABASE, TABLE = "beam-project", "beam-instance", "pipeline", "MetadataTable"
S = 1_000_000_000


@pytest.fixture(scope="module")
def emulator():
    if config.emulator_binary() is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("the Cloud Spanner emulator is not installed on CI")
        pytest.skip("the Cloud Spanner emulator is not installed")
    from spark_backend.demo.emulator import EmulatorProcess

    config.quiet_local_client_env()
    with EmulatorProcess() as proc:
        yield proc.host


@pytest.fixture(scope="module")
def sample(emulator):
    from spark_backend.model.timestamps import now_ns

    base = now_ns() - 900 * S
    rows = create_sample_metadata_table(
        emulator_host=emulator, project=PROJECT, instance=INSTANCE, database=DATABASE,
        table=TABLE, base_ns=base,
    )
    return base, rows


def _pull(tmp_path, emulator, stream="pipeline"):
    cache = Cache(tmp_path / "cache.duckdb")
    summary = beam_metadata.pull_beam_metadata(
        cache, stream, project=PROJECT, instance=INSTANCE, database=DATABASE, table=TABLE,
        emulator_host=emulator,
    )
    return cache, summary


def test_metadata_table_as_dag(tmp_path, emulator, sample):
    base, rows = sample
    cache, summary = _pull(tmp_path, emulator)
    assert summary["partitions"] == 8
    assert summary["states"] == {"FINISHED": 4, "RUNNING": 2, "CREATED": 1, "SCHEDULED": 1}
    assert summary["holding_back"] == "tokA1"
    assert cache.stream_info("pipeline")["system"] == "beam"
    edges = set(cache.con.execute(
        "SELECT parent, child FROM edges WHERE stream = 'pipeline'").fetchall())
    assert edges == {(None, "Parent0"), ("Parent0", "tokA"), ("Parent0", "tokB"),
                     ("tokA", "tokA1"), ("tokA", "tokA2"), ("tokA2", "tokC"), ("tokB", "tokC"),
                     ("tokC", "tokD"), ("tokC", "tokE")}
    parts = {r[0]: r[1:] for r in cache.con.execute(
        "SELECT token, state, epoch_ns(start_ts), epoch_ns(end_ts), epoch_ns(watermark) "
        "FROM partitions WHERE stream = 'pipeline'").fetchall()}
    assert parts["tokA"] == ("finished", base + 10 * S, base + 30 * S, base + 30 * S)
    assert parts["tokB"] == ("finished", base + 10 * S, base + 50 * S, base + 50 * S)
    assert parts["tokA1"] == ("open", base + 30 * S, None, base + 35 * S)
    # tokC announced its children (at +300s): it has ended in the stream, though the pipeline
    # still shows it RUNNING
    assert parts["tokC"][:3] == ("open", base + 50 * S, base + 300 * S)
    assert parts["tokD"][0] == "pending" and parts["tokE"][0] == "pending"
    # the merge: tokC's child partitions record lists both parents
    (cp,) = cache.con.execute(
        "SELECT child_partitions::VARCHAR FROM child_partitions_records WHERE stream='pipeline' "
        "AND partition_token = 'tokB'").fetchone()
    assert json.loads(cp) == [{"parent_partition_tokens": ["tokA2", "tokB"], "token": "tokC"}]
    # the pipeline's watermark: min over partitions not FINISHED
    assert systems.stream_watermark(cache.con, "pipeline", "beam") == (base + 35 * S, "tokA1")


def test_states_and_anomalies(tmp_path, emulator, sample):
    base, rows = sample
    cache, _ = _pull(tmp_path, emulator)
    df = systems.beam_states(cache.con, "pipeline", stuck_after_s=300)
    by = df.set_index("token")
    assert by.loc["tokA", "created_s"] == pytest.approx(1.0)
    assert by.loc["tokA", "scheduled_s"] == pytest.approx(1.0)
    assert by.loc["tokA", "running_s"] == pytest.approx(18.0)
    assert by.loc["tokB", "scheduled_s"] == pytest.approx(5.0)
    assert by.loc["tokD", "state"] == "CREATED" and bool(by.loc["tokD", "stuck"])
    assert by.loc["tokE", "state"] == "SCHEDULED" and bool(by.loc["tokE", "stuck"])
    assert by.loc["tokD", "waiting_s"] > 400 and by.loc["tokE", "waiting_s"] > 300
    assert not by.loc["tokC", "stuck"]
    assert json.loads(by.loc["tokC", "parents"]) == ["tokA2", "tokB"]
    assert by.loc["tokA", "created_ns"] == base - 590 * S
    anomalies = systems.system_anomalies(cache.con, "pipeline", "beam", stall_after_s=60)
    kinds = {(a["kind"], a["partition"]) for a in anomalies}
    assert kinds == {("stuck_created", "tokD"), ("stuck_scheduled", "tokE"), ("stalled", "tokA1")}


def test_pull_again_is_idempotent(tmp_path, emulator, sample):
    cache, _ = _pull(tmp_path, emulator)
    cache.close()
    cache, _ = _pull(tmp_path, emulator)
    (n_edges,) = cache.con.execute(
        "SELECT count(*) FROM edges WHERE stream = 'pipeline'").fetchone()
    (n_rows,) = cache.con.execute(
        "SELECT count(*) FROM beam_partitions WHERE stream = 'pipeline'").fetchone()
    assert n_edges == 9 and n_rows == 8


def test_table_name_is_validated(tmp_path):
    cache = Cache(tmp_path / "cache.duckdb")
    with pytest.raises(BadInput):
        beam_metadata.pull_beam_metadata(
            cache, "s", project="p", instance="i", database="d",
            table="Metadata; DROP TABLE x", emulator_host="127.0.0.1:1",
        )
