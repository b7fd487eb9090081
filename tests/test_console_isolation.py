"""The SQL console cannot hurt the server (issue 68): queries run in a worker process on a
read-only snapshot, only read statements are accepted, nothing in the server's DuckDB changes
(settings, logs, the cache file), and memory, time and answer bytes are capped, each with its
own sentence. Every case goes through the console's own code path (``sql_console.run``, and
the SQL page under AppTest)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import console_process, console_snapshot, sql_console
from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.support.demo_cache import land_world
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("isolation") / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(7, 0.2))
    c = Cache(path)
    yield c
    c.close()


def file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for p in (path, path.with_name(path.name + ".wal")):
        if p.exists():
            digest.update(p.read_bytes())
    return digest.hexdigest()


def server_state(c: Cache) -> tuple:
    """What no console query may change: every setting of the server's DuckDB, its log, the
    cache file's bytes."""
    settings = c.con.execute("SELECT name, value FROM duckdb_settings() ORDER BY name").fetchall()
    logs = c.con.execute("SELECT count(*) FROM duckdb_logs").fetchone()[0]
    return dict(settings), logs, file_hash(c.path)


def workers(parent: int | None = None) -> list[int]:
    """Console worker processes whose parent is ``parent`` (this process by default)."""
    parent = os.getpid() if parent is None else parent
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"console_child.py" in cmd and int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            found.append(int(d.name))
    return found


@pytest.fixture
def untouched(cache, capfd):
    """Fails the test if the server's DuckDB or cache file changed, a worker is left, or a
    worker wrote to this process's stdout or stderr."""
    capfd.readouterr()
    before = server_state(cache)
    yield
    assert server_state(cache) == before
    assert workers() == []
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def refused(cache: Cache, sql: str, kind: type = sql_console.Refused, **limits) -> str:
    with pytest.raises(kind) as caught:
        sql_console.run(cache.cursor(), sql, **limits)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def still_serves(cache: Cache) -> None:
    frame = sql_console.run(cache.cursor(), "SELECT count(*) AS n FROM partitions").frame
    assert int(frame["n"].iloc[0]) == cache.partition_count(cache.streams()[0])


def test_logging_to_a_file_is_refused_and_the_server_lives(cache, untouched, tmp_path):
    target = tmp_path / "log"
    for sql in [f"CALL enable_logging(storage='file', storage_path='{target}')",
                f"SELECT * FROM enable_logging(storage='file', storage_path='{target}')"]:
        assert "refused" in refused(cache, sql)
    assert not target.exists()
    still_serves(cache)


def test_a_worker_that_aborts_leaves_only_a_sentence(cache, untouched, tmp_path):
    """Past the statement check (the worker run directly), DuckDB aborts its process on this
    one; the server reads the abort as one sentence and goes on."""
    target = tmp_path / "log"
    sql = f"CALL enable_logging(storage='file', storage_path='{target}')"
    with console_snapshot.lease(cache.cursor()) as db:
        outcome = console_process.run(db, sql, console_process.Limits(seconds=60))
    assert outcome.status in ("crashed", "error"), outcome
    message = str(sql_console._refusal(outcome, sql, console_process.Limits()))
    assert "\n" not in message and ("worker" in message or "files" in message), message
    assert not target.exists()
    still_serves(cache)


def test_no_setting_or_log_changes(cache, untouched):
    for sql in ["CALL enable_logging(level='trace')",
                "CALL enable_logging(level='trace', storage='stdout')",
                "FROM enable_logging(level='trace', storage='stdout')",
                "SELECT * FROM (SELECT 1) t, disable_logging()",
                "FROM truncate_duckdb_logs()",
                "SET memory_limit = '100GB'", "RESET lock_configuration",
                "PRAGMA enable_profiling", "PRAGMA disable_optimizer", "USE memory"]:
        refused(cache, sql)
    # Settings read in the worker are its own, locked ones.
    frame = sql_console.run(
        cache.cursor(), "SELECT current_setting('lock_configuration') AS locked, "
        "current_setting('enable_external_access') AS external").frame
    assert frame.to_dict("records") == [{"locked": True, "external": False}]


def test_a_worker_that_logs_to_stdout_reaches_no_log(cache, untouched):
    """Run directly in a worker, past the check: DuckDB then logs every statement to the
    worker's stdout, which goes nowhere (``untouched`` reads this process's fds)."""
    sql = "CALL enable_logging(level='trace', storage='stdout')"
    with console_snapshot.lease(cache.cursor()) as db:
        outcome = console_process.run(db, sql, console_process.Limits(seconds=60))
    assert outcome.status == "result", outcome


