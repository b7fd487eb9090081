"""Keeps the fast tier (``pytest -m "not slow"``) free of JVMs, emulators and browsers.

In a run whose ``-m`` expression leaves slow tests out (or with ``CSI_TIER_GUARD=1``), a test
that is not marked ``slow`` runs with tripwires set, and fails naming what it started:

- the ``spark`` and ``emulator_binary`` fixtures (asked for at all);
- ``java`` (a Spark driver in this process or in any child: pyspark's launcher runs the first
  ``java`` on PATH when JAVA_HOME is unset, and a child inherits PATH), and pyspark's
  ``SparkSession.Builder.getOrCreate`` in this process (a JVM an earlier slow test started);
- the emulator (``$SPANNER_EMULATOR_BINARY`` and ``emulator_main`` on PATH name a tripwire);
- chromium through Playwright (``BrowserType.launch`` / ``launch_persistent_context``).

A tripwire records what was started and refuses it (the program exits 1, the call raises), so
the test also fails at the point of the start, and its report says to mark it slow.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

SLOW_FIXTURES = ("spark", "emulator_binary", "browser")
_SHIMMED = ("java", "emulator_main", "chromium", "chromium-browser")
_LOG_ENVVAR = "CSI_TIER_GUARD_LOG"
FORCE_ENVVAR = "CSI_TIER_GUARD"  # "1": tripwires in any run, whatever its -m
_active = False
_tripped: dict[str, list[str]] = {}
_reported: set[str] = set()
_log: Path | None = None


class StartedInFastTier(AssertionError):
    """A test outside the slow tier started a JVM, the emulator or a browser."""


def configure(config: pytest.Config) -> None:
    """Arm the tripwires for a run that leaves slow tests out (``-m "not slow"``, alone or in
    a larger expression), or when ``$CSI_TIER_GUARD`` is 1."""
    global _active
    expression = " ".join((config.getoption("markexpr", "") or "").split())
    _active = "not slow" in expression or os.environ.get(FORCE_ENVVAR) == "1"


def is_slow(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None


def guards(item: pytest.Item) -> bool:
    """True when ``item`` runs with the tripwires: an armed run and a test not marked slow."""
    return _active and not is_slow(item)


def _shim_dir() -> Path:
    """A folder of programs named like the slow ones, each logging its start and exiting 1."""
    folder = Path(tempfile.mkdtemp(prefix="csi-tier-guard-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    for name in _SHIMMED:
        path = folder / name
        path.write_text(
            "#!/bin/sh\n"
            f'echo "{name} $*" >> "${{{_LOG_ENVVAR}}}"\n'
            f'echo "{name} refused: the test is not marked slow (tests/support/tier_guard.py)"'
            " >&2\n"
            "exit 1\n"
        )
        path.chmod(0o755)
    return folder


_SHIMS: Path | None = None


def _shims() -> Path:
    global _SHIMS
    if _SHIMS is None:
        _SHIMS = _shim_dir()
    return _SHIMS


def _refuse(item: pytest.Item, what: str):
    def refused(*args, **kwargs):
        _tripped.setdefault(item.nodeid, []).append(what)
        raise StartedInFastTier(f"{item.nodeid} started {what} but is not marked slow")

    return refused


def check_fixtures(item: pytest.Item) -> None:
    """Fail, before its fixtures start anything, a test not marked slow that asks for one of
    ``SLOW_FIXTURES``."""
    if not guards(item):
        return
    asked = [name for name in SLOW_FIXTURES if name in getattr(item, "fixturenames", ())]
    if asked:
        _reported.add(item.nodeid)
        pytest.fail(_message(item, ", ".join(f"the {name!r} fixture" for name in asked)),
                    pytrace=False)


@contextlib.contextmanager
def tripwires(item: pytest.Item) -> Iterator[None]:
    """Set the tripwires for one test not marked slow (setup, call and teardown)."""
    global _log
    shims = _shims()
    _log = shims / f"log-{os.getpid()}"
    _log.write_text("")
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv("PATH", f"{shims}{os.pathsep}{os.environ.get('PATH', '')}")
        patch.setenv("SPANNER_EMULATOR_BINARY", str(shims / "emulator_main"))
        patch.setenv(_LOG_ENVVAR, str(_log))
        from pyspark.sql import SparkSession

        patch.setattr(SparkSession.Builder, "getOrCreate",
                      _refuse(item, "a Spark session (SparkSession.builder.getOrCreate)"))
        with contextlib.suppress(ImportError):
            from playwright.sync_api import BrowserType

            patch.setattr(BrowserType, "launch", _refuse(item, "chromium (Playwright)"))
            patch.setattr(BrowserType, "launch_persistent_context",
                          _refuse(item, "chromium (Playwright)"))
        yield
    finally:
        patch.undo()
        _log.unlink(missing_ok=True)
        _log = None
        _tripped.pop(item.nodeid, None)


def _started(item: pytest.Item) -> list[str]:
    """What the test has started so far, in-process calls and shims' log lines."""
    what = list(_tripped.get(item.nodeid, ()))
    if _log is not None and _log.exists():
        for line in _log.read_text().splitlines():
            name = line.split(" ", 1)[0]
            what.append(f"{name} (a JVM)" if name == "java" else name)
    return what


def _message(item: pytest.Item, names: str) -> str:
    return (
        f"{item.nodeid} is not marked slow but started {names}: a test that starts a JVM "
        "(Spark), the Cloud Spanner emulator or a browser must be marked @pytest.mark.slow "
        "(or `pytestmark = pytest.mark.slow` for its module) so `pytest -m \"not slow\"` "
        "leaves it out."
    )


def fail_report_if_tripped(item: pytest.Item, report: pytest.TestReport) -> None:
    """Turn the first report after a tripwire fired into a failure that says what started."""
    if item.nodeid in _reported or not guards(item):
        return
    what = _started(item)
    if not what:
        return
    _reported.add(item.nodeid)
    report.outcome = "failed"
    report.longrepr = _message(item, ", ".join(dict.fromkeys(what)))
