"""End to end in a real browser: `streamlit run app/main.py` on localhost, Debian's chromium
driven by playwright. Opens every page, waits for its chart, clicks a partition in the DAG and
sees its details; one screenshot per page in screenshots/ (ignored by git). Installs nothing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from tests.support.demo_cache import pull_demo

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "screenshots"
PAGES = {"overview": "", "sources": "sources", "dag": "dag", "watermarks": "watermarks",
         "transactions": "transactions", "records": "records", "sql": "sql"}
CHARTED = {"dag", "watermarks", "transactions"}

if not Path(CHROMIUM).exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cache = pull_demo(str(tmp_path_factory.mktemp("browser") / "demo.duckdb"))
    port = _free_port()
    log = open(tmp_path_factory.mktemp("log") / "streamlit.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=ROOT, env={**os.environ, "CSI_CACHE": cache}, stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        proc.terminate()
        pytest.fail("streamlit did not start")
    yield url
    proc.terminate()
    proc.wait(timeout=20)
    log.close()


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport={"width": 1500, "height": 1100})
        tab.set_default_timeout(60_000)
        yield tab
        browser.close()


def _open(page, server: str, name: str) -> None:
    page.goto(f"{server}/{PAGES[name]}")
    page.wait_for_selector('[data-testid="stApp"]')
    page.wait_for_selector('h1', timeout=60_000)
    if name in CHARTED:
        page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg')
    page.wait_for_timeout(800)
    assert not page.query_selector('[data-testid="stException"]'), f"{name} raised"


@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_renders(page, server, name):
    _open(page, server, name)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    if name == "overview":
        assert page.get_by_text("has held the stream back").count() >= 1
    if name == "watermarks":
        assert page.get_by_text("has held the stream back for").count() >= 1


_POINT_JS = """() => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  const i = gd._fullData.findIndex(t => t.mode === 'markers' && t.customdata
                                         && t.customdata.length > 3);
  const t = gd._fullData[i], k = Math.floor(t.customdata.length / 2);
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  return {token: t.customdata[k][0],
          x: box.left + xa._offset + xa.c2p(xa.d2c(t.x[k])),
          y: box.top + ya._offset + ya.c2p(ya.d2c(t.y[k]))};
}"""


def test_click_a_partition_in_the_dag(page, server):
    _open(page, server, "dag")
    target = page.evaluate(_POINT_JS)
    page.mouse.move(target["x"], target["y"])
    page.wait_for_timeout(300)
    page.mouse.click(target["x"], target["y"])
    heading = page.locator("h4", has_text=target["token"])
    heading.wait_for(timeout=30_000)
    assert f"partition={target['token']}" in page.url
    page.screenshot(path=str(SHOTS / "dag-selected.png"), full_page=True)
