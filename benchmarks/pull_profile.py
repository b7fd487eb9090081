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
the project: ``pip install py-spy``. ``--native`` pulls once more under Linux perf and splits
each Python process kind's CPU by the library it ran in (DuckDB, the interpreter, protobuf,
Arrow, the kernel): where the CPU without the GIL goes.

    python benchmarks/pull_profile.py --records 1000000 --latency-ms 2 --native
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
    ("module imports (a worker's start, lazy imports)",
     r"\((<frozen (zipimport|importlib)|dataclasses\.py)"),
    ("gRPC: receive and parse responses", r"\(.*(grpc|google/api_core|proto/message)"),
    ("decode rows (reader)", r"\(.*spark_backend/spanner/reader"),
    ("read scheduling (workflow)", r"\(.*spark_backend/spanner/(workflow|connect)"),
    ("records to Arrow (pack)", r"\(.*spark_backend/(model/records|spark/packing)"),
    ("Spark worker: serialize, send", r"\(.*pyspark/"),
    ("land in DuckDB", r"\(.*spark_backend/(cache/|jobs/pull_landing)"),
    ("collect from Spark", r"\(.*(py4j/|spark_backend/jobs/pull_jobs)"),
    ("pull orchestration", r"\(.*spark_backend/jobs/"),
    ("memory and CPU sampler (benchmark)", r"\(.*benchmarks/pull_throughput"),
]
WARM_UP = re.compile(r"^warm_up \(")


def _kind(process: str, daemons: set[str]) -> str:
    """The kind of the process a raw py-spy stack was sampled in (its innermost ``process``
    frame): Spark's daemon and the workers it forks share a command line; the daemon is the
    process that runs ``manager`` and never ``worker``."""
    if "pyspark.daemon" in process or "pyspark/daemon" in process:
        return "daemon" if process.split(":")[0] in daemons else "python worker"
    return "driver"


