"""A command leaves nothing behind and tunes nothing: a CLI demo pull, run in a HOME of its own,
leaves no process running once it exited (no detached builder, no JVM, no Python worker), keeps
nothing under ``~/.cache`` but its logs, and every process it started ran at the nice it was
started with."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow  # Spark in the processes it starts

ROOT = Path(__file__).resolve().parents[1]


def _marked(marker: str) -> list[tuple[int, str, int]]:
    """(pid, command, nice) of every process whose environment holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            if marker.encode() not in env:
                continue
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            nice = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[16])
        except (OSError, ValueError, IndexError):
            continue
        found.append((int(entry), command[:120], nice))
    return found


def test_a_cli_pull_leaves_no_process_and_no_archive_behind(tmp_path):
    marker = f"CSI_TEST_RUN={uuid.uuid4().hex}"
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "CSI_SPARK_LOG")}
    env.update(HOME=str(home), CSI_TEST_RUN=marker.split("=", 1)[1])
    seen: list[tuple[int, str, int]] = []
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_backend", "pull", "--source", "demo", "--demo-scale",
         "0.3", "--cache", str(tmp_path / "c.duckdb")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def started_one() -> bool:
        """The pull's own processes while it runs (its JVM, Spark's Python workers)."""
        seen.extend(p for p in _marked(marker) if p[0] != proc.pid)
        return bool(seen) or proc.poll() is not None

    wait_until(started_one, "the pull started a process of its own, or ended")
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, (out[-2000:], err[-2000:])
    wait_until(lambda: not _marked(marker), "every process the pull started has ended")
    assert all(nice == os.nice(0) for _, _, nice in seen), seen
    cached = {p.relative_to(home).parts[:3] for p in home.rglob("*") if p.is_file()}
    assert cached <= {(".cache", "changestream-inspector", "logs")}, cached
