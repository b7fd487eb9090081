"""The pull benchmark's server (``benchmarks/pull_throughput.py``): a query that continues a
partition at a later start, as a pull's next task does after a task's budget, sends what
Spanner would send, every record from the start on and nothing before it, wherever the start
falls among records chunked over many responses."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from spark_backend.spanner.connect import SpannerTarget, open_database
from spark_backend.spanner.reader import read_partition_rows
from tests.support.benchmarks import load_benchmark
from tests.support.demo_cache import demo_world


@pytest.mark.slow  # integration-heavy: the benchmark server encodes the full demo world
@pytest.mark.parametrize("dialect", ["googlesql", "postgresql"])
def test_a_continued_partition_gets_its_records_from_the_start_and_none_before(dialect):
    bench = load_benchmark("pull_throughput")
    world = demo_world(7)
    server = bench._bench_server(world, dialect, 0.0)
    # The partition whose records are chunked in the longest run of responses without a row
    # beginning at their start (the old server went back to the start of such a run).
    bench.encode_partitions(server, world, dialect)
    runs = {}
    for p in world.partitions:
        _, begins_in, begins_at, _ = server.ahead[p.token]
        runs[p.token] = max(b - a for a, b in zip(begins_in, begins_in[1:]))
    token = max(runs, key=runs.get)
    assert runs[token] >= 5  # a row begins 5 responses or more after the one before it
    times, begins_in, begins_at, responses = server.ahead[token]
    # Starts at rows in the middle of a response, right after a chunked run, and elsewhere.
    picks = sorted({r for r in range(1, len(times)) if begins_at[r] > 0
                    and responses[begins_in[r] - 1][0].chunked_value}
                   | set(range(1, len(times), max(1, len(times) // 15))))
    picks = [r for r in picks if times[r] > times[r - 1]]  # a start is a timestamp
    assert len(picks) >= 10
    with server:
        db = open_database(SpannerTarget("p", "i", "d", dialect, host=server.address))
        p = next(p for p in world.partitions if p.token == token)
        list(read_partition_rows(db, dialect, world.stream, token, p.start, world.end,
                                 bench.HEARTBEAT_MS))  # the whole read: learns the mode
        for r in picks:
            start = times[r]
            before = server.counters
            got = [row for row in read_partition_rows(db, dialect, world.stream, token, start,
                                                      world.end, bench.HEARTBEAT_MS)
                   if row["kind"] != "partition_end"]
            after = server.counters
            sent = after["rows"] - before["rows"]
            assert [row["ts_ns"] for row in got] == times[r:], f"from row {r}"
            # from the response in which row r begins (the reader would drop earlier rows)
            assert after["responses"] - before["responses"] == len(responses) - begins_in[r]
            assert sent == len(times) - r, f"from row {r}: {sent} rows sent, " \
                f"{len(times) - r} from the start on"


@pytest.mark.slow  # integration-heavy: the benchmark server encodes the full demo world
@pytest.mark.parametrize("dialect", ["googlesql", "postgresql"])
def test_a_pull_of_the_last_minutes_gets_exactly_the_worlds_records_from_its_start(dialect):
    """``--last-minutes``: the project pulls a world's last minutes from the same server. The
    initial query at that later start, every partition alive then and every child after,
    continued from the responses encoded ahead: the records are the world's from the start
    on, each once, and none before it."""
    from spark_backend.demo.world import parse_ts
    from spark_backend.spanner.workflow import read_partitions

    bench = load_benchmark("pull_throughput")
    world = demo_world(7)
    server = bench._bench_server(world, dialect, 0.0)
    bench.encode_partitions(server, world, dialect)
    start = world.end - 10 * 60 * 10**9
    expected = sorted((token, parse_ts(r["data_change_record"]["commit_timestamp"]),
                       r["data_change_record"]["server_transaction_id"],
                       r["data_change_record"]["record_sequence"])
                      for token, r in world.all_data_change_records()
                      if parse_ts(r["data_change_record"]["commit_timestamp"]) >= start)
    assert 0 < len(expected) < world.num_data_change_records / 2
    with server:
        db = open_database(SpannerTarget("p", "i", "d", dialect, host=server.address))
        initial = list(read_partition_rows(db, dialect, world.stream, None, start,
                                           world.end, bench.HEARTBEAT_MS))
        roots = [(c["token"], row["ts_ns"]) for row in initial
                 if row["kind"] == "child_partitions"
                 for c in json.loads(row["child_partitions"])]
        assert len(roots) == len(world.partitions_alive_at(start))
        before = server.counters
        rows = list(read_partitions(db, dialect, world.stream, roots, world.end,
                                    bench.HEARTBEAT_MS))
        queries = server.counters["queries"] - before["queries"]
    got = sorted((r["partition_token"], r["ts_ns"], r["server_transaction_id"],
                  r["record_sequence"]) for r in rows if r["kind"] == "data_change")
    assert got == expected
    ended = {r["partition_token"] for r in rows if r["kind"] == "partition_end"}
    assert queries == len(ended)  # one query per partition read: no retries


def test_last_minutes_pulls_the_worlds_end_and_reports_growth_within_the_stream(monkeypatch,
                                                                                capsys):
    """``--last-minutes``: the project side is asked for the world's last M minutes of the same
    server (its own memory trace), and the targets print the peak's growth within the stream
    next to the growth from the smaller world; a cluster row has none."""
    from spark_backend.demo.world import WORLD_DURATION

    bench = load_benchmark("pull_throughput")
    assert bench.WORLD_MINUTES * 60 * 10**9 == WORLD_DURATION
    world = {"address": "127.0.0.1:1", "stream": "S", "start": 0, "end": WORLD_DURATION}
    asked = []

    def side(role, w, args, master, trace=None):
        asked.append((role, w["start"], w["end"], master, trace))
        return {"runs": [{"rows": 500, "seconds": 2.0, "waves": 3}] * 3, "peak_mb": 1.0,
                "peak_pss_mb": 990.0, "peak_pss_kinds_mb": {"driver": 300}}

    monkeypatch.setattr(bench, "_run_side", side)
    args = SimpleNamespace(memory_trace="/tmp/m")
    row = bench._last_minutes(args, world, 20.0, 6, 1000)
    assert asked == [("project", WORLD_DURATION - 6 * 60 * 10**9, WORLD_DURATION, None,
                      "/tmp/m.last6min")]
    assert row == {"records": 500, "latency": 20.0, "spark": "local[*]", "pss_mb": 990.0,
                   "cluster": False, "part_of": 1000, "seconds": 2.0}
    with pytest.raises(SystemExit, match="spans 60 minutes"):
        bench._last_minutes(args, world, 20.0, 61, 1000)
    capsys.readouterr()
    full = {"latency": 20.0, "ratio": 8.5, "of_bound": 0.9, "spark": "local[*]"}
    bench._targets([{**full, "records": 100, "pss_mb": 900.0, "cluster": False},
                    {**full, "records": 1000, "pss_mb": 1000.0, "cluster": False},
                    {**full, "records": 1000, "pss_mb": 600.0, "cluster": True,
                     "spark": "2-worker cluster"},
                    row], [])
    out = capsys.readouterr().out
    assert "memory from 100 to 1,000 records at 20 ms" in out and "+100 MB" in out
    within = [line for line in out.splitlines() if "memory within" in line]
    assert within == ["  memory within the 1,000-record world at 20 ms, its last minutes: "
                      "500 records (2 s) 990 MB; all of it 1,000 MB (+10 MB, +1.0% from the "
                      "fewest records)"]
    assert "500 records, 20 ms, local[*]: " not in out  # a part is not a target row


def test_a_pull_whose_summary_needed_more_than_its_landings_memory_is_named(monkeypatch,
                                                                           capsys):
    """A pull's end that DuckDB refused the memory its landings had (the cache opened again
    with more: the driver's peak rises with it) is named on the row's runs line; none (or a
    limit the user set, kept throughout), nothing."""
    from spark_backend.demo.world import WORLD_DURATION

    bench = load_benchmark("pull_throughput")
    world = {"address": "127.0.0.1:1", "stream": "S", "start": 0, "end": WORLD_DURATION}
    limits = [("64MB", "64MB"), ("64MB", "1GB"), ("64MB", "64MB")]

    def side(role, w, args, master, trace=None):
        return {"runs": [{"rows": 500, "seconds": 2.0, "waves": 3, "landing_memory": land,
                          "summary_memory": m} for land, m in limits],
                "peak_mb": 1.0, "peak_pss_mb": 990.0,
                "peak_pss_kinds_mb": {"driver": 300}}

    monkeypatch.setattr(bench, "_run_side", side)
    args = SimpleNamespace(memory_trace=None)
    bench._last_minutes(args, world, 20.0, 6, 1000)
    assert ("driver 300; 1 of 3 pulls summarized their transactions at 1GB (DuckDB refused "
            "64MB)") in capsys.readouterr().out
    limits[1] = ("64MB", "64MB")
    bench._last_minutes(args, world, 20.0, 6, 1000)
    assert capsys.readouterr().out.rstrip().endswith("(MB): driver 300")
    limits[:] = [("128MB", "128MB")] * 3  # a limit the user set ($CSI_DUCKDB_MEMORY) is kept
    bench._last_minutes(args, world, 20.0, 6, 1000)
    assert capsys.readouterr().out.rstrip().endswith("(MB): driver 300")


def test_last_minutes_outside_the_worlds_hour_is_refused_in_one_sentence():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "benchmarks/pull_throughput.py", "--last-minutes",
                          "0"], capture_output=True, text=True, timeout=60, cwd=root)
    assert out.returncode == 2
    assert ("--last-minutes takes minutes between 0 and 60 (the benchmark's worlds span 60 "
            "minutes), not 0") in out.stderr
    assert "Traceback" not in out.stderr


def test_the_trace_tells_a_pulls_critical_path_through_the_parent_read_last():
    """``critical_path``: from the partition whose last response went out last, back through
    the parent read last (a merge waits for both), to the initial query; a partition read in
    two queries (a task's budget) counts from its first query to its last response; a parent
    the pull never read (it began after it) leaves the partition to the initial query. The
    initial query, the waits and the reads add up to the path's span."""
    bench = load_benchmark("pull_throughput")
    parents = {"A": (), "B": (), "C": ("A", "B"), "D": ("C",), "E": ("X",)}
    # token, queried, last response taken, responses, send s
    queries = [[None, 10.0, 11.0, 2, 0.0],
               ["A", 11.5, 20.0, 100, 1.0], ["B", 11.6, 25.0, 200, 3.0],
               ["C", 26.0, 30.0, 50, 0.0], ["D", 31.0, 33.0, 20, 0.5],
               ["D", 33.5, 40.0, 60, 0.5], ["E", 12.0, 35.0, 90, 0.0]]
    path = bench.critical_path(queries, parents, 0.02)
    assert [s["token"] for s in path["steps"]] == ["B", "C", "D"]
    b, c, d = path["steps"]
    assert b["wait_s"] == pytest.approx(0.6) and b["read_s"] == pytest.approx(13.4)
    assert c["wait_s"] == pytest.approx(1.0)  # after B, the later of its two parents
    assert (d["wait_s"], d["read_s"], d["responses"], d["queries"]) == \
        pytest.approx((1.0, 9.0, 80, 2))
    assert d["pace_s"] == pytest.approx(1.6) and d["send_s"] == pytest.approx(1.0)
    assert path["initial_s"] == pytest.approx(1.0) and path["span_s"] == pytest.approx(30.0)
    assert path["initial_s"] + sum(s["wait_s"] + s["read_s"] for s in path["steps"]) == \
        pytest.approx(path["span_s"])
    # E's parent X was never read: E hangs on the initial query
    late = bench.critical_path(queries[:1] + [["E", 12.0, 45.0, 90, 0.0]], parents, 0.02)
    assert [(s["token"], s["wait_s"]) for s in late["steps"]] == [("E", pytest.approx(1.0))]
    line = bench.path_line(path, 20.0)
    assert "30.0s from the initial query to the last response" in line
    assert "3 partitions read in 26.4s (330 responses, 6.6s at 20 ms; 4.0s of sends" in line
    assert "furthest behind the pace: B 13.4s for 4.0, D 9.0s for 1.6, C 4.0s for 1.0" in line
    at_pace = {**path, "steps": [{**s, "read_s": s["pace_s"] + 0.05} for s in path["steps"]]}
    assert "furthest behind" not in bench.path_line(at_pace, 20.0)
    assert bench.path_line({"steps": [], "span_s": 0.0}, 20.0) == \
        "the server saw no partition read"


def test_a_trace_times_each_response_until_grpc_takes_the_next_and_splits_the_pulls():
    """``ReadTrace.traced``: a response counts when gRPC asks for the next one (its send
    done); the time between is the send's wait. A pull begins at a fresh initial query, not
    at a retried one."""
    bench = load_benchmark("pull_throughput")
    now = [0.0]
    trace = bench.ReadTrace({"A": ()}, 0.02, clock=lambda: now[0])
    it = trace.traced(None, False, iter(["r1", "r2"]))
    assert next(it) == "r1"
    now[0] = 0.5  # gRPC waited 0.5 s to send r1
    assert next(it) == "r2"
    now[0] = 0.75
    assert list(it) == []
    list(trace.traced("A", False, iter(["a"])))
    list(trace.traced(None, True, iter([])))  # a retried initial query: the same pull
    list(trace.traced(None, False, iter([])))  # a new pull
    assert [[q[:4] + [round(q[4], 2)] for q in pull] for pull in trace.pulls] == [
        [[None, 0.0, 0.75, 2, 0.75], ["A", 0.75, 0.75, 1, 0.0], [None, 0.75, None, 0, 0.0]],
        [[None, 0.75, None, 0, 0.0]]]
    paths = trace.take()
    assert len(paths) == 2 and trace.pulls == []
    assert [s["token"] for s in paths[0]["steps"]] == ["A"]


@pytest.mark.slow  # integration-heavy: the benchmark server encodes the full demo world
@pytest.mark.parametrize("dialect", ["googlesql"])
def test_the_servers_trace_of_a_real_read_follows_the_worlds_partitions(dialect):
    """The benchmark's server traces what a reader really asked: each partition once, all its
    responses, and a critical path that starts at a first-generation partition and steps from
    parent to child to the partition read last."""
    from spark_backend.spanner.workflow import read_partitions

    bench = load_benchmark("pull_throughput")
    world = demo_world(7)
    server = bench._bench_server(world, dialect, 0.0)
    encoded = bench.encode_partitions(server, world, dialect)
    with server:
        db = open_database(SpannerTarget("p", "i", "d", dialect, host=server.address))
        initial = list(read_partition_rows(db, dialect, world.stream, None, world.start,
                                           world.end, bench.HEARTBEAT_MS))
        roots = [(c["token"], row["ts_ns"]) for row in initial
                 if row["kind"] == "child_partitions"
                 for c in json.loads(row["child_partitions"])]
        rows = list(read_partitions(db, dialect, world.stream, roots, world.end,
                                    bench.HEARTBEAT_MS))
    assert rows
    [queries] = server.trace.pulls
    assert sorted(q[0] for q in queries if q[0]) == sorted(p.token for p in world.partitions)
    assert all(q[3] == encoded[q[0]] for q in queries)  # every response taken, once
    [path] = server.trace.take()
    steps = path["steps"]
    parents = {p.token: p.parents for p in world.partitions}
    assert len(steps) >= 3 and parents[steps[0]["token"]] == ()
    assert all(a["token"] in parents[b["token"]] for a, b in zip(steps, steps[1:]))
    last = max((q for q in queries if q[0]), key=lambda q: q[2])
    assert steps[-1]["token"] == last[0]
    assert path["initial_s"] + sum(s["wait_s"] + s["read_s"] for s in steps) == \
        pytest.approx(path["span_s"])
