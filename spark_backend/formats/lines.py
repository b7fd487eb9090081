"""The one line reader every file format shares: open, detect, the line loop, bad lines.

A format module gives ``Parser(origin, options)`` with ``line(number, text)`` (the rows of one
stripped, non-empty line; a line that is not of the format is a ``bad`` row, never an
exception) and ``finish()`` (rows owed at the end, e.g. a data change never finished), and may
give ``not_lines(stream, head, origin, options, first)``: the rows of a file whose content is
not lines of text (an Avro container, its records numbered from ``first``), or None to read
lines. Such a file may still be read in parts where the format gives ``block_cuts`` (see
``jobs.import_plan``) and ``avro_header``: a part past the start is read with the file's
header before its bytes.

A format whose lines are read knowing the lines before them (``formats.in_order``) is read
in parts one after another: the parser of a part that is not the file's last is handed on,
pickled, to the part after it (``state``; ``finish`` runs at the end of the last part only).

``read_part`` reads the lines of one byte range of a file: a range begins at a line start
(``jobs.import_plan`` chooses them) and owns the lines that begin in it, numbered from the
range's ``first_line``. It hashes every byte of the range as it reads it (``seen``), so the
caller can tell whether it read what it planned to read. ``.gz`` content is read whole
(a compressed file has one range).

What a bad line keeps (``preview``): at most ``PREVIEW_CHARS`` characters of it, escaped, with
the whole line's size (``raw_bytes``) and SHA-256 (``raw_sha256``): the quarantine never holds
a line of a file whole, whatever the file was.

Runs inside Spark's Python workers: light imports only, never a whole file in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pickle
import re
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from spark_backend.model.records import bad_row, canonical_json

# A line longer than this is quarantined without being parsed (its size and hash are kept).
MAX_LINE_BYTES = 64 * 1024 * 1024
# Quarantine keeps this many characters of a bad line, escaped, beside its size and SHA-256.
PREVIEW_CHARS = 200
# JSON nested deeper than this is set aside (Python's parser would fail the whole file).
MAX_NESTING = 500
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BOM = b"\xef\xbb\xbf"
_GZIP = b"\x1f\x8b"
_CONTROL = {i: f"\\x{i:02x}" for i in (*range(32), 0x7F)}


def preview(data: bytes) -> str:
    """What quarantine shows of a bad line: its first ``PREVIEW_CHARS`` characters, bytes
    that are not UTF-8 and control characters written as ``\\xNN``; '…' ends a cut one."""
    text = data[: PREVIEW_CHARS * 4].decode("utf-8", errors="backslashreplace")
    text = text.translate(_CONTROL)
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def bad_line(origin: str, number: int | None, data: bytes, reason: str,
             digest: str | None = None, size: int | None = None) -> dict[str, Any]:
    """A ``bad`` row keeping ``preview(data)``, the line's size and SHA-256 (given when the
    line was hashed as it streamed by, else of ``data``)."""
    return bad_row(origin, number, preview(data), reason,
                   raw_bytes=len(data) if size is None else size,
                   raw_sha256=digest or hashlib.sha256(data).hexdigest())


def previewed(row: dict[str, Any]) -> dict[str, Any]:
    """A parser's ``bad`` row with its raw text replaced by what quarantine keeps of it."""
    raw = row.get("raw")
    if row.get("kind") != "bad" or not raw or not isinstance(raw, str):
        return row

    data = raw.encode("utf-8", errors="surrogateescape")
    extra = json.loads(row.get("extra") or "{}")
    extra.setdefault("raw_bytes", len(data))
    extra.setdefault("raw_sha256", hashlib.sha256(data).hexdigest())
    return {**row, "raw": preview(data), "extra": canonical_json(extra)}


class _Range(io.RawIOBase):
    """``limit`` bytes of an open binary file from where it stands, hashed as they are read."""

    def __init__(self, raw, limit: int | None):
        self.raw = raw
        self.left = limit
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view = memoryview(buffer)
        if self.left is not None:
            view = view[: self.left]
        n = self.raw.readinto(view)
        if n:
            self.digest.update(view[:n])
            self.size += n
            if self.left is not None:
                self.left -= n
        return n or 0

    def drain(self) -> None:
        """Read (and hash) the rest of the range that the parsing left unread."""
        chunk = bytearray(1 << 20)
        while self.readinto(chunk):
            pass


