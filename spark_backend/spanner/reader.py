"""Reading a Spanner change stream partition with google-cloud-spanner.

The query workflow of the reference doc: single-use strong read-only transactions running
``READ_<stream>`` (GoogleSQL) or ``spanner.read_json_<stream>`` (PostgreSQL) with bound, typed
parameters. Rows arrive through the client's own ``StreamedResultSet`` (chunk merging) with
``lazy_decode`` and are decoded here straight from the protobuf values into named fields, which
is several times faster than the client's full decode. The stream of PartialResultSets is
resumed from the last resume token after transient errors, a bounded number of times.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

from spark_backend.model import config
from spark_backend.model.errors import BadInput
from spark_backend.model.records import RecordError, bad_row, from_change_record, partition_end
from spark_backend.spanner.connect import validate_dialect

_STREAM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")

GOOGLESQL_QUERY = (
    "SELECT ChangeRecord FROM READ_{stream} ("
    "start_timestamp => @start_timestamp, end_timestamp => @end_timestamp, "
    "partition_token => @partition_token, heartbeat_milliseconds => @heartbeat_milliseconds)"
)
POSTGRESQL_QUERY = 'SELECT * FROM "spanner"."read_json_{stream}" ($1, $2, $3, $4, null)'


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


def query_text(dialect: str, stream: str) -> str:
    validate_stream_name(stream)
    template = GOOGLESQL_QUERY if validate_dialect(dialect) == "googlesql" else POSTGRESQL_QUERY
    return template.format(stream=stream)


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


def _decoder(fields_pb, dialect: str):
    """Row (raw protobuf values) -> the change record dict in the doc's PostgreSQL JSON shape."""
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
        if not records:
            return {}
        record = records[0]
        out = {}
        for key in ("data_change_record", "heartbeat_record", "child_partitions_record"):
            items = record.get(key)
            if items:
                out[key] = items[0]
        return out

    return decode_gsql


# --- reading ---------------------------------------------------------------------------------

TRANSIENT_ERRORS = (
    "ServiceUnavailable", "Aborted", "DeadlineExceeded", "InternalServerError", "Cancelled",
    "ResourceExhausted",
)


def _is_source_error(exc: BaseException) -> bool:
    """An error the source raised (as opposed to a bug here)."""
    from google.api_core import exceptions as gexc

    try:
        import grpc
        rpc_error: tuple = (grpc.RpcError,)
    except ImportError:  # pragma: no cover
        rpc_error = ()
    return isinstance(exc, (gexc.GoogleAPIError, *rpc_error))


def _is_transient(exc: BaseException) -> bool:
    return type(exc).__name__ in TRANSIENT_ERRORS


def describe_error(exc: BaseException, stream: str | None = None, target=None) -> str:
    """One sentence for a Spanner error (never a traceback, never credentials)."""
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
    """One Spanner session for a partition read (created and deleted through the client API)."""

    def __init__(self, database):
        from google.cloud.spanner_v1 import CreateSessionRequest

        self.api = database.spanner_api
        self.metadata = [("google-cloud-resource-prefix", database.name)]
        self.name = self.api.create_session(
            request=CreateSessionRequest(database=database.name), metadata=self.metadata
        ).name

    def close(self) -> None:
        try:
            self.api.delete_session(name=self.name, metadata=self.metadata)
        except Exception:  # the session expires on its own; nothing to lose
            pass


def _request(session: _Session, sql: str, params: dict, types: dict):
    from google.cloud.spanner_v1 import ExecuteSqlRequest, TransactionOptions, TransactionSelector
    from google.cloud.spanner_v1._helpers import _make_value_pb
    from google.protobuf.struct_pb2 import Struct

    params_pb = Struct(fields={k: _make_value_pb(v) for k, v in params.items()})
    strong = TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
    return ExecuteSqlRequest(
        session=session.name, sql=sql, params=params_pb, param_types=types,
        transaction=TransactionSelector(single_use=strong),
    )


