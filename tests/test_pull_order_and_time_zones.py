"""The pull's promises that faults and the host's clock settings must not break:
a merge child is read only after every parent is known and finished, a failed pull says how many
partitions failed and what was kept, and a pull extended without --start works in any time zone.
"""

from __future__ import annotations

import os
import time

import pytest

from spark_backend.cache.store import Cache
from spark_backend.demo.server import DemoServer
from spark_backend.demo.world import DEMO_STREAM, build_world
from spark_backend.jobs.pull import PullRequest, PullTuning, run_pull
from spark_backend.jobs.pull_sources import DemoSource, SpannerSource
from spark_backend.model import config
from tests.test_pull_demo import _descendants, cached_records, truth_records

pytestmark = pytest.mark.slow  # Spark in this process, or in the processes it starts

SMALL = 0.3


def _merge_below_a_failure(world) -> tuple[str, str, str]:
    """(bad, hidden parent, merge child): the merge child has a parent ``hidden`` that only
    ``bad`` announces, and another parent that does not depend on ``bad`` at all, so the child
    becomes known while one of its parents is not."""
    parents: dict[str, set] = {}
    for p, c in world.edges:
        parents.setdefault(c, set()).add(p)
    for child, ps in sorted(parents.items()):
        if len(ps) < 2:
            continue
        for hidden in sorted(p for p in ps if p):
            for bad in sorted(p for p in parents.get(hidden, ()) if p):
                below = _descendants(world, bad)
                if any(q not in below and q != bad for q in ps if q):
                    return bad, hidden, child
    raise AssertionError("the demo world has no merge below a failure point")


def test_no_child_is_read_before_all_its_parents_finished(spark, tmp_path):
    world = build_world(scale=SMALL)
    bad, hidden, child = _merge_below_a_failure(world)
    cache = Cache(tmp_path / "order.duckdb")
    result = run_pull(cache, PullRequest(DemoSource(scale=SMALL, faults={"fail_partition": bad}),
                                         tuning=PullTuning(max_attempts=2)))
    assert result.status == "failed" and result.failed_partition == bad
    states = dict(cache.con.execute(
        "SELECT token, state FROM partitions WHERE stream = ?", [DEMO_STREAM]).fetchall())
    # The merge child is known (its other parent announced it) but was not read.
    assert states.get(child) == "pending"
    assert hidden not in states  # only the failed partition would have announced it
    assert cache.con.execute(
        "SELECT count(*) FROM data_change_records WHERE partition_token = ?",
        [child]).fetchone()[0] == 0
    # The invariant, for every partition: read at all => every parent known and finished.
    read_too_early = cache.con.execute(
        """SELECT DISTINCT e.child FROM edges e
           JOIN partitions c ON c.stream = e.stream AND c.token = e.child
           LEFT JOIN partitions p ON p.stream = e.stream AND p.token = e.parent
           WHERE e.stream = ? AND e.parent IS NOT NULL AND c.state <> 'pending'
             AND (p.token IS NULL OR p.state <> 'finished')""", [DEMO_STREAM]).fetchall()
    assert read_too_early == []
    # The message counts honestly: one failed, what was kept, what is left.
    assert result.error.startswith(f"Partition {bad} failed after retries")
    pending = sum(1 for s in states.values() if s == "pending")
    assert f"{pending} partitions that follow them were not read yet" in result.error
    assert "everything else was read" not in result.error
    cache.close()


@pytest.mark.parametrize("tz", ["Asia/Tokyo", "America/New_York"])
def test_extension_without_start_in_any_time_zone(spark, tmp_path, monkeypatch, tz):
    """A Cloud Spanner pull extended without --start (what a live refresh does) starts where
    the cache's range starts, whatever the host's time zone."""
    world = build_world(scale=SMALL)
    mid = world.start + (world.end - world.start) // 2
    server = DemoServer(world, dialect="googlesql")
    host = server.start()
    monkeypatch.setenv(config.EMULATOR_HOST_ENVVAR, host)
    source = SpannerSource("demo-project", "demo-instance", "demo-db", DEMO_STREAM)
    cache = Cache(tmp_path / "tz.duckdb")
    try:
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        first = run_pull(cache, PullRequest(source, start=world.start, end=mid))
        assert first.status == "complete", first.error
        second = run_pull(cache, PullRequest(source, end=world.end))
        assert second.status == "complete", second.error
        assert cache.cached_range(DEMO_STREAM) == (world.start, world.end)
        data = {r for r in cached_records(cache, DEMO_STREAM) if r[1] == "data_change"}
        assert data == {r for r in truth_records(world) if r[1] == "data_change"}
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
        server.stop()
        cache.close()
    assert os.environ.get("TZ") is None
