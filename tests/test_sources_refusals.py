"""The Sources page reads files only where the user said: uploads, and files under the import
folder named at start-up (``$CSI_IMPORT_ROOT``). Any other path (``/etc/passwd``, a ``..``
escape, a symbolic link out of the folder, any path when no folder was named) is one sentence
next to the paths field; nothing is imported and the cache (its quarantine too) is untouched.
No test here gets as far as Spark: a refusal comes before any file is read."""

from __future__ import annotations

import io
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import import_roots
from spark_backend.cache.store import Cache
from spark_backend.model.errors import BadInput

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
SAMPLE = ROOT / "fixtures" / "samples" / "cockroachdb" / "wrapped_diff.ndjson"
TABLES = ("streams", "pulls", "data_change_records", "mods", "heartbeats", "quarantine",
          "imports", "meta")


@pytest.fixture(scope="module")
def cache(tmp_path_factory, landed_caches) -> str:
    return landed_caches.copy(tmp_path_factory.mktemp("src") / "cache.duckdb", 7, 0.1)


@pytest.fixture
def tree(tmp_path) -> dict[str, Path]:
    """An import folder, a valid file beside it (outside), and links from inside to it."""
    root, outside = tmp_path / "imports", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    secret = outside / "secret.ndjson"
    secret.write_bytes(SAMPLE.read_bytes())  # valid records: an import of it would land them
    (root / "inside.ndjson").write_bytes(SAMPLE.read_bytes())
    (root / "link.ndjson").symlink_to(secret)
    (root / "sub" / "fine.ndjson").write_bytes(SAMPLE.read_bytes())
    (root / "sub" / "deep_link.ndjson").symlink_to(secret)
    return {"root": root, "secret": secret}


