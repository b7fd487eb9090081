"""Whether this process was asked to stop (SIGINT, SIGTERM), as its entry point recorded it.

A signal raises ``KeyboardInterrupt`` in the main thread wherever it is, and some libraries
turn that into errors of their own (DuckDB's "Query interrupted" ``RuntimeError``, a module
whose import was cut off, a Spark start that "failed"). What such an error ends is an
interruption, not a failure: the command line records the signal here first, and the cache
records a pull that ends after it as ``interrupted`` (``Cache.finish_pull``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_requested: int | None = None
_deferring = 0  # the main thread is in this many ``deferred`` steps
_pending = False  # a signal came during one: raised when the outermost ends


def request(signum: int) -> None:
    """Record that the process was asked to stop by ``signum`` (the first one counts)."""
    global _requested
    if _requested is None:
        _requested = signum


def requested() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _requested


def clear() -> None:
    """Forget a recorded request (an entry point that runs again in the same process)."""
    global _requested, _pending
    _requested, _pending = None, False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A step of the main thread that a stop must not cut in two (recording a pull's end): a
    signal that comes meanwhile is held (``hold``) and raised as ``KeyboardInterrupt`` when
    the step ends. Other threads' steps are not held (signals interrupt the main thread)."""
    global _deferring, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if _deferring == 0 and _pending:
        _pending = False
        raise KeyboardInterrupt


def hold() -> bool:
    """For a signal handler: True when the main thread is in a ``deferred`` step, which then
    raises ``KeyboardInterrupt`` at its end (the handler must not raise now)."""
    global _pending
    if _deferring:
        _pending = True
        return True
    return False


def name(signum: int | None) -> str:
    """``SIGINT``, ``SIGTERM``...; ``an interrupt`` when no signal was recorded."""
    if signum is None:
        return "an interrupt"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
