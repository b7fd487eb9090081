"""SIGINT and SIGTERM at several moments of a pull from the real command line (``python -m
spark_backend.cli pull --source demo``): during Spark's start, mid-read and while the pull
summarizes its transactions. Each ends within seconds with one sentence on stderr and exit
130 / 143, leaves no process it started (Spark's JVM, its Python workers), records the pull as
interrupted, and the pulls after it end with the demo world's exact ground truth.

SIGINT goes to the command's process group, as a terminal's Ctrl-C does (the JVM and the
workers get it too); SIGTERM to the command alone, as ``kill`` does. Every process the command
starts inherits its environment, so a mark of the test's in it finds them all in /proc, also
those that left the command's tree."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.test_pull_demo import assert_equals_world

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.3"
STREAM = "DemoStream"
MARK = "CSI_SIGNALS_TEST"
SAID = {
    signal.SIGINT: "interrupted: the cache is consistent; run the same pull again to resume.\n",
    signal.SIGTERM: "stopped by SIGTERM: the cache is consistent; run the same pull again to "
                    "resume.\n",
}


class _Pull:
    """The CLI's pull (or ``argv``) as a subprocess, its stdout lines collected as they
    come."""

    def __init__(self, cache: Path, *argv: str):
        self.mark = uuid.uuid4().hex
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", MARK: self.mark}
        argv = argv or ("pull", "--source", "demo", "--demo-scale", SCALE)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spark_backend.cli", *argv, "--cache", str(cache)],
            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.lines.append("")  # the end of stdout
            self.changed.notify_all()

    def wait_for_line(self, pattern: str) -> None:
        """Until a progress line matches ``pattern`` (fails if stdout ends first)."""
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    if line == "":
                        pytest.fail(f"the pull ended before a line matching {pattern!r}: "
                                    f"{''.join(self.lines)[-800:]}")
                    if re.search(pattern, line):
                        return
                seen = len(self.lines)
                self.changed.wait()

    def wait_for_jvm(self) -> None:
        """Until the driver JVM runs (before any progress line): /proc has no event to wait
        on, so it is looked at every 50 ms."""
        while not any(b"java" in cmd for _, cmd in marked(self.mark)):
            if any(" - " in line for line in self.lines):
                pytest.fail(f"a progress line came before the JVM was seen: {self.lines}")
            assert self.proc.poll() is None, self.proc.stderr.read()
            time.sleep(0.05)

    def stop(self, sig: int) -> tuple[int, str]:
        """Send ``sig`` (SIGINT to the group, SIGTERM to the command); its exit code and
        stderr. Fails if it does not end within 60 s."""
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)
        try:
            code = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            left = marked(self.mark)
            os.killpg(self.proc.pid, signal.SIGKILL)
            for pid, _ in left:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the pull did not end within 60 s of {sig!r}; processes: {left}")
        self.reader.join()
        return code, self.proc.stderr.read()


def marked(mark: str) -> list[tuple[int, bytes]]:
    """Living processes (not zombies) whose environment holds the test's mark."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if f"{MARK}={mark}".encode() not in Path(f"/proc/{entry}/environ").read_bytes():
                continue
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if state not in ("Z", "X"):
            found.append((int(entry), cmd[:200]))
    return found


def _stopped(pull: _Pull, sig: int, said: str | None = None) -> None:
    """Stop ``pull`` with ``sig`` and check how it ended."""
    code, err = pull.stop(sig)
    assert (code, err) == (128 + sig, said or SAID[sig])
    assert marked(pull.mark) == []  # no JVM, worker or server outlived the command


def _complete(cache: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "spark_backend.cli", "pull", "--source", "demo",
         "--demo-scale", SCALE, "--cache", str(cache)],
        cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=900,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def _statuses(cache: Path) -> list[tuple[str, str | None]]:
    with Cache(cache, read_only=True) as c:
        return c.con.execute("SELECT status, error FROM pulls ORDER BY pull_id").fetchall()


