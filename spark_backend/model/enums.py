"""The closed sets of the domain, as ``str`` enums (their values are what the cache stores)."""

from __future__ import annotations

from enum import Enum, StrEnum


class Dialect(StrEnum):
    GOOGLESQL = "googlesql"
    POSTGRESQL = "postgresql"


class Source(StrEnum):
    """Where a pull reads from."""

    DEMO = "demo"
    EMULATOR = "emulator"
    SPANNER = "spanner"


class PartitionState(StrEnum):
    """A partition's state in the cache.

    ``pending``: announced by a parent, not read yet; ``open``: read up to ``read_to`` (the
    range end) without finishing; ``finished``: read to its end; ``incomplete``: a read that
    failed after retries (pull again to resume it from its watermark).
    """

    PENDING = "pending"
    OPEN = "open"
    FINISHED = "finished"
    INCOMPLETE = "incomplete"


class EdgeKind(StrEnum):
    """How a partition is related to its parent in the DAG."""

    ROOT = "root"      # a child of the initial query
    SPLIT = "split"    # a parent with several children
    MERGE = "merge"    # a child with several parents
    MOVE = "move"      # one parent, one child
    MOVE_IN = "move_in"    # MUTABLE_KEY_RANGE: a key range moved into a partition
    MOVE_OUT = "move_out"  # MUTABLE_KEY_RANGE: a key range moved out of a partition


def values(enum: type[Enum]) -> tuple[str, ...]:
    """The accepted values of an enum, for messages and choices."""
    return tuple(m.value for m in enum)
