"""File formats the tool imports. Each module exposes ``FORMAT``, ``SYSTEM`` and
``parse_file(path, options) -> Iterator[dict]`` yielding rows of ``records.RECORD_FIELDS``
(``kind='bad'`` rows for input that cannot be decoded; never raising for bad content).

``parse_file`` runs inside Spark's Python workers: it must import only light modules at top level
and must not hold a whole file in memory.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import BadInput

FORMATS: dict[str, str] = {
    "recording": "spark_backend.formats.recording",
    "datastream": "spark_backend.formats.datastream",
    "cockroachdb": "spark_backend.formats.cockroachdb",
    "bigtable": "spark_backend.formats.bigtable",
}


def get(name: str) -> ModuleType:
    if name not in FORMATS:
        raise BadInput(
            f"Unknown format {name!r}; accepted formats are: {', '.join(sorted(FORMATS))}."
        )
    return importlib.import_module(FORMATS[name])
