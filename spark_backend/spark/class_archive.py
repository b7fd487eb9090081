"""Spark's classes kept ready for the next driver JVM: a class-data-sharing archive (CDS).

A local driver JVM spends most of its start loading and verifying Spark's classes, and its
first job more of them. The JVM can write what it loaded to an archive when it exits
(``-XX:ArchiveClassesAtExit``) and map that archive at its next start
(``-XX:SharedArchiveFile``). Measured here (2 cores, JDK 17): the session 10.8 -> 6.7 s and a
first ``mapInArrow`` job 7.8 -> 4.8 s (medians of three), a demo pull from the command line
36.5 -> 30.3 s.

Writing the archive makes a JVM slower (its run +10 s, its exit +23 s), so no user's command
pays it: the first classic session that finds no archive starts one builder in the background
(``python -m spark_backend.spark.class_archive``, detached, at nice 19, its autogroup too), which
runs a local session and the first job of a pull, exits its JVM and moves the archive into place.
Later sessions map it. One archive per JDK, Spark and JVM options (``_key``, ~150 MB); one
unused for a week is removed when another lands, and a builder that failed is not tried again
for a day. ``$CSI_SPARK_CLASS_ARCHIVE=off`` turns it off. An archive the JVM cannot use
(another JDK at that path, a damaged file) is ignored by the JVM with a line in Spark's log.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ENVVAR = "CSI_SPARK_CLASS_ARCHIVE"
_BUILD_TIMEOUT_S = 600  # a builder's lock older than this is a builder that died
_RETRY_AFTER_S = 86_400  # a builder that failed is tried again after a day
_UNUSED_S = 7 * 86_400   # an archive unused for a week goes when another lands


def folder() -> Path:
    """Where the archives are kept: beside the tool's logs, not beside any one cache."""
    return Path.home() / ".cache" / "changestream-inspector" / "jvm"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    return os.path.realpath(java) if java else ""


def _key(java_options: str) -> str:
    """What an archive is good for: the JVM that runs it, Spark's jars and the JVM's options."""
    import pyspark

    java = _java()
    jars = Path(pyspark.__file__).parent / "jars"
    h = hashlib.sha256()
    for part in (java, str(os.stat(java).st_mtime_ns) if java else "", pyspark.__version__,
                 *sorted(p.name for p in jars.glob("*.jar")), java_options):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def archive_for(java_options: str, spark_conf: str) -> Path | None:
    """The archive's path for a driver JVM of these options (it may not exist yet), or None
    where none can be used: turned off, the user's own JVM options or class path
    (``spark_conf``: ``$CSI_SPARK_CONF``), a folder whose path has a space (Spark splits the
    options at spaces)."""
    if os.environ.get(ENVVAR, "").lower() in ("off", "0", "false", "no"):
        return None
    if "spark.driver.extraJavaOptions" in spark_conf or "spark.driver.extraClassPath" in spark_conf:
        return None
    place = folder()
    if " " in str(place):
        return None
    try:
        return place / f"classes-{_key(java_options)}.jsa"
    except (OSError, ImportError):
        return None


def option(archive: Path | None) -> str:
    """The JVM option that maps ``archive`` (marked as used), or "" when there is none yet."""
    if archive is None or not archive.is_file():
        return ""
    with contextlib.suppress(OSError):
        os.utime(archive)  # last used: archives unused for a week are removed
    return f"-XX:SharedArchiveFile={archive}"


def build_later(archive: Path | None, java_options: str) -> None:
    """After a session of these options started without ``archive``: one builder in the
    background, unless one is at work or one failed for these options in the last day."""
    if archive is None or archive.is_file():
        return
    failed = archive.with_suffix(".failed")
    with contextlib.suppress(OSError):
        if time.time() - failed.stat().st_mtime < _RETRY_AFTER_S:
            return
    _start_builder(archive, java_options)


