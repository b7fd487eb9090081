"""Sample files to import through a cluster or Spark Connect, and a cache's content to compare
with what a local import of the same files holds."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb

SAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "samples"

# (format, folder of fixtures/samples): every sample of every format the tool imports.
IMPORTS = (("datastream", "datastream"), ("cockroachdb", "cockroachdb"),
           ("bigtable", "bigtable"))

# Columns that differ between two runs of the same import: when, and by which pull.
_VOLATILE = {"pull_id", "first_pull", "last_pull", "imported_at", "quarantined_at",
             "started_at", "finished_at", "created_at"}
# A heartbeat repeated across files keeps the details (extra, arrival) of one of its copies,
# not always the same one (known gap: the copy that lands first within a chunk).
_PER_TABLE = {"heartbeats": {"extra", "arrival"}}


def copy_samples(into: Path) -> Path:
    """The sample folders copied to ``into`` (e.g. a folder the executors cannot see)."""
    for _, folder in IMPORTS:
        shutil.copytree(SAMPLES / folder, into / folder)
    return into


def local_import(samples: Path, into: Path) -> dict[str, str]:
    """The samples under ``samples`` (``copy_samples``) imported into the cache ``into`` in this
    process, through its own local Spark session (the suite's ``spark`` fixture), as the CLI's
    ``import`` does: what the CLI would print, per format."""
    from spark_backend.cache.store import Cache
    from spark_backend.cli import import_summary
    from spark_backend.jobs.files import import_files

    printed = {}
    with Cache(into) as cache:
        for fmt, folder in IMPORTS:
            result = import_files(cache, fmt, fmt, [str(samples / folder)], {})
            printed[fmt] = import_summary(result) + "\n"
    return printed


def cache_contents(path: Path) -> dict[str, list[tuple]]:
    """Every table of a cache but its bookkeeping of runs, rows sorted, volatile columns out."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        tables = [t for (t,) in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' "
            "AND table_type = 'BASE TABLE' AND table_name NOT IN ('meta', 'pulls') "
            "ORDER BY 1").fetchall()]
        contents = {}
        for table in tables:
            columns = [c for (c,) in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "ORDER BY ordinal_position", [table]).fetchall()
                       if c not in _VOLATILE | _PER_TABLE.get(table, set())]
            listed = ", ".join(f'"{c}"' for c in columns)
            contents[table] = con.execute(
                f'SELECT {listed} FROM "{table}" ORDER BY ALL').fetchall()
        return contents
    finally:
        con.close()
