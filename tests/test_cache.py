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


def test_memory_setting_is_validated(tmp_path, monkeypatch):
    monkeypatch.setenv("CSI_DUCKDB_MEMORY", "lots")
    with pytest.raises(CacheError, match="is not a size"):
        Cache(tmp_path / "m.duckdb")


def test_a_pulling_process_caps_duckdb_lower_and_the_environment_overrides(tmp_path, monkeypatch):
    from spark_backend.cli import _open_cache

    def limit(cache):
        (value,) = cache.con.execute("SELECT current_setting('memory_limit')").fetchone()
        cache.close()
        return value

    monkeypatch.delenv("CSI_DUCKDB_MEMORY", raising=False)
    assert limit(_open_cache(str(tmp_path / "pull.duckdb"), landing=True)).startswith("183")
    assert limit(_open_cache(str(tmp_path / "look.duckdb"))).startswith("953")
    monkeypatch.setenv("CSI_DUCKDB_MEMORY", "2GB")
    assert limit(_open_cache(str(tmp_path / "big.duckdb"), landing=True)).startswith("1.8")


def test_a_pulling_process_gives_duckdb_fewer_threads_and_the_environment_overrides(
        tmp_path, monkeypatch):
    from spark_backend.cli import _open_cache
    from spark_backend.model.config import PULL_THREADS

    def threads(cache):
        (value,) = cache.con.execute("SELECT current_setting('threads')").fetchone()
        cache.close()
        return value

    monkeypatch.delenv("CSI_DUCKDB_THREADS", raising=False)
    assert threads(_open_cache(str(tmp_path / "pull.duckdb"), landing=True)) == PULL_THREADS
    assert PULL_THREADS == max(1, (os.cpu_count() or 1) // 4)
    (default,) = duckdb.connect().execute("SELECT current_setting('threads')").fetchone()
    assert threads(_open_cache(str(tmp_path / "look.duckdb"))) == default
    monkeypatch.setenv("CSI_DUCKDB_THREADS", "3")
    assert threads(_open_cache(str(tmp_path / "three.duckdb"), landing=True)) == 3
    for bad in ("many", "0", "-2"):
        monkeypatch.setenv("CSI_DUCKDB_THREADS", bad)
        with pytest.raises(CacheError, match=f"CSI_DUCKDB_THREADS='{bad}' is not a thread "
                                             "count; use a whole number from 1 to 1024"):
            Cache(tmp_path / "bad.duckdb")


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
    from spark_backend.demo.world import build_world
    from spark_backend.model.records import batched

    world = build_world(scale=0.05)
    rows = [from_change_record(r, p.token) for p in world.partitions
            for r in world.query(p.token, p.start, world.end, 10_000)]
    rows = [r for r in rows if r["kind"] == "data_change"]
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

    # The way a user meets it: the next command that opens it read-write.
    out = subprocess.run([sys.executable, "-m", "spark_backend", "report", "--cache", str(path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "stream DemoStream (spanner)" in out.stdout
    assert f"records: {counts['data_change_records']} data change" in out.stdout
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                           ).fetchone() == ("2",)
        keyed, indexed = _keys_and_indexes(con)
        assert not (keyed | indexed) & set(_GROWING)
        assert _counts(con) == counts
        # the view over the rebuilt tables still reads them
        assert con.execute("SELECT count(*) FROM progress_marks").fetchone()[0] >= (
            counts["data_change_records"] + counts["heartbeats"])
