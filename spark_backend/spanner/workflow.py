"""The query workflow inside one Spark task: read a set of partitions concurrently and follow
their children as they appear.

A child with one parent (a split or a move) is read by the task that read its parent, as soon as
the parent finished. A child with several parents (a merge) is read by this task once it read
every parent that had not finished before the task began (``finished``: the driver names those
it knew of, the finished parents of merges still waiting for another). Only one task reads the
last of them, so only that one reads the child. When its parents were read by tasks running at
the same time, no task reads it: the driver reads it in the next wave, once every parent's task
ended (tasks share nothing but the network, so the hand-over goes through the results of the
job). Either way every partition is read exactly once, after all its parents.

With ``appoint_merges`` (a read of a whole range with no driver between tasks: the
``spanner_change_stream`` data source given ``start`` and ``end``), a merge child is read by the
task that read its first parent (the least token), as soon as that parent finished: the reference
workflow's "appoint one parent". Every partition is still read exactly once; the child may be read
while its other parents are still being read elsewhere, so rows of one key are ordered by their
commit timestamps and record sequences, not by when they arrived.

``max_rows`` bounds what one task returns and ``max_seconds`` how long it reads: after that many
rows or seconds, nothing new is started and each read stops at a new timestamp, ending with a
``partition_end`` row in state ``open`` at the last timestamp read in full (``stopped:
"budget"``) and the number of the last row it passed on (``arrival``: a partition's rows count
on across the queries that continue it in one pull, see ``submit``). The row it stops at is not
passed on.

A task is stateless, as a data source reader's ``read()`` must be: a read stopped at its
budget is closed (the call cancelled, the session given back), and the next task continues the
partition with a new query from the timestamp it stopped after. From a source that paces its
responses the new query's first response holds the row the read stopped at, sent again. So a
read stops at a row that came with the one before it, in the same response, and passes on a row
it had to wait for (``WAITED_S``): that one may be a large row in many responses, and a budget is
more likely to run out while a read waits for such a row. A row that took ``WAITED_MAX_S`` or
longer is not kept: it came from a quiet partition (a live one near its end), where the next row
may be as far off. A read passes on waited rows for at most ``keep_seconds`` after the first it
could have stopped at, and while the task has returned less than an eighth over ``max_rows``
(reads of one task check that without a lock: a few rows more). Each kept row makes the read
wait for the row after it, so a task may end up to that row's wait later than it would have.

A Spark task's results reach the driver only when the task ends, so short tasks are what lets
results land as they come and a merge child start soon after its parents (read by different
tasks) finished.

Rows stream out through a bounded queue (``ROWS_QUEUED``): memory does not grow with the
number of records. A read hands its rows on in small lists (``HAND_ON_ROWS``), not one by one:
the task's consumer mostly waits for rows, and a row put alone on the queue woke it, and made
its thread and the reader's trade Python's lock, for every row.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from spark_backend.model.records import partition_end
from spark_backend.spanner.reader import read_partition_rows

_DONE = object()
# a partition to read: (token, start) or (token, start, its rows read before in this pull)
Root = tuple[str, int] | tuple[str, int, int]

WAITED_S = 0.005       # a row that took longer to arrive than this came in a response of its own
WAITED_MAX_S = 1.0     # ... and one that took this long or longer came from a quiet partition
KEEP_SECONDS = 0.1     # how long a stopped read may pass on such rows before it stops anyway
# Rows the task's reads have handed on and its batching has not taken yet. A row waits there
# as a Python dict (~1.5 KB each); the queue fills where the stream delivers faster than the
# task's core packs. The bounds trade a little peak memory against nothing measurable in time
# (benchmarks/MEMORY.md).
ROWS_QUEUED = 2048
# Rows a read gathers before it hands them on as one list; it also hands on what it gathered
# when a row made it wait for the source (the rows of the response before are complete) and
# before it stops or ends.
HAND_ON_ROWS = 16


class _Workflow:
    def __init__(self, read: Callable[[str, int], Iterator[dict]], threads: int, follow: bool,
                 max_rows: int | None = None, max_seconds: float | None = None,
                 keep_seconds: float = KEEP_SECONDS, finished: Iterable[str] = (),
                 appoint_merges: bool = False):
        """``read(token, start_ns)``: the rows of one query (closed when a read stops at its
        budget); ``finished``: partitions finished before (by other tasks); ``appoint_merges``:
        see the module doc."""
        self.read = read
        self.follow = follow
        self.appoint = appoint_merges
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self.keep_seconds = keep_seconds
        self.stopping = threading.Event()
        # lists of rows (at most ROWS_QUEUED rows in full lists), or _DONE
        self.out: queue.Queue = queue.Queue(maxsize=max(1, ROWS_QUEUED // HAND_ON_ROWS))
        self.lock = threading.Lock()
        self.finished: set[str] = set(finished)  # by this task, or before it began
        self.scheduled: set[str] = set()
        self.waiting: dict[str, tuple[set[str], int]] = {}  # merge child -> (parents, start)
        self.outstanding = 0
        self.work: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._worker, daemon=True)
                        for _ in range(max(1, threads))]
        self.error: BaseException | None = None
        self.emitted = 0

    def submit(self, token: str, start_ns: int, arrival: int = 0) -> None:
        """Read ``token`` from ``start_ns``; ``arrival``: the rows an earlier query of this
        pull read of it (its rows' ``line`` numbers go on from there, so that a partition's
        rows in one pull are numbered once, in the order they arrived: the order check of
        ``analysis.report`` relies on it)."""
        with self.lock:
            if token in self.scheduled:
                return
            self.scheduled.add(token)
            self.outstanding += 1
        self.work.put((token, start_ns, arrival))

    def _worker(self) -> None:
        while True:
            item = self.work.get()
            if item is _DONE:
                return
            token, start_ns, arrival = item
            try:
                self._read_one(token, start_ns, arrival)
            except BaseException as e:  # a bug: surface it in the task instead of hanging
                self.error = e
            finally:
                with self.lock:
                    self.outstanding -= 1
                    last = self.outstanding == 0
                if last:
                    self.out.put(_DONE)

    def _read_one(self, token: str, start_ns: int, arrival: int = 0) -> None:
        if self.stopping.is_set():
            return  # not started: still pending (or its parent's child) in the cache
        children: list[tuple[str, list[str], int]] = []
        finished = False
        last_ts: int | None = None  # rows come in timestamp order: all up to it passed on
        deadline: float | None = None  # set at the first row the read could stop at
        offset = arrival  # rows of this partition read before, in this pull
        gathered: list[dict] = []  # rows not handed on yet (``HAND_ON_ROWS``)
        rows = self.read(token, start_ns)
        while True:
            asked = time.monotonic()
            row = next(rows, None)
            if row is None:
                break
            now = time.monotonic()
            if gathered and now - asked >= WAITED_S:
                self.out.put(gathered)  # the rows before came with an earlier response
                gathered = []
            kind = row["kind"]
            ts = row.get("ts_ns")
            if kind != "partition_end" and ts is not None:
                if self.stopping.is_set() and last_ts is not None and ts > last_ts:
                    if deadline is None:
                        deadline = now + self.keep_seconds
                    waited = WAITED_S <= now - asked < WAITED_MAX_S
                    if not waited or now >= deadline or self._rows_over():
                        rows.close()  # the next task queries again from last_ts + 1
                        gathered.append(partition_end(token, "open", last_ts,
                                                      read_from=start_ns, stopped="budget",
                                                      arrival=arrival))
                        self.out.put(gathered)
                        return
                    # a row it waited for: passed on, the read stops at a later timestamp
                last_ts = ts
            if kind in ("child_partitions", "partition_start"):
                for child in json.loads(row["child_partitions"]):
                    children.append((child["token"], child["parent_partition_tokens"],
                                     row["ts_ns"]))
            elif kind == "partition_end":
                finished = json.loads(row["extra"]).get("state") == "finished"
            _shift(row, offset)  # the reader counts from 1 in each query
            arrival = row.get("line") or arrival
            self._count()
            gathered.append(row)
            if len(gathered) >= HAND_ON_ROWS:
                self.out.put(gathered)
                gathered = []
        if gathered:
            self.out.put(gathered)
        if not (finished and self.follow) or self.stopping.is_set():
            return
        ready = []
        with self.lock:
            self.finished.add(token)
            for child, parents, start in children:
                if self.appoint and len(parents) > 1:
                    if token == min(parents):  # the appointed parent: read it now
                        ready.append((child, start))
                    continue
                self.waiting[child] = (set(parents) or {token}, start)
            for child, (needed, start) in list(self.waiting.items()):
                if needed <= self.finished:
                    del self.waiting[child]
                    ready.append((child, start))
        for child, start in ready:
            self.submit(child, start)

    def _rows_over(self) -> bool:
        """Has the task returned an eighth over its row budget (no more waited rows kept)?"""
        return self.max_rows is not None and self.emitted >= self.max_rows + self.max_rows // 8

    def _count(self) -> None:
        """One more row handed on (or gathered to be): the task's row budget."""
        if self.max_rows is not None:
            with self.lock:
                self.emitted += 1
                if self.emitted >= self.max_rows:
                    self.stopping.set()

    def rows(self, roots: list[Root]) -> Iterator[dict[str, Any]]:
        if not roots:
            return
        for token, start, *arrival in roots:
            self.submit(token, start, *arrival)
        timer = None
        if self.max_seconds is not None:
            timer = threading.Timer(self.max_seconds, self.stopping.set)
            timer.daemon = True
            timer.start()
        for t in self.threads:
            t.start()
        try:
            while True:
                item = self.out.get()
                if item is _DONE:
                    with self.lock:
                        if self.outstanding == 0:
                            break
                    continue
                yield from item
        finally:
            if timer is not None:
                timer.cancel()
            for _ in self.threads:
                self.work.put(_DONE)
        if self.error is not None:
            raise self.error


