"""The record model: one flat row per change stream record, whatever system it came from.

Every source (a Spanner partition read, a recording file, another system's files) turns what it
reads into rows of ``RECORD_FIELDS``; the cache ingests exactly these rows. Pure functions only.

Kinds:
- ``data_change``: a data change record (``ts_ns`` = commit timestamp).
- ``heartbeat``: a heartbeat record, or another system's watermark (``ts_ns`` = its timestamp).
- ``child_partitions``: a child partitions record (``ts_ns`` = its start_timestamp).
- ``partition_end``: written by a reader when it stops reading a partition; ``extra`` holds
  ``{"state": "finished"|"open"|"failed", "read_to": ns, "error": ...}``.
- ``bad``: input that could not be decoded; ``raw`` keeps it, ``extra`` has ``{"reason": ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from json.encoder import c_make_encoder as _c_make_encoder
from json.encoder import encode_basestring as _encode_text
from typing import Any

from spark_backend.model.timestamps import TimestampError, coerce_ns

RECORD_FIELDS: list[tuple[str, str]] = [
    ("partition_token", "string"),
    ("kind", "string"),
    ("ts_ns", "int64"),
    ("record_sequence", "string"),
    ("server_transaction_id", "string"),
    ("is_last_record_in_transaction_in_partition", "bool"),
    ("table_name", "string"),
    ("value_capture_type", "string"),
    ("column_types", "string"),
    ("mods", "string"),
    ("mod_type", "string"),
    ("number_of_records_in_transaction", "int64"),
    ("number_of_partitions_in_transaction", "int64"),
    ("transaction_tag", "string"),
    ("is_system_transaction", "bool"),
    ("child_partitions", "string"),
    ("record_id", "string"),
    ("order_key", "string"),
    ("read_ts_ns", "int64"),
    ("extra", "string"),
    ("origin", "string"),
    ("line", "int64"),
    ("raw", "string"),
]
FIELD_NAMES = [name for name, _ in RECORD_FIELDS]
SPARK_DDL = ", ".join(
    f"{n} {dict(string='STRING', int64='BIGINT', bool='BOOLEAN')[t]}" for n, t in RECORD_FIELDS
)


def arrow_schema():
    import pyarrow as pa

    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_()}
    return pa.schema([(n, types[t]) for n, t in RECORD_FIELDS])


def to_arrow_batch(rows: list[dict[str, Any]]):
    """Rows (dicts with any subset of RECORD_FIELDS) -> one pyarrow RecordBatch."""
    import pyarrow as pa

    columns = {name: [row.get(name) for row in rows] for name in FIELD_NAMES}
    return pa.RecordBatch.from_pydict(columns, schema=arrow_schema())


def batched(rows: Iterable[dict[str, Any]], size: int = 2048) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: the form keys are stored and looked up in."""
    if _ENCODE is None:  # a Python without json's C speed-ups
        return _CANONICAL.encode(value)
    return "".join(_ENCODE(value, 0))


# ``json.dumps`` with these options builds an encoder for each call; one shared encoder writes
# the same text faster, as it keeps no state between calls (benchmarks/MEMORY.md).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# ... and its C encoder, made once: ``JSONEncoder.encode`` makes one for every call. Without
# the circular-reference check: the values are parsed JSON and the project's own dicts and
# lists.
_ENCODE = None if _c_make_encoder is None else _c_make_encoder(
    None, _CANONICAL.default, _encode_text, None, ":", ",", True, False, True)


def _json_object(value: Any) -> Any:
    """JSON columns may arrive as text (GoogleSQL JSON values) or already decoded."""
    if isinstance(value, str):
        return json.loads(value) if value else {}
    return {} if value is None else value


def _mods(raw_mods: Any) -> list[dict[str, Any]]:
    out = []
    for mod in raw_mods or []:
        out.append(
            {
                "keys": _json_object(mod.get("keys")),
                "new_values": _json_object(mod.get("new_values")),
                "old_values": _json_object(mod.get("old_values")),
            }
        )
    return out


_COLUMN_TYPES_SEEN: dict[tuple, str] = {}
_COLUMN_TYPES_BY_OBJECT: dict[int, tuple[Any, str]] = {}


def _column_types_json(raw: Any) -> str:
    """``canonical_json(_column_types(raw))``, remembered: every record of a table carries the
    same column types, and parsing and writing them again was a fifth of a record's cost."""
    known = _COLUMN_TYPES_BY_OBJECT.get(id(raw))
    if known is not None and known[0] is raw:  # the reader shares one list per distinct value
        return known[1]
    try:
        key = tuple((c.get("name"), c.get("type") if isinstance(c.get("type"), str | None)
                     else repr(c.get("type")), c.get("is_primary_key"),
                     c.get("ordinal_position")) for c in raw or ())
        hash(key)
    except (AttributeError, TypeError):
        return canonical_json(_column_types(raw))
    text = _COLUMN_TYPES_SEEN.get(key)
    if text is None:
        text = canonical_json(_column_types(raw))
        if len(_COLUMN_TYPES_SEEN) >= 4096:
            _COLUMN_TYPES_SEEN.clear()
        _COLUMN_TYPES_SEEN[key] = text
    if len(_COLUMN_TYPES_BY_OBJECT) >= 1024:
        _COLUMN_TYPES_BY_OBJECT.clear()
    _COLUMN_TYPES_BY_OBJECT[id(raw)] = (raw, text)  # holds raw: its id is not reused meanwhile
    return text


