"""PySpark Python data sources (Spark 4 API).

- ``SpannerChangeStreamDataSource`` (``spanner_change_stream``): one input partition per change
  stream partition; each yields Arrow batches of ``records.RECORD_FIELDS`` rows.
- ``ChangeFilesDataSource`` (``change_files``): one input partition per file of a supported
  format; each yields the format's rows (bad input as ``kind='bad'`` rows).
- ``change_stream_frame``: the first source's rows through ``mapInArrow``, packed (what a pull
  runs; ``packing`` holds the packed rows' format); ``change_files_frame``: the second's, as
  they are (what an import runs).

Reader state must pickle: only option strings and plain values; clients are opened and heavy
libraries imported inside ``read()``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from spark_backend.model.records import SPARK_DDL
from spark_backend.spark.packing import PACKED_DDL, packed

BATCH_ROWS = 4096  # rows of an imported file per Arrow batch
# Records of a change stream read per Arrow batch (a packed row of a pull's job, see
# ``change_stream_frame``): a task holds the rows of the batch it is filling as Python values
# until it converts and packs them: 2,048 keeps the Python workers' peak lower than 4,096 at the
# same speed, and smaller gives nothing more (benchmarks/MEMORY.md).
STREAM_BATCH_ROWS = 2048


@dataclass
class ChangeStreamPartition(InputPartition):
    """A group of change stream partitions (token, start_ns) that one task reads."""

    index: int
    parts: list[tuple[str, int, int]]  # token, start, its rows read before in this pull
    initial: list[dict] = field(default_factory=list)  # the initial query's rows, to pass on
    end_ns: int | None = None  # where to read to; None: the reader's end_ns


@dataclass
class FilePartition(InputPartition):
    index: int
    path: str                 # the file on the driver's machine (rows name it as their origin)
    shipped: str | None = None  # the name Spark distributed it under (local_files.ship)


def _require(options: dict, name: str) -> str:
    value = options.get(name)
    if value is None or value == "":
        raise ValueError(f"Option {name!r} is required.")
    return value


class SpannerChangeStreamDataSource(DataSource):
    """A change stream's records between two times, one row per record (``SPARK_DDL``).

    A whole range (what a user asks for): project, instance, database, host (optional: a
    local endpoint such as the emulator), stream, start and end (RFC 3339 times; end
    inclusive), heartbeat_ms (default 10000), dialect (default: the database's own), tasks
    (how many input partitions the first partitions are dealt over; default one each). The
    initial query runs while Spark plans the read; every task follows its partitions'
    children, and a merge child is read by the task of its first parent (``workflow``). A
    MUTABLE_KEY_RANGE stream is read in one task (see ``range_partitions``).

    What a pull asks for (no start): end_ns, partitions (JSON list of {"token", "start_ns"}),
    groups (instead of partitions and tasks: a JSON list of such lists, one per task, in task
    order), max_attempts, tasks (how many input partitions; default one per change stream
    partition), threads (partitions a task reads at the same time, default 8),
    follow_children ("true": a task goes on with the children it can read itself), finished
    (JSON list of partition tokens finished before these tasks began: with follow_children, a
    task that finishes the last unfinished parent of a merge reads the merge child itself),
    max_rows (a task stops its reads at the next timestamp after this many rows, leaving them
    ``open`` for the next task: bounds what a task hands to the driver), max_seconds (the same
    after this many seconds), task_markers ("true": each task ends with a ``partition_end``
    row without a partition, naming the task's index, so the driver knows it has all of a
    task's rows), warm_up (N: N tasks that only import the reader; no rows).

    Nothing is written anywhere: rows (and each partition's end row, the progress) travel to
    the driver as the job's results."""

    @classmethod
    def name(cls) -> str:
        return "spanner_change_stream"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> SpannerChangeStreamDataSourceReader:
        return SpannerChangeStreamDataSourceReader(self.options)

    def streamReader(self, schema) -> SpannerChangeStreamStreamReader:
        return SpannerChangeStreamStreamReader(self.options)


def _part(p: dict) -> tuple[str, int, int]:
    """(token, start, rows read of it before in this pull) of an option's partition."""
    arrival = int(p.get("arrival", 0))
    if arrival < 0:
        raise ValueError(f"arrival {arrival} < 0")
    return p["token"], int(p["start_ns"]), arrival


class SpannerChangeStreamDataSourceReader(DataSourceReader):
    def __init__(self, options: dict, streaming: bool = False):
        """``streaming``: the options of a ``readStream`` (``end`` optional)."""
        from spark_backend.spanner.connect import SpannerTarget, validate_dialect
        from spark_backend.spanner.reader import (
            validate_heartbeat,
            validate_stream_name,
        )

        self.project = _require(options, "project")
        self.instance = _require(options, "instance")
        self.database = _require(options, "database")
        dialect = options.get("dialect") or None
        self.dialect = validate_dialect(dialect) if dialect is not None else None
        self.host = options.get("host") or None
        self.stream = validate_stream_name(_require(options, "stream"))
        self.heartbeat_ms = validate_heartbeat(_integer(options, "heartbeat_ms", "10000"))
        self.max_attempts = _integer(options, "max_attempts", "6")
        self.start_ns: int | None = None  # set: a whole range, from the initial query
        self.groups: list[list[tuple[str, int, int]]] | None = None
        self.parts: list[tuple[str, int, int]] = []
        if options.get("partitions") or options.get("groups"):
            self.end_ns = int(_require(options, "end_ns"))
            self.groups, self.parts = _given_parts(options)
        else:
            self.start_ns, self.end_ns = _range(options, need_end=not streaming)
        self.finished = _finished(options)
        # 0 with a whole range: one task per partition the initial query names
        self.tasks = _integer(options, "tasks", "0") or (
            len(self.parts) if self.start_ns is None else 0)
        self.threads = _integer(options, "threads", "8")
        self.follow = options.get("follow_children", "true").lower() == "true"
        self.max_rows = int(options.get("max_rows", "0")) or None
        self.max_seconds = float(options.get("max_seconds", "0")) or None
        self.warm_up = int(options.get("warm_up", "0"))
        self.task_markers = options.get("task_markers", "false").lower() == "true"
        if self.tasks < 0 or self.threads < 1:
            raise ValueError('Options "tasks" and "threads" must be positive integers.')
        SpannerTarget(self.project, self.instance, self.database, self.dialect, self.host)

    def partitions(self) -> list[ChangeStreamPartition]:
        if self.warm_up:
            return [ChangeStreamPartition(i, []) for i in range(self.warm_up)]
        if self.groups is not None:
            return [ChangeStreamPartition(i, g) for i, g in enumerate(self.groups)]
        if self.start_ns is not None:
            return self.range_partitions(self.start_ns, self.end_ns, initial_rows=True)
        return self._dealt(self.parts, self.tasks, [], None)

    def range_partitions(self, start_ns: int, end_ns: int,
                         initial_rows: bool) -> list[ChangeStreamPartition]:
        """The input partitions reading every record from ``start_ns`` to ``end_ns``: the
        partitions the initial query at ``start_ns`` names, dealt over ``tasks`` (one each by
        default); with ``initial_rows`` the first passes on the initial query's rows."""
        rows, parts = self._initial_query(start_ns, end_ns)
        tasks = self.tasks or len(parts)
        if any(r["kind"] == "partition_start" for r in rows):
            # MUTABLE_KEY_RANGE: a new partition is announced by every partition it takes keys
            # from, each naming only itself as the parent, so tasks could not tell which of
            # them reads it: one task reads the whole range (``threads`` at a time), once.
            tasks = 1
        return self._dealt(parts, tasks, rows if initial_rows else [], end_ns)

    @staticmethod
    def _dealt(parts: list[tuple[str, int, int]], tasks: int, initial: list[dict],
               end_ns: int | None) -> list[ChangeStreamPartition]:
        n = max(1, min(tasks, len(parts)))
        groups: list[list[tuple[str, int, int]]] = [[] for _ in range(n)]
        for i, part in enumerate(parts):
            groups[i % len(groups)].append(part)
        return [ChangeStreamPartition(i, g, initial if i == 0 else [], end_ns)
                for i, g in enumerate(groups)]

    def _initial_query(self, start_ns: int, end_ns: int
                       ) -> tuple[list[dict], list[tuple[str, int, int]]]:
        """The NULL-token query from ``start_ns``: its rows, and the partitions it names."""
        from spark_backend.spanner.connect import SpannerTarget, open_database
        from spark_backend.spanner.reader import initial_query_rows

        target = SpannerTarget(self.project, self.instance, self.database, self.dialect,
                               self.host)
        rows = initial_query_rows(open_database(target), self.dialect, self.stream, start_ns,
                                  end_ns, self.heartbeat_ms, max_attempts=self.max_attempts)
        named = {(child["token"], r["ts_ns"]) for r in rows
                 if r["kind"] in ("child_partitions", "partition_start")
                 for child in json.loads(r["child_partitions"])}
        return rows, [(token, start, 0) for token, start in sorted(named)]

    def read(self, partition: ChangeStreamPartition):
        from spark_backend.model import config
        from spark_backend.model.records import batched, partition_end, to_arrow_batch
        from spark_backend.spanner.connect import SpannerTarget, open_database
        from spark_backend.spanner.workflow import read_partitions

        config.quiet_local_client_env()
        if self.warm_up:  # importing what a read needs is the work
            import google.cloud.spanner_v1.streamed  # noqa: F401
            import pyarrow  # noqa: F401
            return
        if partition.initial:
            yield to_arrow_batch(partition.initial)
        if not partition.parts:
            return
        target = SpannerTarget(self.project, self.instance, self.database, self.dialect, self.host)
        database = open_database(target)
        rows = read_partitions(
            database, self.dialect, self.stream, [tuple(p) for p in partition.parts],
            partition.end_ns or self.end_ns, self.heartbeat_ms, threads=self.threads,
            follow_children=self.follow, finished=self.finished,
            max_attempts=self.max_attempts, appoint_merges=self.start_ns is not None,
            max_rows=self.max_rows, max_seconds=self.max_seconds,
        )
        for batch in batched(rows, STREAM_BATCH_ROWS):
            yield to_arrow_batch(batch)
        if self.task_markers:  # the driver lands a task's rows once it saw all of them
            yield to_arrow_batch([partition_end(None, "task_done", None, task=partition.index)])


class SpannerChangeStreamStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("spanner_change_stream")``: the batch source's options with
    ``end`` optional (the stream stops growing there), ``lag_ms`` (how far behind the clock
    a batch ends, default 10000: a query's records are final once its end has passed) and
    ``max_batch_seconds`` (the most of the stream's time one batch covers; default no limit).

    An offset is ``{"read_to_ns": T}``: every record committed at or before T was given. The
    partitions alive just after T (the frontier) are what the initial query at T + 1 names,
    so a batch from T to U reads those partitions and their children from T + 1 to U, each in
    one task, and the next batch starts from U + 1: every record in exactly one batch. Batches
    are replayed from Spark's checkpoint as they were planned (the same times, hence the same
    partitions and records)."""

    def __init__(self, options: dict):
        self.reader = SpannerChangeStreamDataSourceReader(options, streaming=True)
        self.lag_ns = _integer(options, "lag_ms", "10000") * 10**6
        self.batch_ns = _integer(options, "max_batch_seconds", "0") * 10**9
        if self.lag_ns < 0 or self.batch_ns < 0:
            raise ValueError('Options "lag_ms" and "max_batch_seconds" must not be negative.')

    def initialOffset(self) -> dict:
        return {"read_to_ns": self.reader.start_ns - 1}

    def latestOffset(self, start: dict, limit) -> dict:
        done = int(start["read_to_ns"])
        upto = time.time_ns() - self.lag_ns
        if self.reader.end_ns is not None:
            upto = min(upto, self.reader.end_ns)
        if self.batch_ns:
            upto = min(upto, done + self.batch_ns)
        return {"read_to_ns": max(done, upto)}

    def partitions(self, start: dict, end: dict) -> list[ChangeStreamPartition]:
        first, last = int(start["read_to_ns"]) + 1, int(end["read_to_ns"])
        if last < first:
            return []
        return self.reader.range_partitions(first, last,
                                            initial_rows=first == self.reader.start_ns)

    def read(self, partition: ChangeStreamPartition):
        return self.reader.read(partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the source keeps no state between batches."""


def _given_parts(options: dict) -> tuple[list | None, list[tuple[str, int, int]]]:
    """(groups, partitions) of the ``groups`` or ``partitions`` option."""
    try:
        if options.get("groups"):
            groups = [[_part(p) for p in group] for group in json.loads(options["groups"])]
            return groups, [p for group in groups for p in group]
        return None, [_part(p) for p in json.loads(_require(options, "partitions"))]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            'Option "partitions" must be a JSON list of {"token": ..., "start_ns": ...} '
            '(optionally "arrival": the rows of it read before in this pull) and "groups" '
            'a JSON list of such lists.'
        ) from e


def _finished(options: dict) -> list[str]:
    try:
        finished = json.loads(options.get("finished") or "[]")
        if not isinstance(finished, list) or not all(isinstance(t, str) for t in finished):
            raise TypeError
    except (ValueError, TypeError) as e:
        raise ValueError('Option "finished" must be a JSON list of partition tokens.') from e
    return finished


def _integer(options: dict, name: str, default: str) -> int:
    text = options.get(name) or default
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"Option {name!r} must be an integer, not {text!r}.") from None


def _range(options: dict, need_end: bool = True) -> tuple[int, int | None]:
    """(start, end) in nanoseconds of the ``start`` and ``end`` options (RFC 3339); end None
    when it is not needed and not given."""
    from spark_backend.model.timestamps import TimestampError, parse_ns

    times: list[int | None] = []
    for name in ("start", "end"):
        if name == "end" and not need_end and not options.get("end"):
            return times[0], None
        text = _require(options, name)
        try:
            times.append(parse_ns(text))
        except TimestampError as e:
            raise ValueError(f"Option {name!r} is not a time ({e}); use RFC 3339, e.g. "
                             "2026-01-05T09:00:00Z.") from None
    if times[1] < times[0]:
        raise ValueError(f"Option 'end' ({options['end']}) is before 'start' "
                         f"({options['start']}).")
    return times[0], times[1]


def change_stream_frame(spark, options: dict):
    """The rows the ``spanner_change_stream`` source gives for ``options``, read by
    ``mapInArrow`` over one row per input partition instead: the same reader, the same
    tasks and rows, without Spark's Python data-source planning. A read through the data
    source asks three more Python processes (looking up, creating and planning the source)
    for every job and keeps them running, with a daemon each: ~240 MB after warm-up.
    The options are checked here, on the driver, as the data source checks them.

    The rows travel PACKED: each Spark row (``PACKED_DDL``) holds one compressed Arrow IPC
    stream of up to ``STREAM_BATCH_ROWS`` record rows, its repeated columns dictionary-encoded,
    with what the driver's planning needs of them beside it (``packing.packed``); with
    ``task_markers``, a task's last row has no records and names the task (``task``).
    ``packing.packed_rows`` gives the driver the rows as ``Packed`` and ``packing.unpacked``
    the record batches. Spark moves a few opaque values per task instead of converting every
    record from Arrow to its rows and back (in a 100k-record pull the JVM spent ~80 µs of CPU
    per record on that, and a task's results reached the driver ~0.5 s after its last row),
    the task results it holds are the compressed bytes, and so are those the driver holds
    until they land."""
    reader = SpannerChangeStreamDataSourceReader(options)
    parts = reader.partitions()
    markers, reader.task_markers = reader.task_markers, False

    def read(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                for records in reader.read(parts[index]):
                    yield packed(records)
                if markers:  # the driver lands a task's rows once it saw all of them
                    yield packed(None, task=index)

    return spark.range(0, len(parts), 1, len(parts)).mapInArrow(read, PACKED_DDL)


class ChangeFilesDataSource(DataSource):
    """Options: format, paths (JSON list of files on the driver's machine), shipped (JSON
    {path: name} of the files distributed with ``local_files.ship``; a path not in it is read
    in place), table (optional) and the format's own options."""

    @classmethod
    def name(cls) -> str:
        return "change_files"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> ChangeFilesDataSourceReader:
        return ChangeFilesDataSourceReader(self.options)


_READER_OPTIONS = ("format", "paths", "shipped")


class ChangeFilesDataSourceReader(DataSourceReader):
    def __init__(self, options: dict):
        from spark_backend import formats

        self.format = _require(options, "format")
        formats.get(self.format)  # validates the name, listing the accepted ones
        self.paths = json.loads(_require(options, "paths"))
        self.shipped = json.loads(options.get("shipped") or "{}")
        self.format_options = {k: v for k, v in options.items() if k not in _READER_OPTIONS}

    def partitions(self) -> list[FilePartition]:
        return [FilePartition(i, p, self.shipped.get(p)) for i, p in enumerate(self.paths)]

    def read(self, partition: FilePartition):
        """The file's rows (``formats.read_file``): any failure of the file becomes one bad
        row naming it and why; the rows read before it are kept, other files land. A shipped
        file is read from the executor's copy; its rows still name the driver's path."""
        from spark_backend import formats
        from spark_backend.model.records import batched, to_arrow_batch
        from spark_backend.spark.local_files import executor_path

        with executor_path(partition.path, partition.shipped) as local:
            rows = formats.read_file(self.format, local, dict(self.format_options))
            if local != partition.path:
                rows = _renamed(rows, local, partition.path)
            for batch in batched(rows, BATCH_ROWS):
                yield to_arrow_batch(batch)


def change_files_frame(spark, options: dict):
    """The rows the ``change_files`` source gives for ``options``, read by ``mapInArrow`` over
    one row per file instead: the same reader, tasks and rows, without Spark's Python
    data-source planning (``change_stream_frame`` says what that costs; it weighs most on the
    first import of a new session, benchmarks/RESULTS.md "File imports"). The options are
    checked here, on the driver, as the source checks them."""
    reader = ChangeFilesDataSourceReader(options)
    parts = reader.partitions()

    def read(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from reader.read(parts[index])

    return spark.range(0, len(parts), 1, len(parts)).mapInArrow(read, SPARK_DDL)


def _renamed(rows, local: str, path: str):
    """Rows read from ``local`` as if read from ``path`` (origin, and reasons naming it)."""
    from spark_backend.model.records import canonical_json

    quoted_local, quoted_path = canonical_json(local)[1:-1], canonical_json(path)[1:-1]
    for row in rows:
        if row.get("origin") == local:
            row["origin"] = path
        if row.get("kind") == "bad" and quoted_local in (row.get("extra") or ""):
            row["extra"] = row["extra"].replace(quoted_local, quoted_path)
        yield row
