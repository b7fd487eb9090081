"""Where a pull's CPU goes, per record: the benchmark's world served at a latency (as
``pull_throughput.py`` serves it), one pull with Spark warm sampled by py-spy over the driver and
every Python worker, and a table of microseconds of CPU per record by process and stage.

The CPU of each kind of process (driver, Python workers, the JVM) is measured from /proc around
the pull, as ``pull_throughput.py`` measures it. py-spy samples, in each Python process, the
thread that holds the GIL (``--gil``): a sample is 1/rate s of Python work, put to the stage of
its innermost frame that names one (``STAGES``); C code a frame calls with the GIL held (the
protobuf parse, Arrow building a batch) counts for that frame's stage. What a process spent
without the GIL (DuckDB's threads, gRPC's core, Arrow releasing it) is its measured CPU less its
samples, one row per process. On a saturated machine a thread can hold the GIL while it waits
for a core; where a process's samples add up to more than its measured CPU, its stages are scaled
down to that CPU (the row "without the GIL" is then 0). The JVM is measured, not split. Samples
of the warm-up before the pull are left out. py-spy is a developer tool, not a requirement of
the project: ``pip install py-spy``.

    python benchmarks/pull_profile.py --records 1000000 --latency-ms 2
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import pull_throughput as bench  # noqa: E402

# (stage, pattern of a frame "function (file:line)"); the innermost matching frame decides
STAGES = [
    ("Python worker start: imports", r"\((<frozen (zipimport|importlib)|dataclasses\.py)"),
    ("Spark daemon: fork and wait", r"\(daemon\.py:"),
    ("gRPC: receive and parse responses", r"\(.*(grpc|google/api_core|proto/message)"),
    ("decode rows (reader)", r"\(.*spark_backend/spanner/(reader|decode|values)"),
    ("read scheduling (workflow)", r"\(.*spark_backend/spanner/(workflow|connect)"),
    ("records to Arrow (pack)", r"\(.*spark_backend/(model/records|spark/packing)"),
    ("Spark worker: serialize, send", r"\(.*pyspark/"),
    ("land in DuckDB", r"\(.*spark_backend/(cache/|jobs/pull_landing)"),
    ("collect from Spark", r"\(.*(py4j/|spark_backend/spark/(collect|results))"),
    ("pull orchestration", r"\(.*spark_backend/jobs/"),
    ("memory and CPU sampler (benchmark)", r"\(.*benchmarks/pull_throughput"),
]
WARM_UP = re.compile(r"^warm_up \(")


def _kind(stack: list[str]) -> str:
    """The process a raw py-spy stack was sampled in: the innermost ``process`` frame."""
    procs = [f for f in stack if f.startswith("process ")]
    line = procs[-1] if procs else ""
    if "pyspark.daemon" in line or "pyspark/daemon" in line:
        return "python worker"
    return "driver"


def _stage(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, pattern in STAGES:
            if re.search(pattern, frame):
                return name
    return "other Python (interpreter, threads, imports)"


def read_samples(raw: Path) -> dict[str, collections.Counter]:
    """Samples by process kind and stage, from py-spy's raw (collapsed stack) output."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack.startswith("process "):
            continue
        frames = stack.split(";")
        if any(WARM_UP.match(f) for f in frames):
            continue
        out[_kind(frames)][_stage(frames)] += int(count)
    return out


def profile(records: int, latency_ms: float, dialect: str, rate: int,
            keep: Path | None = None) -> None:
    if not shutil.which("py-spy"):
        raise SystemExit("py-spy is not installed; pip install py-spy (a developer tool).")
    scale = round(records / bench.RECORDS_PER_SCALE, 3)
    server, world = bench._start_server(scale, dialect, latency_ms)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "pull.raw"
            cmd = ["py-spy", "record", "--subprocesses", "--gil", "--nonblocking",
                   "--rate", str(rate),
                   "--format", "raw", "-o", str(raw), "--", sys.executable,
                   str(ROOT / "benchmarks" / "pull_throughput.py"), "--role", "project",
                   "--repeat", "1", "--dialect", dialect, "--host", world["address"],
                   "--stream", world["stream"], "--start", str(world["start"]),
                   "--end", str(world["end"])]
            done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
            lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
            if done.returncode != 0 or not lines:
                raise SystemExit(f"the profiled pull failed:\n{done.stderr[-3000:]}")
            run = json.loads(lines[-1])["runs"][0]
            if keep:
                shutil.copyfile(raw, keep)
            _table(run, read_samples(raw), latency_ms, rate)
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def _table(run: dict, samples: dict[str, collections.Counter], latency_ms: float,
           rate: int) -> None:
    rows, cpu = run["rows"], run["cpu_s"]
    total = sum(cpu.values())
    print(f"{rows:,} records at {latency_ms:g} ms in {run['seconds']:.1f} s: "
          f"{total / rows * 1e6:.0f} us of CPU per record "
          f"({', '.join(f'{k} {v / rows * 1e6:.0f}' for k, v in sorted(cpu.items()))})")
    print("| process | stage | us per record |")
    print("|---|---|---|")
    for kind in ("python worker", "driver"):
        counts = samples.get(kind, collections.Counter())
        sampled = sum(counts.values()) / rate
        scale = min(1.0, cpu.get(kind, 0.0) / sampled) if sampled else 0.0
        for stage, k in counts.most_common():
            us = k / rate * scale / rows * 1e6
            if us >= 0.5:
                print(f"| {kind} | {stage} | {us:.1f} |")
        rest = cpu.get(kind, 0.0) - sampled * scale
        print(f"| {kind} | without the GIL (measured less sampled) | {rest / rows * 1e6:.1f} |")
    for kind in sorted(set(cpu) - {"python worker", "driver"}):
        print(f"| {kind} | (measured, not split) | {cpu[kind] / rows * 1e6:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--dialect", default="googlesql", choices=["googlesql", "postgresql"])
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw samples here")
    args = parser.parse_args()
    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    profile(args.records, args.latency_ms, args.dialect, args.rate, args.raw)


if __name__ == "__main__":
    main()
