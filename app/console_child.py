"""The SQL console's worker: runs one query on a read-only snapshot, in a process of its own.

Started by ``app.console_process`` as ``python -I console_child.py FD`` with a JSON request on
stdin (``db``, ``sql``, ``max_rows``, ``memory_bytes``, ``duckdb_memory``, ``threads``,
``cpu_seconds``, ``parent``). Before DuckDB is even imported it asks the kernel to kill it with
its parent and sets its own limits: address space (``RLIMIT_AS``), CPU seconds
(``RLIMIT_CPU``) and file size 0 (``RLIMIT_FSIZE``: it writes no file). It then opens the
snapshot read-only with DuckDB's guards and a locked configuration, runs the query and writes
to descriptor ``FD`` either ``R`` and the result as an Arrow IPC stream (at most ``max_rows``
+ 1 rows, at most ``max_bytes`` bytes), or ``E`` and a JSON error ``{"kind": DuckDB exception
class or ``ResultTooLarge``, "message": text}``.
Its stdout and stderr are the caller's to discard. Imports nothing of the project (it starts
in isolated mode, quickly).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1
BATCH_ROWS = 256
TOO_LARGE = "ResultTooLarge"


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request was set
        os._exit(1)


def _limit(request: dict) -> None:
    memory = int(request["memory_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(request["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _connect(request: dict):
    import duckdb

    con = duckdb.connect(request["db"], read_only=True, config={
        "enable_external_access": False,
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "python_enable_replacements": False,
        "memory_limit": request["duckdb_memory"],
        "threads": int(request["threads"]),
        "temp_directory": "",  # no spilling: the snapshot's folder is not for writing
    })
    con.execute("SET enable_progress_bar = false")
    con.execute("SET lock_configuration = true")
    return con


def _run(out, request: dict) -> None:
    import duckdb
    import pyarrow as pa

    try:
        con = _connect(request)
        # A streaming result: DuckDB computes chunks as they are fetched, so a huge cross join
        # stops at the row cap and a wide answer at the byte cap.
        reader = con.execute(request["sql"]).to_arrow_reader(BATCH_ROWS)
        keep, cap = int(request["max_rows"]) + 1, int(request["max_bytes"])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, reader.schema) as writer:
            for batch in reader:
                writer.write_batch(batch.slice(0, keep))
                keep -= min(keep, batch.num_rows)
                if sink.tell() > cap:
                    _error(out, TOO_LARGE, f"more than {cap} bytes")
                    return
                if not keep:
                    break
        out.write(b"R")
        out.write(sink.getvalue())
    except duckdb.Error as e:
        _error(out, type(e).__name__, str(e))
    except MemoryError:
        _error(out, "OutOfMemoryException", "Out of Memory Error: the worker ran out of memory")
    except pa.ArrowException as e:
        _error(out, "ConversionException", f"Conversion Error: {e}")


def _error(out, kind: str, message: str) -> None:
    out.write(b"E" + json.dumps({"kind": kind, "message": message}).encode())


def main() -> None:
    fd = int(sys.argv[1])
    request = json.loads(sys.stdin.read())
    _die_with_parent(int(request["parent"]))
    _limit(request)
    with os.fdopen(fd, "wb") as out:
        _run(out, request)
        out.flush()
    # Skip DuckDB's teardown: the parent has its answer, and a failed statement may leave
    # state whose destructor aborts the process.
    os._exit(0)


if __name__ == "__main__":
    main()
