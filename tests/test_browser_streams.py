"""Every page in Debian's chromium (1440x900) on every kind of stream the product lands: the
demo world, a MUTABLE_KEY_RANGE stream, a CockroachDB changefeed whose messages carry no times,
and every sample of the Sources page imported as its button does (``app.samples.load``).

Each page is opened by its address and checked once its script has finished
(``data-test-script-state``) and its charts have drawn: no exception, no error box, no error
in the browser's console, every chart carries marks, the DAG draws a bar per partition, and the
Overview's Partitions tile equals the analysis of the same cache.
"""

from __future__ import annotations

import re

import pytest

from app import samples
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED, demo_world
from tests.test_browser import PAGES, SHOTS, _visit, page, server  # noqa: F401  (fixtures)
from tests.test_pages_streams import MUTABLE, UNTIMED, _land_mutable, _land_untimed

pytestmark = [pytest.mark.slow, pytest.mark.browser]

STREAMS = ("DemoStream", MUTABLE, UNTIMED, *(s.stream for s in samples.SAMPLES))
PARTITIONS: dict[str, int] = {}

# Bar paths of the first chart (the DAG's partitions).
_BARS_JS = """() => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  return gd ? gd.querySelectorAll('.barlayer .bars path').length : 0;
}"""


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory, landed_caches) -> str:
    from spark_backend import analysis
    from spark_backend.cache.store import Cache

    path = landed_caches.copy(tmp_path_factory.mktemp("browser-streams") / "streams.duckdb",
                              DEMO_SEED, DEMO_SCALE)
    with Cache(path) as cache:
        from spark_backend.demo.world import MUTABLE_KEY_RANGE

        _land_mutable(cache, demo_world(DEMO_SEED, 0.3, MUTABLE_KEY_RANGE), MUTABLE)
        _land_untimed(cache, UNTIMED)
        for sample in samples.SAMPLES:
            outcome = samples.load(cache, sample)
            assert outcome.ok, outcome.message
        for stream in STREAMS:
            PARTITIONS[stream] = len(analysis.partitions(cache.con, stream))
    return path


@pytest.mark.parametrize("stream", STREAMS)
def test_every_page_draws_every_stream(page, server, stream):  # noqa: F811
    console: list[str] = []
    def heard(m) -> None:
        url = m.location.get("url") or ""
        # Streamlit's client first looks for its server under the page's own path
        # (/<page>/_stcore/health, .../host-config), then at the root: those 404s are its probe.
        if m.type == "error" and not re.search(r"/[^/]+/_stcore/(health|host-config)", url):
            console.append(f"{m.text} ({url})")

    page.on("console", heard)
    page.on("pageerror", lambda e: console.append(str(e)))
    for name, slug in PAGES.items():
        charts = _visit(page, server, slug, stream)
        page.screenshot(path=str(SHOTS / f"streams-{stream}-{name}.png"), full_page=True)
        where = f"{name} of {stream}"
        assert page.locator('[data-testid="stException"]').count() == 0, where
        errors = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
        assert errors == [], (where, errors)
        assert all(ink > 0 for ink in charts), (where, charts)
        if name == "dag":
            assert charts and page.evaluate(_BARS_JS) >= 1, where
        if name == "overview":
            tile = page.locator('[data-testid="stMetric"]', has_text="Partitions").first
            value = tile.locator('[data-testid="stMetricValue"]').inner_text()
            assert value == f"{PARTITIONS[stream]:,}", (where, value)
    assert console == [], console
