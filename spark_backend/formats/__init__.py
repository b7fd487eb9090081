"""File formats the tool imports. Each module exposes ``FORMAT``, ``SYSTEM`` and
``parse_file(path, options) -> Iterator[dict]`` yielding rows of ``records.RECORD_FIELDS``
(``kind='bad'`` rows for input that cannot be decoded; never raising for bad content).

``parse_file`` runs inside Spark's Python workers: it must import only light modules at top level
and must not hold a whole file in memory.
"""

from __future__ import annotations

import gzip
import importlib
import re
from collections.abc import Iterator
from types import ModuleType

from spark_backend.model.errors import BadInput

FORMATS: dict[str, str] = {
    "recording": "spark_backend.formats.recording",
    "datastream": "spark_backend.formats.datastream",
    "cockroachdb": "spark_backend.formats.cockroachdb",
    "bigtable": "spark_backend.formats.bigtable",
}


# A line longer than this is quarantined without being parsed (its size and hash are kept).
MAX_LINE_BYTES = 64 * 1024 * 1024
# Quarantine keeps at most this much of a bad line, with the line's size and SHA-256.
KEEP_RAW_BYTES = 64 * 1024
# JSON nested deeper than this is set aside (Python's parser would fail the whole file).
MAX_NESTING = 500
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_BOM = b"\xef\xbb\xbf"
# Lines ``open_text`` set aside, by path, for the file reader to quarantine (see take_problems).
_PROBLEMS: dict[str, list[dict]] = {}


def open_text(path: str) -> tuple[_Lines, bytes]:
    """(lines of the file as text, its first 4 bytes); ``.gz`` content is decompressed.

    A UTF-8 byte order mark is dropped. A line that is not UTF-8, or longer than
    ``MAX_LINE_BYTES``, is never altered into text: it reads as an empty line (parsers skip
    those, so line numbers stay right) and is set aside with its reason, size and hash for the
    file reader (``take_problems``) to quarantine.
    """
    with open(path, "rb") as probe:
        head = probe.read(4)
    raw = gzip.open(path, "rb") if head[:2] == b"\x1f\x8b" else open(path, "rb")
    return _Lines(raw, path), head


def text_lines(binary, path: str) -> _Lines:
    """``open_text``'s line reading over an already open binary file."""
    return _Lines(binary, path)


def take_problems(path: str) -> list[dict]:
    """The bad-line rows ``open_text`` set aside for ``path`` since the last call."""
    return _PROBLEMS.pop(path, [])


def quarantine_raw(raw: str | bytes) -> tuple[str, dict]:
    """What quarantine keeps of a bad line: at most ``KEEP_RAW_BYTES`` of it, and (when cut)
    the whole line's size and SHA-256."""
    import hashlib

    data = raw.encode("utf-8", errors="surrogateescape") if isinstance(raw, str) else raw
    if len(data) <= KEEP_RAW_BYTES and isinstance(raw, str):
        return raw, {}
    kept = data[:KEEP_RAW_BYTES].decode("utf-8", errors="backslashreplace")
    return kept, {"raw_bytes": len(data), "raw_sha256": hashlib.sha256(data).hexdigest(),
                  "raw_cut": len(data) > KEEP_RAW_BYTES}


def describe_raw(extra: dict) -> str:
    """The words added to a bad line's reason when its raw text was cut or not decoded."""
    if not extra.get("raw_sha256"):
        return ""
    cut = f"; the first {KEEP_RAW_BYTES // 1024} KiB kept" if extra.get("raw_cut") else ""
    return f" (line of {extra['raw_bytes']:,} bytes, sha256 {extra['raw_sha256']}{cut})"


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


class _Lines:
    """Iterates a binary file as text lines, strictly UTF-8, with bounded line length."""

    def __init__(self, raw, path: str):
        self.raw = raw
        self.path = path
        self.number = 0

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.raw.close()

    def __iter__(self):
        return self

    def __next__(self) -> str:
        line = self.raw.readline(MAX_LINE_BYTES + 1)
        if not line:
            raise StopIteration
        self.number += 1
        if self.number == 1 and line.startswith(_BOM):
            line = line[len(_BOM):]
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            self._too_long(line)
            return ""
        if line.count(b"[") + line.count(b"{") > MAX_NESTING and _too_deep(line):
            self._set_aside(line, f"JSON nested deeper than {MAX_NESTING} levels")
            return ""
        try:
            return line.decode("utf-8")
        except UnicodeDecodeError as e:
            self._set_aside(line, f"not UTF-8 (byte {e.start + 1} of the line); the line was "
                                  "kept as it is, not decoded")
            return ""

    def _too_long(self, head: bytes) -> None:
        import hashlib

        digest = hashlib.sha256(head)
        size = len(head)
        while True:
            chunk = self.raw.readline(1 << 20)
            digest.update(chunk)
            size += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                break
        kept = head[:KEEP_RAW_BYTES].decode("utf-8", errors="backslashreplace")
        extra = {"raw_bytes": size, "raw_sha256": digest.hexdigest(), "raw_cut": True}
        self._add(kept, f"longer than the {MAX_LINE_BYTES:,} bytes a line may have"
                        + describe_raw(extra), **extra)

    def _set_aside(self, line: bytes, reason: str) -> None:
        kept, extra = quarantine_raw(line.rstrip(b"\r\n"))
        self._add(kept, reason + describe_raw(extra), **extra)

    def _add(self, raw: str, reason: str, **extra) -> None:
        from spark_backend.model.records import bad_row

        _PROBLEMS.setdefault(self.path, []).append(
            bad_row(self.path, self.number, raw, reason, **extra))


def read_file(name: str, path: str, options: dict[str, str] | None = None) -> Iterator[dict]:
    """Every row of one file of format ``name``, never raising.

    Any failure of the file (any exception type: unreadable, a truncated ``.gz``, a parser
    error) becomes one bad row naming the file and why, after the rows read before it. Lines
    ``open_text`` set aside (not UTF-8, too long, nested too deep) come as bad rows in their
    place. A bad row keeps at most ``KEEP_RAW_BYTES`` of its line, with its size and hash.
    """
    from spark_backend.model.records import bad_row

    module = get(name)
    take_problems(path)  # nothing left over from an earlier attempt
    landed = 0
    try:
        for row in module.parse_file(path, dict(options or {})):
            yield from take_problems(path)
            yield _capped(row)
            landed += 1
        yield from take_problems(path)
    except Exception as e:  # any failure of one file is that file's alone
        yield from take_problems(path)
        detail = (str(e).strip().splitlines() or [""])[0][:500]
        yield bad_row(path, None, "", (
            f"cannot read the file past its first {landed:,} row(s): "
            f"{type(e).__name__}{': ' + detail if detail else ''}"))


def _capped(row: dict) -> dict:
    if row.get("kind") != "bad" or not isinstance(row.get("raw"), str):
        return row
    kept, extra = quarantine_raw(row["raw"])
    if not extra:
        return row
    import json

    from spark_backend.model.records import canonical_json

    old = json.loads(row.get("extra") or "{}")
    reason = str(old.get("reason", "")) + describe_raw(extra)
    return {**row, "raw": kept, "extra": canonical_json({**old, **extra, "reason": reason})}


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise BadInput(
            f"Unknown format {name!r}; accepted formats are: {', '.join(sorted(FORMATS))}."
        )
    return importlib.import_module(FORMATS[name])
