"""Reading a Spanner change stream partition with google-cloud-spanner.

The query workflow of the reference doc: single-use strong read-only transactions running
``READ_<stream>`` (GoogleSQL) or ``spanner.read_json_<stream>`` (PostgreSQL) with bound, typed
parameters. Rows arrive through the client's own ``StreamedResultSet`` (chunk merging) with
``lazy_decode`` and are decoded here straight from the protobuf values into named fields, which
is several times faster than the client's full decode. One bounded retry layer: the stream of
PartialResultSets is resumed from the last resume token after transient errors, with the
backoff of ``google.api_core.retry`` (:data:`RETRY`, also used for the unary calls).

The dialect is the database's own (``connect.ask_dialect``); a given dialect only overrides,
and a query the database refuses because the dialect does not match is answered in one
sentence naming the database's dialect.

Both partition modes
--------------------
A change stream created with ``OPTIONS (partition_mode = 'MUTABLE_KEY_RANGE')`` returns one
``google.spanner.v1.ChangeStreamRecord`` per row (data change, heartbeat, partition start,
partition end, partition event records). How it arrives on the wire, and where we read it:

* GoogleSQL: the same ``READ_<stream>`` function and arguments (Go: ``SELECT ChangeRecord FROM
  READ_%s(@start_timestamp, @end_timestamp, @partition_token, @heartbeat_millis_second)``). The
  one column ``ChangeRecord`` has type code ``PROTO`` (13) with ``proto_type_fqn =
  "google.spanner.v1.ChangeStreamRecord"``; each value is a ``string_value`` holding the
  base64 of the serialized message (Spanner's JSON encoding of PROTO, as of BYTES).
  Read in: googleapis/google-cloud-rust, Spanner ``change_stream`` module (decodes the
  ``ChangeRecord`` column, "TypeCode::Proto containing serialized ChangeStreamRecord bytes";
  its test builds ``Type{code: PROTO, proto_type_fqn: "google.spanner.v1.ChangeStreamRecord"}``
  with a base64 ``StringValue``); cloudspannerecosystem/spanner-change-streams-tail
  ``changestreams/reader.go`` (PR #25 "Add mutable change stream support": ``row.Column(0,
  &spannerpb.ChangeStreamRecord)``); apache/beam PR #35408 ("Deserialize proto based (mutable
  key range) change stream return records": ``ChangeStreamRecordMapper`` reads
  ``resultSet.getProtoChangeStreamRecord(0)``); the emulator's change streams internals doc
  (GoogleCloudPlatform/cloud-spanner-emulator: "the ``google.spanner.v1.ChangeStreamRecord``
  proto for GoogleSQL ``MUTABLE_KEY_RANGE``").
* PostgreSQL: a DIFFERENT function, ``spanner.read_proto_bytes_<stream>($1, $2, $3, $4,
  null)`` (same five arguments as ``read_json_<stream>``), returning ``BYTES`` (bytea, a
  base64 ``string_value``) of the serialized message, in one column named after the function.
  Read in: apache/beam PR #36667 ("Update ChangeStreamDao to query different TVF for
  postgresSQL based on the change stream partition mode") and PR #37427 ("Parse proto bytes
  change stream record in ChangeStreamRecordMapper"); spanner-change-streams-tail
  ``decodeProtoBytePostgresRow`` (``row.Column(0, &[]byte)`` then ``proto.Unmarshal``); the
  emulator doc ("bytes for PostgreSQL ``MUTABLE_KEY_RANGE``", "PostgreSQL results name the
  column after the TVF", ``read_proto_bytes_<name>``).
* In this mode ``end_timestamp`` is required and at most 30 minutes after
  ``start_timestamp`` (apache/beam PR #34967; the emulator's query validator), so a partition
  is read in windows of at most :data:`MUTABLE_WINDOW_NS`.
* apache/beam PR #37991 (the Go SDK's SpannerIO change streams) supports only the immutable
  mode; its review asks to document that restriction. Beam's Java connector and the Go tail
  ask ``information_schema.change_stream_options`` for the mode before querying. We detect it
  from the first query instead: in GoogleSQL from the result's column type (PROTO: mutable;
  ARRAY<STRUCT>: immutable); in PostgreSQL ``read_json_<stream>`` does not exist for a mutable
  stream, so a refusal naming that function is followed by ``read_proto_bytes_<stream>``.
  Until the mode is known a query spans at most 30 minutes (valid in both modes).

The ``ChangeRecord`` value is decoded with the client's own type
(``google.cloud.spanner_v1.types.ChangeStreamRecord``) into its protobuf JSON mapping and
turned into rows by ``model.stream_records``.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import weakref
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, NamedTuple

from spark_backend.model import config
from spark_backend.model.errors import BadInput, SourceError
from spark_backend.model.records import RecordError, bad_row, from_change_record, partition_end
from spark_backend.model.stream_records import from_stream_record
from spark_backend.spanner.connect import (
    RETRY,
    ask_dialect,
    dialect_name,
    is_transient,
    read_api,
    remember_for,
    validate_dialect,
)

_STREAM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")
_NS = 1_000_000_000


class PartitionMode(StrEnum):
    """A change stream's ``partition_mode`` option."""

    IMMUTABLE = "IMMUTABLE_KEY_RANGE"
    MUTABLE = "MUTABLE_KEY_RANGE"


