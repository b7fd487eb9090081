"""What the driver knows of a pull's partitions while it runs (:class:`Plan`), and what one
landing's results said (:class:`Wave`): pure bookkeeping, no Spark, no cache."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from spark_backend.model.enums import PartitionState
from spark_backend.spark.packing import Packed, record_rows


@dataclass
class Wave:
    """What one wave's results said, counted as they land."""

    number: int
    records: int = 0                 # data change, heartbeat and child partitions rows
    ended: int = 0                   # partitions read to their end or to the range end
    failed: list[tuple[str, str]] = field(default_factory=list)

    def count(self, table: Any) -> None:
        import pyarrow.compute as pc

        kinds = table.column("kind")
        self.records += record_rows(table)
        ends = table.filter(pc.equal(kinds, "partition_end"))
        for token, extra in zip(ends.column("partition_token").to_pylist(),
                                ends.column("extra").to_pylist(), strict=True):
            detail = json.loads(extra or "{}")
            if detail.get("stopped") == "budget":
                continue  # read on in the next wave
            self.ended += 1
            if detail.get("state") == PartitionState.INCOMPLETE:
                self.failed.append((token, detail.get("error") or "unknown error"))


class Plan:
    """What the driver knows of the partitions while a pull runs, ahead of the cache.

    A task's results say which of its partitions finished, which stopped for the task's
    budget (and where), which it never started and which children their ends announced: the
    next task is started from that at once, while the results still land. The cache stays
    the record (a pull resumes from it), and its frontier is asked again after every landing
    for anything this plan does not know (e.g. a merge child whose other parent finished in
    an earlier pull: seeded with the finished partitions)."""

    def __init__(self, finished: set[str]):
        self.finished = set(finished)
        self.done: set[str] = set()           # read to their end or the range end, or failed
        self.reading: set[str] = set()
        self.ready: dict[str, int] = {}       # token -> read from (UTC ns)
        self.arrived: dict[str, int] = {}     # token -> its rows read so far (continued ones)
        self.waiting: dict[str, tuple[frozenset[str], int]] = {}  # merge child -> parents

    def offer(self, parts: list[tuple[str, int]]) -> None:
        """Partitions the cache says can be read (those already known here are left)."""
        for token, start in parts:
            if token not in self.reading and token not in self.done and token not in self.ready:
                self.waiting.pop(token, None)
                self.ready[token] = start

    def merge_parents_finished(self) -> list[str]:
        """The finished parents of the merge children still waiting for another parent: a
        task told them reads such a child itself once it finished the others."""
        return sorted({p for parents, _ in self.waiting.values() for p in parents
                       if p in self.finished})

    def take(self) -> list[tuple[str, int, int]]:
        """The readable partitions: (token, read from, its rows read before in this pull)."""
        parts, self.ready = list(self.ready.items()), {}
        self.reading.update(token for token, _ in parts)
        return [(token, start, self.arrived.get(token, 0)) for token, start in parts]

    def task_ended(self, roots: list[tuple[str, int, int]], results: list[Packed]) -> None:
        """A task's ``results`` arrived: what can be read next."""
        ends = [end for piece in results for end in piece.ends]
        children = [child for piece in results for child in piece.children]
        seen = set()
        for token, state, budget, read_to, arrival in ends:
            seen.add(token)
            self.reading.discard(token)
            self.waiting.pop(token, None)  # a merge child the task read itself
            if state == PartitionState.OPEN and budget:
                self.ready[token] = read_to + 1  # as the cache's frontier continues it
                self.arrived[token] = arrival  # its rows in this pull count on from there
            else:
                self.arrived.pop(token, None)
                self.done.add(token)
                if state == PartitionState.FINISHED:
                    self.finished.add(token)
        for token, start, _ in roots:
            self.reading.discard(token)
            if token not in seen and token not in self.done:
                self.ready.setdefault(token, start)  # not started: the task stopped first
        for child, parents, start in children:
            if (child not in seen and child not in self.done and child not in self.reading
                    and child not in self.ready):
                self.waiting[child] = (frozenset(parents), start)
        for child, (parents, start) in list(self.waiting.items()):
            if parents <= self.finished:
                del self.waiting[child]
                self.ready[child] = start
