"""The query workflow inside one Spark task: read a set of partitions concurrently and follow
their children as they appear.

A child with one parent (a split or a move) is read by the task that read its parent, as soon as
the parent finished. A child with several parents (a merge) is read once every parent finished:
by this task when it read them all; across tasks through a coordination folder (local masters),
where each task marks the partitions it finished and then, for each merge child whose parents
are all marked, tries to claim the child by creating its claim file exclusively. Because a task
marks before it checks, the task that finishes the last parent always sees every mark, and the
exclusive create lets exactly one task read the child (the doc: "appoint one parent to wait and
schedule the query"). Without a coordination folder (a cluster), the driver reads such a child
in the next wave, once the cache shows all its parents finished. Either way every partition is
read exactly once, after all its parents.

Rows stream out through a bounded queue: memory does not grow with the number of records.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from spark_backend.spanner.reader import read_partition_rows

_DONE = object()


class _Workflow:
    def __init__(self, read: Callable[[str, int], Iterator[dict]], threads: int, follow: bool,
                 coord_dir: str | None = None):
        self.read = read
        self.follow = follow
        self.coord_dir = coord_dir
        if coord_dir:
            os.makedirs(os.path.join(coord_dir, "finished"), exist_ok=True)
            os.makedirs(os.path.join(coord_dir, "claims"), exist_ok=True)
        self.out: queue.Queue = queue.Queue(maxsize=20_000)
        self.lock = threading.Lock()
        self.finished: set[str] = set()
        self.scheduled: set[str] = set()
        self.waiting: dict[str, tuple[set[str], int]] = {}  # merge child -> (parents, start)
        self.outstanding = 0
        self.work: queue.Queue = queue.Queue()
        self.threads = [threading.Thread(target=self._worker, daemon=True)
                        for _ in range(max(1, threads))]
        self.error: BaseException | None = None

    def submit(self, token: str, start_ns: int) -> None:
        with self.lock:
            if token in self.scheduled:
                return
            self.scheduled.add(token)
            self.outstanding += 1
        self.work.put((token, start_ns))

    def _worker(self) -> None:
        while True:
            item = self.work.get()
            if item is _DONE:
                return
            token, start_ns = item
            try:
                self._read_one(token, start_ns)
            except BaseException as e:  # a bug: surface it in the task instead of hanging
                self.error = e
            finally:
                with self.lock:
                    self.outstanding -= 1
                    last = self.outstanding == 0
                if last:
                    self.out.put(_DONE)

    def _read_one(self, token: str, start_ns: int) -> None:
        children: list[tuple[str, list[str], int]] = []
        finished = False
        for row in self.read(token, start_ns):
            kind = row["kind"]
            if kind in ("child_partitions", "partition_start"):
                for child in json.loads(row["child_partitions"]):
                    children.append((child["token"], child["parent_partition_tokens"],
                                     row["ts_ns"]))
            elif kind == "partition_end":
                finished = json.loads(row["extra"]).get("state") == "finished"
            self.out.put(row)
        if not (finished and self.follow):
            return
        if self.coord_dir:
            self._mark(token)
        ready = []
        with self.lock:
            self.finished.add(token)
            for child, parents, start in children:
                self.waiting[child] = (set(parents) or {token}, start)
            for child, (needed, start) in list(self.waiting.items()):
                if needed <= self.finished or (self.coord_dir and self._all_marked(needed)):
                    del self.waiting[child]
                    if not self.coord_dir or self._claim(child):
                        ready.append((child, start))
        for child, start in ready:
            self.submit(child, start)

    # --- coordination between tasks (a folder every task of a local master sees) -----------

    @staticmethod
    def _name(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def _mark(self, token: str) -> None:
        path = os.path.join(self.coord_dir, "finished", self._name(token))
        with open(path, "w"):
            pass

    def _all_marked(self, tokens: set[str]) -> bool:
        return all(os.path.exists(os.path.join(self.coord_dir, "finished", self._name(t)))
                   for t in tokens)

    def _claim(self, token: str) -> bool:
        try:
            fd = os.open(os.path.join(self.coord_dir, "claims", self._name(token)),
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def rows(self, roots: list[tuple[str, int]]) -> Iterator[dict[str, Any]]:
        if not roots:
            return
        for token, start in roots:
            self.submit(token, start)
        for t in self.threads:
            t.start()
        try:
            while True:
                row = self.out.get()
                if row is _DONE:
                    with self.lock:
                        if self.outstanding == 0:
                            break
                    continue
                yield row
        finally:
            for _ in self.threads:
                self.work.put(_DONE)
        if self.error is not None:
            raise self.error


def read_partitions(
    database, dialect: str, stream: str, roots: list[tuple[str, int]], end_ns: int,
    heartbeat_ms: int, *, threads: int = 8, follow_children: bool = True,
    max_attempts: int = 6, coord_dir: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Rows of ``roots`` (token, start) and, with ``follow_children``, of their descendants
    that can be read here; ``threads`` partitions are read at the same time; ``coord_dir``
    lets the tasks of one pull hand merge children to each other (see the module doc)."""

    def read(token: str, start_ns: int) -> Iterator[dict]:
        return read_partition_rows(database, dialect, stream, token, start_ns, end_ns,
                                   heartbeat_ms, max_attempts=max_attempts)

    yield from _Workflow(read, threads, follow_children, coord_dir).rows(roots)
