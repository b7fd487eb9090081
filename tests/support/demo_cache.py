"""Fixtures for the dashboard's tests: caches to show.

``pull_demo`` fills a cache with the demo world through the real pull
(``spark_backend.jobs.pull.run_pull``, source ``demo``). ``land_world`` lands a world made in a
test (or, in the benchmarks, a big one) without Spark: it turns the world's recording lines into
record rows and lands them with ``Cache.ingest``.

``demo_world`` and ``LandedCaches`` (the session fixture ``landed_caches`` in tests/conftest.py)
keep the test process from building or landing the same demo world once per module: a world is
built once per ``(seed, scale, partition_mode)``, landed once per ``(seed, scale)`` into a
closed, checkpointed DuckDB file, and each module gets a copy of that file of its own.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pyarrow as pa

from spark_backend.cache.store import Cache
from spark_backend.demo.world import IMMUTABLE_KEY_RANGE, World, build_world
from spark_backend.model import records

DEMO_SEED = 7
DEMO_SCALE = 1.0


def land_world(cache: Cache, world, heartbeat_ms: int = 10_000, batch: int = 50_000) -> None:
    """Land a complete pull of ``world`` in ``cache`` without Spark (recording lines -> rows)."""
    stream = world.stream
    cache.ensure_stream(stream, system="spanner", source="demo", dialect="googlesql",
                        source_stream=stream, heartbeat_ms=heartbeat_ms)
    pull_id = cache.begin_pull(stream, "demo", world.start, world.end, heartbeat_ms)
    rows: list[dict] = []

    def flush() -> None:
        if rows:
            table = pa.Table.from_batches([records.to_arrow_batch(rows)])
            cache.ingest(stream, pull_id, table)
            rows.clear()

    for line in world.iter_recording(heartbeat_ms):
        token = line.pop("partition_token")
        rows.append(records.from_change_record(line, token))
        if len(rows) >= batch:
            flush()
    for p in world.partitions:
        state = "finished" if p.end is not None and p.end <= world.end else "open"
        rows.append(records.partition_end(
            p.token, state, world.end if state == "open" else p.end,
            read_from=p.start, **({"end": p.end} if state == "finished" else {}),
        ))
    flush()
    cache.finish_pull(pull_id, "complete", waves=1)


@functools.cache
def demo_world(seed: int = DEMO_SEED, scale: float = DEMO_SCALE,
               partition_mode: str = IMMUTABLE_KEY_RANGE) -> World:
    """``build_world(seed, scale, partition_mode)``, built once per test process. A World is
    read-only (frozen; its accessors return fresh copies), so modules may share it."""
    return build_world(seed, scale, partition_mode)


class LandedCaches:
    """Demo worlds landed with ``land_world`` once per test session, each into a template file
    under ``root`` that is checkpointed and closed (a single file, no write-ahead log), so a
    byte copy of it is a complete cache that a module may open read-write and change."""

    def __init__(self, root: Path):
        self._root = Path(root)
        self._templates: dict[tuple[int, float], Path] = {}

    def template(self, seed: int = DEMO_SEED, scale: float = DEMO_SCALE) -> Path:
        key = (seed, float(scale))
        if key not in self._templates:
            path = self._root / f"demo-{seed}-{float(scale)}.duckdb"
            with Cache(str(path)) as cache:
                land_world(cache, demo_world(seed, float(scale)))
                cache.con.execute("CHECKPOINT")
            wal = path.with_name(path.name + ".wal")
            assert not wal.exists(), f"{wal} left after the cache was closed"
            self._templates[key] = path
        return self._templates[key]

    def copy(self, dest: Path | str, seed: int = DEMO_SEED, scale: float = DEMO_SCALE) -> str:
        """A cache at ``dest`` holding a complete pull of ``demo_world(seed, scale)``."""
        shutil.copyfile(self.template(seed, scale), dest)
        return str(dest)


def pull_demo(path: str, seed: int = DEMO_SEED, scale: float = DEMO_SCALE) -> str:
    """Fill the cache at ``path`` with the demo world through ``run_pull`` (source demo); a
    pull that does not complete fails the test that asked for it (no cache made another way)."""
    from spark_backend.jobs.pull import PullRequest, run_pull
    from spark_backend.jobs.pull_sources import DemoSource

    with Cache(path) as cache:
        result = run_pull(cache, PullRequest(DemoSource(seed=seed, scale=scale)))
    assert result.status == "complete", f"run_pull(source='demo') ended {result.status}: " \
        f"{result.error}"
    return path
