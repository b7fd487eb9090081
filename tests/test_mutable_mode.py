"""Change streams in the MUTABLE_KEY_RANGE partition mode, both dialects: the wire shapes of the
demo server, the reader against the simulator's ground truth (cuts, a slow partition), and the
whole path demo server -> Spark pull -> cache -> report and DAG -> recording round trip."""

from __future__ import annotations

import base64
import json

import pytest
from google.cloud.spanner_v1.types import ChangeStreamRecord

from spark_backend import analysis
from spark_backend.cache.store import Cache
from spark_backend.demo.server import DemoServer
from spark_backend.demo.world import MUTABLE_KEY_RANGE, QueryError
from spark_backend.jobs.files import export_recording, import_files
from spark_backend.jobs.pull import PullRequest, run_pull
from spark_backend.jobs.pull_sources import DemoSource
from spark_backend.spanner.connect import SpannerTarget, ask_dialect, open_database
from spark_backend.spanner.reader import (
    MUTABLE_WINDOW_NS,
    PartitionMode,
    known_mode,
    read_partition_rows,
)
from spark_backend.spanner.workflow import read_partitions
from tests.support.demo_cache import demo_world

HEARTBEAT_MS = 10_000
SCALE = 0.3
DIALECTS = ["googlesql", "postgresql"]


@pytest.fixture(scope="module")
def world():
    return demo_world(7, SCALE, MUTABLE_KEY_RANGE)


def truth_data(world) -> set[tuple]:
    """Every data change record of the world: (partition, commit ns, txn id, sequence)."""
    from spark_backend.model.timestamps import coerce_ns

    return {(token, coerce_ns(r["data_change_record"]["commit_timestamp"]),
             r["data_change_record"]["server_transaction_id"],
             r["data_change_record"]["record_sequence"])
            for token, r in world.all_data_change_records()}


def truth_moves(world) -> set[tuple]:
    return {(m.source, m.destination, kind, m.commit)
            for m in world.moves for kind in ("move_out", "move_in")}


# --- the world and the server speak the mode's own shapes ------------------------------------


def test_world_has_key_range_moves_and_the_mode_rules(world):
    assert len(world.moves) >= 2
    assert any(len(p.parents) > 1 for p in world.partitions)  # a merge
    # end_timestamp is required and at most 30 minutes after the start in this mode
    with pytest.raises(QueryError, match="must not be NULL"):
        world.query(None, world.start, None, HEARTBEAT_MS)
    with pytest.raises(QueryError, match="at most 30 minutes"):
        world.query(None, world.start, world.start + MUTABLE_WINDOW_NS + 1, HEARTBEAT_MS)
    (first,) = list(world.query(None, world.start, world.start, HEARTBEAT_MS))
    tokens = first["partition_start_record"]["partition_tokens"]
    assert tokens == [p.token for p in world.roots]
    ended = next(p for p in world.partitions if p.end is not None)
    records = list(world._read_through(ended.token, ended.start, HEARTBEAT_MS))
    assert "partition_end_record" in records[-1]
    assert records[-1]["partition_end_record"]["partition_token"] == ended.token
    assert "partition_start_record" in records[-2]
    move = world.moves[0]
    out = [r for r in world._read_through(move.source, world.partition(move.source).start,
                                          HEARTBEAT_MS) if "partition_event_record" in r]
    assert {e["destination_partition_token"] for r in out
            for e in r["partition_event_record"].get("move_out_events", [])} >= {
        move.destination}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_wire_shape_is_a_serialized_change_stream_record(world, dialect):
    """GoogleSQL: ChangeRecord PROTO google.spanner.v1.ChangeStreamRecord; PostgreSQL:
    read_proto_bytes_<stream> BYTES (and no read_json_<stream>); base64 values."""
    from google.cloud.spanner_v1 import (
        CreateSessionRequest,
        ExecuteSqlRequest,
        TransactionOptions,
        TransactionSelector,
        param_types,
    )
    from google.cloud.spanner_v1._helpers import _make_value_pb
    from google.protobuf.struct_pb2 import Struct

    from spark_backend.model.timestamps import to_datetime
    from spark_backend.spanner.reader import query_text

    with DemoServer(world, dialect=dialect) as server:
        db = open_database(SpannerTarget("p", "i", "d", dialect, server.address))
        api = db.spanner_api
        meta = [("google-cloud-resource-prefix", db.name)]
        session = api.create_session(request=CreateSessionRequest(database=db.name),
                                     metadata=meta).name
        names = (("start_timestamp", "end_timestamp", "partition_token",
                  "heartbeat_milliseconds") if dialect == "googlesql" else ("p1", "p2", "p3",
                                                                             "p4"))
        values = (to_datetime(world.start), to_datetime(world.start + 60 * 10**9), None,
                  HEARTBEAT_MS)
        types = (param_types.TIMESTAMP, param_types.TIMESTAMP, param_types.STRING,
                 param_types.INT64)

        def run(sql):
            return list(api.execute_streaming_sql(request=ExecuteSqlRequest(
                session=session, sql=sql,
                params=Struct(fields={n: _make_value_pb(v) for n, v in zip(names, values,
                                                                            strict=True)}),
                param_types=dict(zip(names, types, strict=True)),
                transaction=TransactionSelector(single_use=TransactionOptions(
                    read_only=TransactionOptions.ReadOnly(strong=True)))), metadata=meta))

        responses = run(query_text(dialect, world.stream, PartitionMode.MUTABLE))
        field = responses[0].metadata.row_type.fields[0]
        if dialect == "googlesql":
            assert field.name == "ChangeRecord"
            assert field.type_.code == 13  # PROTO
            assert field.type_.proto_type_fqn == "google.spanner.v1.ChangeStreamRecord"
        else:
            assert field.name == f"read_proto_bytes_{world.stream}"
            assert field.type_.code == 7  # BYTES
            with pytest.raises(Exception, match="does not exist"):
                run(query_text(dialect, world.stream, PartitionMode.IMMUTABLE))
        record = ChangeStreamRecord.deserialize(
            base64.b64decode("".join(str(v) for r in responses for v in r.values)))
        assert list(record.partition_start_record.partition_tokens) == [
            p.token for p in world.roots]


