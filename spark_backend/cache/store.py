"""The DuckDB cache file: opening it, registering streams and pulls, ingesting record rows.

Thread safety: one ``Cache`` per thread (DuckDB connections are not shared across threads);
``Cache.cursor()`` gives a thread its own connection to the same file.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from spark_backend.cache.schema import DDL, DROPPED_IN_2, SCHEMA_VERSION, UNKEYED_IN_2
from spark_backend.model import interrupts
from spark_backend.model.config import DEFAULT_MEMORY_LIMIT, MEMORY_ENVVAR, THREADS_ENVVAR
from spark_backend.model.errors import BadInput, CacheError

# meta key -> the first pull whose landed records the ``transactions`` summary does not hold yet
_UNSUMMARIZED = "transactions_unsummarized:"
# records per statement when the summary is rebuilt: its list aggregates hold their groups in
# memory, so a whole large pull in one statement would not fit a pull's DuckDB memory
_SUMMARY_SLICE_RECORDS = 100_000
# the pull's records per slice when what changed since an early summary is found
# (``Cache._summarize``: per slice, the ids of the transactions it touched, the records' count
# per id and the summary's rows joined): at this size a 1M-record pull's slices fit the pull's
# 64MB with room to spare (48MB too), for a few seconds more than larger ones (benchmarks/MEMORY.md)
_CHANGED_SLICE_RECORDS = 200_000

_STREAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


def validate_cache_stream_name(name: str) -> str:
    if not isinstance(name, str) or not _STREAM_NAME.match(name):
        raise CacheError(
            f"{name!r} is not a valid stream name; use letters, digits, '_', '.', '-' "
            "(starting with a letter or '_', at most 128 characters)"
        )
    return name


def _memory_limit(default: str = DEFAULT_MEMORY_LIMIT) -> str:
    value = os.environ.get(MEMORY_ENVVAR, default)
    if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)", value, re.IGNORECASE):
        raise CacheError(f"{MEMORY_ENVVAR}={value!r} is not a size; use e.g. 2GB or 512MB.")
    if MEMORY_ENVVAR in os.environ and _bytes(value) < _bytes(LEAST_MEMORY):
        # DuckDB keeps a 256 KiB block per column being written, and the checkpoint a commit
        # starts needs as much again: below this a pull's commit fails and DuckDB closes the
        # connection for good (FatalException).
        raise CacheError(f"{MEMORY_ENVVAR}={value!r} is below {LEAST_MEMORY}, the least a "
                         "cache being written needs; use e.g. 2GB or 512MB.")
    return value


LEAST_MEMORY = "64MB"


_UNITS = {"kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2,
          "gib": 1024**3}


def _bytes(size: str) -> float:
    """A size accepted by ``_memory_limit`` in bytes."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-zA-Z]+)", size).groups()
    return float(number) * _UNITS[unit.lower()]


# DuckDB's own guards on every connection to a cache (see ``Cache``).
LOCKED_DOWN: dict[str, Any] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "python_enable_replacements": False,
    "lock_configuration": True,
}
STAGING_PREFIXES = ("csi-pull-", "csi-import-")
_OWNER_FILE = ".csi-owner.json"
_LOCK_WORDS = ("Could not set lock", "Conflicting lock", "lock on file")
_UNWRITABLE_WORDS = ("Read-only file system", "Permission denied")
# In this process: pulls between begin_pull and finish_pull, staging folders still in use.
_ACTIVE_PULLS: dict[str, set[int]] = {}
_LIVE_STAGING: set[str] = set()


class CacheLocked(CacheError):
    """Another process holds the cache file (DuckDB's lock)."""


def _key(path: Path) -> str:
    return str(path.resolve())


def _check_path(path: Path, read_only: bool) -> None:
    if path.is_dir():
        raise CacheError(f"The cache {path} is a folder; give a file path, e.g. "
                         f"{path / 'cache.duckdb'}.")
    if path.exists() and not path.is_file():
        raise CacheError(f"The cache {path} is not a regular file; give a DuckDB file path.")
    if read_only:
        if not path.exists():
            raise CacheError(f"No cache file at {path}; pull or import something first.")
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheError(f"Cannot create the folder {path.parent} for the cache: "
                         f"{e.strerror or e}.") from e


def _threads(default: int | None) -> int | None:
    value = os.environ.get(THREADS_ENVVAR)
    if value is None:
        return default
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise CacheError(f"{THREADS_ENVVAR}={value!r} is not a thread count; use a whole "
                         "number from 1 to 1024.")
    return int(value)


