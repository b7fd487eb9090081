"""The Spark job of a file import: tasks read parts of files (``jobs.import_plan``), and the
driver gets their rows back packed, in bounded pieces.

Each task reads its parts in order through the formats' shared line reader
(``formats.read_part``) and yields, per ``BATCH_ROWS`` rows, one Spark row holding them as a
zstd-compressed Arrow IPC stream; after each part, a row naming the part with the size and
SHA-256 of the bytes it read (and, for a part that hands its parser on to the part after
it, that parser pickled: ``formats.lines``). A task's result is therefore about the
compressed size of one part's rows (or of a few small files'), never a whole large file's.

Tasks receive only plain values (paths, offsets, option strings); a part of a file shipped to
the executors (``local_files.ship``) is read from the executor's copy, its rows still naming the
driver's path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

IMPORT_DDL = "arrow BINARY, rows INT, part STRING"
BATCH_ROWS = 4096  # record rows per packed Spark row

# One part as a task receives it: path, start, end, first line number, shipped name or None,
# the file its rows name (a decompressed copy's ``.gz`` file; else the path), the pickled
# parser the part before it left (or None), and whether it is its file's last part.
PartSpec = tuple[str, int, int, int, "str | None", str, "bytes | None", bool]


def parts_frame(spark, fmt: str, tasks: list[list[PartSpec]], options: dict[str, str]):
    """A DataFrame (``IMPORT_DDL``) of one task per entry of ``tasks``."""
    options = dict(options)

    def read(batches):
        for batch in batches:
            for index in batch.column(0).to_pylist():
                yield from read_task(fmt, tasks[index], options)

    return spark.range(0, len(tasks), 1, len(tasks)).mapInArrow(read, IMPORT_DDL)


def read_task(fmt: str, parts: list[PartSpec], options: dict[str, str]) -> Iterator[Any]:
    """On an executor: the packed rows of ``parts``, each part followed by its marker."""
    from spark_backend import formats
    from spark_backend.model.records import batched, to_arrow_batch
    from spark_backend.spark.local_files import executor_path

    left: dict[tuple[str, int], bytes] = {}  # (path, end) -> parser, for a part in this task
    for path, start, end, first_line, shipped, origin, state, last in parts:
        seen: dict[str, Any] = {}
        with executor_path(path, shipped) as local:
            rows = formats.read_part(fmt, local, options, start, end, first_line,
                                     origin=origin, seen=seen,
                                     state=state or left.pop((path, start), None), last=last)
            for chunk in batched(rows, BATCH_ROWS):
                yield _packed(to_arrow_batch(chunk))
        if seen.get("state") is not None:
            left[(path, end)] = seen["state"]
        yield _marker({"path": path, "start": start, "bytes": seen.get("bytes"),
                       "sha256": seen.get("sha256")}, seen.get("state"))


def _packed(batch) -> Any:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=pa.Codec("zstd", 1))
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return pa.RecordBatch.from_arrays(
        [pa.array([sink.getvalue().to_pybytes()], pa.binary()),
         pa.array([batch.num_rows], pa.int32()), pa.array([None], pa.string())],
        names=["arrow", "rows", "part"])


def _marker(part: dict[str, Any], state: bytes | None = None) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([state], pa.binary()), pa.array([0], pa.int32()),
         pa.array([json.dumps(part)], pa.string())], names=["arrow", "rows", "part"])


def unpacked(batches: Iterable[Any]) -> Iterator[Any]:
    """On the driver: the record batches of packed rows, and each part's marker as a dict
    (path, start, bytes, sha256, and ``state``: the parser it hands on, or None)."""
    import pyarrow as pa

    for batch in batches:
        arrows = batch.column("arrow")
        parts = batch.column("part").to_pylist()
        for i, part in enumerate(parts):
            if part is not None:
                yield {**json.loads(part), "state": arrows[i].as_py()}
                continue
            with pa.ipc.open_stream(pa.BufferReader(arrows[i].as_buffer())) as reader:
                yield from reader
