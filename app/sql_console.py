"""The SQL console: read-only queries on the cache, checked before they run.

The app holds the cache file open read-write (it pulls), and DuckDB refuses a second,
read-only connection to the same file in one process. So the console runs on its own cursor and
refuses, before execution, anything that is not one plain query over the cache's own tables:
duckdb's parser gives the statement type, ``json_serialize_sql`` the tree, and every table,
table function and function in the tree is checked. What passes runs inside a READ ONLY
transaction with Python replacement scans off, so a write that slipped through still fails.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

from spark_backend.cache.schema import TABLE_DOCS

MAX_ROWS = 10_000

ALLOWED_TABLES = frozenset(TABLE_DOCS) | {"meta", "pulls", "imports", "quarantine"}
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "duckdb_tables", "duckdb_columns", "duckdb_views", "duckdb_types", "duckdb_functions",
    "duckdb_constraints", "duckdb_indexes", "duckdb_schemas", "duckdb_keywords",
    "range", "generate_series", "unnest", "pragma_table_info", "show_tables",
})
# Scalar functions that read files, change state or reach outside the cache.
_FORBIDDEN_FUNCTION = re.compile(
    r"^(read_.*|.*_scan|glob|sniff_csv|parquet_.*|nextval|setval|setseed|currval|getenv|"
    r"query|query_table|load_.*|install_.*|http_.*|.*secret.*|current_setting|enable_.*|"
    r"checkpoint|force_checkpoint|export_.*|import_.*|pragma_.*|iceberg_.*|delta_.*|"
    r"sqlite_.*|postgres_.*|mysql_.*|system)$"
)
_EXPLAIN = re.compile(r"^\s*explain\s+(?!analyze\b)", re.IGNORECASE)

EXAMPLES: dict[str, str] = {
    "Partitions by state": "SELECT state, count(*) AS partitions\nFROM partitions\nGROUP BY state",
    "Splits and merges": (
        "SELECT parent, count(*) AS children\nFROM edges\nWHERE parent IS NOT NULL\n"
        "GROUP BY parent HAVING count(*) > 1\nORDER BY children DESC"
    ),
    "Busiest tables": (
        "SELECT table_name, mod_type, count(*) AS records, sum(mod_count) AS mods\n"
        "FROM data_change_records\nGROUP BY ALL\nORDER BY records DESC"
    ),
    "Transactions over several partitions": (
        "SELECT server_transaction_id, count(DISTINCT partition_token) AS partitions,\n"
        "       count(*) AS records, max(number_of_records_in_transaction) AS expected\n"
        "FROM data_change_records\nGROUP BY ALL\nHAVING count(DISTINCT partition_token) > 1\n"
        "ORDER BY partitions DESC\nLIMIT 20"
    ),
    "Longest heartbeat silences": (
        "WITH m AS (\n  SELECT partition_token, ts,\n"
        "         ts - lag(ts) OVER (PARTITION BY partition_token ORDER BY ts) AS gap\n"
        "  FROM progress_marks)\nSELECT * FROM m WHERE gap IS NOT NULL\nORDER BY gap DESC\n"
        "LIMIT 10"
    ),
    "Describe a table": "DESCRIBE data_change_records",
}


class Refused(ValueError):
    """A statement the console does not run; the message says why."""


@dataclass
class Result:
    frame: pd.DataFrame
    truncated: bool


def check(sql: str, con: duckdb.DuckDBPyConnection) -> str:
    """The statement to run, or Refused with one sentence."""
    text = (sql or "").strip().rstrip(";").strip()
    if not text:
        raise Refused("Write a query first, e.g. SELECT * FROM partitions LIMIT 10.")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as e:
        raise Refused(f"The query does not parse: {str(e).splitlines()[0]}") from e
    if len(statements) != 1:
        raise Refused("Run one statement at a time.")
    kind = statements[0].type
    inner = text
    if kind == duckdb.StatementType.EXPLAIN:
        if not _EXPLAIN.match(text):
            raise Refused("EXPLAIN ANALYZE runs the query; use EXPLAIN or the query itself.")
        inner = _EXPLAIN.sub("", text, count=1)
        kind = duckdb.extract_statements(inner)[0].type
    if kind != duckdb.StatementType.SELECT:
        raise Refused(
            f"The console is read-only: {kind.name} statements are refused; use SELECT, WITH, "
            "DESCRIBE, SHOW, SUMMARIZE or EXPLAIN."
        )
    tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [inner]).fetchone()[0])
    if tree.get("error"):
        raise Refused(f"The query is not a plain query: {tree.get('error_message')}")
    _check_tree(tree)
    return text


def _check_tree(tree: dict[str, Any]) -> None:
    ctes: set[str] = set()
    _collect_ctes(tree, ctes)
    for node in _nodes(tree):
        kind = node.get("type")
        if kind == "BASE_TABLE":
            name = str(node.get("table_name", "")).lower()
            where = (node.get("catalog_name") or "", node.get("schema_name") or "")
            if where[0] or where[1] not in ("", "main"):
                raise Refused("The console reads only the cache's own tables.")
            if name not in ALLOWED_TABLES and name not in ctes:
                raise Refused(
                    f"{node.get('table_name')!r} is not a table of the cache; the console cannot "
                    "read files or other databases."
                )
        elif kind == "TABLE_FUNCTION":
            name = str(node.get("function", {}).get("function_name", "")).lower()
            if name not in ALLOWED_TABLE_FUNCTIONS:
                raise Refused(f"The table function {name}() is not available in the console.")
        elif node.get("class") == "FUNCTION":
            name = str(node.get("function_name", "")).lower()
            if _FORBIDDEN_FUNCTION.match(name):
                raise Refused(f"The function {name}() is not available in the console.")


def _collect_ctes(value: Any, out: set[str]) -> None:
    for node in _nodes(value):
        for entry in (node.get("cte_map") or {}).get("map") or []:
            out.add(str(entry.get("key", "")).lower())


def _nodes(value: Any):
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _nodes(child)
    elif isinstance(value, list):
        for child in value:
            yield from _nodes(child)


def run(con: duckdb.DuckDBPyConnection, sql: str, max_rows: int = MAX_ROWS) -> Result:
    """Check and run one read-only statement; at most ``max_rows`` rows come back."""
    text = check(sql, con)
    con.execute("SET python_enable_replacements = false")
    con.execute("BEGIN TRANSACTION READ ONLY")
    try:
        cur = con.execute(text)
        columns = [d[0] for d in cur.description or []]
        rows = cur.fetchmany(max_rows + 1)
    except duckdb.Error as e:
        raise Refused(str(e).splitlines()[0]) from e
    finally:
        con.execute("ROLLBACK")
    frame = pd.DataFrame(rows[:max_rows], columns=_unique(columns))
    return Result(frame, truncated=len(rows) > max_rows)


def _unique(columns: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in columns:
        n = seen.get(c, 0)
        seen[c] = n + 1
        out.append(c if n == 0 else f"{c}_{n}")
    return out
