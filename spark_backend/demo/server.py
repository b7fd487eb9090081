"""A local Spanner-protocol gRPC server that serves the demo world's change stream.

The UNCHANGED google-cloud-spanner client talks to it like to the emulator
(``SPANNER_EMULATOR_HOST=127.0.0.1:PORT``, or ``client_options={"api_endpoint": host}`` with
``AnonymousCredentials()``):

* sessions (CreateSession incl. multiplexed, BatchCreateSessions, Get/List/DeleteSession),
* ExecuteStreamingSql for the read functions, in a single-use strong read-only transaction:
  GoogleSQL ``SELECT ChangeRecord FROM READ_<stream>(start_timestamp => @s, end_timestamp => @e,
  partition_token => @t, heartbeat_milliseconds => @h[, read_options => NULL])`` (named or
  positional arguments, ``@params`` or literals) and PostgreSQL
  ``SELECT * FROM "spanner"."read_json_<stream>"($1, $2, $3, $4, null)``,
* ExecuteSql / ExecuteStreamingSql for ``SELECT 1`` pings, BeginTransaction/Commit/Rollback
  (trivial), DatabaseAdmin GetDatabase (returns the dialect) / GetDatabaseDdl, InstanceAdmin
  GetInstance.

Wire shapes mirror what the Cloud Spanner emulator returns (captured in
``fixtures/emulator_shapes/``):

* GoogleSQL: one column ``ChangeRecord`` of type ``ARRAY<STRUCT<data_change_record
  ARRAY<STRUCT<...>>, heartbeat_record ARRAY<STRUCT<timestamp TIMESTAMP>>,
  child_partitions_record ARRAY<STRUCT<...>>>>`` (see :func:`googlesql_row_type`); the two
  record kinds a row does not carry are EMPTY arrays (not NULL); ``column_types.type``,
  ``mods.keys/new_values/old_values`` are JSON; INT64 values travel as decimal strings.
* PostgreSQL: one column named ``read_json_<stream>`` of type JSON with type annotation
  ``PG_JSONB``; the value is the record as compact JSON with sorted keys.

Surprises found on the emulator (documented here, mirrored or deliberately not):

* the emulator accepts ``heartbeat_milliseconds`` from 100; the doc (and this server) say 1000;
* the emulator's PostgreSQL-dialect records carry timestamps as ``...+00:00``; the doc (and
  this server) use ``...Z`` with 6 fractional digits;
* the initial (NULL token) query returns one child partitions record PER child partition,
  record_sequence "00000000", "00000001", ..., start_timestamp = the query's start, and
  ``parent_partition_tokens`` an empty array;
* a split is announced as ONE child partitions record listing all children;
* the emulator's resume token is a constant dummy; this server's tokens are real positions.

Streaming: metadata only in the first PartialResultSet; rows packed several to a response the way
a read of the past comes back (the emulator returns a finished span in one response): the count
cycles 1..``rows_per_response`` (64) so readers meet every packing; a resume token on every
response; chunked values (``chunked_value=true``): every long value (over ``max_chunk_chars``)
and, deterministically, every ``chunk_every``-th value (61) is split across responses, so the
client's chunk merging is exercised. A re-sent request with ``resume_token`` resumes right after
that response.

MUTABLE_KEY_RANGE worlds (``build_world(..., partition_mode=MUTABLE_KEY_RANGE)``): GoogleSQL
``ChangeRecord`` is of type ``PROTO`` (``proto_type_fqn`` ``google.spanner.v1.ChangeStreamRecord``)
and PostgreSQL has ``spanner.read_proto_bytes_<stream>`` (one ``BYTES`` column named after it)
instead of ``read_json_<stream>``; each value is the base64 of a serialized
``ChangeStreamRecord``; ``end_timestamp`` is required, at most 30 minutes after the start (see
``spanner/reader.py`` for where these shapes were read). Same fault knobs. Both modes answer
``SELECT option_value FROM information_schema.database_options WHERE option_name =
'database_dialect'`` (and GetDatabase's ``database_dialect``).

Fault knobs: ``latency_ms`` paces every query's responses, one each ``latency_ms`` (``_Pace``);
``cut_after=N`` aborts each attempt of a query with UNAVAILABLE after N responses (when more
remain), so a long partition read sees several cuts and the client's resume-on-UNAVAILABLE
makes progress; ``fail_partition=token`` breaks every read of that partition after its first
two responses (a partition that keeps failing); ``slow_partition=token`` adds ``slow_ms`` to
the pace of that partition's responses.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from google.cloud.spanner_admin_database_v1.types import common as _dbcommon
from google.cloud.spanner_admin_database_v1.types import spanner_database_admin as _dba
from google.cloud.spanner_admin_instance_v1.types import spanner_instance_admin as _ia
from google.cloud.spanner_v1.types import commit_response as _cr
from google.cloud.spanner_v1.types import result_set as _rs
from google.cloud.spanner_v1.types import spanner as _sp
from google.cloud.spanner_v1.types import transaction as _tx
from google.cloud.spanner_v1.types import type as _ty
from google.protobuf import empty_pb2, struct_pb2

from spark_backend.demo.world import MUTABLE_KEY_RANGE, QueryError, World, parse_ts

__all__ = [
    "DemoServer",
    "googlesql_row_type",
    "postgresql_row_type",
    "to_googlesql_value",
]

# raw protobuf classes (faster than proto-plus wrappers, and what the wire needs)
PRS = _rs.PartialResultSet.pb()
ResultSet = _rs.ResultSet.pb()
ResultSetMetadata = _rs.ResultSetMetadata.pb()
StructType = _ty.StructType.pb()
Type = _ty.Type.pb()
TC = _ty.TypeCode
Session = _sp.Session.pb()
Transaction = _tx.Transaction.pb()

# --------------------------------------------------------------------------- row types


def _t(code: Any, **kw) -> Any:
    return Type(code=int(code), **kw)


def _arr_struct(*fields: tuple[str, Any]) -> Any:
    return _t(TC.ARRAY, array_element_type=_t(
        TC.STRUCT, struct_type=StructType(fields=[StructType.Field(name=n, type_=ty)
                                                  for n, ty in fields])))


def googlesql_row_type() -> Any:
    """The emulator's row type for ``SELECT ChangeRecord FROM READ_<stream>(...)``."""
    S, J, B, INT, TS = (_t(TC.STRING), _t(TC.JSON), _t(TC.BOOL), _t(TC.INT64), _t(TC.TIMESTAMP))
    dcr = _arr_struct(
        ("commit_timestamp", TS), ("record_sequence", S), ("server_transaction_id", S),
        ("is_last_record_in_transaction_in_partition", B), ("table_name", S),
        ("column_types", _arr_struct(("name", S), ("type", J), ("is_primary_key", B),
                                     ("ordinal_position", INT))),
        ("mods", _arr_struct(("keys", J), ("new_values", J), ("old_values", J))),
        ("mod_type", S), ("value_capture_type", S), ("number_of_records_in_transaction", INT),
        ("number_of_partitions_in_transaction", INT), ("transaction_tag", S),
        ("is_system_transaction", B),
    )
    hb = _arr_struct(("timestamp", TS))
    cpr = _arr_struct(
        ("start_timestamp", TS), ("record_sequence", S),
        ("child_partitions", _arr_struct(("token", S),
                                         ("parent_partition_tokens",
                                          _t(TC.ARRAY, array_element_type=S)))),
    )
    change_record = _arr_struct(("data_change_record", dcr), ("heartbeat_record", hb),
                                ("child_partitions_record", cpr))
    return StructType(fields=[StructType.Field(name="ChangeRecord", type_=change_record)])


