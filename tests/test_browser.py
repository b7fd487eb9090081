"""End to end in a real browser: `streamlit run app/main.py` on localhost, Debian's chromium
driven by playwright (never a downloaded browser).

What a person sees, checked in the rendered page: the DAG's plot area carries its bars and edges
(rendered SVG paths and pixel ink) for the demo and for a 2,000-partition world; five clicks on
five bars select five partitions; a shared Watermarks URL restores its moment; link, image and
HTML payloads in URL parameters, partition tokens and transaction ids render as text; the HTML
report draws offline; the live demo advances; the SQL console answers each hostile query
(a setting, a checkpoint, a file read, a memory bomb, an oversized answer) with its sentence
and still answers the next plain one. Screenshots go to screenshots/ (ignored by git).
"""

from __future__ import annotations

import io
import os
import random
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_backend.model.timestamps import format_ns
from tests.support.chromium import CHROMIUM, SHOTS
from tests.support.demo_cache import land_world, pull_demo
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.browser]

ROOT = Path(__file__).resolve().parent.parent
# Bounds on waits for what the dashboard does (a page, a chart, a tick): far above what a
# loaded machine needs, they tell a hang from a slow page; the waits end at the event.
HANG_S = 600
HANG_MS = HANG_S * 1000
PAGES = {"overview": "", "sources": "sources", "dag": "dag", "watermarks": "watermarks",
         "transactions": "transactions", "records": "records", "sql": "sql"}
CHARTED = {"overview", "dag", "watermarks", "transactions"}
T0 = 1_767_603_600 * 10**9  # 2026-01-05T09:00:00Z
HOUR = 3600 * 10**9

if not Path(CHROMIUM).exists():
    pytest.skip("needs Debian's chromium at /usr/bin/chromium", allow_module_level=True)


# --- worlds -------------------------------------------------------------------------------------


def _world(stream: str, lines: list[dict], partitions: list[SimpleNamespace]) -> SimpleNamespace:
    """What ``land_world`` reads of a world, for a recording made here."""
    return SimpleNamespace(stream=stream, start=T0, end=T0 + HOUR, partitions=partitions,
                           iter_recording=lambda heartbeat_ms: (dict(x) for x in lines))


def _root(token: str, i: int) -> dict:
    return {"partition_token": None, "child_partitions_record": {
        "start_timestamp": format_ns(T0), "record_sequence": f"{i:08d}",
        "child_partitions": [{"token": token, "parent_partition_tokens": []}]}}


def _children(parent: str, at: int, kids: list[str], parents: list[str]) -> dict:
    return {"partition_token": parent, "child_partitions_record": {
        "start_timestamp": format_ns(at), "record_sequence": "00000001",
        "child_partitions": [{"token": k, "parent_partition_tokens": parents} for k in kids]}}


def _beat(token: str, at: int) -> dict:
    return {"partition_token": token, "heartbeat_record": {"timestamp": format_ns(at)}}


