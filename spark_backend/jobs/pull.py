"""Pull orchestration: read a time range of a change stream through Spark into the cache.

The query workflow of the reference doc: the initial query (NULL token) runs on the driver and
names the first partitions; then Spark tasks, at most one per task slot, read every partition
that can be read now (a child with several parents only once all of them finished), each for a
few seconds; from a task's results the driver starts the next task at once and lands the results
in the cache, one transaction per task, on a thread of its own (``_read_all``). The cache
remembers every partition's state, so a pull that stopped half-way (a crash, a
failing partition) is resumed by pulling again, and a later end reads only the new span.

Its parts: the source is opened through one interface (``pull_sources``), the driver's
knowledge of the partitions is ``pull_plan``, the Spark jobs are ``pull_jobs``, the landing is
``pull_landing``; the request and the orchestration are here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from spark_backend.cache.store import Cache
from spark_backend.jobs.pull_jobs import JOB_DONE, Jobs
from spark_backend.jobs.pull_landing import Lander, cache_failed, count_pull
from spark_backend.jobs.pull_plan import Plan, Wave
from spark_backend.jobs.pull_sources import OpenSource, PullSource, demo_world
from spark_backend.model import checks, config
from spark_backend.model.enums import PartitionState, Source, values
from spark_backend.model.errors import (
    BadInput,
    CacheError,
    InspectorError,
    PullFailed,
)
from spark_backend.model.records import to_arrow_batch
from spark_backend.model.timestamps import TimestampError, coerce_ns, format_ns, now_ns
from spark_backend.spanner.connect import (
    open_database,
    validate_dialect,
    with_database_dialect,
)
from spark_backend.spanner.reader import (
    initial_query_rows,
    validate_heartbeat,
    validate_stream_name,
)

# The jobs room's pull API (``demo_world``: the dashboard's demo servers serve the same world).
__all__ = ["PullProgress", "PullRequest", "PullResult", "PullTuning", "check_request",
           "demo_world", "planned_serving_address",
           "run_pull", "serving_address", "start_spark", "start_spark_early"]

SOURCES = values(Source)
READERS = ("spark", "here")


@dataclass(slots=True)
class PullTuning:
    """How a pull's tasks read (the defaults suit every source; tests and benchmarks vary
    them). A task stops its reads after ``max_rows_per_task`` rows or ``task_seconds``: that
    bounds what one task hands to the driver (and what waits there for the landing); each stop
    costs the next task a new query of that partition, so a larger budget means fewer stops for
    a little more memory (measurements: benchmarks/MEMORY.md)."""

    max_attempts: int = 6               # tries of a query before its partition fails
    threads_per_task: int = 64          # partitions a task reads at once (they mostly wait)
    max_rows_per_task: int = 32_768
    task_seconds: float = 8.0           # a task's results reach the driver when it ends

    def check(self) -> None:
        checks.integer(self.max_attempts, "max_attempts", 1, 100, field="max_attempts")
        checks.integer(self.threads_per_task, "threads_per_task", 1, 256,
                       field="threads_per_task")
        checks.integer(self.max_rows_per_task, "max_rows_per_task", 100, 10_000_000,
                       field="max_rows_per_task")
        checks.number(self.task_seconds, "task_seconds", 0.5, 3600, "seconds",
                      field="task_seconds")


@dataclass(slots=True)
class PullRequest:
    """What a user asks a pull for: the source (``pull_sources``: the demo, an emulator or a
    Spanner database, with the source's own values), the range, the stream's name in the
    cache, and the Spark to read with."""

    source: PullSource
    stream: str | None = None            # name in the cache (default: the source stream)
    start: str | int | None = None
    end: str | int | None = None
    heartbeat_ms: int = config.DEFAULT_HEARTBEAT_MS
    spark_master: str | None = None
    spark_remote: str | None = None
    # "spark": Spark's tasks read (the pull). "here": this process reads, without Spark: for a
    # small span while Spark is still starting (the dashboard's first minute); same reader,
    # same workflow, same landing.
    reader: str = "spark"
    tuning: PullTuning = field(default_factory=PullTuning)


@dataclass
class PullProgress:
    wave: int
    partitions_done: int
    partitions_total: int
    records: int  # read so far (never goes down)
    message: str
    landed: int | None = None  # of them in the cache, when some are still on their way

    def counted(self) -> str:
        """'27,078 records (18,202 landed)': read so far, and of them landed if not all."""
        if self.landed is None or self.landed >= self.records:
            return f"{self.records:,} records"
        return f"{self.records:,} records ({self.landed:,} landed)"


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


def check_request(request: PullRequest) -> PullRequest:
    """``request`` with its times as UTC ns, every value checked (``BadInput`` names the first
    that is not accepted) before Spark, a server or an emulator starts."""
    source = request.source
    if not hasattr(source, "open") or getattr(source, "kind", None) not in SOURCES:
        raise BadInput(f"Unknown source {source!r}; accepted sources are {', '.join(SOURCES)}.",
                       field="source")
    if request.reader not in READERS:
        raise BadInput(f"Unknown reader {request.reader!r}; accepted are {', '.join(READERS)}.",
                       field="source")
    if source.dialect is not None:
        validate_dialect(source.dialect)
    validate_heartbeat(request.heartbeat_ms)
    if request.stream is not None:
        checks.cache_stream_name(request.stream)
    source.check()
    request.tuning.check()
    checks.spark_choice(request.spark_master, request.spark_remote)
    if source.stream is not None:
        validate_stream_name(source.stream)
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
    if (request.start is not None and source.kind != Source.DEMO
            and request.start > now_ns() + 1e9):
        raise BadInput(
            f"--start {format_ns(request.start)} is in the future; change streams can only be "
            "read from the past (within the retention period).", field="start",
        )
    return request


# --- the wave loop ---------------------------------------------------------------------------


def _initial_query(cache, stream, pull_id, src, request, start_ns, end_ns) -> int:
    """The NULL-token query, on the driver: names the first partitions (and fails fast)."""
    rows = initial_query_rows(open_database(src.target), src.target.dialect, src.source_stream,
                              start_ns, end_ns, request.heartbeat_ms,
                              max_attempts=request.tuning.max_attempts)
    stats = cache.ingest(stream, pull_id, to_arrow_batch(rows))
    return stats.child_partitions


def _read_all(spark, cache, stream, pull_id, src, request, parts, end_ns, report,
              result) -> list[tuple[str, str]]:
    """Read ``parts`` and every partition they lead to; returns [(partition, error)] of the
    partitions that failed (everything that does not depend on them is read)."""

    from spark_backend.spark.session import SparkUnavailable, one_line, spark_log_path

    events: queue.Queue = queue.Queue()
    jobs = Jobs(spark, src, request, end_ns, events)
    plan = Plan(cache.finished_partitions(stream))
    plan.offer(parts)
    lander = Lander(cache, stream, pull_id, end_ns, jobs, events,
                    max_rows=request.tuning.max_rows_per_task)
    failures: list[tuple[str, str]] = []
    pending: dict[int, list[Any]] = {}
    known = cache.partition_count(stream)
    before = result.records  # the initial query's
    read = before  # and what the tasks that ended brought (landed or on their way)

    def progress(message: str) -> PullProgress:
        return PullProgress(jobs.started, result.partitions_read, known, read, message,
                            landed=result.records)

    def launch() -> None:
        if jobs.free_slots() <= 0 or not plan.ready:
            return
        readable = plan.take()
        jobs.start(readable, plan.merge_parents_finished())
        result.waves = jobs.started
        report(progress(f"job {jobs.started}: reading {len(readable)} partitions and the "
                        "children they lead to"))

    launch()
    try:
        while jobs.tasks or lander.outstanding or plan.ready:
            number, item = events.get()
            if number is None:  # a landing
                if isinstance(item, BaseException):
                    raise item
                _, frontier, failures[:], landed, result.partitions_read, known = item
                lander.outstanding -= 1
                result.records = before + landed
                failed = {token for token, _ in failures}
                plan.offer([p for p in frontier if p[0] not in failed])
                report(progress("landed"))
            elif item is JOB_DONE:
                if any(job == number for job, _ in jobs.tasks):
                    raise RuntimeError(f"Spark job {number} ended without all of its tasks' "
                                       "results")
            elif isinstance(item, BaseException):
                raise item
            else:
                jobs.in_flight.release()
                if item.task is None:
                    pending.setdefault(number, []).append(item)
                else:
                    results = pending.pop(number, [])
                    plan.task_ended(jobs.tasks.pop((number, item.task)), results)
                    launch()  # before landing: the next task does not wait for the cache
                    read += sum(p.records for p in results)
                    report(progress(f"job {number}: reading"))
                    lander.put(results)
            launch()
            lander.slot_idle(jobs.free_slots() > 0)
    except InspectorError:
        jobs.cancel()
        raise
    except BaseException as e:
        jobs.cancel()
        if isinstance(e, KeyboardInterrupt | SystemExit):
            raise
        raise SparkUnavailable(
            f"A Spark job of the pull failed ({one_line(e)}); every task that finished before "
            f"is kept, pull again to resume; Spark's log is {spark_log_path()}."
        ) from e
    finally:
        jobs.closed = True
        lander.close()  # what arrived lands, even when the pull fails
    return failures


def _read_here(spark, cache, stream, pull_id, src, request, parts, end_ns, report,
               result) -> list[tuple[str, str]]:
    """``_read_all`` without Spark: this process reads ``parts`` and what they lead to with
    the tasks' own workflow (``threads_per_task`` at a time) and lands the rows as they come,
    50k at a time, in one transaction per round; a merge child is read in the round that
    finishes the last of its parents (those finished before are the cache's). For small spans
    only: one process, no row budget."""
    from spark_backend.cache.ingest import ingest_stream
    from spark_backend.model.records import batched
    from spark_backend.spanner.workflow import read_partitions

    database = open_database(src.target)
    failures: list[tuple[str, str]] = []
    while parts:
        result.waves += 1
        wave = Wave(result.waves)
        report(PullProgress(wave.number, result.partitions_read, cache.partition_count(stream),
                            result.records, f"reading {len(parts)} partitions in this process"))
        rows = read_partitions(database, src.target.dialect, src.source_stream, parts, end_ns,
                               request.heartbeat_ms, threads=request.tuning.threads_per_task,
                               max_attempts=request.tuning.max_attempts,
                               finished=cache.finished_partitions(stream))
        ingest_stream(cache, stream, pull_id, (to_arrow_batch(b) for b in batched(rows, 4096)),
                      on_chunk=wave.count,
                      extra_sql=lambda w=wave: [count_pull(pull_id, w.records, result.waves)])
        result.records += wave.records
        result.partitions_read += wave.ended
        failures += wave.failed
        report(PullProgress(wave.number, result.partitions_read, cache.partition_count(stream),
                            result.records, "landed"))
        failed = {token for token, _ in failures}
        parts = [p for p in cache.frontier(stream, end_ns) if p[0] not in failed]
    return failures


def start_spark_early() -> tuple[Any, Any]:
    """Start Spark on a thread of its own: (a future of the session, an Event set once the
    JVM is launched). A caller may start gRPC threads (a demo server, a read ``here``) after
    the event without a fork of this process next to them."""

    from spark_backend.spark.session import jvm_launched, spark_session

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spark-start")
    session = pool.submit(spark_session)
    pool.shutdown(wait=False)
    return session, jvm_launched


def start_spark(master: str | None = None, remote: str | None = None) -> Any:
    """Start the Spark session and its Python workers ahead of a pull (seconds saved later)."""
    from spark_backend.spark.session import spark_session, warm_up

    spark = spark_session(master, remote)
    warm_up(spark)
    return spark


def serving_address(spark: Any = None) -> str:
    """The address of this machine where a source this process serves (a demo server, a local
    emulator) listens: where the executors of ``spark`` (by default the session that
    ``spark_session()`` gives, as the dashboard's pulls use) reach it; 127.0.0.1 for local Spark."""
    from spark_backend.spark.session import executor_facing_address, spark_session

    return executor_facing_address(spark if spark is not None else spark_session())


def planned_serving_address() -> str | None:
    """``serving_address()`` before Spark has started (a demo server can start while Spark
    does); None when only the running session knows it."""
    from spark_backend.spark.session import planned_executor_facing_address

    return planned_executor_facing_address()


def run_pull(
    cache: Cache,
    request: PullRequest,
    progress: Callable[[PullProgress], None] | None = None,
) -> PullResult:
    """Pull ``[start, end]`` of a change stream into the cache; see the module docstring."""
    request = check_request(request)
    report = progress or (lambda p: None)
    began = time.monotonic()
    from spark_backend.spark.session import spark_session

    # Start the JVM before any gRPC channel exists: forking next to gRPC threads is fragile.
    spark = (spark_session(request.spark_master, request.spark_remote)
             if request.reader == "spark" else None)
    bind = serving_address(spark) if spark is not None else "127.0.0.1"
    with request.source.open(bind) as src:
        src, dialect_error = _settle_dialect(src)
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
            stream, system="spanner", source=request.source.kind, dialect=src.target.dialect,
            location=src.location, source_stream=src.source_stream,
            heartbeat_ms=request.heartbeat_ms,
        )
        _check_range(cache, stream, start_ns)
        cache.close_running_pulls(stream)
        pull_id = cache.begin_pull(stream, request.source.kind, start_ns, end_ns,
                                   request.heartbeat_ms)
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
        except duckdb.Error as e:  # the cache, before or after the reads
            result.status, result.error = "failed", cache_failed(cache, e, "the pull wrote to it")
        except Exception as e:  # Spark or the source failed in a way we did not foresee
            result.status = "failed"
            first = (str(e).splitlines() or [""])[0]
            result.error = (f"The pull stopped on an error this tool has no sentence for "
                            f"({type(e).__name__}: {first}); the partitions read so far are "
                            "kept, and the next pull resumes from them.")
        try:
            report(PullProgress(result.waves, result.partitions_read,
                                cache.partition_count(stream), result.records,
                                "summarizing the transactions"))
        finally:  # a progress callback that raises (a dashboard rerun) still ends the pull
            try:
                cache.finish_pull(pull_id, result.status, error=result.error,
                                  failed_partition=result.failed_partition, waves=result.waves)
            except duckdb.Error as e:  # the summary (the pull's end is recorded before it)
                result.status = "failed"
                result.error = cache_failed(cache, e, "summarizing the pull's transactions")
            except CacheError as e:  # the cache could not be opened again for the summary
                result.status, result.error = "failed", str(e)
    result.seconds = time.monotonic() - began
    return result


def _settle_dialect(src: OpenSource) -> tuple[OpenSource, InspectorError | None]:
    """The database's own dialect, unless the source's ``dialect`` overrides it (then a query
    the database refuses for the dialect says so in one sentence). A database that cannot be
    asked fails the pull like any source error (returned, raised where the pull records it)."""
    try:
        target = with_database_dialect(src.target)
    except InspectorError as e:
        return src, e
    return dataclasses.replace(src, target=target), None


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
    read = _read_all if spark is not None else _read_here
    failures = read(spark, cache, stream, pull_id, src, request, parts, end_ns, report, result)
    if failures:
        raise PullFailed(_failure_message(failures, cache.partition_states(stream)),
                         partition=failures[0][0])
    result.status = "complete"
