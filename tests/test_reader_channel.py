"""What a partition read that falls behind lets the source send ahead of it, seen from the
source (the demo server counts the rows it sent): a bounded window, not what gRPC's
bandwidth probe would grow it to."""

from __future__ import annotations

import os
import time

os.environ["SPANNER_DISABLE_BUILTIN_METRICS"] = "true"

from spark_backend.demo.server import DemoServer
from spark_backend.demo.world import build_world
from spark_backend.spanner.connect import SpannerTarget, forget, open_database, read_api
from spark_backend.spanner.reader import read_partition_rows

HEARTBEAT_MS = 10_000


def test_a_read_that_falls_behind_holds_a_bounded_window_of_what_the_source_sent():
    """A Spark worker reads dozens of partitions at once; when its CPU cannot keep up, what
    each stream received ahead of its reader waits in the process's memory. With gRPC's
    bandwidth probe on (the client library's own channel) the server got ~6,000-8,000 rows
    ahead of a reader that paused (all 3,870 left of this partition); on the reads' channel
    the 64 KB stream window holds a few hundred."""
    world = build_world(seed=7, scale=2)
    root = max(world.roots, key=lambda p: len(world.records_for(p.token)))
    total = len(world.records_for(root.token))
    assert total > 4_000
    with DemoServer(world) as server:
        db = open_database(SpannerTarget("p", "i", "d", "googlesql", server.address))
        try:
            assert read_api(db) is not db.spanner_api  # local endpoint: the reads' channel
            rows = read_partition_rows(db, "googlesql", world.stream, root.token, root.start,
                                       world.end, HEARTBEAT_MS)
            read = 0
            for _ in rows:
                read += 1
                if read == 200:
                    break
            time.sleep(2.0)  # the reader falls behind; the server sends what it may
            ahead = server.counters["rows"] - read
            rows.close()
        finally:
            forget(server.address)
    assert ahead < 1_000, f"the server sent {ahead} rows ahead of the reader"