# --- the reader ------------------------------------------------------------------------------


def read_all(world, server, dialect=None) -> list[dict]:
    db = open_database(SpannerTarget("demo-project", "demo-instance", "demo-db", dialect,
                                     server.address))
    initial = list(read_partition_rows(db, dialect, world.stream, None, world.start, world.end,
                                       HEARTBEAT_MS))
    assert [r["kind"] for r in initial] == ["partition_start"]
    assert known_mode(db, world.stream) is PartitionMode.MUTABLE
    roots = [(c["token"], initial[0]["ts_ns"])
             for c in json.loads(initial[0]["child_partitions"])]
    return initial + list(read_partitions(db, dialect, world.stream, roots, world.end,
                                          HEARTBEAT_MS))


# GoogleSQL in the fast tier; PostgreSQL (the same reads, ~11 s CPU) in the full suite.
@pytest.mark.parametrize(
    "dialect", [DIALECTS[0], pytest.param(DIALECTS[1], marks=pytest.mark.slow)])
def test_reader_follows_partition_starts_with_cuts_and_a_slow_partition(world, dialect):
    """No --dialect: asked from the database; the mode from the first query; every partition
    read once from its start timestamp, every record once, key-range moves as rows."""
    slow = world.moves[0].destination
    with DemoServer(world, dialect=dialect, cut_after=20, slow_partition=slow,
                    slow_ms=2) as server:
        rows = read_all(world, server)
        assert server.cuts_injected > 10
    data = [r for r in rows if r["kind"] == "data_change"]
    got = {(r["partition_token"], r["ts_ns"], r["server_transaction_id"], r["record_sequence"])
           for r in data}
    assert len(data) == len(got) == world.num_data_change_records
    assert got == truth_data(world)
    ends = {r["partition_token"]: json.loads(r["extra"]) for r in rows
            if r["kind"] == "partition_end"}
    assert len([r for r in rows if r["kind"] == "partition_end"]) == len(world.partitions)
    for p in world.partitions:
        if p.end is None:
            assert ends[p.token]["state"] == "open"
        else:
            assert ends[p.token]["state"] == "finished" and ends[p.token]["end"] == p.end
    moves = {(r["partition_token"], r["ts_ns"], d)
             for r in rows if r["kind"] == "partition_event"
             for d in json.loads(r["extra"])["move_out"]}
    assert moves == {(m.source, m.commit, m.destination) for m in world.moves}


def test_explicit_wrong_dialect_is_one_sentence_naming_the_database_dialect(world):
    with DemoServer(world, dialect="postgresql") as server:
        db = open_database(SpannerTarget("p", "i", "d", "googlesql", server.address))
        assert ask_dialect(db) == "postgresql"
        rows = list(read_partition_rows(db, "googlesql", world.stream, None, world.start,
                                        world.end, HEARTBEAT_MS))
    (end,) = rows
    error = json.loads(end["extra"])["error"]
    assert error.startswith("The database is PostgreSQL-dialect but it was queried as GoogleSQL")
    assert "\n" not in error and "Traceback" not in error


# --- the whole path --------------------------------------------------------------------------


@pytest.fixture(scope="module", params=DIALECTS)
def mutable_pull(request, spark, world, tmp_path_factory):
    dialect = request.param
    path = tmp_path_factory.mktemp(f"mutable-{dialect}") / "m.duckdb"
    cache = Cache(path)
    with DemoServer(world, dialect=dialect, cut_after=7, latency_ms=0.5,
                    slow_partition=world.stall[0], slow_ms=3) as server:
        result = run_pull(cache, PullRequest(
            DemoSource(host=server.address, dialect=dialect, scale=SCALE),
            heartbeat_ms=HEARTBEAT_MS))
        cuts = server.cuts_injected
    yield cache, result, cuts, path
    cache.close()