def big_world(n: int = 2000, seed: int = 7) -> SimpleNamespace:
    """``n`` partitions splitting (mostly), merging and moving over one hour."""
    rng = random.Random(seed)
    lines: list[dict] = []
    parts: dict[str, SimpleNamespace] = {}
    alive: list[str] = []

    def new(start: int) -> str:
        token = f"part-{len(parts):05d}"
        parts[token] = SimpleNamespace(token=token, start=start, end=None)
        alive.append(token)
        return token

    for i in range(8):
        lines.append(_root(new(T0), i))
    step = int(HOUR * 0.95) // n
    at = T0
    while len(parts) < n:
        at += step
        r = rng.random()
        ends = [alive.pop(rng.randrange(len(alive)))
                for _ in range(2 if r < 0.15 and len(alive) > 2 else 1)]
        kids = [new(at) for _ in range(1 if r < 0.25 else 2)] if len(ends) == 1 else [new(at)]
        for token in ends:
            parts[token].end = at
            lines.append(_beat(token, (parts[token].start + at) // 2))
            lines.append(_children(token, at, kids, ends if len(ends) > 1 else [token]))
    for token in alive:
        lines.append(_beat(token, T0 + HOUR - rng.randrange(1, 9) * 10**9))
    return _world("Big2000", lines, list(parts.values()))


PAYLOADS = {
    "link": "[Your session expired](http://evil.example/login)",
    "image": "![pixel](http://evil.example/pixel.png)",
    "html": "<b>bold</b><img src=http://evil.example/x.png>",
}


def unread_world(n: int = 6) -> SimpleNamespace:
    """What a pull stopped after its first query leaves: partitions named, no time read."""
    parts = [SimpleNamespace(token=f"unread-{i}", start=T0, end=None) for i in range(n)]
    world = _world("Unread", [_root(p.token, i) for i, p in enumerate(parts)], parts)
    world.end = T0
    return world


def payload_world() -> SimpleNamespace:
    """Partition tokens and transaction ids carrying link, image and HTML payloads."""
    lines, parts = [], []
    for i, (name, text) in enumerate(PAYLOADS.items()):
        token = f"{text}-{name}"
        parts.append(SimpleNamespace(token=token, start=T0, end=None))
        lines.append(_root(token, i))
        for k in range(3):
            at = T0 + (k + 1) * 60 * 10**9 + i * 10**6
            lines.append({"partition_token": token, "data_change_record": {
                "commit_timestamp": format_ns(at), "record_sequence": f"{k:08d}",
                "server_transaction_id": f"{text}-txn{k}",
                "is_last_record_in_transaction_in_partition": True, "table_name": "Accounts",
                "column_types": [{"name": "AccountId", "type": {"code": "STRING"},
                                  "is_primary_key": True, "ordinal_position": 1}],
                "mods": [{"keys": {"AccountId": text}, "new_values": {}, "old_values": {}}],
                "mod_type": "INSERT", "value_capture_type": "NEW_VALUES",
                "number_of_records_in_transaction": 1, "number_of_partitions_in_transaction": 1,
                "transaction_tag": text, "is_system_transaction": False}})
            lines.append(_beat(token, at + 5 * 10**9))
    return _world("Payloads", lines, parts)


# --- the server and the browser ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory) -> str:
    """One cache: the demo world (through the real pull), a 2,000-partition world and a world
    of payloads (landed through ``Cache.ingest``)."""
    from spark_backend import analysis
    from spark_backend.analysis import stalls
    from spark_backend.cache.store import Cache

    path = pull_demo(str(tmp_path_factory.mktemp("browser") / "demo.duckdb"))
    with Cache(path) as cache:
        land_world(cache, big_world())
        land_world(cache, payload_world())
        land_world(cache, unread_world())
        # what the tests compare with, read before the server holds the file
        for stream in ("DemoStream", "Big2000"):
            FACTS[stream] = {
                "partitions": cache.con.execute(
                    "SELECT count(*) FROM partitions WHERE stream = ?", [stream]).fetchone()[0],
                "edges": int(analysis.edges(cache.con, stream)["kind"].isin(
                    ["split", "merge", "move"]).sum())}
        FACTS["worst"] = stalls.worst_stall(cache.con, "DemoStream", 60.0)
    report = Path(path).with_name("report.html")
    FACTS["report"] = subprocess.run(
        [sys.executable, "-m", "spark_backend", "report", "--cache", path, "--stream",
         "DemoStream", "--html", str(report)], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)
    FACTS["report_path"] = report
    return path


FACTS: dict = {}


_SERVER_LOG: dict[str, Path] = {}


@pytest.fixture(scope="module")
def server(cache_path, tmp_path_factory):
    port = _free_port()
    _SERVER_LOG["path"] = tmp_path_factory.mktemp("log") / "streamlit.log"
    log = open(_SERVER_LOG["path"], "w")
    # Arrow's allocator prints the options it read (MIMALLOC_VERBOSE); the dashboard must set
    # its own, as when started from a shell that has none.
    env = {k: v for k, v in os.environ.items() if not k.startswith("MIMALLOC_")}
    # SIGUSR1 writes every thread's stack to the log (``_server_stacks``: what a page waited on).
    launch = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, "
              "all_threads=True); from streamlit.web.cli import main; sys.argv[0] = 'streamlit'; "
              "sys.exit(main())")
    proc = subprocess.Popen(
        [sys.executable, "-c", launch, "run", "app/main.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=ROOT, env={**env, "CSI_CACHE": cache_path, "MIMALLOC_VERBOSE": "1"}, stdout=log,
        stderr=subprocess.STDOUT)
    _SERVER_LOG["pid"] = proc.pid
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + HANG_S
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
    proc.wait(timeout=30)
    log.close()


def _server_stacks() -> str:
    """The dashboard server's threads as they are now (from its log), to say what a page that
    never came waited on."""
    import signal

    before = _SERVER_LOG["path"].stat().st_size
    os.kill(_SERVER_LOG["pid"], signal.SIGUSR1)
    wait_until(lambda: _SERVER_LOG["path"].stat().st_size > before, "the server's stacks")
    with open(_SERVER_LOG["path"], errors="replace") as f:
        f.seek(before)
        return f.read()[-12_000:]


@pytest.fixture
def page(browser):
    """A fresh tab (1440x900, as a person opens it) that records outside requests."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(HANG_MS)
    tab.outside = []

    def only_local(route) -> None:
        host = urllib.parse.urlparse(route.request.url).hostname
        local = route.request.url.startswith(("data:", "blob:", "file:"))
        if host in ("127.0.0.1", "localhost") or local:
            route.continue_()
        else:
            tab.outside.append(route.request.url)
            route.abort()

    tab.route("**/*", only_local)
    yield tab
    context.close()


def _open(page, server: str, name: str, query: str = "") -> None:
    page.goto(f"{server}/{PAGES[name]}{query}")
    page.wait_for_selector('[data-testid="stApp"]')
    page.wait_for_selector("h1")
    if name in CHARTED:
        page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg')
    _settle(page)
    assert not page.query_selector('[data-testid="stException"]'), f"{name} raised"


def _settle(page) -> None:
    """Until the script has ended and every chart is drawn (see ``_IDLE``). After an action that
    reruns the script, wait first for what the rerun changes (the URL, a heading): until then
    the previous run's end still reads as idle."""
    page.wait_for_selector(_IDLE, timeout=HANG_MS)
    page.wait_for_function(_CHARTS_READY_JS, polling=100, timeout=HANG_MS)


def _ink(png: bytes) -> float:
    """Share of pixels carrying colour or dark strokes (a blank plot area is ~0)."""
    from PIL import Image

    raw = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    n = len(raw) // 3
    inked = 0
    for i in range(0, 3 * n, 3):
        r, g, b = raw[i], raw[i + 1], raw[i + 2]
        if max(r, g, b) - min(r, g, b) > 40 or max(r, g, b) < 150:
            inked += 1
    return inked / max(1, n)


_IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
# Charts draw after the script has ended: no element still a loading placeholder, and every
# chart container holds its SVG.
_CHARTS_READY_JS = """() =>
  !document.querySelector('[data-testid="stMain"] [data-testid="stSkeleton"]')
  && [...document.querySelectorAll('[data-testid="stPlotlyChart"]')]
       .every(c => c.querySelector('.main-svg'))"""


def _visit(tab, url: str, slug: str, stream: str, ink: bool = True) -> list[float]:
    """Opens the page by its address; once it is drawn, returns each chart's ink (the share of
    its plot area's pixels that carry marks: SVG and WebGL traces alike), or with ``ink=False``
    (a live page, whose charts are redrawn while one would read them) an empty list."""
    tab.goto(f"{url}/{slug}?stream={urllib.parse.quote(stream)}")
    tab.wait_for_selector(_IDLE)
    tab.wait_for_function(_CHARTS_READY_JS, polling=100)
    inks: list[float] = []
    for chart in tab.locator('[data-testid="stPlotlyChart"]').all() if ink else ():
        area = chart.locator(".nsewdrag")
        inks.append(_ink((area.first if area.count() else chart).screenshot()))
    return inks


# --- every page -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PAGES))
def test_every_page_renders(page, server, name):
    _open(page, server, name, "?stream=DemoStream")
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)
    if name in ("overview", "watermarks"):
        assert page.get_by_text("Worst stall").count() >= 1
    assert page.outside == [], "no outside fetches (icon, fonts)"


def test_the_dashboard_gives_arrows_freed_pages_back(page, server):
    """The dashboard's process loads pyarrow after ``app/main.py`` imported the package, so
    Arrow's allocator read ``MIMALLOC_PURGE_DELAY=0`` (``config.ALLOCATOR_ENV``)."""
    _open(page, server, "overview", "?stream=DemoStream")
    read = re.findall(r"option 'purge_delay': (-?\d+)", _SERVER_LOG["path"].read_text())
    assert read and set(read) == {"0"}, read


def test_overview_is_also_at_its_slug(page, server):
    page.goto(f"{server}/overview?stream=DemoStream")
    page.wait_for_selector("h1")
    _settle(page)
    assert page.get_by_text("Worst stall").count() >= 1


# --- the DAG draws, and a click selects every time ----------------------------------------------

_MARKS_JS = """() => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  const bars = gd.querySelectorAll('.barlayer .bars path');
  const drawn = [...bars].filter(p => (p.getAttribute('d') || '').length > 4).length;
  const segments = [...gd.querySelectorAll('.scatterlayer .js-line')]
      .map(p => ((p.getAttribute('d') || '').match(/M/g) || []).length);
  return {bars: drawn, segments: segments.reduce((a, b) => a + b, 0)};
}"""


def _dag_marks(page, server: str, stream: str, shot: str) -> dict:
    _open(page, server, "dag", f"?stream={stream}")
    marks = page.evaluate(_MARKS_JS)
    area = page.locator('[data-testid="stPlotlyChart"] .nsewdrag').first
    marks["ink"] = _ink(area.screenshot())
    page.screenshot(path=str(SHOTS / shot), full_page=True)
    return marks


def test_dag_draws_bars_and_edges_for_the_demo(page, server):
    marks = _dag_marks(page, server, "DemoStream", "dag-demo.png")
    assert marks["bars"] >= FACTS["DemoStream"]["partitions"], marks
    assert marks["segments"] >= FACTS["DemoStream"]["edges"] > 0, marks  # every edge is drawn
    assert marks["ink"] > 0.10, marks


def test_dag_draws_2000_partitions(page, server):
    marks = _dag_marks(page, server, "Big2000", "dag-2000.png")
    assert marks["bars"] >= FACTS["Big2000"]["partitions"] >= 2000, marks
    assert marks["segments"] >= FACTS["Big2000"]["edges"] > 0, marks
    assert marks["ink"] > 0.10, marks


_BAR_WIDTHS_JS = """() => [...document.querySelectorAll(
  '[data-testid="stPlotlyChart"] .barlayer .bars path')]
  .map(p => p.getBoundingClientRect().width)"""


def test_dag_of_partitions_with_no_time_read_draws_them_and_says_why(page, server):
    """A pull stopped after its first query: every bar starts and ends at one instant, which
    drew nothing (an axis a millisecond wide around bars of no width)."""
    marks = _dag_marks(page, server, "Unread", "dag-unread.png")
    widths = page.evaluate(_BAR_WIDTHS_JS)
    assert len(widths) == 6 and min(widths) >= 10, widths
    assert marks["ink"] > 0.01, marks
    assert "No time read yet" in _text(page, '[data-testid="stPlotlyChart"]')


_BAR_JS = """(k) => {
  const gd = document.querySelector('[data-testid="stPlotlyChart"] .js-plotly-plot');
  const traces = gd._fullData.filter(t => t.type === 'bar' && t.customdata
                                          && t.name !== 'selected');
  const all = [];
  traces.forEach(t => t.customdata.forEach((c, i) => all.push([t, i])));
  all.sort((a, b) => (a[0].x[a[1]] > b[0].x[b[1]] ? -1 : 1));  // the longest bars first
  const [t, i] = all[k];
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.getBoundingClientRect();
  const mid = xa.d2c(t.base[i]) + t.x[i] / 2;
  return {token: t.customdata[i][0],
          x: box.left + xa._offset + xa.c2p(mid), y: box.top + ya._offset + ya.c2p(t.y[i])};
}"""


def test_five_clicks_select_five_partitions(page, server):
    _open(page, server, "dag", "?stream=DemoStream")
    chosen = []
    for k in (0, 3, 6, 9, 12):
        target = page.evaluate(_BAR_JS, k)
        page.mouse.move(target["x"], target["y"])
        page.wait_for_timeout(200)
        page.mouse.click(target["x"], target["y"])
        page.wait_for_function(
            "t => new URLSearchParams(location.search).get('partition') === t",
            arg=target["token"], timeout=HANG_MS)
        page.locator("h4", has_text=target["token"]).wait_for(timeout=HANG_MS)
        _settle(page)
        chosen.append(target["token"])
    assert len(set(chosen)) == 5
    # The selection is highlighted without fading the rest: every bar keeps its opacity.
    faded = page.evaluate("""() => [...document.querySelectorAll(
        '[data-testid="stPlotlyChart"] .barlayer .bars path')].filter(
        p => parseFloat(getComputedStyle(p).opacity || '1') < 0.9).length""")
    assert faded == 0
    page.screenshot(path=str(SHOTS / "dag-selected.png"), full_page=True)


def test_the_selected_partition_travels_through_the_sidebars_links(page, server):
    """A partition clicked on the DAG is still selected on the pages the sidebar opens (its
    links carry no URL parameters) and is back in their URL."""
    from playwright.sync_api import expect

    _open(page, server, "dag", "?stream=DemoStream")
    target = page.evaluate(_BAR_JS, 4)
    page.mouse.click(target["x"], target["y"])
    page.wait_for_function("t => new URLSearchParams(location.search).get('partition') === t",
                           arg=target["token"], timeout=HANG_MS)
    _settle(page)
    sidebar = page.locator('[data-testid="stSidebarNav"]')
    for title in ("Records", "Watermarks", "Partition DAG"):
        sidebar.get_by_role("link", name=title).click()
        page.wait_for_function(
            "t => new URLSearchParams(location.search).get('partition') === t",
            arg=target["token"], timeout=HANG_MS)
        _settle(page)
        assert not page.query_selector('[data-testid="stException"]'), title
        if title == "Watermarks":  # drilled into it
            expect(page.locator('[data-testid="stMain"]')).to_contain_text(
                target["token"], timeout=HANG_MS)
        else:  # Records and the DAG: their partition list shows it chosen
            chosen = page.locator('[data-testid="stSelectbox"] input[aria-label="Partition"]')
            expect(chosen.first).to_have_value(target["token"], timeout=HANG_MS)
        page.screenshot(path=str(SHOTS / f"partition-travels-{title}.png"), full_page=True)


# --- a shared Watermarks URL restores its moment -----------------------------------------------


def test_shared_watermarks_url_restores_its_moment(page, server):
    worst = FACTS["worst"]
    middle = (worst["since_ns"] + worst["until_ns"]) // 2
    query = urllib.parse.urlencode({"stream": "DemoStream", "at": format_ns(middle),
                                    "partition": worst["partition"]})
    _open(page, server, "watermarks", "?" + query)
    text = _text(page, '[data-testid="stMain"]')
    assert f"partition {worst['partition']} held the low watermark" in text
    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
    moment = slider.get_attribute("aria-valuetext")
    held = int(moment[:2]) * 3600 + int(moment[3:5]) * 60 + int(moment[6:8])
    since = (worst["since_ns"] // 10**9) % 86400
    until = (worst["until_ns"] // 10**9) % 86400
    assert since < held < until, (moment, worst)
    # The slider moves the moment in the URL (and every arrow-key step counts).
    slider.focus()
    for _ in range(2):  # each step reruns the page, which writes the moment to the URL
        before = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(page.url).query))["at"]
        page.keyboard.press("ArrowLeft")
        page.wait_for_function("m => new URLSearchParams(location.search).get('at') !== m",
                               arg=before, timeout=HANG_MS)
        _settle(page)
    after = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(page.url).query))["at"]
    assert after < format_ns(middle)
    page.screenshot(path=str(SHOTS / "watermarks-shared.png"), full_page=True)


