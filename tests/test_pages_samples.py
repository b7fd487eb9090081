"""Every page under AppTest on every sample of the Sources page, imported as its button does
(``app.samples.load``, through Spark): no page raises or shows an error box, the Overview's
tiles agree with its headline; and the analysis side (``report``, ``history``, the HTML report)
of the CockroachDB sample whose messages carry no times."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from app import resources, samples
from spark_backend import analysis
from spark_backend.analysis.html_report import build_html
from spark_backend.cache.store import Cache
from tests.test_pages_streams import PAGES, analysed, app, clean, plain

pytestmark = pytest.mark.slow

KEYS = [s.key for s in samples.SAMPLES]


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("samples") / "samples.duckdb")
    with Cache(path) as cache:
        for sample in samples.SAMPLES:
            outcome = samples.load(cache, sample)
            assert outcome.ok, outcome.message
    return path


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("key", KEYS)
def test_every_page_shows_every_sample(cache_path, key, page):
    at = app(cache_path, page, stream=samples.by_key(key).stream)
    clean(at)
    assert at.title


@pytest.mark.parametrize("key", KEYS)
def test_overview_of_a_sample_agrees_with_its_headline(cache_path, key):
    stream = samples.by_key(key).stream
    at = app(cache_path, stream=stream)
    clean(at)
    truth = analysed(cache_path, stream)
    metrics = {m.label: m.value for m in at.metric}
    shown = [plain(m.value) for m in at.markdown]
    assert metrics["Partitions"] == f"{len(truth['parts']):,}"
    anomalies = int(metrics["Anomalies"].replace(",", ""))
    if any("Worst stall" in m for m in shown):
        assert anomalies >= 1
    if not truth["heartbeats"]:  # Datastream, CockroachDB without resolved timestamps
        assert not any("Worst stall" in m or m.startswith("#### No stall") for m in shown)
        assert any(m.startswith(("**Freshness:**", "**No times:**")) for m in shown), shown


def test_datastream_has_freshness_not_stalls(cache_path):
    """An hour between two Datastream events is no stall: Datastream sends no heartbeats."""
    stream = samples.by_key("sample_datastream_mysql").stream
    for page in ("overview", "watermarks"):
        at = app(cache_path, page, stream=stream)
        clean(at)
        shown = " ".join(plain(m.value) for m in at.markdown)
        assert "Freshness:" in shown and "sends no heartbeats" in shown
        assert "Worst stall" not in shown


def test_untimed_cockroachdb_sample_in_report_history_and_html(cache_path):
    stream = samples.by_key("sample_cockroachdb_diff").stream
    con = resources.open_cache(cache_path).cursor()
    try:
        report = analysis.build_report(con, stream)
        history = analysis.history(con, stream, "rides")
        html = build_html(con, stream)
    finally:
        con.close()
    assert report["range"] == {"start": None, "end": None}
    assert [p["start"] for p in report["partitions"]] == [None]
    assert len(history) == 1 and history["commit_ns"].isna().all()
    assert "carry no commit times" in html and "no times (the source sent none)" in html