MUTABLE_WINDOW_NS = 30 * 60 * _NS  # MUTABLE_KEY_RANGE: end_timestamp <= start_timestamp + 30 min
CHANGE_STREAM_RECORD_FQN = "google.spanner.v1.ChangeStreamRecord"

GOOGLESQL_QUERY = (
    "SELECT ChangeRecord FROM READ_{stream} ("
    "start_timestamp => @start_timestamp, end_timestamp => @end_timestamp, "
    "partition_token => @partition_token, heartbeat_milliseconds => @heartbeat_milliseconds)"
)
POSTGRESQL_QUERY = 'SELECT * FROM "spanner"."read_json_{stream}" ($1, $2, $3, $4, null)'
POSTGRESQL_MUTABLE_QUERY = (
    'SELECT * FROM "spanner"."read_proto_bytes_{stream}" ($1, $2, $3, $4, null)'
)

# id(Database) -> {stream: the partition mode its first query showed}, while it lives
_MODES: dict[int, dict[str, PartitionMode]] = {}
_MODES_LOCK = threading.Lock()


def validate_stream_name(name: str) -> str:
    """A change stream name goes into the query text, so it must be a plain identifier."""
    if not isinstance(name, str) or not _STREAM_NAME.match(name):
        raise BadInput(
            f"{name!r} is not a valid change stream name; use a letter followed by letters, "
            "digits or underscores (at most 128 characters).", field="stream",
        )
    return name


def validate_heartbeat(ms: int) -> int:
    if not isinstance(ms, int) or isinstance(ms, bool) or not (
        config.MIN_HEARTBEAT_MS <= ms <= config.MAX_HEARTBEAT_MS
    ):
        raise BadInput(
            f"Heartbeat {ms!r} ms is out of range; Spanner accepts 1,000 to 300,000 milliseconds.",
            field="heartbeat_ms",
        )
    return ms


def query_text(dialect: str, stream: str, mode: str = PartitionMode.IMMUTABLE) -> str:
    validate_stream_name(stream)
    if validate_dialect(dialect) == "googlesql":
        template = GOOGLESQL_QUERY
    elif PartitionMode(mode) is PartitionMode.MUTABLE:
        template = POSTGRESQL_MUTABLE_QUERY
    else:
        template = POSTGRESQL_QUERY
    return template.format(stream=stream)


def known_mode(database, stream: str) -> PartitionMode | None:
    with _MODES_LOCK:
        return _MODES.get(id(database), {}).get(stream)


def _remember_mode(database, stream: str, mode: PartitionMode) -> None:
    with _MODES_LOCK:
        modes = dict(_MODES.get(id(database), {}), **{stream: mode})
        remember_for(database, _MODES, modes)


# --- decoding --------------------------------------------------------------------------------


def _field_type(field):
    """The Type of a StructType.Field, raw protobuf or proto-plus."""
    return field.type_ if hasattr(field, "type_") else field.type


def _value_decoder(type_pb):
    """A decoder specialised for one column type: raw protobuf ``Value`` -> Python, STRUCT
    fields named from the metadata. Scalars stay as the wire gives them (TIMESTAMP, INT64 and
    JSON are strings; ``records.from_change_record`` converts them)."""
    code = int(type_pb.code)
    if code == 8:  # ARRAY
        element = _value_decoder(type_pb.array_element_type)

        def array(v):
            if v.WhichOneof("kind") != "list_value":
                return None
            return [element(x) for x in v.list_value.values]
        return array
    if code == 9:  # STRUCT
        fields = [(f.name, _value_decoder(_field_type(f))) for f in type_pb.struct_type.fields]
        fields = [(name, _same_value_once(dec) if name in _REPEATED_FIELDS else dec)
                  for name, dec in fields]

        def struct(v):
            if v.WhichOneof("kind") != "list_value":
                return None
            return {name: dec(x) for (name, dec), x in zip(fields, v.list_value.values,
                                                            strict=False)}
        return struct
    if code == 1:  # BOOL
        return lambda v: v.bool_value if v.WhichOneof("kind") == "bool_value" else None
    if code == 3:  # FLOAT64
        return lambda v: v.number_value if v.WhichOneof("kind") == "number_value" else (
            v.string_value or None)
    return lambda v: v.string_value if v.WhichOneof("kind") == "string_value" else None


# Fields whose value repeats from record to record (every record of a table carries the same
# column types): decoded once per distinct value.
_REPEATED_FIELDS = frozenset({"column_types"})


def _same_value_once(decode):
    """``decode``, remembered by the value's wire bytes (a C call instead of decoding a list
    of structs again). The result is shared between records: read it, never change it."""
    seen: dict[bytes, Any] = {}

    def remembered(v):
        key = v.SerializeToString()
        out = seen.get(key)
        if out is None:
            out = decode(v)
            if len(seen) < 1024:
                seen[key] = out
        return out
    return remembered


