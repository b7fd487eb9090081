"""Fuzz the SQL console with statements built from DuckDB's own function catalogue
(``duckdb_functions()``): scalar, aggregate and table functions, nested, with arguments that
name files, SQL text and extreme values. None may change a setting of the server's DuckDB,
write the cache or any file, read a file, leave a worker behind or stop the server (this test
process); each answers rows or one sentence."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from app import sql_console
from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.support.demo_cache import land_world
from tests.test_console_isolation import server_state, workers

pytestmark = pytest.mark.slow

STATEMENTS = 420
SEED = 68
SECRET = "s3cr3t-fuzz-do-not-read"
# Functions of the Python client (they scan Python objects of the process that calls them).
CLIENT_ONLY = {"pandas_scan", "arrow_scan", "arrow_scan_dumb", "python_map_function"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "c.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(7, 0.1))
    c = Cache(path)
    yield c
    c.close()


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fuzz-outside")
    (d / "t.csv").write_text(f"a,b\n1,{SECRET}\n")
    (d / "t.json").write_text(json.dumps({"a": SECRET}))
    (d / "t.txt").write_text(SECRET)
    with duckdb.connect(str(d / "t.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT ? AS a", [SECRET])
    return d


def catalogue() -> list[tuple[str, str, list[str]]]:
    """(name, type, parameter types) of every built-in function, in a stable order."""
    with duckdb.connect(":memory:") as con:
        rows = con.execute(
            "SELECT DISTINCT function_name, function_type, parameter_types "
            "FROM duckdb_functions() WHERE function_type IN "
            "('scalar', 'aggregate', 'table', 'macro', 'table_macro') "
            "AND NOT starts_with(function_name, '__') ORDER BY ALL").fetchall()
    return [(n, t, list(p or [])) for n, t, p in rows if n not in CLIENT_ONLY]


def literal(kind: str, rnd: random.Random, outside: Path) -> str:
    texts = ["'x'", f"'{outside / 't.csv'}'", f"'{outside / 't.txt'}'", f"'{outside}/*'",
             f"'{outside / 'new.parquet'}'", "'SELECT * FROM partitions'", "'CHECKPOINT'",
             "'SET threads = 1'", "'{\"a\": [1, 2]}'", "'2024-01-01'", "''", "'%'",
             f"'{outside / 't.duckdb'}'", "'https://example.com/x.csv'", "token"]
    numbers = ["0", "1", "-1", "2", "1000000000", "9223372036854775807", "0.5", "-1e308",
               "'NaN'::DOUBLE", "NULL"]
    kind = (kind or "").upper()
    if kind in ("VARCHAR", "JSON", "BLOB", "ANY", "T") or not kind:
        return rnd.choice(texts + numbers[:4])
    if any(word in kind for word in ("INT", "DOUBLE", "FLOAT", "DECIMAL", "NUMERIC")):
        return rnd.choice(numbers)
    if "TIMESTAMP" in kind:
        return rnd.choice(["TIMESTAMP '2024-01-01 00:00:00'", "now()", "start_ts"])
    if "DATE" in kind:
        return "DATE '2024-02-29'"
    if "INTERVAL" in kind:
        return rnd.choice(["INTERVAL 1 DAY", "INTERVAL 1000000 YEAR"])
    if "BOOL" in kind:
        return rnd.choice(["true", "false"])
    if "[]" in kind or "LIST" in kind:
        return rnd.choice(["[1, 2, 3]", "['a', 'b']", "range(100000)", "[]"])
    if "MAP" in kind:
        return "MAP {'a': 1}"
    if "STRUCT" in kind:
        return "{'a': 1}"
    return rnd.choice(texts + numbers)


def call(fn: tuple[str, str, list[str]], rnd: random.Random, outside: Path,
         depth: int = 0, scalars: list | None = None) -> str:
    name, _, params = fn
    args = []
    for kind in params:
        if depth < 1 and scalars and rnd.random() < 0.25:
            args.append(call(rnd.choice(scalars), rnd, outside, depth + 1))
        else:
            args.append(literal(kind, rnd, outside))
    return f'"{name}"({", ".join(args)})'


def statements(outside: Path) -> list[str]:
    rnd = random.Random(SEED)
    fns = catalogue()
    scalars = [f for f in fns if f[1] in ("scalar", "macro")]
    aggregates = [f for f in fns if f[1] == "aggregate"]
    tables = [f for f in fns if f[1] in ("table", "table_macro")]
    out = [f"SELECT * FROM {call(f, rnd, outside)} LIMIT 5" for f in tables]
    # forms DuckDB's serialiser cannot answer for (PIVOT), and EXPLAIN around them
    out += [f"PIVOT (SELECT 1 AS k, * FROM {call(f, rnd, outside)} LIMIT 5) ON k "
            "USING count(*)" for f in tables]
    out += [f"EXPLAIN {rnd.choice(['', 'ANALYZE '])}PIVOT (SELECT 1 AS k, * FROM "
            f"{call(f, rnd, outside)} LIMIT 5) ON k USING count(*)" for f in tables]
    while len(out) < STATEMENTS:
        shape = rnd.random()
        if shape < 0.5:
            f = rnd.choice(scalars)
            out.append(f"SELECT {call(f, rnd, outside, scalars=scalars)} AS v "
                       "FROM partitions LIMIT 3")
        elif shape < 0.75:
            f = rnd.choice(aggregates)
            out.append(f"SELECT {call(f, rnd, outside, scalars=scalars)} AS v "
                       "FROM (FROM partitions LIMIT 50)")
        else:
            f, g = rnd.choice(tables), rnd.choice(scalars)
            out.append(f"SELECT {call(g, rnd, outside)} AS v, * "
                       f"FROM {call(f, rnd, outside)} LIMIT 3")
    return out


def files(d: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def test_generated_statements_change_nothing(cache, outside, capfd):
    generated = statements(outside)
    assert len(generated) >= STATEMENTS and len(set(generated)) >= STATEMENTS - 10
    before, outside_before = server_state(cache), files(outside)
    capfd.readouterr()
    answered = {"rows": 0, "refused": 0}
    for sql in generated:
        try:
            result = sql_console.run(cache.cursor(), sql, max_seconds=5.0)
        except sql_console.Refused as e:
            message = str(e)
            assert "\n" not in message and "Traceback" not in message, (sql, message)
            assert SECRET not in message, sql
            answered["refused"] += 1
        else:
            assert isinstance(result.frame, pd.DataFrame)
            assert SECRET not in result.frame.to_string(), sql
            answered["rows"] += 1
        assert workers() == [], sql
    assert server_state(cache) == before
    assert files(outside) == outside_before
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    # The fuzz exercised both sides: statements that ran and statements refused.
    assert answered["rows"] > 50 and answered["refused"] > 20, answered
    still = sql_console.run(cache.cursor(), "SELECT count(*) AS n FROM partitions").frame
    assert int(still["n"].iloc[0]) == cache.partition_count(cache.streams()[0])