# --- payloads render as text --------------------------------------------------------------------

_FORMED_JS = """() => ({
  links: [...document.querySelectorAll('a[href]')]
         .filter(a => new URL(a.href, location.href).hostname.includes('evil')).length,
  images: [...document.querySelectorAll('img[src*="evil.example"], image[href*="evil"]')].length,
  bold: [...document.querySelectorAll('[data-testid="stMain"] b, [data-testid="stSidebar"] b')]
        .filter(b => b.textContent === 'bold').length,
})"""


def _text(page, selector: str = '[data-testid="stApp"]') -> str:
    """What is seen (zero-width spaces, which break autolinks, are not seen)."""
    return page.locator(selector).first.inner_text().replace("\u200b", "")


def _no_payload_formed(page) -> None:
    formed = page.evaluate(_FORMED_JS)
    assert formed == {"links": 0, "images": 0, "bold": 0}, formed
    assert not [u for u in page.outside if "evil.example" in u], page.outside


# Every payload in one value: markdown or HTML rendering of the value would form at least one
# of their elements (a link, an image, bold text), which ``_no_payload_formed`` counts.
ALL_PAYLOADS = " ".join(PAYLOADS.values())


@pytest.mark.parametrize("param", ["stream", "start", "end", "partition", "txn", "step", "at",
                                   "stall"])