def mutable_row_type(dialect: str, stream: str) -> Any:
    """MUTABLE_KEY_RANGE: GoogleSQL ``ChangeRecord`` of type PROTO
    ``google.spanner.v1.ChangeStreamRecord``; PostgreSQL one BYTES column named after the
    function ``read_proto_bytes_<stream>``. Values: base64 of the serialized message."""
    if dialect == "googlesql":
        return StructType(fields=[StructType.Field(name="ChangeRecord", type_=_t(
            TC.PROTO, proto_type_fqn="google.spanner.v1.ChangeStreamRecord"))])
    return StructType(fields=[StructType.Field(name=f"read_proto_bytes_{stream}",
                                               type_=_t(TC.BYTES))])


def to_stream_record_value(rec: dict) -> str:
    """A ``ChangeStreamRecord`` dict (protobuf JSON mapping) -> its wire value: the base64 of
    the serialized message (Spanner's encoding of PROTO and BYTES values)."""
    from google.cloud.spanner_v1.types import ChangeStreamRecord
    from google.protobuf import json_format

    message = json_format.ParseDict(rec, ChangeStreamRecord.pb()())
    return base64.b64encode(message.SerializeToString()).decode()


def postgresql_row_type(stream: str) -> Any:
    """The emulator's row type for ``SELECT * FROM "spanner"."read_json_<stream>"(...)``."""
    return StructType(fields=[StructType.Field(
        name=f"read_json_{stream}",
        type_=_t(TC.JSON, type_annotation=int(_ty.TypeAnnotationCode.PG_JSONB)))])


# --------------------------------------------------------------------------- value encoding


# One encoder for every value: ``json.dumps`` with options builds one per call.
_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def _js(obj: Any) -> str:
    return _JSON.encode(obj)