def _start_builder(archive: Path, java_options: str) -> None:
    lock = archive.with_suffix(".building")
    try:
        archive.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if lock.exists() and time.time() - lock.stat().st_mtime > _BUILD_TIMEOUT_S:
            lock.unlink(missing_ok=True)
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:  # a builder is at work, or the folder cannot be written: not this time
        return
    os.close(fd)
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_REMOTE", "CSI_SPARK_MASTER", "CSI_SPARK_LOG")}
    env[ENVVAR] = "off"  # the builder's own session neither maps an archive nor builds one
    command = [sys.executable, "-m", "spark_backend.spark.class_archive", str(archive),
               java_options]
    try:
        with open(archive.parent / "builder.log", "ab") as log:
            # Through a Python that exits at once: the builder is nobody's child (a command
            # that lists its own processes, or waits for them, does not meet it).
            subprocess.run([sys.executable, "-c", _DETACH, *command], env=env,
                           stdin=subprocess.DEVNULL, stdout=log, stderr=log, timeout=30,
                           check=True)
    except (OSError, subprocess.SubprocessError):
        lock.unlink(missing_ok=True)


_DETACH = ("import subprocess, sys; subprocess.Popen(sys.argv[1:], start_new_session=True, "
           "stdin=subprocess.DEVNULL, close_fds=True)")


def build(archive: Path, java_options: str) -> None:
    """Run a local session and the first job of a pull in a JVM that writes its classes at
    exit, then move the archive into place (and remove archives of other keys)."""
    _yield_the_cpu()
    lock = archive.with_suffix(".building")
    written = archive.with_name(f".{archive.name}.{os.getpid()}")
    os.environ["CSI_SPARK_DRIVER_JAVA_OPTIONS"] = (
        f"{java_options} -XX:ArchiveClassesAtExit={written}")
    try:
        from spark_backend.spark.session import spark_session, warm_up

        spark = spark_session("local[1]")
        warm_up(spark)
        gateway = spark.sparkContext._gateway
        classpath = gateway.jvm.System.getProperty("java.class.path")
        spark.stop()
        with contextlib.suppress(Exception):  # the JVM leaves without an answer
            gateway.jvm.System.exit(0)
        gateway.proc.wait(timeout=_BUILD_TIMEOUT_S)
        _check(written, classpath)
        os.replace(written, archive)
        for other in archive.parent.glob("classes-*.jsa"):
            if other != archive and time.time() - other.stat().st_mtime > _UNUSED_S:
                other.unlink(missing_ok=True)
    except BaseException:
        archive.with_suffix(".failed").touch()
        raise
    finally:
        written.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


def _yield_the_cpu() -> None:
    """The builder (and the JVM and Python workers it starts, which inherit this) runs only on
    CPU nobody else wants: nice 19, and so is its autogroup. The builder leads a session of its
    own, and where the kernel groups each session's processes (``sched_autogroup_enabled``,
    on here) CPU is first shared between the groups by the group's nice: the process's own
    nice alone left it an equal share beside the user's pull.
    A first ``pull --source demo`` in a new HOME (the builder at work beside it): 41.1, 37.5 s
    at nice 10 alone, 34.3, 32.1 s now (alternating, stop 60)."""
    with contextlib.suppress(OSError):
        os.nice(19 - os.nice(0))
    with contextlib.suppress(OSError), open("/proc/self/autogroup", "w") as group:
        group.write("19")


def _check(written: Path, classpath: str) -> None:
    """The archive maps whole in a JVM of Spark's class path (``-Xshare:on`` fails otherwise):
    one cut short (a full disk) made such a JVM die of SIGBUS at its start."""
    if not written.is_file() or written.stat().st_size == 0:
        raise RuntimeError(f"the JVM wrote no archive at {written}")
    mapped = subprocess.run(
        [_java() or "java", "-Xshare:on", f"-XX:SharedArchiveFile={written}",
         "-XX:ErrorFile=/dev/null", "-cp", classpath, "-version"],
        capture_output=True, text=True, timeout=120)
    if mapped.returncode != 0:
        raise RuntimeError(f"the archive {written} does not load (exit {mapped.returncode}): "
                           f"{mapped.stdout[-500:]}{mapped.stderr[-500:]}")


def discard(archive: Path) -> None:
    """An archive a driver JVM could not start with: gone, and not built again for a day."""
    archive.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        archive.with_suffix(".failed").touch()


if __name__ == "__main__":
    build(Path(sys.argv[1]), sys.argv[2])