def stream_mode(fields_pb) -> PartitionMode:
    """The partition mode a result's one column shows: PROTO ``ChangeStreamRecord``
    (GoogleSQL) or BYTES (PostgreSQL ``read_proto_bytes_``): mutable; else immutable."""
    type_pb = _field_type(fields_pb[0])
    code = int(type_pb.code)
    if code == 13 or code == 7:  # PROTO, BYTES
        return PartitionMode.MUTABLE
    return PartitionMode.IMMUTABLE


def decode_stream_record(value: Any) -> dict[str, Any]:
    """One ``ChangeRecord`` value (base64 text on the wire, or raw bytes) -> the
    ``ChangeStreamRecord`` in its protobuf JSON mapping, decoded with the client's own type."""
    from google.cloud.spanner_v1.types import ChangeStreamRecord
    from google.protobuf import json_format

    if hasattr(value, "WhichOneof"):
        value = value.string_value
    data = value if isinstance(value, bytes) else base64.b64decode(value)
    message = ChangeStreamRecord.pb().FromString(data)
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def _decoder(fields_pb, dialect: str):
    """Row (raw protobuf values) -> the change record dict: the doc's PostgreSQL JSON shape in
    the immutable mode, the ``ChangeStreamRecord`` JSON mapping in the mutable mode."""
    if stream_mode(fields_pb) is PartitionMode.MUTABLE:
        return lambda row: decode_stream_record(row[0])
    if dialect == "postgresql":
        def decode_pg(row):
            value = row[0]
            text = value.string_value if hasattr(value, "string_value") else value
            return json.loads(text)
        return decode_pg

    decode_column = _value_decoder(_field_type(fields_pb[0]))

    def decode_gsql(row):
        raw = row[0]
        if not hasattr(raw, "WhichOneof"):  # already plain Python (tests feed captured JSON)
            from google.protobuf import json_format, struct_pb2

            raw = json_format.ParseDict(raw, struct_pb2.Value())
        records = decode_column(raw) or []
        if not records or records[0] is None:  # a null record: malformed, as an empty one
            return {}
        record = records[0]
        out = {}
        for key in ("data_change_record", "heartbeat_record", "child_partitions_record"):
            items = record.get(key)
            if items:
                out[key] = items[0]
        return out

    return decode_gsql


def to_row(record: dict[str, Any], token: str | None, mode: PartitionMode) -> dict[str, Any]:
    """A decoded change record -> one flat row (``records`` / ``stream_records``)."""
    if mode is PartitionMode.MUTABLE:
        return from_stream_record(record, token)
    return from_change_record(record, token)


def _row_decoder(fields_pb, dialect: str, token: str | None):
    """Row (raw protobuf values) -> one flat row of ``token``'s partition; a malformed record
    raises ``RecordError`` with the decoded record as ``record`` (for the bad row's text).

    GoogleSQL's data change and heartbeat records in the immutable mode (nearly every row of a
    read) go straight from the protobuf values to the row (:func:`_fast_gsql`), without the
    nested dicts of :func:`_decoder`; every other row, and any value that is not as the doc
    says, takes the general way: :func:`_decoder`, then :func:`to_row`. Both ways give the
    same row."""
    mode = stream_mode(fields_pb)
    decode = _decoder(fields_pb, dialect)
    fast = (_fast_gsql(_field_type(fields_pb[0]), token)
            if dialect == "googlesql" and mode is PartitionMode.IMMUTABLE else None)

    def general(row):
        record = decode(row)
        try:
            return to_row(record, token, mode)
        except RecordError as e:
            e.record = record
            raise

    if fast is None:
        return general

    def row_of(row):
        raw = row[0]
        out = fast(raw) if hasattr(raw, "WhichOneof") else None
        return out if out is not None else general(row)
    return row_of


# The fields of GoogleSQL's data_change_record a row needs, with their type codes (the doc's
# table: STRING 6, TIMESTAMP 4, BOOL 1, INT64 2, JSON 11, ARRAY 8). ``_fast_gsql`` is used only
# when a result's metadata has the required ones with these types.
_DC_REQUIRED = {"commit_timestamp": 4, "record_sequence": 6, "server_transaction_id": 6,
                "table_name": 6, "mod_type": 6, "column_types": 8, "mods": 8}
_DC_OPTIONAL = {"is_last_record_in_transaction_in_partition": 1, "value_capture_type": 6,
                "number_of_records_in_transaction": 2, "number_of_partitions_in_transaction": 2,
                "transaction_tag": 6, "is_system_transaction": 1}
_MOD_FIELDS = ("keys", "new_values", "old_values")


def _struct_fields(type_pb, code: int = 9) -> dict[str, Any] | None:
    """name -> Type of a STRUCT's fields (of an ARRAY<STRUCT> when ``code`` is 8)."""
    if int(type_pb.code) != code:
        return None
    if code == 8:
        return _struct_fields(type_pb.array_element_type)
    return {f.name: _field_type(f) for f in type_pb.struct_type.fields}


