"""The emulator source against a real Cloud Spanner emulator (no mocks).

Without the emulator these tests skip with the install hint, except on CI (CI=true) where they
fail. Run: ``python -m pytest tests/test_emulator_source.py``.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")

from spark_backend.demo import emulator as em
from tests.support.emulator_queries import query_change_stream
from tests.support.waiting import HANG_S, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.emulator]

DIALECTS = ["googlesql", "postgresql"]
UTC = dt.UTC


def _require_emulator() -> str:
    try:
        return em.find_emulator_binary()
    except em.EmulatorNotInstalled as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"emulator missing on CI: {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def emulator():
    _require_emulator()
    with em.EmulatorProcess(churn_seconds=2) as proc:
        yield proc


_n = iter(range(1_000_000))


@pytest.fixture
def fresh_db(emulator):
    """A provisioned database of each dialect on the shared emulator: (host, names...)."""

    def make(dialect: str) -> tuple[str, str, str, str, str]:
        db = f"db{next(_n)}-{dialect[:2]}"
        em.provision(emulator.host, "test-project", "test-instance", db, dialect)
        return emulator.host, "test-project", "test-instance", db, dialect

    return make


def _cmdlines_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# ------------------------------------------------------------------ not installed


def test_missing_binary_message(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere" / "emulator_main"
    monkeypatch.setenv("SPANNER_EMULATOR_BINARY", str(missing))
    with pytest.raises(em.EmulatorNotInstalled) as err:
        em.EmulatorProcess()
    msg = str(err.value)
    assert str(missing) in msg
    assert "gcloud components install cloud-spanner-emulator" in msg
    assert "google-cloud-cli-spanner-emulator" in msg
    assert "SPANNER_EMULATOR_BINARY=/path/to/emulator_main" in msg
    assert isinstance(err.value, RuntimeError)
    with pytest.raises(em.EmulatorNotInstalled):
        em.start_emulator_world()


# ------------------------------------------------------------------ process


def test_process_start_stop_frees_port_and_leaves_no_orphan():
    _require_emulator()
    proc = em.EmulatorProcess(churn_seconds=2)
    with proc:
        host, pid, port = proc.host, proc.pid, proc.port
        assert host == f"127.0.0.1:{port}"
        assert proc.running and not em.port_is_free(port)
        assert _cmdlines_mentioning(f"127.0.0.1:{port}") == [pid]
        assert "--override_change_stream_partition_token_alive_seconds" in proc.command(port)
    assert not proc.running
    assert _gone(pid)
    assert em.port_is_free(port)
    assert _cmdlines_mentioning(f"127.0.0.1:{port}") == []
    proc.stop()  # idempotent


def test_process_stopped_on_keyboard_interrupt():
    _require_emulator()
    with pytest.raises(KeyboardInterrupt), em.EmulatorProcess() as proc:
        pid, port = proc.pid, proc.port
        raise KeyboardInterrupt
    assert _gone(pid) and em.port_is_free(port)


def test_process_that_dies_reports_its_output():
    _require_emulator()
    with pytest.raises(em.EmulatorStartError) as err:
        em.EmulatorProcess(extra_args=["--no_such_flag_for_test"]).start()
    assert "no_such_flag_for_test" in str(err.value)
    assert _cmdlines_mentioning("--no_such_flag_for_test") == []


# ------------------------------------------------------------------ provision


@pytest.mark.parametrize("dialect", DIALECTS)
def test_provision_creates_schema_and_is_idempotent(fresh_db, dialect):
    host, project, instance, database, _ = fresh_db(dialect)
    em.provision(host, project, instance, database, dialect)  # second call: no-op
    db = em.open_database(host, project, instance, database, dialect)
    assert em.database_dialect_of(db) == dialect
    db.reload()
    ddl = "\n".join(db.ddl_statements)
    assert "Accounts" in ddl and "Transfers" in ddl
    assert "CREATE CHANGE STREAM" in ddl and "BankStream" in ddl
    other = "postgresql" if dialect == "googlesql" else "googlesql"
    with pytest.raises(em.EmulatorProvisionError, match="already exists with dialect"):
        em.provision(host, project, instance, database, other)


# ------------------------------------------------------------------ workload


def test_workload_run_n_is_deterministic_and_reports_commit_timestamps(fresh_db):
    runs = []
    for _ in range(2):
        w = em.Workload(*fresh_db("googlesql"), seed=5, accounts=6)
        before = dt.datetime.now(UTC)
        done = w.run_n(12)
        w.close()
        assert len(done) == 12
        committed = w.committed
        assert committed[0].action == "seed" and len(committed) == 13
        assert committed[1:] == done
        stamps = [c.commit_timestamp for c in committed]
        assert all(s.tzinfo is not None and s >= before - dt.timedelta(seconds=5) for s in stamps)
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        assert all(c.transaction_tag == f"app=bank,action={c.action}" for c in committed)
        runs.append([(c.action, c.writes) for c in committed])
    assert runs[0] == runs[1]
    assert {"transfer"} <= {a for a, _ in runs[0]}


def _workload_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "emulator-workload" and t.is_alive()]


def test_workload_background_thread(fresh_db):
    w = em.Workload(*fresh_db("postgresql"), seed=2, rate_per_s=50)
    with w:
        wait_until(lambda: len(w.committed) >= 10 or w.errors,
                   "the background workload committed 10 transactions")
    n = len(w.committed)
    assert n >= 10 and not w.errors
    assert not _workload_threads()  # stopped: its thread has ended, nothing commits any more
    assert len(w.committed) == n


# ------------------------------------------------------------------ change stream


def _decode(row, dialect):
    """(kind, payload) from one read-function row; payload in the PostgreSQL JSON shape."""
    if dialect == "postgresql":
        (rec,) = row[0].items()
        kind, body = rec
        if kind == "child_partitions_record":
            body = dict(body, start_timestamp=_ts(body["start_timestamp"]))
        if kind == "data_change_record":
            body = dict(body, commit_timestamp=_ts(body["commit_timestamp"]))
        return kind, body
    data, heartbeat, children = row[0][0]
    if children:
        ts, seq, parts = children[0]
        return "child_partitions_record", {
            "start_timestamp": ts,
            "record_sequence": seq,
            "child_partitions": [
                {"token": t, "parent_partition_tokens": list(p)} for t, p in parts
            ],
        }
    if heartbeat:
        return "heartbeat_record", {"timestamp": heartbeat[0][0]}
    names = [
        "commit_timestamp", "record_sequence", "server_transaction_id",
        "is_last_record_in_transaction_in_partition", "table_name", "column_types", "mods",
        "mod_type", "value_capture_type", "number_of_records_in_transaction",
        "number_of_partitions_in_transaction", "transaction_tag", "is_system_transaction",
    ]  # fmt: skip
    body = dict(zip(names, data[0], strict=True))
    body["mods"] = [{"keys": k, "new_values": n, "old_values": o} for k, n, o in body["mods"]]
    return "data_change_record", body


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _follow(db, dialect, start, end):
    """Query the initial partition set and all descendants; returns (records, children)."""
    initial = [_decode(r, dialect) for r in query_change_stream(db, dialect, em.DEFAULT_STREAM,
                                                                    start, end, None)]
    records, parents, queue = [], {}, []
    for kind, body in initial:
        assert kind == "child_partitions_record"
        for child in body["child_partitions"]:
            parents[child["token"]] = set(child["parent_partition_tokens"])
            queue.append((child["token"], body["start_timestamp"]))
    seen = set()
    while queue:
        token, ts = queue.pop()
        if token in seen:
            continue
        seen.add(token)
        for kind, body in (_decode(r, dialect) for r in query_change_stream(
                db, dialect, em.DEFAULT_STREAM, ts, end, token)):
            if kind == "data_change_record":
                records.append((token, body))
            elif kind == "child_partitions_record":
                for child in body["child_partitions"]:
                    parents.setdefault(child["token"], set()).update(
                        child["parent_partition_tokens"])
                    queue.append((child["token"], body["start_timestamp"]))
    return initial, records, parents


@pytest.mark.parametrize("dialect", DIALECTS)
def test_initial_query_returns_child_partitions(fresh_db, dialect):
    db = em.open_database(*fresh_db(dialect))
    now = dt.datetime.now(UTC)
    rows = [_decode(r, dialect) for r in query_change_stream(
        db, dialect, em.DEFAULT_STREAM, now, now + dt.timedelta(seconds=1), None)]
    assert rows and all(kind == "child_partitions_record" for kind, _ in rows)
    children = [c for _, body in rows for c in body["child_partitions"]]
    assert children and all(c["parent_partition_tokens"] == [] for c in children)
    assert len({c["token"] for c in children}) == len(children)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_committed_transaction_appears_exactly_once(fresh_db, dialect):
    names = fresh_db(dialect)
    start = dt.datetime.now(UTC)
    w = em.Workload(*names, seed=11, accounts=8)
    db = em.open_database(*names)
    w.run_n(60)
    # Partitions live 2..4 s of the emulator's clock: rounds of transactions, each followed to
    # its end, until a partition has split or merged (the rounds are counted, not timed).
    for _ in range(100):
        end = w.committed[-1].commit_timestamp + dt.timedelta(milliseconds=500)
        while dt.datetime.now(UTC) <= end:  # the stream is read to an end in the past
            time.sleep(0.01)
        initial, records, parents = _follow(db, dialect, start, end)
        first_gen = {c["token"] for _, b in initial for c in b["child_partitions"]}
        if set(parents) - first_gen:
            break
        w.run_n(20)
    assert set(parents) - first_gen, "no partition split or merged in 100 rounds"
    committed = w.committed  # the seeding transaction too
    assert len(committed) > 50

    by_txn = defaultdict(list)
    for token, rec in records:
        assert start <= rec["commit_timestamp"] <= end
        by_txn[rec["server_transaction_id"]].append((token, rec))
    seen_at = {}
    for txn_id, recs in by_txn.items():
        stamps = {r["commit_timestamp"] for _, r in recs}
        assert len(stamps) == 1
        stamp = stamps.pop()
        assert stamp not in seen_at, "two server transactions with one commit timestamp"
        seen_at[stamp] = txn_id
        assert len(recs) == recs[0][1]["number_of_records_in_transaction"]
        assert len({t for t, _ in recs}) == recs[0][1]["number_of_partitions_in_transaction"]

    for txn in committed:
        txn_id = seen_at.pop(txn.commit_timestamp, None)
        assert txn_id is not None, f"missing from the change stream: {txn}"
        got = Counter(
            (r["table_name"], next(iter(m["keys"].values())), r["mod_type"])
            for _, r in by_txn[txn_id]
            for m in r["mods"]
        )
        assert got == Counter((w_.table, w_.key, w_.mod_type) for w_ in txn.writes)
    assert not seen_at, "change stream holds transactions the workload did not commit"


def test_start_emulator_world():
    _require_emulator()
    with em.start_emulator_world(dialect="postgresql", churn_seconds=2) as world:
        pid = world.process.pid
        assert world.host == world.process.host and world.dialect == "postgresql"
        w = world.workload(seed=1)
        w.run_n(3)
        db = em.open_database(world.host, world.project, world.instance, world.database,
                              world.dialect)
        rows = list(query_change_stream(db, "postgresql", world.stream, world.created_at,
                                           world.created_at, None))
        assert rows
    assert _gone(pid)


def test_sigterm_is_enough_to_stop():
    """stop() escalates to SIGKILL only after a timeout; the emulator obeys SIGTERM."""
    _require_emulator()
    with em.EmulatorProcess() as proc:
        os.killpg(proc.pid, signal.SIGTERM)
        # Nothing else signals it before it exits: it ended because of the SIGTERM (a hang
        # would show as the bound passing, not as a slow machine).
        proc._proc.wait(timeout=HANG_S)
        assert proc._proc.returncode != -signal.SIGKILL