def to_googlesql_value(rec: dict) -> list:
    """A PostgreSQL-shape record dict -> the GoogleSQL ``ChangeRecord`` value as nested lists
    (INT64 as strings, JSON fields as JSON text, absent record kinds as empty arrays)."""
    dcr: list = []
    hb: list = []
    cpr: list = []
    if "data_change_record" in rec:
        d = rec["data_change_record"]
        dcr = [[
            d["commit_timestamp"], d["record_sequence"], d["server_transaction_id"],
            d["is_last_record_in_transaction_in_partition"], d["table_name"],
            [[c["name"], _js(c["type"]), c["is_primary_key"], str(c["ordinal_position"])]
             for c in d["column_types"]],
            [[_js(m["keys"]), _js(m["new_values"]), _js(m["old_values"])] for m in d["mods"]],
            d["mod_type"], d["value_capture_type"], str(d["number_of_records_in_transaction"]),
            str(d["number_of_partitions_in_transaction"]), d["transaction_tag"],
            d["is_system_transaction"],
        ]]
    elif "heartbeat_record" in rec:
        hb = [[rec["heartbeat_record"]["timestamp"]]]
    else:
        c = rec["child_partitions_record"]
        cpr = [[c["start_timestamp"], c["record_sequence"],
                [[cp["token"], list(cp["parent_partition_tokens"])]
                 for cp in c["child_partitions"]]]]
    return [[dcr, hb, cpr]]


def _longest_string_path(v: Any, path: tuple = ()) -> tuple[int, tuple]:
    if isinstance(v, str):
        return len(v), path
    best = (-1, ())
    if isinstance(v, list):
        for i, x in enumerate(v):
            cand = _longest_string_path(x, (*path, i))
            if cand[0] > best[0]:
                best = cand
    return best


def _cut(v: Any, path: tuple, a: int, b: int, first: bool, last: bool) -> Any:
    """The piece of ``v`` holding characters ``[a, b)`` of the string at ``path``; ``first``
    keeps everything before the path, ``last`` everything after (chunk merge rules)."""
    if not path:
        return v[a:b]
    i = path[0]
    return ((v[:i] if first else []) + [_cut(v[i], path[1:], a, b, first, last)]
            + (v[i + 1:] if last else []))


def _chunks(v: Any, max_chars: int, force: bool) -> list:
    """Split a value into chunk pieces (a list of length 1 when it is not chunked)."""
    if isinstance(v, str):
        n, path = len(v), ()
    else:
        n, path = _longest_string_path(v)
    if n > max_chars:
        bounds = list(range(0, n, max_chars)) + [n]
    elif force and n >= 2:
        bounds = [0, n // 2, n]
    else:
        return [v]
    k = len(bounds) - 1
    return [_cut(v, path, bounds[j], bounds[j + 1], j == 0, j == k - 1) for j in range(k)]


def _to_pb_value(v: Any) -> Any:
    out = struct_pb2.Value()
    _fill_pb_value(out, v)
    return out


def _fill_pb_value(out: Any, v: Any) -> None:
    """``v`` (str, bool, None or nested lists of them) into the protobuf ``Value`` ``out``,
    element by element (faster than ``ListValue.extend``)."""
    if isinstance(v, str):
        out.string_value = v
    elif isinstance(v, list):
        values = out.list_value.values
        if not v:
            out.list_value.SetInParent()  # an empty list is still a list
        for item in v:
            _fill_pb_value(values.add(), item)
    elif v is None:
        out.null_value = struct_pb2.NULL_VALUE
    elif isinstance(v, bool):
        out.bool_value = v
    else:
        raise TypeError(f"cannot encode {type(v)}")


# --------------------------------------------------------------------------- SQL parsing

_G_RE = re.compile(
    r"^\s*SELECT\s+ChangeRecord\s+FROM\s+(READ_(\w+))\s*\((.*)\)\s*;?\s*$", re.I | re.S)
_PG_RE = re.compile(
    r'^\s*SELECT\s+\*\s+FROM\s+"?spanner"?\s*\.\s*("?)((read_json_|read_proto_bytes_)(\w+))\1'
    r"\s*\((.*)\)\s*;?\s*$",
    re.I | re.S)
_DIALECT_RE = re.compile(
    r"^\s*SELECT\s+option_value\s+FROM\s+information_schema\.database_options\s+WHERE\s+"
    r"option_name\s*=\s*'database_dialect'\s*;?\s*$", re.I)
_PING_RE = re.compile(r"^\s*SELECT\s+1\s*;?\s*$", re.I)
_G_ARGS = ("start_timestamp", "end_timestamp", "partition_token", "heartbeat_milliseconds",
           "read_options")


class _SqlError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def _split_args(text: str) -> list[str]:
    args, depth, cur, quote = [], 0, [], None
    for ch in text:
        if quote:
            cur.append(ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch == "(":
            depth += 1
            cur.append(ch)
        elif ch == ")":
            depth -= 1
            cur.append(ch)
        elif ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        args.append("".join(cur).strip())
    return args


def _param_value(name: str, request: Any) -> Any:
    if name not in request.params.fields:
        raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"No parameter found for binding: {name}")
    v = request.params.fields[name]
    kind = v.WhichOneof("kind")
    if kind == "null_value":
        return None
    if kind == "string_value":
        return v.string_value
    if kind == "number_value":
        return int(v.number_value) if v.number_value.is_integer() else v.number_value
    if kind == "bool_value":
        return v.bool_value
    return v  # list/struct (read_options) -> caller rejects


def _literal(expr: str, request: Any, pg: bool) -> Any:
    e = expr.strip()
    e = re.sub(r"::\s*[\w ]+$", "", e).strip()  # PostgreSQL casts
    m = re.match(r"^(?:TIMESTAMP|CAST\s*\()?\s*(['\"])(.*)\1(?:\s+AS\s+\w+\s*\))?$", e, re.I | re.S)
    if e.upper() == "NULL":
        return None
    if pg and re.fullmatch(r"\$\d+", e):
        return _param_value("p" + e[1:], request)
    if not pg and e.startswith("@"):
        return _param_value(e[1:], request)
    if m:
        return m.group(2)
    if re.fullmatch(r"-?\d+", e):
        return int(e)
    raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT, f"Unsupported argument expression: {e}")