def read_part(module: ModuleType, path: str, options: dict[str, str] | None = None,
              start: int = 0, end: int | None = None, first_line: int = 1,
              origin: str | None = None, seen: dict[str, Any] | None = None,
              state: bytes | None = None, last: bool = True) -> Iterator[dict[str, Any]]:
    """Every row of bytes ``[start, end)`` of ``path`` (None: to the end) in ``module``'s
    format, rows naming ``origin`` (default ``path``); never raising.

    Any failure (unreadable, a truncated ``.gz``, a parser error) becomes one bad row naming
    the file and why, after the rows read before it. ``seen`` receives the range's ``bytes``
    and ``sha256`` as read, the rest of the range read through even after a failure.
    ``state``: the pickled parser the part before this one left (None: a new parser); when
    the range is not the file's ``last``, ``seen["state"]`` receives this part's parser,
    pickled, and the rows ``finish`` owes wait for the last part.
    """
    origin = origin or path
    options = dict(options or {})
    try:
        raw = open(path, "rb")
    except Exception as e:  # any failure of one file is that file's alone
        yield _failed(origin, 0, e)
        return
    with raw:
        rng = _Range(raw, None if end is None else end - start)
        landed = 0
        try:
            header = _header(module, raw, start)
            raw.seek(start)
            stream = io.BufferedReader(rng if header is None else _Prefixed(header, rng),
                                       1 << 20)
            for row in _rows(module, stream, 0 if header else start, first_line,
                             origin, options, state, None if last else seen):
                yield previewed(row)
                landed += 1
        except Exception as e:
            yield _failed(origin, landed, e)
        try:
            rng.drain()
        except OSError:  # the failure is told above; the hash then says what was read
            pass
    if seen is not None:
        seen.update(bytes=rng.size, sha256=rng.digest.hexdigest())


class _Prefixed(io.RawIOBase):
    """``head``, then what ``rest`` reads: a block-aligned part read after its file's header."""

    def __init__(self, head: bytes, rest: _Range):
        self.head = memoryview(head)
        self.rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self.head:
            return self.rest.readinto(buffer)
        n = min(len(buffer), len(self.head))
        buffer[:n] = self.head[:n]
        self.head = self.head[n:]
        return n


def _header(module, raw, start: int) -> bytes | None:
    """The header bytes of a block container (``module.avro_header``) when ``start`` is past
    it: a part of the file read on its own needs them before its blocks."""
    walk = getattr(module, "avro_header", None)
    if start == 0 or walk is None:
        return None
    raw.seek(0)
    found = walk(raw)
    if found is None:
        return None
    raw.seek(0)
    return raw.read(found[0])


def _failed(origin: str, landed: int, e: Exception) -> dict[str, Any]:
    detail = (str(e).strip().splitlines() or [""])[0][:500]
    where = f" past its first {landed:,} row(s)" if landed else ""
    return bad_row(origin, None, "", f"cannot read the file{where}: {type(e).__name__}"
                                     f"{': ' + detail if detail else ''}")


def _rows(module, stream, start: int, first_line: int, origin: str,
          options: dict[str, str], state: bytes | None = None,
          handed_on: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    if start == 0 and state is None:
        if stream.peek(2)[:2] == _GZIP:
            stream = gzip.GzipFile(fileobj=stream, mode="rb")
        not_lines = getattr(module, "not_lines", None)
        other = (not_lines(stream, stream.peek(4)[:4], origin, options, first_line)
                 if not_lines else None)
        if other is not None:
            yield from other
            return
    parser = module.Parser(origin, options) if state is None else pickle.loads(state)
    for number, text in _lines(stream, first_line, origin, bom=start == 0):
        if isinstance(text, dict):
            yield text
        elif text:
            yield from parser.line(number, text)
    if handed_on is None:
        yield from parser.finish()
    else:
        handed_on["state"] = pickle.dumps(parser, protocol=pickle.HIGHEST_PROTOCOL)


def _lines(stream, number: int, origin: str, bom: bool) -> Iterator[tuple[int, Any]]:
    """(number, stripped text) per line, or (number, bad row) for a line that is not
    UTF-8, longer than ``MAX_LINE_BYTES`` or nested deeper than ``MAX_NESTING``."""
    while line := stream.readline(MAX_LINE_BYTES + 1):
        if bom and line.startswith(_BOM):
            line = line[len(_BOM):]
        bom = False
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            yield number, _too_long(stream, line, origin, number)
        elif line.count(b"[") + line.count(b"{") > MAX_NESTING and _too_deep(line):
            yield number, bad_line(origin, number, line.rstrip(b"\r\n"),
                                   f"JSON nested deeper than {MAX_NESTING} levels")
        else:
            try:
                yield number, line.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                yield number, bad_line(origin, number, line.rstrip(b"\r\n"),
                                       f"not UTF-8 (byte {e.start + 1} of the line)")
        number += 1


def _too_long(stream, head: bytes, origin: str, number: int) -> dict[str, Any]:
    digest = hashlib.sha256(head)
    size = len(head)
    while chunk := stream.readline(1 << 20):
        digest.update(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            break
    return bad_line(origin, number, head, f"longer than the {MAX_LINE_BYTES:,} bytes a line "
                    f"may have (line of {size:,} bytes)", digest.hexdigest(), size)


def _too_deep(line: bytes) -> bool:
    depth = 0
    for byte in _STRING.sub(b"", line):
        if byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False