def _positions(type_pb) -> dict[str, int]:
    return {f.name: i for i, f in enumerate(type_pb.struct_type.fields)}


class _GsqlLayout(NamedTuple):
    """Where the direct decoder finds each value of a GoogleSQL change record row."""

    record_width: int
    i_dc: int
    i_hb: int
    dc_width: int
    dc: tuple[int, ...]  # the positions of ``_DC_REQUIRED``'s fields, in its order
    dc_optional: tuple[int | None, ...]  # those of ``_DC_OPTIONAL``'s, None where absent
    hb_width: int
    i_hb_ts: int
    mod_width: int
    mod: tuple[int, int, int]  # keys, new_values, old_values
    column_types: Any  # the decoder of the column_types value


def _gsql_layout(column_type) -> _GsqlLayout | None:
    """The layout of a result whose metadata is the doc's shape, else None."""
    record = _struct_fields(column_type, 8)
    if record is None or "data_change_record" not in record or "heartbeat_record" not in record:
        return None
    dc, hb = _struct_fields(record["data_change_record"], 8), _struct_fields(
        record["heartbeat_record"], 8)
    if dc is None or hb is None or int(hb.get("timestamp", _NO_TYPE).code) != 4:
        return None
    if any(int(dc.get(n, _NO_TYPE).code) != c for n, c in _DC_REQUIRED.items()) or any(
            n in dc and int(dc[n].code) != c for n, c in _DC_OPTIONAL.items()):
        return None
    mod = _struct_fields(dc["mods"], 8)
    if mod is None or any(int(mod.get(n, _NO_TYPE).code) != 11 for n in _MOD_FIELDS):
        return None
    at_record = _positions(column_type.array_element_type)
    at_dc = _positions(record["data_change_record"].array_element_type)
    at_hb = _positions(record["heartbeat_record"].array_element_type)
    at_mod = _positions(dc["mods"].array_element_type)
    return _GsqlLayout(
        len(at_record), at_record["data_change_record"], at_record["heartbeat_record"],
        len(at_dc), tuple(at_dc[n] for n in _DC_REQUIRED),
        tuple(at_dc.get(n) for n in _DC_OPTIONAL), len(at_hb), at_hb["timestamp"],
        len(at_mod), tuple(at_mod[n] for n in _MOD_FIELDS), _value_decoder(dc["column_types"]))


def _text(v, required: bool = False):
    """A STRING-coded value: its text, None for null; ``_SKIP`` for any other kind (and for
    null where ``required``)."""
    s = v.string_value
    if s:
        return s
    kind = v.WhichOneof("kind")
    if kind == "string_value":
        return s
    return _SKIP if required or kind != "null_value" else None


def _flag(v):
    if v.bool_value:
        return True
    kind = v.WhichOneof("kind")
    return False if kind == "bool_value" else None if kind == "null_value" else _SKIP


def _count(v):
    s = _text(v)
    if s is None or s is _SKIP:
        return s
    try:
        return int(s)
    except ValueError:
        return _SKIP


_SCAN_JSON = json.decoder.JSONDecoder().scan_once


def _json_value(v):
    """A JSON value's object (``{}`` for null or empty, as ``records._json_object``); raises
    ValueError for bad JSON, ``_SKIP`` for a value of another kind."""
    s = v.string_value
    if not s:
        kind = v.WhichOneof("kind")
        return {} if kind == "string_value" or kind == "null_value" else _SKIP
    try:  # the C scanner without ``json.loads``'s two Python calls around it
        obj, end = _SCAN_JSON(s, 0)
    except StopIteration:
        return json.loads(s)  # leading space, or not JSON: as json.loads has it
    return obj if end == len(s) else json.loads(s)


def _first(v, width: int):
    """The first element of an ARRAY<STRUCT> value, as its list of values (None: empty or
    null, ``_SKIP``: anything else)."""
    kind = v.WhichOneof("kind")
    if kind != "list_value":
        return None if kind == "null_value" else _SKIP
    items = v.list_value.values
    if not items:
        return None
    item = items[0]
    if item.WhichOneof("kind") != "list_value":
        return _SKIP
    values = item.list_value.values
    return values if len(values) == width else _SKIP


def _types_decoder(column_types):
    """column_types value -> its canonical JSON text (``_SKIP`` if malformed), remembered for
    the texts seen last (a result's rows repeat a few)."""
    from spark_backend.model.records import _column_types_json

    seen: dict[bytes, str] = {}

    def types_text(v):
        key = v.SerializeToString()
        out = seen.get(key)
        if out is None:
            try:
                out = _column_types_json(column_types(v))
            except (AttributeError, KeyError, TypeError, ValueError):
                return _SKIP
            if len(seen) >= 1024:
                seen.clear()
            seen[key] = out
        return out
    return types_text


