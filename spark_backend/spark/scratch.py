"""The driver JVM's scratch folder: where Spark puts its block manager, the driver's added
files and pyspark's folders for this process.

Spark makes those folders under ``java.io.tmpdir`` (``/tmp``) and removes them in a shutdown
hook, which a SIGKILL never runs: each killed command would leave three folders behind. Here
they live in one folder of this process, ``csi-spark-<pid>-*`` under the temporary folder
(``$TMPDIR``). The process holds an exclusive ``flock`` on the folder's ``.owner`` file for its
life; the kernel lets go of it when the process ends, however it ends. So a later start
removes every such folder whose lock it can take (its owner is gone), and a folder of a running
process, also one in another PID namespace sharing the folder, is never touched.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
import threading
from pathlib import Path

PREFIX = "csi-spark-"
_lock = threading.Lock()
_folder: str | None = None
_owner: int | None = None  # the descriptor holding the lock, open for the process's life


def folder() -> str:
    """This process's scratch folder, made (and the folders of ended processes removed) on
    the first call; removed when the process exits."""
    global _folder, _owner
    with _lock:
        if _folder is None:
            root = tempfile.gettempdir()
            sweep(root)
            # made under a name no sweep looks at, and named only once its lock is held
            making = tempfile.mkdtemp(prefix=f".{PREFIX}", dir=root)
            fd = os.open(os.path.join(making, ".owner"), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            made = os.path.join(root, f"{PREFIX}{os.getpid()}-{os.path.basename(making)[-8:]}")
            os.rename(making, made)
            _folder, _owner = made, fd
            atexit.register(shutil.rmtree, made, True)
        return _folder


def sweep(root: str | os.PathLike) -> list[str]:
    """Remove the scratch folders under ``root`` that no process owns any more; their names."""
    removed = []
    for entry in Path(root).glob(f"{PREFIX}*"):
        if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != os.getuid():
            continue
        try:
            fd = os.open(entry / ".owner", os.O_RDWR)
        except OSError:
            continue  # not made by folder(), or being made: not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its process lives
        finally:
            os.close(fd)
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry.name)
    return removed
