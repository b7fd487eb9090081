"""Run one console query in a worker process (``app/console_child.py``) and bound it.

The worker has its own memory (``RLIMIT_AS``, DuckDB's ``memory_limit`` below it) and CPU
(``RLIMIT_CPU``) limits, set by the kernel; it is killed (SIGKILL) at the wall-clock deadline,
when its answer passes the byte cap, or with this process. Its stdout goes nowhere and its
stderr only here (its last lines tell an abort for lack of memory from another one): nothing of
it reaches the server's log. ``run`` returns once the worker is gone.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

CHILD = str(Path(__file__).resolve().with_name("console_child.py"))
STDERR_TAIL = 8192
# Words a worker that died for lack of memory leaves on stderr (C++ and Python allocators).
_MEMORY_WORDS = ("bad_alloc", "Out of Memory", "MemoryError", "Cannot allocate memory")
_TOO_LARGE = "ResultTooLarge"


@dataclass(frozen=True)
class Limits:
    seconds: float = 15.0
    memory_bytes: int = 1 << 30  # the worker's whole address space
    result_bytes: int = 32 << 20  # the Arrow answer; Streamlit sends about as many bytes
    max_rows: int = 10_000
    threads: int = 2

    @property
    def duckdb_memory(self) -> str:
        """DuckDB's own limit: half the address space (the rest is Python, Arrow, code)."""
        return f"{self.memory_bytes // 2 // (1 << 20)}MB"


@dataclass
class Outcome:
    """``status``: ``result`` (``table``), ``error`` (DuckDB's ``kind`` and ``message``),
    ``timeout``, ``memory``, ``too_large`` or ``crashed`` (``message`` says how)."""

    status: str
    table: pa.Table | None = None
    kind: str = ""
    message: str = ""


def run(db: str | os.PathLike, sql: str, limits: Limits) -> Outcome:
    """Run ``sql`` on the snapshot ``db`` in a new worker process, within ``limits``."""
    request = {
        "db": str(db), "sql": sql, "max_rows": limits.max_rows,
        "max_bytes": limits.result_bytes, "memory_bytes": limits.memory_bytes,
        "duckdb_memory": limits.duckdb_memory, "threads": limits.threads,
        # CPU seconds of all threads; the wall-clock deadline below is the limit users see
        "cpu_seconds": max(1, int(limits.seconds * limits.threads) + 1),
        "parent": os.getpid(),
    }
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", CHILD, str(write_fd)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(write_fd,),
            cwd=str(Path(db).parent))
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as answer:
            data, tail, why = _collect(proc, answer, json.dumps(request).encode(), limits)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()
    return _outcome(why, data, tail, proc.returncode)


def _collect(proc: subprocess.Popen, answer, request: bytes,
             limits: Limits) -> tuple[bytes, bytes, str]:
    """The worker's answer and stderr tail, read until it closes its answer or a limit hits
    (``why``: ``""``, ``timeout`` or ``too_large``)."""
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # it died at once; its stderr and return code tell why
    deadline = time.monotonic() + limits.seconds
    cap = limits.result_bytes + (1 << 20)  # the Arrow stream's own framing on top
    data, tail = bytearray(), bytearray()
    with selectors.DefaultSelector() as sel:
        sel.register(answer, selectors.EVENT_READ, "answer")
        sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
        open_streams = 2
        while open_streams:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(data), bytes(tail), "timeout"
            for key, _ in sel.select(left):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                elif key.data == "answer":
                    data += chunk
                    if len(data) > cap:
                        return bytes(data), bytes(tail), "too_large"
                else:
                    tail = (tail + chunk)[-STDERR_TAIL:]
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(data), bytes(tail), "timeout"
    return bytes(data), bytes(tail), ""


def _outcome(why: str, data: bytes, tail: bytes, code: int | None) -> Outcome:
    if why:
        return Outcome(why)
    if data[:1] == b"R":
        try:
            return Outcome("result", table=pa.ipc.open_stream(data[1:]).read_all())
        except pa.ArrowInvalid:
            pass  # cut short: the worker died while writing; its end tells why below
    if data[:1] == b"E":
        error = json.loads(data[1:])
        if error["kind"] == _TOO_LARGE:
            return Outcome("too_large")
        if error["kind"] == "OutOfMemoryException":
            return Outcome("memory", kind=error["kind"], message=error["message"])
        return Outcome("error", kind=error["kind"], message=error["message"])
    text = tail.decode(errors="replace")
    if code in (-signal.SIGXCPU, -signal.SIGKILL) and not any(w in text for w in _MEMORY_WORDS):
        return Outcome("timeout")  # the kernel's CPU limit (soft, then hard)
    if any(w in text for w in _MEMORY_WORDS):
        return Outcome("memory", message=_last_line(text))
    return Outcome("crashed", message=_how(code, text))


def _how(code: int | None, text: str) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}" + (
            f": {_last_line(text)}" if text.strip() else "")
    return f"exit status {code}" + (f": {_last_line(text)}" if text.strip() else "")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
