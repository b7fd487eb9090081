"""Start a Spark standalone cluster or a Spark Connect server from the installed pyspark.

Each standalone worker runs under ``unshare -m`` with a private tmpfs over /tmp and over the
folders named (the cache's folder), so its executors share nothing with the driver but the
network: a job that writes into, or reads from, a driver path fails there as on a real cluster.
Everything Spark prints goes into log files in ``log_dir``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from spark_backend.model.config import ALLOCATOR_ENV

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120.0,
               host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}); see {log}")
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:.0f}s; see {log}")


def unshare_missing() -> str | None:
    """Why workers cannot get private mounts here (None: they can)."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "private mounts per worker (unshare -m, mount -t tmpfs) need root"
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tmpfs /tmp"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"unshare -m with a tmpfs mount is not allowed here: {probe.stderr.strip()}"
    return None


def netns_missing() -> str | None:
    """Why workers cannot get a network of their own here (None: they can)."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "a network namespace per worker (ip netns) needs root"
    name = f"csi-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add is not allowed here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


@contextmanager
def private_network() -> Iterator[tuple[str, str, str]]:
    """A network namespace joined to this machine's only by a pair of virtual interfaces:
    yields (namespace, this side's address, the namespace's address). A process in it is
    like another machine on the same network: it reaches this one at this side's address
    only (127.0.0.1 there is its own loopback, with nothing listening)."""
    tag = f"{os.getpid() % 100_000}"
    ns, near_if, far_if = f"csi-net-{tag}", f"csih{tag}", f"csin{tag}"
    net = f"198.18.{os.getpid() % 250}"  # 198.18.0.0/15: for network tests (RFC 2544)
    near, far = f"{net}.1", f"{net}.2"
    steps = [["ip", "netns", "add", ns],
             ["ip", "link", "add", near_if, "type", "veth", "peer", "name", far_if],
             ["ip", "link", "set", far_if, "netns", ns],
             ["ip", "addr", "add", f"{near}/30", "dev", near_if],
             ["ip", "link", "set", near_if, "up"],
             ["ip", "-n", ns, "addr", "add", f"{far}/30", "dev", far_if],
             ["ip", "-n", ns, "link", "set", far_if, "up"],
             ["ip", "-n", ns, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, text=True)
        yield ns, near, far
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # its end of the pair
        subprocess.run(["ip", "link", "del", near_if], capture_output=True)  # gone with it


def _private_mounts_script(hidden: list[Path], keep: list[Path]) -> str:
    """Shell lines: tmpfs over /tmp and ``hidden``; paths of ``keep`` (the Python environment,
    the project) that lie under a hidden folder are bound back.

    Each is first bound to a folder outside what gets hidden, inside the worker's own mount
    namespace, and moved back after the tmpfs mounts. (Binding it back from ``/proc/1/root``
    failed for a checkout under /tmp on our CI machine; why was not pinned down.)"""
    covered = [p for p in keep
               if any(p == h or h in p.parents for h in [Path("/tmp"), *hidden])]
    lines = ["set -e", 'stash="$(mktemp -d /run/csi-keep.XXXXXX)"',
             'mount -t tmpfs tmpfs "$stash"']
    for i, path in enumerate(covered):
        q = shlex.quote(str(path))
        lines += [f'mkdir -p "$stash/{i}"', f'mount --bind {q} "$stash/{i}"']
    lines.append("mount -t tmpfs tmpfs /tmp")
    for folder in hidden:
        lines += [f"mkdir -p {shlex.quote(str(folder))}",
                  f"mount -t tmpfs tmpfs {shlex.quote(str(folder))}"]
    for i, path in enumerate(covered):
        q = shlex.quote(str(path))
        lines += [f"mkdir -p {q}", f'mount --move "$stash/{i}" {q}']
    lines += ['umount "$stash"', 'rmdir "$stash"', 'exec "$@"']
    return "\n".join(lines)


def _env(extra_pythonpath: list[str]) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARK_HOME"] = str(spark_home())
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["SPARK_NO_DAEMONIZE"] = "1"
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*extra_pythonpath, *paths]))
    env.pop("SPARK_REMOTE", None)
    for name in ALLOCATOR_ENV:  # as on a real cluster: the driver's settings do not reach it
        env.pop(name, None)
    return env


@dataclass
class Cluster:
    master_url: str
    log_dir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    web_ui: tuple[str, int] = ("", 0)  # the master's web UI: (host, port)


@contextmanager
def standalone_cluster(log_dir: Path, *, workers: int = 2, cores: int = 1,
                       memory: str = "1g", hidden: list[Path] = (),
                       project_root: Path | None = None,
                       isolated: bool = True, host: str = "127.0.0.1",
                       network: tuple[str, str] | None = None) -> Iterator[Cluster]:
    """A master on ``host`` and ``workers`` workers, each worker (``isolated``) in its own
    mount namespace with a private /tmp and private ``hidden`` folders; with ``network``
    (a namespace and its address, ``private_network``) the workers run in that network
    namespace, at that address, and reach the master at ``host``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    home = spark_home()
    project = [str(project_root)] if project_root else []
    env = _env(project)
    port, ui = free_port(), free_port()
    spark_class = str(home / "bin" / "spark-class")
    procs: list[subprocess.Popen] = []
    try:
        log = log_dir / "master.log"
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", host,
             "--port", str(port), "--webui-port", str(ui)],
            env={**env, "SPARK_LOCAL_IP": host}, stdout=log.open("wb"),
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        procs.append(master)
        _wait_port(port, master, log, host=host)
        url = f"spark://{host}:{port}"
        worker_host = network[1] if network else "127.0.0.1"
        netns = ["ip", "netns", "exec", network[0]] if network else []
        keep = [Path(sys.prefix).resolve(), home, *(Path(p).resolve() for p in project)]
        script = _private_mounts_script([Path(h).resolve() for h in hidden], keep)
        worker_ports = []
        for i in range(workers):
            wport = free_port()
            log = log_dir / f"worker-{i + 1}.log"
            wrap = (["unshare", "-m", "--propagation", "private", "sh", "-c", script, "worker"]
                    if isolated else [])
            cmd = [*netns, *wrap, spark_class, "org.apache.spark.deploy.worker.Worker", url,
                   "--host", worker_host, "--port", str(wport), "--webui-port",
                   str(free_port()), "--cores", str(cores), "--memory", memory,
                   "--work-dir", "/tmp/spark-work"]
            procs.append(subprocess.Popen(cmd, env={**env, "SPARK_LOCAL_IP": worker_host},
                                          stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
            worker_ports.append((wport, procs[-1], log))
        for wport, proc, log in worker_ports:
            _wait_port(wport, proc, log, host=worker_host)
        _wait_registered(log_dir / "master.log", workers)
        yield Cluster(url, log_dir, procs, (host, ui))
    finally:
        _stop(procs)


def _wait_registered(master_log: Path, workers: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if master_log.read_text(errors="replace").count("Registering worker") >= workers:
            return
        time.sleep(0.3)
    raise RuntimeError(f"the workers did not register with the master; see {master_log}")


@contextmanager
def connect_server(log_dir: Path, *, master: str = "local[2]",
                   project_root: Path | None = None) -> Iterator[str]:
    """A Spark Connect server (the spark-connect jar that ships in pyspark), in the foreground
    of a child process; yields its ``sc://`` URL."""
    log_dir.mkdir(parents=True, exist_ok=True)
    home = spark_home()
    env = _env([str(project_root)] if project_root else [])
    port = free_port()
    log = log_dir / "connect-server.log"
    cmd = [str(home / "bin" / "spark-submit"), "--class", CONNECT_CLASS, "--name",
           "Spark Connect server", "--master", master,
           "--conf", f"spark.connect.grpc.binding.port={port}",
           "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
           "--conf", f"spark.executorEnv.PYTHONPATH={env['PYTHONPATH']}",
           "--conf", f"spark.pyspark.python={env['PYSPARK_PYTHON']}",
           "spark-internal"]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_port(port, proc, log, timeout=180)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop([proc])


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop each process group we started (the worker's executors and Python workers too)."""
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 15)
            except ProcessLookupError:
                continue
    for proc in reversed(procs):
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
