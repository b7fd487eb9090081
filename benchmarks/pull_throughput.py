"""Pull throughput: the project's Spark pull against the plain sequential baseline.

One demo world (the deterministic simulator behind the local Spanner-protocol server, run in
its own process with simulated network latency) is read twice in the same run:

- baseline: google-cloud-spanner as documented, one partition at a time (the query workflow,
  merges read once after their parents), the client's default (full) decode;
- project: `run_pull` (Spark, one task per partition, wave by wave, lazy decode) into a fresh
  DuckDB cache.

Each side runs in its own process; peak memory is the peak resident set of that process and
all of its children (the JVM and Spark's Python workers for the project), sampled every 0.2 s.

    python benchmarks/pull_throughput.py --records 100000 1000000 --latency-ms 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECORDS_PER_SCALE = 28_000  # rows (data change + heartbeats + child partitions) at scale 1.0


def _tree_rss_kb(pid: int) -> int:
    """RSS of a process and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ppid = int(fields[1])
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss[int(entry)] = int(line.split()[1])
                        break
            children.setdefault(ppid, []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


class PeakMemory:
    def __init__(self, pid: int | None = None):
        self.pid = pid or os.getpid()
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, _tree_rss_kb(self.pid))
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, _tree_rss_kb(self.pid))


# --- the two sides (each runs in its own process) ---------------------------------------------