def _stage(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, pattern in STAGES:
            if re.search(pattern, frame):
                return name
    return "other Python (interpreter, threads, imports)"


def read_samples(raw: Path) -> dict[str, collections.Counter]:
    """Samples by process kind and stage, from py-spy's raw (collapsed stack) output."""
    stacks = []
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit() and stack.startswith("process "):
            frames = stack.split(";")
            process = [f for f in frames if f.startswith("process ")][-1]
            stacks.append((process, frames, int(count)))

    def pids(frame: str) -> set[str]:
        return {p.split(":")[0] for p, frames, _ in stacks
                if any(f.startswith(frame) for f in frames)}

    daemons = pids("manager (daemon.py:") - pids("worker (daemon.py:")  # a fork runs both
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for process, frames, count in stacks:
        if not any(WARM_UP.match(f) for f in frames):
            out[_kind(process, daemons)][_stage(frames)] += count
    return out


def profile(records: int, latency_ms: float, dialect: str, rate: int,
            keep: Path | None = None, native: bool = False) -> None:
    if not shutil.which("py-spy"):
        raise SystemExit("py-spy is not installed; pip install py-spy (a developer tool).")
    if native and not shutil.which("perf"):
        raise SystemExit("--native needs Linux perf on the PATH (apt-get install linux-perf).")
    scale = round(records / bench.RECORDS_PER_SCALE, 3)
    server, world = bench._start_server(scale, dialect, latency_ms)
    side = [sys.executable, str(ROOT / "benchmarks" / "pull_throughput.py"), "--role", "project",
            "--repeat", "1", "--dialect", dialect, "--host", world["address"],
            "--stream", world["stream"], "--start", str(world["start"]), "--end", str(world["end"])]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            raw = Path(tmp) / "pull.raw"
            run = _profiled(["py-spy", "record", "--subprocesses", "--gil", "--nonblocking",
                             "--rate", str(rate), "--format", "raw", "-o", str(raw), "--", *side])
            if keep:
                shutil.copyfile(raw, keep)
            _table(run, read_samples(raw), latency_ms, rate)
            if native:
                data = Path(tmp) / "perf.data"
                run = _profiled(["perf", "record", "-q", "-F", str(rate), "-o", str(data), "--",
                                 *side])
                _native_table(run, read_native(data))
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def _profiled(cmd: list[str]) -> dict:
    """The one pull of the project side ``cmd`` runs (its JSON line's first run)."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the profiled pull failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])["runs"][0]


_PERF_LINE = re.compile(
    r"\s*(?P<comm>\S.*?)\s+(?P<pid>\d+)/\d+\s+[0-9a-f]+\s+.*\((?P<dso>.*)\)\s*$")


def read_native(data: Path) -> dict[str, collections.Counter]:
    """perf samples by process kind and library (the shared object the CPU was in): the driver
    is the first process sampled (the command perf started), the JVM the process with a thread
    named ``java``, every other Python process a worker."""
    text = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,dso"],
                          capture_output=True, text=True, check=True).stdout
    samples = [(m["comm"], m["pid"], m["dso"]) for m in map(_PERF_LINE.match, text.splitlines())
               if m]
    driver = samples[0][1] if samples else ""
    jvm = {pid for comm, pid, _ in samples if comm == "java"}
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for _, pid, dso in samples:
        kind = "driver" if pid == driver else "JVM" if pid in jvm else "python worker"
        out[kind][re.sub(r"(\.cpython|\.so|\.abi3).*", "", dso.rsplit("/", 1)[-1])] += 1
    return out


def _native_table(run: dict, samples: dict[str, collections.Counter]) -> None:
    """Each Python process kind's measured CPU split by the library its samples were in (the
    driver's includes the benchmark's memory sampler, which reads /proc in the kernel)."""
    rows, cpu = run["rows"], dict(run["cpu_s"])
    cpu["driver"] = cpu.get("driver", 0.0) + cpu.pop("memory sampler", 0.0)
    print(f"the same pull again under perf: {run['seconds']:.1f} s")
    print("| process | library | us per record |")
    print("|---|---|---|")
    for kind in ("python worker", "driver"):
        counts = samples.get(kind, collections.Counter())
        n = sum(counts.values())
        for lib, k in counts.most_common(8):
            us = cpu.get(kind, 0.0) * k / max(n, 1) / rows * 1e6
            if us >= 0.5:
                print(f"| {kind} | {lib} | {us:.1f} |")


def _table(run: dict, samples: dict[str, collections.Counter], latency_ms: float,
           rate: int) -> None:
    rows, cpu = run["rows"], run["cpu_s"]
    total = sum(cpu.values())
    print(f"{rows:,} records at {latency_ms:g} ms in {run['seconds']:.1f} s: "
          f"{total / rows * 1e6:.0f} us of CPU per record "
          f"({', '.join(f'{k} {v / rows * 1e6:.0f}' for k, v in sorted(cpu.items()))})")
    print("| process | stage | us per record |")
    print("|---|---|---|")
    for kind in ("python worker", "driver", "daemon"):
        counts = samples.get(kind, collections.Counter())
        if not counts and not cpu.get(kind):
            continue
        sampled = sum(counts.values()) / rate
        scale = min(1.0, cpu.get(kind, 0.0) / sampled) if sampled else 0.0
        for stage, k in counts.most_common():
            us = k / rate * scale / rows * 1e6
            if us >= 0.5:
                print(f"| {kind} | {stage} | {us:.1f} |")
        rest = cpu.get(kind, 0.0) - sampled * scale
        print(f"| {kind} | without the GIL (measured less sampled) | {rest / rows * 1e6:.1f} |")
    for kind in sorted(set(cpu) - {"python worker", "driver", "daemon"}):
        print(f"| {kind} | (measured, not split) | {cpu[kind] / rows * 1e6:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--dialect", default="googlesql", choices=["googlesql", "postgresql"])
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw samples here")
    parser.add_argument("--native", action="store_true",
                        help="also split each process's CPU by library with Linux perf")
    args = parser.parse_args()
    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    profile(args.records, args.latency_ms, args.dialect, args.rate, args.raw,
            args.native)


if __name__ == "__main__":
    main()