def test_url_parameters_render_as_text(page, server, param):
    query = {"stream": "DemoStream", param: ALL_PAYLOADS}
    target = {"partition": "dag", "txn": "transactions", "at": "watermarks",
              "stall": "watermarks"}.get(param, "overview")
    page.goto(f"{server}/{PAGES[target]}?{urllib.parse.urlencode(query)}")
    page.wait_for_selector("h1")
    _settle(page)
    _no_payload_formed(page)
    if param in ("stream", "partition", "txn"):
        assert ALL_PAYLOADS in _text(page)


def test_tokens_and_transaction_ids_render_as_text(page, server):
    tokens = [f"{text}-{name}" for name, text in PAYLOADS.items()]
    for token in tokens:
        query = urllib.parse.urlencode({"stream": "Payloads", "partition": token})
        _open(page, server, "dag", "?" + query)
        _no_payload_formed(page)
        assert token in _text(page, "h4")
        # hover a bar: the hover label shows the token as text
        target = page.evaluate(_BAR_JS, 0)
        page.mouse.move(target["x"], target["y"])
        page.wait_for_timeout(300)
        _no_payload_formed(page)
    txn = f"{PAYLOADS['link']}-txn0"
    _open(page, server, "transactions", "?" + urllib.parse.urlencode(
        {"stream": "Payloads", "txn": txn}))
    _no_payload_formed(page)
    assert txn in _text(page, '[data-testid="stMain"]')
    for name in ("overview", "watermarks", "records"):
        _open(page, server, name, "?stream=Payloads")
        _no_payload_formed(page)
    page.screenshot(path=str(SHOTS / "payloads-transactions.png"), full_page=True)