def _mods_decoder(width: int, i_keys: int, i_new: int, i_old: int):
    """mods value -> its canonical JSON text, ``_SKIP`` if a mod is not as the doc says."""
    from spark_backend.model.records import canonical_json

    def mods_text(v):
        kind = v.WhichOneof("kind")
        if kind != "list_value":
            return canonical_json([]) if kind == "null_value" else _SKIP
        mods = []
        for m in v.list_value.values:
            # a mod that is not a list reads as an empty one: the wrong width
            mv = m.list_value.values
            if len(mv) != width:
                return _SKIP
            keys, new, old = _json_value(mv[i_keys]), _json_value(mv[i_new]), \
                _json_value(mv[i_old])
            if keys is _SKIP or new is _SKIP or old is _SKIP:
                return _SKIP
            mods.append({"keys": keys, "new_values": new, "old_values": old})
        return canonical_json(mods)
    return mods_text


def _fast_gsql(column_type, token: str | None):
    """The direct decoder of :func:`_row_decoder` for one result's column type, or None when
    the metadata is not the doc's shape. It returns None for a row it does not take (a child
    partitions record, a null or missing value where the doc has one, anything unusual): the
    general way then decodes that row, and reports it if it is malformed."""
    from spark_backend.model.records import MOD_TYPES
    from spark_backend.model.timestamps import parse_ns

    layout = _gsql_layout(column_type)
    if layout is None:
        return None
    record_width, i_dc, i_hb, dc_width = layout[:4]
    i_ts, i_seq, i_txn, i_table, i_type, i_types, i_mods = layout.dc
    i_last, i_capture, i_records, i_parts, i_tag, i_system = layout.dc_optional
    hb_width, i_hb_ts = layout.hb_width, layout.i_hb_ts
    types_text = _types_decoder(layout.column_types)
    mods_text = _mods_decoder(layout.mod_width, *layout.mod)
    text, flag, count, first = _text, _flag, _count, _first

    def data_change(values):
        mod_type = text(values[i_type], True)
        if mod_type not in MOD_TYPES:
            return None
        try:
            row = {
                "partition_token": token, "kind": "data_change",
                "ts_ns": parse_ns(text(values[i_ts], True)),
                "record_sequence": text(values[i_seq], True),
                "server_transaction_id": text(values[i_txn], True),
                "is_last_record_in_transaction_in_partition":
                    None if i_last is None else flag(values[i_last]),
                "table_name": text(values[i_table]),
                "value_capture_type": None if i_capture is None else text(values[i_capture]),
                "column_types": types_text(values[i_types]),
                "mods": mods_text(values[i_mods]),
                "mod_type": mod_type,
                "number_of_records_in_transaction":
                    None if i_records is None else count(values[i_records]),
                "number_of_partitions_in_transaction":
                    None if i_parts is None else count(values[i_parts]),
                "transaction_tag": None if i_tag is None else text(values[i_tag]),
                "is_system_transaction": None if i_system is None else flag(values[i_system]),
            }
        except (TypeError, ValueError):  # _SKIP as a timestamp, a bad one, or bad JSON
            return None
        for value in row.values():
            if value is _SKIP:
                return None
        return row

    def fast(raw):
        record = first(raw, record_width)
        if record is None or record is _SKIP:
            return None
        values = first(record[i_dc], dc_width)
        if values is not None:
            return None if values is _SKIP else data_change(values)
        values = first(record[i_hb], hb_width)
        if values is None or values is _SKIP:
            return None
        try:
            ts_ns = parse_ns(text(values[i_hb_ts], True))
        except (TypeError, ValueError):
            return None
        return {"partition_token": token, "kind": "heartbeat", "ts_ns": ts_ns}
    return fast


class _NoType:
    code = 0


_NO_TYPE = _NoType()
_SKIP = object()  # a value the direct decoder leaves to the general way


# --- errors ----------------------------------------------------------------------------------


def _is_source_error(exc: BaseException) -> bool:
    """An error the source raised (as opposed to a bug here)."""
    from google.api_core import exceptions as gexc

    try:
        import grpc
        rpc_error: tuple = (grpc.RpcError,)
    except ImportError:  # pragma: no cover
        rpc_error = ()
    return isinstance(exc, (gexc.GoogleAPIError, *rpc_error))


def describe_error(exc: BaseException, stream: str | None = None, target=None,
                   database=None) -> str:
    """One sentence for a Spanner error (never a traceback, never credentials)."""
    from spark_backend.spanner.connect import describe_unreachable

    unreachable = describe_unreachable(exc, database)
    if unreachable:
        return unreachable
    name = type(exc).__name__
    message = getattr(exc, "message", None) or str(exc)
    message = message.splitlines()[0] if message else name
    where = f" ({target.path})" if target is not None else ""
    if name == "NotFound":
        return f"Spanner says not found{where}: {message}"
    if name in ("PermissionDenied", "Unauthenticated"):
        return (
            f"Spanner refused the credentials{where}: {message}. Run `gcloud auth "
            "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS."
        )
    if name in ("InvalidArgument", "FailedPrecondition", "OutOfRange"):
        return f"Spanner rejected the query{where}: {message}"
    return f"Spanner error {name}{where}: {message}"


def _refused(exc: BaseException) -> bool:
    return type(exc).__name__ in ("InvalidArgument", "NotFound", "FailedPrecondition")


