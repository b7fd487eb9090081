"""Whether this process was asked to stop (SIGINT, SIGTERM), as its entry point recorded it.

A signal raises ``KeyboardInterrupt`` in the main thread wherever it is, and some libraries
turn that into errors of their own (DuckDB's "Query interrupted" ``RuntimeError``, a module
whose import was cut off, a Spark start that "failed"). What such an error ends is an
interruption, not a failure: the command line records the signal here first, and the cache
records a pull that ends after it as ``interrupted`` (``Cache.finish_pull``).
"""

from __future__ import annotations

import signal

_requested: int | None = None


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
    global _requested
    _requested = None


def name(signum: int | None) -> str:
    """``SIGINT``, ``SIGTERM``...; ``an interrupt`` when no signal was recorded."""
    if signum is None:
        return "an interrupt"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
