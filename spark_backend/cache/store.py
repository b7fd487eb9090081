"""The DuckDB cache file: opening it, registering streams and pulls, ingesting record rows.

Thread safety: one ``Cache`` per thread (DuckDB connections are not shared across threads);
``Cache.cursor()`` gives a thread its own connection to the same file.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from spark_backend.cache.schema import DDL, SCHEMA_VERSION
from spark_backend.model.config import DEFAULT_MEMORY_LIMIT, MEMORY_ENVVAR
from spark_backend.model.errors import BadInput, CacheError

_STREAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


def validate_cache_stream_name(name: str) -> str:
    if not isinstance(name, str) or not _STREAM_NAME.match(name):
        raise CacheError(
            f"{name!r} is not a valid stream name; use letters, digits, '_', '.', '-' "
            "(starting with a letter or '_', at most 128 characters)"
        )
    return name


def _memory_limit() -> str:
    value = os.environ.get(MEMORY_ENVVAR, DEFAULT_MEMORY_LIMIT)
    if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|KiB|MiB|GiB)", value, re.IGNORECASE):
        raise CacheError(f"{MEMORY_ENVVAR}={value!r} is not a size; use e.g. 2GB or 512MB.")
    return value


@dataclass
class IngestStats:
    data_change: int = 0
    heartbeats: int = 0
    child_partitions: int = 0
    duplicates: int = 0
    bad: int = 0
    partitions_ended: int = 0


class Cache:
    """One DuckDB cache file."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        elif not self.path.exists():
            raise CacheError(f"No cache file at {self.path}; pull or import something first.")
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.IOException as e:
            first = str(e).splitlines()[0]
            if "not a valid DuckDB database file" in first:
                raise CacheError(
                    f"{self.path} is not a DuckDB cache file; give --cache a new file or a "
                    "cache made by this tool."
                ) from e
            raise CacheError(
                f"Cannot open the cache {self.path}: {first} (is another process using it?)"
            ) from e
        except duckdb.ConnectionException as e:
            raise CacheError(
                f"Cannot open the cache {self.path} again with other settings in this process "
                f"({str(e).splitlines()[0]}); use the connection that is already open."
            ) from e
        except duckdb.Error as e:
            raise CacheError(f"{self.path} is not a DuckDB cache file ({e}).") from e
        self.read_only = read_only
        # Bounded memory: big ingests and queries spill to a temp folder beside the file.
        self.con.execute(f"SET memory_limit = '{_memory_limit()}'")
        if not read_only:
            self._create()

    def _create(self) -> None:
        for stmt in DDL:
            self.con.execute(stmt)
        self.con.execute(
            "INSERT INTO meta VALUES ('schema_version', ?), ('version', '0') "
            "ON CONFLICT DO NOTHING",
            [str(SCHEMA_VERSION)],
        )

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
        pull_id = self.con.execute("SELECT nextval('pull_ids')").fetchone()[0]
        self.con.execute(
            "INSERT INTO pulls (pull_id, stream, source, range_start, range_end, heartbeat_ms, "
            "started_at, status) VALUES (?, ?, ?, make_timestamp_ns(?), make_timestamp_ns(?), ?, "
            "current_timestamp, 'running')",
            [pull_id, stream, source, start_ns, end_ns, heartbeat_ms],
        )
        return int(pull_id)

    def finish_pull(
        self, pull_id: int, status: str, *, error: str | None = None,
        failed_partition: str | None = None, waves: int | None = None,
    ) -> None:
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
            if isinstance(batch, str | Path):
                con.read_parquet(str(batch)).create_view("b")
            else:
                con.register("b", batch)
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
                    self.con, stream, pull_id, chunk,
                    count_existing_as_duplicates=count_existing_as_duplicates,
                )
                for name in vars(stats):
                    setattr(stats, name, getattr(stats, name) + getattr(part, name))
            end_ingest(self.con)
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

    def close_running_pulls(self, stream: str) -> None:
        """Pulls of ``stream`` still marked running were cut off: mark them interrupted."""
        self.con.execute(
            "UPDATE pulls SET status = 'interrupted' WHERE stream = ? AND status = 'running'",
            [stream],
        )

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
