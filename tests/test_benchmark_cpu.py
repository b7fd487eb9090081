"""The pull benchmark's CPU accounting (``benchmarks/pull_throughput.py``): what it prints as a
pull's cores per process kind must be the CPU the processes really used."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location(
        "pull_throughput", ROOT / "benchmarks" / "pull_throughput.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_of_a_child_is_counted_by_its_kind():
    bench = _bench()
    busy = subprocess.Popen([sys.executable, "-c",
                             "import sys, time\ninput()\n"
                             "end = time.process_time() + 0.6\n"
                             "while time.process_time() < end: pass\n"
                             "print('done', flush=True)\ninput()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        before = bench.tree_cpu_by_kind(os.getpid())
        busy.stdin.write("\n")
        busy.stdin.flush()
        assert busy.stdout.readline().strip() == "done"  # it burnt 0.6 s of CPU
        after = bench.tree_cpu_by_kind(os.getpid())
    finally:
        busy.communicate("\n", timeout=30)
    spent = after.get("other", 0.0) - before.get("other", 0.0)
    assert 0.55 <= spent <= 1.0, (before, after)


def test_cpu_line_gives_cores_and_microseconds_per_record():
    bench = _bench()
    runs = [{"seconds": 10.0, "rows": 100_000, "cpu_s": {"driver": 4.0, "JVM": 1.0}},
            {"seconds": 20.0, "rows": 100_000, "cpu_s": {"driver": 1.0}},
            {"seconds": 5.0, "rows": 100_000, "cpu_s": {"driver": 1.0}}]
    line = bench._cpu_line(runs)
    assert "0.50 cores" in line and "JVM 0.10" in line and "driver 0.40" in line, line
    assert "50 us per record" in line, line
