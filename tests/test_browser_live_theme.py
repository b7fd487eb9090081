"""The live demo and the themes in a real browser (Debian's chromium through playwright, never a
downloaded browser) against `streamlit run app/main.py` on localhost.

- The start race: a click on Overview while "Start the live demo" spins lands on the stream
  being started; the heading, the sidebar, the URL and every link name it from then on.
- The live Overview updates without greying out: sampled every 0.5 s, the page's elements are
  (almost) never faded by Streamlit's stale-element style while the fragment refreshes.
- The system's dark preference: the page is dark and no text is dark on dark (the charts'
  included); the light preference stays light.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.chromium import CHROMIUM, SHOTS
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parent.parent
HANG_S = 600  # a page or a pull this long in coming is a hang, not a slow machine
HANG_MS = HANG_S * 1000
STARTED: dict[str, str] = {}  # the live stream the race test started (for the greying test)

if not Path(CHROMIUM).exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(landed_caches, tmp_path_factory):
    """The dashboard on a copy of the landed demo cache (stream DemoStream)."""
    folder = tmp_path_factory.mktemp("live_theme")
    cache = landed_caches.copy(folder / "demo.duckdb")
    port = _free_port()
    log = open(folder / "streamlit.log", "w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    # No file watcher: files edited in the checkout meanwhile must not reload the app's modules
    # under a running live demo.
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true",
         "--server.fileWatcherType", "none"],
        cwd=ROOT, env={**env, "CSI_CACHE": cache}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200
        except OSError:
            return proc.poll() is not None  # exited: fail below, not after the hang bound

    wait_until(healthy, "the dashboard answers /_stcore/health", hang_s=HANG_S, poll_s=0.2)
    assert proc.poll() is None, (folder / "streamlit.log").read_text()[-3000:]
    yield url
    proc.terminate()
    proc.wait(timeout=60)
    log.close()


def _tab(browser, scheme: str = "light"):
    context = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme=scheme)
    tab = context.new_page()
    tab.set_default_timeout(HANG_MS)
    return context, tab


# What names the stream on screen: the page's heading, the sidebar's stream, the stream of
# every link in the main area, and the URL's.
_NAMES = """() => {
  const h1 = document.querySelector('[data-testid="stMain"] h1');
  const side = document.querySelector(
    '[data-testid="stSidebar"] [data-testid="stSelectbox"] input');
  const links = [...document.querySelectorAll('[data-testid="stMain"] a[href*="stream="]')]
    .map(a => new URL(a.href, location.href).searchParams.get('stream'));
  return {h1: h1 ? h1.innerText.trim() : null,
          side: side ? side.value : null,
          links, url: new URL(location.href).searchParams.get('stream'),
          path: location.pathname,
          charts: document.querySelectorAll('[data-testid="stPlotlyChart"] .main-svg').length};
}"""


def test_click_away_while_the_live_demo_starts(server, browser):
    context, tab = _tab(browser)
    tab.goto(f"{server}/sources?stream=DemoStream")
    tab.get_by_role("button", name="Start the live demo").wait_for()
    tab.get_by_role("button", name="Start the live demo").click()
    tab.locator('[data-testid="stSpinner"]').wait_for()  # the start is under way
    asked = tab.evaluate(_NAMES)
    assert asked["side"].startswith("LiveDemo_"), asked  # named from the click on
    assert asked["url"] == asked["side"], asked
    tab.locator('[data-testid="stSidebarNav"] a', has_text="Overview").click()

    seen: list[dict] = []

    def live_overview_drawn() -> bool:
        names = tab.evaluate(_NAMES)
        seen.append(names)
        return bool(names["h1"] and names["h1"].startswith("LiveDemo_") and names["charts"])

    wait_until(live_overview_drawn, "the live Overview draws its charts", hang_s=HANG_S,
               poll_s=0.25)
    stream = seen[-1]["h1"]
    assert stream == asked["side"], "the stream shown is the stream asked for"
    STARTED["stream"] = stream
    shown = [n for n in seen if n["h1"] is not None and n["path"] == "/"]
    assert shown, "the Overview rendered"
    for names in shown:  # every state the page went through after the click
        assert names["h1"] == stream, names
        assert names["side"] == stream, names
        assert names["url"] == stream, names
        assert all(link == stream for link in names["links"]), names
    assert seen[-1]["links"], "the tiles link to the other pages with the stream"
    tab.screenshot(path=str(SHOTS / "live_start_race.png"), full_page=True)

    # The DAG link opens the same stream, and the sidebar there says so.
    tab.locator('[data-testid="stMain"] a', has_text="Partition DAG").click()
    tab.wait_for_url("**/dag?*")
    assert urllib.parse.parse_qs(urllib.parse.urlparse(tab.url).query)["stream"] == [stream]
    wait_until(lambda: tab.evaluate(_NAMES)["side"] == stream, "the DAG page's sidebar names "
               "the live stream", hang_s=HANG_S)
    context.close()


# Per sample: which elements Streamlit marks stale, and which of them a person sees faded
# (visible, opacity below 0.9: the stale style fades after half a second). Retained copies are
# hidden (display: none) while their replacement mounts.
_FADED = """() => {
  const kind = e => e.querySelector('[data-testid="stPlotlyChart"]') ? 'chart'
    : ((e.querySelector('[data-testid]') || e).getAttribute('data-testid'));
  const stale = [...document.querySelectorAll(
    '[data-testid="stMain"] [data-testid="stElementContainer"][data-stale="true"]')];
  const faded = stale.filter(e => !e.getAttribute('data-retained')
    && getComputedStyle(e).display !== 'none' && parseFloat(getComputedStyle(e).opacity) < 0.9);
  const status = [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stText"]')]
    .map(e => e.innerText).find(t => t.includes(' is live: ')) || '';
  return {faded: faded.map(kind), stale: stale.length, status};
}"""


def test_live_overview_updates_without_greying_out(server, browser):
    stream = STARTED.get("stream")
    if stream is None:
        pytest.skip("needs the live demo the start-race test started")
    context, tab = _tab(browser)
    tab.goto(f"{server}/?stream={stream}")
    tab.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for()
    samples = []
    # A measurement, not a wait: 43 looks at the page 0.5 s apart (~4 refreshes at 5 s), then
    # 200 looks 0.1 s apart to time how long each refresh keeps elements stale.
    for _ in range(43):
        samples.append(tab.evaluate(_FADED))
        time.sleep(0.5)
    fine = []
    for _ in range(200):
        fine.append((time.monotonic(), tab.evaluate(_FADED)["stale"]))
        time.sleep(0.1)
    refreshes = [int(s["status"].split(": ")[1].split()[0]) for s in samples if s["status"]]
    assert refreshes and refreshes[-1] > refreshes[0], "the live demo refreshed meanwhile"
    faded = [s["faded"] for s in samples if s["faded"]]
    episodes, began = [], None
    for at, stale in fine:
        if stale and began is None:
            began = at
        elif not stale and began is not None:
            episodes.append(at - began)
            began = None
    print(f"faded in {len(faded)} of 43 samples; stale episodes (s): "
          f"{[round(e, 2) for e in episodes]}")
    assert not faded, faded
    assert episodes, "the fragment redrew the page while it was watched"
    # a refresh draws what the runner prepared: far under the 5 s cadence
    assert max(episodes) < 2.5, episodes
    context.close()


# Every visible text (HTML and the charts' SVG) and opaque chart line whose colour has too
# little contrast with what it is drawn on (WCAG contrast ratio below 3), and the app's
# background.
_CONTRAST = """() => {
  const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
  const lum = c => { const [r, g, b] = c.slice(0, 3).map(v => v / 255).map(
    v => v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4));
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const ratio = (a, b) => (Math.max(lum(a), lum(b)) + 0.05) / (Math.min(lum(a), lum(b)) + 0.05);
  const app = document.querySelector('[data-testid="stApp"]');
  const appBg = rgb(getComputedStyle(app).backgroundColor);
  const under = e => { for (let n = e; n; n = n.parentElement) {
      const c = rgb(getComputedStyle(n).backgroundColor);
      if (c.length === 3 || (c.length === 4 && c[3] > 0.5)) return c; }
    return appBg; };
  const bad = [];
  const walker = document.createTreeWalker(app, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const e = t.parentElement;
    // disabled controls are exempt (WCAG 1.4.3): dimmed on purpose
    if (!t.textContent.trim() || !e || e.closest('svg, [disabled], [aria-disabled="true"]')) {
      continue;
    }
    const r = e.getBoundingClientRect(), s = getComputedStyle(e);
    if (!r.width || !r.height || s.visibility === 'hidden' || parseFloat(s.opacity) === 0) continue;
    const k = ratio(rgb(s.color), under(e));
    if (k < 3) bad.push(`${t.textContent.trim().slice(0, 40)} (${s.color}: ${k.toFixed(1)})`);
  }
  for (const e of document.querySelectorAll('.main-svg text')) {
    const fill = e.style.fill || getComputedStyle(e).fill;
    if (!e.textContent.trim() || !fill || fill === 'none') continue;
    const chart = e.closest('[data-testid="stPlotlyChart"]');
    const k = ratio(rgb(fill), under(chart));
    if (k < 3) bad.push(`chart: ${e.textContent.trim().slice(0, 40)} (${fill}: ${k.toFixed(1)})`);
  }
  // Opaque lines (the low watermark, a stalled partition): as visible as text should be.
  let lines = 0;
  for (const e of document.querySelectorAll('.main-svg .scatterlayer .js-line')) {
    const stroke = rgb(e.style.stroke || getComputedStyle(e).stroke);
    const alpha = parseFloat(e.style.strokeOpacity || '1') * (stroke.length === 4 ? stroke[3] : 1);
    if (stroke.length < 3 || alpha < 0.9) continue;
    lines += 1;
    const chart = e.closest('[data-testid="stPlotlyChart"]');
    const k = ratio(stroke, under(chart));
    if (k < 3) bad.push(`chart line rgb(${stroke}): ${k.toFixed(1)}`);
  }
  return {bg: appBg, bad, lines};
}"""


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_the_page_follows_the_system_colour_scheme(server, browser, scheme):
    context, tab = _tab(browser, scheme)
    tab.goto(f"{server}/?stream=DemoStream")
    tab.locator('[data-testid="stPlotlyChart"] .main-svg').first.wait_for()
    tab.get_by_text("Worst stall").first.wait_for()
    seen = tab.evaluate(_CONTRAST)
    tab.screenshot(path=str(SHOTS / f"overview_{scheme}.png"), full_page=True)
    luminance = sum(seen["bg"][:3]) / 3
    if scheme == "dark":
        assert luminance < 60, f"the page is dark: background {seen['bg']}"
    else:
        assert luminance > 200, f"the page is light: background {seen['bg']}"
    assert seen["lines"] >= 2, "the lag chart's opaque lines were checked"
    assert not seen["bad"], seen["bad"][:20]
    # The Sources page's primary buttons: white text on the primary colour.
    tab.goto(f"{server}/sources?stream=DemoStream")
    tab.get_by_role("button", name="Start the live demo").wait_for()
    seen = tab.evaluate(_CONTRAST)
    assert not seen["bad"], seen["bad"][:20]
    context.close()