def test_checkpoints_and_temp_tables_are_refused(cache, untouched):
    for sql in ["CHECKPOINT", "FORCE CHECKPOINT", "CHECKPOINT c", "FROM checkpoint()",
                "SELECT * FROM force_checkpoint()",
                "EXPLAIN ANALYZE CREATE TEMP TABLE t AS FROM range(20000000)",
                "EXPLAIN CREATE TABLE t AS SELECT 1", "CREATE TEMP TABLE t AS SELECT 1",
                "VACUUM", "ANALYZE", "EXPLAIN ANALYZE INSERT INTO meta VALUES ('a', 'b')"]:
        message = refused(cache, sql)
        assert "read-only" in message or "only reads" in message, (sql, message)


def test_a_memory_bomb_stops_at_the_memory_limit(cache, untouched):
    message = refused(cache, "SELECT len(range(1000000000))", sql_console.TooMuchMemory)
    assert message.startswith("The query needs more than 1,024 MB of memory")
    still_serves(cache)


@pytest.mark.slow
def test_the_answer_is_capped_in_bytes_not_only_rows(cache, untouched):
    # 300 MB in 10,000 rows (the row cap): past the byte cap
    message = refused(cache, "SELECT repeat('x', 30000) FROM range(10000)", sql_console.TooLarge)
    assert message.startswith("The answer is larger than 32 MB")
    # 1 GB and 10 GB: DuckDB computes chunks of 2,048 rows ahead of the fetch, so the worker's
    # memory may run out before the answer's bytes are counted; either limit answers.
    for sql in ["SELECT repeat('x', 100000) FROM range(10000)",
                "SELECT repeat('x', 1000000) FROM range(10000)"]:
        with pytest.raises((sql_console.TooLarge, sql_console.TooMuchMemory)):
            sql_console.run(cache.cursor(), sql)
    small = sql_console.run(cache.cursor(), "SELECT repeat('x', 100) AS s FROM range(10)")
    assert len(small.frame) == 10 and not small.truncated


def test_a_query_deaf_to_interrupts_is_killed_at_the_deadline(cache, untouched):
    """``repeat`` of a gigabyte does not check for interrupts: the worker is killed."""
    refused(cache, "SELECT length(repeat('x', 1000000000))", sql_console.TimedOut,
            max_seconds=1.0, max_memory=4 << 30)
    still_serves(cache)


def test_answers_of_every_kind_of_type(cache, untouched):
    frame = sql_console.run(cache.cursor(), (
        "SELECT TIMESTAMP '9999-12-31 00:00:00' AS t, DATE '0001-01-01' AS d, 1::HUGEINT AS h, "
        "{'a': 1} AS s, MAP {'a': 1} AS m, INTERVAL 1 DAY AS i, [1, 2] AS l, 'x'::BLOB AS b"
    )).frame
    assert str(frame["t"].iloc[0]).startswith("9999-12-31") and frame["s"].iloc[0] == {"a": 1}
    message = refused(cache, "SELECT union_value(k := 1) AS u")
    assert "cannot show" in message and "CAST(x AS VARCHAR)" in message