def _mismatch(database, dialect: str) -> str | None:
    """One sentence when the database's own dialect is not ``dialect`` (None if it is, or if
    the database cannot say)."""
    try:
        own = ask_dialect(database)
    except Exception:
        return None
    if own == dialect:
        return None
    return (
        f"The database is {dialect_name(own)}-dialect but it was queried as "
        f"{dialect_name(dialect)} (--dialect {dialect}); leave --dialect out to use the "
        f"database's own dialect, or pass --dialect {own}."
    )


def _is_missing_function(exc: BaseException) -> bool:
    """PostgreSQL: ``read_json_<stream>`` does not exist (a MUTABLE_KEY_RANGE stream)."""
    message = (getattr(exc, "message", None) or str(exc)).lower()
    return _refused(exc) and "read_json_" in message and (
        "does not exist" in message or "not found" in message)


# --- reading ---------------------------------------------------------------------------------


def _params(dialect: str, token: str | None, start_ns: int, end_ns: int | None, hb: int):
    from google.cloud.spanner_v1 import param_types

    from spark_backend.model.timestamps import to_datetime

    start, end = to_datetime(start_ns), (None if end_ns is None else to_datetime(end_ns))
    if dialect == "googlesql":
        return (
            {"start_timestamp": start, "end_timestamp": end, "partition_token": token,
             "heartbeat_milliseconds": hb},
            {"start_timestamp": param_types.TIMESTAMP, "end_timestamp": param_types.TIMESTAMP,
             "partition_token": param_types.STRING, "heartbeat_milliseconds": param_types.INT64},
        )
    return (
        {"p1": start, "p2": end, "p3": token, "p4": hb},
        {"p1": param_types.TIMESTAMP, "p2": param_types.TIMESTAMP, "p3": param_types.STRING,
         "p4": param_types.INT64},
    )


class _Session:
    """A Spanner session for partition reads (created and deleted through the client API).

    A read takes one from the process's idle sessions of its database (:meth:`take`) and
    gives it back when its query ended or was cancelled (:meth:`give_back`): a Spark task
    starts and stops dozens of partition reads at each of its boundaries, and two calls to
    the source per read (create, delete) were two round trips on the way of each of them. A
    session Spanner no longer knows (deleted after an hour idle, or a server that restarted)
    is replaced when a query says so (:meth:`renew`)."""

    def __init__(self, database):
        self.api = read_api(database)
        self.database_name = database.name
        self.metadata = [("google-cloud-resource-prefix", database.name)]
        self.key = (id(database), database.name)
        self.name = self._create()

    def _create(self) -> str:
        from google.cloud.spanner_v1 import CreateSessionRequest

        return self.api.create_session(
            request=CreateSessionRequest(database=self.database_name), metadata=self.metadata,
            retry=RETRY,
        ).name

    @classmethod
    def take(cls, database) -> _Session:
        key = (id(database), database.name)
        with _IDLE_LOCK:
            idle = _IDLE_SESSIONS.get(key)
            if idle is None:  # the first read of this Database: its list goes with it
                _IDLE_SESSIONS[key] = []
                weakref.finalize(database, _IDLE_SESSIONS.pop, key, None)
            elif idle:
                return idle.pop()
        return cls(database)

    def give_back(self) -> None:
        with _IDLE_LOCK:
            idle = _IDLE_SESSIONS.get(self.key)
            if idle is not None and len(idle) < IDLE_SESSIONS_MAX:
                idle.append(self)
                return
        self.close()

    def renew(self) -> None:
        self.name = self._create()

    def close(self) -> None:
        try:
            self.api.delete_session(name=self.name, metadata=self.metadata)
        except Exception:  # the session expires on its own; nothing to lose
            pass


# (id(Database), its name) -> sessions no read is using, dropped with the Database (a
# forgotten endpoint's); at most IDLE_SESSIONS_MAX each (a task reads at most ``threads``
# partitions at once). Those left when the process ends are deleted by Spanner after an hour
# idle.
_IDLE_SESSIONS: dict[tuple[int, str], list[_Session]] = {}
_IDLE_LOCK = threading.Lock()
IDLE_SESSIONS_MAX = 128


def _session_gone(exc: BaseException) -> bool:
    """Spanner no longer knows the session (NOT_FOUND "Session not found")."""
    return type(exc).__name__ == "NotFound" and "session not found" in str(exc).lower()


def param_value(value: Any) -> Any:
    """A query parameter of ``_params`` (None, int, str, or a timestamp as
    ``DatetimeWithNanoseconds``) as the ``google.protobuf.Value`` of Spanner's wire format:
    integers and timestamps travel as strings (``ExecuteSqlRequest.params``)."""
    from google.protobuf.struct_pb2 import NULL_VALUE, Value

    if value is None:
        return Value(null_value=NULL_VALUE)
    if hasattr(value, "rfc3339"):  # DatetimeWithNanoseconds: RFC 3339, full precision
        return Value(string_value=value.rfc3339())
    if isinstance(value, int | str) and not isinstance(value, bool):
        return Value(string_value=str(value))
    raise TypeError(f"no Spanner parameter encoding for {type(value).__name__}")