def _as_ts(v: Any, arg: str) -> int | None:
    if v is None:
        return None
    try:
        return parse_ts(str(v))
    except ValueError:
        raise _SqlError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"Could not parse {v} as a TIMESTAMP. The timestamp value must end with an "
            "uppercase literal 'Z' to specify Zulu time (UTC-0).") from None


def _as_int(v: Any) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                        f"Could not parse {v} as INT64 for heartbeat_milliseconds") from None


def _line_col(sql: str, pos: int) -> str:
    line = sql.count("\n", 0, pos) + 1
    col = pos - (sql.rfind("\n", 0, pos) + 1) + 1
    return f"{line}:{col}"


# --------------------------------------------------------------------------- the server


class _LazySeq:
    """A generator materialized on demand, shareable between threads."""

    def __init__(self, gen: Iterator[Any]):
        self._gen = gen
        self._items: list[Any] = []
        self._done = False
        self._lock = threading.Lock()

    def get(self, i: int) -> Any | None:
        with self._lock:
            while len(self._items) <= i and not self._done:
                try:
                    self._items.append(next(self._gen))
                except StopIteration:
                    self._done = True
            return self._items[i] if i < len(self._items) else None


class _Query:
    __slots__ = ("end", "heartbeat_ms", "start", "token")

    def __init__(self, token, start, end, heartbeat_ms):
        self.token, self.start, self.end, self.heartbeat_ms = token, start, end, heartbeat_ms


class _Pace:
    """The times a query's responses are due: one every ``delay`` seconds, as from a source
    that produces them at a steady rate. The wait before a response counts from when the one
    before was due, not from when it went out, so the server's own work per response and the
    sleep's overshoot do not add up over a long partition (benchmarks/MEMORY.md). A reader
    that fell behind by more than a response's time gets one response at once and the pace
    then counts from there: the k-th response never goes out before start + k * ``delay``.
    ``clock`` and ``sleep`` are ``time``'s unless given (tests)."""

    def __init__(self, delay: float, clock=time.monotonic, sleep=time.sleep):
        self.delay = delay
        self.due: float | None = None
        self._clock, self._sleep = clock, sleep

    def wait(self) -> None:
        if self.delay <= 0:
            return
        now = self._clock()
        base = now if self.due is None else max(self.due, now - self.delay)
        self.due = base + self.delay
        if self.due > now:
            self._sleep(self.due - now)


