"""Read-only snapshots of a cache for the SQL console's worker processes.

The dashboard holds its cache read-write, and DuckDB refuses another process opening a file a
writer holds; the cache's own connection cannot write elsewhere either (``enable_external_access``
is off and the configuration is locked). So a snapshot is copied through Arrow: one read-only
transaction on a cursor of the cache (DuckDB's MVCC makes every table of it the same moment)
streams each table into a new DuckDB file made with the cache's own DDL, then its views.

Contract:

- ``prepare(cursor)`` starts bringing the snapshot up to date in the background (the SQL page
  calls it when it opens).
- ``lease(con)`` yields the path of a snapshot equal to what ``con`` sees now; it is rebuilt only
  when the cache changed (its ``meta`` version, its tables' row estimates or its DDL), and a
  replaced snapshot is deleted once no lease holds it.
- Snapshots live in one private folder of this process (mode 0700), removed at exit; folders
  left by a process that was killed are removed by the next one.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import itertools
import shutil
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from app import private_temp

FOLDER_PREFIX = "csi-console-"
BATCH_ROWS = 65_536
# The copy runs in the dashboard's process: a modest budget of its own (it streams batches).
BUILD_CONFIG = {"threads": 1, "memory_limit": "256MB", "enable_external_access": False,
                "autoinstall_known_extensions": False, "autoload_known_extensions": False}


@dataclass
class _Snapshot:
    path: Path
    key: str
    leases: int = 0
    replaced: bool = False


_lock = threading.Lock()
_current: dict[str, _Snapshot] = {}  # cache file -> its newest snapshot
_building: dict[str, threading.Lock] = {}
_folder: Path | None = None
_serial = itertools.count(1)


@contextlib.contextmanager
def lease(con: duckdb.DuckDBPyConnection) -> Iterator[Path]:
    """The path of a read-only snapshot of the cache ``con`` is a connection (or cursor) of."""
    cur = con.cursor()
    try:
        cur.execute("BEGIN TRANSACTION READ ONLY")
        try:
            source, key = _identity(cur)
            snap = _get(cur, source, key)
        finally:
            cur.execute("ROLLBACK")
    finally:
        cur.close()
    try:
        yield snap.path
    finally:
        _release(snap)


def prepare(cursor: Callable[[], duckdb.DuckDBPyConnection]) -> None:
    """Bring the snapshot of the cache up to date on a thread of its own (``cursor`` makes a
    new cursor of the cache on that thread), so that the first query need not wait for the copy
    (seconds on a million records). Returns at once; does nothing while a copy is under way.
    Not a daemon, even when called from one (Streamlit's script threads are daemons, and a
    thread inherits that): a process exiting during the copy waits for it, since DuckDB aborts
    the process ("terminate called") when a thread is still inside it at interpreter exit."""
    threading.Thread(target=_prepare, args=(cursor,), name="console-snapshot",
                     daemon=False).start()


def _prepare(cursor: Callable[[], duckdb.DuckDBPyConnection]) -> None:
    con = cursor()
    try:
        source = con.execute("SELECT coalesce(path, database_name) FROM duckdb_databases() "
                             "WHERE database_name = current_database()").fetchone()[0]
        with _lock:
            busy = _building.setdefault(str(source), threading.Lock()).locked()
        if not busy:
            with lease(con):
                pass
    except (duckdb.Error, OSError):
        pass  # the query that needs the snapshot copies it again and says what failed
    finally:
        con.close()


def folder() -> Path:
    """This process's private folder for snapshots (made on first use, removed at exit)."""
    global _folder
    with _lock:
        if _folder is None:
            _folder = private_temp.make(FOLDER_PREFIX)
            atexit.register(shutil.rmtree, _folder, True)
        return _folder


def _identity(cur: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """The cache file and a key that changes whenever its tables or their rows do."""
    source = cur.execute("SELECT coalesce(path, database_name) FROM duckdb_databases() "
                         "WHERE database_name = current_database()").fetchone()[0]
    parts = cur.execute(
        "SELECT list(table_name || ':' || estimated_size || ':' || md5(sql) ORDER BY table_name) "
        "FROM duckdb_tables() WHERE database_name = current_database() AND NOT temporary"
    ).fetchone()[0] or []
    views = cur.execute(
        "SELECT list(md5(sql) ORDER BY view_name) FROM duckdb_views() "
        "WHERE database_name = current_database() AND NOT internal AND NOT temporary"
    ).fetchone()[0] or []
    version = ""
    if any(p.startswith("meta:") for p in parts):
        row = cur.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        version = row[0] if row else ""
    key = hashlib.sha256("\n".join([str(version), *parts, *views]).encode()).hexdigest()
    return str(source), key


def _get(cur: duckdb.DuckDBPyConnection, source: str, key: str) -> _Snapshot:
    with _lock:
        build_lock = _building.setdefault(source, threading.Lock())
    with build_lock:  # one copy at a time per cache; others wait and share it
        with _lock:
            snap = _current.get(source)
            if snap is not None and snap.key == key:
                snap.leases += 1
                return snap
        path = folder() / f"snapshot-{next(_serial)}.duckdb"  # never a name used before
        try:
            _copy(cur, path)
        except BaseException:
            _unlink(path)
            raise
        with _lock:
            old = _current.get(source)
            new = _current[source] = _Snapshot(path, key, leases=1)
            if old is not None:
                old.replaced = True
                if old.leases == 0:
                    _unlink(old.path)
        return new


def _release(snap: _Snapshot) -> None:
    with _lock:
        snap.leases -= 1
        if snap.replaced and snap.leases == 0:
            _unlink(snap.path)


def _copy(cur: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Every table and view ``cur`` sees, in its open transaction, into a new file ``path``."""
    tables = cur.execute(
        "SELECT table_name, sql FROM duckdb_tables() WHERE database_name = current_database() "
        "AND NOT temporary ORDER BY table_name").fetchall()
    views = cur.execute(
        "SELECT sql FROM duckdb_views() WHERE database_name = current_database() "
        "AND NOT internal AND NOT temporary ORDER BY view_oid").fetchall()
    with duckdb.connect(str(path), config=dict(BUILD_CONFIG)) as out:
        for name, ddl in tables:
            out.execute(ddl)
            quoted = '"' + name.replace('"', '""') + '"'
            reader = cur.execute(f"SELECT * FROM {quoted}").to_arrow_reader(BATCH_ROWS)
            out.register("_console_batch", reader)
            try:
                out.execute(f"INSERT INTO {quoted} SELECT * FROM _console_batch")
            finally:
                out.unregister("_console_batch")
        for (ddl,) in views:
            out.execute(ddl)
        out.execute("CHECKPOINT")


def _unlink(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".wal")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