def params_struct(params: dict) -> Any:
    """``params`` (name -> ``param_value``) as the request's ``Struct``."""
    from google.protobuf.struct_pb2 import Struct

    return Struct(fields={k: param_value(v) for k, v in params.items()})


def _request(session: _Session, sql: str, params: dict, types: dict):
    from google.cloud.spanner_v1 import ExecuteSqlRequest, TransactionOptions, TransactionSelector

    params_pb = params_struct(params)
    strong = TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
    return ExecuteSqlRequest(
        session=session.name, sql=sql, params=params_pb, param_types=types,
        transaction=TransactionSelector(single_use=strong),
    )


def _resumable(session: _Session, request, max_attempts: int, backoff_s: float, stats: dict):
    """PartialResultSets, resumed from the last resume token after a transient error: the one
    retry layer. At most ``max_attempts`` attempts in a row without progress; the pauses follow
    ``google.api_core.retry``'s exponential backoff (with jitter, at most 5 s). A session
    Spanner no longer knows is replaced once, before any result, without a pause. Closing
    this generator cancels the call (the session is free again)."""
    from google.api_core.retry import exponential_sleep_generator

    resume_token = b""
    buffer: list = []
    failures = 0
    renewed = False
    sleeps = exponential_sleep_generator(backoff_s, 5.0, 2.0)
    while True:
        stream = None
        try:
            request.resume_token = resume_token
            stream = session.api.execute_streaming_sql(request=request, metadata=session.metadata)
            for item in stream:
                buffer.append(item)
                if item.resume_token:
                    resume_token = item.resume_token
                    yield from buffer
                    buffer.clear()
                    if failures:
                        failures = 0
                        sleeps = exponential_sleep_generator(backoff_s, 5.0, 2.0)
            yield from buffer
            return
        except GeneratorExit:
            if stream is not None:
                stream.cancel()
            raise
        except Exception as e:
            if not renewed and not resume_token and _session_gone(e):
                renewed = True
                session.renew()
                request.session = session.name
                buffer.clear()
                continue
            if not is_transient(e) or failures + 1 >= max_attempts:
                raise
            buffer.clear()
            failures += 1
            stats["retries"] = stats.get("retries", 0) + 1
            time.sleep(next(sleeps))


def query_partition(
    database, dialect: str, stream: str, token: str | None, start_ns: int, end_ns: int | None,
    heartbeat_ms: int, *, max_attempts: int = 6, backoff_s: float = 0.2,
    stats: dict | None = None, mode: str = PartitionMode.IMMUTABLE,
) -> Iterator[dict[str, Any]]:
    """Flat rows (``records`` / ``stream_records``) of one partition query in arrival order,
    and in place of a malformed record the ``RecordError`` saying why (its ``record`` is the
    decoded record). ``mode`` picks the PostgreSQL function; ``stats["mode"]`` tells what the
    result showed."""
    from google.cloud.spanner_v1.streamed import StreamedResultSet

    stats = stats if stats is not None else {}
    sql = query_text(dialect, stream, mode)
    params, types = _params(dialect, token, start_ns, end_ns, heartbeat_ms)
    session = _Session.take(database)
    responses = None
    reusable = False
    try:
        request = _request(session, sql, params, types)
        responses = _resumable(session, request, max_attempts, backoff_s, stats)
        results = StreamedResultSet(responses, lazy_decode=True)
        decode = None
        try:
            for row in results:
                if decode is None:
                    stats["mode"] = stream_mode(results.fields)
                    decode = _row_decoder(results.fields, dialect, token)
                try:
                    out = decode(row)
                except RecordError as e:  # handed on: the rows after it are still read
                    out = e
                yield out
        except GeneratorExit:  # the reader stopped here (a task's budget): cancel the call
            reusable = True
            raise
        if decode is None and results.metadata is not None and results.fields:
            stats["mode"] = stream_mode(results.fields)
        reusable = True
    finally:
        if responses is not None:
            responses.close()
        if reusable:
            session.give_back()
        else:  # a failed query: a fresh session for the next one
            session.close()


