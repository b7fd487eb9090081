"""Fixtures for the dashboard's tests: a demo cache filled through the real pull when it exists.

``demo_cache_path`` pulls the demo world with ``spark_backend.jobs.pull.run_pull`` (source
``demo``).
``land_world`` is the hand-made fallback (and the benchmark's fast path for big worlds): it turns
the demo world's recording lines into record rows and lands them with ``Cache.ingest``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pyarrow as pa

from spark_backend.cache.store import Cache
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
    try:
        cache.finish_pull(pull_id, "complete", waves=1)
    except Exception:  # an older store.finish_pull; record the range by hand
        cache.finish_pull(pull_id, "failed", waves=1)
        cache.con.execute(
            "UPDATE pulls SET status = 'complete', error = NULL WHERE pull_id = ?", [pull_id])
        cache.con.execute(
            "UPDATE streams SET range_start = make_timestamp_ns(?), "
            "range_end = make_timestamp_ns(?) WHERE stream = ?", [world.start, world.end, stream])


def pull_demo(path: str, seed: int = DEMO_SEED, scale: float = DEMO_SCALE) -> str:
    """Fill the cache at ``path`` with the demo world through ``run_pull`` (source demo).

    While the pull cannot complete (it is being written), the world is landed directly and a
    warning names the pull's error, so the dashboard's tests still check what pages show.
    """
    from spark_backend.jobs.pull import PullRequest, run_pull

    with Cache(path) as cache:
        result = run_pull(cache, PullRequest(source="demo", demo_seed=seed, demo_scale=scale))
    if result.status == "complete":
        return path
    warnings.warn(f"run_pull(source='demo') did not complete ({result.error}); "
                  "landing the demo world directly", stacklevel=2)
    Path(path).unlink(missing_ok=True)
    from spark_backend.demo.world import build_world

    with Cache(path) as cache:
        land_world(cache, build_world(seed, scale))
    return path
