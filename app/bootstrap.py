"""The first minute: with an empty cache, pull the demo world in time slices on a background
thread, so the first slice's chart is on screen while the rest is read.

Each slice is an ordinary pull to a later end of the same stream (the pull reads only the new
span), through the same client code and the same demo server as any pull. Progress is the share
of the world's hour the stream's low watermark has covered, read from the cache after each slice
lands: it only moves when data has landed, and it reaches 100% when the pull is done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_backend.model.timestamps import format_ns

from . import pulling

FIRST_SLICE_S = 300  # the first chart after 5 minutes of the world; then bigger steps
SLICES_S = (300, 900, 1800, 2700, 3600)


@dataclass
class Bootstrap:
    """The demo world being pulled slice by slice into an empty cache."""

    path: str
    start_ns: int
    end_ns: int
    prepare: Callable[[], str]   # starts Spark and the demo server; returns the server's host
    pull: Callable[[pulling.PullForm, str, str], pulling.Outcome]  # (form, host, reader)
    low_watermark: Callable[[], int | None]
    covered_ns: int | None = None
    slices_done: int = 0
    message: str = "starting Spark and the demo server…"
    error: str | None = None
    stream: str | None = None
    began: float = field(default_factory=time.monotonic)
    first_landed_s: float | None = None
    _thread: threading.Thread | None = field(default=None, repr=False)

    def ends(self) -> list[int]:
        return [min(self.end_ns, self.start_ns + int(s * 1e9)) for s in SLICES_S]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bootstrap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            host = self.prepare()
        except Exception as e:  # Spark or the server did not start: say so on the page
            self.error = f"The demo could not start: {str(e).splitlines()[0]}"
            return
        for end in self.ends():
            self.message = (f"reading the demo world up to {format_ns(end)[11:19]} "
                            f"(slice {self.slices_done + 1} of {len(SLICES_S)})")
            # The first slice is read in this process (Spark may still be starting: the
            # first chart does not wait for it); the others by Spark.
            reader = "here" if self.slices_done == 0 else "spark"
            outcome = self.pull(pulling.PullForm(source="demo", start=format_ns(self.start_ns),
                                                 end=format_ns(end)), host, reader)
            if not outcome.ok:
                self.error = outcome.message
                return
            self.stream = outcome.stream or self.stream
            self.slices_done += 1
            if self.first_landed_s is None:
                self.first_landed_s = time.monotonic() - self.began
            self.covered_ns = self.low_watermark() or end
        self.message = "the demo world is cached"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def fraction(self) -> float:
        if self.covered_ns is None:
            return 0.0
        span = max(1, self.end_ns - self.start_ns)
        return max(0.0, min(1.0, (self.covered_ns - self.start_ns) / span))

    def progress_text(self) -> str:
        covered = ("nothing yet" if self.covered_ns is None else
                   f"{format_ns(self.start_ns)[11:19]} → {format_ns(self.covered_ns)[11:19]}")
        return (f"Pulling the demo world: the low watermark has covered {self.fraction:.0%} of "
                f"its hour ({covered}); now {self.message}.")


def make(path: str, cache: Any, lock: Any, prepare: Callable[[], str],
         world_bounds: tuple[int, int]) -> Bootstrap:
    """A bootstrap of ``path`` (not started)."""
    from spark_backend.analysis import low_watermark

    def pull(form: pulling.PullForm, host: str, reader: str) -> pulling.Outcome:
        with lock:
            return pulling.pull(cache, form, lambda p: None, prepare=lambda f: host,
                                reader=reader)

    def low() -> int | None:
        con = cache.cursor()
        try:
            names = [r[0] for r in con.execute("SELECT stream FROM streams").fetchall()]
            return low_watermark(con, names[0])[0] if names else None
        finally:
            con.close()

    return Bootstrap(path, world_bounds[0], world_bounds[1], prepare, pull, low)