def _connect(path: Path, read_only: bool, memory_limit: str, threads: int | None = None,
             allocator: dict[str, Any] | None = None) -> duckdb.DuckDBPyConnection:
    # A pull commits once per task's results: checkpointing at every commit (DuckDB's default
    # past 16 MB of WAL) would cost a large share of the landing time, and until a checkpoint
    # what was written stays in memory too, so 64 MB bounds both. The WAL is replayed after a
    # crash (benchmarks/MEMORY.md).
    config = {**LOCKED_DOWN, "memory_limit": memory_limit, "checkpoint_threshold": "64MB"}
    if threads is not None:
        config["threads"] = threads
    if read_only and not os.access(path.parent, os.W_OK):
        # A cache in a read-only place: DuckDB spills beside the file by default, which
        # fails there ("Failed to create directory ...tmp"); this process's own folder in the
        # system's temporary place instead (DuckDB makes it, and removes it at close).
        config["temp_directory"] = os.path.join(
            tempfile.gettempdir(), f"csi-duckdb-{os.getpid()}-{abs(hash(str(path)))}")
    config.update(allocator or {})
    config["lock_configuration"] = False  # locked below, once the connection's own are set
    try:
        con = duckdb.connect(str(path), read_only=read_only, config=config)
    except duckdb.ConnectionException as e:
        raise CacheError(
            f"Cannot open the cache {path} again with other settings in this process "
            f"({str(e).splitlines()[0]}); use the connection that is already open."
        ) from e
    except duckdb.Error as e:
        first = (str(e).splitlines() or [""])[0]
        if "not a valid DuckDB database file" in first:
            raise CacheError(
                f"{path} is not a DuckDB cache file; it was left untouched: give a new file "
                "or a cache made by this tool."
            ) from e
        if any(word in first for word in _LOCK_WORDS):
            raise CacheLocked(
                f"Cannot open the cache {path}: another process holds it ({first}); close "
                "that process or give another cache file."
            ) from e
        if not read_only and any(word in first for word in _UNWRITABLE_WORDS):
            raise CacheError(
                f"Cannot write the cache {path} ({first.rsplit(': ', 1)[-1]}); pulls, imports "
                "and the dashboard need a cache file they can write: give one in a writable "
                "place (report, export and history also read a read-only one)."
            ) from e
        raise CacheError(f"Cannot open the cache {path}: {first}") from e
    # DuckDB draws a progress bar on stdout for a query past 2 s, terminal or not (seen before
    # a query's printed result in tests/test_cli.py); its settings are the connection's own
    # (cursors inherit them), so they are set before the lock. The lock is the database's: a
    # second connection of this process to an open cache finds it set (and keeps DuckDB's bar).
    for statement in ("SET enable_progress_bar = false", "SET lock_configuration = true"):
        with contextlib.suppress(duckdb.InvalidInputException):  # locked already
            con.execute(statement)
    return con


def _check_ours(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A DuckDB file with tables but no cache ``meta`` is someone else's: refuse it, untouched."""
    names = sorted(r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
        "AND NOT temporary UNION SELECT view_name FROM duckdb_views() "
        "WHERE database_name = current_database() AND NOT internal AND NOT temporary"
    ).fetchall())
    if not names:
        return
    version = None
    if "meta" in names:
        try:
            row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = row[0] if row else None
        except duckdb.Error:
            version = None
    if version is None:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise CacheError(
            f"{path} is a DuckDB database but not a cache of this tool (it holds {shown}); it "
            "was left untouched: give a new file or a cache made by this tool."
        )
    if not re.fullmatch(r"[0-9]{1,9}", str(version)) or int(version) < 1:
        raise CacheError(
            f"{path} names its schema version {version!r}, which is not a version of this "
            f"tool's caches (a whole number from 1 to {SCHEMA_VERSION}): it is damaged or was "
            "changed outside this tool, and was left untouched: give a new file or a cache "
            "made by this tool."
        )
    if int(version) > SCHEMA_VERSION:
        raise CacheError(
            f"{path} is a cache of schema version {version}, newer than this tool's "
            f"({SCHEMA_VERSION}); it was left untouched: update the tool or give another file."
        )
    if int(version) == SCHEMA_VERSION:
        _check_columns(con, path)


@functools.lru_cache(maxsize=1)
def _schema_columns() -> dict[str, frozenset[str]]:
    """The columns of every table the schema creates (``ALTER``s add columns that a read-write
    open adds to older files: not counted)."""
    con = duckdb.connect(":memory:")
    try:
        for stmt in DDL:
            if stmt.lstrip().upper().startswith("CREATE TABLE"):
                con.execute(stmt)
        rows = con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                           "WHERE database_name = current_database()").fetchall()
    finally:
        con.close()
    tables: dict[str, set[str]] = {}
    for table, column in rows:
        tables.setdefault(table, set()).add(column)
    return {table: frozenset(columns) for table, columns in tables.items()}


def _check_columns(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """A cache of this schema version whose tables lack some of the schema's columns was
    changed outside this tool: refuse it, untouched (every query of it would fail on its
    own). A table that is missing altogether is created by the next read-write open."""
    have: dict[str, set[str]] = {}
    for table, column in con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() "
            "WHERE database_name = current_database()").fetchall():
        have.setdefault(table, set()).add(column)
    missing = [f"{table}.{column}" for table, columns in sorted(_schema_columns().items())
               if table in have for column in sorted(columns - have[table])]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5
                                          else "")
        raise CacheError(
            f"{path} is a cache of schema version {SCHEMA_VERSION} whose tables lack "
            f"{'a column' if len(missing) == 1 else 'columns'} of that schema ({shown}): it was "
            "changed outside this tool, and was left untouched: give a new file, or pull or "
            "import again into one."
        )


