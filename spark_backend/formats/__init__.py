"""File formats the tool imports. Each module exposes ``FORMAT``, ``SYSTEM``, ``Parser`` and
``splittable(head)`` for the shared line reader (``formats.lines``), and
``parse_file(path, options) -> Iterator[dict]`` yielding rows of ``records.RECORD_FIELDS``
(``kind='bad'`` rows for input that cannot be decoded; never raising for bad content).

``splittable(head)``: whether a file beginning with ``head`` (its first bytes, not
compressed) may be read as byte ranges of whole lines by separate tasks, each range on its
own: true where a line means the same wherever the file is cut.

``IN_ORDER`` (optional, default False): a format that is not ``splittable`` but whose
``Parser`` pickles is still cut into parts, read one after another, each part's parser
handed on to the next (``lines.read_part``'s ``state``): a large file is read in bounded
pieces although its lines depend on the lines before them.

``import_sql(stream, pull_id)`` (optional): statements an import runs on the cache once all
its parts landed, in the same transaction (what a part alone could not tell).

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
              seen: dict[str, Any] | None = None, state: bytes | None = None,
              last: bool = True) -> Iterator[dict]:
    """``lines.read_part`` for the format called ``name``."""
    from spark_backend.formats import lines

    return lines.read_part(get(name), path, options, start, end, first_line, origin, seen,
                           state, last)


def in_order(module: ModuleType, head: bytes) -> bool:
    """Whether files of ``module`` beginning with ``head`` are cut into parts read one after
    another (``IN_ORDER``), rather than one part or parts read independently."""
    return not module.splittable(head) and getattr(module, "IN_ORDER", False) \
        and head[:4] != b"Obj\x01"


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise BadInput(
            f"Unknown format {name!r}; accepted formats are: {', '.join(sorted(FORMATS))}."
        )
    return importlib.import_module(FORMATS[name])
