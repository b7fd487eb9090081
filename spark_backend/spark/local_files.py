"""Files on the driver's machine, read by executors that cannot see its disk.

On ``local[*]`` the executors are threads and processes of the driver's machine and read the
files where they are. Anywhere else (a ``spark://`` master, YARN, Kubernetes, Spark Connect)
every file to read travels through Spark itself:

- classic Spark: ``SparkContext.addFile``. The driver's file server serves the file; each
  executor fetches it into its own work folder, where ``SparkFiles.get`` finds it. Spark keeps
  every added file for the life of the context and an executor started later fetches all of
  them again, so what is handed to ``addFile`` must stay as it is while the session lives: a
  hard link (a copy across file systems) in a folder of this process, removed when it exits.
- Spark Connect: ``spark.addArtifacts(..., file=True)`` uploads the file to the server, which
  keeps it for the session and serves it to its executors the same way; the client keeps
  nothing.

Spark names an added file by its base name alone, so each file travels under a name made of
its SHA-256 and its base name: two files called alike never collide, and a file changed since
an earlier import is a new name (an executor never reads a stale copy).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator

from spark_backend.spark.remote import is_remote

_lock = threading.Lock()
_kept: str | None = None     # this process's folder of links handed to SparkContext.addFile
_shipped: set[tuple[int, str]] = set()  # (session, name) already sent


def needs_shipping(spark) -> bool:
    """Whether executors of ``spark`` may not see the driver's files (anything but local)."""
    if is_remote(spark):
        return True
    return not spark.sparkContext.master.startswith("local")


def shipped_name(path: str, digest: str) -> str:
    """The name a file travels under: unique per content, ending in its own base name."""
    return f"{digest[:32]}-{os.path.basename(path)}"


def ship(spark, files: dict[str, str]) -> dict[str, str]:
    """Send ``{path: sha256}`` to the executors of ``spark``; returns ``{path: name}`` for
    :func:`executor_path`. Nothing is sent (an empty dict) on a local master."""
    if not needs_shipping(spark):
        return {}
    names = {path: shipped_name(path, digest) for path, digest in files.items()}
    todo = {p: n for p, n in names.items() if (id(spark), n) not in _shipped}
    if todo:
        if is_remote(spark):
            _upload(spark, todo)
        else:
            _add_files(spark, todo)
    return names


def _upload(spark, todo: dict[str, str]) -> None:
    """Spark Connect: the server keeps the uploads; links here only name them."""
    folder = tempfile.mkdtemp(prefix="csi-upload-")
    try:
        links = []
        for path, name in todo.items():
            link = os.path.join(folder, name)
            os.symlink(path, link)
            links.append(link)
        spark.addArtifacts(*links, file=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _shipped.update((id(spark), n) for n in todo.values())


def _add_files(spark, todo: dict[str, str]) -> None:
    sc = spark.sparkContext
    folder = _kept_folder()
    for path, name in todo.items():
        kept = os.path.join(folder, name)
        if not os.path.exists(kept):
            try:
                os.link(path, kept)
            except OSError:  # another file system, or links not allowed: a copy
                shutil.copyfile(path, kept)
        sc.addFile(kept)
        _shipped.add((id(spark), name))


def _kept_folder() -> str:
    global _kept
    with _lock:
        if _kept is None:
            _kept = tempfile.mkdtemp(prefix="csi-shipped-")
            atexit.register(shutil.rmtree, _kept, True)
        return _kept


@contextlib.contextmanager
def executor_path(path: str, name: str | None) -> Iterator[str]:
    """On an executor: where to read the driver's ``path`` (shipped as ``name``; None: read in
    place). A shipped file is read through a link bearing its own base name, because formats
    take meaning from it (a changefeed file's topic, ``.avro``); the link lives in the
    executor's own temporary folder, for the read only."""
    if not name:
        yield path
        return
    from pyspark import SparkFiles

    local = SparkFiles.get(name)
    folder = tempfile.mkdtemp(prefix="csi-read-")
    try:
        link = os.path.join(folder, os.path.basename(path))
        os.symlink(local, link)
        yield link
    finally:
        shutil.rmtree(folder, ignore_errors=True)