def read_partition_rows(
    database, dialect: str | None, stream: str, token: str | None, start_ns: int, end_ns: int,
    heartbeat_ms: int, *, max_attempts: int = 6, backoff_s: float = 0.2,
) -> Iterator[dict[str, Any]]:
    """Flat record rows of one partition from ``start_ns`` to ``end_ns``, then its end row.

    ``dialect`` None: the database's own (asked once per process). Both partition modes: the
    mode comes from the first query's result; in the mutable mode (and until the mode is
    known) the partition is read in windows of at most 30 minutes, and it ends at its
    partition end record. A process that does not know the stream's mode yet learns it from an
    empty-span query first (``_probe_mode``). Never raises for the source's faults: a
    partition that keeps failing ends with a ``partition_end`` row in state ``incomplete``
    naming the error, after every row read. Rows a window or a resumed stream returns twice
    are yielded once.
    """
    given = dialect
    stats: dict = {}
    mark = start_ns
    seen_at_mark: set[tuple] = set()
    end_at: int | None = None  # the partition's end (child partitions / partition end record)
    arrival = 0
    queries = 0
    try:
        dialect = validate_dialect(dialect) if dialect is not None else ask_dialect(database)
        mode = known_mode(database, stream)
        if mode is None and token is not None:
            mode = _probe_mode(database, dialect, stream, token, start_ns, heartbeat_ms,
                               max_attempts, backoff_s, stats)
        while True:
            window_end = (end_ns if mode is PartitionMode.IMMUTABLE
                          else min(end_ns, mark + MUTABLE_WINDOW_NS))
            queries += 1
            records = _query_with_mode(database, dialect, stream, token, mark, window_end,
                                       heartbeat_ms, mode, max_attempts, backoff_s, stats)
            for row in records:
                if isinstance(row, RecordError):
                    yield bad_row(token or "(initial query)", arrival,
                                  json.dumps(row.record, default=str), str(row))
                    continue
                identity = (row["kind"], row["ts_ns"], row.get("server_transaction_id"),
                            row.get("record_sequence"))
                if row["ts_ns"] < mark or (row["ts_ns"] == mark and identity in seen_at_mark):
                    continue  # returned again by a resumed stream or the next window
                if row["ts_ns"] > mark:
                    mark, seen_at_mark = row["ts_ns"], set()
                seen_at_mark.add(identity)
                if row["kind"] in ("child_partitions", "partition_end_record"):
                    end_at = row["ts_ns"]
                arrival += 1
                row["line"] = arrival
                yield row
            mode = stats.get("mode", mode)
            if mode is not None:
                _remember_mode(database, stream, mode)
            if token is None or end_at is not None or window_end >= end_ns:
                break
            if window_end > mark:  # the window was read through to its end
                mark, seen_at_mark = window_end, set()
    except Exception as e:
        if not _is_source_error(e):
            raise
        error = (given is not None and _refused(e) and _mismatch(database, given)) or \
            describe_error(e, stream, database=database)
        yield partition_end(token, "incomplete", mark, read_from=start_ns, error=error,
                            attempts=queries, retries=stats.get("retries", 0))
        return
    if token is None:
        return
    if end_at is not None:
        yield partition_end(token, "finished", end_at, read_from=start_ns, end=end_at,
                            attempts=queries, retries=stats.get("retries", 0))
    else:
        yield partition_end(token, "open", end_ns, read_from=start_ns, attempts=queries,
                            retries=stats.get("retries", 0))



def initial_query_rows(database, dialect: str | None, stream: str, start_ns: int, end_ns: int,
                       heartbeat_ms: int, *, max_attempts: int = 6) -> list[dict[str, Any]]:
    """The rows of the initial query (NULL partition token) from ``start_ns``: the records
    naming the partitions alive then. ``SourceError`` with the source's sentence when it kept
    failing."""
    rows = list(read_partition_rows(database, dialect, stream, None, start_ns, end_ns,
                                    heartbeat_ms, max_attempts=max_attempts))
    failed = [r for r in rows if r["kind"] == "partition_end"]
    if failed:
        raise SourceError(json.loads(failed[0]["extra"]).get("error")
                          or "The initial change stream query failed.")
    return rows

def _probe_mode(database, dialect, stream, token, start_ns, heartbeat_ms, max_attempts,
                backoff_s, stats) -> PartitionMode | None:
    """The partition mode from an empty-span query (start = end, valid in both modes), so the
    real query can span the whole range in the immutable mode (its heartbeats then do not
    depend on a window). Its rows are not kept: the real query returns them again."""
    probe: dict = {}
    for _ in _query_with_mode(database, dialect, stream, token, start_ns, start_ns,
                              heartbeat_ms, None, max_attempts, backoff_s, probe):
        pass
    stats["retries"] = stats.get("retries", 0) + probe.get("retries", 0)
    mode = probe.get("mode")
    if mode is not None:
        _remember_mode(database, stream, mode)
    return mode


def _query_with_mode(database, dialect, stream, token, start_ns, end_ns, heartbeat_ms, mode,
                     max_attempts, backoff_s, stats) -> Iterator[dict[str, Any]]:
    """``query_partition`` with the partition mode settled: in PostgreSQL an unknown mode
    tries ``read_json_<stream>`` and, when the database says it does not exist, the mutable
    mode's ``read_proto_bytes_<stream>``."""
    if mode is None and dialect == "postgresql":
        try:
            first = True
            for record in query_partition(
                database, dialect, stream, token, start_ns, end_ns, heartbeat_ms,
                max_attempts=max_attempts, backoff_s=backoff_s, stats=stats,
                mode=PartitionMode.IMMUTABLE,
            ):
                first = False
                yield record
            return
        except Exception as e:
            if not (first and _is_missing_function(e)):
                raise
        mode = PartitionMode.MUTABLE
    stats.pop("mode", None)
    for record in query_partition(
        database, dialect, stream, token, start_ns, end_ns, heartbeat_ms,
        max_attempts=max_attempts, backoff_s=backoff_s, stats=stats,
        mode=mode or PartitionMode.IMMUTABLE,
    ):
        yield record
    if "mode" not in stats and mode is not None:
        stats["mode"] = mode
