"""Planning a file import: each file hashed and cut into byte ranges of whole lines (parts),
the parts grouped into Spark tasks of bounded size; and, once read, the check that every
file is still what was planned.

Bounded memory at any size: a part holds at most about ``RANGE_BYTES`` of its file (a line
never splits, so a part ends at the first line end past the bound), a task at most that many
bytes or ``TASK_FILES`` files, and a task's results are what one part or a few small files
give. Files a format cannot read in pieces (``formats.<module>.splittable``), and ``.gz``
files, are one part each.

A file that changes while it is imported is never taken for the file that was planned: each
part's SHA-256 is computed here while hashing the whole file, the task reading it hashes the
bytes it actually read, and after the reading the file's size and modification time must be
those seen before it was hashed (``check_unchanged``).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from types import ModuleType

from spark_backend.model.errors import BadInput

RANGE_BYTES = 32 * 1024 * 1024
TASK_FILES = 500
_GZIP = b"\x1f\x8b"


@dataclass(frozen=True)
class Part:
    """Bytes ``[start, end)`` of ``path``: whole lines, the first numbered ``first_line``."""

    path: str
    start: int
    end: int
    first_line: int
    sha256: str


@dataclass
class PlannedFile:
    path: str                # resolved
    size: int                # as seen before it was hashed
    mtime_ns: int
    sha256: str
    parts: list[Part] = field(default_factory=list)


class _Cutter:
    """Hashes a file chunk by chunk; with ``range_bytes``, also cuts it into parts."""

    def __init__(self, path: str, range_bytes: int | None):
        self.path = path
        self.range_bytes = range_bytes
        self.whole = hashlib.sha256()
        self.part = hashlib.sha256()
        self.pos = self.start = self.newlines = 0
        self.first_line = 1
        self.parts: list[Part] = []

    def feed(self, chunk: bytes) -> None:
        self.whole.update(chunk)
        if self.range_bytes is None:
            self.pos += len(chunk)
            return
        i = 0
        while (j := chunk.find(b"\n", max(i, self.start + self.range_bytes - 1 - self.pos))) >= 0:
            self._cut(chunk, i, j + 1)
            i = j + 1
        self.part.update(memoryview(chunk)[i:])
        self.newlines += chunk.count(b"\n", i)
        self.pos += len(chunk)

    def _cut(self, chunk: bytes, i: int, j: int) -> None:
        self.part.update(memoryview(chunk)[i:j])
        self.newlines += chunk.count(b"\n", i, j)
        end = self.pos + j
        self.parts.append(Part(self.path, self.start, end, self.first_line,
                               self.part.hexdigest()))
        self.start, self.first_line = end, self.first_line + self.newlines
        self.newlines = 0
        self.part = hashlib.sha256()

    def close(self) -> list[Part]:
        if self.range_bytes is None:
            return [Part(self.path, 0, self.pos, 1, self.whole.hexdigest())]
        if self.pos > self.start or not self.parts:
            self.parts.append(Part(self.path, self.start, self.pos, self.first_line,
                                   self.part.hexdigest()))
        return self.parts


def plan_file(path: str, module: ModuleType, range_bytes: int = RANGE_BYTES) -> PlannedFile:
    """``path`` hashed, and cut into parts where its format allows (OSError if unreadable)."""
    st = os.stat(path)
    with open(path, "rb") as f:
        head = f.read(4)
        split = head[:2] != _GZIP and module.splittable(head)
        cutter = _Cutter(path, range_bytes if split else None)
        cutter.feed(head)
        while chunk := f.read(1 << 20):
            cutter.feed(chunk)
    return PlannedFile(path, st.st_size, st.st_mtime_ns, cutter.whole.hexdigest(),
                       cutter.close())


def tasks_of(parts: list[Part], task_bytes: int = RANGE_BYTES,
             task_files: int = TASK_FILES) -> list[list[Part]]:
    """Parts grouped in order into tasks of at most ``task_bytes`` (a larger part alone) and
    ``task_files`` parts."""
    tasks: list[list[Part]] = []
    size = 0
    for part in parts:
        length = part.end - part.start
        if not tasks or len(tasks[-1]) >= task_files or size + length > task_bytes:
            tasks.append([])
            size = 0
        tasks[-1].append(part)
        size += length
    return tasks


def check_unchanged(files: list[PlannedFile],
                    read: dict[tuple[str, int], tuple[int | None, str | None]]) -> None:
    """BadInput naming the first file that is not what was planned: a part read with other
    bytes than were hashed (``read``: (path, start) -> (bytes, sha256) as the task read
    them), or a size or modification time that moved since."""
    for planned in files:
        why = _changed(planned, read)
        if why:
            raise BadInput(f"{planned.path} changed while it was imported ({why}); nothing of "
                           "this import was kept: import it again once the file no longer "
                           "changes.", field="paths")


def _changed(planned: PlannedFile,
             read: dict[tuple[str, int], tuple[int | None, str | None]]) -> str | None:
    for part in planned.parts:
        got = read.get((part.path, part.start))
        if got is None:
            return f"bytes {part.start:,} to {part.end:,} were not read"
        if got[0] is None:
            return "it could not be opened again to be read"
        if got != (part.end - part.start, part.sha256):
            return (f"bytes {part.start:,} to {part.end:,} read as {got[0]:,} bytes of other "
                    "content than were hashed before")
    try:
        st = os.stat(planned.path)
    except OSError as e:
        return f"it cannot be read any more: {e.strerror or e}"
    if st.st_size != planned.size:
        return f"it was {planned.size:,} bytes and is {st.st_size:,} now"
    if st.st_mtime_ns != planned.mtime_ns:
        return "it was written to since the import began"
    return None
