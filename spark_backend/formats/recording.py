"""The project's recording format (DESIGN.md): JSON Lines, one change record per line in the
PostgreSQL-dialect shape plus the partition it was read from."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from spark_backend.formats import open_text
from spark_backend.model.records import RecordError, bad_row, from_change_record
from spark_backend.model.timestamps import format_ns

FORMAT = "recording"
SYSTEM = "spanner"
_RECORD_KEYS = ("data_change_record", "heartbeat_record", "child_partitions_record")


def parse_lines(lines: Iterable[str], origin: str) -> Iterator[dict[str, Any]]:
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            yield bad_row(origin, number, text, f"not JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(obj, dict) or not any(k in obj for k in _RECORD_KEYS):
            yield bad_row(
                origin, number, text,
                "not a recording line: expected an object with partition_token and one of "
                + ", ".join(_RECORD_KEYS),
            )
            continue
        token = obj.get("partition_token")
        if token is not None and not isinstance(token, str):
            yield bad_row(origin, number, text, "partition_token must be a string or null")
            continue
        try:
            row = from_change_record(obj, token)
        except RecordError as e:
            yield bad_row(origin, number, text, str(e))
            continue
        row["origin"] = origin
        row["line"] = number
        yield row


def parse_file(path: str, options: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    f, _ = open_text(path)
    with f:
        yield from parse_lines(f, path)


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
