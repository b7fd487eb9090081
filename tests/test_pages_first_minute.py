"""The first minute: an empty cache pulls the demo world in slices (``app.bootstrap``, Spark
and the demo server for real); once every slice has landed, the Overview says exactly what it
says after a restart on the same cache, and what the whole hour holds."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from app import resources
from spark_backend.demo.world import build_world
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED
from tests.test_pages_streams import MAIN, clean, plain

pytestmark = pytest.mark.slow


def overview_shown(at: AppTest) -> dict:
    """What the Overview shows, as the reader sees it."""
    return {
        "title": [t.value for t in at.title],
        "caption": [plain(c.value) for c in at.caption],
        "markdown": [plain(m.value) for m in at.markdown],
        "metrics": [(m.label, m.value, m.delta) for m in at.metric],
        "anomalies": [d.value.to_dict("records") for d in at.dataframe],
        "success": [plain(s.value) for s in at.success],
    }


def test_overview_after_the_first_minute_equals_the_overview_after_a_restart(tmp_path):
    path = str(tmp_path / "first.duckdb")
    at = AppTest.from_file(MAIN, default_timeout=900)
    at.session_state["cache_path"] = path
    at.run()  # starts the bootstrap, waits for its first slice, opens the Overview
    clean(at)
    boot = resources.bootstrap_of(path)
    assert boot is not None and boot.slices_done >= 1, boot
    assert at.title and at.title[0].value == boot.stream
    boot._thread.join()  # the bootstrap's own thread: done when every slice has landed
    assert boot.error is None, boot.error
    at.run()
    clean(at)
    after_first_minute = overview_shown(at)

    st.cache_data.clear()  # a restarted server has no cached query results
    restarted = AppTest.from_file(MAIN, default_timeout=300)
    restarted.session_state["cache_path"] = path
    restarted.run()
    clean(restarted)
    assert overview_shown(restarted) == after_first_minute

    world = build_world(DEMO_SEED, DEMO_SCALE)
    metrics = {label: value for label, value, _ in after_first_minute["metrics"]}
    assert metrics["Partitions"] == f"{len(world.partitions):,}"
    assert metrics["Data change records"] == f"{world.num_data_change_records:,}"
    assert "→ 10:00:00 UTC" in after_first_minute["caption"][0]
    lead = next(m for m in after_first_minute["markdown"] if m.startswith("#### "))
    if "Worst stall" in lead:
        assert int(metrics["Anomalies"]) >= 1
