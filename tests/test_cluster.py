"""The pull on a Spark standalone cluster whose executors share nothing with the driver.

A master and two workers are started from the installed pyspark (``far_cluster``, one for the
module); the workers live in a network namespace of their own, joined to this one by a veth
pair (another machine as far as the network goes: the driver's 127.0.0.1 is not theirs), and
each runs under ``unshare -m`` with a private tmpfs over /tmp and over the cache's folder, so a
job that touched a driver path would fail. The demo world pulled through it must equal the
ground truth, and nothing of Spark's reaches the terminal. Needs root (private mounts, network
namespaces): on CI (CI=true) a missing capability fails the run, elsewhere the tests skip with
the reason. A few tests start a cluster of their own (a worker without the project, a master
without workers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.support.cluster import standalone_cluster, unshare_missing
from tests.test_pull_demo import assert_equals_world

pytestmark = pytest.mark.slow  # Spark in this process, or in the processes it starts

ROOT = Path(__file__).resolve().parent.parent
SPARK_NOISE = ("WARN", "INFO", "ERROR", "Exception", "\tat ", "log4j", "SLF4J", "Traceback",
               "py4j", "NativeCodeLoader", "Setting default log level")


def _require(reason: str | None, what: str) -> None:
    """Fail on CI (``CI=true``), skip elsewhere, when the workers cannot have ``what``."""
    if reason is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the cluster test cannot give its workers {what} on CI: {reason}")
    pytest.skip(f"the cluster test needs workers with {what}: {reason}")


def _require_private_mounts() -> None:
    _require(unshare_missing(), "private mounts")


def cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.pop("SPARK_REMOTE", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "spark_backend", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout)


def assert_no_spark_output(out: subprocess.CompletedProcess) -> None:
    text = out.stdout + out.stderr
    noisy = [line for line in text.splitlines() if any(n in line for n in SPARK_NOISE)]
    assert not noisy, noisy[:5]


_PROBE = """
import json, sys
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false")
         .config("spark.driver.host", sys.argv[4]).config("spark.driver.bindAddress", sys.argv[4])
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
cached, marker = sys.argv[2], sys.argv[3]
def look(_):
    import os
    yield os.path.exists(cached), os.path.exists(marker)
print(json.dumps(spark.sparkContext.parallelize(range(8), 8).mapPartitions(look).collect()))
"""


_EXECUTOR_PROBE = """
import json, os, sys
from spark_backend.model.config import ALLOCATOR_ENV
from spark_backend.spark.session import spark_session
spark = spark_session(sys.argv[1])
names = list(ALLOCATOR_ENV)  # the task must not import the package (it sets them)
def look(_):
    import os, sys
    pid, heap = os.getpid(), None
    while pid > 1 and heap is None:  # up to the executor's JVM: its heap as launched
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\\0")
        if any("CoarseGrainedExecutorBackend" in w for w in words):
            heap = [w for w in words if w.startswith("-Xmx")]
        with open(f"/proc/{pid}/stat") as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    yield ({name: os.environ.get(name) for name in names}, "spark_backend" in sys.modules,
           os.environ.get("CSI_PROBE"), heap)
print(json.dumps([spark.sparkContext.getConf().get("spark.executor.memory"),
                  spark.sparkContext.parallelize(range(4), 4).mapPartitions(look).collect()]))
