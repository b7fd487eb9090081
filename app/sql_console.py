"""The SQL console: any read-only query on the cache, where it cannot hurt the dashboard.

Design:

- **Where it runs.** Not in the dashboard's process: a query that aborts DuckDB, exhausts
  memory or ignores interrupts would take the server (and any pull it runs) down with it. Each
  query runs in a worker process of its own (``app.console_process``, ``app/console_child.py``)
  on a read-only snapshot of the cache (``app.console_snapshot``: copied when the cache changed,
  kept in a private temporary folder), with DuckDB's guards (no file, URL, database or
  extension; a locked configuration) and the kernel's limits (address space, CPU seconds, no
  file written). A setting, a log or a checkpoint a query manages to change is the worker's
  own and ends with it; the worker's output never reaches the server's log.
- **What is accepted,** by DuckDB's own parse (``extract_statements`` on a locked-down
  connection, ``duckdb.tokenize``, the function catalogue): one statement, of type SELECT
  (WITH, DESCRIBE, SHOW, SUMMARIZE, PIVOT, UNPIVOT and FROM-first queries parse as SELECT), or
  EXPLAIN [ANALYZE] of one; table functions and PRAGMAs only from the lists of those that read
  (``READ_TABLE_FUNCTIONS``, ``READ_PRAGMAS``), so one a DuckDB release adds is refused until
  someone reads what it does. Files, URLs and extensions are refused by DuckDB itself,
  whatever the construct.
- **Bounds,** each with its own sentence: wall-clock time (the worker is killed at the
  deadline), memory (``RLIMIT_AS``, DuckDB's ``memory_limit`` within it), rows and result bytes.
- The connection the dashboard hands over must itself be locked down (``REQUIRED_SETTINGS``);
  the snapshot is read on a cursor of it in one read-only transaction.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pandas as pd
import pyarrow as pa

from . import console_process, console_snapshot

MAX_ROWS = 10_000
MAX_SECONDS = 15.0
MAX_MEMORY_BYTES = 1 << 30
MAX_RESULT_BYTES = 32 << 20

# What must hold on the connection the console reads the cache through.
REQUIRED_SETTINGS = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "lock_configuration": True,
}
ACCEPTED = "use SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, PIVOT or EXPLAIN"
# The table functions (and table macros) a query may call: each reads the cache's own tables
# or catalogue, or makes rows. Any other one (checkpoints, logging, profiling, SQL of its own,
# objects of the calling process, files) is refused before the query runs.
READ_TABLE_FUNCTIONS = frozenset({
    "range", "generate_series", "unnest", "repeat", "repeat_row", "json_each", "json_tree",
    "summary", "histogram", "histogram_values", "test_all_types", "icu_calendar_names",
    "pg_timezone_names", "duckdb_columns", "duckdb_constraints", "duckdb_databases",
    "duckdb_dependencies", "duckdb_functions", "duckdb_indexes", "duckdb_keywords",
    "duckdb_memory", "duckdb_optimizers", "duckdb_schemas", "duckdb_sequences",
    "duckdb_settings", "duckdb_tables", "duckdb_temporary_files", "duckdb_types",
    "duckdb_views", "pragma_collations", "pragma_database_size", "pragma_metadata_info",
    "pragma_platform", "pragma_show", "pragma_storage_info", "pragma_table_info",
    "pragma_version",
})
# The PRAGMAs that DuckDB answers with a query of the catalogue.
READ_PRAGMAS = frozenset({
    "database_list", "database_size", "show_tables", "show_tables_expanded", "show_databases",
    "table_info", "storage_info", "collations", "version", "platform", "functions",
    "metadata_info",
})
# What DuckDB's statement types are called in a refusal, where the type hides the keyword.
_KIND_WORDS = {
    duckdb.StatementType.CALL: "CALL (and CHECKPOINT)",
    duckdb.StatementType.SET: "SET (and RESET, USE)",
    duckdb.StatementType.VACUUM: "VACUUM (and ANALYZE)",
}
_GENERATED = (duckdb.StatementType.CREATE, duckdb.StatementType.TRANSACTION)
_FILE_FUNCTION = re.compile(
    r"^(read_.*|.*_scan|glob|sniff_csv|parquet_.*|load_.*|install_.*|http_.*|"
    r"iceberg_.*|delta_.*|sqlite_.*|postgres_.*|mysql_.*)$"
)
_MISSING_TABLE = re.compile(r"Table with name (.+?) does not exist")
_EXTENSION = re.compile(r'(\w+ with name "?[^"]+"?) is not in the catalog, but it exists in '
                        r"the (\w+) extension")


def examples(stream: str) -> dict[str, str]:
    """Example queries on ``stream`` (the one the sidebar names), by title; each runs."""
    one = "'" + stream.replace("'", "''") + "'"
    return {
        "Partitions by state": (
            f"SELECT state, count(*) AS partitions\nFROM partitions\nWHERE stream = {one}\n"
            "GROUP BY state"),
        "Splits and merges": (
            f"SELECT parent, count(*) AS children\nFROM edges\nWHERE stream = {one}\n"
            "  AND parent IS NOT NULL\nGROUP BY parent HAVING count(*) > 1\n"
            "ORDER BY children DESC"),
        "Busiest tables": (
            "SELECT table_name, mod_type, count(*) AS records, sum(mod_count) AS mods\n"
            f"FROM data_change_records\nWHERE stream = {one}\nGROUP BY ALL\n"
            "ORDER BY records DESC"),
        "Transactions over several partitions": (
            "SELECT server_transaction_id, count(DISTINCT partition_token) AS partitions,\n"
            "       count(*) AS records, max(number_of_records_in_transaction) AS expected\n"
            f"FROM data_change_records\nWHERE stream = {one}\nGROUP BY ALL\n"
            "HAVING count(DISTINCT partition_token) > 1\nORDER BY partitions DESC\nLIMIT 20"),
        "Longest heartbeat silences": (
            "WITH m AS (\n  SELECT partition_token, ts,\n"
            "         ts - lag(ts) OVER (PARTITION BY partition_token ORDER BY ts) AS gap\n"
            f"  FROM progress_marks\n  WHERE stream = {one})\n"
            "SELECT * FROM m WHERE gap IS NOT NULL\nORDER BY gap DESC\nLIMIT 10"),
        "Partition states in one row (PIVOT)": (
            f"PIVOT (SELECT state FROM partitions WHERE stream = {one})\n"
            "ON state USING count(*)"),
        "Every stream in the cache": (
            "SELECT s.stream, s.system, count(p.token) AS partitions\n"
            "FROM streams s LEFT JOIN partitions p USING (stream)\nGROUP BY ALL\n"
            "ORDER BY s.stream"),
        "Describe a table": "DESCRIBE data_change_records",
    }


class Refused(ValueError):
    """A statement the console does not run, or that DuckDB refused; one sentence why."""


class TimedOut(Refused):
    """The query ran past the console's time limit; its worker was killed."""


