"""Wall time of a one-line import from the command line, with a Spark Connect server kept
running, against the 3 s bound of issue 8 and against the same import on ``local[*]``.

Starts a Spark Connect server from the installed pyspark (``local[2]``, as in README 'Spark
Connect'), then runs ``python -m spark_backend import`` of a one-line Datastream file
``--runs`` times through it (``--spark-remote``) and ``--runs`` times on ``local[*]``, each
run a new process and a new cache file, and prints every time and the medians. The first
Connect run of a new server also opens the tool's server-side session (its Python workers);
it is printed apart and left out of the median (``--cold`` runs of each, default 1).

    python benchmarks/import_time.py --runs 5
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", type=int, default=1)
    args = parser.parse_args()
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
