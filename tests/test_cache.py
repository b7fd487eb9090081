"""The DuckDB cache: idempotent ingest, duplicates, chunks of one wave in one transaction."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_backend.cache.ingest import ingest_stream
from spark_backend.cache.store import Cache
from spark_backend.model.errors import CacheError
from spark_backend.model.records import arrow_schema, from_change_record, to_arrow_batch

ROOT = Path(__file__).resolve().parent.parent


def _hb(token, ts):
    return from_change_record({"heartbeat_record": {"timestamp": ts}}, token)


def _dc(token, seq="00000000"):
    return from_change_record({"data_change_record": {
        "commit_timestamp": "2022-09-27T12:30:00.123456Z", "record_sequence": seq,
        "server_transaction_id": "tx1", "is_last_record_in_transaction_in_partition": True,
        "table_name": "T", "column_types": [], "mods": [{"keys": {"k": "1"}, "new_values": {},
                                                        "old_values": {}}],
        "mod_type": "INSERT", "value_capture_type": "NEW_ROW",
        "number_of_records_in_transaction": 1, "number_of_partitions_in_transaction": 1,
        "transaction_tag": "", "is_system_transaction": False}}, token)


def _files(tmp_path, *chunks):
    folder = tmp_path / "wave"
    folder.mkdir()
    for i, rows in enumerate(chunks):
        pq.write_table(pa.Table.from_batches([to_arrow_batch(rows)], arrow_schema()),
                       folder / f"part-{i}.parquet")
    return str(folder / "*.parquet")


@pytest.fixture
def cache(tmp_path):
    c = Cache(tmp_path / "c.duckdb")
    c.ensure_stream("s", system="spanner")
    yield c
    c.close()


def test_a_duplicate_split_across_files_of_one_wave_is_counted(cache, tmp_path):
    batch = _files(tmp_path, [_dc("p"), _hb("p", "2022-09-27T12:31:00Z")],
                   [_dc("p"), _dc("p", "00000001")])
    stats = cache.ingest("s", 1, batch)
    assert stats.data_change == 2 and stats.duplicates == 1
    assert cache.con.execute("SELECT sum(copies) FROM data_change_records").fetchone()[0] == 3
    # Landing the same wave again (a resumed pull re-reading) stores and counts nothing.
    again = cache.ingest("s", 2, batch)
    assert (again.data_change, again.duplicates) == (0, 0)
    assert cache.con.execute("SELECT sum(copies) FROM data_change_records").fetchone()[0] == 3
    assert cache.con.execute("SELECT count(*) FROM mods").fetchone()[0] == 2


def test_a_failing_ingest_leaves_the_cache_as_it_was(cache, tmp_path):
    cache.ingest("s", 1, pa.Table.from_batches([to_arrow_batch([_dc("p")])]))
    version = cache.version()
    broken = tmp_path / "broken"
    broken.mkdir()
    good = _files(tmp_path, [_dc("p", "00000009")])
    (broken / "part-0.parquet").write_bytes(open(good.replace("*", "part-0"), "rb").read())
    (broken / "part-1.parquet").write_bytes(b"not parquet")
    with pytest.raises(Exception):
        cache.ingest("s", 2, str(broken / "*.parquet"))
    assert cache.con.execute("SELECT count(*) FROM data_change_records").fetchone()[0] == 1
    assert cache.version() == version


def test_stream_names_and_files_are_checked(tmp_path):
    with pytest.raises(CacheError, match="not a valid stream name"):
        Cache(tmp_path / "a.duckdb").ensure_stream("bad name;", system="spanner")
    (tmp_path / "text.duckdb").write_text("hello")
    with pytest.raises(CacheError, match="not a DuckDB cache file"):
        Cache(tmp_path / "text.duckdb")
    c = Cache(tmp_path / "b.duckdb")
    with pytest.raises(CacheError, match="holds no stream yet"):
        c.resolve_stream(None)


@pytest.mark.parametrize("read_only", [False, True])
def test_a_cache_draws_no_progress_bar_and_its_settings_stay_locked(tmp_path, read_only):
    """DuckDB draws a progress bar on stdout for a query past 2 s (it came before a query's
    printed result); off on every connection and cursor, and the configuration locked after."""
    path = tmp_path / "c.duckdb"
    Cache(path).close()
    with Cache(path, read_only=read_only) as cache:
        for con in (cache.con, cache.cursor()):
            assert con.execute("SELECT current_setting('enable_progress_bar'), "
                               "current_setting('lock_configuration')").fetchone() == (False, True)
            with pytest.raises(duckdb.InvalidInputException, match="locked"):
                con.execute("SET enable_progress_bar = true")
        # a second connection of this process finds the database locked already: it opens
        with Cache(path, read_only=read_only) as again:
            assert again.con.execute(
                "SELECT current_setting('lock_configuration')").fetchone() == (True,)


def test_memory_setting_is_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("CSI_DUCKDB_MEMORY", "lots")
    with pytest.raises(CacheError, match="is not a size"):
        Cache(tmp_path / "m.duckdb")
    monkeypatch.setenv("CSI_DUCKDB_MEMORY", "32MB")
    with pytest.raises(CacheError, match="'32MB' is below 64MB, the least a cache being "):
        Cache(tmp_path / "m.duckdb")
    assert not (tmp_path / "m.duckdb").exists()


def test_a_pulling_process_caps_duckdb_lower_and_the_environment_overrides(tmp_path, monkeypatch):
    from spark_backend.cli import _open_cache

    def limit(cache):
        (value,) = cache.con.execute("SELECT current_setting('memory_limit')").fetchone()
        cache.close()
        return value

    monkeypatch.delenv("CSI_DUCKDB_MEMORY", raising=False)
    assert limit(_open_cache(str(tmp_path / "pull.duckdb"), landing="pull")).startswith("61.")
    assert limit(_open_cache(str(tmp_path / "import.duckdb"), landing="import")  # MiB
                 ).startswith("122")
    assert limit(_open_cache(str(tmp_path / "look.duckdb"))).startswith("953")
    monkeypatch.setenv("CSI_DUCKDB_MEMORY", "2GB")
    assert limit(_open_cache(str(tmp_path / "big.duckdb"), landing="pull")).startswith("1.8")


def test_a_pulling_process_gives_duckdb_fewer_threads_and_the_environment_overrides(
        tmp_path, monkeypatch):
    from spark_backend.cli import _open_cache
    from spark_backend.model.config import PULL_THREADS

    def threads(cache):
        (value,) = cache.con.execute("SELECT current_setting('threads')").fetchone()
        cache.close()
        return value

    monkeypatch.delenv("CSI_DUCKDB_THREADS", raising=False)
    assert threads(_open_cache(str(tmp_path / "pull.duckdb"), landing="pull")) == PULL_THREADS
    assert PULL_THREADS == max(1, (os.cpu_count() or 1) // 4)
    (default,) = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()
    assert threads(_open_cache(str(tmp_path / "look.duckdb"))) == default
    monkeypatch.setenv("CSI_DUCKDB_THREADS", "3")
    assert threads(_open_cache(str(tmp_path / "three.duckdb"), landing="pull")) == 3
    for bad in ("many", "0", "-2"):
        monkeypatch.setenv("CSI_DUCKDB_THREADS", bad)
        with pytest.raises(CacheError, match=f"CSI_DUCKDB_THREADS='{bad}' is not a thread "
                                             "count; use a whole number from 1 to 1024"):
            Cache(tmp_path / "bad.duckdb")


def test_a_pulling_process_has_duckdbs_allocator_give_freed_memory_back(tmp_path):
    """The landing cache flushes DuckDB's allocator past 8 MB and purges it on a background
    thread (a pull's median memory, not its peak: see ``config.PULL_ALLOCATOR``); a cache
    the dashboard opens keeps DuckDB's own settings (its queries reuse what they freed)."""
    from spark_backend.cli import _open_cache

    def allocator(cache):
        row = cache.con.execute("SELECT current_setting('allocator_flush_threshold'), "
                                "current_setting('allocator_background_threads')").fetchone()
        cache.close()
        return row

    assert allocator(_open_cache(str(tmp_path / "pull.duckdb"), landing="pull")) == (
        "7.6 MiB", True)
    assert allocator(_open_cache(str(tmp_path / "look.duckdb"))) == ("128.0 MiB", False)


def test_arrows_allocator_gives_freed_pages_back_in_the_tools_processes():
    """mimalloc (Arrow's allocator) reads its options once, when pyarrow loads: importing the
    package first sets them; a user's own setting wins. MIMALLOC_VERBOSE prints what the
    allocator itself read."""
    def purge_delay(**env):
        full = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
        out = subprocess.run([sys.executable, "-c", "import spark_backend, pyarrow"],
                             env={**full, "MIMALLOC_VERBOSE": "1", **env}, cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=True)
        return re.search(r"option 'purge_delay': (-?\d+)", out.stderr).group(1)

    assert purge_delay() == "0"
    assert purge_delay(MIMALLOC_PURGE_DELAY="250") == "250"


_ARENA_PROBE = """
import ctypes, os, sys, tempfile, threading
if sys.argv[1] in ("package", "own"):
    import spark_backend
if sys.argv[1] == "package":  # a process the package starts: it inherits the environment
    os.execv(sys.executable, [sys.executable, "-c", os.environ["ARENA_PROBE"], "started"])
barrier = threading.Barrier(16)
def work():
    keep = [bytearray(1000) for _ in range(100)]  # malloc'd by this thread
    barrier.wait()  # all 16 alive at once
libc = ctypes.CDLL("libc.so.6")
threads = [threading.Thread(target=work) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile("r", suffix=".xml") as out:
    fp = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(fp))
    libc.fclose(ctypes.c_void_p(fp))
    print(os.environ.get("MALLOC_ARENA_MAX"), out.read().count("<heap nr="))
"""


def test_the_tools_processes_keep_two_malloc_arenas():
    """glibc's malloc reads MALLOC_ARENA_MAX when a process starts: the package sets it for
    the processes it starts (Spark's JVM and workers inherit it) and leaves the malloc of the
    process importing it as the user started it; a user's own setting wins. 16 threads
    allocating at once would otherwise get arenas of their own (up to 8 per core)."""
    def arenas(mode, **env):
        full = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
        full["ARENA_PROBE"] = _ARENA_PROBE
        out = subprocess.run([sys.executable, "-c", _ARENA_PROBE, mode], env={**full, **env},
                             cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
        setting, heaps = out.stdout.split()
        return setting, int(heaps)

    assert arenas("package") == ("2", 2)
    assert arenas("package", MALLOC_ARENA_MAX="1") == ("1", 1)
    setting, heaps = arenas("without")
    assert setting == "None" and heaps > 2
    _, own = arenas("own")  # importing the package tunes nothing in the importing process
    assert own > 2


def _demo_data_change_rows():
    """A small demo world and its data change records as cache rows."""
    from spark_backend.demo.world import build_world

    world = build_world(scale=0.05)
    rows = [from_change_record(r, p.token) for p in world.partitions
            for r in world.query(p.token, p.start, world.end, 10_000)]
    return world, [r for r in rows if r["kind"] == "data_change"]


def _summary_from_rows(rows: list[dict]) -> list[tuple]:
    """The ``transactions`` rows, computed in Python from the record rows themselves."""
    import datetime as dt
    import json

    by_id: dict[str, list[dict]] = {}
    for row in rows:
        by_id.setdefault(row["server_transaction_id"], []).append(row)
    want = []
    for tid, records in sorted(by_id.items()):
        first_ns = min(r["ts_ns"] for r in records)
        want.append((
            "s", tid,
            dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=first_ns // 1000),
            len(records),
            max(r["number_of_records_in_transaction"] for r in records),
            sorted({r["partition_token"] for r in records}),
            max(r["number_of_partitions_in_transaction"] for r in records),
            sorted({r["table_name"] for r in records} - {None}),
            sorted({r["mod_type"] for r in records}),
            next((r["transaction_tag"] for r in records if r["transaction_tag"]), None)
            or records[0]["transaction_tag"],
            sum(len(json.loads(r["mods"] or "[]")) for r in records),
        ))
    return want


def test_the_transaction_summary_matches_the_records_whether_built_per_landing_or_at_a_pulls_end(
        tmp_path, monkeypatch):
    """One statement builds ``transactions`` (``store.rebuild_transactions``): at the end of each
    ``Cache.ingest`` for the transactions it added to, and at a pull's end (any status) for
    all its landings. Either way the rows equal a summary computed here from the records:
    transactions that span landings (and pulls) counted once, NULLs in no list."""
    from spark_backend.cache import ingest, store
    from spark_backend.model.records import batched

    world, rows = _demo_data_change_rows()
    for row in rows[::7]:  # other systems' records can lack a table (lists keep no NULL)
        row["table_name"] = None
    batches = [to_arrow_batch(chunk) for chunk in batched(rows, 100)]
    assert len(batches) > 6 and len(world.transactions) > 100
    want = _summary_from_rows(rows)
    assert len(want) == len(world.transactions)
    assert any(len(w[5]) > 1 for w in want)  # some span partitions, so landings
    landing = Cache(tmp_path / "landing.duckdb")
    deferred = Cache(tmp_path / "deferred.duckdb")
    for c in (landing, deferred):
        c.ensure_stream("s", system="spanner")
    one = landing.begin_pull("s", "test", None, None, None)
    for batch in batches:
        landing.ingest("s", one, batch)  # summarized at the end of every landing
    monkeypatch.setattr(store, "_SUMMARY_SLICE_RECORDS", 50)  # many slices
    first = deferred.begin_pull("s", "test", None, None, None)
    half = len(batches) // 2
    ingest.ingest_stream(deferred, "s", first, batches[:half], chunk_rows=250)
    assert deferred.con.execute("SELECT count(*) FROM transactions").fetchone() == (0,)
    deferred.finish_pull(first, "failed", error="cut off")  # any end summarizes
    (partial,) = deferred.con.execute("SELECT count(*) FROM transactions").fetchone()
    assert 0 < partial < len(world.transactions)
    second = deferred.begin_pull("s", "test", None, None, None)
    ingest.ingest_stream(deferred, "s", second, batches[half - 1:], chunk_rows=250)
    deferred.finish_pull(second, "complete")
    query = "SELECT * FROM transactions ORDER BY server_transaction_id"
    assert landing.con.execute(query).fetchall() == want
    assert deferred.con.execute(query).fetchall() == want
    assert deferred.con.execute(
        "SELECT count(*) FROM meta WHERE key LIKE 'transactions_unsummarized:%'").fetchone() \
        == (0,)
    landing.close()
    deferred.close()


def test_a_summary_brought_up_to_date_while_a_pull_lands_leaves_its_end_only_what_changed(
        tmp_path, monkeypatch):
    """``Cache.summarize_landed`` (a pull's lander, while it waits) summarizes what landed so
    far and keeps the pull's mark; each later summary, the pull's end included, rebuilds only
    the transactions that got records since. The end's rows equal a summary of all the
    records, transactions that span the summaries included."""
    from spark_backend.cache import ingest, store
    from spark_backend.model.records import batched

    world, rows = _demo_data_change_rows()
    batches = [to_arrow_batch(chunk) for chunk in batched(rows, 100)]
    cut = [len(batches) // 3 * 100, 2 * (len(batches) // 3) * 100]
    parts = [rows[:cut[0]], rows[cut[0]:cut[1]], rows[cut[1]:]]
    ids = [{r["server_transaction_id"] for r in part} for part in parts]
    assert ids[0] & ids[1] and ids[1] & ids[2]  # transactions span the summaries
    rebuilt: list[int] = []  # transactions rebuilt by each summary
    slices: list[list[int]] = []  # ... by each of its rebuilds (a slice of their ids each)
    inserts: list[list[int]] = []  # rows each rebuild's statements inserted (its own slices)
    rebuild = store.rebuild_transactions

    class Inserts:  # the connection, counting what each INSERT wrote
        def __init__(self, con):
            self.con = con

        def execute(self, sql, *args):
            result = self.con.execute(sql, *args)
            if sql.lstrip().startswith("INSERT"):
                inserts[-1].append(result.fetchone()[0])
            return result

    def counting(con, stream, touched):
        (n,) = con.execute(f"SELECT count(*) FROM {touched}").fetchone()
        rebuilt[-1] += n
        slices[-1].append(n)
        inserts.append([])
        rebuild(Inserts(con), stream, touched)

    monkeypatch.setattr(store, "rebuild_transactions", counting)
    monkeypatch.setattr(store, "_SUMMARY_SLICE_RECORDS", 50)  # many slices
    monkeypatch.setattr(store, "_CHANGED_SLICE_RECORDS", 200)  # ... of what changed, too
    cache = Cache(tmp_path / "early.duckdb")
    cache.ensure_stream("s", system="spanner")
    pull = cache.begin_pull("s", "test", None, None, None)
    query = "SELECT * FROM transactions ORDER BY server_transaction_id"
    marks = "SELECT count(*) FROM meta WHERE key LIKE 'transactions_unsummarized:%'"
    for start, end in [(0, cut[0]), (cut[0], cut[1])]:
        ingest.ingest_stream(cache, "s", pull, batches[start // 100:end // 100],
                             chunk_rows=250)
        rebuilt.append(0)
        slices.append([])
        assert cache.summarize_landed("s")
        assert cache.con.execute(query).fetchall() == _summary_from_rows(rows[:end])
        assert cache.con.execute(marks).fetchone() == (1,)  # the end still summarizes
    ingest.ingest_stream(cache, "s", pull, batches[cut[1] // 100:], chunk_rows=250)
    rebuilt.append(0)
    slices.append([])
    cache.finish_pull(pull, "complete")
    assert cache.con.execute(query).fetchall() == _summary_from_rows(rows)
    assert cache.con.execute(marks).fetchone() == (0,)
    assert rebuilt == [len(ids[0]), len(ids[1]), len(ids[2])]
    assert len(ids[1]) < len(ids[0] | ids[1])  # the second rebuilt less than all
    # what changed since an early summary is found a slice of the transactions at a time
    # (at once it ran out of a 1M-record pull's 64MB), by the hash of their ids
    assert len(slices[0]) == 1  # without an early summary before: all at once, as ever
    records = [cut[1], len(rows)]
    for summary, n in zip(slices[1:], records, strict=True):
        assert len(summary) == -(-n // 200), summary
        assert 0 < max(summary) < sum(summary)
    # ... and each rebuild slices that slice again: none of its statements gets all of it.
    # Both slicings once took the hash modulo their counts, so when the counts shared a
    # factor, one of a rebuild's statements got the whole slice (a 1M-record pull's end at
    # 2 ms: 6 slices of what changed, each rebuilt in 2, one of them empty, ran out of 64MB).
    assert sum(len(rows) > 1 for rows in inserts) > 2
    for rows in inserts:
        assert min(rows) > 0, inserts  # every statement of a rebuild got a share
    cache.close()


def _single_record_transactions(tmp_path, memory_limit: str, records: int):
    """A cache opened with ``memory_limit`` and a pull of ``records`` data records, each a
    transaction of its own, landed and not summarized yet (the pull's end does that)."""
    from spark_backend.model.records import batched

    _, rows = _demo_data_change_rows()
    copies = []
    for i in range(records):  # the world's records again, at other times, alone each
        row = dict(rows[i % len(rows)])
        row["ts_ns"] += (i // len(rows)) * 10**12
        row["server_transaction_id"] = f"t{i:08d}"
        row["record_sequence"] = "00000000"
        copies.append(row)
    cache = Cache(tmp_path / "single.duckdb", memory_limit=memory_limit, threads=1)
    cache.ensure_stream("s", system="spanner")
    pull_id = cache.begin_pull("s", "test", None, None, None)
    for chunk in batched(copies, 1_000):  # a transaction each, as a pull's tasks land
        ingest_stream(cache, "s", pull_id, [to_arrow_batch(chunk)])
    return cache, pull_id


@pytest.mark.slow  # integration-heavy: lands and summarizes 100,000 transactions three times
def test_a_pulls_summary_gets_more_memory_than_its_landings_when_duckdb_refuses_it(
        tmp_path, monkeypatch):
    """A pull lands in ``PULL_MEMORY_LIMIT``; its transaction summary needs more when its
    records are mostly transactions of their own. The pull's end then opens the connection
    again with ``DEFAULT_MEMORY_LIMIT`` and summarizes; a limit the user set in
    ``$CSI_DUCKDB_MEMORY`` is a cap: there DuckDB's refusal stands and the mark stays (the
    next open without it summarizes, the same way). A summary at the pull's tail
    (``summarize_landed``) that DuckDB refuses leaves it all to the end."""
    from spark_backend.model.config import DEFAULT_MEMORY_LIMIT, PULL_MEMORY_LIMIT

    monkeypatch.delenv("CSI_DUCKDB_MEMORY", raising=False)
    # The summary of 60,000 fits in 64MB, 75,000 no longer (single thread). Landing in less
    # than 64MB is no option: the checkpoint a commit starts then does not fit.
    records, small = 100_000, PULL_MEMORY_LIMIT
    cache, pull_id = _single_record_transactions(tmp_path, small, records)
    cache.con.execute("CHECKPOINT")  # as the pull's end does first
    with pytest.raises(duckdb.OutOfMemoryException):  # it does not fit where it landed
        with cache.transaction():
            cache.summarize_transactions("s")
    assert cache.summarize_landed("s") is False  # at a pull's tail: left to the end
    assert cache.con.execute("SELECT count(*) FROM transactions").fetchone() == (0,)
    cache.finish_pull(pull_id, "complete")
    assert cache.memory_limit == DEFAULT_MEMORY_LIMIT
    assert cache.con.execute("SELECT count(*), sum(records_seen) FROM transactions"
                             ).fetchone() == (records, records)
    assert cache.con.execute("SELECT count(*) FROM meta WHERE key LIKE "
                             "'transactions_unsummarized:%'").fetchone() == (0,)
    cache.close()

    monkeypatch.setenv("CSI_DUCKDB_MEMORY", small)
    (tmp_path / "single.duckdb").unlink()
    cache, pull_id = _single_record_transactions(tmp_path, small, records)
    with pytest.raises(duckdb.OutOfMemoryException):
        cache.finish_pull(pull_id, "complete")
    assert cache.memory_limit == small
    assert cache.con.execute("SELECT status FROM pulls").fetchone() == ("complete",)
    assert cache.con.execute("SELECT count(*) FROM meta WHERE key LIKE "
                             "'transactions_unsummarized:%'").fetchone() == (1,)
    cache.close()
    monkeypatch.delenv("CSI_DUCKDB_MEMORY")  # the next open summarizes what is marked
    cache = Cache(tmp_path / "single.duckdb", memory_limit=small, threads=1)
    assert cache.memory_limit == DEFAULT_MEMORY_LIMIT
    assert cache.con.execute("SELECT count(*), sum(records_seen) FROM transactions"
                             ).fetchone() == (records, records)
    cache.close()


# Made by the previous release (schema 1): `pull --source demo --demo-scale 0.02` at 8ac9fc5.
SCHEMA_1_CACHE = ROOT / "fixtures" / "caches" / "schema-v1-demo.duckdb.gz"
_GROWING = ("data_change_records", "mods", "transactions", "heartbeats")


def _keys_and_indexes(con) -> tuple[set[str], set[str]]:
    keyed = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_constraints() WHERE constraint_type IN "
        "('PRIMARY KEY', 'UNIQUE')").fetchall()}
    indexed = {r[0] for r in con.execute("SELECT table_name FROM duckdb_indexes()").fetchall()}
    return keyed, indexed


def _counts(con) -> dict[str, int]:
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in _GROWING}


def test_the_tables_that_grow_with_the_records_carry_no_key_index(cache):
    # DuckDB holds a key's ART index in memory and checks it at every insert; ingest keeps
    # the records unique itself.
    keyed, indexed = _keys_and_indexes(cache.con)
    assert not (keyed | indexed) & set(_GROWING)
    assert {"partitions", "pulls", "streams"} <= keyed  # the small tables keep theirs
    batch = to_arrow_batch([_dc("p1"), _dc("p2"), _hb("p1", "2022-09-27T12:30:01Z")])
    first = cache.ingest("s", None, batch)
    again = cache.ingest("s", None, batch, count_existing_as_duplicates=True)  # a file again
    assert (first.data_change, first.heartbeats) == (2, 1)
    assert (again.data_change, again.heartbeats, again.duplicates) == (0, 0, 3)
    assert _counts(cache.con) == {"data_change_records": 2, "mods": 2, "transactions": 1,
                                  "heartbeats": 1}
    assert cache.con.execute("SELECT sum(copies) FROM data_change_records").fetchone() == (4,)


def test_a_schema_1_cache_is_read_as_it_is_and_migrated_at_a_read_write_open(tmp_path):
    import gzip
    import hashlib

    path = tmp_path / "old.duckdb"
    path.write_bytes(gzip.decompress(SCHEMA_1_CACHE.read_bytes()))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with duckdb.connect(str(path), read_only=True) as con:
        keyed, indexed = _keys_and_indexes(con)
        assert {"data_change_records", "transactions", "heartbeats"} <= keyed
        assert "mods" in indexed
        counts = _counts(con)
    assert min(counts.values()) > 0

    reader = Cache(path, read_only=True)  # the dashboard: reads it, changes nothing
    try:
        assert _counts(reader.con) == counts
    finally:
        reader.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before

    # The report reads it read-only, as it is...
    out = subprocess.run([sys.executable, "-m", "spark_backend", "report", "--cache", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "stream DemoStream (spanner)" in out.stdout
    assert f"records: {counts['data_change_records']} data change" in out.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    # ...and the next read-write open (the dashboard's, a pull's or an import's) migrates it.
    Cache(path).close()
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                           ).fetchone() == ("2",)
        keyed, indexed = _keys_and_indexes(con)
        assert not (keyed | indexed) & set(_GROWING)
        assert _counts(con) == counts
        # the view over the rebuilt tables still reads them
        assert con.execute("SELECT count(*) FROM progress_marks").fetchone()[0] >= (
            counts["data_change_records"] + counts["heartbeats"])


def _record_at(token, ns, seq, kind):
    ts = f"2022-09-27T12:30:00.{ns:09d}Z"
    if kind == "hb":
        return _hb(token, ts)
    if kind == "end":
        return from_change_record({"child_partitions_record": {
            "start_timestamp": ts, "record_sequence": seq,
            "child_partitions": [{"token": f"{token}-child", "parent_partition_tokens": [token]}]}},
            token)
    row = _dc(token, seq)
    row["ts_ns"] += ns - 123_456_000
    return row


def _deliveries(seed: int) -> list[list[dict]]:
    """Landings as readers deliver them: each partition in slices from where the last one
    stopped, now and then read again from a slice's last time (a resumed read) or from
    anywhere (a read again, also after it ended); a record now and then twice in one landing,
    one after its partition's end, and records known by another identity or by no partition."""
    import random

    rng = random.Random(seed)
    parts = {}
    for p in range(4):
        token = f"p{p}"
        rows = []
        for i in range(40):
            kind = rng.choice(["dc", "dc", "dc", "hb"])
            rows.append(_record_at(token, 1000 * (i + 1) + p, f"{i:08d}", kind))
            if kind == "dc" and rng.random() < 0.2:  # two records at one time
                rows.append(_record_at(token, 1000 * (i + 1) + p, f"{i:08d}b", "dc"))
        rows.append(_record_at(token, 1000 * 41 + p, "99999999", "end"))
        if p == 3:  # a record after its partition's end (a file can say anything)
            rows.append(_record_at(token, 1000 * 42 + p, "00000042", "dc"))
        parts[token] = rows
    at = dict.fromkeys(parts, 0)
    landings = []
    while any(at[t] < len(parts[t]) for t in parts) or len(landings) < 30:
        landing = []
        for token in rng.sample(sorted(parts), 2):
            rows, start = parts[token], at[token]
            if start >= len(rows) or rng.random() < 0.15:
                start = rng.randrange(len(rows))  # a read again, from anywhere
            elif start and rng.random() < 0.3:  # resumed at the last time read
                last = rows[start - 1]["ts_ns"]
                while start and rows[start - 1]["ts_ns"] == last:
                    start -= 1
            end = min(len(rows), start + rng.randint(1, 8))
            landing += rows[start:end]
            at[token] = max(at[token], end)
            if rng.random() < 0.2 and landing:
                landing.append(dict(rng.choice(landing)))
        for n in range(rng.randint(0, 2)):
            other = _record_at(None, 5000 + len(landings), f"{n:08d}", "dc")
            other["record_id"] = f"uuid-{rng.randrange(6)}"  # another system's identity
            landing.append(other)
        if rng.random() < 0.2:
            landing.append(_record_at(None, 7000 + rng.randrange(4), "00000000", "dc"))
        landings.append(landing)
    return landings


def _identity(row: dict) -> tuple:
    if row.get("record_id"):
        return ("id", row["record_id"])
    return (row["kind"], row["partition_token"], row["ts_ns"],
            row.get("record_sequence") if row["kind"] == "data_change" else None)


# One seed in the fast tier; the other five (~5 s CPU each) in the full suite.
@pytest.mark.parametrize(
    "seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in range(1, 6))])
def test_no_record_is_stored_twice_or_lost_when_partitions_are_read_again(tmp_path, seed):
    # The duplicate check looks up only the records that may be cached (a partition's time
    # at or before its watermark, an ended partition, another identity); the records stored
    # must be exactly the distinct records delivered, for a pull and for file imports.
    landings = _deliveries(seed)
    delivered = [r for landing in landings for r in landing if r["kind"] in
                 ("data_change", "heartbeat")]
    distinct = {_identity(r) for r in delivered}
    for pull_id, as_files in ((1, False), (None, True)):
        with Cache(tmp_path / f"c-{as_files}.duckdb") as cache:
            cache.ensure_stream("s", system="spanner")
            duplicates = 0
            for landing in landings:
                stats = cache.ingest("s", pull_id, to_arrow_batch(landing),
                                     count_existing_as_duplicates=as_files)
                duplicates += stats.duplicates
            stored = cache.con.execute(
                "SELECT 'data_change', partition_token, epoch_ns(commit_timestamp), "
                "record_sequence, record_id, copies FROM data_change_records "
                "UNION ALL SELECT 'heartbeat', nullif(partition_token, ''), epoch_ns(timestamp), "
                "NULL, NULL, copies FROM heartbeats").fetchall()
        keys = [("id", rid) if rid else (kind, token, ts, seq)
                for kind, token, ts, seq, rid, _ in stored]
        assert len(keys) == len(set(keys)) and set(keys) == distinct
        if as_files:  # every copy delivered after the first is counted, and kept count of
            assert duplicates == len(delivered) - len(distinct)
            assert sum(copies for *_, copies in stored) == len(delivered)


def test_a_pull_reading_its_partitions_on_looks_up_no_stored_record(cache, monkeypatch):
    # Continuing a partition after its watermark, nothing can be cached yet: the stored
    # records (whose scan grows with the cache) are not read; a resumed read looks them up.
    first = [_record_at("p", 1000 * i, f"{i:08d}", "dc") for i in range(1, 5)]
    cache.ingest("s", 1, to_arrow_batch(first + [_record_at("p", 4500, "", "hb")]))
    seen: list[str] = []
    con = cache.con

    class Spy:
        def __getattr__(self, name):
            return getattr(con, name)

        def execute(self, sql, *args):
            seen.append(" ".join(sql.split()))
            return con.execute(sql, *args)

    monkeypatch.setattr(cache, "con", Spy())
    on = [_record_at("p", 1000 * i, f"{i:08d}", "dc") for i in range(5, 9)]
    assert ingest_stream(cache, "s", 1, [to_arrow_batch(on)]).data_change == 4  # as a pull
    assert not [s for s in seen if "FROM data_change_records" in s or "FROM heartbeats" in s]
    seen.clear()
    again = ingest_stream(cache, "s", 1,
                          [to_arrow_batch(on[-2:] + [_record_at("p", 9000, "9", "dc")])])
    assert (again.data_change, again.duplicates) == (1, 0)
    assert [s for s in seen if "FROM data_change_records" in s]
    assert con.execute("SELECT count(*) FROM data_change_records").fetchone() == (9,)


def test_a_pulls_records_go_from_the_batch_as_they_are_and_store_what_grouping_would(
        tmp_path, monkeypatch):
    # A pull's batch repeats no record and holds none that may be stored: its records go
    # to the stored tables straight from the batch, not through a grouped copy. A batch with
    # a repeated record is grouped. Both store the same rows, mods included.
    import spark_backend.cache.ingest as ingest

    staged: list[bool] = []
    stage = ingest._stage_data_change
    monkeypatch.setattr(ingest, "_stage_data_change",
                        lambda con, stream, grouped: (staged.append(grouped),
                                                      stage(con, stream, grouped))[1])
    _, rows = _demo_data_change_rows()
    by_partition: dict[str, list[dict]] = {}
    for row in rows:
        by_partition.setdefault(row["partition_token"], []).append(row)
    stored = {}
    for repeat in (False, True):
        staged.clear()
        with Cache(tmp_path / f"c-{repeat}.duckdb", memory_limit="64MB", threads=1) as cache:
            cache.ensure_stream("s", system="spanner")
            duplicates = 0
            for landing in by_partition.values():
                batch = to_arrow_batch(landing + landing[:1] if repeat else landing)
                duplicates += ingest_stream(cache, "s", 1, [batch]).duplicates
            stored[repeat] = (
                cache.con.execute("SELECT * EXCLUDE (copies) FROM data_change_records "
                                  "ORDER BY ALL").fetchall(),
                cache.con.execute("SELECT * FROM mods ORDER BY ALL").fetchall(),
                cache.con.execute("SELECT sum(copies) FROM data_change_records").fetchone())
        assert staged == ([True] * len(by_partition) if repeat else [False] * len(by_partition))
        assert duplicates == (len(by_partition) if repeat else 0)
    assert len(stored[False][0]) == len(rows) and len(stored[False][1]) > len(rows)
    assert stored[False][:2] == stored[True][:2]
    assert stored[True][2] == (len(rows) + len(by_partition),)
