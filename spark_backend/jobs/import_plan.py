"""Planning a file import: each file hashed and cut into byte ranges of whole lines (parts),
the parts grouped into Spark tasks of bounded size; and, once read, the check that every
file is still what was planned.

Bounded memory at any size: a part holds at most about ``RANGE_BYTES`` of its file (a line
never splits, so a part ends at the first line end past the bound), a task at most that many
bytes or ``TASK_FILES`` files, and a task's results are what one part or a few small files
give. Files of a format whose lines depend on the lines before them (``formats.in_order``)
are cut the same way, each part after the first marked ``follows``; an Avro container is cut
between its data blocks where the format gives ``block_cuts``: it is read after the part
before it, with the parser that part left. Files a format cannot read in pieces at all are
one part each. A ``.gz`` file of a format read in pieces is decompressed into a staging folder first
(``plan_gzip``) and its copy cut like any file: its identity (SHA-256, size, the ``origin`` its
rows name) stays the ``.gz`` file's, its line numbers are those of its content. A ``.gz`` file
of any other format, or one that does not decompress, is one part read as it is.

A file that changes while it is imported is never taken for the file that was planned: each
part's SHA-256 is computed here while hashing the whole file, the task reading it hashes the
bytes it actually read, and after the reading the file's size and modification time must be
those seen before it was hashed (``check_unchanged``).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from dataclasses import dataclass, field, replace
from types import ModuleType

from spark_backend.formats import in_order
from spark_backend.model.errors import BadInput, InspectorError

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
    origin: str = ""  # the file the rows name when not ``path`` (a staged copy's ``.gz``)
    follows: bool = False  # read after the part before it, with the parser it left
    last: bool = True  # the file's last part (its parser's ``finish`` rows come here)

    @property
    def named(self) -> str:
        return self.origin or self.path


@dataclass
class PlannedFile:
    path: str                # resolved; for a ``.gz`` file, its decompressed copy
    size: int                # as seen before it was hashed
    mtime_ns: int
    sha256: str              # of the file the user named (the ``.gz`` file itself)
    parts: list[Part] = field(default_factory=list)
    origin: str = ""         # the ``.gz`` file of a decompressed copy
    origin_size: int = -1

    @property
    def named(self) -> str:
        """The file the user named: its rows' ``origin``, its row of ``imports``."""
        return self.origin or self.path

    @property
    def named_size(self) -> int:
        return self.origin_size if self.origin else self.size


class _Cutter:
    """Hashes a file chunk by chunk; with ``range_bytes``, also cuts it into parts."""

    def __init__(self, path: str, range_bytes: int | None, origin: str = "",
                 cuts: list[tuple[int, int]] | None = None):
        self.path = path
        self.cuts = list(cuts or [])  # (offset, first record) where blocks may be cut
        self.by_blocks = bool(self.cuts)
        self.origin = origin
        self.range_bytes = range_bytes
        self.whole = hashlib.sha256()
        self.part = hashlib.sha256()
        self.pos = self.start = self.newlines = 0
        self.first_line = 1
        self.parts: list[Part] = []

    def feed(self, chunk: bytes) -> None:
        self.whole.update(chunk)
        if self.by_blocks:
            self._feed_cuts(chunk)
            return
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

    def _feed_cuts(self, chunk: bytes) -> None:
        """Cut at the block offsets given, a part's first "line" the number of its first
        record."""
        i = 0
        while self.cuts and self.cuts[0][0] <= self.pos + len(chunk):
            offset, first = self.cuts.pop(0)
            self._cut(chunk, i, offset - self.pos)
            self.first_line = first
            i = offset - self.pos
        self.part.update(memoryview(chunk)[i:])
        self.pos += len(chunk)

    def _cut(self, chunk: bytes, i: int, j: int) -> None:
        self.part.update(memoryview(chunk)[i:j])
        self.newlines += chunk.count(b"\n", i, j)
        end = self.pos + j
        self.parts.append(Part(self.path, self.start, end, self.first_line,
                               self.part.hexdigest(), self.origin))
        self.start, self.first_line = end, self.first_line + self.newlines
        self.newlines = 0
        self.part = hashlib.sha256()

    def close(self, in_order: bool = False) -> list[Part]:
        """The parts; with ``in_order``, each after the first ``follows`` the one before."""
        if self.range_bytes is None:
            return [Part(self.path, 0, self.pos, 1, self.whole.hexdigest(), self.origin)]
        if self.pos > self.start or not self.parts:
            self.parts.append(Part(self.path, self.start, self.pos, self.first_line,
                                   self.part.hexdigest(), self.origin))
        if not in_order:
            return self.parts
        last = len(self.parts) - 1
        return [replace(p, follows=i > 0, last=i == last) for i, p in enumerate(self.parts)]