def counts(path: str) -> dict[str, int]:
    with Cache(path) as c:
        return {t: c.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def plain(text: str) -> str:
    """Markdown as the reader sees it: the pages backslash-escape every value they show."""
    return re.sub(r"\\(.)", r"\1", text).replace("\u200b", "")


def sources(cache: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = cache
    at.run()
    at.switch_page("../pages/sources.py").run()
    at.radio(key="src_source").set_value("files").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def import_paths(at: AppTest, paths: str, fmt: str = "cockroachdb") -> AppTest:
    at.selectbox(key="src_format").set_value(fmt)
    at.text_input(key="src_stream").set_value("Stolen")
    at.text_area(key="src_paths").set_value(paths)
    at.button(key="src_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def next_to_paths(at: AppTest) -> list[str]:
    """The error messages drawn right after the paths field."""
    for col in at.columns:
        kids = list(col.children.values())
        keys = [getattr(k, "key", None) for k in kids]
        if "src_paths" in keys:
            after = kids[keys.index("src_paths") + 1:]
            return [plain(k.value) for k in after if type(k).__name__ == "Error"]
    raise AssertionError("no paths field")


CASES = {
    # name: (the paths typed, relative to the tree; the words the one sentence starts with)
    "etc-passwd": ("/etc/passwd", "/etc/passwd is not under the import folder"),
    "etc-shadow": ("/etc/shadow", "/etc/shadow is not under the import folder"),
    "dotdot": ("../outside/secret.ndjson", "../outside/secret.ndjson is not under the import"),
    "dotdot-inside": ("sub/../../outside/secret.ndjson", "sub/../../outside/secret.ndjson is"),
    "absolute-outside": ("{secret}", "{secret} is not under the import folder"),
    "link-out": ("link.ndjson", "link.ndjson is not under the import folder"),
    "folder-holding-a-link-out": ("sub", "sub/deep_link.ndjson is not under the import folder"),
    "one-bad-line-of-two": ("inside.ndjson\n/etc/passwd", "/etc/passwd is not under the"),
    "missing-outside": ("/etc/no-such-file", "/etc/no-such-file is not under the import folder"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_path_outside_the_import_folder_is_one_sentence(cache, tree, monkeypatch, case):
    monkeypatch.setenv(import_roots.IMPORT_ROOT_ENVVAR, str(tree["root"]))
    typed, words = (s.format(secret=tree["secret"]) for s in CASES[case])
    before = counts(cache)
    at = import_paths(sources(cache), typed)
    errors = [plain(e.value) for e in at.error]
    assert len(errors) == 1, errors
    assert errors[0].startswith(words), errors
    assert errors[0].endswith(f"{tree['root'].resolve()} (after following links and ..); give "
                              "files or folders under it, or upload the files."), errors
    assert next_to_paths(at) == errors
    assert not at.success
    assert counts(cache) == before


def test_without_an_import_folder_no_path_is_read(cache, monkeypatch):
    monkeypatch.delenv(import_roots.IMPORT_ROOT_ENVVAR, raising=False)
    before = counts(cache)
    at = sources(cache)
    assert "This page reads uploaded files only (no import folder was named at start-up: " \
           "$CSI_IMPORT_ROOT)." in [plain(c.value) for c in at.caption]
    at = import_paths(at, str(SAMPLE))  # the project's own sample: still not through this field
    errors = [plain(e.value) for e in at.error]
    assert errors == [f"{SAMPLE} is not read: files of the server are read only under an import "
                      "folder named at start-up ($CSI_IMPORT_ROOT), and none was; upload the "
                      "files instead."]
    assert next_to_paths(at) == errors
    assert counts(cache) == before


def test_nothing_given_says_what_is_accepted(cache, tree, monkeypatch):
    monkeypatch.setenv(import_roots.IMPORT_ROOT_ENVVAR, str(tree["root"]))
    before = counts(cache)
    at = import_paths(sources(cache), "  \n ")
    assert [plain(e.value) for e in at.error] == [
        "Nothing to import: the page reads uploaded files, or files and folders under the "
        f"import folder {tree['root'].resolve()}."]
    assert counts(cache) == before


# --- the rule itself, without the page -------------------------------------------------------


def test_paths_under_the_folder_are_resolved_and_expanded(tree, monkeypatch):
    monkeypatch.setenv(import_roots.IMPORT_ROOT_ENVVAR, str(tree["root"]))
    root = tree["root"].resolve()
    assert import_roots.checked_paths(["inside.ndjson", "", f"{root}/sub/fine.ndjson"]) == [
        str(root / "inside.ndjson"), str(root / "sub" / "fine.ndjson")]
    (tree["root"] / "sub" / "deep_link.ndjson").unlink()
    (tree["root"] / "sub" / "near_link.ndjson").symlink_to(root / "inside.ndjson")
    # a link that stays inside is read as its target; a folder gives its files
    assert import_roots.checked_paths(["sub"]) == [str(root / "sub" / "fine.ndjson"),
                                                   str(root / "inside.ndjson")]
    with pytest.raises(BadInput, match="does not exist") as missing:
        import_roots.checked_paths(["nope.ndjson"])
    assert missing.value.field == "paths"
    with pytest.raises(BadInput, match="cannot be followed to a file"):
        import_roots.checked_paths(["a\x00b"])


def test_a_loop_of_links_is_named_as_one(tree, monkeypatch):
    monkeypatch.setenv(import_roots.IMPORT_ROOT_ENVVAR, str(tree["root"]))
    root = tree["root"].resolve()
    (root / "loops").mkdir()
    (root / "loops" / "a.ndjson").symlink_to(root / "loops" / "b.ndjson")
    (root / "loops" / "b.ndjson").symlink_to(root / "loops" / "a.ndjson")
    (root / "loops" / "fine.ndjson").write_text("{}\n")
    with pytest.raises(BadInput, match=r"^loops/a.ndjson is a loop of symbolic links") as loop:
        import_roots.checked_paths(["loops/a.ndjson"])
    assert loop.value.field == "paths" and "not under" not in str(loop.value)
    # found in a folder, a loop goes as it is, for the import to quarantine with its reason
    assert import_roots.checked_paths(["loops"]) == [
        str(root / "loops" / "fine.ndjson"), str(root / "loops" / "a.ndjson"),
        str(root / "loops" / "b.ndjson")]


def test_uploads_live_in_a_private_folder_only_while_used(tmp_path):
    class Named(io.BytesIO):
        def __init__(self, name: str, data: bytes):
            super().__init__(data)
            self.name = name

    uploads = [Named("../../etc/evil.jsonl", b"a" * (3 << 20)), Named(".hidden", b"b"),
               Named("evil.jsonl", b"c")]
    uploads[0].read(10)  # a reader that moved on: the copy starts at the beginning anyway
    with import_roots.uploads_on_disk(uploads) as paths:
        folder = Path(paths[0]).parent.parent
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert [Path(p).relative_to(folder).as_posix() for p in paths] == [
            "0/evil.jsonl", "1/hidden", "2/evil.jsonl"]
        assert [Path(p).read_bytes() for p in paths] == [b"a" * (3 << 20), b"b", b"c"]
    assert not folder.exists()
    with pytest.raises(RuntimeError), import_roots.uploads_on_disk(uploads[1:]) as paths:
        folder = Path(paths[0]).parent.parent
        raise RuntimeError("the import failed")
    assert not folder.exists()
    with import_roots.uploads_on_disk([]) as none:
        assert none == []


def test_upload_folders_of_a_killed_process_are_removed_by_the_next_upload(tmp_path):
    import subprocess
    import sys
    import tempfile

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    orphan = Path(tempfile.gettempdir()) / f"csi-upload-{int(gone.stdout)}-test"
    (orphan / "0").mkdir(parents=True)
    (orphan / "0" / "left.jsonl").write_bytes(b"{}")
    mine = Path(tempfile.mkdtemp(prefix=f"csi-upload-{os.getpid()}-"))  # alive: kept
    try:
        upload = io.BytesIO(b"x")
        upload.name = "x.jsonl"
        with import_roots.uploads_on_disk([upload]) as paths:
            assert Path(paths[0]).parent.parent.name.startswith(f"csi-upload-{os.getpid()}-")
            assert not orphan.exists()
            assert mine.is_dir()
    finally:
        shutil.rmtree(orphan, ignore_errors=True)
        shutil.rmtree(mine, ignore_errors=True)


# --- the cache file typed in the sidebar: only in the start-up cache's folder ------------------


def test_a_typed_cache_path_opens_only_in_the_start_up_cache_folder(tmp_path, monkeypatch):
    caches, elsewhere = tmp_path / "caches", tmp_path / "elsewhere"
    caches.mkdir()
    elsewhere.mkdir()
    (caches / "away.duckdb").symlink_to(elsewhere / "x.duckdb")
    monkeypatch.setenv("CSI_CACHE", str(caches / "main.duckdb"))
    current = str(caches.resolve() / "main.duckdb")
    folder = caches.resolve()
    assert import_roots.cache_choice("", current) == (current, None)
    assert import_roots.cache_choice(f" {current} ", current) == (current, None)
    assert import_roots.cache_choice("other.duckdb", current) == (
        str(folder / "other.duckdb"), None)
    assert import_roots.cache_choice(f"{folder}/team/b.duckdb", current) == (
        str(folder / "team" / "b.duckdb"), None)
    for typed in ("/etc/passwd", "../elsewhere/new.duckdb", str(elsewhere / "new.duckdb"),
                  "away.duckdb"):
        assert import_roots.cache_choice(typed, current) == (current, (
            f"{typed} is not opened: cache files are opened only in the start-up cache's "
            f"folder {folder} ($CSI_CACHE names the start-up cache); still showing "
            f"{current}.")), typed
    assert import_roots.cache_choice("/tmp/x\x00.duckdb", current) == (current, (
        "'/tmp/x\\x00.duckdb' cannot be followed to a file (embedded null byte); give the "
        f"path of a file or folder. Still showing {current}."))
    assert list(elsewhere.iterdir()) == []  # nothing was created there
    monkeypatch.delenv("CSI_CACHE")
    assert import_roots.cache_choice("b.duckdb", current) == (
        str(Path.home().resolve() / ".cache" / "changestream-inspector" / "b.duckdb"), None)


def test_the_sidebar_refuses_a_cache_path_outside_and_creates_nothing(tmp_path, monkeypatch,
                                                                      landed_caches):
    caches, elsewhere = tmp_path / "caches", tmp_path / "elsewhere"
    caches.mkdir()
    elsewhere.mkdir()
    start = caches / "main.duckdb"
    landed_caches.copy(start, 7, 0.1)
    monkeypatch.setenv("CSI_CACHE", str(start))
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    for typed in (str(elsewhere / "new.duckdb"), "/etc/passwd"):
        at.sidebar.text_input(key="cache_path_input").set_value(typed).run()
        assert not at.exception, [e.value for e in at.exception]
        errors = [plain(e.value) for e in at.sidebar.error]
        assert any(f"{typed} is not opened" in e for e in errors), errors
        assert at.session_state["cache_path"] == str(start)
    assert list(elsewhere.iterdir()) == []  # the refused path was never opened (nor created)
