"""The project's recording format (DESIGN.md): JSON Lines, one change record per line in the
PostgreSQL-dialect shape plus the partition it was read from.

Streams in the ``MUTABLE_KEY_RANGE`` partition mode record their ``ChangeStreamRecord``s in the
protobuf JSON mapping with the proto field names (``data_change_record`` with ``table`` and
``column_metadata``, ``heartbeat_record``, ``partition_start_record``, ``partition_end_record``,
``partition_event_record``), one per line with its partition. A line is read in the mode its
shape shows, so one file may hold either."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

from spark_backend.formats.lines import read_part
from spark_backend.model.records import RecordError, bad_row, from_change_record
from spark_backend.model.stream_records import STREAM_RECORD_KEYS, from_stream_record
from spark_backend.model.timestamps import format_ns

FORMAT = "recording"
SYSTEM = "spanner"
_RECORD_KEYS = ("data_change_record", "heartbeat_record", "child_partitions_record",
                "partition_start_record", "partition_end_record", "partition_event_record")
_MUTABLE_ONLY = ("partition_start_record", "partition_end_record", "partition_event_record")


def is_stream_record(obj: dict[str, Any]) -> bool:
    """A MUTABLE_KEY_RANGE ``ChangeStreamRecord`` line (as opposed to the doc's JSON shape)."""
    if any(k in obj for k in _MUTABLE_ONLY):
        return True
    dc = obj.get("data_change_record")
    return isinstance(dc, dict) and ("column_metadata" in dc or "table" in dc) and (
        "table_name" not in dc)


def to_row(obj: dict[str, Any], token: str | None) -> dict[str, Any]:
    """One recording line object -> one flat row, in the mode its shape shows."""
    if is_stream_record(obj):
        return from_stream_record({k: v for k, v in obj.items() if k in STREAM_RECORD_KEYS},
                                  token)
    return from_change_record(obj, token)


def splittable(head: bytes) -> bool:
    """Every recording line stands on its own: a file may be read in byte ranges."""
    return True


class Parser:
    """Recording lines -> rows (``formats.lines``); keeps no state from line to line."""

    def __init__(self, origin: str, options: dict[str, str] | None = None):
        self.origin = origin

    def line(self, number: int, text: str) -> Iterator[dict[str, Any]]:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            yield bad_row(self.origin, number, text, f"not JSON ({e.msg} at column {e.colno})")
            return
        if not isinstance(obj, dict) or not any(k in obj for k in _RECORD_KEYS):
            yield bad_row(
                self.origin, number, text,
                "not a recording line: expected an object with partition_token and one of "
                + ", ".join(_RECORD_KEYS),
            )
            return
        token = obj.get("partition_token")
        if token is not None and not isinstance(token, str):
            yield bad_row(self.origin, number, text, "partition_token must be a string or null")
            return
        try:
            row = to_row(obj, token)
        except RecordError as e:
            yield bad_row(self.origin, number, text, str(e))
            return
        row["origin"] = self.origin
        row["line"] = number
        yield row

    def finish(self) -> Iterator[dict[str, Any]]:
        return iter(())


def parse_file(path: str, options: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    return read_part(sys.modules[__name__], path, options)


# --- export ---------------------------------------------------------------------------------


def _json(text: str | None, default: Any) -> Any:
    return default if text is None else json.loads(text)


def data_change_line(row: dict[str, Any], mods: list[dict[str, Any]]) -> dict[str, Any]:
    """A cached data change record (with its mods) -> one recording line object."""
    return {
        "partition_token": row["partition_token"],
        "data_change_record": {
            "commit_timestamp": format_ns(row["commit_ns"]),
            "record_sequence": row["record_sequence"],
            "server_transaction_id": row["server_transaction_id"],
            "is_last_record_in_transaction_in_partition": row[
                "is_last_record_in_transaction_in_partition"
            ],
            "table_name": row["table_name"],
            "column_types": _json(row["column_types"], []),
            "mods": mods,
            "mod_type": row["mod_type"],
            "value_capture_type": row["value_capture_type"],
            "number_of_records_in_transaction": row["number_of_records_in_transaction"],
            "number_of_partitions_in_transaction": row["number_of_partitions_in_transaction"],
            "transaction_tag": row["transaction_tag"],
            "is_system_transaction": row["is_system_transaction"],
        },
    }


def heartbeat_line(token: str, ts_ns: int) -> dict[str, Any]:
    return {"partition_token": token, "heartbeat_record": {"timestamp": format_ns(ts_ns)}}


def child_partitions_line(
    token: str | None, start_ns: int, record_sequence: str | None, children: str
) -> dict[str, Any]:
    return {
        "partition_token": token,
        "child_partitions_record": {
            "start_timestamp": format_ns(start_ns),
            "record_sequence": record_sequence,
            "child_partitions": _json(children, []),
        },
    }


# --- export, MUTABLE_KEY_RANGE (ChangeStreamRecord in its protobuf JSON mapping) -------------


def stream_data_change_line(row: dict[str, Any], mods: list[dict[str, Any]]) -> dict[str, Any]:
    """A cached data change record of a MUTABLE_KEY_RANGE stream -> one recording line: a
    ``DataChangeRecord`` whose mods name columns by their index in ``column_metadata``."""
    columns = _json(row["column_types"], [])
    names = [c["name"] for c in columns]

    def values(obj: dict[str, Any]) -> list[dict[str, Any]]:
        for name in obj:
            if name not in names:
                names.append(name)
                columns.append({"name": name, "type": None, "is_primary_key": False,
                                "ordinal_position": 0})
        return [{"column_metadata_index": names.index(n), "value": v} for n, v in obj.items()]

    encoded = [{"keys": values(m.get("keys") or {}),
                "new_values": values(m.get("new_values") or {}),
                "old_values": values(m.get("old_values") or {})} for m in mods]
    return {
        "partition_token": row["partition_token"],
        "data_change_record": {
            "commit_timestamp": format_ns(row["commit_ns"]),
            "record_sequence": row["record_sequence"],
            "server_transaction_id": row["server_transaction_id"],
            "is_last_record_in_transaction_in_partition": row[
                "is_last_record_in_transaction_in_partition"
            ],
            "table": row["table_name"],
            "column_metadata": [
                {"name": c["name"], "type": c.get("type") or {},
                 "is_primary_key": bool(c.get("is_primary_key")),
                 "ordinal_position": str(c.get("ordinal_position") or 0)}
                for c in columns
            ],
            "mods": encoded,
            "mod_type": row["mod_type"],
            "value_capture_type": row["value_capture_type"],
            "number_of_records_in_transaction": row["number_of_records_in_transaction"],
            "number_of_partitions_in_transaction": row["number_of_partitions_in_transaction"],
            "transaction_tag": row["transaction_tag"],
            "is_system_transaction": row["is_system_transaction"],
        },
    }


def partition_start_line(token: str | None, start_ns: int, record_sequence: str | None,
                         tokens: str | None) -> dict[str, Any]:
    return {"partition_token": token, "partition_start_record": {
        "start_timestamp": format_ns(start_ns), "record_sequence": record_sequence,
        "partition_tokens": _json(tokens, [])}}


def partition_event_line(token: str, ts_ns: int, record_sequence: str | None,
                         move_in: str | None, move_out: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"commit_timestamp": format_ns(ts_ns),
                            "record_sequence": record_sequence, "partition_token": token}
    sources, destinations = _json(move_in, []), _json(move_out, [])
    if sources:
        body["move_in_events"] = [{"source_partition_token": t} for t in sources]
    if destinations:
        body["move_out_events"] = [{"destination_partition_token": t} for t in destinations]
    return {"partition_token": token, "partition_event_record": body}


def partition_end_line(token: str, ts_ns: int, record_sequence: str | None) -> dict[str, Any]:
    return {"partition_token": token, "partition_end_record": {
        "end_timestamp": format_ns(ts_ns), "record_sequence": record_sequence,
        "partition_token": token}}
