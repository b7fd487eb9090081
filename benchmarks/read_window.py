"""What partition reads that fall behind hold in a Spark worker's memory: one process reads the
benchmark's world as a pull's task does (``workflow.read_partitions`` from the roots, ``--threads``
partitions at once, children followed, for ``--seconds``), packing its rows as a task does, as
fast as one core allows, so it falls behind what dozens of streams send. Its peak PSS and rows
read, once on the reads' channel (``connect.read_api``: no gRPC bandwidth probe) and once on
the client library's own channel, alternating, ``--repeat`` times each; medians printed.

    python benchmarks/read_window.py                 # the 1M-record world at 20 ms (builds it)
    python benchmarks/read_window.py --host H:P      # a world server already running
        (``python benchmarks/pull_throughput.py --role server --scale 35.714 --latency-ms 20``)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
HEARTBEAT_MS = 10_000


def _pss_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _read(host: str, stream: str, start: int, end: int, threads: int, seconds: float,
          channel: str) -> dict:
    os.environ["SPANNER_DISABLE_BUILTIN_METRICS"] = "true"
    from spark_backend.model.records import batched, to_arrow_batch
    from spark_backend.spanner import reader
    from spark_backend.spanner.connect import SpannerTarget, open_database
    from spark_backend.spanner.workflow import read_partitions
    from spark_backend.spark.datasource import STREAM_BATCH_ROWS
    from spark_backend.spark.packing import packed

    if channel == "library":
        reader.read_api = lambda database: database.spanner_api
    db = open_database(SpannerTarget("p", "i", "d", "googlesql", host))
    initial = list(read_partitions(db, "googlesql", stream, [(None, start)], end, HEARTBEAT_MS,
                                   threads=1))
    roots = [(c["token"], r["ts_ns"]) for r in initial if r["kind"] == "child_partitions"
             for c in json.loads(r["child_partitions"])]
    peak = [_pss_mb()]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _pss_mb())
            time.sleep(0.1)

    threading.Thread(target=sample, daemon=True).start()
    rows = 0
    for batch in batched(read_partitions(db, "googlesql", stream, roots, end, HEARTBEAT_MS,
                                         threads=threads, max_seconds=seconds), STREAM_BATCH_ROWS):
        packed(to_arrow_batch(batch))
        rows += len(batch)
    done.set()
    return {"channel": channel, "peak_pss_mb": round(peak[0]), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", help="a world server already running (host:port)")
    parser.add_argument("--scale", type=float, default=35.714, help="else the world to build")
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--role", choices=["read"], help=argparse.SUPPRESS)
    parser.add_argument("--channel", choices=["reads", "library"], help=argparse.SUPPRESS)
    parser.add_argument("--world", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.role == "read":
        world = json.loads(args.world)
        print(json.dumps(_read(world["address"], world["stream"], world["start"],
                               world["end"], args.threads, args.seconds, args.channel)))
        return 0

    server = None
    if args.host:
        # the benchmark world's fixed range (pull_throughput's world servers)
        world = {"address": args.host, "stream": "DemoStream",
                 "start": 1767603600000000000, "end": 1767607200000000000}
    else:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from pull_throughput import _start_server

        print(f"building the world (scale {args.scale}) ...", file=sys.stderr, flush=True)
        server, world = _start_server(args.scale, "googlesql", args.latency_ms)
    env = dict(os.environ, MALLOC_ARENA_MAX=os.environ.get("MALLOC_ARENA_MAX", "2"))
    runs: dict[str, list[dict]] = {"reads": [], "library": []}
    try:
        for _ in range(args.repeat):
            for channel in runs:
                out = subprocess.run(
                    [sys.executable, __file__, "--role", "read", "--channel", channel,
                     "--world", json.dumps(world), "--threads", str(args.threads),
                     "--seconds", str(args.seconds)],
                    cwd=ROOT, env=env, capture_output=True, text=True, check=False)
                lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
                if out.returncode != 0 or not lines:
                    raise SystemExit(f"the read failed:\n{out.stderr[-2000:]}")
                run = json.loads(lines[-1])
                runs[channel].append(run)
                print(json.dumps(run), flush=True)
    finally:
        if server is not None:
            server.stdin.close()
            server.wait(timeout=60)
    for channel, done in runs.items():
        peaks = [r["peak_pss_mb"] for r in done]
        rows = [r["rows"] for r in done]
        print(f"{channel:>8} channel, {args.threads} partitions at once, {args.seconds:g} s: "
              f"peak PSS median {statistics.median(peaks):.0f} MB {peaks}, rows read median "
              f"{statistics.median(rows):,.0f} {rows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
