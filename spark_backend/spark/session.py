"""The Spark session: local by default, any master or a Spark Connect endpoint on request.

Spark never writes on the terminal: the JVM (launcher, log4j, Python workers of a local master)
writes into a log file, one per process, whose path every Spark error message names.
Results come back through Spark itself, by its public API (:func:`arrow_batches`:
``DataFrame.toArrow()``): the executors share nothing with the driver but the network, so the
same code runs on ``local[*]``, a ``spark://`` master, YARN/Kubernetes and Spark Connect.
Nothing started here outlives the process: the JVM and its Python workers are this process's
children and go with it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_backend.model import checks, config
from spark_backend.model.errors import BadInput, InspectorError
from spark_backend.spark import probes, scratch
from spark_backend.spark.remote import is_remote

_lock = threading.Lock()
_registered: set[int] = set()
_warm: set[int] = set()
_log_path: Path | None = None

# Set once this process has launched its JVM (or uses one it did not launch): from then on
# gRPC threads may start without a fork of this process next to them.
jvm_launched = threading.Event()

LOG_ENVVAR = "CSI_SPARK_LOG"  # where Spark's own output goes (default: under the cache folder)
_REMOTE_RE = checks.SPARK_REMOTE_RE


class SparkUnavailable(InspectorError):
    """Spark did not start, or a Spark job failed for a reason outside the project."""


def spark_log_path() -> Path:
    """The file this process's Spark output goes to (created on first use)."""
    global _log_path
    if _log_path is None:
        chosen = os.environ.get(LOG_ENVVAR)
        if chosen:
            path = Path(chosen)
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            path = config.DEFAULT_CACHE.parent / "logs" / f"spark-{stamp}-{os.getpid()}.log"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab"):
                pass
        except OSError as e:
            raise SparkUnavailable(
                f"Spark's log cannot be written at {path} ({e.strerror or e}); set "
                f"${LOG_ENVVAR} to a file in a writable folder."
            ) from e
        _log_path = path
    return _log_path


