"""Waiting in tests on what happened, never on how long it usually takes.

``wait_until`` returns as soon as a condition holds; its bound is a hang detector far above
anything a loaded machine needs (the condition is about an event, not about a time).
``ThreadClock`` stands in for ``time`` in a module whose rules measure how long something took:
the test says how long a wait was, and no load on the machine shows in what the code measures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

HANG_S = 120.0  # a condition this long unmet is a hang, not a slow machine


def wait_until(condition: Callable[[], object], what: str, hang_s: float = HANG_S,
               poll_s: float = 0.005) -> None:
    """Return once ``condition()`` is true; fail naming ``what`` if it never becomes true."""
    stop = time.monotonic() + hang_s
    while not condition():
        if time.monotonic() > stop:
            raise AssertionError(f"never happened (waited {hang_s:.0f} s): {what}")
        time.sleep(poll_s)


class ThreadClock:
    """``time`` with a ``monotonic()`` of each thread's own, moved only by ``advance``.

    Patched over a module's ``time`` (``monkeypatch.setattr(module, "time", clock)``), it lets
    a test's row source "take" a chosen time to produce a row while everything else takes none;
    every other name is the real ``time`` module's.
    """

    def __init__(self, start: float = 1_000.0):
        self._start = start
        self._now: dict[int, float] = {}
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now.get(threading.get_ident(), self._start)

    def advance(self, seconds: float) -> None:
        """The calling thread's clock moves ``seconds`` on (as a wait of that long would)."""
        with self._lock:
            ident = threading.get_ident()
            self._now[ident] = self._now.get(ident, self._start) + seconds

    def __getattr__(self, name: str):
        return getattr(time, name)
