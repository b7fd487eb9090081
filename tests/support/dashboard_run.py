"""The dashboard (``AppTest`` of ``app/main.py``) in a process of its own, which prints one
JSON line of what it showed: a Spark session with another master cannot start beside the test
process's own, and the cache is free again when it exits.

- ``python -m tests.support.dashboard_run pulls CACHE``: on the empty cache ``CACHE``, with the
  Spark of the environment (``CSI_SPARK_MASTER``), wait until the first minute has pulled the
  whole demo world, then pull the demo world again from the Sources page with the PostgreSQL
  dialect as stream ``DemoPg``; what the first minute and the Sources page said.
- ``python -m tests.support.dashboard_run pages CACHE``: every page on ``CACHE``; per page, its
  exceptions, errors, charts and the lines written across them (annotations).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
MAIN = str(ROOT / "app" / "main.py")


def pages(cache: str) -> dict:
    said = {}
    for page in ("overview", "dag", "watermarks", "transactions", "records", "sql", "sources"):
        at = AppTest.from_file(MAIN, default_timeout=120)
        at.session_state["cache_path"] = cache
        at.run()
        at.switch_page(f"../pages/{page}.py").run()
        charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
        said[page] = {"exceptions": [e.value for e in at.exception],
                      "errors": [e.value for e in at.error],
                      "charts": len(charts),
                      "notes": [a.get("text") for c in charts
                                for a in c.get("layout", {}).get("annotations", [])]}
    return said


def pulls(cache: str) -> dict:
    from app import resources

    at = AppTest.from_file(MAIN, default_timeout=300)
    at.session_state["cache_path"] = cache
    at.run()  # returns once the first slice is on screen; the rest lands on its thread
    said = {"first_run_errors": [e.value for e in at.error],
            "exceptions": [e.value for e in at.exception]}
    boot = resources.bootstrap_of(cache)
    deadline = time.monotonic() + 300
    while boot is not None and boot.running and time.monotonic() < deadline:
        time.sleep(0.5)
    said["bootstrap"] = (None if boot is None else
                         {"running": boot.running, "error": boot.error, "message": boot.message,
                          "slices_done": boot.slices_done, "fraction": boot.fraction})
    at.switch_page("../pages/sources.py").run()
    at.radio(key="src_source").set_value("demo").run()
    at.text_input(key="src_stream").set_value("DemoPg")
    at.selectbox(key="src_dialect").set_value("postgresql")
    at.button(key="src_go").click().run()
    said["sources"] = {"success": [s.value for s in at.success],
                       "errors": [e.value for e in at.error],
                       "exceptions": [e.value for e in at.exception]}
    return said


if __name__ == "__main__":
    what = {"pulls": pulls, "pages": pages}[sys.argv[1]]
    print(json.dumps(what(sys.argv[2]), default=str), flush=True)