# --- the SQL console -----------------------------------------------------------------------------

# Hostile queries and the words of the sentence each must show (``app/sql_console``).
HOSTILE = {
    "CALL enable_logging(storage='file', storage_path='/tmp/x')": "The console is read-only",
    "CHECKPOINT": "The console is read-only",
    "SELECT * FROM read_text('/etc/passwd')": "reads only the cache's own tables",
    "SELECT len(range(1000000000))": "MB of memory, the console's limit",
    "SELECT repeat('x', 1000000) FROM range(100)": "The answer is larger than 32 MB",
}


def _run_sql(page, sql: str, shows: str) -> None:
    """Runs ``sql`` and returns once the main area shows ``shows`` and the app has stopped."""
    from playwright.sync_api import expect

    box = page.locator('[data-testid="stTextArea"] textarea')
    box.fill(sql)
    box.press("Control+Enter")  # Streamlit takes a text area's value on Ctrl+Enter or blur
    expect(page.locator(_IDLE)).to_have_count(1, timeout=120_000)
    page.get_by_role("button", name="Run").click()
    main = page.locator('[data-testid="stMain"]')
    expect(main.get_by_text(shows).first).to_be_visible(timeout=120_000)
    expect(page.locator(_IDLE)).to_have_count(1, timeout=120_000)


