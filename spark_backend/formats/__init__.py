"""File formats the tool imports. Each module exposes ``FORMAT``, ``SYSTEM`` and
``parse_file(path, options) -> Iterator[dict]`` yielding rows of ``records.RECORD_FIELDS``
(``kind='bad'`` rows for input that cannot be decoded; never raising for bad content).

``parse_file`` runs inside Spark's Python workers: it must import only light modules at top level
and must not hold a whole file in memory.
"""

from __future__ import annotations

import gzip
import importlib
from types import ModuleType

from spark_backend.model.errors import BadInput

FORMATS: dict[str, str] = {
    "recording": "spark_backend.formats.recording",
    "datastream": "spark_backend.formats.datastream",
    "cockroachdb": "spark_backend.formats.cockroachdb",
    "bigtable": "spark_backend.formats.bigtable",
}


def open_text(path: str):
    """(text file, its first 4 bytes): ``.gz`` content is decompressed, bad UTF-8 replaced."""
    with open(path, "rb") as probe:
        head = probe.read(4)
    if head[:2] == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace"), head
    return open(path, encoding="utf-8", errors="replace"), head


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise BadInput(
            f"Unknown format {name!r}; accepted formats are: {', '.join(sorted(FORMATS))}."
        )
    return importlib.import_module(FORMATS[name])