def _python_logs_to_file() -> None:
    """py4j and pyspark log through Python's logging: into the same file, not the terminal."""
    handler = logging.FileHandler(spark_log_path())
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("py4j", "pyspark"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
            logger.addHandler(handler)
        logger.propagate = False


def _loopback(host: str) -> bool:
    """True when every address ``host`` names is this machine's loopback."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None)
    except (OSError, UnicodeError):
        return False
    return bool(infos) and all(
        ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def names_loopback(address: str) -> bool:
    """True when ``HOST:PORT`` (or ``[V6]:PORT``, or a bare host) names only this machine's
    loopback: an address that executors on other machines cannot reach here."""
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or "]:" in address else address
    return _loopback(host.strip("[]"))


def _route_source(host: str, port: int) -> str | None:
    """The address of this machine that the network reaches ``host`` from (the kernel's choice
    of source address for a datagram to it: nothing is sent), or None without a route."""
    try:
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(
                host.strip("[]"), port, type=socket.SOCK_DGRAM):
            with socket.socket(family, kind, proto) as s:
                try:
                    s.connect(sockaddr)
                except OSError:
                    continue
                return s.getsockname()[0]
    except (OSError, UnicodeError):
        pass
    return None


def _master_hosts(master: str) -> list[tuple[str, int]]:
    """(host, port) of each master a URL names: ``spark://A:7077,B:7077``, ``k8s://https://H:P``
    (none for ``yarn`` and ``local``)."""
    if master.startswith("spark://"):
        rest = master[len("spark://"):].split(",")
    elif master.startswith("k8s://"):
        rest = [master[len("k8s://"):].split("://", 1)[-1].split("/", 1)[0]]
    else:
        return []
    hosts = []
    for address in rest:
        host, _, port = address.rpartition(":")
        if not host:
            host, port = address, "443"
        hosts.append((host.strip("[]"), int(port) if port.isdigit() else 443))
    return hosts


def driver_address(master: str) -> str | None:
    """The address the driver listens on and gives its executors (and that a source served by
    this process binds to): ``$SPARK_LOCAL_IP`` when set; 127.0.0.1 for local Spark and for a
    master on this machine's loopback; otherwise this machine's address on the way to the
    master (the executors of a real cluster cannot reach the driver's loopback), or None:
    Spark's own choice, the host name's address (YARN, or no route to the master)."""
    chosen = os.environ.get("SPARK_LOCAL_IP")
    if chosen:
        return chosen
    if master.startswith("local"):
        return "127.0.0.1"
    hosts = _master_hosts(master)
    if hosts and all(_loopback(host) for host, _ in hosts):
        return "127.0.0.1"
    for host, port in hosts:
        address = _route_source(host, port)
        if address:
            return address
    return None


def _towards_connect(host: str, port: int = 15002) -> str:
    """This machine's address for the executors behind a Connect server at ``host``:
    ``$SPARK_LOCAL_IP`` when set; 127.0.0.1 for a server on the loopback; otherwise the
    address on the way to the server."""
    chosen = os.environ.get("SPARK_LOCAL_IP")
    if chosen:
        return chosen
    return "127.0.0.1" if _loopback(host) else (_route_source(host, port) or "127.0.0.1")


def executor_facing_address(spark) -> str:
    """The address of this process that the session's executors reach it at: where a source
    this process serves (the demo world) must listen for them."""
    if is_remote(spark):  # the Connect server's executors: on its side of the network
        return _towards_connect(spark.client.host.strip("[]"))
    host = spark.sparkContext.getConf().get("spark.driver.host", "127.0.0.1")
    return "127.0.0.1" if _loopback(host) else host


def planned_executor_facing_address(master: str | None = None,
                                    remote: str | None = None) -> str | None:
    """``executor_facing_address`` of the session that ``spark_session(master, remote)`` makes,
    known before it exists (a demo server can start while Spark does); None when only the
    session knows (YARN: Spark's own choice) or the settings are malformed (the session says
    so)."""
    master, remote, _, _ = _settings(master, remote)
    try:
        if remote:
            host, port = validate_remote(remote)
            return _towards_connect(host, port)
        return driver_address(checks.spark_master(master))
    except BadInput:
        return None


def validate_remote(remote: str) -> tuple[str, int]:
    checks.spark_remote(remote)
    m = _REMOTE_RE.match(remote)
    return m.group("host").strip("[]"), int(m.group("port") or 15002)


_RAISED = re.compile(r"(?P<qual>(?:[A-Za-z_]\w*\.)*(?P<name>[A-Za-z_]\w*)): (?P<message>.+)")
_NOT_PYTHON = ("org.", "java.", "javax.", "scala.", "py4j.", "io.grpc.", "com.")


def task_raised(text: str) -> str | None:
    """What a Spark task's Python code raised, as one line, from the Python worker's traceback
    inside a Spark error's text (the last exception line of the last traceback); this project's
    own errors give their sentence alone. None when the text holds no Python traceback."""
    raised = None
    in_traceback = False
    for line in text.splitlines():
        if "Traceback (most recent call last)" in line:
            in_traceback = True
            continue
        if not in_traceback or line[:1] in (" ", "\t"):
            continue
        m = _RAISED.fullmatch(line.strip())
        if m and not m["qual"].startswith(_NOT_PYTHON) and (
                m["qual"].startswith("spark_backend.")
                or m["name"].endswith(("Error", "Exception", "Exit", "Interrupt"))):
            raised = m
    if raised is None:
        return None
    if raised["qual"].startswith("spark_backend."):
        return raised["message"].strip()[:400]
    said = f"{raised['name']}: {raised['message'].strip()}"[:400]
    if raised["name"] in ("ModuleNotFoundError", "ImportError"):
        said += (" (every node needs the project and its requirements installed for the "
                 "Python that runs its tasks: README, Running on a cluster)")
    return said


def one_line(error: BaseException) -> str:
    """The first meaningful line of a Spark/py4j error (never a stack trace); for a task whose
    Python code raised, what it raised (``task_raised``): a task on an executor of a cluster
    meets what the driver did not (no credentials there, the project not installed)."""
    text = str(error)
    raised = task_raised(text)
    if raised:
        return f"a task raised: {raised}"
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "Traceback", "File ", "JVM stacktrace")):
            return line[:300]
    return type(error).__name__


def _settings(master: str | None, remote: str | None) -> tuple[str, str | None, str, str]:
    """(master, remote, and the label each is named by in an error) that a session of these
    arguments uses: the arguments, else env SPARK_REMOTE, then env CSI_SPARK_MASTER, then
    ``local[*]``."""
    remote_label, master_label = "--spark-remote", "--spark-master"
    if not remote and not master:
        remote, remote_label = os.environ.get(config.SPARK_REMOTE_ENVVAR), "$SPARK_REMOTE"
    if not master and not remote:
        master, master_label = os.environ.get(config.SPARK_MASTER_ENVVAR), "$CSI_SPARK_MASTER"
    return master or "local[*]", remote, master_label, remote_label


def spark_session(master: str | None = None, remote: str | None = None):
    """Get (or create) the session (``data_sources`` registers the project's data sources).

    ``remote`` selects Spark Connect (``sc://host:15002``), ``master`` a classic session; with
    neither, env SPARK_REMOTE, then env CSI_SPARK_MASTER, then ``local[*]`` (an explicit
    ``master`` is not overridden by an exported SPARK_REMOTE). ``driver_address`` says where
    the driver listens.
    Raises ``BadInput`` for a malformed URL and ``SparkUnavailable`` (one sentence naming the
    log file) when Spark does not start.
    """
    config.quiet_local_client_env()
    master, remote, master_label, remote_label = _settings(master, remote)
    with _lock:
        _python_logs_to_file()
        if remote:
            checks.spark_remote(remote, remote_label)
            checks.spark_conf(os.environ.get(config.SPARK_CONF_ENVVAR), remote=True)
            spark = _connect_session(remote, remote_label)
        else:
            spark = _classic_session(checks.spark_master(master, master_label), master_label)
        jvm_launched.set()
    return spark


def data_sources(spark):
    """``spark`` with the project's Python data sources registered (``spanner_change_stream``,
    ``change_files``), once per session; returns it. Only a ``spark.read.format(...)`` of them
    needs this: registering starts Spark's data-source lookup process (~70 MB with its
    daemon), which a pull (``datasource.change_stream_frame``) does without."""
    with _lock:
        if id(spark) not in _registered:
            from spark_backend.spark.datasource import (
                ChangeFilesDataSource,
                SpannerChangeStreamDataSource,
            )

            try:
                spark.dataSource.register(SpannerChangeStreamDataSource)
                spark.dataSource.register(ChangeFilesDataSource)
            except Exception as e:
                raise SparkUnavailable(
                    f"Spark started but refused the project's data sources ({one_line(e)}); "
                    f"Spark's log is {spark_log_path()}."
                ) from e
            _registered.add(id(spark))
    return spark


def _import_connect_client() -> None:
    """Import the Connect client without IPython: pyspark imports it (a third of a second)
    only to size a progress bar in a terminal, which the tool never shows."""
    if "IPython" in sys.modules or "pyspark.sql.connect.session" in sys.modules:
        return
    sys.modules["IPython"] = None  # type: ignore[assignment]  # an ImportError for pyspark
    try:
        import pyspark.sql.connect.session  # noqa: F401
    finally:
        if sys.modules.get("IPython", 0) is None:
            del sys.modules["IPython"]


def _leave_out(label: str) -> str:
    """How to do without the Spark ``label`` names: a flag is left out, a variable unset."""
    return f"unset {label[1:]}" if label.startswith("$") else f"leave out {label}"


def _connect_session(remote: str, label: str = "--spark-remote"):
    _import_connect_client()
    from pyspark.sql import SparkSession

    host, port = validate_remote(remote)
    shown = checks.shown_remote(remote)
    try:  # the Connect client retries for minutes against nothing: ask once, quickly
        socket.create_connection((host, port), timeout=3).close()
    except OSError as e:
        raise SparkUnavailable(
            f"No Spark Connect server answers at {shown} ({e.strerror or e}); start one "
            f"(README, 'Spark Connect') or {_leave_out(label)} to use local Spark."
        ) from e
    problem = probes.connect_port_problem(host, port, tls=_connect_uses_tls(remote, host))
    if problem:  # the Connect client would retry for minutes (gRPC's lines on the terminal)
        raise SparkUnavailable(f"Spark Connect at {shown} cannot be used: {problem}.")
    url = remote if ";" in remote else f"{remote.rstrip('/')}/;session_id={_session_id(remote)}"
    try:
        spark = SparkSession.builder.remote(url).getOrCreate()
        return _alive(spark, remote) if url != remote else spark
    except SparkUnavailable:
        raise
    except Exception as e:
        said = one_line(e)
        token = _connect_params(remote).get("token")
        if token:  # a credential is never shown
            said = said.replace(token, "(hidden)")
        raise SparkUnavailable(
            f"Spark Connect at {shown} did not accept a session ({said})."
        ) from e


def _connect_params(remote: str) -> dict[str, str]:
    """The ``;key=value`` parameters of a Connect URL."""
    return dict(part.strip().partition("=")[::2] for part in remote.split(";")[1:])


def _connect_uses_tls(remote: str, host: str) -> bool:
    """Whether pyspark's Connect client talks TLS to ``remote`` (``ChannelBuilder.secure``):
    with ``;use_ssl=true``, or with a ``;token=`` to any host but ``localhost``."""
    params = _connect_params(remote)
    use_ssl = params.get("use_ssl", "").lower() == "true"
    return use_ssl or ("token" in params and host != "localhost")


# Spark Connect: every process of the tool joins one server-side session per server (its id
# kept in a file), instead of opening a new one. A new session starts its own Python workers
# on the server (seconds); a session used before has them running, and has the uploaded
# files. The server ends a session left idle (an hour by default): a new one is made then.
_SESSIONS_FILE = "spark-connect-sessions.json"


def _sessions_path() -> Path:
    return config.DEFAULT_CACHE.parent / _SESSIONS_FILE


def _session_id(remote: str, fresh: bool = False) -> str:
    path = _sessions_path()
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(known, dict):
            known = {}
    except (OSError, ValueError):
        known = {}
    chosen = known.get(remote)
    try:
        uuid.UUID(str(chosen))
    except ValueError:
        chosen = None
    if chosen and not fresh:
        return chosen
    known.pop(remote, None)
    known = dict(list(known.items())[-19:])  # the servers used last
    known[remote] = chosen = str(uuid.uuid4())
    with contextlib.suppress(OSError):  # not kept: the next process opens a new session
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known), encoding="utf-8")
        os.replace(tmp, path)
    return chosen


def _alive(spark, remote: str):
    """A session the server ended (idle, released) refuses every call: replace it."""
    try:
        spark.conf.get("spark.sql.shuffle.partitions")
        return spark
    except Exception as e:
        if "SESSION_CLOSED" not in str(e) and "INVALID_HANDLE" not in str(e):
            raise
    with contextlib.suppress(Exception):
        spark.client.close()
    from pyspark.sql import SparkSession

    url = f"{remote.rstrip('/')}/;session_id={_session_id(remote, fresh=True)}"
    return SparkSession.builder.remote(url).create()  # the new default session


_DRIVER_JAVA_OPTIONS = (
    "-XX:+UseSerialGC -Xms32m -Xmn32m -XX:MinHeapFreeRatio=10 -XX:MaxHeapFreeRatio=30 "
    "-XX:TieredStopAtLevel=1 -XX:CompileThresholdScaling=10 -XX:ReservedCodeCacheSize=96m "
    "-XX:+IgnoreUnrecognizedVMOptions "
    "-XX:+UnlockDiagnosticVMOptions -XX:TrimNativeHeapInterval=1000")


def _scratch_option() -> str:
    """The driver JVM's temporary folder: this process's (``scratch``), which the next start
    removes if a SIGKILL left it. Spark makes its folders under it unless the user named
    others (``spark.local.dir``, ``$SPARK_LOCAL_DIRS``). A path with a space cannot travel in
    the JVM's options, which Spark splits at spaces: Spark's own default (``/tmp``) then."""
    folder = scratch.folder()
    return "" if " " in folder else f"-Djava.io.tmpdir={folder}"


def _crash_file() -> str:
    """Where a driver JVM that crashes writes its report: beside Spark's log, not in the
    folder the command runs in (``hs_err_pid*.log``)."""
    folder = str(spark_log_path().parent)
    return "" if " " in folder else f"-XX:ErrorFile={folder}/hs_err_pid%p.log"


def _classic_conf(master: str, address: str | None):
    """The classic session's settings: the tool's, then the user's (``$CSI_SPARK_CONF``)."""
    from pyspark import SparkConf

    java_options = os.environ.get("CSI_SPARK_DRIVER_JAVA_OPTIONS", _DRIVER_JAVA_OPTIONS)
    conf = (
        SparkConf()
        .setMaster(master)
        .setAppName("changestream-inspector")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.sql.shuffle.partitions", "4")
        .set("spark.python.worker.reuse", "true")
        .set("spark.sql.execution.arrow.pyspark.enabled", "true")
        # The driver's JVM holds little (tasks' results on their way to Python; Spark asks for
        # a 450 MB heap at least): a heap that starts small (not 1/64 of the machine's memory)
        # and gives back what it does not need, a 32 MB young generation, a small code cache,
        # and the C heap's free pages returned every second (a JDK 17 older than 17.0.9 ignores
        # that option). Only the quick compiler (C1, ``TieredStopAtLevel=1``): the JVM moves
        # opaque packed bytes and schedules tasks, its code is not what a pull waits for, and
        # it is smaller without the optimising one. It compiles a method after 10x its usual
        # calls (``CompileThresholdScaling=10``), so methods called once per task or job do not
        # grow the compiled code with the work a process has done. Measurements:
        # benchmarks/RESULTS.md ("the driver's JVM starts with") and benchmarks/MEMORY.md.
        .set("spark.driver.memory", os.environ.get("CSI_SPARK_DRIVER_MEMORY", "512m"))
        .set("spark.driver.extraJavaOptions",
             f"{java_options} {_crash_file()} {_scratch_option()}".strip())
        .set("spark.executor.memory", "1g")
        # A task's results up to 16 MB travel in its status message instead of being put in
        # the executor's block store, fetched from there and removed (Spark's default above
        # 1 MB; a 1M-record pull's tasks carry up to 32,768 records).
        .set("spark.task.maxDirectResultSize", "16m")
        # A job's results bigger than this are dropped by the executors and the job aborted
        # with why, instead of being fetched into a 512 MB heap that they would exhaust (an
        # OutOfMemoryError in a result-getter thread leaves the job waiting forever). An
        # import's job stays well below it (``jobs.files``: at most 256 MB of input a job).
        .set("spark.driver.maxResultSize", "256m")
        # What Spark keeps of finished jobs, stages and SQL executions for its UI and status
        # tracker (kept with the UI off too), by default 1,000 of each: a long-lived process
        # (the dashboard, whose live views pull every few seconds) would grow its JVM's live
        # heap with every job up to that (~23 KB per job kept; benchmarks/MEMORY.md). A pull
        # looks at none of it.
        .set("spark.ui.retainedJobs", "100")
        .set("spark.ui.retainedStages", "100")
        .set("spark.sql.ui.retainedExecutions", "100")
    )
    if address:
        conf.set("spark.driver.host", address).set("spark.driver.bindAddress", address)
    for name in config.ALLOCATOR_ENV:  # a cluster's executors do not inherit the driver's env
        if name in os.environ:
            conf.set(f"spark.executorEnv.{name}", os.environ[name])
    # The user's own settings last: they win over the tool's (executor memory, shipping the
    # project with spark.submit.pyFiles, a YARN queue...).
    for key, value in checks.spark_conf(os.environ.get(config.SPARK_CONF_ENVVAR)).items():
        conf.set(key, value)
    return conf


def _fileno(stream: Any) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


@contextlib.contextmanager
def _descriptor_to(fd: int, path: Path, name: str) -> Iterator[None]:
    """Descriptor ``fd`` is the file at ``path`` meanwhile, while ``sys.<name>`` (when it
    writes to ``fd``) writes to a copy of what ``fd`` was: this process's own output still
    reaches the terminal, what a process started meanwhile inherits goes to the file."""
    stream = getattr(sys, name)
    with contextlib.suppress(Exception):
        stream.flush()
    saved = os.dup(fd)
    kept = None
    try:
        if _fileno(stream) == fd:
            kept = open(os.dup(saved), "w", buffering=1,
                        encoding=getattr(stream, "encoding", None) or "utf-8",
                        errors="backslashreplace")
            setattr(sys, name, kept)
        with open(path, "ab") as log:
            os.dup2(log.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        if kept is not None:
            setattr(sys, name, stream)
            with contextlib.suppress(Exception):
                kept.close()


@contextlib.contextmanager
def _child_output_to_log() -> Iterator[None]:
    """While the JVM is launched, this process's descriptors 1 and 2 (which the JVM and the
    Python workers it starts inherit) are Spark's log file: what they write (log4j's console,
    the JVM's own warnings, a worker's traceback) goes there, not on the terminal. This
    process's ``sys.stdout`` and ``sys.stderr`` still reach the terminal meanwhile; a C
    library of this process writing to the descriptors in that window writes to the log."""
    path = spark_log_path()
    with _descriptor_to(1, path, "stdout"), _descriptor_to(2, path, "stderr"):
        yield


def _classic_session(master: str, label: str = "--spark-master"):
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:  # this thread's session, else the process's (one SparkContext per process)
        return SparkSession.active()
    except PySparkRuntimeError:
        pass  # none yet, or the last one was stopped
    _check_standalone_master(master, label)
    # A master given beside an exported SPARK_REMOTE wins (``spark_session``): Spark's launcher
    # and pyspark's builder would take the variable for a Connect session (the launcher refuses
    # both), so this process, whose one session is classic, drops it.
    os.environ.pop(config.SPARK_REMOTE_ENVVAR, None)
    address = driver_address(master)
    if address:  # what the JVM, launched below, advertises (its block manager's files too)
        os.environ["SPARK_LOCAL_IP"] = address
    conf = _classic_conf(master, address)
    spark = None
    try:
        with _child_output_to_log():
            spark = SparkSession.builder.config(conf=conf).getOrCreate()
        jvm_launched.set()
        spark.sparkContext.setLogLevel("WARN")
        _wait_for_an_executor(spark, master, label)
        return spark
    except Exception as e:
        if spark is not None:
            with contextlib.suppress(Exception):
                spark.stop()
        if isinstance(e, InspectorError):
            raise
        raise SparkUnavailable(
            f"Spark did not start with master {master} ({one_line(e)}); Spark's log is "
            f"{spark_log_path()}."
        ) from e


EXECUTOR_WAIT_ENVVAR = "CSI_SPARK_EXECUTOR_WAIT_S"


def _executor_wait_s() -> float:
    raw = os.environ.get(EXECUTOR_WAIT_ENVVAR, "60")
    try:
        wait_s = float(raw)
    except ValueError:
        wait_s = -1.0
    if not 0 < wait_s <= 3600:
        raise BadInput(f"${EXECUTOR_WAIT_ENVVAR}={raw!r} is not a wait; give seconds from 1 "
                       "to 3600.")
    return wait_s


def _wait_for_an_executor(spark, master: str, label: str) -> None:
    """A standalone master that gives the application no executor (no worker registered, or
    none with the cores and memory an executor asks for) lets its jobs wait for ever without a
    word: one task (a job of its own group) runs on the first executor; without one within
    ``$CSI_SPARK_EXECUTOR_WAIT_S`` (default 60 s) the job is cancelled and one sentence says
    why. Not for YARN or Kubernetes, whose executors may only come with the first job."""
    sc = spark.sparkContext
    if not master.startswith("spark://") or sc.getConf().get(
            "spark.dynamicAllocation.enabled", "false").lower() == "true":
        return
    wait_s = _executor_wait_s()
    group = f"csi-executor-wait-{os.getpid()}"
    ran = threading.Event()
    failed: list[BaseException] = []

    def probe() -> None:
        try:
            sc.setJobGroup(group, "waiting for a first executor", interruptOnCancel=True)
            spark.range(0, 1, 1, 1).count()
        except BaseException as e:
            failed.append(e)
        finally:
            ran.set()

    threading.Thread(target=probe, daemon=True, name="spark-executor-wait").start()
    if not ran.wait(wait_s):
        with contextlib.suppress(Exception):
            sc.cancelJobGroup(group)
        memory = sc.getConf().get("spark.executor.memory", "1g")
        raise SparkUnavailable(
            f"The Spark master at {master} gave this application no executor within "
            f"{wait_s:.0f} s: no worker is registered with it, or none has a free core and "
            f"the memory an executor asks for (spark.executor.memory {memory}); start a "
            f"worker (README, 'Running on a cluster') or {_leave_out(label)} to use local "
            "Spark.")
    if failed:
        raise failed[0]


def _check_standalone_master(master: str, label: str = "--spark-master") -> None:
    """A standalone master that does not answer: say so at once (Spark retries for a minute)."""
    if not master.startswith("spark://"):
        return
    problems = []
    for host, port in _master_hosts(master):
        try:
            socket.create_connection((host, port), timeout=3).close()
        except OSError:
            continue
        problem = probes.master_port_problem(host, port)
        if problem is None:
            return
        problems.append(problem)
    if problems:  # something answers, but not a master: Spark would retry for a minute
        said = "; ".join(problems)
        raise SparkUnavailable(
            f"{said[0].upper()}{said[1:]}; give {label} the master's URL as its web UI shows "
            f"it (spark://HOST:7077), or {_leave_out(label)} to use local Spark.")
    raise SparkUnavailable(
        f"No Spark master answers at {master}; start one (README, 'Running on a cluster') or "
        f"{_leave_out(label)} to use local Spark."
    )


def warm_up(spark) -> None:
    """Start the Python workers (planning and executors) and import the reader in them.

    The first job of a session pays for starting Python workers and importing the Spanner
    client (seconds); paying it here, e.g. while a dashboard starts, keeps it out of a pull.
    """
    if id(spark) in _warm:
        return
    from spark_backend.spark.datasource import change_stream_frame

    df = change_stream_frame(spark, dict(
        project="warm-up", instance="warm-up", database="warm-up", stream="WarmUp",
        heartbeat_ms="10000", end_ns="0", partitions="[]", warm_up=str(task_slots(spark))))
    for _ in arrow_batches(spark, df):
        pass
    _warm.add(id(spark))


def task_slots(spark) -> int:
    """How many tasks the cluster runs at once (Connect: from the server's conf, else 4)."""
    if is_remote(spark):
        try:
            configured = spark.conf.get("spark.default.parallelism", None)
            if configured:
                return max(1, int(configured))
            m = re.match(r"local\[(\d+|\*)", spark.conf.get("spark.master", "") or "")
            if m:
                return int(m.group(1)) if m.group(1) != "*" else (os.cpu_count() or 2)
        except Exception:
            pass
        return 4
    return max(1, int(spark.sparkContext.defaultParallelism))


def arrow_batches(spark, df) -> Iterator[Any]:
    """The DataFrame's rows as Arrow record batches, once its job ended (``DataFrame.toArrow``,
    public on classic Spark and Spark Connect alike). A pull bounds each job (one task, a row
    and time budget), so the driver holds one task's results at a time per job."""
    del spark  # the DataFrame knows its session; kept for callers that name it
    yield from df.toArrow().to_batches()