def test_console_refuses_hostile_queries_in_a_sentence_and_keeps_serving(page, server):
    """Each hostile query shows its one sentence (no raw exception, no Streamlit size box),
    and the same server still answers a plain query after every one of them."""
    from playwright.sync_api import expect

    _open(page, server, "sql", "?stream=DemoStream")
    alert = page.locator('[data-testid="stAlert"]')
    for sql, words in HOSTILE.items():
        _run_sql(page, sql, words)
        alerts = alert.all_inner_texts()
        assert len(alerts) == 1 and words in alerts[0], (sql, alerts)
        assert "\n" not in alerts[0].strip(), f"one sentence, not a traceback: {alerts[0]}"
        assert not page.query_selector('[data-testid="stException"]'), sql
        assert "MessageSizeError" not in _text(page, '[data-testid="stMain"]'), sql
        _run_sql(page, "SELECT 6 * 7 AS answer", "1 rows")
        expect(alert).to_have_count(0)  # the refusal is gone once the answer is drawn
        assert page.get_by_text("1 rows", exact=True).count() == 1, sql
        assert page.locator('[data-testid="stDataFrame"]').count() >= 1, sql
    page.screenshot(path=str(SHOTS / "sql-after-hostile.png"), full_page=True)


# --- the HTML report draws offline ---------------------------------------------------------------