def plan_file(path: str, module: ModuleType, range_bytes: int = RANGE_BYTES,
              origin: str = "") -> PlannedFile:
    """``path`` hashed, and cut into parts where its format allows (OSError if unreadable);
    the parts name ``origin`` as the file their rows come from, when given."""
    st = os.stat(path)
    with open(path, "rb") as f:
        head = f.read(4)
        ordered = head[:2] != _GZIP and in_order(module, head)
        split = head[:2] != _GZIP and (module.splittable(head) or ordered)
        blocks = getattr(module, "block_cuts", None)
        cuts = blocks(path, range_bytes) if blocks and head == b"Obj\x01" else None
        cutter = _Cutter(path, range_bytes if split or cuts else None, origin, cuts)
        cutter.feed(head)
        while chunk := f.read(1 << 20):
            cutter.feed(chunk)
    return PlannedFile(path, st.st_size, st.st_mtime_ns, cutter.whole.hexdigest(),
                       cutter.close(ordered))


class _Hashing:
    """A file read through, hashed as it is read."""

    def __init__(self, raw):
        self.raw = raw
        self.digest = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.digest.update(data)
        self.size += len(data)
        return data


def plan_gzip(path: str, module: ModuleType, staging: str,
              range_bytes: int = RANGE_BYTES) -> PlannedFile | None:
    """A ``.gz`` file whose content ``module`` reads in pieces, decompressed into the folder
    ``staging`` and planned like any file, its SHA-256, size and ``origin`` those of ``path``;
    None when ``path`` is not gzip, its content is not read in pieces, or it does not
    decompress whole (then it is read as one part, which tells where it broke). OSError when
    ``path`` cannot be read; InspectorError when the copy cannot be written."""
    st = os.stat(path)
    with open(path, "rb") as raw:
        if raw.read(2) != _GZIP:
            return None
        raw.seek(0)
        source = _Hashing(raw)
        copy = os.path.join(staging, f"{len(os.listdir(staging)):06d}.data")
        try:
            with gzip.GzipFile(fileobj=source, mode="rb") as unzipped:
                head = unzipped.read(4)
                if not (module.splittable(head) or in_order(module, head)):
                    return None
                _copy_out(unzipped, head, copy, path)
        except (EOFError, zlib.error, gzip.BadGzipFile):
            if os.path.exists(copy):
                os.remove(copy)
            return None
        while source.read(1 << 20):  # bytes past the last member: hashed as the file's
            pass
    if (os.stat(path).st_size, os.stat(path).st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        raise BadInput(f"{path} changed while it was decompressed for the import; import it "
                       "again once the file no longer changes.", field="paths")
    planned = plan_file(copy, module, range_bytes, origin=path)
    planned.sha256, planned.origin, planned.origin_size = (source.digest.hexdigest(), path,
                                                           source.size)
    return planned


def _copy_out(unzipped, head: bytes, copy: str, path: str) -> None:
    try:
        out = open(copy, "wb")
    except OSError as e:
        raise _staging_error(path, copy, e) from e
    with out:
        chunk = head
        while chunk:
            try:
                out.write(chunk)
            except OSError as e:
                raise _staging_error(path, copy, e) from e
            chunk = unzipped.read(1 << 20)


def _staging_error(path: str, copy: str, e: OSError) -> InspectorError:
    return InspectorError(f"Cannot decompress {path} for the import into "
                          f"{os.path.dirname(copy)} ({e.strerror or e}); free space beside "
                          "the cache (its decompressed size), or import the file "
                          "decompressed.")


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
            raise BadInput(f"{planned.named} changed while it was imported ({why}); nothing of "
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
