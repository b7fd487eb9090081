"""The SQL console: any read-only query on the cache, made safe by DuckDB itself.

Design (issue 11): every connection to a cache runs with DuckDB's own guards
(``spark_backend.cache.store.LOCKED_DOWN``: ``enable_external_access=false``,
``autoinstall_known_extensions=false``, ``autoload_known_extensions=false``,
``lock_configuration=true``, no Python replacement scans). The cache needs none of what they
forbid (batches arrive as Arrow; staged Parquet is read with pyarrow), so the console runs on a
cursor of the very instance the dashboard holds open read-write. A second connection with other
settings to the same file is refused by DuckDB in one process, and a read-only connection from
another process is refused while the dashboard holds the file: a locked-down cache is the
design that works while a pull is running. What the console adds:

- a ``READ ONLY`` transaction (DuckDB refuses every write in it),
- a time limit (``con.interrupt()`` from a timer) and a row cap (a ``LIMIT`` on the relation,
  so a huge cross join stops early),
- a statement check that only *explains*: one statement, and a kind that reads (SELECT, WITH,
  DESCRIBE, SHOW, SUMMARIZE, PIVOT, UNPIVOT, EXPLAIN, CALL, PRAGMA). Files, URLs, other
  databases and extensions are refused by DuckDB, whatever the query construct; its refusal is
  turned into one sentence here.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

MAX_ROWS = 10_000
MAX_SECONDS = 15.0

# What must hold on the connection the console runs on (checked before every query).
REQUIRED_SETTINGS = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}
_READING = {duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN, duckdb.StatementType.CALL}
_PIVOT = re.compile(r"^\s*(pivot|pivot_wider|unpivot|pivot_longer)\b", re.IGNORECASE)
_FILE_FUNCTION = re.compile(
    r"^(read_.*|.*_scan|glob|sniff_csv|parquet_.*|load_.*|install_.*|http_.*|"
    r"iceberg_.*|delta_.*|sqlite_.*|postgres_.*|mysql_.*)$"
)
_MISSING_TABLE = re.compile(r"Table with name (.+?) does not exist")
_EXTENSION = re.compile(r'(\w+ with name "?[^"]+"?) is not in the catalog, but it exists in '
                        r"the (\w+) extension")

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
    "Partition states per stream (PIVOT)": (
        "PIVOT (SELECT stream, state FROM partitions)\nON state USING count(*)"
    ),
    "Describe a table": "DESCRIBE data_change_records",
}


class Refused(ValueError):
    """A statement the console does not run, or that DuckDB refused; one sentence why."""


class TimedOut(Refused):
    """The query ran past the console's time limit and was interrupted."""


@dataclass
class Result:
    frame: pd.DataFrame
    truncated: bool


def check(sql: str) -> str:
    """The one statement to run, or Refused with one sentence (explains; DuckDB enforces)."""
    text = (sql or "").strip().rstrip(";").strip()
    if not text:
        raise Refused("Write a query first, e.g. SELECT * FROM partitions LIMIT 10.")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as e:
        raise Refused(f"The query does not parse: {_first_line(e)}") from e
    # A PIVOT without an IN list comes with statements DuckDB generates (an ENUM of the
    # values, then the query); they carry no text of their own.
    written = [s for s in statements if s.query.strip()]
    if len(written) > 1:
        raise Refused("Run one statement at a time.")
    kind = statements[-1].type
    if kind in _READING or (kind == duckdb.StatementType.CREATE and _PIVOT.match(text)):
        return text
    raise Refused(
        f"The console is read-only: {kind.name} statements are refused; use SELECT, WITH, "
        "DESCRIBE, SHOW, SUMMARIZE, PIVOT or EXPLAIN."
    )