class TooMuchMemory(Refused):
    """The query needed more memory than the console's worker may use."""


class TooLarge(Refused):
    """The query's answer is larger than the console may send to the browser."""


@dataclass
class Result:
    frame: pd.DataFrame
    truncated: bool


def prepare(cursor: Callable[[], duckdb.DuckDBPyConnection]) -> None:
    """Start bringing the snapshot the console reads up to date (``console_snapshot.prepare``);
    returns at once."""
    console_snapshot.prepare(cursor)


def check(sql: str) -> str:
    """The one read statement to run, or Refused with one sentence (by DuckDB's own parse)."""
    text = (sql or "").strip().rstrip(";").strip()
    if not text:
        raise Refused("Write a query first, e.g. SELECT * FROM partitions LIMIT 10.")
    statements = _parse(text)
    if len([s for s in statements if s.query.strip()]) > 1:
        raise Refused("Run one statement at a time.")
    kind, query = _principal(statements), text
    if kind == duckdb.StatementType.EXPLAIN:
        query = _explained(text)
        kind = _principal(_parse(query)) if query else kind
    if kind != duckdb.StatementType.SELECT:
        raise Refused(f"The console is read-only: {_KIND_WORDS.get(kind, kind.name)} "
                      f"statements are refused; {ACCEPTED}.")
    _check_functions(text)
    return text


