"""Private temporary folders of this process, named ``<prefix><pid>-…`` under the system's
temp folder, so that the next process can remove the ones a killed process left behind."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def make(prefix: str) -> Path:
    """A new folder (mode 0700) of this process, after removing the orphans of ``prefix``."""
    remove_orphans(prefix)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def remove_orphans(prefix: str) -> None:
    """Folders of ``prefix`` whose process is gone (killed before its exit handler ran)."""
    name = re.compile(rf"^{re.escape(prefix)}(\d+)-")
    for entry in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        found = name.match(entry.name)
        if found and entry.is_dir() and not _alive(int(found.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
