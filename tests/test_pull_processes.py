"""What a pull starts: Spark's executor Python workers, not its data-source planning processes.

A read through a Python data source makes Spark keep three more Python processes and a daemon
each (looking up, creating and planning the source: ~240 MB after warm-up); the pull reads
through ``mapInArrow`` instead (and so does an import). Run in a process of its own: what a
test of this session read through a data source would have started them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a pull through Spark, in a process of its own

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
import spark_backend.jobs.pull_jobs as pull_jobs
from spark_backend.cache.store import Cache
from spark_backend.jobs.pull import PullRequest, run_pull
from spark_backend.jobs.pull_sources import DemoSource
from spark_backend.spark.session import spark_session, warm_up

received = []  # the rows of each packed row the driver took from Spark
taken = pull_jobs.packed_rows
def spy(batches):
    for piece in taken(batches):
        received.append(piece.rows)
        yield piece
pull_jobs.packed_rows = spy

warm_up(spark_session())
with tempfile.TemporaryDirectory() as tmp, Cache(os.path.join(tmp, "c.duckdb")) as cache:
    result = run_pull(cache, PullRequest(DemoSource()))

def children(pid):
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode()
                found += [cmd] + children(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found

spark = spark_session()
jvm = spark.sparkContext._jvm
print(json.dumps({"status": result.status, "records": result.records, "packed": received,
                  "processes": children(os.getpid()),
                  "jvm_args": list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                                   .getInputArguments()),
                  "direct_results": spark.sparkContext.getConf().get(
                      "spark.task.maxDirectResultSize")}))
"""


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    """One demo pull in a process of its own: what it started and its JVM's settings."""
    tmp_path = tmp_path_factory.mktemp("pull-processes")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT)], capture_output=True,
                         text=True, env=env, cwd=tmp_path, timeout=600, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1])


def test_a_pull_starts_no_data_source_planning_processes(seen):
    assert (seen["status"], seen["records"]) == ("complete", 28_000)
    python = [p for p in seen["processes"] if "pyspark" in p]
    assert any("pyspark.worker" in p for p in python), seen["processes"]  # the tasks' workers
    assert not [p for p in python if "data_source" in p], python


def test_the_driver_jvm_compiles_with_c1_and_takes_task_results_directly(seen):
    """The memory settings of a pull's JVM (see "Memory of a pull" in the README), as the
    running JVM reports them: the quick compiler only, for methods called ten times as often
    as its thresholds ask, and task results up to 16 MB in their status message instead of
    through the block store (above Spark's default 1 MB)."""
    assert "-XX:TieredStopAtLevel=1" in seen["jvm_args"], seen["jvm_args"]
    assert "-XX:CompileThresholdScaling=10" in seen["jvm_args"], seen["jvm_args"]
    assert seen["direct_results"] == "16m"


def test_a_pulls_tasks_hand_over_their_records_in_packed_rows_of_at_most_2048(seen):
    """A task holds the rows of the batch it fills as Python values until it packs them, so
    the batch's size bounds what a Python worker holds of them (README, "Memory of a pull")."""
    from spark_backend.spark.datasource import STREAM_BATCH_ROWS

    assert STREAM_BATCH_ROWS == 2048
    rows = seen["packed"]
    assert sum(rows) >= 28_000 and max(rows) == STREAM_BATCH_ROWS, rows