def clean_staging(cache_path: str | Path) -> list[Path]:
    """Remove the staging folders (``csi-pull-*``, ``csi-import-*``) that killed runs left
    beside the cache; returns what was removed.

    A folder made by ``Cache.staging_dir`` names its cache and is removed when it is this
    cache's and not in use in this process. A folder without that note (made by older code)
    is removed only when no other DuckDB file shares the folder and no pull of this cache is
    running in this process. Called on every read-write open: another process cannot hold the
    cache then (DuckDB's lock), so a folder of this cache not in use here is a dead run's.
    """
    path = Path(cache_path)
    me = _key(path)
    parent = path.parent
    try:
        entries = list(parent.iterdir())
    except OSError:
        return []
    others = any(e.is_file() and e.suffix in (".duckdb", ".db") and _key(e) != me
                 for e in entries)
    removed = []
    for entry in entries:
        if (not entry.name.startswith(STAGING_PREFIXES) or entry.is_symlink()
                or not entry.is_dir() or str(entry) in _LIVE_STAGING):
            continue
        owner = _staging_owner(entry)
        if owner is not None:
            if owner != me:
                continue
        elif others or _ACTIVE_PULLS.get(me):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
    return removed


def _remove_dead_temp(cache_path: Path) -> None:
    """DuckDB's spill folder beside the cache (``<file>.tmp``) that a killed process left (its
    own close removes it): called while this process holds the cache, before it spills."""
    folder = Path(f"{cache_path}.tmp")
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in folder.glob("duckdb_temp_*"):
        with contextlib.suppress(OSError):
            entry.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when nothing else is in it


def disk_full(error: Exception) -> bool:
    """DuckDB's error says the disk is full: a write that failed (WAL, checkpoint), or a spill
    refused because the temporary folder's disk has no room (an ``OutOfMemoryException``
    whose cause is the disk, not the memory limit)."""
    text = str(error)
    return "No space left on device" in text or "max_temp_directory_size" in text


def cache_failure(path: str | Path, error: Exception) -> str:
    """One sentence for an error DuckDB raised about the cache file ``path`` (a command that
    read or wrote it): what is wrong with the file or the machine, and what to do."""
    first = (str(error).splitlines() or [""])[0]
    if disk_full(error):
        return (f"The disk of the cache {path} is full ({first}); free space there (or give a "
                "cache on another disk) and run again: what was committed before is kept.")
    if isinstance(error, duckdb.OutOfMemoryException):
        return (f"DuckDB ran out of its memory limit on the cache {path} ({first}); give it "
                f"more with ${MEMORY_ENVVAR} (e.g. {MEMORY_ENVVAR}=2GB) and run again.")
    if isinstance(error, duckdb.IOException | duckdb.SerializationException |
                  duckdb.InternalException):
        return (f"The cache {path} is damaged: DuckDB cannot read part of it ({first}); pull "
                "or import the streams again into a new cache file, or restore a copy.")
    if isinstance(error, duckdb.BinderException | duckdb.CatalogException):
        return (f"The cache {path} does not have the tables and columns this tool's queries "
                f"need ({first}); it was changed outside this tool: give a new file, or pull "
                "or import again into one.")
    return f"The cache {path} failed ({type(error).__name__}: {first})."


