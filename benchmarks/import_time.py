"""Wall time of a one-line import from the command line, with a Spark Connect server kept
running, against the 3 s bound of issue 8 and against the same import on ``local[*]``.

Starts a Spark Connect server from the installed pyspark (``local[2]``, as in README 'Spark
Connect'), then runs ``python -m spark_backend import`` of a one-line Datastream file
``--runs`` times through it (``--spark-remote``) and ``--runs`` times on ``local[*]``, each
run a new process and a new cache file, and prints every time and the medians. The first
Connect run of a new server also opens the tool's server-side session (its Python workers);
it is printed apart and left out of the median (``--cold`` runs of each, default 1).

    python benchmarks/import_time.py --runs 5

Large imports (issue 68): ``--recording-mb N`` imports a generated recording of about N MB
(``tests/support/import_inputs.py``: the demo world's lines, each a distinct record, 6 bad
lines among them) and ``--small-files N`` a folder of N one-line recordings, each with the
real command line on ``local[*]``, and print the wall time, the records, and the peak memory of
the import's processes: the command's own Python process (the driver), Spark's JVM and its
Python workers, as resident set (peak ``VmHWM`` of each) and proportional set size (``Pss``
of ``/proc/<pid>/smaps_rollup``, sampled every 0.2 s; the sum over the tree at its highest).

    python benchmarks/import_time.py --recording-mb 1000 --small-files 10000

``--changefeed-messages N`` imports a CockroachDB changefeed of N messages over 100,000 keys
(each key's later versions become UPDATE after the parts landed) and ``--bigtable-changes N``
a Bigtable change stream feed of N data changes, each value in two chunks on two lines (read
part after part, in order):

    python benchmarks/import_time.py --changefeed-messages 3000000 --bigtable-changes 1000000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BOUND_S = 3.0
LINE = (ROOT / "fixtures" / "samples" / "datastream" / "mysql_events.jsonl").read_text(
    encoding="utf-8").splitlines()[0]


def _env(work: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SPARK_REMOTE", None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["CSI_SPARK_LOG"] = str(work / "spark.log")
    return env


def _one_import(work: Path, spark: list[str]) -> float:
    cache = work / "run.duckdb"
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "spark_backend", "import", "--cache", str(cache), "--format",
         "datastream", "--stream", "s", str(work / "one.jsonl"), *spark],
        cwd=ROOT, env=_env(work), capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - began
    if done.returncode != 0 or "imported 1 records" not in done.stdout:
        raise SystemExit(f"the import failed: {done.stderr.strip() or done.stdout.strip()}")
    cache.unlink()
    return took


def _series(work: Path, label: str, spark: list[str], runs: int, cold: int) -> list[float]:
    times = [_one_import(work, spark) for _ in range(cold + runs)]
    for i, t in enumerate(times):
        print(f"  {label:10s} run {i + 1}: {t:5.2f} s{'  (cold, not counted)' if i < cold else ''}",
              flush=True)
    return times[cold:]


def _status(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _tree(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *_tree(kid)]
    return out


def _role(pid: int, top: int) -> str:
    if pid == top:
        return "driver (python)"
    try:
        with open(f"/proc/{pid}/cmdline") as f:
            cmd = f.read().split("\0")[0]
    except OSError:
        return "?"
    return "JVM" if cmd.endswith("java") else "python workers"


def _measured(argv: list[str], work: Path) -> tuple[float, str, dict[str, int], int]:
    """Run ``argv``: (seconds, its stdout, peak VmHWM per role, peak Pss of the whole tree)."""
    began = time.perf_counter()
    out_file, err_file = open(work / "out.txt", "w+"), open(work / "err.txt", "w+")
    # To files, not pipes: a pipe nobody reads until the end would stop the command once full.
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(work), stdout=out_file, stderr=err_file,
                            text=True)
    peaks: dict[str, int] = {}
    pss_peak = 0
    while proc.poll() is None:
        pids = [proc.pid, *_tree(proc.pid)]
        pss_peak = max(pss_peak, sum(_pss(p) for p in pids))
        for pid in pids:
            role, peak = _role(pid, proc.pid), _status(pid, "VmHWM")
            if role != "?" and peak:  # not a process that ended while it was looked at
                peaks[role] = max(peaks.get(role, 0), peak)
        time.sleep(0.2)
    proc.wait()
    out_file.seek(0)
    err_file.seek(0)
    out, err = out_file.read(), err_file.read()
    out_file.close()
    err_file.close()
    if proc.returncode != 0:
        raise SystemExit(f"the import failed: {err.strip()[-2000:]}")
    return time.perf_counter() - began, out, peaks, pss_peak


def _inputs(args, work: Path) -> list[tuple[str, str, Path]]:
    """(what, format, path) of each large input the arguments ask for, written in ``work``."""
    from tests.support.import_inputs import (
        write_bigtable_feed,
        write_changefeed,
        write_recording,
        write_small_files,
    )

    runs = []
    if args.recording_mb:
        rec = work / "big.jsonl"
        lines, bad = write_recording(rec, args.recording_mb * 1_000_000)
        runs.append((f"recording, {lines:,} lines ({bad} bad)", "recording", rec))
    if args.small_files:
        write_small_files(work / "many", args.small_files)
        runs.append((f"folder of {args.small_files:,} one-line files", "recording",
                     work / "many"))
    if args.changefeed_messages:
        feed = work / "feed.ndjson"
        write_changefeed(feed, args.changefeed_messages)
        runs.append((f"changefeed, {args.changefeed_messages:,} messages", "cockroachdb", feed))
    if args.bigtable_changes:
        feed = work / "bigtable.jsonl"
        lines = write_bigtable_feed(feed, args.bigtable_changes)
        runs.append((f"Bigtable feed, {lines:,} lines", "bigtable", feed))
    return runs


def _large(args) -> None:
    with tempfile.TemporaryDirectory(prefix="import-large-") as tmp:
        work = Path(tmp)
        for label, fmt, path in _inputs(args, work):
            if path.is_file():
                label += f", {path.stat().st_size / 1e6:,.0f} MB"
            took, out, peaks, pss = _measured(
                [sys.executable, "-m", "spark_backend", "import", "--cache",
                 str(work / f"{path.name}.duckdb"), "--format", fmt, "--stream", "s",
                 str(path)], work)
            summary = next(x for x in out.splitlines() if x.startswith("s: imported"))
            print(f"{label}: {took:,.1f} s; {summary}")
            print("  peak RSS: " + ", ".join(f"{role} {mb / 1e6:,.0f} MB"
                                             for role, mb in sorted(peaks.items()))
                  + f"; peak PSS of all its processes together {pss / 1e6:,.0f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", type=int, default=1)
    parser.add_argument("--recording-mb", type=int, default=0)
    parser.add_argument("--small-files", type=int, default=0)
    parser.add_argument("--changefeed-messages", type=int, default=0)
    parser.add_argument("--bigtable-changes", type=int, default=0)
    args = parser.parse_args()
    if args.recording_mb or args.small_files or args.changefeed_messages or args.bigtable_changes:
        _large(args)
        return
    from tests.support.cluster import connect_server

    with tempfile.TemporaryDirectory(prefix="import-time-") as tmp:
        work = Path(tmp)
        (work / "one.jsonl").write_text(LINE + "\n", encoding="utf-8")
        began = time.perf_counter()
        with connect_server(work / "logs", master="local[2]", project_root=ROOT) as url:
            print(f"Spark Connect server at {url} (up in {time.perf_counter() - began:.1f} s)")
            connect = _series(work, "connect", ["--spark-remote", url], args.runs, args.cold)
        local = _series(work, "local[*]", [], args.runs, args.cold)
    c, loc = statistics.median(connect), statistics.median(local)
    print(f"one-line import, median of {args.runs}: Spark Connect {c:.2f} s "
          f"(bound {BOUND_S:.1f} s: {'within' if c <= BOUND_S else 'OVER'}), "
          f"local[*] {loc:.2f} s (Connect/local = {c / loc:.2f})")


if __name__ == "__main__":
    main()
