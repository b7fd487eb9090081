"""Environment configuration, read in one place as named constants."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

EMULATOR_HOST_ENVVAR = "SPANNER_EMULATOR_HOST"
EMULATOR_BINARY_ENVVAR = "SPANNER_EMULATOR_BINARY"
DEFAULT_EMULATOR_BINARY = "/usr/lib/google-cloud-sdk/bin/cloud_spanner_emulator/emulator_main"
SPARK_MASTER_ENVVAR = "CSI_SPARK_MASTER"
SPARK_REMOTE_ENVVAR = "SPARK_REMOTE"
# Spark settings of the user's, applied last to a classic session (they win over the tool's
# own): ``KEY=VALUE`` entries separated by ``;`` or new lines (``checks.spark_conf``).
SPARK_CONF_ENVVAR = "CSI_SPARK_CONF"
CACHE_ENVVAR = "CSI_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "changestream-inspector" / "cache.duckdb"
MEMORY_ENVVAR = "CSI_DUCKDB_MEMORY"
DEFAULT_MEMORY_LIMIT = "1GB"  # DuckDB's cap for the cache; larger work spills to disk
# ... in a process that only pulls or imports (the CLI, the benchmark): landing reads back
# little of what it wrote, so a small buffer pool lowers a pull's peak memory at the same speed
# (the rest spills to the cache's temporary folder). An import keeps 128MB: it lands all of its
# files in one transaction. A pull's transaction summary gets more when DuckDB refuses it 64MB
# (``Cache._summarize_in_room``). $CSI_DUCKDB_MEMORY overrides both (a cap, never raised).
# Measurements: benchmarks/MEMORY.md ("Figures the code's comments held").
PULL_MEMORY_LIMIT = "64MB"
IMPORT_MEMORY_LIMIT = "128MB"
THREADS_ENVVAR = "CSI_DUCKDB_THREADS"
# ... and DuckDB's threads there: the Spark workers read on the machine's cores meanwhile, and
# fewer DuckDB threads land faster in less memory on 2 cores (benchmarks/MEMORY.md). A quarter
# of the cores, at least one; $CSI_DUCKDB_THREADS sets it.
PULL_THREADS = max(1, (os.cpu_count() or 1) // 4)
# ... and DuckDB's allocator (jemalloc) there gives back what a landing freed: after each
# statement that allocated more than 8 MB, and on a background thread. It lowers a pull's
# typical memory, not its peak or time (benchmarks/MEMORY.md, "The allocator change").
PULL_ALLOCATOR = {"allocator_flush_threshold": "8MB", "allocator_background_threads": True}

# Arrow's allocator (mimalloc) keeps the pages it freed for a second before it gives them back,
# and reads that once, when pyarrow loads: ``spark_backend/__init__.py`` sets it first (and
# ``app/main.py`` imports the package before anything loads pyarrow). A pull frees one task's
# Arrow results after another, in the driver and in Spark's Python workers: 0 gives them back at
# once, which lowers a pull's peak memory for a few percent of landing time.
# glibc's malloc keeps one arena of freed memory per thread that ever allocated (up to 8 per
# core); two per process let the landing, job and reader threads reuse each other's pages.
# glibc reads MALLOC_ARENA_MAX when a process starts: the processes this one starts (Spark's JVM
# and its local Python workers) inherit it; this process's own malloc is left as the user started
# it. A cluster's executors get these from the session (``spark.executorEnv``). A user's own
# setting wins. Measurements: benchmarks/MEMORY.md and docs/pull.md ("Memory of a pull").
ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "0", "MALLOC_ARENA_MAX": "2"}


def set_allocator_env() -> None:
    """The allocator settings of ``ALLOCATOR_ENV`` for the processes this one starts (and
    Arrow's, read when pyarrow loads here); an exported value of the user's is kept."""
    for name, value in ALLOCATOR_ENV.items():
        os.environ.setdefault(name, value)


DEFAULT_HEARTBEAT_MS = 10_000
MIN_HEARTBEAT_MS = 1_000
MAX_HEARTBEAT_MS = 300_000


def emulator_binary() -> str | None:
    """Path of the Cloud Spanner emulator binary, or None when it is not installed."""
    candidate = os.environ.get(EMULATOR_BINARY_ENVVAR) or DEFAULT_EMULATOR_BINARY
    if Path(candidate).is_file() and os.access(candidate, os.X_OK):
        return candidate
    return shutil.which("emulator_main")


def quiet_local_client_env() -> None:
    """Settings every process that talks to a local Spanner endpoint needs."""
    # Without this the client exports metrics and takes ~30 s to exit.
    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # gRPC's fork handlers break channels when Spark forks its JVM launcher and workers.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