def run(con: duckdb.DuckDBPyConnection, sql: str, max_rows: int = MAX_ROWS,
        max_seconds: float = MAX_SECONDS, max_memory: int = MAX_MEMORY_BYTES,
        max_bytes: int = MAX_RESULT_BYTES) -> Result:
    """Run one read statement on a snapshot of the cache ``con`` is a locked-down cursor of.

    It runs in a worker process (never in this one): at most ``max_rows`` rows and
    ``max_bytes`` bytes of answer come back, the worker may use ``max_memory`` bytes of
    address space and is killed after ``max_seconds``. Every failure is ``Refused`` (a subclass
    per limit) with one sentence.
    """
    text = check(sql)
    _require_locked_down(con)
    limits = console_process.Limits(seconds=max_seconds, memory_bytes=max_memory,
                                    result_bytes=max_bytes, max_rows=max_rows)
    try:
        with console_snapshot.lease(con) as db:
            outcome = console_process.run(db, text, limits)
    except (duckdb.Error, OSError) as e:
        raise Refused(f"The console could not prepare its copy of the cache ({_first_line(e)}); "
                      "try again once the disk or the cache is available.") from e
    if outcome.status != "result":
        raise _refusal(outcome, text, limits)
    table = outcome.table
    table = table.rename_columns(_unique(table.column_names))
    try:
        frame = table.slice(0, max_rows).to_pandas()
    except pa.ArrowException as e:
        why = _first_line(e).rstrip(".")
        raise Refused(f"The answer has a column the console cannot show ({why}); cast it to a "
                      "plain type, e.g. CAST(x AS VARCHAR).") from e
    return Result(frame, truncated=table.num_rows > max_rows)


def _parse(text: str) -> list:
    """DuckDB's statements of ``text``, parsed on a locked-down connection of its own: a PRAGMA
    is expanded while it is parsed (``import_database`` reads files), so the parse itself must
    not reach a file."""
    try:
        with duckdb.connect(":memory:", config=dict(REQUIRED_SETTINGS)) as parser:
            return parser.extract_statements(text)
    except duckdb.Error as e:
        raise Refused(f"The query does not parse: {_first_line(e)}") from e


def _principal(statements: list) -> duckdb.StatementType:
    """The type of the one statement written: a PIVOT without an IN list comes with
    statements DuckDB generates (an ENUM of the values; around an EXPLAIN, a transaction) that
    carry no text of their own."""
    main = [s for s in statements if s.query.strip() or s.type not in _GENERATED]
    return main[0].type if len(main) == 1 else duckdb.StatementType.MULTI


def _explained(text: str) -> str:
    """The statement an EXPLAIN explains: the text after EXPLAIN, its ANALYZE/VERBOSE words and
    its (options), by DuckDB's tokenizer."""
    depth = 0
    for pos, _, word in _tokens(text)[1:]:
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0 and word.upper() not in ("ANALYZE", "ANALYSE", "VERBOSE"):
            return text[pos:]
    return ""


def _check_functions(text: str) -> None:
    """Refuse a PRAGMA or a table function that is not known to only read."""
    words = [word for _, _, word in _tokens(text)]
    if words and words[0].upper() == "PRAGMA":
        name = words[1].lower() if len(words) > 1 else ""
        if name not in READ_PRAGMAS:
            raise Refused(f"The console only reads: PRAGMA {name} is refused; the PRAGMAs it "
                          f"runs are {', '.join(sorted(READ_PRAGMAS))}.")
    tables = _table_function_names()
    called = [n for n in _called(text) if n in tables and n not in READ_TABLE_FUNCTIONS]
    files = [f"{n}()" for n in called if _FILE_FUNCTION.match(n)]
    if files:
        raise Refused(f"The console reads only the cache's own tables; {', '.join(files)} "
                      "reads files, URLs or other databases, which are not available here.")
    if called:
        raise Refused(f"The console only reads: {', '.join(f'{n}()' for n in called)} is "
                      "refused, as every table function but those that read the cache or its "
                      f"catalogue (such as range() or duckdb_tables()); {ACCEPTED}.")