def test_html_report_draws_offline(page, cache_path):
    done, out = FACTS["report"], FACTS["report_path"]
    assert done.returncode == 0, done.stderr
    page.goto(out.as_uri())
    page.wait_for_selector(".js-plotly-plot .barlayer .bars path")
    assert page.locator(".js-plotly-plot").count() == 3
    assert page.locator(".js-plotly-plot .barlayer .bars path").count() >= 41  # the DAG's bars
    assert page.locator(".js-plotly-plot .scatterlayer .js-line").count() > 0
    assert "Worst stall" in page.inner_text("body")
    assert page.outside == [], "the report fetches nothing"


# --- the live demo advances ---------------------------------------------------------------------


def test_live_demo_advances(page, server):
    page.goto(f"{server}/sources")
    page.wait_for_selector("h1")
    _settle(page)
    page.get_by_role("button", name="Start the live demo").click()
    page.wait_for_url("**/?stream=LiveDemo_*", timeout=HANG_MS)
    page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg')

    def now_line() -> str:
        text = page.locator('[data-testid="stMain"]').inner_text()
        return next((line for line in text.splitlines() if line.startswith("Now (")), "")

    first = now_line()
    assert first, "the live Overview says where the low watermark is now"
    # No timing threshold: wait (bounded) until the page has moved on by itself.
    page.wait_for_function(
        "t => ![...document.querySelectorAll('[data-testid=\"stMain\"] p')]"
        ".some(p => p.innerText === t)", arg=first, timeout=HANG_MS)
    assert now_line() != first
    page.screenshot(path=str(SHOTS / "live.png"), full_page=True)
    stream = urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)["stream"][0]
    # Every page of the running stream draws, with no exception or error box.
    for name, slug in PAGES.items():
        _visit(page, server, slug, stream, ink=False)
        assert page.locator('[data-testid="stException"]').count() == 0, name
        errors = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
        assert errors == [], (name, errors)
    # Stop ends it: the page says so (and the emulator's test below runs without its ticks).
    page.goto(f"{server}/sources")
    page.wait_for_selector("h1")
    _settle(page)
    page.get_by_role("button", name=f"Stop {stream}").first.click()
    page.wait_for_function(
        "s => document.querySelector('[data-testid=\"stMain\"]').innerText"
        ".includes(s + ' is stopped: ')", arg=stream, timeout=HANG_MS)
    _settle(page)


# --- the live emulator starts from the Sources page and stops from it -------------------------


def _emulators_of(url: str) -> list[int]:
    """Pids of the emulators the dashboard serving ``url`` started (its children)."""
    port = urllib.parse.urlparse(url).port
    pids = {int(p) for p in os.listdir("/proc") if p.isdigit()}

    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""

    def parent(pid: int) -> int | None:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None

    dashboard = {p for p in pids if "streamlit" in cmdline(p) and f"{port}" in cmdline(p)}
    return [p for p in pids if parent(p) in dashboard and "emulator_main" in cmdline(p)]


def test_live_emulator_starts_and_stops(page, server):
    from playwright.sync_api import expect

    from tests.conftest import require_emulator

    require_emulator()
    page.goto(f"{server}/sources")
    page.wait_for_selector("h1")
    _settle(page)
    page.get_by_role("button", name="Start the live emulator").click()
    page.wait_for_url("**/?stream=LiveEmulator_*", timeout=HANG_MS)
    try:
        page.wait_for_selector('[data-testid="stPlotlyChart"] .main-svg')
    except Exception as e:  # seen beside other test processes: what it waited on
        raise AssertionError(f"the live Overview drew no chart: {e}\n{_server_stacks()}") from e
    main = page.locator('[data-testid="stMain"]')
    assert "LiveEmulator_" in main.inner_text() and " is live: " in main.inner_text()
    assert len(_emulators_of(server)) == 1, "one emulator runs for the live stream"
    page.goto(f"{server}/sources")
    try:
        page.wait_for_selector("h1")
    except Exception as e:  # seen once, in a run beside another test process: what it waited on
        raise AssertionError(f"the Sources page did not come: {e}\n{_server_stacks()}") from e
    _settle(page)
    page.get_by_role("button", name="Stop LiveEmulator").first.click()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=\"stMain\"]').innerText"
        ".includes(' is stopped: ')", timeout=HANG_MS)
    expect(page.get_by_role("button", name="Start the live emulator")).to_be_enabled(
        timeout=HANG_MS)
    _settle(page)
    assert _emulators_of(server) == [], "Stop ends the emulator"
