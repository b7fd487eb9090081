"""The Partition DAG above the clickable size, in Debian's chromium (1440x900, software GL).

An 8,000-partition world (``big_world`` of ``tests/test_browser.py``, landed through
``Cache.ingest``): above ``figures.CLICKABLE_BARS`` partitions the bars of a state are one SVG
path. Checked in the rendered page: the paths carry a segment per partition and per edge, the
plot area carries ink (pixels, not only elements), the page says bars are chosen from the list,
and a partition chosen there (the URL's ``partition``) is drawn selected with its panel.
"""

from __future__ import annotations

import urllib.parse

import pytest

from app.figures import CLICKABLE_BARS
from tests.support.demo_cache import land_world
from tests.test_browser import (  # noqa: F401  (fixtures)
    SHOTS,
    _ink,
    _open,
    big_world,
    page,
    server,
)

pytestmark = [pytest.mark.slow, pytest.mark.browser]

STREAM, SIZE = "Big8000", 8000
FACTS: dict = {}


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory) -> str:
    from spark_backend import analysis
    from spark_backend.cache.store import Cache

    path = str(tmp_path_factory.mktemp("dag-large") / "large.duckdb")
    world = big_world(SIZE)
    world.stream = STREAM
    with Cache(path) as cache:
        land_world(cache, world)
        parts = analysis.partitions(cache.con, STREAM)
        FACTS["partitions"] = len(parts)
        FACTS["edges"] = int(analysis.edges(cache.con, STREAM)["kind"].isin(
            ["split", "merge", "move"]).sum())
        FACTS["token"] = sorted(parts["token"])[len(parts) // 2]
    return path


# Segments ("M" commands) per scatter trace, by legend name; bar paths drawn.
_PATHS_JS = """() => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  const out = {};
  gd.querySelectorAll('.scatterlayer .trace').forEach((g, i) => {
    const d = [...g.querySelectorAll('.js-line')].map(p => p.getAttribute('d') || '').join('');
    out[gd._fullData[g.__data__[0].trace.index].name] = (d.match(/M/g) || []).length;
  });
  return {segments: out, bars: gd.querySelectorAll('.barlayer .bars path').length};
}"""


def test_large_dag_draws_every_partition_and_edge(page, server):  # noqa: F811
    assert FACTS["partitions"] >= SIZE > CLICKABLE_BARS
    _open(page, server, "dag", f"?stream={STREAM}")
    drawn = page.evaluate(_PATHS_JS)
    segments = drawn["segments"]
    bars = sum(n for name, n in segments.items()
               if name.split(" (")[0] in ("finished", "open", "stalled", "incomplete",
                                           "holding back"))
    edges = sum(n for name, n in segments.items()
                if name.split(" (")[0] in ("split", "merge", "move"))
    assert bars >= FACTS["partitions"], drawn  # one segment per partition
    assert edges >= FACTS["edges"] > 0, drawn
    assert drawn["bars"] < 10, drawn  # no per-partition bar elements at this size
    area = page.locator('[data-testid="stPlotlyChart"] .nsewdrag').first
    ink = _ink(area.screenshot())
    page.screenshot(path=str(SHOTS / "dag-8000.png"), full_page=True)
    assert ink > 0.10, ink
    caption = page.locator('[data-testid="stMain"]').inner_text()
    assert f"above {CLICKABLE_BARS:,} partitions" in caption


def test_large_dag_selects_from_the_list(page, server):  # noqa: F811
    token = FACTS["token"]
    _open(page, server, "dag", "?" + urllib.parse.urlencode(
        {"stream": STREAM, "partition": token}))
    page.locator("h4", has_text=token).wait_for(timeout=60_000)
    drawn = page.evaluate(_PATHS_JS)
    assert drawn["segments"].get("selected") == 1, drawn  # the chosen bar, in yellow
    page.screenshot(path=str(SHOTS / "dag-8000-selected.png"), full_page=True)