class DemoServer:
    """Serve ``world`` over the Spanner gRPC API on 127.0.0.1, or on ``host`` (the address a
    remote cluster's executors reach this machine at; see module doc)."""

    def __init__(
        self,
        world: World,
        dialect: str = "googlesql",
        latency_ms: float = 0.0,
        cut_after: int | None = None,
        slow_partition: str | None = None,
        slow_ms: float = 200.0,
        fail_partition: str | None = None,
        *,
        rows_per_response: int = 64,
        max_chunk_chars: int = 1024,
        chunk_every: int = 61,
        max_workers: int = 64,
        port: int = 0,
        host: str = "127.0.0.1",
        remembered_queries: int = 32,
    ):
        dialect = dialect.lower()
        if dialect in ("postgres", "pg"):
            dialect = "postgresql"
        if dialect not in ("googlesql", "postgresql"):
            raise ValueError(f"dialect must be 'googlesql' or 'postgresql', not {dialect!r}")
        if cut_after is not None and cut_after < 1:
            raise ValueError("cut_after must be >= 1")
        self.world = world
        self.dialect = dialect
        self.latency_ms = latency_ms
        self.cut_after = cut_after
        self.slow_partition = slow_partition
        self.fail_partition = fail_partition
        self.slow_ms = slow_ms
        self.rows_per_response = max(1, rows_per_response)
        self.max_chunk_chars = max(16, max_chunk_chars)
        self.chunk_every = max(1, chunk_every)
        self._max_workers = max_workers
        self._port = port
        self._host = f"[{host}]" if ":" in host else host
        self._server: grpc.Server | None = None
        self._address: str | None = None
        self._lock = threading.Lock()
        self._sessions: dict[str, Any] = {}
        self._session_seq = 0
        self._txn_seq = 0
        self._seq_cache: OrderedDict[bytes, _LazySeq] = OrderedDict()
        self._remembered = max(1, remembered_queries)  # encoded queries kept for re-reads
        self._counters = {
            "queries": 0,  # change stream query attempts (incl. resumed ones)
            "resumed": 0,  # attempts that carried a resume token
            "cuts": 0,  # injected UNAVAILABLE aborts
            "errors": 0,  # queries rejected with a Spanner error
            "responses": 0,  # PartialResultSets sent
            "rows": 0,  # change records completed
            "chunked": 0,  # responses ending in a chunked value
            "pings": 0,  # SELECT 1
            "sessions_created": 0,
        }
        self.mutable = getattr(world, "partition_mode", None) == MUTABLE_KEY_RANGE
        if self.mutable:
            self._row_type = mutable_row_type(dialect, world.stream)
        elif dialect == "googlesql":
            self._row_type = googlesql_row_type()
        else:
            self._row_type = postgresql_row_type(world.stream)

    # ------------------------------------------------------------------ lifecycle

    @property
    def address(self) -> str | None:
        return self._address

    @property
    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    @property
    def queries_served(self) -> int:
        return self.counters["queries"]

    @property
    def cuts_injected(self) -> int:
        return self.counters["cuts"]

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counters[key] += n

    def start(self) -> str:
        if self._server is not None:
            return self._address  # type: ignore[return-value]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers,
                                       thread_name_prefix="demo-spanner"),
            options=[("grpc.so_reuseport", 0)],
        )
        server.add_generic_rpc_handlers(self._handlers())
        port = server.add_insecure_port(f"{self._host}:{self._port}")
        if not port:
            raise OSError(f"could not bind {self._host}:{self._port}")
        server.start()
        self._server = server
        self._address = f"{self._host}:{port}"
        return self._address

    def stop(self, grace: float | None = 0.5) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()
            if self._address:
                from spark_backend.spanner import connect

                connect.forget(self._address)

    def __enter__(self) -> DemoServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ gRPC plumbing

    def _handlers(self) -> tuple:
        def unary(fn, req_cls, resp_cls=None):
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=req_cls.FromString,
                response_serializer=lambda m: m.SerializeToString())

        def stream(fn, req_cls):
            return grpc.unary_stream_rpc_method_handler(
                fn, request_deserializer=req_cls.FromString,
                response_serializer=lambda m: m.SerializeToString())

        sp = {
            "CreateSession": unary(self.CreateSession, _sp.CreateSessionRequest.pb()),
            "BatchCreateSessions": unary(self.BatchCreateSessions,
                                         _sp.BatchCreateSessionsRequest.pb()),
            "GetSession": unary(self.GetSession, _sp.GetSessionRequest.pb()),
            "ListSessions": unary(self.ListSessions, _sp.ListSessionsRequest.pb()),
            "DeleteSession": unary(self.DeleteSession, _sp.DeleteSessionRequest.pb()),
            "ExecuteSql": unary(self.ExecuteSql, _sp.ExecuteSqlRequest.pb()),
            "ExecuteStreamingSql": stream(self.ExecuteStreamingSql, _sp.ExecuteSqlRequest.pb()),
            "BeginTransaction": unary(self.BeginTransaction, _sp.BeginTransactionRequest.pb()),
            "Commit": unary(self.Commit, _sp.CommitRequest.pb()),
            "Rollback": unary(self.Rollback, _sp.RollbackRequest.pb()),
        }
        dba = {
            "GetDatabase": unary(self.GetDatabase, _dba.GetDatabaseRequest.pb()),
            "GetDatabaseDdl": unary(self.GetDatabaseDdl, _dba.GetDatabaseDdlRequest.pb()),
        }
        ia = {"GetInstance": unary(self.GetInstance, _ia.GetInstanceRequest.pb())}
        return (
            grpc.method_handlers_generic_handler("google.spanner.v1.Spanner", sp),
            grpc.method_handlers_generic_handler(
                "google.spanner.admin.database.v1.DatabaseAdmin", dba),
            grpc.method_handlers_generic_handler(
                "google.spanner.admin.instance.v1.InstanceAdmin", ia),
        )

    # ------------------------------------------------------------------ sessions

    def _new_session(self, database: str, template: Any | None) -> Any:
        with self._lock:
            self._session_seq += 1
            self._counters["sessions_created"] += 1
            name = f"{database}/sessions/demo-{self._session_seq:06d}"
            s = Session(name=name)
            if template is not None:
                s.multiplexed = template.multiplexed
                s.labels.update(template.labels)
                s.creator_role = template.creator_role
            s.create_time.GetCurrentTime()
            s.approximate_last_use_time.GetCurrentTime()
            self._sessions[name] = s
            return s

    def CreateSession(self, request, context):
        return self._new_session(request.database, request.session)

    def BatchCreateSessions(self, request, context):
        resp = _sp.BatchCreateSessionsResponse.pb()()
        for _ in range(max(1, request.session_count)):
            resp.session.append(self._new_session(request.database, request.session_template))
        return resp

    def GetSession(self, request, context):
        with self._lock:
            s = self._sessions.get(request.name)
        if s is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Session not found: {request.name}")
        return s

    def ListSessions(self, request, context):
        resp = _sp.ListSessionsResponse.pb()()
        with self._lock:
            resp.sessions.extend(s for n, s in self._sessions.items()
                                 if n.startswith(request.database + "/"))
        return resp

    def DeleteSession(self, request, context):
        with self._lock:
            self._sessions.pop(request.name, None)
        return empty_pb2.Empty()

    def _check_session(self, name: str, context) -> None:
        with self._lock:
            ok = name in self._sessions
        if not ok:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Session not found: {name}")

    # ------------------------------------------------------------------ transactions (trivial)

    def _new_txn_id(self) -> bytes:
        with self._lock:
            self._txn_seq += 1
            return f"demo-txn-{self._txn_seq}".encode()

    def BeginTransaction(self, request, context):
        self._check_session(request.session, context)
        return Transaction(id=self._new_txn_id())

    def Commit(self, request, context):
        resp = _cr.CommitResponse.pb()()
        resp.commit_timestamp.GetCurrentTime()
        return resp

    def Rollback(self, request, context):
        return empty_pb2.Empty()

    # ------------------------------------------------------------------ admin

    def GetDatabase(self, request, context):
        db = _dba.Database.pb()(
            name=request.name,
            state=int(_dba.Database.State.READY),
            database_dialect=int(
                _dbcommon.DatabaseDialect.POSTGRESQL if self.dialect == "postgresql"
                else _dbcommon.DatabaseDialect.GOOGLE_STANDARD_SQL),
            version_retention_period="1h",
        )
        db.earliest_version_time.FromNanoseconds(self.world.start)
        return db

    def GetDatabaseDdl(self, request, context):
        resp = _dba.GetDatabaseDdlResponse.pb()()
        resp.statements.extend(self._ddl())
        return resp

    def GetInstance(self, request, context):
        return _ia.Instance.pb()(name=request.name, display_name="demo", node_count=1,
                                 state=int(_ia.Instance.State.READY))

    def _ddl(self) -> list[str]:
        if self.dialect == "postgresql":
            options = " WITH (partition_mode = 'MUTABLE_KEY_RANGE')" if self.mutable else ""
            return [f'CREATE CHANGE STREAM "{self.world.stream}" FOR ALL{options}']
        options = " OPTIONS (partition_mode = 'MUTABLE_KEY_RANGE')" if self.mutable else ""
        return [f"CREATE CHANGE STREAM {self.world.stream} FOR ALL{options}"]

    def _dialect_result(self) -> Any:
        """``information_schema.database_options``' database_dialect row."""
        md = ResultSetMetadata(row_type=StructType(fields=[StructType.Field(
            name="option_value", type_=_t(TC.STRING))]))
        rs = ResultSet(metadata=md)
        rs.rows.add().values.add().string_value = (
            "POSTGRESQL" if self.dialect == "postgresql" else "GOOGLE_STANDARD_SQL")
        return rs

    # ------------------------------------------------------------------ queries

    def _parse(self, request) -> _Query | None:
        """Parse a change stream query; None for ``SELECT 1``; raises _SqlError."""
        sql = request.sql
        if _PING_RE.match(sql):
            return None
        stream = self.world.stream
        if self.dialect == "googlesql":
            m = _G_RE.match(sql)
            if not m:
                raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                "The demo server only answers change stream queries "
                                "(SELECT ChangeRecord FROM READ_<stream>(...)) and SELECT 1. "
                                f"Got: {sql[:200]}")
            if m.group(2).lower() != stream.lower():
                raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                f"Table-valued function not found: {m.group(1)} "
                                f"[at {_line_col(sql, m.start(1))}]")
            vals: dict[str, Any] = {}
            for i, arg in enumerate(_split_args(m.group(3))):
                nm = re.match(r"^(\w+)\s*=>\s*(.*)$", arg, re.S)
                if nm:
                    key = nm.group(1).lower()
                    if key not in _G_ARGS:
                        raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"Named argument {nm.group(1)} not found in signature "
                                        f"for call to function {m.group(1)}")
                    vals[key] = _literal(nm.group(2), request, pg=False)
                else:
                    if i >= len(_G_ARGS):
                        raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"Too many arguments to {m.group(1)}")
                    vals[_G_ARGS[i]] = _literal(arg, request, pg=False)
        else:
            m = _PG_RE.match(sql)
            if not m:
                raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                "The demo server only answers change stream queries "
                                '(SELECT * FROM "spanner"."read_json_<stream>"(...)) and SELECT 1.'
                                f" Got: {sql[:200]}")
            name = m.group(4) if m.group(1) else m.group(4).lower()
            prefix = m.group(3).lower()
            # MUTABLE_KEY_RANGE streams have read_proto_bytes_<stream> instead of read_json_.
            wanted = "read_proto_bytes_" if self.mutable else "read_json_"
            if name != stream or prefix != wanted:
                raise _SqlError(grpc.StatusCode.NOT_FOUND,
                                "[ERROR] function spanner."
                                f"{m.group(2) if m.group(1) else m.group(2).lower()}"
                                "(timestamp with time zone, timestamp with time zone, text, "
                                "bigint, unknown) does not exist")
            args = _split_args(m.group(5))
            if len(args) != 5:
                raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                f"[ERROR] function spanner.{prefix}{name} expects 5 arguments, "
                                f"got {len(args)}")
            vals = {k: _literal(a, request, pg=True) for k, a in zip(_G_ARGS, args, strict=True)}
        if vals.get("read_options") is not None:
            raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                            "read_options is reserved for future use; the only permitted "
                            "value is NULL.")
        token = vals.get("partition_token")
        if token is not None and not isinstance(token, str):
            raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                            "partition_token must be a STRING")
        return _Query(token, _as_ts(vals.get("start_timestamp"), "start_timestamp"),
                      _as_ts(vals.get("end_timestamp"), "end_timestamp"),
                      _as_int(vals.get("heartbeat_milliseconds")))

    @staticmethod
    def _check_transaction(request) -> None:
        sel = request.transaction
        ok = (sel.WhichOneof("selector") in (None, "single_use")
              and (not sel.HasField("single_use")
                   or (sel.single_use.HasField("read_only")
                       and sel.single_use.read_only.WhichOneof("timestamp_bound")
                       in (None, "strong"))))
        if not ok:
            raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                            "Change stream queries must be strong reads executed via single use "
                            "transactions using the ExecuteStreamingSql API.")

    def _ping_result(self, request) -> Any:
        md = ResultSetMetadata(row_type=StructType(fields=[StructType.Field(
            name="", type_=_t(TC.INT64))]))
        if request.transaction.HasField("begin"):
            md.transaction.id = self._new_txn_id()
        rs = ResultSet(metadata=md)
        rs.rows.add().values.add().string_value = "1"
        self._count("pings")
        return rs

    def ExecuteSql(self, request, context):
        self._check_session(request.session, context)
        if _DIALECT_RE.match(request.sql):
            return self._dialect_result()
        try:
            q = self._parse(request)
            if q is not None:
                raise _SqlError(grpc.StatusCode.INVALID_ARGUMENT,
                                "Change stream queries must be strong reads executed via single "
                                "use transactions using the ExecuteStreamingSql API.")
        except _SqlError as e:
            self._count("errors")
            context.abort(e.code, e.message)
        return self._ping_result(request)

    def ExecuteStreamingSql(self, request, context) -> Iterator[Any]:
        self._check_session(request.session, context)
        if _DIALECT_RE.match(request.sql):
            rs = self._dialect_result()
            yield PRS(metadata=rs.metadata, values=rs.rows[0].values, resume_token=b"dialect")
            return
        try:
            q = self._parse(request)
            if q is None:
                rs = self._ping_result(request)
                yield PRS(metadata=rs.metadata, values=rs.rows[0].values,
                          resume_token=b"ping")
                return
            self._check_transaction(request)
            rows = self.world.query(q.token, q.start, q.end, q.heartbeat_ms)
        except _SqlError as e:
            self._count("errors")
            context.abort(e.code, e.message)
        except QueryError as e:
            self._count("errors")
            context.abort(getattr(grpc.StatusCode, e.code), e.message)

        qkey = self._query_key(request)
        skip = 0
        if request.resume_token:
            skip = self._decode_resume(request.resume_token, qkey, context) + 1
            self._count("resumed")
        self._count("queries")
        sent = 0
        delay = self.latency_ms / 1000.0
        if self.slow_partition is not None and q.token == self.slow_partition:
            delay += self.slow_ms / 1000.0
        pace = _Pace(delay)
        failing = self.fail_partition is not None and q.token == self.fail_partition
        for idx, (prs, n_rows) in self._response_seq(rows, qkey, skip):
            if failing and idx >= 2:
                self._count("cuts")
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "Demo server: this partition keeps failing (fail_partition)")
            if self.cut_after is not None and sent >= self.cut_after:
                self._count("cuts")
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              f"Demo server: injected stream cut after {sent} responses")
            if not self._paced(pace, n_rows, context):
                return
            if prs.chunked_value:
                self._count("chunked")
            sent += 1
            yield prs

    def _paced(self, pace: _Pace, n_rows: int, context) -> bool:
        """Wait until a response is due (``pace``) and count it; False: the client left."""
        pace.wait()
        if not context.is_active():
            return False
        self._count("responses")
        self._count("rows", n_rows)
        return True

    # ------------------------------------------------------------------ response building

    @staticmethod
    def _query_key(request) -> bytes:
        h = hashlib.blake2b(digest_size=8)
        h.update(request.sql.encode())
        h.update(request.params.SerializeToString(deterministic=True))
        return h.digest()

    @staticmethod
    def _decode_resume(token: bytes, qkey: bytes, context) -> int:
        try:
            raw = base64.b64decode(token)
            if raw[:8] != qkey:
                raise ValueError
            return int(raw[8:].decode())
        except Exception:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "Invalid resume_token: it does not belong to this query.")
            raise  # unreachable

    @staticmethod
    def _resume_token(qkey: bytes, idx: int) -> bytes:
        return base64.b64encode(qkey + str(idx).encode())

    def _response_seq(self, rows: Iterator[dict], qkey: bytes,
                      skip: int) -> Iterator[tuple[int, tuple[Any, int]]]:
        """``(index, (response, rows completed))`` from index ``skip`` on. Resumed attempts reuse
        the responses already built for the same query (small LRU), so a partition read that is
        cut every N responses stays linear."""
        with self._lock:
            seq = self._seq_cache.pop(qkey, None)
            if seq is None:
                seq = _LazySeq(self._responses(rows, qkey))
            self._seq_cache[qkey] = seq
            while len(self._seq_cache) > self._remembered:
                self._seq_cache.popitem(last=False)
        idx = skip
        while True:
            item = seq.get(idx)
            if item is None:
                return
            yield idx, item
            idx += 1

    def _responses(self, rows: Iterator[dict], qkey: bytes) -> Iterator[tuple[Any, int]]:
        """The deterministic PartialResultSet sequence of a query, with rows completed."""
        googlesql = self.dialect == "googlesql"
        idx = 0
        cur = PRS()
        cur.metadata.row_type.CopyFrom(self._row_type)
        complete = 0
        budget = 1  # rows in the current response: cycles 1..rows_per_response

        def flush(chunked: bool) -> Any:
            nonlocal cur, idx, complete, budget
            out = cur
            out.chunked_value = chunked
            out.resume_token = self._resume_token(qkey, idx)
            n = complete
            idx += 1
            cur = PRS()
            complete = 0
            budget = 1 + idx % self.rows_per_response
            return out, n

        for i, rec in enumerate(rows):
            if self.mutable:
                value = to_stream_record_value(rec)
            else:
                value = to_googlesql_value(rec) if googlesql else _js(rec)
            pieces = _chunks(value, self.max_chunk_chars,
                             force=(i % self.chunk_every == 3 % self.chunk_every))
            for j, piece in enumerate(pieces):
                cur.values.append(_to_pb_value(piece))
                if j < len(pieces) - 1:
                    yield flush(True)
            complete += 1
            if complete >= budget:
                yield flush(False)
        if len(cur.values) or idx == 0:
            yield flush(False)