@pytest.mark.slow  # a pull through Spark
def test_pull_equals_ground_truth(mutable_pull, world):
    cache, result, cuts, _ = mutable_pull
    assert result.status == "complete", result.error
    assert cuts > 0
    got = set(cache.con.execute(
        "SELECT partition_token, epoch_ns(commit_timestamp), server_transaction_id, "
        "record_sequence FROM data_change_records WHERE stream = 'DemoStream'").fetchall())
    assert got == truth_data(world)
    assert analysis.duplicates(cache.con, "DemoStream") == 0
    edges = set(cache.con.execute(
        "SELECT parent, child FROM edges WHERE stream = 'DemoStream'").fetchall())
    assert edges == set(world.edges)
    states = dict(cache.con.execute(
        "SELECT token, state FROM partitions WHERE stream = 'DemoStream'").fetchall())
    assert states == {p.token: ("finished" if p.end is not None else "open")
                      for p in world.partitions}
    txns = analysis.transactions(cache.con, "DemoStream")
    assert len(txns) == len(world.transactions) and txns["complete"].all()


@pytest.mark.slow  # a pull through Spark
def test_dag_draws_key_range_moves_and_report_works(mutable_pull, world):
    cache, _, _, _ = mutable_pull
    edges = analysis.edges(cache.con, "DemoStream")
    moves = {(r.parent, r.child, r.kind, r.ts_ns) for r in edges.itertuples()
             if r.kind in ("move_in", "move_out")}
    assert moves == truth_moves(world)
    kinds = set(edges["kind"])
    assert {"root", "split", "merge", "move_in", "move_out"} <= kinds
    report = analysis.build_report(cache.con, "DemoStream")
    assert len(report["partitions"]) == len(world.partitions)
    records = analysis.summary(cache.con, "DemoStream")["records"]
    assert records["partition_event"] == 2 * len(world.moves)
    assert records["partition_end"] == sum(p.end is not None for p in world.partitions)
    token, stall_from, stall_to = world.stall
    gaps = analysis.heartbeat_gaps(cache.con, "DemoStream")
    stall = gaps[gaps["partition"] == token].iloc[0]
    assert stall["from_ns"] <= stall_from and stall["to_ns"] >= stall_to
    # The figure draws one dotted segment per move, at its commit timestamp, source lane to
    # destination lane.
    from spark_backend.analysis import dag_layout, figures

    nodes = dag_layout.layout(analysis.partitions(cache.con, "DemoStream"))
    segments = dag_layout.edge_segments(nodes, edges)
    drawn = segments[segments["kind"] == dag_layout.KEY_RANGE_MOVE]
    lane = dict(zip(nodes["token"], nodes["lane"], strict=True))
    assert {(r.x0_ns, r.y0, r.y1) for r in drawn.itertuples()} == {
        (m.commit, lane[m.source], lane[m.destination]) for m in world.moves}
    fig = figures.dag_figure(nodes, segments)
    trace = next(t for t in fig.data if t.name.startswith(dag_layout.KEY_RANGE_MOVE))
    assert trace.name == f"{dag_layout.KEY_RANGE_MOVE} ({len(world.moves)})"
    assert sum(1 for y in trace.y if y == y) == 2 * len(world.moves)  # two points per segment
    assert dag_layout.to_svg(nodes, segments).count('stroke="#e37400"') == len(world.moves)


@pytest.mark.slow  # a pull through Spark
def test_recording_round_trip(mutable_pull, spark, tmp_path, world):
    cache, _, _, _ = mutable_pull
    out = tmp_path / "mutable.jsonl"
    lines = export_recording(cache, "DemoStream", out)
    first = json.loads(out.read_text().splitlines()[0])
    assert first["partition_token"] is None and "partition_start_record" in first
    assert any("partition_event_record" in line for line in out.read_text().splitlines())
    assert lines > world.num_data_change_records
    other = Cache(tmp_path / "replay.duckdb")
    result = import_files(other, "Replay", "recording", [str(out)])
    assert result.bad == 0
    for table, cols in (("data_change_records", "partition_token, epoch_ns(commit_timestamp), "
                                                "server_transaction_id, record_sequence, mod_type"),
                        ("mods", "record_key, mod_index, keys, new_values, old_values"),
                        ("partition_records", "partition_token, kind, timestamp, "
                                              "partition_tokens, move_in, move_out"),
                        ("heartbeats", "partition_token, timestamp")):
        sql = f"SELECT {cols} FROM {table} WHERE stream = ?"
        a = set(cache.con.execute(sql, ["DemoStream"]).fetchall())
        b = set(other.con.execute(sql, ["Replay"]).fetchall())
        assert a == b, table
    again = tmp_path / "again.jsonl"
    export_recording(other, "Replay", again)
    assert again.read_text() == out.read_text()
    other.close()
