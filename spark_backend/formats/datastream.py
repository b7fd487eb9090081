"""Datastream events (``--format datastream``): JSON Lines and Avro object container files.

What a file may hold (reference doc 001, "Events and streams"):

- **JSON**: one event per line (Datastream's JSON output to Cloud Storage is JSON Lines;
  ``.gz`` files are decompressed). Each event has the generic metadata ``stream_name``,
  ``read_method``, ``object``, ``schema_key``, ``uuid``, ``read_timestamp``,
  ``source_timestamp``, ``sort_keys``, the source-specific ``source_metadata`` and the row in
  ``payload``. Timestamps are RFC 3339 text (no offset = UTC) or epoch milliseconds.
- **Avro**: an object container file (magic ``Obj\\x01``) whose header carries the schema; read
  record by record with fastavro. ``read_timestamp``/``source_timestamp`` are
  ``timestamp-millis``; ``payload`` is a record whose fields are the columns.

How an event maps to a row of ``records.RECORD_FIELDS`` (``kind='data_change'``):

- ``ts_ns`` = ``source_timestamp``; ``read_ts_ns`` = ``read_timestamp`` (freshness = read - source).
- ``table_name`` = ``object`` (e.g. ``SAMPLE.TBL``); ``partition_token`` = ``object`` too: each
  source table is a node of the DAG with no parents.
- ``record_id`` = ``uuid``: the doc's duplicate identity, so a redelivered event counts as a
  duplicate in the cache.
- ``mod_type``: ``is_deleted`` true -> DELETE; else ``change_type`` INSERT -> INSERT; a backfill
  event (``read_method`` ``*-backfill*``) or a dump (``change_type`` ``oracle_dump``, any
  ``*dump*``) -> INSERT: a backfill reads the row as it is; any other change type (UPDATE,
  UPDATE-INSERT, UPDATE-DELETE) -> UPDATE. The source's own ``change_type`` is kept in
  ``extra``.
- ``mods``: one mod. ``keys`` are the primary key columns of the payload, taken from
  ``primary_keys`` (MySQL, PostgreSQL, Salesforce), ``replication_index`` (SQL Server), the
  ``keys`` option (comma-separated column names), or for Oracle (no key list in its metadata) the
  ``row_id`` as ``{"ROWID": ...}``; else ``{}``. ``new_values`` = the other payload columns
  (DELETE: ``old_values`` = the deleted row's other columns, ``new_values`` = ``{}``).
- ``server_transaction_id`` = ``tx_id`` (Oracle, PostgreSQL, SQL Server), else None. Datastream
  gives no record count for a transaction, so its transactions are "unknown" (never
  "incomplete") in ``analysis.transactions``.
- Avro values are what Datastream's consumers see (the unified types' JSON definitions):
  logical types are decoded (``timestamp-*``, ``date``, ``time-*``, ``decimal``), the custom
  record types are unwrapped (``timestampTz`` -> RFC 3339 with its offset, ``datetime`` ->
  ISO 8601 date and time, ``varchar`` -> its text), and ``bytes`` are base64 text.
- ``order_key``: the doc's order per source, zero-padded so it sorts as text. Backfill events
  (``read_method`` ``*-backfill*``, no order implied) sort first: ``0|<source ts>|<uuid>``. CDC
  and supplementation events: ``1|`` then MySQL ``log_file`` (numeric suffix padded) +
  ``log_position``; Oracle ``scn`` then ``rs_id`` (hex parts padded) + ``ssn`` (the doc names
  rs_id+ssn; scn is put first because it is Oracle's commit order and the doc's own example
  rs_ids contradict its sequence of INSERT/UPDATE/DELETE); PostgreSQL and SQL Server
  ``source_timestamp`` + ``lsn``; Salesforce ``source_timestamp``; every key ends in ``|uuid``.
- ``extra`` keeps ``stream_name``, ``read_method``, ``phase`` (backfill | cdc |
  supplementation), ``source`` (mysql | oracle | postgresql | sqlserver | salesforce),
  ``schema_key``, ``sort_keys``, ``change_type``, the exact timestamp texts, ``source_metadata``.
- ``column_types`` (Avro only): the payload fields of the writer schema with their Avro types.

Bad input (never raises): a line that is not JSON (e.g. truncated), an object that is not a
Datastream event, a file that is neither JSON nor Avro, an Avro file without its header/schema or
cut short: one ``bad`` row naming the file and line (Avro: record number) with the reason.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

from spark_backend.formats.lines import read_part
from spark_backend.model.records import bad_row, canonical_json
from spark_backend.model.timestamps import TimestampError, coerce_ns, parse_ns

FORMAT = "datastream"
SYSTEM = "datastream"

AVRO_MAGIC = b"Obj\x01"
GENERIC_FIELDS = (
    "stream_name", "read_method", "object", "schema_key", "uuid", "read_timestamp",
    "source_timestamp", "sort_keys",
)
_REQUIRED = ("uuid", "object", "source_timestamp", "payload")


class EventError(ValueError):
    """An object that is not a Datastream event."""


# --- reading ---------------------------------------------------------------------------------


def _json_lines(head: bytes) -> bool:
    first = head.removeprefix(b"\xef\xbb\xbf").lstrip()[:1]  # a BOM is fine
    return first in (b"{", b"")


def splittable(head: bytes) -> bool:
    """JSON Lines: every event stands on its own. Avro: not by lines, by its blocks
    (``block_cuts``)."""
    return head != AVRO_MAGIC and _json_lines(head)


def not_lines(stream, head: bytes, origin: str, options: dict[str, str], first: int = 1):
    """An Avro container's records (numbered from ``first``), or why the file is neither JSON
    Lines nor Avro; None for JSON Lines."""
    if head == AVRO_MAGIC:
        return _parse_avro(stream, origin, options, first)
    if _json_lines(head):
        return None
    if origin.lower().endswith(".avro"):
        reason = (
            "not an Avro object container file (no 'Obj\\x01' header, so no "
            "schema): Datastream Avro files carry their schema in the header"
        )
    else:
        reason = (
            "neither a Datastream JSON Lines file (one event object per line) "
            "nor an Avro object container file"
        )
    return iter([bad_row(origin, 1, head.decode("latin-1"), reason)])


def parse_file(path: str, options: dict[str, str] | None = None) -> Iterator[dict[str, Any]]:
    return read_part(sys.modules[__name__], path, options)


class Parser:
    """Datastream JSON Lines events -> rows (``formats.lines``); no state between lines."""

    def __init__(self, origin: str, options: dict[str, str] | None = None):
        self.origin = origin
        self.options = options or {}

    def line(self, number: int, text: str) -> Iterator[dict[str, Any]]:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            yield bad_row(
                self.origin, number, text,
                f"not JSON ({e.msg}, column {e.colno}); "
                "a truncated line or not a Datastream JSON Lines file",
            )
            return
        try:
            row = event_row(obj, self.options)
        except EventError as e:
            yield bad_row(self.origin, number, text, str(e))
            return
        row["origin"] = self.origin
        row["line"] = number
        yield row

    def finish(self) -> Iterator[dict[str, Any]]:
        return iter(())


def _long(f) -> int:
    """One Avro ``long`` (zig-zag varint); EOFError at the end of the file."""
    shift = value = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise EOFError
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return (value >> 1) ^ -(value & 1)
        shift += 7
        if shift > 63:
            raise ValueError("an Avro long longer than 10 bytes")


def avro_header(f) -> tuple[int, bytes] | None:
    """(the header's size, the sync marker) of the Avro container open at its start in ``f``,
    or None when the header cannot be walked (the reader then says why)."""
    try:
        if f.read(4) != AVRO_MAGIC:
            return None
        while count := _long(f):  # the metadata map, in blocks of entries
            if count < 0:
                count = -count
                _long(f)  # the block's size in bytes
            for _ in range(2 * count):  # a key and a value per entry
                f.seek(_long(f), 1)
        sync = f.read(16)
    except (EOFError, ValueError):
        return None
    return (f.tell(), sync) if len(sync) == 16 else None


def block_cuts(path: str, range_bytes: int) -> list[tuple[int, int]]:
    """Where an Avro container may be cut into parts of about ``range_bytes`` each: (offset
    of a data block, number of its first record), after the header; a part is read with
    the file's header before it (``lines.read_part``). Walks the blocks by their sizes and
    sync markers, reading ~20 bytes per block; the cuts end where the walk fails (the last
    part then reads on to the failure and says what it is)."""
    cuts: list[tuple[int, int]] = []
    with open(path, "rb") as f:
        header = avro_header(f)
        if header is None:
            return cuts
        last, sync = header
        records = 0
        size = f.seek(0, 2)
        f.seek(last)
        try:
            while f.tell() < size:
                count, length = _long(f), _long(f)
                if count < 0 or length < 0:
                    break
                f.seek(length, 1)
                if f.read(16) != sync:
                    break
                records += count
                if f.tell() - last >= range_bytes and f.tell() < size:
                    last = f.tell()
                    cuts.append((last, records + 1))
        except (EOFError, ValueError):
            pass
    return cuts


def _parse_avro(f, path: str, options: dict[str, str], first: int = 1
                ) -> Iterator[dict[str, Any]]:
    import fastavro

    try:
        reader = fastavro.reader(f)
    except Exception as e:  # fastavro raises ValueError/EOFError/SchemaParseException...
        yield bad_row(
            path, None, "",
            f"not a readable Avro file: its header/schema cannot be read ({e})",
        )
        return
    column_types = _avro_column_types(reader.writer_schema)
    wrapped = _wrapped_columns(reader.writer_schema)
    index = first - 1
    iterator = iter(reader)
    while True:
        try:
            record = next(iterator)
        except StopIteration:
            return
        except Exception as e:
            yield bad_row(
                path, index + 1, "",
                f"record {index + 1}: the Avro file is cut short or corrupt ({e}); "
                f"{index} records before it were read",
            )
            return
        index += 1
        if wrapped and isinstance(record, dict) and isinstance(record.get("payload"), dict):
            record = {**record, "payload": {k: _unwrap(wrapped.get(k), v)
                                            for k, v in record["payload"].items()}}
        try:
            row = event_row(record, options)
        except EventError as e:
            yield bad_row(path, index, _raw(record), f"record {index}: {e}")
            continue
        if column_types is not None:
            row["column_types"] = column_types
        row["origin"] = path
        row["line"] = index
        yield row


def _payload_fields(schema: Any) -> list[dict[str, Any]]:
    if not isinstance(schema, dict):
        return []
    for field in schema.get("fields", []):
        if field.get("name") != "payload":
            continue
        ptype = field.get("type")
        if isinstance(ptype, list):  # ["null", {record}]
            ptype = next((t for t in ptype if isinstance(t, dict)), None)
        if isinstance(ptype, dict):
            return list(ptype.get("fields") or [])
    return []


def _wrapped_columns(schema: Any) -> dict[str, str]:
    """Payload columns whose Avro type is one of Datastream's custom record types."""
    out = {}
    for col in _payload_fields(schema):
        ctype = col.get("type")
        options = ctype if isinstance(ctype, list) else [ctype]
        for t in options:
            if isinstance(t, dict) and t.get("type") == "record":
                out[col.get("name")] = str(t.get("name", "")).split(".")[-1]
    return out


def _unwrap(record_name: str | None, value: Any) -> Any:
    """A custom record type's value -> the plain value of its JSON definition."""
    if record_name is None or not isinstance(value, dict):
        return value
    if record_name == "timestampTz" and "timestamp" in value:
        instant = value["timestamp"]
        offset = value.get("offset") or 0
        if isinstance(offset, dt.time):  # time-millis decoded as a time of day
            offset = ((offset.hour * 60 + offset.minute) * 60 + offset.second) * 1000 + (
                offset.microsecond // 1000)
        if isinstance(instant, int | float):
            instant = dt.datetime.fromtimestamp(instant / 1e6, dt.UTC)
        if isinstance(instant, dt.datetime):
            zone = dt.timezone(dt.timedelta(milliseconds=int(offset)))
            return instant.astimezone(zone).isoformat()
        return value
    if record_name == "datetime" and "date" in value and "time" in value:
        date, time_ = value["date"], value["time"]
        if isinstance(date, int):
            date = dt.date(1970, 1, 1) + dt.timedelta(days=date)
        if isinstance(time_, int):
            time_ = (dt.datetime.min + dt.timedelta(microseconds=time_)).time()
        if isinstance(date, dt.date) and isinstance(time_, dt.time):
            return dt.datetime.combine(date, time_).isoformat()
        return value
    if record_name == "varchar":
        text = value.get("value")
        if text is None:
            strings = [v for v in value.values() if isinstance(v, str)]
            text = strings[0] if len(strings) == 1 else None
        return value if text is None else text
    return value


def _raw(record: Any) -> str:
    try:
        return json.dumps(record, default=str, sort_keys=True)
    except (TypeError, ValueError):
        return repr(record)


def _avro_column_types(schema: Any) -> str | None:
    """The payload record's fields -> column_types (name, Avro type, ordinal position)."""
    if not isinstance(schema, dict):
        return None
    for field in schema.get("fields", []):
        if field.get("name") != "payload":
            continue
        ptype = field.get("type")
        if isinstance(ptype, list):  # ["null", {record}]
            ptype = next((t for t in ptype if isinstance(t, dict)), None)
        if not isinstance(ptype, dict) or "fields" not in ptype:
            return None
        cols = [
            {"name": c.get("name"), "type": c.get("type"), "is_primary_key": None,
             "ordinal_position": i}
            for i, c in enumerate(ptype["fields"], start=1)
        ]
        return canonical_json(cols)
    return None


# --- one event ------------------------------------------------------------------------------


def _ts_ns(value: Any, name: str) -> int:
    """RFC 3339 text (no offset: UTC), epoch milliseconds (number or digits) or a datetime."""
    if isinstance(value, bool) or value is None:
        raise EventError(f"{name} is missing or not a timestamp ({value!r})")
    if isinstance(value, int | float):
        return int(value) * 1_000_000
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value.strip()) * 1_000_000
    try:
        if isinstance(value, str):
            return parse_ns(value)
        return coerce_ns(value)
    except TimestampError as e:
        raise EventError(f"{name}: {e}") from e


def _ts_text(value: Any) -> Any:
    if value is None or isinstance(value, str | int):
        return value
    return _jsonable(value)


def source_of(read_method: str | None, metadata: dict[str, Any]) -> str:
    rm = (read_method or "").lower()
    for prefix, name in (
        ("mysql", "mysql"), ("oracle", "oracle"), ("postgres", "postgresql"),
        ("sqlserver", "sqlserver"), ("salesforce", "salesforce"),
    ):
        if rm.startswith(prefix):
            return name
    if "log_position" in metadata:
        return "mysql"
    if "scn" in metadata or "rs_id" in metadata:
        return "oracle"
    if "physical_location" in metadata or "replication_index" in metadata:
        return "sqlserver"
    if "lsn" in metadata:
        return "postgresql"
    if "object_name" in metadata or "domain" in metadata:
        return "salesforce"
    return "unknown"


def phase_of(read_method: str | None) -> str:
    rm = (read_method or "").lower()
    if "backfill" in rm:
        return "backfill"
    if "supplementation" in rm:
        return "supplementation"
    return "cdc"


def _pad_int(value: Any, width: int = 20) -> str:
    if value is None or value == "":
        return "".rjust(width, "0")
    try:
        n = int(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{n:0{width}d}" if n >= 0 else f"-{-n:0{width - 1}d}"


def _pad_log_file(name: Any) -> str:
    """'mysql-bin.000023' -> 'mysql-bin.' + suffix padded to 20 digits (sorts by number)."""
    text = "" if name is None else str(name)
    m = re.match(r"^(.*?)(\d+)$", text)
    if not m:
        return text
    return m.group(1) + m.group(2).rjust(20, "0")


def _pad_hex_parts(text: Any, sep: str, width: int) -> str:
    """'0x0073c9.000a4e4c.01d0' -> each hex part padded to ``width`` digits."""
    if text is None:
        return ""
    parts = str(text).lower().removeprefix("0x").split(sep)
    out = []
    for p in parts:
        p = p.removeprefix("0x")
        out.append(p.rjust(width, "0") if re.fullmatch(r"[0-9a-f]*", p) else p)
    return sep.join(out)


def _lsn(value: Any) -> str:
    """PostgreSQL 'X/Y', SQL Server 'aaaa:bbbb:cccc' (hex) or a decimal LSN -> sortable text."""
    if value is None:
        return ""
    text = str(value)
    if "/" in text:
        return _pad_hex_parts(text, "/", 16)
    if ":" in text:
        return _pad_hex_parts(text, ":", 16)
    if text.isdigit():
        return text.rjust(40, "0")
    return text


def order_key(source: str, phase: str, ts_ns: int, md: dict[str, Any], uuid: str) -> str:
    ts = _pad_int(ts_ns)
    if phase == "backfill":
        return f"0|{ts}|{uuid}"
    if source == "mysql":
        body = f"{_pad_log_file(md.get('log_file'))}|{_pad_int(md.get('log_position'))}"
    elif source == "oracle":
        body = (
            f"{_pad_int(md.get('scn'))}|{_pad_hex_parts(md.get('rs_id'), '.', 16)}"
            f"|{_pad_int(md.get('ssn'))}"
        )
    elif source in ("postgresql", "sqlserver"):
        body = f"{ts}|{_lsn(md.get('lsn'))}"
    else:
        body = ts
    return f"1|{body}|{uuid}"


def _key_columns(source: str, md: dict[str, Any], options: dict[str, str]) -> list[str] | None:
    for field in ("primary_keys", "replication_index"):
        cols = md.get(field)
        if isinstance(cols, list) and cols:
            return [str(c) for c in cols]
    if options.get("keys"):
        return [c.strip() for c in options["keys"].split(",") if c.strip()]
    return None


def normalize_mod_type(change_type: Any, is_deleted: Any, phase: str) -> str:
    if is_deleted is True:
        return "DELETE"
    ct = str(change_type or "").upper()
    if ct == "DELETE":
        return "DELETE"
    # A dump (Oracle's ``oracle_dump``, MySQL's full dump) is a backfill: the row as it is.
    if ct == "INSERT" or "DUMP" in ct or phase == "backfill":
        return "INSERT"
    return "UPDATE"


def _checked(event: Any) -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """(source_metadata, payload, uuid, object) of an event, or EventError saying what is
    missing or wrong (and which format the object looks like, if another one)."""
    if not isinstance(event, dict):
        raise EventError(f"expected a Datastream event object, got {type(event).__name__}")
    missing = [k for k in _REQUIRED if k not in event]
    if missing:
        hint = ""
        if "after" in event or "resolved" in event or "__crdb__" in event:
            hint = " (it looks like a CockroachDB changefeed message: use --format cockroachdb)"
        elif any(k in event for k in ("dataChange", "data_change", "heartbeat", "closeStream",
                                      "close_stream", "response")):
            hint = " (it looks like a Bigtable change stream record: use --format bigtable)"
        elif any(k in event for k in ("data_change_record", "heartbeat_record",
                                      "child_partitions_record")):
            hint = " (it looks like a Spanner recording line: use --format recording)"
        raise EventError(
            f"not a Datastream event: missing {', '.join(missing)}{hint}"
        )
    md = event.get("source_metadata") or {}
    payload = event.get("payload")
    if not isinstance(md, dict):
        raise EventError("source_metadata must be an object")
    if not isinstance(payload, dict):
        raise EventError("payload must be an object holding the row")
    uuid = event.get("uuid")
    if not isinstance(uuid, str) or not uuid:
        raise EventError("uuid must be a non-empty string")
    obj = event.get("object")
    if not isinstance(obj, str) or not obj:
        raise EventError("object must be a non-empty string")
    return md, payload, uuid, obj


def event_row(event: Any, options: dict[str, str] | None = None) -> dict[str, Any]:
    """One Datastream event (decoded JSON or Avro record) -> one data_change row."""
    options = options or {}
    md, payload, uuid, obj = _checked(event)
    ts_ns = _ts_ns(event.get("source_timestamp"), "source_timestamp")
    read_ts = event.get("read_timestamp")
    read_ns = None if read_ts is None else _ts_ns(read_ts, "read_timestamp")
    read_method = event.get("read_method")
    phase = phase_of(read_method)
    source = source_of(read_method, md)
    mod_type = normalize_mod_type(md.get("change_type"), md.get("is_deleted"), phase)

    key_cols = _key_columns(source, md, options)
    payload = {str(k): _jsonable(v) for k, v in payload.items()}
    if key_cols is not None:
        keys = {c: payload.get(c) for c in key_cols}
        key_source = "columns"
    elif source == "oracle" and md.get("row_id") is not None:
        keys = {"ROWID": md.get("row_id")}
        key_source = "row_id"
    else:
        keys = {}
        key_source = "none"
    others = {k: v for k, v in payload.items() if key_cols is None or k not in key_cols}
    if mod_type == "DELETE":
        mod = {"keys": keys, "new_values": {}, "old_values": others}
    else:
        mod = {"keys": keys, "new_values": others, "old_values": {}}

    tx_id = md.get("tx_id")
    extra = {
        "system": "datastream",
        "source": source,
        "phase": phase,
        "stream_name": event.get("stream_name"),
        "read_method": read_method,
        "schema_key": event.get("schema_key"),
        "sort_keys": _jsonable(event.get("sort_keys")),
        "change_type": md.get("change_type"),
        "source_timestamp": _ts_text(event.get("source_timestamp")),
        "read_timestamp": _ts_text(read_ts),
        "key_source": key_source,
        "source_metadata": _jsonable(md),
    }
    return {
        "partition_token": obj,
        "kind": "data_change",
        "ts_ns": ts_ns,
        "read_ts_ns": read_ns,
        "table_name": obj,
        "mod_type": mod_type,
        "mods": canonical_json([mod]),
        "value_capture_type": "NEW_ROW",
        "server_transaction_id": None if tx_id in (None, "") else str(tx_id),
        "record_id": uuid,
        "order_key": order_key(source, phase, ts_ns, md, uuid),
        "extra": canonical_json(extra),
    }


def _jsonable(value: Any) -> Any:
    """Avro values (bytes, datetimes, decimals) -> JSON-able values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):  # BYTES: base64 text, as in Datastream's JSON output
        import base64

        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime):
        from spark_backend.model.timestamps import format_ns, from_datetime

        return format_ns(from_datetime(value))
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, float) and value != value:
        return None
    return value
