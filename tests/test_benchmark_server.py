"""The pull benchmark's server (``benchmarks/pull_throughput.py``): a query that continues a
partition at a later start, as a pull's next task does after a task's budget, sends what
Spanner would send, every record from the start on and nothing before it, wherever the start
falls among records chunked over many responses."""

from __future__ import annotations

import pytest

from spark_backend.demo.world import build_world
from spark_backend.spanner.connect import SpannerTarget, open_database
from spark_backend.spanner.reader import read_partition_rows
from tests.support.benchmarks import load_benchmark


@pytest.mark.parametrize("dialect", ["googlesql", "postgresql"])
def test_a_continued_partition_gets_its_records_from_the_start_and_none_before(dialect):
    bench = load_benchmark("pull_throughput")
    world = build_world(seed=7)
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
