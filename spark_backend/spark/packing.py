"""Task results as they travel from a Spark task to the driver, and wait there to land.

Each packed row (``PACKED_DDL``) holds one compressed Arrow IPC stream of record rows
(:func:`packed`) with what the driver's planning needs of them beside it; the driver keeps the
rows compressed (:class:`Packed`) until they land. No pyspark here: the driver's modules import
this without starting anything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

PACKED_DDL = "arrow BINARY, rows INT, records INT, task INT, plan STRING"

# The rows that count as records (progress), as against a partition's start and end rows.
RECORD_KINDS = ("data_change", "heartbeat", "child_partitions")


# The columns whose values repeat from record to record within a task's batch: a partition's
# token and a table's column types (JSON) on every record of them, a
# transaction's tag and sequence numbers on each of its records, a few names. Dictionary-encoded,
# each distinct value travels once, in less than half the bytes (``benchmarks/packed_results.py``;
# figures in benchmarks/RESULTS.md).
# DuckDB reads the encoded columns as their values; ``pyarrow.compute`` and ``to_pylist`` too.
DICTIONARY_COLUMNS = ("partition_token", "record_sequence", "table_name", "value_capture_type",
                      "column_types", "mod_type", "transaction_tag")
# zstd at level 1: about half LZ4's bytes for a little more packing time; Spark's JVM holds the
# packed bytes of the tasks it has not handed over yet, and the driver those it has not landed
# yet (figures in benchmarks/RESULTS.md).
PACKED_CODEC = ("zstd", 1)


def packed(batch, encoded=DICTIONARY_COLUMNS, codec=PACKED_CODEC, *, task: int | None = None):
    """A one-row Arrow batch (``PACKED_DDL``) holding ``batch`` (or no records: None) as an
    IPC stream compressed with ``codec`` (name, level), its ``encoded`` columns
    dictionary-encoded; beside it its rows, its records (``RECORD_KINDS``), ``task`` (the
    index of the task this row ends) and, as JSON, the partition ends and announced children
    in it (:func:`ends_and_children`), null when there are none."""
    import pyarrow as pa

    arrow, rows, records, plan = pa.array([None], pa.binary()), 0, 0, None
    if batch is not None:
        ends, children = ends_and_children([batch])
        plan = json.dumps([ends, children]) if ends or children else None
        rows = batch.num_rows
        records = record_rows(batch)
        columns = [column.dictionary_encode() if name in encoded else column
                   for name, column in zip(batch.schema.names, batch.columns, strict=True)]
        batch = pa.RecordBatch.from_arrays(columns, batch.schema.names)
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=pa.Codec(*codec))
        with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
            writer.write_batch(batch)
        data = sink.getvalue()
        offsets = pa.array([0, data.size], pa.int32()).buffers()[1]
        arrow = pa.Array.from_buffers(pa.binary(), 1, [None, offsets, data])  # not copied
    return pa.RecordBatch.from_arrays(
        [arrow, pa.array([rows], pa.int32()), pa.array([records], pa.int32()),
         pa.array([task], pa.int32()), pa.array([plan], pa.string())],
        ["arrow", "rows", "records", "task", "plan"])


@dataclass
class Packed:
    """One packed row as the driver holds it until it lands: the records still compressed
    (``data``, None for a task's end), and what the driver's planning needs of them."""

    data: object | None          # a pyarrow Buffer: one IPC stream
    rows: int
    records: int
    task: int | None             # the task this row ends
    ends: list[tuple]            # (token, state, stopped for the budget, read to, rows read)
    children: list[tuple]        # (child, parents, start)

    def batches(self):
        """The record batches (``DICTIONARY_COLUMNS`` still encoded), decoded now."""
        import pyarrow as pa

        if self.data is not None:
            yield from pa.ipc.open_stream(self.data)


def packed_rows(batches):
    """The :class:`Packed` rows of the packed Arrow ``batches`` (``PACKED_DDL``); each
    keeps its bytes where they arrived (no copy)."""
    for batch in batches:
        data = batch.column("arrow")
        columns = batch.select(["rows", "records", "task", "plan"]).to_pydict()
        for i in range(batch.num_rows):
            plan = columns["plan"][i]
            ends, children = json.loads(plan) if plan else ([], [])
            yield Packed(data[i].as_buffer() if data[i].is_valid else None,
                         columns["rows"][i] or 0, columns["records"][i] or 0,
                         columns["task"][i], [tuple(e) for e in ends],
                         [tuple(c) for c in children])


def unpacked(batches):
    """The record batches inside the packed rows of ``batches`` (see :func:`packed`): the
    ``DICTIONARY_COLUMNS`` stay dictionary-encoded, each batch with its own dictionaries."""
    for row in packed_rows(batches):
        yield from row.batches()


def record_rows(batch) -> int:
    """The rows of an Arrow table or batch that are records (``RECORD_KINDS``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kinds = pa.array(RECORD_KINDS)
    return int(pc.sum(pc.is_in(batch.column("kind"), value_set=kinds)).as_py() or 0)


def ends_and_children(batches) -> tuple[list[tuple], list[tuple]]:
    """(token, state, stopped for the budget, read to, the partition's rows read so far in
    the pull when it stopped for the budget) of each partition end row and (child,
    parents, start) of each announced child, from Arrow batches of records (a task's end
    marker of the data source, a partition end without a partition, is left out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ends: list[tuple] = []
    children: list[tuple] = []
    for batch in batches:
        kinds = batch.column("kind")
        picked = batch.filter(pc.is_in(kinds, value_set=pa.array(
            ["partition_end", "child_partitions"])))
        for row in picked.select(["kind", "partition_token", "ts_ns", "extra",
                                  "child_partitions"]).to_pylist():
            if row["kind"] == "partition_end":
                if row["partition_token"] is None:
                    continue  # a task's own end marker
                detail = json.loads(row["extra"] or "{}")
                ends.append((row["partition_token"], detail.get("state"),
                             detail.get("stopped") == "budget", row["ts_ns"],
                             detail.get("arrival", 0)))
            else:
                for child in json.loads(row["child_partitions"] or "[]"):
                    parents = [t for t in child["parent_partition_tokens"] if t]
                    children.append((child["token"], parents or [row["partition_token"]],
                                     row["ts_ns"]))
    return ends, children