"""


def test_a_clusters_executors_get_the_sessions_settings_and_the_users(far_cluster):
    """The cluster's workers were started without Arrow's allocator setting
    (``standalone_cluster``): the executors of the tool's session get it from the session's
    configuration. $CSI_SPARK_CONF is applied last: it wins over the tool's own settings
    (executors of 1g) and reaches the executors (their JVM's heap, their environment)."""
    from spark_backend.model.config import ALLOCATOR_ENV

    env = {k: v for k, v in far_cluster.env.items() if k not in ALLOCATOR_ENV}
    env["CSI_SPARK_CONF"] = "spark.executor.memory=700m; spark.executorEnv.CSI_PROBE=seen"
    out = subprocess.run([sys.executable, "-c", _EXECUTOR_PROBE, far_cluster.master_url],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    memory, tasks = json.loads(out.stdout.strip().splitlines()[-1])
    assert memory == "700m"
    assert tasks == [[ALLOCATOR_ENV, False, "seen", ["-Xmx700M"]]] * 4, tasks


def _project_folders() -> list[Path]:
    """The checkout, and the folder this environment's Python imports ``spark_backend`` from
    outside it (an editable install of another checkout): both hidden from a worker that must
    not have the project. Skips when the project is installed into the environment itself."""
    found = subprocess.run(
        [sys.executable, "-c", "import os, spark_backend; "
         "print(os.path.dirname(os.path.dirname(os.path.abspath(spark_backend.__file__))))"],
        cwd="/", env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True, text=True)
    folders = [ROOT.resolve()]
    if found.returncode == 0:
        where = Path(found.stdout.strip()).resolve()
        if where == Path(sys.prefix).resolve() or Path(sys.prefix).resolve() in where.parents:
            pytest.skip(f"the project is installed into this Python's environment ({where}): "
                        "a worker cannot have the requirements without it")
        if where not in folders:
            folders.append(where)
    return folders


def test_a_project_shipped_to_nodes_without_it_with_spark_submit_pyfiles(tmp_path):
    """Workers that have the requirements but not the project (its folder hidden from them,
    nothing of it on their path): the pull says in one sentence that a task could not import
    it; shipped as a zip with ``CSI_SPARK_CONF=spark.submit.pyFiles=...`` (README, Running on a
    cluster), the pull equals the ground truth."""
    import zipfile

    _require_private_mounts()
    shipped = tmp_path / "ship" / "csi.zip"
    shipped.parent.mkdir()
    with zipfile.ZipFile(shipped, "w") as z:
        for path in sorted((ROOT / "spark_backend").rglob("*.py")):
            z.write(path, path.relative_to(ROOT).as_posix())
    hidden = tmp_path / "cache"
    hidden.mkdir()
    with standalone_cluster(tmp_path / "logs", workers=1, cores=2,
                            hidden=[hidden, *_project_folders()]) as running:
        env = {"PYTHONPATH": ""}
        out = cli("pull", "--source", "demo", "--spark-master", running.master_url,
                  "--cache", str(hidden / "without.duckdb"), env=env)
        assert out.returncode == 1, out.stderr[-2000:]
        assert ("a task raised: ModuleNotFoundError: No module named 'spark_backend' (every "
                "node needs the project") in out.stderr, out.stderr[-2000:]
        assert_no_spark_output(out)
        out = cli("pull", "--source", "demo", "--spark-master", running.master_url,
                  "--cache", str(hidden / "shipped.duckdb"),
                  env={**env, "CSI_SPARK_CONF": f"spark.submit.pyFiles={shipped}"})
        assert out.returncode == 0, out.stderr[-2000:]
        assert "pulled 28,000 records from 41 partitions" in out.stdout
        with Cache(hidden / "shipped.duckdb") as cache:
            assert_equals_world(cache, "DemoStream", build_world())


def test_import_on_a_standalone_cluster_equals_a_local_import(far_cluster, spark):
    """Sample files of every format, in a folder the executors cannot see, imported through
    the cluster with the CLI: it prints and the cache holds exactly what a local import of the
    same files (in this process, on the suite's local session) prints and holds."""
    from tests.support.imports import IMPORTS, cache_contents, copy_samples, local_import

    where = far_cluster.hidden / "import"
    samples = copy_samples(where / "samples")
    local = local_import(samples, where / "local.duckdb")
    for fmt, folder in IMPORTS:
        out = subprocess.run(
            [sys.executable, "-m", "spark_backend", "import", "--cache",
             str(where / "cluster.duckdb"), "--format", fmt, "--stream", fmt,
             str(samples / folder), "--spark-master", far_cluster.master_url],
            cwd=ROOT, env=far_cluster.env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (fmt, out.stderr[-3000:])
        assert_no_spark_output(out)
        # its progress lines, then what it imported: as the local import says it
        assert out.stdout[out.stdout.index(f"{fmt}: imported"):] == local[fmt]
    cluster_rows = cache_contents(where / "cluster.duckdb")
    assert cluster_rows == cache_contents(where / "local.duckdb")
    assert sum(len(rows) for rows in cluster_rows.values()) > 100
    assert not [p for p in where.iterdir() if p.name.startswith("csi-")]


def test_what_a_task_raised_is_found_in_the_spark_error():
    """The Python worker's traceback inside Spark's error, as a classic session (py4j) and a
    Connect session give it (texts from real runs, Java frames shortened)."""
    from spark_backend.spark.session import one_line, task_raised

    classic = (
        "An error occurred while calling o75.getResult.\n"
        ": org.apache.spark.SparkException: Exception thrown in awaitResult: \n"
        "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:70)\n"
        "Caused by: org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception"
        " was thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "/x/datasource.py", line 169, in read\n'
        "    database = open_database(target)\n"
        "spark_backend.model.errors.SourceError: No Google Cloud credentials were found.\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n"
        "org.apache.spark.SparkException: Job aborted due to stage failure\n")
    assert task_raised(classic) == "No Google Cloud credentials were found."
    assert one_line(RuntimeError(classic)) == (
        "a task raised: No Google Cloud credentials were found.")
    connect = (
        "\n  An exception was thrown from the Python worker. Please see the stack trace below.\n"
        "[PYTHON_EXCEPTION] An exception was thrown from the Python worker: Traceback (most "
        "recent call last):\n"
        '  File "/x/y.py", line 3, in f\n'
        "    import spark_backend\n"
        "ModuleNotFoundError: No module named 'spark_backend'\n SQLSTATE: 38000\n")
    assert task_raised(connect).startswith(
        "ModuleNotFoundError: No module named 'spark_backend' (every node needs the project")
    assert task_raised("An error occurred while calling o1.x.\n: java.io.IOException: x") is None
    assert one_line(RuntimeError("Job aborted\n\tat x")) == "Job aborted"


def test_a_master_without_workers_is_one_sentence(tmp_path):
    """A master is up but no worker is registered (stopped, or not started yet): the pull's jobs
    would wait for ever without a word; it is one sentence once the wait for an executor is over
    (``CSI_SPARK_EXECUTOR_WAIT_S``, 60 s by default, 5 here)."""
    with standalone_cluster(tmp_path / "logs", workers=0, isolated=False) as running:
        out = cli("pull", "--source", "demo", "--spark-master", running.master_url, "--cache",
                  str(tmp_path / "c.duckdb"), env={"CSI_SPARK_EXECUTOR_WAIT_S": "5"})
        # The master's web UI port for its RPC port: Spark retried for a minute, then said
        # "(An error occurred while calling None.org.apache.spark.sql.classic.SparkSession.)"
        host, ui = running.web_ui
        web = cli("pull", "--source", "demo", "--spark-master", f"spark://{host}:{ui}",
                  "--cache", str(tmp_path / "c.duckdb"))
        master_log = (running.log_dir / "master.log").read_text(errors="replace")
    said = web.stderr.strip().splitlines()
    assert web.returncode == 1 and len(said) == 1, web.stderr[-2000:]
    assert said[0].startswith(
        f"error: A web server (HTTP/1.1 400 Bad Request) answers at {host}:{ui}, not a Spark "
        "master (a standalone master's web UI"), said
    # the probe of the master's own port (the pull above) leaves no complaint in its log (a
    # frame it could not read is a WARN with the exception, "Too large frame" for HTTP's bytes)
    assert not [line for line in master_log.splitlines()
                if "Exception" in line or "ERROR" in line or "frame" in line], master_log[-3000:]
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: The Spark master at {running.master_url} gave this application no executor "
        "within 5 s: no worker is registered with it"), lines
    assert_no_spark_output(out)


def test_a_bogus_master_is_one_sentence(tmp_path):
    out = cli("pull", "--source", "demo", "--spark-master", "bogus://x",
              "--cache", str(tmp_path / "c.duckdb"), timeout=120)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "bogus://x" in lines[0] and "spark://HOST:PORT" in lines[0]
    assert out.stdout == ""


def test_a_master_nobody_answers_is_one_sentence(tmp_path):
    from tests.support.cluster import free_port

    url = f"spark://127.0.0.1:{free_port()}"
    out = cli("pull", "--source", "demo", "--spark-master", url,
              "--cache", str(tmp_path / "c.duckdb"), timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0], lines
    assert_no_spark_output(out)
    # the cache file this pull created is gone again: it held nothing ("holds no stream yet")
    assert not list(tmp_path.iterdir())


def test_spark_start_failure_names_its_log_file(tmp_path):
    """A Spark that cannot start (here: a driver memory the JVM refuses) is one sentence
    naming the file where Spark's own words went."""
    log = tmp_path / "spark.log"
    script = ("import sys\n"
              "from spark_backend.spark import session\n"
              "from pyspark import SparkConf\n"
              "orig = SparkConf.set\n"
              "SparkConf.set = lambda self, k, v: orig(self, k, 'not-a-size' if k == "
              "'spark.driver.memory' else v)\n"
              "try:\n"
              "    session.spark_session('local[1]')\n"
              "except session.SparkUnavailable as e:\n"
              "    print(e)\n")
    env = dict(os.environ, CSI_SPARK_LOG=str(log))
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and str(log) in lines[0], (out.stdout, out.stderr[-2000:])
    assert_no_spark_output(out)
    assert log.stat().st_size > 0  # Spark's own words went to the file


def _require_network_namespaces() -> None:
    from tests.support.cluster import netns_missing

    _require(netns_missing(), "a network of their own")


@pytest.fixture(scope="module")
def far_cluster(tmp_path_factory):
    """A cluster on another machine as far as the network goes: its two workers live in a
    network namespace of their own (a veth pair to this one), where 127.0.0.1 is not the
    driver's, and keep their private mounts. ``far_cluster.near``: this machine's address on
    the way to them; ``far_cluster.env``: the environment of a user's machine (no
    SPARK_LOCAL_IP, no SPARK_REMOTE)."""
    from tests.support.cluster import private_network

    _require_private_mounts()
    _require_network_namespaces()
    base = tmp_path_factory.mktemp("far")
    hidden = base / "cache"
    hidden.mkdir()
    with private_network() as (ns, near, far), \
            standalone_cluster(base / "logs", workers=2, hidden=[hidden], project_root=ROOT,
                               host=near, network=(ns, far)) as running:
        running.hidden, running.near = hidden, near
        running.env = {k: v for k, v in os.environ.items()
                       if k not in ("SPARK_LOCAL_IP", "SPARK_REMOTE")}
        yield running


def _worker_logs(running) -> dict[str, int]:
    """Each worker log's size now: ``_executors_called_back`` reads only what comes after."""
    return {log.name: log.stat().st_size for log in running.log_dir.glob("worker-*.log")}


def _executors_called_back(running, near: str, since: dict[str, int]) -> None:
    """Since ``since``, both workers launched executors for this run's application, given the
    driver's address ``near``."""
    logs = []
    for log in running.log_dir.glob("worker-*.log"):
        with open(log, "rb") as f:
            f.seek(since.get(log.name, 0))
            logs.append(f.read().decode(errors="replace"))
    launched = [text for text in logs if "Asked to launch executor" in text]
    assert len(launched) == 2, "both workers ran executors for this run"
    assert all(f"CoarseGrainedScheduler@{near}:" in text for text in launched)


def test_a_pull_on_workers_of_another_network_equals_the_ground_truth(far_cluster):
    """With no SPARK_LOCAL_IP set, as on a user's machine, the driver gives the far workers its
    address on the way to the master, the demo world's server listens there too, and the pull
    equals the ground truth."""
    from spark_backend.spark.session import driver_address

    saved = os.environ.pop("SPARK_LOCAL_IP", None)
    try:
        assert driver_address(far_cluster.master_url) == far_cluster.near
    finally:
        if saved is not None:
            os.environ["SPARK_LOCAL_IP"] = saved
    cache_dir = far_cluster.hidden / "pull"
    cache_dir.mkdir()
    (cache_dir / "driver-only.txt").write_text("the executors must not see this")
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as marker:
        marker.write("nor this, in the driver's /tmp")
        marker.flush()
        # The isolation is real: the executors see neither the cache folder nor the driver's
        # /tmp, and they run on both workers.
        probe = subprocess.run(
            [sys.executable, "-c", _PROBE, far_cluster.master_url,
             str(cache_dir / "driver-only.txt"), marker.name, far_cluster.near],
            cwd=ROOT, env=far_cluster.env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert len(seen) == 8 and not any(a or b for a, b in seen)
    cache = cache_dir / "demo.duckdb"
    since = _worker_logs(far_cluster)
    out = subprocess.run(
        [sys.executable, "-m", "spark_backend", "pull", "--source", "demo",
         "--spark-master", far_cluster.master_url, "--cache", str(cache)],
        cwd=ROOT, env=far_cluster.env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pulled 28,000 records from 41 partitions" in out.stdout
    assert_no_spark_output(out)
    with Cache(cache) as opened:
        assert_equals_world(opened, "DemoStream", build_world())
    _executors_called_back(far_cluster, far_cluster.near, since)


def test_a_local_emulator_pull_on_workers_of_another_network(far_cluster):
    """``--source emulator`` starts an emulator on this machine: it listens where the far
    executors reach it, and they read its partitions (splits and merges every 2 to 4 s)."""
    import re

    since = _worker_logs(far_cluster)
    out = subprocess.run(
        [sys.executable, "-m", "spark_backend", "pull", "--source", "emulator",
         "--emulator-seconds", "4", "--spark-master", far_cluster.master_url,
         "--cache", str(far_cluster.hidden / "emulator.duckdb")],
        cwd=ROOT, env=far_cluster.env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    pulled = re.search(r"pulled ([\d,]+) records from (\d+) partitions", out.stdout)
    assert pulled, out.stdout
    assert int(pulled.group(1).replace(",", "")) > 0 and int(pulled.group(2)) > 1, out.stdout
    assert_no_spark_output(out)
    _executors_called_back(far_cluster, far_cluster.near, since)


def test_a_loopback_emulator_host_for_far_executors_is_one_sentence(monkeypatch):
    """``SPANNER_EMULATOR_HOST=localhost:9010`` with executors elsewhere (this machine serves
    them at a non-loopback address): they would dial their own loopback and every partition
    would fail after retries; the pull's source says so in one sentence before any job. With
    local executors it is used as given."""
    from spark_backend.jobs.pull_sources import SpannerSource
    from spark_backend.model.errors import BadInput

    monkeypatch.setenv("SPANNER_EMULATOR_HOST", "localhost:9010")
    source = SpannerSource(project="p", instance="i", database="d", stream="S")
    with pytest.raises(BadInput) as said, source.open("198.18.0.1"):
        pass
    assert str(said.value).startswith(
        "SPANNER_EMULATOR_HOST=localhost:9010 names this machine's loopback"), said.value
    assert "(e.g. 198.18.0.1:PORT" in str(said.value)
    with source.open("127.0.0.1") as src:
        assert src.target.host == "localhost:9010"


def test_the_dashboards_pulls_on_workers_of_another_network(far_cluster):
    """The dashboard started with ``CSI_SPARK_MASTER`` naming the far cluster, on an empty
    cache: its first minute pulls the whole demo world through the cluster, and a Pull from the
    Sources page (the dashboard's shared demo server, PostgreSQL dialect) lands too; both equal
    the ground truth."""
    cache = far_cluster.hidden / "dashboard.duckdb"
    env = dict(far_cluster.env, CSI_SPARK_MASTER=far_cluster.master_url)
    since = _worker_logs(far_cluster)
    out = subprocess.run([sys.executable, "-m", "tests.support.dashboard_run", "pulls",
                          str(cache)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["exceptions"] == [] and said["first_run_errors"] == [], said
    assert said["bootstrap"]["error"] is None, said
    assert said["bootstrap"]["slices_done"] == 5, said
    assert said["sources"]["errors"] == [] and said["sources"]["exceptions"] == [], said
    assert any("28\\,000 records of DemoPg" in s for s in said["sources"]["success"]), said
    world = build_world()
    with Cache(cache) as opened:
        assert_equals_world(opened, "DemoStream", world, heartbeats=False)  # in 5 slices
        assert_equals_world(opened, "DemoPg", world)
    _executors_called_back(far_cluster, far_cluster.near, since)


def _source_towards_a_documentation_address() -> str | None:
    """The source address ``ip route get`` names for 198.51.100.7 (a second opinion on the
    kernel's route); skips without iproute2."""
    import shutil

    if shutil.which("ip") is None:
        pytest.skip("iproute2's ip is not installed: no second opinion on the route")
    route = subprocess.run(["ip", "-o", "route", "get", "198.51.100.7"], capture_output=True,
                           text=True)
    words = route.stdout.split()
    return words[words.index("src") + 1] if "src" in words else None


def test_the_driver_address_follows_the_master(monkeypatch):
    """Local Spark and a master on the loopback keep the driver on 127.0.0.1; a chosen
    SPARK_LOCAL_IP wins; a master elsewhere gets this machine's address on the way to it."""
    from spark_backend.spark.session import driver_address

    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    for master in ("local[*]", "local[2]", "spark://127.0.0.1:7077", "spark://localhost:7077",
                   "spark://127.0.0.1:7077,localhost:7078", "k8s://https://127.0.0.1:6443"):
        assert driver_address(master) == "127.0.0.1", master
    expected = _source_towards_a_documentation_address()
    assert driver_address("spark://198.51.100.7:7077") == expected
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.9.8.7")
    assert driver_address("spark://198.51.100.7:7077") == "10.9.8.7"
    assert driver_address("local[*]") == "10.9.8.7"


def test_the_serving_address_is_known_before_spark_starts(monkeypatch):
    """What the dashboard's first minute binds its demo server to before the session exists
    equals what the session will say, for each way Spark is chosen."""
    from spark_backend.spark.session import planned_executor_facing_address as planned

    for name in ("SPARK_LOCAL_IP", "SPARK_REMOTE", "CSI_SPARK_MASTER"):
        monkeypatch.delenv(name, raising=False)
    assert planned() == "127.0.0.1"  # local[*]
    assert planned(master="local[2]") == "127.0.0.1"
    assert planned(remote="sc://127.0.0.1:15002") == "127.0.0.1"
    assert planned(master="yarn") is None  # Spark's own choice: known once it has started
    assert planned(master="bogus://x") is None  # the session says what is wrong
    expected = _source_towards_a_documentation_address()
    assert planned(master="spark://198.51.100.7:7077") == expected
    monkeypatch.setenv("CSI_SPARK_MASTER", "spark://198.51.100.7:7077")
    assert planned() == expected
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:15002")  # wins over CSI_SPARK_MASTER
    assert planned() == "127.0.0.1"
    assert planned(master="spark://198.51.100.7:7077") == expected  # an explicit master wins
    # A Connect server on this machine's loopback (a tunnel) whose executors are elsewhere:
    # SPARK_LOCAL_IP chooses, as for a classic driver.
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.9.8.7")
    assert planned() == "10.9.8.7"



def test_a_users_own_session_on_workers_of_another_network_reads_with_read_format(far_cluster,
                                                                                   tmp_path):
    """A data engineer's job, as the README shows it, in a classic session of its own on the
    far cluster: its executors read the demo server over the network, and the rows are every
    record of the range once."""
    from spark_backend.demo.server import DemoServer
    from tests.support import batch_job
    from tests.test_datasource_range import options

    world = build_world(7, 0.1)
    out = tmp_path / "records.parquet"
    since = _worker_logs(far_cluster)
    with DemoServer(world, host=far_cluster.near) as demo:
        job = subprocess.run(
            [sys.executable, "-m", "tests.support.batch_job",
             f"{far_cluster.master_url}@{far_cluster.near}",
             json.dumps(options(world, demo.start())), str(out)],
            cwd=ROOT, env=far_cluster.env, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    batch_job.check(out, world)
    _executors_called_back(far_cluster, far_cluster.near, since)
