"""Where the dashboard may read files for an import: files uploaded through the page, and files
under the import folder named when the dashboard started (``$CSI_IMPORT_ROOT``); no other path
of the server. The one-click samples are the project's own files, named in ``app/samples.py``.
A cache file typed in the sidebar is opened only in the start-up cache's folder
(:func:`cache_choice`).

Each path typed in the page is resolved (relative to the import folder; symbolic links and
``..`` followed) and must lie under the resolved import folder, and so must every file found
under a folder given: a link inside the folder that leads out of it is refused too. A path
outside is refused before anything about it is looked at, so the answer is the same whether it
exists or not.
"""

from __future__ import annotations

import atexit
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Protocol

from app import private_temp
from spark_backend.jobs.files import scan_paths
from spark_backend.model.config import CACHE_ENVVAR, DEFAULT_CACHE
from spark_backend.model.errors import BadInput, InspectorError

IMPORT_ROOT_ENVVAR = "CSI_IMPORT_ROOT"
_CHUNK = 1 << 20  # bytes copied at a time from an upload to its temporary file
UPLOAD_PREFIX = "csi-upload-"  # + pid + "-": a folder of uploads being imported
_LIVE: set[Path] = set()  # this process's upload folders in use


class Upload(Protocol):
    """What an import needs of an uploaded file (``streamlit``'s ``UploadedFile`` is one)."""

    name: str

    def seek(self, offset: int, whence: int = 0) -> int: ...
    def read(self, size: int = -1) -> bytes: ...


def import_root() -> Path | None:
    """The import folder named at start-up, resolved; None when none was named."""
    raw = os.environ.get(IMPORT_ROOT_ENVVAR, "").strip()
    return Path(raw).resolve() if raw else None


def accepted() -> str:
    """What the page reads, as a phrase for its captions and refusals."""
    root = import_root()
    if root is None:
        return (f"uploaded files only (no import folder was named at start-up: "
                f"${IMPORT_ROOT_ENVVAR})")
    return f"uploaded files, or files and folders under the import folder {root}"


def refusal(shown: str, root: Path | None) -> str:
    """The one sentence for a path the page does not read."""
    if root is None:
        return (f"{shown} is not read: files of the server are read only under an import folder "
                f"named at start-up (${IMPORT_ROOT_ENVVAR}), and none was; upload the files "
                "instead.")
    return (f"{shown} is not under the import folder {root} (after following links and ..); "
            "give files or folders under it, or upload the files.")


def _under(root: Path, path: Path, shown: str) -> bool:
    """Whether ``path``, its links followed, is under ``root``; ``BadInput`` for a path that
    cannot be followed (a loop of links, a NUL byte), naming it as ``shown``."""
    try:
        return path.resolve().is_relative_to(root)
    except RuntimeError as e:  # Path.resolve's "Symlink loop"
        raise BadInput(f"{shown} is a loop of symbolic links ({e}); give the file itself, or "
                       "a link that ends at one.", field="paths") from e
    except (OSError, ValueError) as e:
        raise BadInput(f"{shown!r} cannot be followed to a file ({e}); give the path of a "
                       "file or folder.", field="paths") from e


def checked_paths(lines: Iterable[str]) -> list[str]:
    """The files to import for the paths typed in the page (one per item; relative ones are
    under the import folder): every file given or found under a folder given, resolved, each
    under the import folder. ``BadInput(field="paths")`` with one sentence for the first path
    that is not, before anything is read."""
    root = import_root()
    given = [line.strip() for line in lines if line.strip()]
    targets = []
    for line in given:
        target = root / line if root is not None else Path(line)
        if root is None or not _under(root, target, line):
            raise BadInput(refusal(line, root), field="paths")
        targets.append(target.resolve())
    if not targets:
        return []
    files, other = scan_paths([str(t) for t in targets])  # BadInput when a path is missing
    checked = []
    for path in files:
        if not _under(root, path, _shown(root, path)):
            raise BadInput(refusal(_shown(root, path), root), field="paths")
        checked.append(str(path.resolve()))
    # Not-regular entries (pipes, broken links, loops of links) go as given: the import
    # quarantines them with their reason. Each was listed in a folder, checked here.
    for path in (Path(where) for where, _ in other):
        if not _under(root, path.parent, _shown(root, path.parent)):
            raise BadInput(refusal(_shown(root, path), root), field="paths")
        checked.append(str(path))
    return checked


def _shown(root: Path, path: Path) -> str:
    """A path found under a folder, as the user knows it (relative to the import folder)."""
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


@contextmanager
def uploads_on_disk(uploads: Iterable[Upload]) -> Iterator[list[str]]:
    """The uploaded files copied (a chunk at a time) into a private temporary folder (mode 0700,
    one subfolder per upload, each under its own base name); yields their paths and removes the
    folder when the block ends, however it ends, or at the latest when the process exits (or,
    killed, at the next upload of any dashboard process)."""
    uploads = list(uploads)
    if not uploads:
        yield []
        return
    folder = private_temp.make(UPLOAD_PREFIX)
    _LIVE.add(folder)
    try:
        paths = []
        for i, upload in enumerate(uploads):
            place = folder / str(i)
            place.mkdir()
            target = place / _file_name(upload.name)
            try:
                upload.seek(0)
                with open(target, "xb") as out:
                    _copy(upload, out)
            except OSError as e:
                raise InspectorError(f"Could not keep the upload {upload.name} on this machine "
                                     f"({e.strerror or e}); nothing was imported.") from e
            paths.append(str(target))
        yield paths
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        _LIVE.discard(folder)


def _remove_live() -> None:
    """At exit: the folders of imports still running (a server stopped in the middle)."""
    for folder in list(_LIVE):
        shutil.rmtree(folder, ignore_errors=True)


atexit.register(_remove_live)


def _copy(source: Upload, out: IO[bytes]) -> None:
    while chunk := source.read(_CHUNK):
        out.write(chunk)


def _file_name(name: str) -> str:
    """An upload's name as a file name of its own folder: its base name, never hidden or empty
    (the suffix is kept: formats read ``.gz`` and ``.avro`` by it)."""
    base = Path(name.replace("\\", "/")).name.lstrip(".")
    return base or "upload"


# --- the cache file typed in the sidebar ---------------------------------------------------------


def startup_cache() -> Path:
    """The cache the dashboard started with: ``$CSI_CACHE``, else the default."""
    return Path(os.environ.get(CACHE_ENVVAR) or DEFAULT_CACHE)


def cache_choice(typed: str, current: str) -> tuple[str, str | None]:
    """The cache file to open for what was typed in the sidebar, and the sentence when it is
    refused (then the ``current`` one stays). Accepted: ``current``, and files in the start-up
    cache's folder or below it, relative ones there too. Opening creates a missing file (and
    its folders): a path elsewhere would let a browser write wherever the server may."""
    typed = typed.strip()
    if not typed or typed == current:
        return current, None
    folder = startup_cache().resolve().parent
    target = folder / typed
    try:
        if _under(folder, target, typed):
            return str(target.resolve()), None
    except BadInput as e:
        return current, f"{e} Still showing {current}."
    return current, (f"{typed} is not opened: cache files are opened only in the start-up "
                     f"cache's folder {folder} (${CACHE_ENVVAR} names the start-up cache); "
                     f"still showing {current}.")
