"""The SQL console, made safe by DuckDB itself: no file, URL, database or extension is
reachable through any query construct, runaway queries stop at the limit, writes are refused,
and valid analytical SQL (PIVOT, windows, EXPLAIN) runs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from app import sql_console
from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.support.demo_cache import land_world

ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cr3t-do-not-read"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("console") / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(7, 0.2))
    c = Cache(path)
    yield c
    c.close()


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> dict[str, str]:
    """Files outside the cache, each holding SECRET: the console must read none of them."""
    d = tmp_path_factory.mktemp("outside")
    (d / "t.csv").write_text(f"a,b\n1,{SECRET}\n")
    (d / "t.jsonl").write_text(json.dumps({"a": SECRET}) + "\n")
    (d / "t.txt").write_text(SECRET)
    (d / "schema.sql").write_text(f"SELECT '{SECRET}' AS a;")
    with duckdb.connect(str(d / "one.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT ? AS a", [SECRET])
    return {"csv": str(d / "t.csv"), "jsonl": str(d / "t.jsonl"), "txt": str(d / "t.txt"),
            "db": str(d / "one.duckdb"), "dir": str(d)}


def counts(c: Cache) -> tuple:
    return c.con.execute(
        "SELECT (SELECT count(*) FROM partitions), (SELECT count(*) FROM data_change_records), "
        "(SELECT count(*) FROM pulls), (SELECT count(*) FROM meta)").fetchone()


ESCAPES = [
    "SELECT * FROM '{csv}'",
    "SELECT * FROM read_csv('{csv}')",
    "SELECT * FROM read_csv_auto('{csv}')",
    "SELECT * FROM read_json('{jsonl}')",
    "SELECT * FROM '{jsonl}'",
    "SELECT read_text('{txt}')",
    "SELECT * FROM read_text('{txt}')",
    "SELECT * FROM read_blob('{txt}')",
    "SELECT * FROM glob('{dir}/*')",
    "DESCRIBE '{csv}'",
    "SUMMARIZE '{csv}'",
    "PIVOT '{csv}' ON a USING count(*)",
    "UNPIVOT '{csv}' ON a INTO NAME n VALUE v",
    # the CTE-in-a-subquery hole: a CTE named like a path in one place, the path read elsewhere
    "SELECT * FROM (WITH \"{csv}\" AS (SELECT 1 AS a) SELECT a FROM \"{csv}\") x, \"{csv}\"",
    "SELECT * FROM (WITH \"{jsonl}\" AS (SELECT 1) SELECT 1) x, \"{jsonl}\"",
    "SELECT * FROM (WITH \"{db}\" AS (SELECT 1) SELECT 1) x, \"{db}\"",
    "SELECT (SELECT count(*) FROM '{csv}') AS n",
    "SELECT * FROM partitions WHERE token IN (SELECT b FROM '{csv}')",
    "SELECT * FROM partitions p, LATERAL (SELECT * FROM read_csv('{csv}')) q",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r, '{csv}' WHERE n < 3) "
    "SELECT * FROM r",
    "SELECT a, row_number() OVER () FROM '{csv}'",
    "EXPLAIN ANALYZE SELECT * FROM '{csv}'",
    "EXPLAIN SELECT * FROM '{csv}'",
    "CALL read_csv('{csv}')",
    "FROM query_table('{csv}')",
    "FROM query('SELECT * FROM ''{csv}''')",
    "SELECT * FROM sniff_csv('{csv}')",
    "SELECT * FROM parquet_metadata('{csv}')",
    "ATTACH '{db}' AS other",
    "SELECT * FROM '{db}'",
    "COPY partitions TO '{dir}/out.csv'",
    "COPY (SELECT 1) TO '{dir}/out.csv'",
    "EXPORT DATABASE '{dir}/export'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "LOAD '{dir}/x.duckdb_extension'",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "PRAGMA enable_external_access",
    "SELECT * FROM 'https://example.com/data.csv'",
    "SELECT * FROM read_parquet('s3://bucket/x.parquet')",
    "SELECT excel_text(1.5, '0.00')",
    "SELECT '127.0.0.1'::INET",
    "DROP TABLE partitions",
    "DELETE FROM heartbeats",
    "UPDATE partitions SET state = 'x'",
    "INSERT INTO meta VALUES ('a', 'b')",
    "CREATE TABLE x AS SELECT * FROM '{csv}'",
    "CREATE TEMP TABLE x AS SELECT 1",
    "DETACH c",
    "USE memory",
    "SELECT 1; SELECT * FROM '{csv}'",
    # statements DuckDB cannot serialise (PIVOT, PRAGMA) and names written to hide a call
    "PIVOT (SELECT * FROM enable_logging(storage='file', storage_path='{dir}/log')) "
    "ON x USING count(*)",
    "EXPLAIN PIVOT (SELECT * FROM checkpoint()) ON x USING count(*)",
    "PIVOT (SELECT * FROM read_csv('{csv}')) ON a USING count(*)",
    "SELECT * FROM enable_profiling()",
    "SELECT * FROM system.main.force_checkpoint /* hidden */ ()",
    'SELECT * FROM "Checkpoint"()',
    "SELECT * FROM checkpoint -- hidden\n()",
    "PRAGMA import_database('{dir}')",
    "PRAGMA all_profiling_output",
    "PRAGMA force_checkpoint",
    "PRAGMA enable_profiling",
]


@pytest.mark.parametrize("template", ESCAPES)
def test_nothing_outside_the_cache_is_reachable(cache, outside, template):
    sql = template.format(**outside)
    before = counts(cache)
    with pytest.raises(sql_console.Refused) as refused:
        sql_console.run(cache.cursor(), sql)
    message = str(refused.value)
    assert "\n" not in message and SECRET not in message
    assert "Traceback" not in message and "INTERNAL" not in message.upper()
    assert "worker process" not in message  # refused, not run until it crashed
    assert counts(cache) == before
    assert not (Path(outside["dir"]) / "out.csv").exists()
    assert not (Path(outside["dir"]) / "export").exists()
    assert not (Path(outside["dir"]) / "log").exists()


def test_refusals_name_what_was_wrong(cache, outside):
    cases = {
        f"SELECT * FROM read_csv('{outside['csv']}')": "read_csv()",
        f"SELECT * FROM '{outside['csv']}'": "cache's own tables",
        "SELECT excel_text(1.5, '0.00')": "extension 'excel'",
        "SELECT '127.0.0.1'::INET": "extension 'inet'",
        "DROP TABLE partitions": "read-only",
        "SET threads = 1": "read-only",
        "SELECT 1; SELECT 2": "one statement",
        "CALL pragma_table_info('partitions')": "CALL",
        "SELEC 1": "does not parse",
        "SELECT * FROM no_such_table": "no_such_table",
        "SELECT * FROM enable_profiling()": "enable_profiling() is refused",
        "PIVOT (SELECT * FROM disable_logging()) ON x USING count(*)": "disable_logging()",
        "PRAGMA all_profiling_output": "PRAGMA all_profiling_output is refused",
        "": "Write a query",
    }
    for sql, why in cases.items():
        with pytest.raises(sql_console.Refused, match=None) as refused:
            sql_console.run(cache.cursor(), sql)
        assert why in str(refused.value), (sql, str(refused.value))


def test_the_connection_holds_duckdbs_own_guards(cache):
    names = [*sql_console.REQUIRED_SETTINGS, "python_enable_replacements"]
    got = cache.con.execute(
        "SELECT " + ", ".join(f"current_setting('{n}')" for n in names)).fetchone()
    assert dict(zip(names, got, strict=True)) == {
        **sql_console.REQUIRED_SETTINGS, "python_enable_replacements": False}


def test_a_connection_without_the_guards_is_refused(tmp_path):
    with duckdb.connect(str(tmp_path / "open.duckdb")) as con:
        with pytest.raises(sql_console.Refused, match="locked-down"):
            sql_console.run(con, "SELECT 1")


VALID = {
    "PIVOT partitions ON state USING count(*)": None,
    "UNPIVOT (SELECT 1 AS a, 2 AS b) ON a, b INTO NAME n VALUE v": None,
    "SELECT token, row_number() OVER (ORDER BY start_ts) AS n, "
    "lag(watermark) OVER (ORDER BY start_ts) AS prev FROM partitions": None,
    "EXPLAIN SELECT count(*) FROM partitions": None,
    "EXPLAIN (FORMAT JSON) SELECT 1": None,
    "EXPLAIN /* x */ ANALYZE SELECT count(*) FROM partitions": None,
    "EXPLAIN ANALYZE /* x */ SELECT count(*) FROM partitions": None,
    "EXPLAIN ANALYZE SELECT 1": None,
    "PRAGMA database_list": None,
    "PRAGMA table_info('partitions')": None,
    "SELECT * FROM pragma_table_info('partitions')": None,
    "SHOW TABLES": None,
    "DESCRIBE partitions": None,
    "SUMMARIZE partitions": None,
    "FROM partitions LIMIT 3": None,
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 10) "
    "SELECT sum(n) FROM r": None,
    "SELECT * FROM progress_marks LIMIT 5": None,
    "SELECT count(*) FROM range(1000)": None,
}


@pytest.mark.parametrize("sql", list(VALID))
def test_valid_analytical_sql_runs(cache, sql):
    result = sql_console.run(cache.cursor(), sql)
    assert len(result.frame) > 0


@pytest.fixture(scope="module")
def two_streams(tmp_path_factory):
    """A cache of two streams of different sizes; the second's name has a dot and a dash."""
    path = tmp_path_factory.mktemp("console-two") / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(7, 0.2))
        land_world(c, dataclasses.replace(build_world(8, 0.1), stream="Orders.v2-eu"))
    c = Cache(path)
    yield c
    c.close()


