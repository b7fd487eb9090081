"""The first minute and every page's time, as a person meets them in chromium.

    python benchmarks/first_chart.py [--runs 3] [--cache BIG.duckdb] [--page-runs 3]
                                     [--nav url|click|both]

1. ``streamlit run app/main.py`` with a fresh HOME (an empty cache: the demo pulls itself), in
   Debian's chromium: seconds from the start of the process until the first chart has drawn
   marks, and until the Overview has settled. Median of ``--runs`` fresh starts.
2. With ``--cache`` (e.g. the 1M-record cache of ``dashboard_queries.py``): each page's seconds
   from navigation until it has settled (charts drawn, text unchanged for 1.5 s), median of
   ``--page-runs`` visits. ``--nav url`` opens each page by its address (a fresh load of the
   whole app and a new session each time, as a shared link does); ``--nav click`` moves there
   by the sidebar's link (one session, as a person goes from page to page); ``both`` measures
   each way in turn.

Prints figures against the issue's bound (first chart within 30 s) and its baseline (56 s on a
quiet machine with the one-shot pull, and no chart on the Overview). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
BOUND_S, BASELINE_S = 30.0, 56.0
TIMEOUT_MS = 600_000
PAGES = ("", "sources", "dag", "watermarks", "transactions", "records", "sql")
# the sidebar link's text of each page (app/nav.py)
NAV_TITLES = {"overview": "Overview", "sources": "Sources and pull", "dag": "Partition DAG",
              "watermarks": "Watermarks", "transactions": "Transactions", "records": "Records",
              "sql": "SQL"}
_DRAWN_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].some(gd =>
    gd.querySelectorAll('.barlayer .bars path, .scatterlayer .js-line').length > 0)"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    port = _port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app/main.py", "--server.port", str(port),
         "--server.address", "127.0.0.1", "--server.headless", "true"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=2)
            break
        except OSError:
            time.sleep(0.25)
    return proc, url


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


def _settled(page, quiet_s: float = 1.5, timeout: float = 600) -> None:
    last, since, t0 = None, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < timeout:
        busy = page.locator("[data-testid='stStatusWidget'], [data-testid='stSpinner']").count()
        text = page.locator("[data-testid='stMain']").inner_text()
        if busy or text != last:
            last, since = text, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


def first_chart(browser) -> tuple[float, float]:
    """(first chart drawn, Overview settled) in seconds after `streamlit run`, fresh HOME."""
    home = tempfile.mkdtemp(prefix="first-chart-home-")
    env = {**os.environ, "HOME": home, "PYTHONPATH": str(ROOT)}
    env.pop("CSI_CACHE", None)
    began = time.monotonic()
    proc, url = _serve(env)
    try:
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(url + "/")
        page.wait_for_function(_DRAWN_JS, timeout=900_000, polling=250)
        chart = time.monotonic() - began
        _settled(page)
        page.close()
        return chart, time.monotonic() - began
    finally:
        _stop(proc)


def _go(page, url: str, name: str, how: str) -> None:
    """Open page ``name`` by its address, or by clicking its sidebar link and waiting for its
    title to replace the previous page's."""
    if how == "url":
        page.goto(f"{url}/{name}")
        page.wait_for_selector("h1", timeout=600_000)
        return
    before = page.locator("[data-testid='stMain'] h1").first.inner_text()
    title = NAV_TITLES[name or "overview"]
    page.locator("[data-testid='stSidebarNav'] a", has_text=title).first.click()
    page.wait_for_function(
        "b => { const h = document.querySelector(\"[data-testid='stMain'] h1\");"
        " return h && h.innerText !== b; }",
        arg=before, timeout=TIMEOUT_MS, polling=100)


def page_times(browser, cache: str, runs: int, how: str = "url") -> dict[str, float]:
    env = {**os.environ, "CSI_CACHE": os.path.abspath(cache), "PYTHONPATH": str(ROOT)}
    proc, url = _serve(env)
    out: dict[str, list[float]] = {p or "overview": [] for p in PAGES}
    try:
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        # the server's first run (imports, caches) is not a page's time; the last page is
        # where a click starts from, so that each click changes the page
        page.goto(f"{url}/{PAGES[-1]}")
        _settled(page)
        for _ in range(runs + 1):
            for name in PAGES:
                t = time.monotonic()
                _go(page, url, name, how)
                _settled(page)
                out[name or "overview"].append(time.monotonic() - t - 1.5)
        page.close()
    finally:
        _stop(proc)
    # the first visit of each page fills Streamlit's query cache: report the later ones
    return {k: statistics.median(v[1:]) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache", help="a cache for the per-page times (e.g. 1M records)")
    ap.add_argument("--page-runs", type=int, default=3)
    ap.add_argument("--skip-first", action="store_true", help="only the per-page times")
    ap.add_argument("--nav", choices=("url", "click", "both"), default="both",
                    help="open each page by its address, by the sidebar's link, or both")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        if not args.skip_first:
            got = [first_chart(browser) for _ in range(args.runs)]
            for i, (chart, done) in enumerate(got, 1):
                print(f"fresh start {i}: first chart {chart:5.1f}s, Overview settled {done:5.1f}s")
            chart = statistics.median(c for c, _ in got)
            done = statistics.median(d for _, d in got)
            print(f"first chart (median of {len(got)}): {chart:.1f}s  bound {BOUND_S:.0f}s  "
                  f"baseline {BASELINE_S:.0f}s (no chart on the Overview then)"
                  f" -> {'within' if chart <= BOUND_S else 'OVER'} the bound; Overview settled "
                  f"{done:.1f}s")
        for how in (("url", "click") if args.nav == "both" else (args.nav,)) if args.cache else ():
            times = page_times(browser, args.cache, args.page_runs, how)
            for name, secs in times.items():
                print(f"page {name:<13} {secs:6.2f}s (median of {args.page_runs}, by {how})",
                      flush=True)
        browser.close()


if __name__ == "__main__":
    main()