def app(cache: Cache) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = str(cache.path)
    at.run()
    at.switch_page("../pages/sql.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def run_on_page(at: AppTest, sql: str) -> list[str]:
    at.selectbox(key="sql_ex").set_value("(write your own)").run()
    [t for t in at.text_area if t.key.startswith("sql_text")][0].set_value(sql).run()
    at.button(key="sql_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return [e.value for e in at.error]


@pytest.mark.slow
def test_the_page_answers_each_case_with_one_sentence(cache, untouched, tmp_path):
    at = app(cache)
    cases = {
        f"CALL enable_logging(storage='file', storage_path='{tmp_path / 'x'}')": "refused",
        "CALL enable_logging(level='trace')": "refused",
        "FORCE CHECKPOINT": "refused",
        "EXPLAIN ANALYZE CREATE TEMP TABLE t AS FROM range(20000000)": "refused",
        "SELECT len(range(1000000000))": "MB of memory",
        # 300 MB of answer: Streamlit's own message-size box must never show
        "SELECT repeat('x', 30000) FROM range(10000)": "larger than 32 MB",
    }
    for sql, why in cases.items():
        errors = run_on_page(at, sql)
        assert len(errors) == 1 and why in errors[0], (sql, errors)
        assert "\n" not in errors[0].strip()
    assert run_on_page(at, "SELECT count(*) AS n FROM partitions") == []
    [answer] = [d.value for d in at.dataframe if list(d.value.columns) == ["n"]]
    assert int(answer["n"].iloc[0]) == cache.partition_count(cache.streams()[0])


@pytest.mark.slow
def test_the_snapshot_follows_the_cache(tmp_path):
    path = tmp_path / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(3, 0.05))
        count = "SELECT count(*) AS n FROM data_change_records"
        first = int(sql_console.run(c.cursor(), count).frame["n"].iloc[0])
        with console_snapshot.lease(c.cursor()) as a, console_snapshot.lease(c.cursor()) as b:
            assert a == b  # unchanged cache: one copy
        c.con.execute("DELETE FROM data_change_records WHERE rowid % 2 = 0")
        c.con.execute("UPDATE meta SET value = value || '1' WHERE key = 'version'")
        second = int(sql_console.run(c.cursor(), count).frame["n"].iloc[0])
        assert second < first and second == c.con.execute(count).fetchone()[0]
        with console_snapshot.lease(c.cursor()) as newest:
            assert newest != a and not a.exists()  # the replaced copy is gone


def test_two_caches_of_the_same_content_each_have_their_snapshot(tmp_path):
    world = build_world(3, 0.05)
    caches = [Cache(tmp_path / f"{name}.duckdb") for name in ("a", "b")]
    try:
        for c in caches:
            land_world(c, world)
        count = "SELECT count(*) AS n FROM data_change_records"
        got = [int(sql_console.run(c.cursor(), count).frame["n"].iloc[0]) for c in caches * 2]
        assert got == [world.num_data_change_records] * 4
        with console_snapshot.lease(caches[0].cursor()) as a, \
                console_snapshot.lease(caches[1].cursor()) as b:
            assert a != b
    finally:
        for c in caches:
            c.close()


def test_the_snapshot_is_copied_before_the_first_query(tmp_path):
    """The SQL page starts the copy when it opens: the query then finds it made."""
    path = tmp_path / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(3, 0.05))
        sql_console.prepare(c.cursor)
        wait_until(lambda: not any(t.name == "console-snapshot" for t in threading.enumerate()),
                   "the snapshot's copy")
        made = set(console_snapshot.folder().glob("snapshot-*.duckdb"))
        with console_snapshot.lease(c.cursor()) as db:
            assert db in made


KILLED_PARENT = textwrap.dedent("""
    import sys
    from app import console_snapshot, sql_console
    from spark_backend.cache.store import Cache
    c = Cache(sys.argv[1])
    print(console_snapshot.folder(), flush=True)
    sql_console.run(c.cursor(), "SELECT count(*) FROM range(10000000000000)", max_seconds=600)
""")
EXITING = textwrap.dedent("""
    import sys
    from app import console_snapshot, sql_console
    from spark_backend.cache.store import Cache
    c = Cache(sys.argv[1])
    print(console_snapshot.folder(), flush=True)
    print(len(sql_console.run(c.cursor(), "FROM partitions").frame), flush=True)
""")


@pytest.mark.slow
def test_nothing_of_the_worker_outlives_the_dashboard(tmp_path):
    """A dashboard killed mid-query takes its worker with it; its snapshot folder is removed
    by the next process; a dashboard that exits removes its own."""
    path = tmp_path / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(3, 0.05))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dash = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(path)], env=env,
                            stdout=subprocess.PIPE, text=True)
    killed_folder = Path(dash.stdout.readline().strip())
    wait_until(lambda: workers(dash.pid), "the worker's start")
    [worker] = workers(dash.pid)
    dash.send_signal(signal.SIGKILL)
    dash.wait()
    wait_until(lambda: not Path(f"/proc/{worker}").exists()
          or "Z" in Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0],
          "the worker's end")
    assert killed_folder.exists()  # killed: its exit handler never ran
    done = subprocess.run([sys.executable, "-c", EXITING, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    own_folder, rows = done.stdout.split()
    assert int(rows) > 0
    assert not Path(own_folder).exists() and not killed_folder.exists()


EXITING_DURING_THE_COPY = textwrap.dedent("""
    import sys, threading
    from app import sql_console
    from spark_backend.cache.store import Cache
    c = Cache(sys.argv[1])
    # Streamlit runs page scripts on daemon threads; the copy starts from one and the
    # interpreter exits while it runs.
    starter = threading.Thread(target=sql_console.prepare, args=(c.cursor,), daemon=True)
    starter.start()
    starter.join()
    print([t.daemon for t in threading.enumerate() if t.name == "console-snapshot"], flush=True)
""")


def test_a_process_exiting_during_the_copy_ends_cleanly(tmp_path):
    """The copy started from a daemon thread is still waited for at exit: DuckDB aborts a
    process whose interpreter ends while a thread is inside it."""
    path = tmp_path / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(3, 0.05))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", EXITING_DURING_THE_COPY, str(path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "terminate called" not in done.stderr
    assert done.stdout.strip() in ("[False]", "[]")
