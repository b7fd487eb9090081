"""A pull's Spark jobs: each reads a group of partitions in one task and hands its results,
packed, to the driver's events when it ends (``DataFrame.toArrow``)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterable

from spark_backend.spark.packing import packed_rows

JOB_DONE = object()  # a job's results were all handed over


class Jobs:
    """Spark jobs reading partitions, one task each, their results handed back through Spark
    when the job ends.

    At most as many tasks run as Spark has slots (a task queued behind a running one would
    leave its partitions unread for that task's time): a task that ends frees its slot for
    the next one, started at once with what can be read then. Every task reads for at most
    ``task_seconds`` (and ``max_rows_per_task`` rows) and ends its results with a marker
    row; everything a task returned lands in ONE transaction, so the cache only ever holds
    whole task results (a crash loses at most the tasks in flight, which the next pull reads
    again).
    """

    def __init__(self, spark, src, request, end_ns, events):
        from spark_backend.spark.session import task_slots

        self.spark, self.src, self.request, self.end_ns = spark, src, request, end_ns
        self.slots = task_slots(spark)
        self.events = events
        self.in_flight = threading.Semaphore(8)  # batches not taken yet: back-pressure
        self.closed = False
        self.tasks: dict[tuple[int, int], list[tuple[str, int, int]]] = {}  # running -> roots
        self.started = 0
        # Spark Connect: processes of the tool share one server-side session, so this pull's
        # operations carry a tag of their own and only they are interrupted on failure.
        self.tag = f"csi-pull-{os.getpid()}-{id(self):x}"

    def free_slots(self) -> int:
        return self.slots - len(self.tasks)

    def start(self, parts: list[tuple[str, int, int]], finished: Iterable[str] = ()) -> None:
        """``min(free slots, len(parts))`` jobs of one task each, reading ``parts`` between
        them; ``finished``: partitions finished before, whose merge children the tasks may
        complete. A job of one task hands its results over when that task ends
        (``DataFrame.toArrow``), so a task's slot is refilled as soon as it ends."""
        n = max(1, min(self.free_slots(), len(parts)))
        for group in (parts[i::n] for i in range(n)):
            self.started += 1
            number = self.started
            self.tasks[(number, 0)] = group
            options = {
                "project": self.src.target.project, "instance": self.src.target.instance,
                "database": self.src.target.database, "dialect": self.src.target.dialect,
                "host": self.src.target.host or "", "stream": self.src.source_stream,
                "heartbeat_ms": str(self.request.heartbeat_ms), "end_ns": str(self.end_ns),
                "max_attempts": str(self.request.tuning.max_attempts),
                "threads": str(self.request.tuning.threads_per_task),
                "max_rows": str(self.request.tuning.max_rows_per_task),
                "max_seconds": str(self.request.tuning.task_seconds), "task_markers": "true",
                "finished": json.dumps(list(finished)),
                "groups": json.dumps([[{"token": t, "start_ns": s, "arrival": a}
                                       for t, s, a in group]]),
            }
            threading.Thread(target=self._run, args=(number, options), daemon=True,
                             name=f"pull-job-{number}").start()

    def _run(self, number: int, options: dict) -> None:
        from spark_backend.spark.datasource import change_stream_frame
        from spark_backend.spark.session import arrow_batches, is_remote

        try:
            if is_remote(self.spark):
                self.spark.addTag(self.tag)  # this thread's operations
            df = change_stream_frame(self.spark, options)
            for piece in packed_rows(arrow_batches(self.spark, df)):
                while not self.in_flight.acquire(timeout=0.5):
                    if self.closed:
                        return  # the pull ended: nobody takes it
                self.events.put((number, piece))
            self.events.put((number, JOB_DONE))
        except BaseException as e:
            self.events.put((number, e))

    def cancel(self) -> None:
        from spark_backend.spark.session import is_remote

        if not is_remote(self.spark):
            with contextlib.suppress(Exception):
                self.spark.sparkContext.cancelAllJobs()
        else:
            with contextlib.suppress(Exception):
                self.spark.interruptTag(self.tag)