def test_every_example_runs_on_the_stream_it_names(two_streams):
    streams = two_streams.streams()
    assert len(streams) == 2
    for stream in streams:
        for name, sql in sql_console.examples(stream).items():
            assert len(sql_console.run(two_streams.cursor(), sql).frame) > 0, (stream, name)
        by_state = sql_console.run(two_streams.cursor(),
                                   sql_console.examples(stream)["Partitions by state"]).frame
        assert int(by_state["partitions"].sum()) == two_streams.partition_count(stream)
    counts = {s: two_streams.partition_count(s) for s in streams}
    assert len(set(counts.values())) == 2, counts


def test_pivot_counts_partitions_by_state(cache):
    frame = sql_console.run(cache.cursor(), "PIVOT (SELECT state FROM partitions) ON state "
                                            "USING count(*)").frame
    want = dict(cache.con.execute(
        "SELECT state, count(*) FROM partitions GROUP BY state").fetchall())
    assert {c: int(frame[c].iloc[0]) for c in frame.columns} == want


RUNAWAY = [
    "SELECT count(*) FROM range(10000000000000)",
    "SELECT sum(a.range * b.range * c.range) FROM range(100000) a, range(100000) b, "
    "range(100000) c",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
]


@pytest.mark.parametrize("sql", RUNAWAY)
def test_runaway_queries_stop_at_the_limit(cache, sql):
    with pytest.raises(sql_console.TimedOut, match=r"stopped after 0\.3 s"):
        sql_console.run(cache.cursor(), sql, max_seconds=0.3)
    # The cache answers as before.
    assert sql_console.run(cache.cursor(), "SELECT count(*) FROM partitions").frame.size == 1