def run(con: duckdb.DuckDBPyConnection, sql: str, max_rows: int = MAX_ROWS,
        max_seconds: float = MAX_SECONDS) -> Result:
    """Run one read-only statement on a locked-down cache cursor.

    At most ``max_rows`` rows come back; the query is interrupted after ``max_seconds``.
    Every failure is ``Refused`` (``TimedOut`` for the time limit) with one sentence.
    """
    text = check(sql)
    _require_locked_down(con)
    timer = threading.Timer(max_seconds, con.interrupt)
    con.execute("BEGIN TRANSACTION READ ONLY")
    timer.start()
    try:
        rel = con.sql(text)
        if rel is None:
            columns, rows = [], []
        else:
            columns = list(rel.columns)
            rows = rel.limit(max_rows + 1).fetchall()
    except duckdb.Error as e:
        raise _explain(e, text, max_seconds) from e
    finally:
        timer.cancel()
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # the transaction already ended (e.g. interrupted)
    frame = pd.DataFrame(rows[:max_rows], columns=_unique(columns))
    return Result(frame, truncated=len(rows) > max_rows)


def _require_locked_down(con: duckdb.DuckDBPyConnection) -> None:
    names = list(REQUIRED_SETTINGS)
    got = con.execute(
        "SELECT " + ", ".join(f"current_setting('{n}')" for n in names)).fetchone()
    wrong = [n for n, v in zip(names, got, strict=True) if bool(v) != REQUIRED_SETTINGS[n]]
    if wrong:
        raise Refused(
            "The console runs only on a locked-down cache connection; this one has "
            f"{', '.join(wrong)} set otherwise."
        )


def _explain(e: duckdb.Error, text: str, max_seconds: float) -> Refused:
    first = _first_line(e)
    if isinstance(e, duckdb.InterruptException):
        return TimedOut(
            f"The query was stopped after {max_seconds:g} s, the console's time limit; narrow "
            "it with WHERE or LIMIT, or run it with the command line on a copy of the cache."
        )
    if isinstance(e, duckdb.PermissionException):
        named = _file_functions(text)
        what = f"{', '.join(named)} is" if named else "files, URLs, other databases and " \
                                                      "extensions are"
        return Refused(
            f"The console reads only the cache's own tables; {what} not available here "
            f"(DuckDB: {_strip_kind(first)})."
        )
    missing = _MISSING_TABLE.search(first)
    if missing and re.search(r"[/\\:.~]", missing.group(1)):
        return Refused(
            f"The console reads only the cache's own tables; {missing.group(1)!r} is not one of "
            "them (files, URLs and other databases are not available here)."
        )
    found = _EXTENSION.search(first)
    if found:
        return Refused(
            f"{found.group(1)} needs the DuckDB extension {found.group(2)!r}, and the console "
            "loads no extensions; use the functions and types DuckDB has built in."
        )
    if isinstance(e, duckdb.TransactionException) and "read-only" in first:
        return Refused("The console is read-only: statements that write are refused.")
    if "configuration has been locked" in first:
        return Refused("The console cannot change settings.")
    if isinstance(e, duckdb.OutOfMemoryException):
        return Refused(
            "The query needs more memory than the cache may use (CSI_DUCKDB_MEMORY); narrow "
            "it with WHERE or LIMIT."
        )
    return Refused(f"The query failed: {first}")


def _file_functions(text: str) -> list[str]:
    """Functions in the query that read outside the cache, by name (for the sentence)."""
    try:
        with duckdb.connect(":memory:", config=dict(REQUIRED_SETTINGS)) as parser:
            tree = json.loads(parser.execute("SELECT json_serialize_sql(?)", [text]).fetchone()[0])
    except (duckdb.Error, TypeError, ValueError):
        return []
    names = []
    for node in _nodes(tree):
        name = ""
        if node.get("type") == "TABLE_FUNCTION":
            name = str((node.get("function") or {}).get("function_name", ""))
        elif node.get("class") == "FUNCTION":
            name = str(node.get("function_name", ""))
        if name and _FILE_FUNCTION.match(name.lower()) and f"{name}()" not in names:
            names.append(f"{name}()")
    return names


def _nodes(value: Any):
    if isinstance(value, dict):
        yield value
        for child in value.values():
            yield from _nodes(child)
    elif isinstance(value, list):
        for child in value:
            yield from _nodes(child)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _strip_kind(line: str) -> str:
    return re.sub(r"^[A-Za-z ]+Error: ", "", line)


def _unique(columns: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for c in columns:
        n = seen.get(c, 0)
        seen[c] = n + 1
        out.append(c if n == 0 else f"{c}_{n}")
    return out
