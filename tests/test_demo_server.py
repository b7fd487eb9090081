"""The demo Spanner-protocol server, driven by the unchanged google-cloud-spanner client."""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import UTC, datetime
from pathlib import Path

os.environ["SPANNER_DISABLE_BUILTIN_METRICS"] = "true"

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import spanner
from google.cloud.spanner_admin_database_v1 import DatabaseDialect
from google.cloud.spanner_v1 import param_types
from google.protobuf.json_format import MessageToDict

from spark_backend.demo.server import (
    DemoServer,
    googlesql_row_type,
    postgresql_row_type,
)
from spark_backend.demo.world import format_ts, parse_ts
from tests.support.demo_cache import demo_world

SHAPES = Path(__file__).resolve().parents[1] / "fixtures" / "emulator_shapes"
GSQL = ("SELECT ChangeRecord FROM READ_DemoStream(start_timestamp => @s, end_timestamp => @e, "
        "partition_token => @t, heartbeat_milliseconds => @h)")
PGSQL = 'SELECT * FROM "spanner"."read_json_DemoStream"($1, $2, $3, $4, null)'


@pytest.fixture(scope="module")
def world():
    return demo_world(7)


def _dt(ns):
    return None if ns is None else datetime.fromtimestamp(ns // 10**9, UTC).replace(
        microsecond=ns % 10**9 // 1000)


def _ts(v) -> str:
    return v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _gsql_to_dict(value) -> dict:
    """Client-decoded GoogleSQL ChangeRecord -> the PostgreSQL JSON shape."""
    (rec,) = value
    dcr, hb, cpr = rec
    assert sum(bool(x) for x in (dcr, hb, cpr)) == 1
    if dcr:
        (d,) = dcr
        return {"data_change_record": {
            "commit_timestamp": _ts(d[0]), "record_sequence": d[1],
            "server_transaction_id": d[2], "is_last_record_in_transaction_in_partition": d[3],
            "table_name": d[4],
            "column_types": [{"name": c[0], "type": dict(c[1]), "is_primary_key": c[2],
                              "ordinal_position": c[3]} for c in d[5]],
            "mods": [{"keys": dict(m[0]), "new_values": dict(m[1]), "old_values": dict(m[2])}
                     for m in d[6]],
            "mod_type": d[7], "value_capture_type": d[8],
            "number_of_records_in_transaction": d[9],
            "number_of_partitions_in_transaction": d[10], "transaction_tag": d[11],
            "is_system_transaction": d[12]}}
    if hb:
        return {"heartbeat_record": {"timestamp": _ts(hb[0][0])}}
    (c,) = cpr
    return {"child_partitions_record": {
        "start_timestamp": _ts(c[0]), "record_sequence": c[1],
        "child_partitions": [{"token": t, "parent_partition_tokens": list(p)} for t, p in c[2]]}}


@pytest.fixture(scope="module")
def chunky(world):
    """An ended partition of moderate size whose records include values long enough to be
    chunked across several PartialResultSets (looked for once: it reads every record)."""
    sizes = {}
    for p in world.partitions:
        records = world.records_for(p.token) if p.end is not None else []
        if any(len(json.dumps(r)) > 3000 for r in records):
            sizes[p] = len(records)
    return min(sizes, key=lambda p: abs(sizes[p] - 500))


def _canon(rec) -> str:
    return json.dumps(rec, sort_keys=True)


class Reader:
    def __init__(self, address, dialect):
        self.dialect = dialect
        client = spanner.Client(project="demo-project", credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": address})
        self.db = client.instance("demo-instance").database("demo-db")

    def query(self, token, start, end, hb, sql=None):
        if self.dialect == "googlesql":
            params = {"s": _dt(start), "e": _dt(end), "t": token, "h": hb}
            types = {"s": param_types.TIMESTAMP, "e": param_types.TIMESTAMP,
                     "t": param_types.STRING, "h": param_types.INT64}
            sql = sql or GSQL
        else:
            params = {"p1": _dt(start), "p2": _dt(end), "p3": token, "p4": hb}
            types = {"p1": param_types.TIMESTAMP, "p2": param_types.TIMESTAMP,
                     "p3": param_types.STRING, "p4": param_types.INT64}
            sql = sql or PGSQL
        with self.db.snapshot() as snap:
            rows = list(snap.execute_sql(sql, params=params, param_types=types))
        assert all(len(r) == 1 for r in rows)
        if self.dialect == "googlesql":
            return [_gsql_to_dict(r[0]) for r in rows]
        return [json.loads(json.dumps(r[0])) for r in rows]


@pytest.fixture(scope="module", params=["googlesql", "postgresql"])
def served(request, world):
    with DemoServer(world, dialect=request.param) as srv:
        yield srv, Reader(srv.address, request.param)


def test_row_types_match_the_emulator():
    g = json.loads((SHAPES / "googlesql_metadata.json").read_text())["row_type"]
    pb = googlesql_row_type()
    assert MessageToDict(pb, preserving_proto_field_name=True) == g
    pg = json.loads((SHAPES / "postgresql_metadata.json").read_text())["row_type"]
    ours = MessageToDict(postgresql_row_type("s"), preserving_proto_field_name=True)
    assert ours == pg  # the emulator capture used a stream named "s"


def test_dialect_and_initial_query(served, world):
    srv, reader = served
    want = (DatabaseDialect.POSTGRESQL if srv.dialect == "postgresql"
            else DatabaseDialect.GOOGLE_STANDARD_SQL)
    assert reader.db.database_dialect == want
    rows = reader.query(None, world.start, None, 10_000)
    assert rows == list(world.query(None, world.start, None, 10_000))
    assert [r["child_partitions_record"]["child_partitions"][0]["token"] for r in rows] == \
        [p.token for p in world.roots]


def test_partition_query_equals_world_query(served, world, chunky):
    srv, reader = served
    p = chunky  # a partition that ends (split/merge) and holds long, chunked values
    chunked_before = srv.counters["chunked"]
    got = reader.query(p.token, p.start, None, 2000)
    want = list(world.query(p.token, p.start, None, 2000))
    assert [_canon(r) for r in got] == [_canon(r) for r in want]
    assert "child_partitions_record" in got[-1]
    assert srv.counters["chunked"] - chunked_before >= 10


def test_heartbeats_at_requested_interval(served, world):
    _, reader = served
    token, t0, t1 = world.stall
    start, end = t0 - 30 * 10**9, t1 + 30 * 10**9
    rows = reader.query(token, start, end, 1000)
    assert [_canon(r) for r in rows] == \
        [_canon(r) for r in world.query(token, start, end, 1000)]
    hbs = [parse_ts(r["heartbeat_record"]["timestamp"]) for r in rows if "heartbeat_record" in r]
    assert hbs
    assert not [h for h in hbs if t0 < h < t1]  # stalled: silent
    assert t1 in hbs  # recovery
    marks = [start]
    for r in rows:
        kind, body = next(iter(r.items()))
        t = parse_ts(body.get("timestamp") or body.get("commit_timestamp"))
        if kind == "heartbeat_record" and t != t1:
            assert t - marks[-1] == 10**9  # one interval after the latest progress mark
        marks.append(t)
    assert all(b - a <= 10**9 for a, b in zip(marks, marks[1:]) if not (a <= t0 and b >= t1))


@pytest.mark.parametrize(
    ("case", "exc", "text"),
    [
        ("heartbeat", gexc.OutOfRange, "heartbeat_milliseconds must be within min 1000"),
        ("order", gexc.InvalidArgument, "start_timestamp must be <= end_timestamp"),
        ("token", gexc.InvalidArgument, "partition_token is invalid"),
        ("past", gexc.OutOfRange, "too far in the past"),
        ("stream", (gexc.InvalidArgument, gexc.NotFound), "NoSuch"),
    ],
)
def test_errors(served, world, case, exc, text):
    srv, reader = served
    root = world.roots[0].token
    args = {"heartbeat": (root, world.start, None, 10),
            "order": (root, world.start + 10**10, world.start, 1000),
            "token": ("no-such-token", world.start, None, 1000),
            "past": (None, world.start - 10**9, None, 1000),
            "stream": (None, world.start, None, 1000)}[case]
    sql = None
    if case == "stream":
        sql = (GSQL.replace("READ_DemoStream", "READ_NoSuch") if srv.dialect == "googlesql"
               else PGSQL.replace("read_json_DemoStream", "read_json_NoSuch"))
    with pytest.raises(exc) as e:
        reader.query(*args, sql=sql)
    assert text in str(e.value)


def test_positional_and_literal_forms(world):
    root = world.roots[0]
    end = root.start + 5 * 60 * 10**9
    want = [_canon(r) for r in world.query(root.token, root.start, end, 60_000)]
    with DemoServer(world, dialect="googlesql") as srv:
        reader = Reader(srv.address, "googlesql")
        sql = (f"SELECT ChangeRecord FROM READ_DemoStream(@s, @e, '{root.token}', 60000, NULL)")
        assert [_canon(r) for r in reader.query(None, root.start, end, 0, sql=sql)] == want
        sql = ("SELECT ChangeRecord FROM READ_DemoStream(start_timestamp => @s, end_timestamp => "
               "@e, partition_token => @t, heartbeat_milliseconds => @h, read_options => NULL)")
        assert [_canon(r) for r in reader.query(root.token, root.start, end, 60_000,
                                                sql=sql)] == want
    with DemoServer(world, dialect="postgresql") as srv:
        reader = Reader(srv.address, "postgresql")
        sql = (f"SELECT * FROM spanner.\"read_json_DemoStream\"('{format_ts(root.start)}', $2, "
               f"'{root.token}', 60000, NULL)")
        assert [_canon(r) for r in reader.query(None, root.start, end, 0, sql=sql)] == want


@pytest.mark.parametrize("dialect", ["googlesql", "postgresql"])
def test_cuts_are_resumed_without_loss_or_duplicates(world, chunky, dialect):
    p = chunky
    want = [_canon(r) for r in world.query(p.token, p.start, None, 5000)]
    with DemoServer(world, dialect=dialect, cut_after=3, latency_ms=0.0) as srv:
        got = [_canon(r) for r in Reader(srv.address, dialect).query(p.token, p.start, None,
                                                                     5000)]
        counters = srv.counters
    assert got == want
    assert counters["cuts"] >= 10 and counters["resumed"] == counters["cuts"]


def test_slow_partition_and_latency(world):
    root = world.roots[0]
    end = root.start + 60 * 10**9
    with DemoServer(world, slow_partition=root.token, slow_ms=30) as srv:
        reader = Reader(srv.address, "googlesql")
        t = time.perf_counter()
        rows = reader.query(root.token, root.start, end, 10_000)
        slow = time.perf_counter() - t
        n = srv.counters["responses"]
    assert rows and slow >= 0.03 * n * 0.9


def test_server_stops_cleanly(world):
    srv = DemoServer(world)
    addr = srv.start()
    assert addr.startswith("127.0.0.1:")
    reader = Reader(addr, "googlesql")
    assert reader.query(None, world.start, None, 10_000)
    srv.stop()
    srv.stop()  # idempotent
    host, port = addr.split(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2).close()


def test_the_pace_counts_from_when_the_last_response_was_due():
    """``latency_ms`` paces a query's responses one each ``latency_ms``: the server's own
    work per response (and the sleep's overshoot) comes out of the next wait instead of
    adding up over a long partition; after a reader fell behind, one response goes at once
    and the pace counts from there, never faster."""
    from spark_backend.demo import server

    clock = [100.0]
    sent = []

    def sleep(seconds):
        assert seconds > 0
        clock[0] += seconds

    pace = server._Pace(0.020, clock=lambda: clock[0], sleep=sleep)
    for work in (0.001, 0.003, 0.0, 0.002):  # each response's sending takes a while
        pace.wait()
        sent.append(round(clock[0] - 100.0, 6))
        clock[0] += work
    assert sent == [0.02, 0.04, 0.06, 0.08]  # not 0.02, 0.041, 0.064, ...
    clock[0] += 0.5  # the reader fell behind (flow control held the sends)
    back = clock[0]
    after = []
    for _ in range(3):
        pace.wait()
        after.append(round(clock[0] - back, 6))
    assert after == [0.0, 0.02, 0.04]  # one at once, then one each 20 ms again
    server._Pace(0.0, clock=lambda: clock[0], sleep=sleep).wait()  # no latency: no wait
    assert round(clock[0] - back, 6) == 0.04
