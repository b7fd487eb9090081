"""The pull benchmark's CPU accounting (``benchmarks/pull_throughput.py``): what it prints as a
pull's CPU per process kind must be the CPU the processes really used."""

import os
import subprocess
import sys
import threading
import time

import pytest

from tests.support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("pull_throughput")


BURN = ("end = time.process_time() + 0.6\n"
        "while time.process_time() < end: pass\n")


def _measured(bench, code: str) -> tuple[dict, dict]:
    """CPU by kind of a process tree running ``code`` (which prints "ready", waits for a line,
    does its work, prints "done" and waits for a line), before and after its work."""
    root = subprocess.Popen([sys.executable, "-c", code, "pyspark.daemon"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert root.stdout.readline().strip() == "ready"
        before = bench.tree_cpu_by_kind(root.pid)
        root.stdin.write("\n")
        root.stdin.flush()
        assert root.stdout.readline().strip() == "done"
        after = bench.tree_cpu_by_kind(root.pid)
    finally:
        root.communicate("\n", timeout=60)
    return before, after


def test_cpu_of_the_measured_process_itself(bench):
    before, after = _measured(bench, "import time\nprint('ready', flush=True)\ninput()\n"
                              + BURN + "print('done', flush=True)\ninput()\n")
    assert 0.55 <= after["driver"] - before["driver"] <= 1.0, (before, after)


def test_workers_a_spark_daemon_forked_and_reaped_count_as_workers(bench):
    # The root starts a "daemon" (its command line names pyspark.daemon), which forks a
    # worker that burns 0.6 s of CPU and exits: its CPU is then only the daemon's children's.
    daemon = ("import os, time\nprint('ready', flush=True)\ninput()\n"
              "pid = os.fork()\n"
              "if pid == 0:\n" + "".join("    " + line + "\n" for line in BURN.splitlines())
              + "    os._exit(0)\n"
              "os.waitpid(pid, 0)\nprint('done', flush=True)\ninput()\n")
    root = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {daemon!r}, "
            "'pyspark.daemon'])\n")
    before, after = _measured(bench, root)
    worker = after.get("python worker", 0.0) - before.get("python worker", 0.0)
    assert 0.55 <= worker <= 1.0, (before, after)
    assert after["daemon"] - before["daemon"] < 0.2, (before, after)


def test_the_memory_sampler_is_counted_apart_from_the_driver(bench):
    spent = bench._cpu_spent({"driver": 10.0, "JVM": 5.0},
                             {"driver": 14.0, "JVM": 6.0, "python worker": 3.0}, sampler=0.5)
    assert spent == {"driver": 3.5, "memory sampler": 0.5, "JVM": 1.0, "python worker": 3.0}


def test_cpu_line_gives_cores_and_microseconds_per_record(bench):
    runs = [{"seconds": 10.0, "rows": 100_000, "cpu_s": {"driver": 4.0, "JVM": 1.0}},
            {"seconds": 20.0, "rows": 100_000, "cpu_s": {"driver": 1.0}},
            {"seconds": 5.0, "rows": 100_000, "cpu_s": {"driver": 1.0}}]
    line = bench._cpu_line(runs)
    assert "0.50 cores" in line and "JVM 0.10" in line and "driver 0.40" in line, line
    assert "50 us per record" in line, line
    assert "machine's CPUs" not in line  # runs measured before the machine's figures
    runs[0].update(machine_busy_s=18.0, saturated_s=6.2)
    assert bench._cpu_line(runs).endswith(
        "; the machine's CPUs (the server and all else included) 1.80 busy, saturated (under "
        "5% idle) for 6s of the pull")


@pytest.mark.parametrize("idle_share", [0.0, 0.04, 0.06, 1.0])
def test_the_sampler_counts_the_seconds_the_machines_cpus_were_saturated(bench, monkeypatch,
                                                                        idle_share):
    """Between two samples the machine was saturated when its CPUs idled under 5% of that
    time: fed the machine's idle seconds (``machine_cpu``), the sampler counts every second it
    ran or none. The machine's real load (other tests, a CPU hog) plays no part."""
    cpus = os.cpu_count() or 1
    samples: list[float] = []
    enough = threading.Event()

    def machine_cpu():
        now = time.monotonic()
        samples.append(now)
        if len(samples) >= 6:
            enough.set()
        return 0.0, idle_share * cpus * now

    monkeypatch.setattr(bench, "machine_cpu", machine_cpu)
    with bench.PeakMemory() as sampler:
        enough.wait()
    ran = samples[-1] - samples[0]
    if idle_share < 0.05:
        assert ran > 0 and sampler.saturated_s == pytest.approx(ran, abs=0.05)
    else:
        assert sampler.saturated_s == pytest.approx(0.0, abs=0.01)  # the clocks differ by µs