def _staging_owner(folder: Path) -> str | None:
    try:
        return str(json.loads((folder / _OWNER_FILE).read_text(encoding="utf-8"))["cache"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def parquet_dataset(batch: str | Path) -> Any:
    """Staged Parquet files (a path or glob) as a pyarrow dataset: the cache reads no files
    itself (external access is off), so staging is read here and handed over as Arrow."""
    import pyarrow.dataset as ds

    from spark_backend.model.records import arrow_schema

    files = sorted(glob.glob(str(batch)))
    if not files:
        return ds.dataset([], schema=arrow_schema())
    return ds.dataset(files, format="parquet")


@dataclass
class IngestStats:
    data_change: int = 0
    heartbeats: int = 0
    child_partitions: int = 0
    duplicates: int = 0
    bad: int = 0
    partitions_ended: int = 0


def rebuild_transactions(con: duckdb.DuckDBPyConnection, stream: str, touched: str) -> None:
    """Rebuild the ``transactions`` rows of ``stream`` whose ids the temporary table
    ``touched`` (one column ``id``; an id may repeat) lists, from all their records; in the
    caller's transaction.

    The one place the summary is computed: a pull's end (``Cache.summarize_transactions``) and
    an import's end (``ingest.end_ingest``) both call it. It runs in slices of about
    ``_SUMMARY_SLICE_RECORDS`` records, because its list aggregates hold their groups in memory.
    """
    if not re.fullmatch(r"_[a-z_]+", touched):
        raise ValueError(f"{touched!r} is not a temporary table name")
    (records,) = con.execute(
        "SELECT count(*) FROM data_change_records WHERE stream = ? AND "
        f"server_transaction_id IN (SELECT id FROM {touched})", [stream]).fetchone()
    con.execute(
        "DELETE FROM transactions WHERE stream = ? AND server_transaction_id IN "
        f"(SELECT id FROM {touched})", [stream])
    slices = max(1, -(-int(records) // _SUMMARY_SLICE_RECORDS))
    # The slice's filter takes its numbers as UBIGINT, the type of ``hash``: bound as plain
    # integers DuckDB evaluates it far slower. It slices by the hash's low 32 bits,
    # ``Cache._summarize``'s slices by its high 32: with the same bits, a slice of a slice whose
    # counts share a factor would be all or nothing (and one statement would get it all).
    # The lists are made distinct by ``list_distinct`` (which also drops NULLs), not by
    # DISTINCT aggregates, which keep a hash table per list and group.
    for i in range(slices):
        con.execute(
            f"""INSERT INTO transactions
            SELECT stream, server_transaction_id, min(commit_timestamp), count(*),
                   max(number_of_records_in_transaction),
                   list_sort(list_distinct(list(partition_token))),
                   max(number_of_partitions_in_transaction),
                   list_sort(list_distinct(list(table_name))),
                   list_sort(list_distinct(list(mod_type))),
                   any_value(transaction_tag), sum(coalesce(mod_count, 0))
            FROM data_change_records
            WHERE stream = $stream AND server_transaction_id IN
                  (SELECT id FROM {touched}
                   WHERE (hash(id) & 4294967295::UBIGINT) % $slices::UBIGINT = $i::UBIGINT)
            GROUP BY stream, server_transaction_id""",
            {"stream": stream, "slices": slices, "i": i})


class Cache:
    """One DuckDB cache file.

    Every connection to a cache runs with DuckDB's own guards (``LOCKED_DOWN``): no file,
    network or extension access and a locked configuration. The cache needs none of these
    (batches arrive as Arrow, Parquet staging is read with pyarrow). Another process cannot
    open a file a writer holds, so the SQL console reads a snapshot of the cache taken through
    this connection (``app/console_snapshot.py``), in a worker process of its own.
    """

    def __init__(self, path: str | Path, read_only: bool = False, *,
                 memory_limit: str = DEFAULT_MEMORY_LIMIT, threads: int | None = None,
                 allocator: dict[str, Any] | None = None):
        """``memory_limit``: DuckDB's cap in this process unless ``$CSI_DUCKDB_MEMORY`` sets
        one (``PULL_MEMORY_LIMIT`` for a process that only pulls or imports); ``threads``:
        DuckDB's threads (None: one per core) unless ``$CSI_DUCKDB_THREADS`` sets them
        (``PULL_THREADS`` for that process); ``allocator``: DuckDB's allocator settings
        (``PULL_ALLOCATOR`` for that process; None: DuckDB's own)."""
        self.path = Path(path)
        self.read_only = read_only
        _check_path(self.path, read_only)
        self.memory_limit = _memory_limit(memory_limit)
        self._settings = (_threads(threads), allocator)
        # (stream, mark) of the summaries brought up to date while a pull still lands
        # (``summarize_landed``): from then on only the transactions that changed are rebuilt
        self._summarized_early: set[tuple[str, str]] = set()
        self.con = _connect(self.path, read_only, self.memory_limit, *self._settings)
        try:
            _check_ours(self.con, self.path)
        except BaseException:
            self.con.close()
            raise
        if not read_only:
            self._create()
            self._recover()

    def _create(self) -> None:
        row = None
        if self.con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'meta' "
                            "AND database_name = current_database()").fetchone()[0]:
            row = self.con.execute(
                "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) < 2:
            self._migrate_to_2()
            return
        columns = "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database()"
        before = self.con.execute(columns).fetchone()[0]
        for stmt in DDL:
            self.con.execute(stmt)
        self.con.execute(
            "INSERT INTO meta VALUES ('schema_version', ?), ('version', '0') "
            "ON CONFLICT DO NOTHING",
            [str(SCHEMA_VERSION)],
        )
        if self.con.execute(columns).fetchone()[0] != before:
            # DuckDB cannot replay a WAL that adds a column to a table with a DEFAULT
            # current_timestamp ("no default database set"): a process killed before its
            # first checkpoint left a cache nobody could open. The new catalog goes to the
            # file at once.
            self.con.execute("CHECKPOINT")

    def _migrate_to_2(self) -> None:
        """Schema 1 -> 2, in one transaction (a crash leaves schema 1, migrated again at the
        next open): the growing tables are rebuilt without their PRIMARY KEY, the index on
        ``mods`` goes (``schema.py`` says why)."""
        with self.transaction():
            for name in DROPPED_IN_2:
                self.con.execute(f"DROP INDEX IF EXISTS {name}")
            for table in UNKEYED_IN_2:
                self.con.execute(f"ALTER TABLE {table} RENAME TO {table}_schema1")
            for stmt in DDL:  # creates the rebuilt tables; the others exist
                self.con.execute(stmt)
            for table in UNKEYED_IN_2:
                self.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {table}_schema1")
                self.con.execute(f"DROP TABLE {table}_schema1")
            self.con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                             [str(SCHEMA_VERSION)])
        self.con.execute("CHECKPOINT")

    def _recover(self) -> None:
        """After a crash or SIGKILL: close the dead runs' pulls as ``interrupted`` and remove
        their staging folders. No other process can hold the cache now (DuckDB's lock), so a
        pull ``running`` that is not running in this process is dead."""
        live = sorted(_ACTIVE_PULLS.get(_key(self.path), ()))
        self.con.execute(
            "UPDATE pulls SET status = 'interrupted', finished_at = coalesce(finished_at, "
            "current_timestamp), error = coalesce(error, 'the process ended during the pull "
            "(killed or crashed); pull again to resume') "
            "WHERE status = 'running' AND NOT list_contains(?::BIGINT[], pull_id)",
            [live],
        )
        clean_staging(self.path)
        _remove_dead_temp(self.path)
        if not live:
            for (key,) in self.con.execute(
                    "SELECT key FROM meta WHERE starts_with(key, ?)", [_UNSUMMARIZED]).fetchall():
                try:
                    self._summarize_in_room(key.removeprefix(_UNSUMMARIZED))
                except duckdb.OutOfMemoryException:
                    pass  # the mark stays: the next open (or the stream's next pull) retries

    def needs_recovery(self) -> bool:
        """A run that died left work that only a read-write open does (``_recover``): a pull
        still marked ``running`` or transactions not summarized yet; or the file has no cache
        tables yet. Meant for a read-only open, when no process writes the cache: a pull
        marked running is then a dead one."""
        try:
            row = self.con.execute(
                "SELECT (SELECT count(*) FROM pulls WHERE status = 'running') "
                "+ (SELECT count(*) FROM meta WHERE starts_with(key, ?))",
                [_UNSUMMARIZED]).fetchone()
        except duckdb.CatalogException:
            return True
        return bool(row[0])

    def staging_dir(self, kind: str) -> Path:
        """A new staging folder beside the cache (``csi-<kind>-*``) that names its cache, so
        that the next read-write open removes it when a run dies before removing it itself."""
        folder = Path(tempfile.mkdtemp(prefix=f"csi-{kind}-", dir=self.path.parent))
        (folder / _OWNER_FILE).write_text(
            json.dumps({"cache": _key(self.path), "pid": os.getpid()}), encoding="utf-8")
        _LIVE_STAGING.add(str(folder))
        return folder

    def release_staging(self, folder: Path) -> None:
        """Remove a folder made by ``staging_dir``."""
        shutil.rmtree(folder, ignore_errors=True)
        _LIVE_STAGING.discard(str(folder))

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        return self.con.cursor()

    # --- bookkeeping --------------------------------------------------------------------

    def version(self) -> int:
        row = self.con.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        return int(row[0]) if row else 0

    def _bump(self) -> None:
        self.con.execute(
            "UPDATE meta SET value = CAST(CAST(value AS BIGINT) + 1 AS TEXT) WHERE key = 'version'"
        )

    def read_every_block(self) -> int:
        """Read every column of every table, so that DuckDB checks the checksum of each data
        block the tables hold: a damaged one raises ``duckdb.IOException`` ("Corrupt database
        file"), which ``cache_failure`` names. Returns the number of tables read."""
        tables = [r[0] for r in self.con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() "
            "ORDER BY table_name").fetchall()]
        for table in tables:
            quoted = table.replace('"', '""')
            self.con.execute(f'SELECT max(hash(COLUMNS(*))) FROM "{quoted}"').fetchall()
        return len(tables)

    def streams(self) -> list[str]:
        rows = self.con.execute("SELECT stream FROM streams ORDER BY stream").fetchall()
        return [r[0] for r in rows]

    def stream_info(self, stream: str) -> dict[str, Any] | None:
        cur = self.con.execute("SELECT * FROM streams WHERE stream = ?", [stream])
        row = cur.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    def resolve_stream(self, stream: str | None) -> str:
        """The stream a command is about: the one given, or the only one in the cache."""
        names = self.streams()
        if stream is None:
            if len(names) == 1:
                return names[0]
            if not names:
                raise CacheError(f"The cache {self.path} holds no stream yet; pull or import one.")
            raise BadInput(
                f"The cache holds several streams ({', '.join(names)}); choose one with --stream.",
                field="stream",
            )
        if stream not in names:
            listed = ", ".join(names) if names else "none"
            raise BadInput(f"No stream {stream!r} in the cache {self.path} (streams: {listed}).",
                           field="stream")
        return stream

    def ensure_stream(
        self,
        stream: str,
        *,
        system: str,
        source: str | None = None,
        dialect: str | None = None,
        location: str | None = None,
        source_stream: str | None = None,
        heartbeat_ms: int | None = None,
    ) -> None:
        validate_cache_stream_name(stream)
        existing = self.stream_info(stream)
        if existing is None:
            self.con.execute(
                "INSERT INTO streams (stream, system, source, dialect, location, source_stream, "
                "heartbeat_ms) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [stream, system, source, dialect, location, source_stream, heartbeat_ms],
            )
            return
        if existing["system"] != system:
            raise CacheError(
                f"Stream {stream!r} in the cache holds {existing['system']} records, not "
                f"{system}; choose another --stream name."
            )

    def begin_pull(
        self, stream: str, source: str, start_ns: int | None, end_ns: int | None,
        heartbeat_ms: int | None,
    ) -> int:
        # The next identifier is max + 1 in the same statement, never a DuckDB sequence: after
        # a crash DuckDB restores a sequence to its checkpointed value while the row written
        # after it survives, and the next pull would collide with it.
        for attempt in range(5):
            try:
                (pull_id,) = self.con.execute(
                    "INSERT INTO pulls (pull_id, stream, source, range_start, range_end, "
                    "heartbeat_ms, started_at, status) SELECT coalesce(max(pull_id), 0) + 1, ?, "
                    "?, make_timestamp_ns(?), make_timestamp_ns(?), ?, current_timestamp, "
                    "'running' FROM pulls RETURNING pull_id",
                    [stream, source, start_ns, end_ns, heartbeat_ms],
                ).fetchone()
                break
            except (duckdb.ConstraintException, duckdb.TransactionException):
                if attempt == 4:  # another thread of this process took the same id each time
                    raise
        _ACTIVE_PULLS.setdefault(_key(self.path), set()).add(int(pull_id))
        return int(pull_id)

    def finish_pull(
        self, pull_id: int, status: str, *, error: str | None = None,
        failed_partition: str | None = None, waves: int | None = None,
    ) -> None:
        """Record the pull's end and bring the transaction summary up to date.

        In a process asked to stop (``interrupts.requested()``) a pull that "failed" was ended
        by the signal (the errors it surfaces as are DuckDB's "Query interrupted", a cut-off
        import, a Spark start that did not finish): it is recorded ``interrupted``, and the
        summary is left to the next read-write open (its mark stays), so that the process
        ends within seconds."""
        with interrupts.deferred():  # a signal meanwhile does not cut the record in two
            self._record_end(pull_id, status, error, failed_partition, waves)
        # Apart, so that the pull's end is recorded even if the summary fails (its mark stays
        # for the next read-write open).
        try:
            (stream,) = self.con.execute(
                "SELECT stream FROM pulls WHERE pull_id = ?", [pull_id]).fetchone()
            if interrupts.requested() is None:
                self._summarize_in_room(stream)
        finally:
            _ACTIVE_PULLS.get(_key(self.path), set()).discard(pull_id)

    def _record_end(self, pull_id: int, status: str, error: str | None,
                    failed_partition: str | None, waves: int | None) -> None:
        stop = interrupts.requested()
        if stop is not None and status == "failed":
            status = "interrupted"
            error = f"interrupted by {interrupts.name(stop)}; pull again to resume"
        with self.transaction():
            self.con.execute(
                "UPDATE pulls SET status = ?, error = ?, failed_partition = ?, "
                "finished_at = current_timestamp, waves = coalesce(?, waves) WHERE pull_id = ?",
                [status, error, failed_partition, waves, pull_id],
            )
            if status == "complete":
                self.con.execute(
                    """UPDATE streams SET
                         range_start = CASE WHEN streams.range_start IS NULL THEN p.range_start
                                            ELSE least(streams.range_start, p.range_start) END,
                         range_end = CASE WHEN streams.range_end IS NULL THEN p.range_end
                                          ELSE greatest(streams.range_end, p.range_end) END
                       FROM pulls p WHERE p.pull_id = ? AND streams.stream = p.stream""",
                    [pull_id],
                )
            self._bump()

    def _summarize_in_room(self, stream: str) -> None:
        """``summarize_transactions`` in a transaction of its own, in this connection's memory
        if it fits there.

        A pull's landings run in ``PULL_MEMORY_LIMIT`` (64MB), which a typical 1M-record
        pull's summary fits once the landings' WAL (kept in memory until a checkpoint) is
        written out; one whose records are mostly transactions of their own needs more (1M
        single-record transactions: DuckDB refused 64MB). There the connection is opened
        again with ``DEFAULT_MEMORY_LIMIT``, unless ``$CSI_DUCKDB_MEMORY`` set the limit: that
        is the user's cap.
        """
        try:
            self._summarize_checkpointed(lambda: self.summarize_transactions(stream))
            return
        except duckdb.OutOfMemoryException:
            if not self._may_grow_memory():
                raise
        try:
            self._reopen(DEFAULT_MEMORY_LIMIT)
        except CacheError as e:  # e.g. another process took the file while it was closed
            first = (str(e.__cause__ or e).splitlines() or [""])[0]
            raise CacheError(
                f"The cache {self.path} could not be opened again with {DEFAULT_MEMORY_LIMIT} "
                f"to summarize the transactions just landed ({first}); the records and the "
                "end of the pull or import are kept, and the next read-write open of the cache "
                "summarizes them."
            ) from e
        with self.transaction():
            self.summarize_transactions(stream)
            self._bump()

    def _summarize_checkpointed(self, summarize: Callable[[], Any]) -> Any:
        """``summarize()`` in a transaction of its own, after a checkpoint: the landings' WAL,
        held in memory until then, is written out first."""
        with contextlib.suppress(duckdb.TransactionException):  # another's write in progress
            self.con.execute("CHECKPOINT")
        with self.transaction():
            result = summarize()
            self._bump()
        return result

    def _may_grow_memory(self) -> bool:
        return (MEMORY_ENVVAR not in os.environ
                and _bytes(self.memory_limit) < _bytes(DEFAULT_MEMORY_LIMIT))

    def _reopen(self, memory_limit: str) -> None:
        """This cache's connection again, with ``memory_limit`` (its cursors end with it)."""
        self.con.close()
        self.memory_limit = memory_limit
        self.con = _connect(self.path, self.read_only, memory_limit, *self._settings)

    def summarize_transactions(self, stream: str) -> None:
        """Bring the ``transactions`` summary up to date with the records that pulls landed
        without it (``defer_transactions``); in the caller's transaction.

        A pull's landings leave the summary alone: folding each landing into it would update
        the transactions seen in earlier ones again and again (the commit rewriting them each
        time). The pull's end (any status) rebuilds the touched
        transactions once, from all their records; a run killed before that leaves the mark,
        and the next read-write open rebuilds them. After ``summarize_landed`` only those
        whose records changed since are rebuilt.
        """
        self._summarize(stream, final=True)

    def summarize_landed(self, stream: str) -> bool:
        """While a pull still lands (its lander, with nothing to land and a Spark task slot
        idle): bring the summary up to date with what landed so far, in a transaction of its
        own. The mark stays, and the pull's end then rebuilds only the transactions whose
        records changed since (found by their count: records are only ever added). False
        when DuckDB refuses it this connection's memory (the end then does it all)."""
        try:
            mark = self._summarize_checkpointed(lambda: self._summarize(stream, final=False))
        except duckdb.OutOfMemoryException:
            return False
        if mark is not None:
            self._summarized_early.add((stream, mark))
        return True

    def _summarize(self, stream: str, final: bool) -> str | None:
        """Rebuild what the mark of ``stream`` says is out of date (or, after an earlier
        ``summarize_landed`` of the same mark, what changed since); ``final`` removes the
        mark. Returns the mark (None: there was none).

        After an early summary, what changed since is found and rebuilt a slice of the
        transactions' ids at a time (``_CHANGED_SLICE_RECORDS`` of the pull's records per
        slice; the rebuild slices each again by its own count): found at once, a 1M-record
        pull's changes (their ids, the records' count per id and the summary's rows joined)
        do not fit a pull's ``64MB``. A slice here is one of the hash's high 32 bits, so that
        the rebuild's own slices (its low 32 bits) split it again."""
        key = _UNSUMMARIZED + stream
        row = self.con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
        if row is None:
            return None
        params = {"stream": stream, "pull": int(row[0])}
        touched = ("SELECT DISTINCT server_transaction_id AS id FROM data_change_records "
                   "WHERE stream = $stream AND pull_id >= $pull AND server_transaction_id "
                   "IS NOT NULL")
        if (stream, row[0]) not in self._summarized_early:
            # Their ids alone fit (a 1M-record pull's 458k in 64MB); the rebuild slices itself.
            self.con.execute(f"CREATE OR REPLACE TEMP TABLE _touched AS {touched}", params)
            rebuild_transactions(self.con, stream, "_touched")
        else:
            (records,) = self.con.execute(
                "SELECT count(*) FROM data_change_records WHERE stream = $stream AND "
                "pull_id >= $pull", params).fetchone()
            params["slices"] = max(1, -(-int(records) // _CHANGED_SLICE_RECORDS))
            # As in ``rebuild_transactions``: the slice's numbers bound as UBIGINT (hash's type).
            changed = f"""SELECT c.id FROM (
                SELECT server_transaction_id AS id, count(*) AS n FROM data_change_records
                WHERE stream = $stream AND server_transaction_id IN ({touched}
                      AND (hash(server_transaction_id) >> 32) % $slices::UBIGINT = $i::UBIGINT)
                GROUP BY server_transaction_id) c
              LEFT JOIN transactions t ON t.stream = $stream AND t.server_transaction_id = c.id
              WHERE t.records_seen IS DISTINCT FROM c.n"""
            for i in range(params["slices"]):
                self.con.execute(f"CREATE OR REPLACE TEMP TABLE _touched AS {changed}",
                                 {**params, "i": i})
                rebuild_transactions(self.con, stream, "_touched")
        self.con.execute("DROP TABLE _touched")
        if final:
            self.con.execute("DELETE FROM meta WHERE key = ?", [key])
            self._summarized_early.discard((stream, row[0]))
        return row[0]

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self.con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self.con.execute("ROLLBACK")
            raise
        self.con.execute("COMMIT")

    def scan(self, batch: Any, sql: str) -> list[tuple]:
        """Run ``sql`` over a batch (Arrow, or a Parquet path/glob) exposed as the view ``b``."""
        con = self.cursor()
        try:
            con.register("b", parquet_dataset(batch) if isinstance(batch, str | Path) else batch)
            return con.execute(sql).fetchall()
        finally:
            con.close()

    # --- ingest --------------------------------------------------------------------------

    def ingest(
        self,
        stream: str,
        pull_id: int | None,
        batch: Any,
        *,
        count_existing_as_duplicates: bool = False,
        extra_sql: list[tuple[str, list[Any]]] | None = None,
    ) -> IngestStats:
        """Land record rows in one transaction; idempotent on record identity.

        ``batch`` is a pyarrow Table/RecordBatch of ``records.RECORD_FIELDS`` or a path (glob)
        of Parquet files of them. A record already cached is not stored again; it counts as a
        duplicate only when ``count_existing_as_duplicates`` (file imports), because a pull
        that resumes a partition re-reads its last timestamp on purpose.
        ``extra_sql`` statements run in the same transaction (e.g. marking a pull's progress).
        """
        from spark_backend.cache.ingest import begin_ingest, end_ingest, ingest_batch

        # Parquet output is landed file by file (in the same transaction) to bound memory.
        chunks = sorted(glob.glob(str(batch))) if isinstance(batch, str | Path) else [batch]
        with self.transaction():
            begin_ingest(self.con)
            stats = IngestStats()
            for chunk in chunks:
                part = ingest_batch(
                    self.con, stream, pull_id,
                    parquet_dataset(chunk) if isinstance(chunk, str) else chunk,
                    count_existing_as_duplicates=count_existing_as_duplicates,
                )
                for name in vars(stats):
                    setattr(stats, name, getattr(stats, name) + getattr(part, name))
            end_ingest(self.con, stream)
            for sql, params in extra_sql or []:
                self.con.execute(sql, params)
            self._bump()
        return stats

    # --- the questions a pull asks -------------------------------------------------------

    def cached_range(self, stream: str) -> tuple[int | None, int | None]:
        """(start, end) of what is cached for ``stream``, in UTC nanoseconds (None: nothing)."""
        row = self.con.execute(
            "SELECT epoch_ns(range_start), epoch_ns(range_end) FROM streams WHERE stream = ?",
            [stream],
        ).fetchone()
        if row is None:
            return None, None
        return (None if row[0] is None else int(row[0]),
                None if row[1] is None else int(row[1]))

    def partition_count(self, stream: str) -> int:
        return int(self.con.execute(
            "SELECT count(*) FROM partitions WHERE stream = ?", [stream]).fetchone()[0])

    def partition_states(self, stream: str) -> dict[str, int]:
        """How many partitions of ``stream`` are in each state (``PartitionState`` values)."""
        rows = self.con.execute(
            "SELECT state, count(*) FROM partitions WHERE stream = ? GROUP BY state", [stream],
        ).fetchall()
        return {state: int(n) for state, n in rows}

    def finished_partitions(self, stream: str) -> set[str]:
        """Tokens of the partitions of ``stream`` read to their end."""
        rows = self.con.execute(
            "SELECT token FROM partitions WHERE stream = ? AND state = 'finished'", [stream],
        ).fetchall()
        return {token for (token,) in rows}

    def close_running_pulls(self, stream: str) -> None:
        """Pulls of ``stream`` still marked running were cut off: mark them interrupted."""
        self.con.execute(
            "UPDATE pulls SET status = 'interrupted' WHERE stream = ? AND status = 'running'",
            [stream],
        )

    def defer_transactions(self, stream: str, pull_id: int) -> None:
        """Mark that ``pull_id`` lands records that the ``transactions`` summary does not hold
        yet (in the landing's transaction); ``summarize_transactions`` adds them."""
        self.con.execute("INSERT INTO meta VALUES (?, ?) ON CONFLICT DO NOTHING",
                         [_UNSUMMARIZED + stream, str(pull_id)])

    def frontier(self, stream: str, end_ns: int) -> list[tuple[str, int]]:
        """Partitions a pull can read now, with the timestamp to read each from (UTC ns).

        Never read (``pending``), ``open`` (read up to ``read_to`` < ``end_ns``: continue right
        after it) or ``incomplete`` (a failed read: resume at its watermark) — and only when
        every parent is known and ``finished`` (a merge child is read once, after all its
        parents; a parent the cache has not seen yet counts as not finished).
        """
        rows = self.con.execute(
            """
            SELECT p.token, epoch_ns(CASE
                     WHEN p.state = 'open' THEN p.read_to
                     WHEN p.state = 'incomplete'
                       THEN coalesce(p.watermark, p.read_from, p.start_ts)
                     ELSE p.start_ts END) AS from_ns, p.state
            FROM partitions p
            WHERE p.stream = $stream
              AND (p.state IN ('pending', 'incomplete')
                   OR (p.state = 'open' AND p.read_to < make_timestamp_ns($end)))
              AND NOT EXISTS (
                  SELECT 1 FROM edges e
                  LEFT JOIN partitions q ON q.stream = e.stream AND q.token = e.parent
                  WHERE e.stream = $stream AND e.child = p.token AND e.parent IS NOT NULL
                    AND (q.token IS NULL OR q.state <> 'finished'))
              AND coalesce(p.start_ts, make_timestamp_ns(0)) <= make_timestamp_ns($end)
            ORDER BY p.start_ts, p.token""",
            {"stream": stream, "end": end_ns},
        ).fetchall()
        return [(tok, int(ns) + (1 if state == "open" else 0)) for tok, ns, state in rows]
