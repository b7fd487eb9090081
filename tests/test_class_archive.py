"""The driver JVM's class archive (``spark_backend/spark/class_archive.py``), for real, in a HOME
of its own: the first session starts a builder in the background and the archive lands; the
next session's JVM maps it; a damaged archive (cut short: a JVM dies of SIGBUS at its start
with it) is dropped and the session starts without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from spark_backend.spark import class_archive

ROOT = Path(__file__).resolve().parent.parent

SESSION = """
import json
from spark_backend.spark.session import spark_session
spark = spark_session("local[1]")
args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
print(json.dumps({"archive": [a for a in args.getInputArguments() if "SharedArchiveFile" in a],
                  "count": spark.range(0, 4, 1, 2).count()}))
"""


def _session(home: Path, log: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != class_archive.ENVVAR}
    env.update(HOME=str(home), CSI_SPARK_LOG=str(log), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", SESSION], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stderr == "", out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_session_builds_the_archive_and_the_next_maps_it(tmp_path):
    home = tmp_path / "home"
    jvm = home / ".cache" / "changestream-inspector" / "jvm"
    first = _session(home, tmp_path / "first.log")
    assert first == {"archive": [], "count": 4}
    deadline = time.monotonic() + 300
    priorities = set()
    while not list(jvm.glob("classes-*.jsa")) and time.monotonic() < deadline:
        assert not list(jvm.glob("*.failed")), (jvm / "builder.log").read_text()[-3000:]
        priorities |= _builders_priorities(home)
        time.sleep(1)
    # the builder's JVM and workers at nice 19, their autogroup too (at nice 10 in an autogroup
    # at nice 0, a first demo pull beside the builder took 41.1, 37.5 s against 34.3, 32.1)
    assert priorities == {(19, "nice 19" if _autogroups() else None)}, priorities
    (archive,) = jvm.glob("classes-*.jsa")
    assert not list(jvm.glob("*.building")) and not list(jvm.glob(".classes-*"))

    second = _session(home, tmp_path / "second.log")
    assert second == {"archive": [f"-XX:SharedArchiveFile={archive}"], "count": 4}
    said = (tmp_path / "second.log").read_text(errors="replace")
    assert "[cds" not in said, said[-2000:]  # mapped: the JVM says nothing of it

    whole = archive.read_bytes()
    archive.chmod(0o600)
    archive.write_bytes(whole[: len(whole) // 3])
    third = _session(home, tmp_path / "third.log")
    assert third == {"archive": [], "count": 4}
    assert not archive.exists() and archive.with_suffix(".failed").exists()
    # the crashed JVM's report is beside Spark's log, not in the folder the command ran in
    assert list(tmp_path.glob("hs_err_pid*.log")) and not list(ROOT.glob("hs_err_pid*.log"))


def _autogroups() -> bool:
    try:
        return Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


def _builders_priorities(home: Path) -> set:
    """(nice, autogroup's nice) of what the builder of ``home``'s archive started: its JVM and
    the JVM's Python workers (the builder itself lowers its priority first thing)."""
    found = set()
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes()
            if b"spark_backend.spark.class_archive" not in command or (
                    str(home).encode() not in command):
                continue
            pids = [task_child for task in (proc / "task").iterdir()
                    for task_child in (task / "children").read_text().split()]
            while pids:
                place = Path("/proc") / pids.pop()
                if b"spark_backend.spark.class_archive" in (place / "cmdline").read_bytes():
                    continue  # the builder, seen through the process that detached it
                nice = int((place / "stat").read_text().rsplit(")", 1)[1].split()[16])
                group = (place / "autogroup").read_text().split()
                found.add((nice, " ".join(group[-2:]) if _autogroups() else None))
                pids += [child for task in (place / "task").iterdir()
                         for child in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_no_archive_where_it_is_turned_off_or_the_users_options_replace_the_jvms(monkeypatch):
    monkeypatch.delenv(class_archive.ENVVAR, raising=False)
    assert class_archive.archive_for("-Xss4m", "") is not None
    assert class_archive.archive_for("-Xss4m", "") != class_archive.archive_for("-Xss8m", "")
    assert class_archive.archive_for("-Xss4m", "spark.driver.extraJavaOptions=-Xss2m") is None
    assert class_archive.archive_for("-Xss4m", "spark.driver.extraClassPath=/x.jar") is None
    monkeypatch.setenv(class_archive.ENVVAR, "off")
    assert class_archive.archive_for("-Xss4m", "") is None
