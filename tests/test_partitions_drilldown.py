"""From the stall to the partition: the Watermarks page's Partitions table, the stalled
partition's silence, and the partition carried to the DAG, under AppTest on the demo world
(landed without Spark)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from streamlit.testing.v1 import AppTest

from app import partitions_view
from app.formatting import clock, duration
from spark_backend import analysis
from spark_backend.analysis import stalls
from spark_backend.cache.store import Cache
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED, demo_world

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
STREAM = "DemoStream"


@pytest.fixture(scope="module")
def world():
    return demo_world(DEMO_SEED, DEMO_SCALE)


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory, landed_caches) -> str:
    return landed_caches.copy(tmp_path_factory.mktemp("parts") / "demo.duckdb",
                              DEMO_SEED, DEMO_SCALE)


@pytest.fixture(scope="module")
def truth(demo_cache):
    with Cache(demo_cache) as cache:
        grid = stalls.watermark_replay(cache.con, STREAM)["t_ns"].drop_duplicates()
        return {"parts": analysis.partitions(cache.con, STREAM, 60.0),
                "step_s": float(grid.diff().max()) / 1e9,
                "worst": stalls.worst_stall(cache.con, STREAM, 60.0),
                "table": partitions_view.partitions_table(cache.con, STREAM, 60.0)}


def app(cache: str, page: str, **params: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = cache
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def plain(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def partitions_frame(at: AppTest):
    return next(d.value for d in at.dataframe if "worst lag (s)" in d.value.columns)


def test_the_table_has_one_row_per_partition_with_the_analysis_states(truth, world):
    table, parts = truth["table"], truth["parts"]
    assert sorted(table["token"]) == sorted(p.token for p in world.partitions)
    merged = table.merge(parts, on="token", suffixes=("", "_a"))
    assert len(merged) == len(parts)
    assert (merged["state"] == merged["state_a"]).all()
    assert (merged["stalled"] == merged["stalled_a"]).all()
    assert (merged["lag_now_s"] - merged["lag_s"]).abs().max() < 1e-6
    by_token = parts.set_index("token")
    for row in table.itertuples():
        assert row.parents == len(by_token.loc[row.token, "parents"])
        assert row.children == len(by_token.loc[row.token, "children"])
        assert row.records == by_token.loc[row.token, "data_change_records"]


def test_the_stalled_partition_s_worst_lag_and_silence_are_the_headline_s(truth, world):
    worst, table = truth["worst"], truth["table"]
    token, silent_from, silent_to = world.stall
    assert worst["partition"] == token
    row = table[table["token"] == token].iloc[0]
    # The silence is the stall's: from its last mark before to its next mark after.
    assert (row["gap_from_ns"], row["gap_to_ns"]) == (worst["since_ns"], worst["until_ns"])
    assert row["gap_from_ns"] <= silent_from and row["gap_to_ns"] >= silent_to
    # The table's worst lag is the silence exactly; the headline's is read on the replay's
    # grid, so it is at most one grid step shorter, and says the same in words.
    assert row["worst_lag_s"] == pytest.approx((row["gap_to_ns"] - row["gap_from_ns"]) / 1e9)
    assert 0 <= row["worst_lag_s"] - worst["max_lag_s"] <= truth["step_s"]
    assert duration(row["worst_lag_s"]) == duration(worst["max_lag_s"])
    # It is the partition with the worst lag of all.
    assert table["worst_lag_s"].idxmax() == row.name


def test_the_watermarks_page_lists_the_partitions(demo_cache, world, truth):
    at = app(demo_cache, "watermarks")
    shown = partitions_frame(at)
    assert len(shown) == len(world.partitions)
    token = world.stall[0]
    row = shown[shown["token"] == token].iloc[0]
    assert row["worst lag (s)"] == round(truth["table"].set_index("token")
                                         .loc[token, "worst_lag_s"], 1)
    assert row["partition"] != token and token.startswith(row["partition"].rstrip("…"))
    assert set(shown["state"]) <= {"open", "finished", "stalled"}
    # The state filter and the search narrow it.
    at.multiselect(key="wm_parts_state").set_value(["finished"]).run()
    finished = partitions_frame(at)
    assert len(finished) == int(truth["parts"]["finished"].sum()) > 0
    assert set(finished["state"]) == {"finished"}
    at.multiselect(key="wm_parts_state").set_value([]).run()
    at.text_input(key="wm_parts_search").set_value(token[3:15].lower()).run()
    found = partitions_frame(at)
    assert token in set(found["token"]) and len(found) < len(world.partitions)


def test_the_explain_link_lands_on_the_stalled_partition_s_silence(demo_cache, truth):
    worst = truth["worst"]
    token = worst["partition"]
    # What the Overview's "Explain the worst stall" link opens: partition and moment.
    at = app(demo_cache, "watermarks", partition=token)
    lead = next(plain(m.value) for m in at.markdown if "Worst stall" in m.value)
    since, until = clock(worst["since_ns"]), clock(worst["until_ns"])
    assert f"from {since} to {until} UTC" in lead
    said = next(plain(m.value) for m in at.markdown if "No record or heartbeat" in m.value)
    assert f"No record or heartbeat from {since} to {until} UTC" in said
    assert "after the silence" in said  # its records start after the stall: said so
    charts = list(at.get("plotly_chart"))
    assert any("silent" in c.proto.spec for c in charts), "the silence is shaded and labelled"
    assert any(f"Partition {token}" in plain(m.value) for m in at.markdown)
    # Its parents are buttons that drill into them.
    parent = truth["parts"].set_index("token").loc[token, "parents"][0]
    at.button(key=f"parent-{parent}").click().run()
    assert at.query_params["partition"] in (parent, [parent])


def test_the_stall_button_selects_the_stalled_partition(demo_cache, truth):
    at = app(demo_cache, "watermarks")
    assert not any("No record or heartbeat" in m.value for m in at.markdown)
    at.button(key="wm_explain").click().run()
    assert at.query_params["partition"] in (truth["worst"]["partition"],
                                            [truth["worst"]["partition"]])
    assert any("No record or heartbeat" in m.value for m in at.markdown)


def test_the_partition_travels_to_the_dag(demo_cache, truth):
    token = truth["worst"]["partition"]
    at = app(demo_cache, "watermarks", partition=token)
    link = next(p for p in at.get("page_link") if p.proto.page == "dag")
    params = parse_qs(link.proto.query_string)
    assert params["partition"] == [token] and params["stream"] == [STREAM]
    at = app(demo_cache, "dag", **{k: v[0] for k, v in params.items()})
    assert any(f"Partition {token}" in plain(m.value) for m in at.markdown)
    assert at.selectbox(key=f"dag_pick_{token}").value == token
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    picked = [t for t in spec["data"] if t.get("name") == "selected"]
    assert len(picked) == 1, "the DAG outlines the partition carried in the URL"
    # ... and carries it back to its silence.
    back = next(p for p in at.get("page_link") if p.proto.page == "watermarks")
    assert parse_qs(back.proto.query_string)["partition"] == [token]
    # Its heartbeats say the silence between them.
    beats = next(d.value for d in at.dataframe if "seconds since the previous" in d.value.columns)
    worst = truth["table"].set_index("token").loc[token, "worst_lag_s"]
    assert beats["seconds since the previous"].max() >= round(worst, 1)


def test_an_unknown_partition_is_one_sentence(demo_cache):
    at = app(demo_cache, "watermarks", partition="no-such-token")
    assert [plain(e.value) for e in at.error] == [
        "No partition 'no-such-token' in DemoStream; choose one in the Partitions table."]


def test_none_in_the_dags_list_deselects_the_partition(demo_cache, truth):
    token = truth["worst"]["partition"]
    at = app(demo_cache, "dag", partition=token)
    assert any(f"Partition {token}" in plain(m.value) for m in at.markdown)
    at.selectbox(key=f"dag_pick_{token}").select("(none)").run()
    assert "partition" not in at.query_params
    assert at.session_state["partition"] is None
    assert not any(f"Partition {token}" in plain(m.value) for m in at.markdown)
    assert at.selectbox(key="dag_pick_None").value == "(none)"
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert not [t for t in spec["data"] if t.get("name") == "selected"]
    assert not at.exception and not at.error
