"""Pull orchestration: read a time range of a change stream through Spark into the cache.

The query workflow of the reference doc, wave by wave: the initial query (NULL token) runs on
the driver and names the first partitions; each wave reads every partition that can be read now
(a child with several parents only once all of them finished) in parallel, one Spark task per
partition, from its start to the range end; each wave lands in the cache in one transaction.
The cache remembers every partition's state, so a pull that stopped half-way (a crash, a
failing partition) is resumed by pulling again, and a later end reads only the new span.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_backend.cache.store import Cache
from spark_backend.model import config
from spark_backend.model.enums import PartitionState, Source, values
from spark_backend.model.errors import BadInput, InspectorError, PullFailed, SourceError
from spark_backend.model.records import to_arrow_batch
from spark_backend.model.timestamps import TimestampError, coerce_ns, format_ns, now_ns
from spark_backend.spanner.connect import (
    SpannerTarget,
    open_database,
    validate_dialect,
    with_database_dialect,
)
from spark_backend.spanner.reader import (
    read_partition_rows,
    validate_heartbeat,
    validate_stream_name,
)

SOURCES = values(Source)


@dataclass
class PullRequest:
    source: str
    stream: str | None = None            # name in the cache (default: the source stream)
    source_stream: str | None = None     # the change stream's name at the source
    project: str | None = None
    instance: str | None = None
    database: str | None = None
    dialect: str | None = None            # None: the database's own (asked); given: overrides
    start: str | int | None = None
    end: str | int | None = None
    heartbeat_ms: int = config.DEFAULT_HEARTBEAT_MS
    spark_master: str | None = None
    spark_remote: str | None = None
    demo_seed: int = 7
    demo_scale: float = 1.0
    demo_faults: dict[str, Any] = field(default_factory=dict)
    demo_host: str | None = None         # an already running demo server (the dashboard's)
    emulator_seconds: float = 20.0
    max_attempts: int = 6
    threads_per_task: int = 8


@dataclass
class PullProgress:
    wave: int
    partitions_done: int
    partitions_total: int
    records: int
    message: str


@dataclass
class PullResult:
    stream: str
    status: str                    # complete | failed | nothing-to-do
    records: int = 0
    waves: int = 0
    partitions_read: int = 0
    error: str | None = None
    failed_partition: str | None = None
    pull_id: int | None = None
    seconds: float = 0.0


@dataclass
class _Source:
    target: SpannerTarget
    source_stream: str
    default_start_ns: int | None
    default_end_ns: int | None
    location: str


def _validated(request: PullRequest) -> PullRequest:
    if request.source not in SOURCES:
        raise BadInput(
            f"Unknown source {request.source!r}; accepted sources are {', '.join(SOURCES)}.",
            field="source",
        )
    if request.dialect is not None:
        validate_dialect(request.dialect)
    validate_heartbeat(request.heartbeat_ms)
    if request.source_stream is not None:
        validate_stream_name(request.source_stream)
    if request.source == "spanner":
        missing = [n for n in ("project", "instance", "database", "source_stream")
                   if not getattr(request, n)]
        if missing:
            flags = ", ".join("--stream" if m == "source_stream" else f"--{m}" for m in missing)
            at_fault = "stream" if missing[0] == "source_stream" else missing[0]
            raise BadInput(f"The spanner source needs {flags}.", field=at_fault)
    for label in ("start", "end"):
        value = getattr(request, label)
        if value is not None:
            try:
                setattr(request, label, coerce_ns(value))
            except TimestampError as e:
                raise BadInput(f"--{label}: {e}.", field=label) from e
    if request.start is not None and request.end is not None and request.start > request.end:
        raise BadInput(
            f"--start {format_ns(request.start)} is after --end {format_ns(request.end)}; "
            "the start must be before or at the end.", field="start",
        )
    if request.start is not None and request.source != "demo" and request.start > now_ns() + 1e9:
        raise BadInput(
            f"--start {format_ns(request.start)} is in the future; change streams can only be "
            "read from the past (within the retention period).", field="start",
        )
    return request


@contextlib.contextmanager
def _open_source(request: PullRequest) -> Iterator[_Source]:
    """Start what the source needs (demo server, emulator) and stop it afterwards."""
    if request.source == "demo":
        from spark_backend.demo.server import DemoServer
        from spark_backend.demo.world import DEMO_STREAM, build_world

        world = build_world(seed=request.demo_seed, scale=request.demo_scale)
        server = None
        if request.demo_host:
            host = request.demo_host
        else:
            server = DemoServer(world, dialect=request.dialect or "googlesql",
                                **request.demo_faults)
            host = server.start()
        try:
            target = SpannerTarget("demo-project", "demo-instance", "demo-db", request.dialect,
                                   host)
            yield _Source(target, request.source_stream or DEMO_STREAM, world.start,
                          world.end, f"demo world seed={request.demo_seed} "
                          f"scale={request.demo_scale}")
        finally:
            if server is not None:
                server.stop()
        return
    if request.source == "emulator":
        from spark_backend.demo import emulator

        try:
            world = emulator.start_emulator_world(dialect=request.dialect or "googlesql",
                                                  churn_seconds=2)
        except emulator.EmulatorNotInstalled as e:
            raise SourceError(str(e)) from e
        except (emulator.EmulatorStartError, emulator.EmulatorProvisionError) as e:
            raise SourceError(f"The Cloud Spanner emulator did not start: {e}") from e
        try:
            with world.workload(seed=request.demo_seed):
                target = SpannerTarget(world.project, world.instance, world.database,
                                       request.dialect, world.host)
                start = int(world.created_at.timestamp() * 1e9)
                end = start + int(request.emulator_seconds * 1e9)
                yield _Source(target, world.stream, start, end,
                              f"local emulator {world.project}/{world.instance}/{world.database}")
        finally:
            world.stop()
        return
    # Resolved here: Spark's workers do not see environment changes made after they started.
    target = SpannerTarget(request.project, request.instance, request.database, request.dialect,
                           os.environ.get(config.EMULATOR_HOST_ENVVAR) or None)
    yield _Source(target, request.source_stream, None, None, target.path)


# --- the wave loop ---------------------------------------------------------------------------


def _initial_query(cache, stream, pull_id, src, request, start_ns, end_ns) -> int:
    """The NULL-token query, on the driver: names the first partitions (and fails fast)."""
    database = open_database(src.target)
    rows = list(read_partition_rows(
        database, request.dialect, src.source_stream, None, start_ns, end_ns,
        request.heartbeat_ms, max_attempts=request.max_attempts,
    ))
    failed = [r for r in rows if r["kind"] == "partition_end"]
    if failed:
        detail = json.loads(failed[0]["extra"])
        raise SourceError(detail.get("error") or "The initial change stream query failed.")
    stats = cache.ingest(stream, pull_id, to_arrow_batch(rows))
    return stats.child_partitions


def _read_wave(spark, src, request, parts, end_ns, staging: Path,
               on_progress: Callable[[int, int], None]) -> Any:
    """Run one Spark job over the wave's partitions; returns what to ingest.

    The job runs in a helper thread while this thread relays the tasks' progress notes to
    ``on_progress(partitions_done, records)`` (so a UI callback stays on its own thread).
    """
    from spark_backend.spark.session import is_remote

    remote = is_remote(spark)
    progress_dir = staging.parent / f"{staging.name}-progress"
    if not remote:
        progress_dir.mkdir(parents=True, exist_ok=True)
    options = {
        "project": src.target.project, "instance": src.target.instance,
        "database": src.target.database, "dialect": src.target.dialect,
        "host": src.target.host or "", "stream": src.source_stream,
        "heartbeat_ms": str(request.heartbeat_ms), "end_ns": str(end_ns),
        "max_attempts": str(request.max_attempts),
        "tasks": str(_task_slots(spark)), "threads": str(request.threads_per_task),
        "progress_dir": "" if remote else str(progress_dir),
        "coord_dir": "" if remote else str(staging.parent / "coordination"),
        "partitions": json.dumps([{"token": t, "start_ns": s} for t, s in parts]),
    }
    df = spark.read.format("spanner_change_stream").options(**options).load()

    def run() -> Any:
        if remote:
            return df.toArrow()  # Spark Connect: the cluster cannot write into our folder
        # Files of at most 100k rows: the cache lands them one by one in bounded memory.
        df.write.mode("overwrite").option("maxRecordsPerFile", 100_000).parquet(str(staging))
        return str(staging / "*.parquet")

    with ThreadPoolExecutor(max_workers=1) as pool:
        job = pool.submit(run)
        try:
            while True:
                try:
                    return job.result(timeout=0.5)
                except FutureTimeout:
                    on_progress(*_task_progress(progress_dir))
        except BaseException:
            if not job.done():
                with contextlib.suppress(Exception):
                    spark.sparkContext.cancelAllJobs()
            raise
        finally:
            shutil.rmtree(progress_dir, ignore_errors=True)


def _task_progress(progress_dir: Path) -> tuple[int, int]:
    partitions = records = 0
    for note in progress_dir.glob("task-*.json"):
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(note.read_text())
            partitions += int(data["partitions"])
            records += int(data["records"])
    return partitions, records


def _task_slots(spark) -> int:
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return 4


def _wave_outcome(cache: Cache, batch: Any) -> tuple[int, int, list[tuple[str, str]]]:
    """(record rows, partitions read, [(partition, error)] of those that ended incomplete)."""
    total, ended = cache.scan(
        batch, "SELECT count(*) FILTER (WHERE kind IN ('data_change', 'heartbeat', "
               "'child_partitions')), count(*) FILTER (WHERE kind = 'partition_end') FROM b")[0]
    failed = cache.scan(
        batch, "SELECT partition_token, extra ->> 'error' FROM b WHERE kind = 'partition_end' "
               "AND (extra ->> 'state') = 'incomplete' ORDER BY partition_token")
    return int(total), int(ended), [(t, e) for t, e in failed]


def start_spark(master: str | None = None, remote: str | None = None) -> Any:
    """Start the Spark session and its Python workers ahead of a pull (seconds saved later)."""
    from spark_backend.spark.session import spark_session, warm_up

    spark = spark_session(master, remote)
    warm_up(spark)
    return spark


def run_pull(
    cache: Cache,
    request: PullRequest,
    progress: Callable[[PullProgress], None] | None = None,
) -> PullResult:
    """Pull ``[start, end]`` of a change stream into the cache; see the module docstring."""
    request = _validated(request)
    report = progress or (lambda p: None)
    began = time.monotonic()
    from spark_backend.spark.session import spark_session

    # Start the JVM before any gRPC channel exists: forking next to gRPC threads is fragile.
    spark = spark_session(request.spark_master, request.spark_remote)
    with _open_source(request) as src:
        src, request, dialect_error = _settle_dialect(src, request)
        stream = request.stream or src.source_stream
        start_ns = request.start if request.start is not None else src.default_start_ns
        if start_ns is None:
            start_ns = cache.cached_range(stream)[0]  # UTC ns from the cache, any time zone
        if start_ns is None:
            raise BadInput("--start is required for this source (RFC 3339, e.g. "
                           "2026-01-05T09:00:00Z).", field="start")
        end_ns = request.end if request.end is not None else (src.default_end_ns or now_ns())
        if start_ns > end_ns:
            raise BadInput(f"--start {format_ns(start_ns)} is after the end {format_ns(end_ns)}.",
                           field="start")
        cache.ensure_stream(
            stream, system="spanner", source=request.source, dialect=request.dialect,
            location=src.location, source_stream=src.source_stream,
            heartbeat_ms=request.heartbeat_ms,
        )
        _check_range(cache, stream, start_ns)
        cache.close_running_pulls(stream)
        pull_id = cache.begin_pull(stream, request.source, start_ns, end_ns, request.heartbeat_ms)
        result = PullResult(stream=stream, status="running", pull_id=pull_id)
        try:
            if dialect_error is not None:
                raise dialect_error
            _run_waves(cache, spark, stream, pull_id, src, request, start_ns, end_ns, report,
                       result)
        except InspectorError as e:
            result.status, result.error = "failed", str(e)
            result.failed_partition = getattr(e, "partition", None)
        except KeyboardInterrupt:
            cache.finish_pull(pull_id, "interrupted", error="interrupted by the user")
            raise
        except Exception as e:  # Spark or the source failed in a way we did not foresee
            result.status = "failed"
            first = (str(e).splitlines() or [""])[0]
            result.error = f"The pull failed: {type(e).__name__}: {first}"
        cache.finish_pull(pull_id, result.status, error=result.error,
                          failed_partition=result.failed_partition, waves=result.waves)
    result.seconds = time.monotonic() - began
    return result


def _settle_dialect(
    src: _Source, request: PullRequest,
) -> tuple[_Source, PullRequest, InspectorError | None]:
    """The database's own dialect, unless ``request.dialect`` overrides it (then a query the
    database refuses for the dialect says so in one sentence). A database that cannot be
    asked fails the pull like any source error (returned, raised where the pull records it)."""
    try:
        target = with_database_dialect(src.target)
    except InspectorError as e:
        return src, request, e
    return (dataclasses.replace(src, target=target),
            dataclasses.replace(request, dialect=target.dialect), None)


def _failure_message(failures: list[tuple[str, str]], states: dict[str, int]) -> str:
    """One sentence: how many partitions failed, what was kept, what is left to read."""
    token, error = failures[0]
    failed = len(failures)
    waiting = states.get(PartitionState.PENDING, 0) + states.get(PartitionState.INCOMPLETE, 0)
    waiting -= failed
    which = (f"Partition {token} failed" if failed == 1
             else f"{failed} partitions failed (first {token})")
    left = (f", and {waiting} partitions that follow them were not read yet" if waiting > 0
            else "")
    return (f"{which} after retries ({error}); "
            f"{states.get(PartitionState.FINISHED, 0)} partitions were read to their end and "
            f"{states.get(PartitionState.OPEN, 0)} to the range end and are kept, the failed "
            f"{'one is' if failed == 1 else 'ones are'} kept as far as read and marked "
            f"incomplete{left}: pull again to resume.")


def _check_range(cache: Cache, stream: str, start_ns: int) -> None:
    cached_start, _ = cache.cached_range(stream)
    if cached_start is not None and cache.partition_count(stream) and start_ns < cached_start:
        raise BadInput(
            f"The cache holds {stream!r} from {format_ns(cached_start)}; a pull can extend it to "
            "a later end but not to an earlier start; give this pull another name with --as.",
            field="start",
        )


def _run_waves(
    cache, spark, stream, pull_id, src, request, start_ns, end_ns, report, result
) -> None:
    has_partitions = cache.partition_count(stream)
    if not has_partitions:
        report(PullProgress(0, 0, 0, 0, "initial query"))
        result.records += _initial_query(cache, stream, pull_id, src, request, start_ns, end_ns)
    parts = cache.frontier(stream, end_ns)
    if not parts and has_partitions:
        result.status = "nothing-to-do"
        return
    staging_root = Path(tempfile.mkdtemp(prefix="csi-pull-", dir=cache.path.parent))
    done = 0
    failures: list[tuple[str, str]] = []
    try:
        while parts:
            result.waves += 1
            known = cache.partition_count(stream)
            report(PullProgress(result.waves, done, max(known, done + len(parts)), result.records,
                                f"wave {result.waves}: reading {len(parts)} partitions and "
                                "the children they lead to"))
            staging = staging_root / f"wave-{result.waves}"
            wave, base_done, base_records = result.waves, done, result.records

            def live(partitions: int, records: int) -> None:
                report(PullProgress(wave, base_done + partitions,
                                    max(known, base_done + partitions), base_records + records,
                                    f"wave {wave}: reading"))

            batch = _read_wave(spark, src, request, parts, end_ns, staging, live)
            rows, ended, failed = _wave_outcome(cache, batch)
            cache.ingest(stream, pull_id, batch, extra_sql=[(
                "UPDATE pulls SET records = records + ?, waves = ? WHERE pull_id = ?",
                [rows, result.waves, pull_id])])
            shutil.rmtree(staging, ignore_errors=True)
            done += ended
            result.records += rows
            result.partitions_read = done
            report(PullProgress(result.waves, done, cache.partition_count(stream),
                                result.records, f"wave {result.waves} landed"))
            failures.extend(failed)
            # Go on with every branch that does not depend on a failed partition.
            given_up = {token for token, _ in failures}
            parts = [p for p in cache.frontier(stream, end_ns) if p[0] not in given_up]
        if failures:
            raise PullFailed(_failure_message(failures, cache.partition_states(stream)),
                             partition=failures[0][0])
        result.status = "complete"
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
