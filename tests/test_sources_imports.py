"""The Sources page's imports that are allowed land their records through the real import
(Spark local[*]): a file under the import folder named at start-up, and an uploaded file, whose
private temporary copy is gone once the import is over."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import import_roots
from spark_backend.cache.store import Cache

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
SAMPLE = ROOT / "fixtures" / "samples" / "datastream" / "mysql_events.jsonl"


def plain(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text).replace("\u200b", "")


def sources(cache: str) -> AppTest:
    """The Sources page on an empty cache whose first-minute demo pull is skipped."""
    at = AppTest.from_file(MAIN, default_timeout=300)
    at.session_state["cache_path"] = cache
    at.session_state["bootstrapped"] = True
    at.run()
    at.switch_page("../pages/sources.py").run()
    at.radio(key="src_source").set_value("files").run()
    at.selectbox(key="src_format").set_value("datastream").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def landed(cache: str, stream: str) -> tuple[int, int]:
    """(data change records, quarantined lines) of ``stream``."""
    with Cache(cache) as c:
        return c.con.execute(
            "SELECT (SELECT count(*) FROM data_change_records WHERE stream = $s),"
            " (SELECT count(*) FROM quarantine WHERE stream = $s)", {"s": stream}).fetchone()


def expected() -> tuple[int, str]:
    """(records, the import's sentence after "records into S from 1 file") of the sample: one
    record per event ``uuid``; a uuid delivered again is a duplicate copy."""
    uuids = [json.loads(line)["uuid"] for line in SAMPLE.read_text().splitlines() if line]
    copies = len(uuids) - len(set(uuids))
    assert copies == 1  # the sample shows a redelivery
    return len(set(uuids)), ("(0 already imported, 1 duplicate copy, 0 bad lines "
                             "quarantined).")


def uploads_left() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("csi-upload-*")}


def test_a_file_under_the_import_folder_lands(tmp_path, monkeypatch):
    folder = tmp_path / "imports" / "datastream"
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_bytes(SAMPLE.read_bytes())
    monkeypatch.setenv(import_roots.IMPORT_ROOT_ENVVAR, str(tmp_path / "imports"))
    cache = str(tmp_path / "c.duckdb")
    at = sources(cache)
    at.text_input(key="src_stream").set_value("FromRoot")
    at.text_area(key="src_paths").set_value("datastream/events.jsonl")
    at.button(key="src_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    records, tail = expected()
    assert landed(cache, "FromRoot") == (records, 0)
    said = [plain(s.value) for s in at.success]
    assert said == [f"Imported {records} records into FromRoot from 1 file {tail}"], said


def test_an_upload_lands_and_its_copy_is_removed(tmp_path, monkeypatch):
    monkeypatch.delenv(import_roots.IMPORT_ROOT_ENVVAR, raising=False)  # uploads need none
    cache = str(tmp_path / "c.duckdb")
    before = uploads_left()
    at = sources(cache)
    at.text_input(key="src_stream").set_value("Uploaded")
    at.file_uploader[0].upload("mysql events.jsonl", SAMPLE.read_bytes(), "application/json")
    at.run()
    at.button(key="src_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    records, tail = expected()
    assert landed(cache, "Uploaded") == (records, 0)
    said = [plain(s.value) for s in at.success]
    assert said == [f"Imported {records} records into Uploaded from 1 file {tail}"], said
    assert uploads_left() == before
    # The uploader is empty again: the next Import has nothing to read and says what it takes.
    assert at.file_uploader[0].value in (None, [])
    at.button(key="src_go").click().run()
    assert [plain(e.value) for e in at.error] == [
        "Nothing to import: the page reads uploaded files only (no import folder was named at "
        "start-up: $CSI_IMPORT_ROOT)."]
