"""Records of change streams in the ``MUTABLE_KEY_RANGE`` partition mode -> flat rows.

In that mode every row of the read function is one ``google.spanner.v1.ChangeStreamRecord``
(``google/cloud/spanner_v1/types/change_stream.py`` in google-cloud-spanner). Readers decode it
with the client's own type and hand it here in its protobuf JSON mapping with the proto field
names (``MessageToDict(..., preserving_proto_field_name=True)``): the same form the recording
format stores, one record per line. Pure functions only.

Row kinds added by this mode (``records`` has the others):

- ``partition_start``: a partition start record (``ts_ns`` = its start_timestamp);
  ``child_partitions`` lists the partitions to read next in the same JSON shape as a child
  partitions record, each with the partition that announced it as its parent (none for the
  initial query), so the query workflow follows both modes alike.
- ``partition_event``: a partition event record (``ts_ns`` = its commit_timestamp); ``extra``
  holds ``{"move_in": [source tokens], "move_out": [destination tokens]}``.
- ``partition_end_record``: a partition end record (``ts_ns`` = its end_timestamp), the last
  record of a partition: the partition finished there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_backend.model.records import RecordError, canonical_json, from_change_record
from spark_backend.model.timestamps import TimestampError, coerce_ns

STREAM_RECORD_KEYS = (
    "data_change_record", "heartbeat_record", "partition_start_record", "partition_end_record",
    "partition_event_record",
)
MUTABLE_KINDS = ("partition_start", "partition_event", "partition_end_record")


def _mod_values(values: Any, names: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values or []:
        index = int(item.get("column_metadata_index", 0))
        if not 0 <= index < len(names):
            raise ValueError(f"column_metadata_index {index} has no column metadata")
        out[names[index]] = item.get("value")
    return out


def data_change_to_doc_shape(dc: Mapping[str, Any]) -> dict[str, Any]:
    """A ``DataChangeRecord`` (protobuf JSON mapping) -> the reference doc's data change record
    shape (``table_name``, ``column_types``, ``mods`` as JSON objects keyed by column name)."""
    columns = list(dc.get("column_metadata") or [])
    names = [c["name"] for c in columns]
    return {
        "commit_timestamp": dc["commit_timestamp"],
        "record_sequence": dc.get("record_sequence", ""),
        "server_transaction_id": dc.get("server_transaction_id", ""),
        "is_last_record_in_transaction_in_partition": bool(
            dc.get("is_last_record_in_transaction_in_partition", False)),
        "table_name": dc.get("table", ""),
        "column_types": [
            {"name": c["name"], "type": c.get("type") or {},
             "is_primary_key": bool(c.get("is_primary_key", False)),
             "ordinal_position": int(c.get("ordinal_position", 0))}
            for c in columns
        ],
        "mods": [
            {"keys": _mod_values(m.get("keys"), names),
             "new_values": _mod_values(m.get("new_values"), names),
             "old_values": _mod_values(m.get("old_values"), names)}
            for m in dc.get("mods") or []
        ],
        "mod_type": dc.get("mod_type", "MOD_TYPE_UNSPECIFIED"),
        "value_capture_type": dc.get("value_capture_type"),
        "number_of_records_in_transaction": int(dc.get("number_of_records_in_transaction", 0)),
        "number_of_partitions_in_transaction": int(
            dc.get("number_of_partitions_in_transaction", 0)),
        "transaction_tag": dc.get("transaction_tag", ""),
        "is_system_transaction": bool(dc.get("is_system_transaction", False)),
    }


def from_stream_record(record: Mapping[str, Any], partition_token: str | None) -> dict[str, Any]:
    """One ``ChangeStreamRecord`` (protobuf JSON mapping) read in ``partition_token`` (None:
    the initial query) -> one flat row. Raises :class:`records.RecordError` for a bad shape."""
    present = [k for k in STREAM_RECORD_KEYS if k in record]
    if len(present) != 1:
        raise RecordError(
            "malformed change stream record: expected exactly one of "
            + ", ".join(STREAM_RECORD_KEYS))
    key = present[0]
    body = record[key]
    try:
        if key == "data_change_record":
            return from_change_record(
                {"data_change_record": data_change_to_doc_shape(body)}, partition_token)
        if key == "heartbeat_record":
            return {"partition_token": partition_token, "kind": "heartbeat",
                    "ts_ns": coerce_ns(body["timestamp"])}
        if key == "partition_start_record":
            parents = [] if partition_token is None else [partition_token]
            children = [{"token": str(t), "parent_partition_tokens": parents}
                        for t in body.get("partition_tokens") or []]
            return {"partition_token": partition_token, "kind": "partition_start",
                    "ts_ns": coerce_ns(body["start_timestamp"]),
                    "record_sequence": body.get("record_sequence"),
                    "child_partitions": canonical_json(children)}
        if key == "partition_end_record":
            return {"partition_token": partition_token, "kind": "partition_end_record",
                    "ts_ns": coerce_ns(body["end_timestamp"]),
                    "record_sequence": body.get("record_sequence"),
                    "extra": canonical_json({"partition_token": body.get("partition_token")})}
        moves_in = [str(e["source_partition_token"]) for e in body.get("move_in_events") or []]
        moves_out = [str(e["destination_partition_token"])
                     for e in body.get("move_out_events") or []]
        return {"partition_token": partition_token, "kind": "partition_event",
                "ts_ns": coerce_ns(body["commit_timestamp"]),
                "record_sequence": body.get("record_sequence"),
                "extra": canonical_json({"move_in": moves_in, "move_out": moves_out,
                                         "partition_token": body.get("partition_token")})}
    except RecordError:
        raise
    except (KeyError, TypeError, ValueError, TimestampError, AttributeError) as e:
        what = f"missing field {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
        raise RecordError(f"malformed {key}: {what}") from e