def test_row_cap(cache):
    result = sql_console.run(cache.cursor(), "SELECT * FROM range(100000)", max_rows=1000)
    assert len(result.frame) == 1000 and result.truncated
    cross = sql_console.run(cache.cursor(), "SELECT * FROM range(100000) a, range(100000) b, "
                                            "range(100000) c", max_rows=10)
    assert len(cross.frame) == 10 and cross.truncated
    small = sql_console.run(cache.cursor(), "SELECT 1 AS a, 2 AS a")
    assert list(small.frame.columns) == ["a", "a_1"] and not small.truncated


def test_no_extension_is_installed_or_loaded_with_a_fresh_home(tmp_path):
    """In a fresh HOME, queries that would need an extension fail without DuckDB creating
    ~/.duckdb/extensions (nothing downloaded, nothing loaded)."""
    home = tmp_path / "home"
    home.mkdir()
    script = textwrap.dedent(f"""
        from app import sql_console
        from spark_backend.cache.store import Cache
        c = Cache({str(tmp_path / 'x.duckdb')!r})
        out = []
        for sql in ["SELECT excel_text(1.5, '0.00')", "SELECT '127.0.0.1'::INET",
                    "SELECT * FROM 'https://example.com/x.csv'", "INSTALL httpfs",
                    "LOAD httpfs", "SELECT * FROM read_json('https://example.com/x.json')",
                    "SELECT * FROM sqlite_scan('x.db', 't')", "SELECT st_point(1, 2)"]:
            try:
                sql_console.run(c.cursor(), sql)
                out.append("ran: " + sql)
            except sql_console.Refused as e:
                out.append("refused")
        loaded = c.con.execute("SELECT DISTINCT function_name FROM duckdb_functions() "
                               "WHERE function_name IN ('excel_text', 'st_point', "
                               "'sqlite_scan', 'host')").fetchall()
        print(out, loaded)
    """)
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{['refused'] * 8} []"
    assert not (home / ".duckdb").exists()