def main(argv: list[str] | None = None) -> int:
    """Serve the demo world until stdin closes or SIGTERM: prints the address on stdout."""

    from spark_backend.demo.world import build_world
    from spark_backend.model import checks
    from spark_backend.model.errors import BadInput

    class Parser(argparse.ArgumentParser):
        def error(self, message: str):  # one line instead of usage + message
            self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")

    parser = Parser(prog="python -m spark_backend.demo.server")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--dialect", choices=["googlesql", "postgresql"], default="googlesql")
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--partition-mode", choices=["IMMUTABLE_KEY_RANGE", "MUTABLE_KEY_RANGE"],
                        default="IMMUTABLE_KEY_RANGE")
    args = parser.parse_args(argv)
    try:
        checks.number(args.scale, "--scale", *checks.DEMO_SCALE)
        checks.integer(args.seed, "--seed", *checks.DEMO_SEED)
        checks.number(args.latency_ms, "--latency-ms", 0.0, 60_000.0, "milliseconds")
        checks.integer(args.port, "--port", 0, 65_535)
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.port:  # asked before gRPC, whose refusal is a log line and a traceback
        import socket

        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", args.port))
        except OSError as e:
            print(f"error: the demo server cannot listen on 127.0.0.1:{args.port} "
                  f"({e.strerror or e}); give a free --port, or 0 for any.", file=sys.stderr)
            return 1
    server = DemoServer(build_world(args.seed, args.scale, args.partition_mode), args.dialect,
                        latency_ms=args.latency_ms, port=args.port)
    address = server.start()
    print(address, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