def _tokens(text: str) -> list[tuple[int, duckdb.token_type, str]]:
    """DuckDB's tokens of ``text`` as (position, type, text), comments left out."""
    spans = duckdb.tokenize(text)
    ends = [p for p, _ in spans[1:]] + [len(text)]
    return [(pos, kind, _word(text[pos:end]))
            for (pos, kind), end in zip(spans, ends, strict=True)
            if kind != duckdb.token_type.comment]


def _word(span: str) -> str:
    """A token's own text: the span up to the next token, less the blanks and comments that
    the tokenizer skips after it."""
    if span.startswith('"'):
        end = 1
        while end < len(span):
            if span[end] == '"' and span[end + 1:end + 2] != '"':
                return span[:end + 1]
            end += 2 if span[end] == '"' else 1
        return span
    cut = min((i for i in (span.find("/*"), span.find("--")) if i > 0), default=len(span))
    return span[:cut].split(None, 1)[0] if span[:cut].strip() else span.strip()


def _called(text: str) -> list[str]:
    """The names written as calls in ``text`` (a name followed by an opening parenthesis),
    unquoted and in lower case, each once."""
    tokens = _tokens(text)
    names: list[str] = []
    for (_, kind, word), (_, _, after) in zip(tokens, tokens[1:]):
        if kind in (duckdb.token_type.identifier, duckdb.token_type.keyword) and after == "(":
            name = word[1:-1].replace('""', '"') if word.startswith('"') else word
            if name.lower() not in names:
                names.append(name.lower())
    return names


@functools.cache
def _table_function_names() -> frozenset[str]:
    """Every table function and table macro DuckDB has built in, by DuckDB's catalogue."""
    with duckdb.connect(":memory:", config=dict(REQUIRED_SETTINGS)) as con:
        return frozenset(n for (n,) in con.execute(
            "SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
            "WHERE function_type IN ('table', 'table_macro')").fetchall())


def _refusal(outcome: console_process.Outcome, text: str,
             limits: console_process.Limits) -> Refused:
    mb = limits.memory_bytes / (1 << 20)
    if outcome.status == "timeout":
        return TimedOut(
            f"The query was stopped after {limits.seconds:g} s, the console's time limit; narrow "
            "it with WHERE or LIMIT, or run it with the command line on a copy of the cache.")
    if outcome.status == "memory":
        return TooMuchMemory(
            f"The query needs more than {mb:,.0f} MB of memory, the console's limit; narrow it "
            "with WHERE or LIMIT, or aggregate before returning rows.")
    if outcome.status == "too_large":
        return TooLarge(
            f"The answer is larger than {limits.result_bytes / (1 << 20):,.0f} MB, the most "
            "the console shows; select fewer or narrower columns (e.g. left(text, 100)) or "
            "fewer rows.")
    if outcome.status == "crashed":
        return Refused(
            f"The query ended the console's worker process ({outcome.message}); the "
            "dashboard is unaffected, and the query cannot run here.")
    error = getattr(duckdb, outcome.kind, duckdb.Error)
    if not (isinstance(error, type) and issubclass(error, duckdb.Error)):
        error = duckdb.Error
    return _explain(error(outcome.message), text)


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


def _explain(e: duckdb.Error, text: str) -> Refused:
    """DuckDB's refusal of the query, as one sentence saying what is available instead."""
    first = _first_line(e)
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
    return Refused(f"The query failed: {first}")


def _file_functions(text: str) -> list[str]:
    """Functions in the query that read outside the cache, by name (for the sentence)."""
    return [f"{n}()" for n in _called(text) if _FILE_FUNCTION.match(n)]


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
