"""The live demo world: the recorded demo world (``world.build_world``) replayed against the wall
clock, faster than life, so a stream is "still changing" while someone watches.

World time ``w`` is shown at wall time ``anchor + (w - stall_from) / speed`` (whole
microseconds): the demo's stalling partition goes silent ``stall_in_s`` seconds after the live
world starts and speaks again ``6 min / speed`` later; partitions split and merge every few tens
of seconds. Only what has happened by now exists: a query's end is cut at now (a real database
would wait for it). After the recorded hour has played (about ``60 min / speed``) the world
stops changing; start a new live world to watch again.

It has what ``demo.server.DemoServer`` uses of a world (``stream``, ``start``, ``query``,
``check_query``), so the same server serves it and the same client code reads it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

from .world import (
    MAX_HEARTBEAT_MS,
    MIN_HEARTBEAT_MS,
    QueryError,
    World,
    build_world,
    format_ts,
    parse_ts,
)

_US = 1_000
_TS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z")


class LiveWorld:
    """``world`` replayed ``speed`` times faster than the wall clock (see the module doc)."""

    def __init__(self, world: World, speed: int = 4, stall_in_s: float = 30.0,
                 clock: Callable[[], int] = time.time_ns):
        if speed < 1:
            raise ValueError("speed must be a whole number >= 1")
        mode = getattr(world, "partition_mode", "IMMUTABLE_KEY_RANGE")
        if mode != "IMMUTABLE_KEY_RANGE":
            raise ValueError(f"the live world replays immutable-key-range worlds, not {mode}")
        self.base = world
        self.speed = int(speed)
        self.clock = clock
        self.stream = world.stream
        token, stall_from, stall_to = world.stall
        self._w0 = stall_from
        self._anchor = (clock() + int(stall_in_s * 1e9)) // _US * _US
        self.stall = (token, self.wall(stall_from), self.wall(stall_to))
        self.start = self.wall(world.start)
        self.ends_at = self.wall(world.end)

    # --- time ------------------------------------------------------------------------------

    def wall(self, w: int) -> int:
        """World nanoseconds -> wall-clock nanoseconds (whole microseconds)."""
        return self._anchor + (w - self._w0) // (self.speed * _US) * _US

    def _world_from(self, t: int) -> int:
        """The first world instant shown at or after wall time ``t``."""
        k = -((self._anchor - t) // _US)  # ceil((t - anchor) / 1us)
        return self._w0 + k * self.speed * _US

    def _world_to(self, t: int) -> int:
        """The last world instant shown at or before wall time ``t``."""
        return self._world_from(t + _US) - 1

    @property
    def now(self) -> int:
        return self.clock()

    @property
    def end(self) -> int:
        """What has happened so far: now, or the end of the recorded hour."""
        return min(self.now // _US * _US, self.ends_at)

    @property
    def finished(self) -> bool:
        return self.now >= self.ends_at

    # --- the read function -----------------------------------------------------------------

    def _wall_text(self, text: str) -> str:
        return format_ts(self.wall(parse_ts(text)))

    def _message(self, message: str) -> str:
        return _TS.sub(lambda m: self._wall_text(m.group(0)), message)

    def _args(self, token: str | None, start_ns: int | None, end_ns: int | None,
              heartbeat_ms: int | None) -> tuple[int | None, int, int | None]:
        if heartbeat_ms is not None and not MIN_HEARTBEAT_MS <= heartbeat_ms <= MAX_HEARTBEAT_MS:
            raise QueryError(
                "OUT_OF_RANGE",
                f"heartbeat_milliseconds must be within min {MIN_HEARTBEAT_MS} and max "
                f"{MAX_HEARTBEAT_MS}. Received heartbeat_milliseconds: {heartbeat_ms}.")
        if start_ns is not None and start_ns > self.end:
            raise QueryError(
                "OUT_OF_RANGE",
                "Specified start_timestamp is too far in the future. Please specify a "
                f"start_timestamp within the earliest read timestamp: {format_ts(self.start)}, "
                f"and the current maximum start timestamp: {format_ts(self.end)}. Received "
                f"start_timestamp: {format_ts(start_ns)}.")
        end = self.end if end_ns is None else min(end_ns, self.end)
        w_start = None if start_ns is None else self._world_from(start_ns)
        if w_start is not None and start_ns >= self.start:  # rounding never moves it earlier
            w_start = max(w_start, self.base.start)
        if token is not None and w_start is not None and self.base.has_partition(token):
            part = self.base.partition(token)
            if start_ns >= self.wall(part.start):
                w_start = max(w_start, part.start)
        w_end = min(self._world_to(end), self.base.end)
        if w_start is not None:
            w_end = max(w_end, w_start)
        hb = None if heartbeat_ms is None else min(MAX_HEARTBEAT_MS, heartbeat_ms * self.speed)
        return w_start, w_end, hb

    def check_query(self, token: str | None, start_ns: int | None, end_ns: int | None,
                    heartbeat_ms: int | None) -> None:
        w_start, w_end, hb = self._args(token, start_ns, end_ns, heartbeat_ms)
        try:
            self.base.check_query(token, w_start, w_end, hb)
        except QueryError as e:
            raise QueryError(e.code, self._message(e.message)) from None

    def query(self, token: str | None, start_ns: int, end_ns: int | None,
              heartbeat_ms: int) -> Iterator[dict]:
        """The read function over what has happened by now, timestamps on the wall clock."""
        w_start, w_end, hb = self._args(token, start_ns, end_ns, heartbeat_ms)
        try:
            rows = self.base.query(token, w_start, w_end, hb)
        except QueryError as e:
            raise QueryError(e.code, self._message(e.message)) from None
        return (self._to_wall(row) for row in rows)

    def _wall_values(self, values: dict) -> dict:
        """A mod's keys or values with every value holding a time on the wall clock too (the
        same mapping as the commit timestamps: a row's ``LastUpdate`` written by a transaction
        equals its record's commit timestamp, live as recorded)."""
        return {name: self._wall_text(v) if isinstance(v, str) and _TS.fullmatch(v) else v
                for name, v in values.items()}

    def _to_wall(self, row: dict) -> dict:
        if "data_change_record" in row:
            rec = row["data_change_record"]
            rec["commit_timestamp"] = self._wall_text(rec["commit_timestamp"])
            rec["mods"] = [{part: self._wall_values(values) for part, values in mod.items()}
                           for mod in rec["mods"]]
        elif "heartbeat_record" in row:
            rec = row["heartbeat_record"]
            rec["timestamp"] = self._wall_text(rec["timestamp"])
        elif "child_partitions_record" in row:
            rec = row["child_partitions_record"]
            rec["start_timestamp"] = self._wall_text(rec["start_timestamp"])
        return row


def build_live_world(seed: int = 7, scale: float = 1.0, speed: int = 4,
                     stall_in_s: float = 30.0) -> LiveWorld:
    """The demo world of ``(seed, scale)``, live from now on."""
    return LiveWorld(build_world(seed, scale), speed=speed, stall_in_s=stall_in_s)