def run_baseline(host: str, dialect: str, stream: str, start: str, end: str,
                 budget_s: float) -> dict:
    """Sequential, default decode: the plain client as its docs show it. Stops after
    ``budget_s`` seconds (its rate is steady; a 1M-record baseline would take half an hour)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect
    from google.cloud.spanner_v1 import param_types

    from spark_backend.model.timestamps import parse_ns, to_datetime

    client = spanner.Client(project="p", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": host})
    client._emulator_host = host
    db = client.instance("i").database("d", database_dialect=(
        DatabaseDialect.POSTGRESQL if dialect == "postgresql"
        else DatabaseDialect.GOOGLE_STANDARD_SQL))
    if dialect == "googlesql":
        sql = (f"SELECT ChangeRecord FROM READ_{stream}(start_timestamp => @s, end_timestamp => "
               "@e, partition_token => @t, heartbeat_milliseconds => @h)")
        types = {"s": param_types.TIMESTAMP, "e": param_types.TIMESTAMP,
                 "t": param_types.STRING, "h": param_types.INT64}
        names = ("s", "e", "t", "h")
    else:
        sql = f'SELECT * FROM "spanner"."read_json_{stream}"($1, $2, $3, $4, null)'
        types = {"p1": param_types.TIMESTAMP, "p2": param_types.TIMESTAMP,
                 "p3": param_types.STRING, "p4": param_types.INT64}
        names = ("p1", "p2", "p3", "p4")
    end_dt = to_datetime(parse_ns(end))

    def children_of(row):
        if dialect == "googlesql":
            record = row[0][0]
            cps = record[2]  # child_partitions_record: list of structs
            out = []
            for cp in cps or []:
                for child in cp[2]:
                    out.append((child[0], list(child[1]), cp[0]))
            return out
        doc = row[0] if isinstance(row[0], dict) else json.loads(row[0])
        cp = doc.get("child_partitions_record")
        if not cp:
            return []
        return [(c["token"], c["parent_partition_tokens"], cp["start_timestamp"])
                for c in cp["child_partitions"]]

    rows = 0
    queue = [(None, to_datetime(parse_ns(start)))]
    parents_done: dict[str, set] = {}
    scheduled: set = set()
    began = time.monotonic()
    while queue and time.monotonic() - began < budget_s:
        token, start_dt = queue.pop(0)
        params = dict(zip(names, (start_dt, end_dt, token, 10_000), strict=True))
        with db.snapshot() as snap:
            for row in snap.execute_sql(sql, params=params, param_types=types):
                rows += 1
                if rows % 1000 == 0 and time.monotonic() - began >= budget_s:
                    break
                for child, parents, child_start in children_of(row):
                    if child in scheduled:
                        continue
                    done = parents_done.setdefault(child, set())
                    if token is not None:
                        done.add(token)
                    if token is None or done >= set(p for p in parents if p):
                        scheduled.add(child)
                        cs = child_start if not isinstance(child_start, str) else to_datetime(
                            parse_ns(child_start))
                        queue.append((child, cs))
    seconds = time.monotonic() - began
    return {"rows": rows, "seconds": seconds, "partitions": len(scheduled)}


def run_project(host: str, dialect: str, stream: str, start: str, end: str,
                master: str | None, threads: int) -> dict:
    os.environ["SPANNER_EMULATOR_HOST"] = host
    from spark_backend.cache.store import Cache
    from spark_backend.jobs.pull import PullRequest, run_pull
    from spark_backend.spark.session import spark_session, warm_up

    warm_up(spark_session(master))  # one-time JVM and worker start-up: not part of throughput
    with tempfile.TemporaryDirectory() as tmp, Cache(Path(tmp) / "bench.duckdb") as cache:
        began = time.monotonic()
        result = run_pull(cache, PullRequest(
            source="spanner", project="p", instance="i", database="d", source_stream=stream,
            dialect=dialect, start=start, end=end, spark_master=master,
            threads_per_task=threads))
        seconds = time.monotonic() - began
        if result.status != "complete":
            raise SystemExit(f"pull failed: {result.error}")
        return {"rows": result.records, "seconds": seconds, "partitions": result.partitions_read,
                "waves": result.waves}


def _side(args) -> None:
    with PeakMemory() as mem:
        if args.role == "baseline":
            out = run_baseline(args.host, args.dialect, args.stream, args.start, args.end,
                               args.baseline_seconds)
        else:
            out = run_project(args.host, args.dialect, args.stream, args.start, args.end,
                              args.master, args.threads)
    out["peak_mb"] = mem.peak_kb / 1024
    print(json.dumps(out), flush=True)


# --- the driver ---------------------------------------------------------------------------------


def _start_server(scale: float, dialect: str, latency_ms: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_backend.demo.server", "--scale", str(scale),
         "--dialect", dialect, "--latency-ms", str(latency_ms)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    address = proc.stdout.readline().strip()
    if not address:
        raise SystemExit("the demo server did not start")
    return proc, address


def _run_side(role: str, host: str, args, world) -> dict:
    cmd = [sys.executable, __file__, "--role", role, "--host", host, "--dialect", args.dialect,
           "--stream", world["stream"], "--start", world["start"], "--end", world["end"],
           "--baseline-seconds", str(args.baseline_seconds), "--threads", str(args.threads)]
    if args.master:
        cmd += ["--master", args.master]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{role} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--latency-ms", type=float, default=2.0,
                        help="simulated network latency per server response")
    parser.add_argument("--dialect", default="googlesql")
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument("--baseline-seconds", type=float, default=180.0,
                        help="the baseline reads this long at most (it reports a rate)")
    parser.add_argument("--threads", type=int, default=8,
                        help="partitions each Spark task reads at the same time")
    parser.add_argument("--role", choices=["baseline", "project"], help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    parser.add_argument("--end", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    if args.role:
        _side(args)
        return
    from spark_backend.demo.world import DEMO_STREAM, WORLD_START, format_ts

    print(f"{'records':>9} {'partitions':>10} {'baseline rec/s':>15} {'project rec/s':>14} "
          f"{'ratio':>6} {'baseline MB':>12} {'project MB':>11}")
    for target in args.records:
        scale = round(target / RECORDS_PER_SCALE, 3)
        proc, host = _start_server(scale, args.dialect, args.latency_ms)
        try:
            world = {"stream": DEMO_STREAM, "start": format_ts(WORLD_START),
                     "end": format_ts(WORLD_START + 3600 * 10**9)}
            base = _run_side("baseline", host, args, world)
            mine = _run_side("project", host, args, world)
        finally:
            proc.stdin.close()
            proc.wait(timeout=60)
        b_rate, p_rate = base["rows"] / base["seconds"], mine["rows"] / mine["seconds"]
        print(f"{mine['rows']:>9,} {mine['partitions']:>10} {b_rate:>15,.0f} {p_rate:>14,.0f} "
              f"{p_rate / b_rate:>5.2f}x {base['peak_mb']:>12,.0f} {mine['peak_mb']:>11,.0f}",
              flush=True)
        if base["rows"] != mine["rows"]:
            print(f"  note: the baseline read {base['rows']:,} rows in {base['seconds']:.0f}s "
                  f"(its time budget), the project all {mine['rows']:,} in "
                  f"{mine['seconds']:.0f}s")


if __name__ == "__main__":
    main()