def _column_types(raw: Any) -> list[dict[str, Any]]:
    out = []
    for col in raw or []:
        col_type = col.get("type")
        out.append(
            {
                "name": col.get("name"),
                "type": _json_object(col_type) if col_type is not None else None,
                "is_primary_key": col.get("is_primary_key"),
                "ordinal_position": _int_or_none(col.get("ordinal_position")),
            }
        )
    return out


def _int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return int(value)


def _bool_or_none(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"expected a boolean, got {value!r}")


MOD_TYPES = frozenset({"INSERT", "UPDATE", "DELETE"})  # the doc's mod_type values


class RecordError(ValueError):
    """A change record that does not have the shape of the reference doc."""


def from_change_record(
    record: Mapping[str, Any], partition_token: str | None
) -> dict[str, Any]:
    """One change record in the doc's PostgreSQL JSON shape -> one flat row.

    ``record`` has exactly one of data_change_record, heartbeat_record, child_partitions_record
    (the GoogleSQL form decoded with field names is the same shape).
    """
    try:
        if record.get("data_change_record"):
            return _data_change(record["data_change_record"], partition_token)
        if record.get("heartbeat_record"):
            hb = record["heartbeat_record"]
            return {
                "partition_token": partition_token,
                "kind": "heartbeat",
                "ts_ns": coerce_ns(hb["timestamp"]),
            }
        if record.get("child_partitions_record"):
            return _child_partitions(record["child_partitions_record"], partition_token)
    except (KeyError, TypeError, ValueError, TimestampError, AttributeError) as e:
        raise RecordError(f"malformed change record: {_describe(e)}") from e
    raise RecordError(
        "malformed change record: expected one of data_change_record, heartbeat_record, "
        "child_partitions_record"
    )


def _describe(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"missing field {e.args[0]!r}"
    return str(e)


def _data_change(dc: Mapping[str, Any], partition_token: str | None) -> dict[str, Any]:
    mod_type = dc["mod_type"]
    if mod_type not in MOD_TYPES:
        raise ValueError(f"mod_type {mod_type!r} is not INSERT, UPDATE or DELETE")
    return {
        "partition_token": partition_token,
        "kind": "data_change",
        "ts_ns": coerce_ns(dc["commit_timestamp"]),
        "record_sequence": str(dc["record_sequence"]),
        "server_transaction_id": str(dc["server_transaction_id"]),
        "is_last_record_in_transaction_in_partition": _bool_or_none(
            dc.get("is_last_record_in_transaction_in_partition")
        ),
        "table_name": dc["table_name"],
        "value_capture_type": dc.get("value_capture_type"),
        "column_types": _column_types_json(dc.get("column_types")),
        "mods": canonical_json(_mods(dc.get("mods"))),
        "mod_type": mod_type,
        "number_of_records_in_transaction": _int_or_none(
            dc.get("number_of_records_in_transaction")
        ),
        "number_of_partitions_in_transaction": _int_or_none(
            dc.get("number_of_partitions_in_transaction")
        ),
        "transaction_tag": dc.get("transaction_tag"),
        "is_system_transaction": _bool_or_none(dc.get("is_system_transaction")),
    }


def _child_partitions(cp: Mapping[str, Any], partition_token: str | None) -> dict[str, Any]:
    children = []
    for child in cp.get("child_partitions") or []:
        parents = [p for p in (child.get("parent_partition_tokens") or []) if p is not None]
        children.append({"token": child["token"], "parent_partition_tokens": parents})
    return {
        "partition_token": partition_token,
        "kind": "child_partitions",
        "ts_ns": coerce_ns(cp["start_timestamp"]),
        "record_sequence": (None if cp.get("record_sequence") is None
                            else str(cp["record_sequence"])),
        "child_partitions": canonical_json(children),
    }


def partition_end(
    partition_token: str | None, state: str, read_to_ns: int | None, **detail: Any
) -> dict[str, Any]:
    """The row a reader writes when it stops reading a partition."""
    return {
        "partition_token": partition_token,
        "kind": "partition_end",
        "ts_ns": read_to_ns,
        "extra": canonical_json({"state": state, **detail}),
    }


def bad_row(origin: str, line: int | None, raw: str, reason: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "bad",
        "origin": origin,
        "line": line,
        "raw": raw,
        "extra": canonical_json({"reason": reason, **extra}),
    }
