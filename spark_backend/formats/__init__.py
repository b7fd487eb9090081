"""File formats the tool imports. Each module exposes ``FORMAT``, ``SYSTEM``, ``Parser`` and
``splittable(head)`` for the shared line reader (``formats.lines``), and
``parse_file(path, options) -> Iterator[dict]`` yielding rows of ``records.RECORD_FIELDS``
(``kind='bad'`` rows for input that cannot be decoded; never raising for bad content).

``splittable(head)``: whether a file beginning with ``head`` (its first bytes, not
compressed) may be read as byte ranges of whole lines by separate tasks, each range on its
own: true where a line means the same wherever the file is cut.

Parsers run inside Spark's Python workers: they import only light modules at top level and
never hold a whole file in memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from spark_backend.model.errors import BadInput

FORMATS: dict[str, str] = {
    "recording": "spark_backend.formats.recording",
    "datastream": "spark_backend.formats.datastream",
    "cockroachdb": "spark_backend.formats.cockroachdb",
    "bigtable": "spark_backend.formats.bigtable",
}


def read_file(name: str, path: str, options: dict[str, str] | None = None) -> Iterator[dict]:
    """Every row of one file of format ``name``, never raising (``lines.read_part`` over the
    whole file): a failure of the file is one bad row after the rows read before it; a bad
    line keeps a preview, its size and its hash."""
    from spark_backend.formats.lines import read_part

    return read_part(get(name), path, options)


def read_part(name: str, path: str, options: dict[str, str] | None, start: int,
              end: int | None, first_line: int, origin: str | None = None,
              seen: dict[str, Any] | None = None) -> Iterator[dict]:
    """``lines.read_part`` for the format called ``name``."""
    from spark_backend.formats import lines

    return lines.read_part(get(name), path, options, start, end, first_line, origin, seen)


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise BadInput(
            f"Unknown format {name!r}; accepted formats are: {', '.join(sorted(FORMATS))}."
        )
    return importlib.import_module(FORMATS[name])
