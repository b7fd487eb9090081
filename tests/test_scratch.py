"""The driver JVM's scratch folder (``spark.scratch``): one per process, removed at its exit,
and a folder whose process was killed is removed by the next start, never a living one's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from spark_backend.spark import scratch

ROOT = Path(__file__).resolve().parent.parent
HOLD = ("import sys, os\n"
        "from spark_backend.spark import scratch\n"
        "print(scratch.folder(), flush=True)\n"
        "open(os.path.join(scratch.folder(), 'blockmgr-x'), 'w').close()\n"
        "sys.stdin.read()\n")


def _holder(tmp: Path) -> tuple[subprocess.Popen, Path]:
    """A process that made its scratch folder under ``tmp`` and waits on its stdin."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD], cwd=str(ROOT), text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_process_s_folder_goes_a_living_one_s_stays(tmp_path):
    killed, killed_folder = _holder(tmp_path)
    living, living_folder = _holder(tmp_path)
    assert killed_folder.parent == tmp_path and killed_folder.name.startswith(
        f"{scratch.PREFIX}{killed.pid}-")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (killed_folder / "blockmgr-x").exists()  # a SIGKILL runs no clean-up
    assert scratch.sweep(tmp_path) == [killed_folder.name]
    assert not killed_folder.exists() and (living_folder / "blockmgr-x").exists()
    living.stdin.close()  # it exits: its folder goes with it
    assert living.wait() == 0
    assert list(tmp_path.iterdir()) == []


def test_what_was_not_made_by_a_process_of_the_tool_is_left(tmp_path):
    (tmp_path / f"{scratch.PREFIX}1-mine").mkdir()  # no owner's lock file
    (tmp_path / f"{scratch.PREFIX}2-file").write_text("x")
    (tmp_path / f"{scratch.PREFIX}3-link").symlink_to(tmp_path / f"{scratch.PREFIX}1-mine")
    assert scratch.sweep(tmp_path) == []
    assert len(list(tmp_path.iterdir())) == 3
