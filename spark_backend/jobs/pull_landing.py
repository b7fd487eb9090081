"""Landing a pull's results: ``Lander`` lands tasks' results in the cache on a thread of its
own while the driver (``pull``) starts the next tasks; ``cache_failed`` says in one sentence
what a write the cache refused means for the pull."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import duckdb

from spark_backend.cache.ingest import ingest_stream
from spark_backend.cache.store import Cache, disk_full
from spark_backend.jobs.pull_plan import Wave
from spark_backend.model import config
from spark_backend.model.errors import CacheError
from spark_backend.spark.packing import Packed

LANDED = object()
# The lander brings the transaction summary up to date while the pull still reads (instead of
# all at its end) once a Spark task slot has been idle this long with nothing to land, and at
# least this many records landed since it last did, and at least as many as had landed then:
# at a pull's tail, where the last partitions' chains hold it and a core idles. The end then
# rebuilds only what changed since (``Cache.summarize_landed``). Each summary looks at all the
# pull's records to find what changed, so a pull whose slots idle all along (a stream of one
# partition) summarizes at 100k, 200k, 400k, ... records: its summaries scan about twice its
# records in all, not the square of them.
EARLY_SUMMARY_IDLE_S = 2.0
EARLY_SUMMARY_RECORDS = 100_000


class Lander:
    """Lands tasks' results in the cache on a thread of its own, in the order they arrived,
    while the driver starts the next tasks; after each landing it asks the cache's frontier
    and posts ``(None, (LANDED, frontier, failures, records, ended, partitions))`` to the
    driver's events. Only this thread touches the cache while the pull reads.

    The driver never waits for a landing while the results not landed yet are fewer than
    ``max_rows``: results that arrive during a landing wait for their own, one task's
    results per transaction (landing together what had waited could need more than the
    pull's DuckDB memory). The driver does not wait for each landing, which would leave the
    task slots it freed meanwhile empty.

    While nothing waits to land and the driver reports a task slot idle for
    ``EARLY_SUMMARY_IDLE_S`` (``slot_idle``), it brings the transaction summary up to date with
    what landed (``EARLY_SUMMARY_RECORDS`` or more since it last did, and as many as had landed
    then); results that arrive meanwhile wait for it, as for a landing."""

    def __init__(self, cache, stream, pull_id, end_ns, jobs, events, max_rows):
        self.cache, self.stream, self.pull_id, self.end_ns = cache, stream, pull_id, end_ns
        self.jobs, self.events, self.max_rows = jobs, events, max_rows
        self.total = Wave(0)
        self.changed = threading.Condition()
        self.waiting: list[list[Any]] = []  # task results not landing yet, in order
        self.rows = 0                       # rows waiting or landing
        self.closing = False
        self.outstanding = 0                # tasks put and not landed (the driver's count)
        self.idle_since: float | None = None  # a task slot idle since (the driver's word)
        self.summarized_at = 0              # records landed at the last early summary
        self.thread = threading.Thread(target=self._run, daemon=True, name="pull-lander")
        self.thread.start()

    def put(self, pieces: list[Packed]) -> None:
        rows = sum(p.rows for p in pieces)
        with self.changed:
            while self.rows and self.rows + rows > self.max_rows and self.thread.is_alive():
                self.changed.wait(0.5)
            self.waiting.append(pieces)
            self.rows += rows
            self.changed.notify_all()
        self.outstanding += 1

    def close(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        self.thread.join()

    def slot_idle(self, idle: bool) -> None:
        """The driver's word after each event: a Spark task slot has nothing to run (or not)."""
        with self.changed:
            if not idle:
                self.idle_since = None
            elif self.idle_since is None:
                self.idle_since = time.monotonic()
                self.changed.notify_all()

    def _summary_due_in(self) -> float | None:
        """Seconds until the summary of what landed is due (0: now; None: not as things are)."""
        since = self.total.records - self.summarized_at
        if self.idle_since is None or since < max(EARLY_SUMMARY_RECORDS, self.summarized_at):
            return None
        return max(0.0, self.idle_since + EARLY_SUMMARY_IDLE_S - time.monotonic())

    def _summarize_landed(self) -> Any:
        """The summary brought up to date with what landed (``Cache.summarize_landed``), on
        this thread, between landings; a failure of the cache's is the pull's, as a landing's."""
        self.summarized_at = self.total.records
        try:
            self.cache.summarize_landed(self.stream)
        except duckdb.Error as e:
            error = CacheError(cache_failed(self.cache, e, "summarizing the transactions landed"))
            error.__cause__ = e
            return error
        finally:
            give_back_memory()
        return None

    def _run(self) -> None:
        while True:
            with self.changed:
                while not self.waiting and not self.closing:
                    due = self._summary_due_in()
                    if due == 0:
                        break
                    self.changed.wait(due)
                if not self.waiting and self.closing:
                    return
                pieces = self.waiting.pop(0) if self.waiting else None
            if pieces is None:
                error = self._summarize_landed()
                if error is not None:
                    self.events.put((None, error))
                continue
            rows = sum(p.rows for p in pieces)
            batches: list[Any] = []  # decoded only now: until here they wait compressed
            try:
                before = self.total.records
                batches = [batch for piece in pieces for batch in piece.batches()]
                ingest_stream(self.cache, self.stream, self.pull_id, batches,
                              on_chunk=self.total.count,
                              extra_sql=lambda b=before: [count_pull(
                                  self.pull_id, self.total.records - b, self.jobs.started)])
                landed = (LANDED, self.cache.frontier(self.stream, self.end_ns),
                          list(self.total.failed), self.total.records, self.total.ended,
                          self.cache.partition_count(self.stream))
            except duckdb.Error as e:  # the cache, not Spark: say so, and how to resume
                landed = CacheError(cache_failed(self.cache, e, "landing a task's results"))
                landed.__cause__ = e
            except BaseException as e:
                landed = e
            del pieces, batches
            give_back_memory()
            with self.changed:
                self.rows -= rows
                self.changed.notify_all()
            self.events.put((None, landed))


def cache_failed(cache: Cache, error: Exception, doing: str) -> str:
    """One sentence for a write the cache's DuckDB refused (not Spark's, not the source's)."""
    first = (str(error).splitlines() or [""])[0]
    advice = "pull again to resume"
    if disk_full(error):  # DuckDB says "Out of Memory" when its spill finds the disk full
        advice = f"free space on the disk of {cache.path} and {advice}"
    elif isinstance(error, duckdb.OutOfMemoryException):
        name = config.MEMORY_ENVVAR
        advice = f"give DuckDB more memory with ${name} (e.g. {name}=256MB) and {advice}"
    return (f"The cache {cache.path} failed while {doing} ({first}); what landed before is "
            f"kept; {advice}.")


def give_back_memory() -> None:
    """Return the heap's free pages to the system (glibc): a landing's Arrow batches and
    DuckDB's staging tables leave free heap behind, which glibc otherwise keeps for the
    process (benchmarks/MEMORY.md)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def count_pull(pull_id: int, records: int, waves: int) -> tuple[str, list[Any]]:
    """The statement that adds a landing's records to its pull (run in the landing's
    transaction)."""
    return ("UPDATE pulls SET records = records + ?, waves = ? WHERE pull_id = ?",
            [records, waves, pull_id])