def _shift(row: dict, n: int) -> None:
    """Move a row's number (``line``, the reader's count in its query) by ``n``."""
    if row.get("line") is not None:
        row["line"] += n


def read_partitions(
    database, dialect: str, stream: str, roots: list[Root], end_ns: int,
    heartbeat_ms: int, *, threads: int = 8, follow_children: bool = True,
    max_attempts: int = 6, max_rows: int | None = None, max_seconds: float | None = None,
    finished: Iterable[str] = (), appoint_merges: bool = False,
) -> Iterator[dict[str, Any]]:
    """Rows of ``roots`` (token, start[, rows read of it before in this pull]) and, with
    ``follow_children``, of their descendants that can be read here (``finished``: partitions
    finished before, whose merge children a read here may complete); ``threads`` partitions
    are read at the same time; ``max_rows`` and ``max_seconds`` bound the rows returned and
    the time taken, and ``appoint_merges`` who reads a merge child (see the module doc).
    Keeps nothing once its rows are consumed or it is closed."""

    def read(token: str, start_ns: int) -> Iterator[dict]:
        return read_partition_rows(database, dialect, stream, token, start_ns, end_ns,
                                   heartbeat_ms, max_attempts=max_attempts)

    yield from _Workflow(read, threads, follow_children, max_rows, max_seconds,
                         finished=finished, appoint_merges=appoint_merges).rows(roots)
