"""PySpark Python data sources (Spark 4 API).

- ``SpannerChangeStreamDataSource`` (``spanner_change_stream``): one input partition per change
  stream partition; each yields Arrow batches of ``records.RECORD_FIELDS`` rows.
- ``ChangeFilesDataSource`` (``change_files``): one input partition per file of a supported
  format; each yields the format's rows (bad input as ``kind='bad'`` rows).

Reader state must pickle: only option strings and plain values; clients are opened and heavy
libraries imported inside ``read()``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from spark_backend.model.records import SPARK_DDL

BATCH_ROWS = 4096


@dataclass
class ChangeStreamPartition(InputPartition):
    """A group of change stream partitions (token, start_ns) that one task reads."""

    index: int
    parts: list[tuple[str, int]]


@dataclass
class FilePartition(InputPartition):
    index: int
    path: str


def _require(options: dict, name: str) -> str:
    value = options.get(name)
    if value is None or value == "":
        raise ValueError(f"Option {name!r} is required.")
    return value


class SpannerChangeStreamDataSource(DataSource):
    """Options: project, instance, database, dialect, host (optional), stream, heartbeat_ms,
    end_ns, partitions (JSON list of {"token", "start_ns"}), max_attempts, tasks (how many
    input partitions; default one per change stream partition), threads (partitions a task
    reads at the same time, default 8), follow_children ("true": a task goes on with the
    children it can read itself), coord_dir (a folder all tasks see, to hand merge children
    to each other), progress_dir (where tasks note their progress for the driver)."""

    @classmethod
    def name(cls) -> str:
        return "spanner_change_stream"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> SpannerChangeStreamDataSourceReader:
        return SpannerChangeStreamDataSourceReader(self.options)


class SpannerChangeStreamDataSourceReader(DataSourceReader):
    def __init__(self, options: dict):
        from spark_backend.spanner.connect import SpannerTarget, validate_dialect
        from spark_backend.spanner.reader import (
            validate_heartbeat,
            validate_stream_name,
        )

        self.project = _require(options, "project")
        self.instance = _require(options, "instance")
        self.database = _require(options, "database")
        self.dialect = validate_dialect(options.get("dialect", "googlesql"))
        self.host = options.get("host") or None
        self.stream = validate_stream_name(_require(options, "stream"))
        self.heartbeat_ms = validate_heartbeat(int(_require(options, "heartbeat_ms")))
        self.end_ns = int(_require(options, "end_ns"))
        self.max_attempts = int(options.get("max_attempts", "6"))
        try:
            parts = json.loads(_require(options, "partitions"))
            self.parts = [(p["token"], int(p["start_ns"])) for p in parts]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                'Option "partitions" must be a JSON list of {"token": ..., "start_ns": ...}.'
            ) from e
        self.tasks = int(options.get("tasks", "0")) or len(self.parts)
        self.threads = int(options.get("threads", "8"))
        self.follow = options.get("follow_children", "true").lower() == "true"
        self.progress_dir = options.get("progress_dir") or None
        self.coord_dir = options.get("coord_dir") or None
        if self.tasks < 1 or self.threads < 1:
            raise ValueError('Options "tasks" and "threads" must be positive integers.')
        SpannerTarget(self.project, self.instance, self.database, self.dialect, self.host)

    def partitions(self) -> list[ChangeStreamPartition]:
        groups: list[list[tuple[str, int]]] = [[] for _ in range(min(self.tasks, len(self.parts)))]
        for i, part in enumerate(self.parts):
            groups[i % len(groups)].append(part)
        return [ChangeStreamPartition(i, g) for i, g in enumerate(groups)]

    def read(self, partition: ChangeStreamPartition):
        from spark_backend.model import config
        from spark_backend.model.records import batched, to_arrow_batch
        from spark_backend.spanner.connect import SpannerTarget, open_database
        from spark_backend.spanner.workflow import read_partitions

        config.quiet_local_client_env()
        target = SpannerTarget(self.project, self.instance, self.database, self.dialect, self.host)
        database = open_database(target)
        rows = read_partitions(
            database, self.dialect, self.stream, [tuple(p) for p in partition.parts],
            self.end_ns, self.heartbeat_ms, threads=self.threads,
            follow_children=self.follow, max_attempts=self.max_attempts,
            coord_dir=self.coord_dir,
        )
        counted = _count_progress(rows, self.progress_dir, partition.index)
        for batch in batched(counted, BATCH_ROWS):
            yield to_arrow_batch(batch)


def _count_progress(rows, progress_dir: str | None, index: int):
    """Pass rows through; about once a second note how far this task is in a small file the
    driver reads to show live progress (local masters only: a cluster has no shared folder)."""
    if not progress_dir:
        yield from rows
        return
    import os
    import time

    path = os.path.join(progress_dir, f"task-{index}.json")
    records = partitions = 0
    last = 0.0

    def note():
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump({"records": records, "partitions": partitions}, f)
        os.replace(tmp, path)

    for row in rows:
        if row["kind"] == "partition_end":
            partitions += 1
        else:
            records += 1
        now = time.monotonic()
        if now - last > 1.0:
            note()
            last = now
        yield row
    note()


class ChangeFilesDataSource(DataSource):
    """Options: format, paths (JSON list of files), table (optional)."""

    @classmethod
    def name(cls) -> str:
        return "change_files"

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> ChangeFilesDataSourceReader:
        return ChangeFilesDataSourceReader(self.options)


class ChangeFilesDataSourceReader(DataSourceReader):
    def __init__(self, options: dict):
        from spark_backend import formats

        self.format = _require(options, "format")
        formats.get(self.format)  # validates the name, listing the accepted ones
        self.paths = json.loads(_require(options, "paths"))
        self.format_options = {k: v for k, v in options.items() if k not in ("format", "paths")}

    def partitions(self) -> list[FilePartition]:
        return [FilePartition(i, p) for i, p in enumerate(self.paths)]

    def read(self, partition: FilePartition):
        from spark_backend import formats
        from spark_backend.model.records import bad_row, batched, to_arrow_batch

        module = formats.get(self.format)

        def rows():
            try:
                yield from module.parse_file(partition.path, dict(self.format_options))
            except (OSError, UnicodeError, ValueError) as e:
                yield bad_row(partition.path, None, "", f"cannot read the file: {e}")

        for batch in batched(rows(), BATCH_ROWS):
            yield to_arrow_batch(batch)