@pytest.fixture(scope="module")
def world():
    return build_world(scale=float(SCALE))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_at_each_moment_of_a_pull_then_the_next_pull_is_exact(tmp_path, world, sig):
    cache = tmp_path / "c.duckdb"

    # During Spark's start: nothing was recorded, and the file it created goes.
    pull = _Pull(cache)
    pull.wait_for_jvm()
    _stopped(pull, sig)
    assert not cache.exists()

    # Mid-read: the reads so far are kept and the pull is recorded as interrupted.
    pull = _Pull(cache)
    pull.wait_for_line(r"job \d+: reading")
    _stopped(pull, sig)
    statuses = _statuses(cache)
    assert [s for s, _ in statuses] == ["interrupted"], statuses
    assert sig.name in statuses[0][1] or "interrupted by the user" in statuses[0][1]

    # While the next pull summarizes its transactions (into the existing cache): its reads
    # were complete and are recorded so; the summary is left to the next open.
    pull = _Pull(cache)
    pull.wait_for_line("summarizing the transactions")
    _stopped(pull, sig)
    assert [s for s, _ in _statuses(cache)] == ["interrupted", "complete"]

    out = _complete(cache)
    assert "the range is already cached; nothing to read" in out, out
    with Cache(cache) as c:
        assert_equals_world(c, STREAM, world, heartbeats=False)
    assert [s for s, _ in _statuses(cache)] == ["interrupted", "complete", "nothing-to-do"]
    left = [p.name for p in tmp_path.iterdir() if p.name != "c.duckdb"]
    assert left == [], left  # no staging folder, no DuckDB spill folder, no WAL


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_an_import_then_the_import_again_is_exact(tmp_path, sig):
    """Ctrl-C (or SIGTERM) once the import says what it reads (its Spark starts then): the
    import again lands exactly what an import that was never interrupted lands."""
    from tests.support.imports import SAMPLES, cache_contents

    argv = ("import", "--format", "datastream", "--stream", "DS", str(SAMPLES / "datastream"))
    cache = tmp_path / "c.duckdb"
    run = _Pull(cache, *argv)
    run.wait_for_line(r"part\(s\)")
    said = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}[sig]
    _stopped(run, sig,
             f"{said}: the cache is consistent; run the same import again to finish it.\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for path in (cache, tmp_path / "clean.duckdb"):
        done = subprocess.run([sys.executable, "-m", "spark_backend.cli", *argv, "--cache",
                               str(path)], cwd=str(ROOT), env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    assert cache_contents(cache) == cache_contents(tmp_path / "clean.duckdb")


def test_sigterm_of_an_emulator_pull_leaves_no_emulator(tmp_path):
    """SIGTERM while a pull reads the emulator it started (its own process group, so a
    terminal's Ctrl-C would not reach it): the emulator goes with the command."""
    from tests.conftest import require_emulator

    require_emulator()
    run = _Pull(tmp_path / "c.duckdb", "pull", "--source", "emulator", "--emulator-seconds", "4")
    run.wait_for_line(r"job \d+: reading")
    assert any(b"emulator" in cmd for _, cmd in marked(run.mark))  # the moment has one
    _stopped(run, signal.SIGTERM)
    statuses = _statuses(tmp_path / "c.duckdb")
    assert [s for s, _ in statuses] == ["interrupted"], statuses


def test_a_second_sigint_stops_at_once_with_one_sentence(tmp_path):
    """Ctrl-C twice mid-read: the second stops the command at once (no wait for its
    clean-up), still with one sentence and nothing it started left running; the next
    read-write open recovers the cache (the pull is then recorded interrupted)."""
    run = _Pull(tmp_path / "c.duckdb")
    run.wait_for_line(r"job \d+: reading")
    os.killpg(run.proc.pid, signal.SIGINT)
    code, err = run.stop(signal.SIGINT)
    assert code == 130 and err.count("\n") == 1, err
    assert err in (SAID[signal.SIGINT], "stopped at once by a second SIGINT: the cache is "
                   "recovered by the next pull or import.\n")
    assert marked(run.mark) == []
    with Cache(tmp_path / "c.duckdb") as c:
        assert c.con.execute("SELECT status FROM pulls").fetchall() == [("interrupted",)]