def _resumable(session: _Session, request, max_attempts: int, backoff_s: float, stats: dict):
    """PartialResultSets, resumed from the last resume token after a transient error."""
    resume_token = b""
    buffer: list = []
    failures = 0
    while True:
        try:
            request.resume_token = resume_token
            for item in session.api.execute_streaming_sql(
                request=request, metadata=session.metadata
            ):
                buffer.append(item)
                if item.resume_token:
                    resume_token = item.resume_token
                    yield from buffer
                    buffer.clear()
                    failures = 0
            yield from buffer
            return
        except Exception as e:
            if not _is_transient(e) or failures + 1 >= max_attempts:
                raise
            buffer.clear()
            failures += 1
            stats["retries"] = stats.get("retries", 0) + 1
            time.sleep(min(backoff_s * (2 ** (failures - 1)), 5.0))


def query_partition(
    database, dialect: str, stream: str, token: str | None, start_ns: int, end_ns: int | None,
    heartbeat_ms: int, *, max_attempts: int = 6, backoff_s: float = 0.2,
    stats: dict | None = None,
) -> Iterator[dict[str, Any]]:
    """Change records of one partition query, in the doc's JSON shape, in arrival order."""
    from google.cloud.spanner_v1.streamed import StreamedResultSet

    stats = stats if stats is not None else {}
    sql = query_text(dialect, stream)
    params, types = _params(dialect, token, start_ns, end_ns, heartbeat_ms)
    session = _Session(database)
    try:
        request = _request(session, sql, params, types)
        results = StreamedResultSet(
            _resumable(session, request, max_attempts, backoff_s, stats), lazy_decode=True
        )
        decode = None
        for row in results:
            if decode is None:
                decode = _decoder(results.fields, dialect)
            yield decode(row)
    finally:
        session.close()


def read_partition_rows(
    database, dialect: str, stream: str, token: str | None, start_ns: int, end_ns: int,
    heartbeat_ms: int, *, max_attempts: int = 6, backoff_s: float = 0.2,
) -> Iterator[dict[str, Any]]:
    """Flat record rows of one partition from ``start_ns`` to ``end_ns``, then its end row.

    Never raises for the source's faults: a partition that keeps failing ends with a
    ``partition_end`` row in state ``incomplete`` naming the error, after every row read.
    A restarted query resumes at the last progress mark and skips what it already yielded.
    """
    seen_at_mark: set[tuple] = set()
    mark = start_ns
    child_start: int | None = None
    arrival = 0
    attempts = 0
    stats: dict = {}
    while True:
        attempts += 1
        try:
            for record in query_partition(
                database, dialect, stream, token, mark, end_ns, heartbeat_ms,
                max_attempts=max_attempts, backoff_s=backoff_s, stats=stats,
            ):
                try:
                    row = from_change_record(record, token)
                except RecordError as e:
                    yield bad_row(token or "(initial query)", arrival, json.dumps(record,
                                  default=str), str(e))
                    continue
                identity = (row["kind"], row["ts_ns"], row.get("server_transaction_id"),
                            row.get("record_sequence"))
                if row["ts_ns"] < mark or (row["ts_ns"] == mark and identity in seen_at_mark):
                    continue  # re-read after a restart
                if row["ts_ns"] > mark:
                    mark, seen_at_mark = row["ts_ns"], set()
                seen_at_mark.add(identity)
                if row["kind"] == "child_partitions":
                    child_start = row["ts_ns"]
                arrival += 1
                row["line"] = arrival
                yield row
            break
        except Exception as e:
            if not _is_source_error(e):
                raise
            retryable = _is_transient(e)
            if not retryable or attempts >= 3:
                yield partition_end(
                    token, "incomplete", mark, read_from=start_ns,
                    error=describe_error(e, stream), attempts=attempts,
                    retries=stats.get("retries", 0),
                )
                return
            time.sleep(backoff_s * attempts)
    if token is None:
        return
    if child_start is not None:
        yield partition_end(token, "finished", child_start, read_from=start_ns, end=child_start,
                            attempts=attempts, retries=stats.get("retries", 0))
    else:
        yield partition_end(token, "open", end_ns, read_from=start_ns, attempts=attempts,
                            retries=stats.get("retries", 0))
