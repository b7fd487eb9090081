"""Every page under AppTest on every kind of stream the product lands, without Spark: the demo
world, a MUTABLE_KEY_RANGE stream, and a CockroachDB changefeed whose messages carry no times
(the wrapped+diff sample through its own parser). No page raises or shows an error box, and
each page's figures agree with its headline and with the analysis of the same cache.

The samples imported through Spark (the Sources page's buttons) are in test_pages_samples.py.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from streamlit.proto.Metric_pb2 import Metric
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from app import resources, samples
from spark_backend import analysis
from spark_backend.analysis import stalls, systems
from spark_backend.analysis.display import clock
from spark_backend.cache.store import Cache
from spark_backend.demo.world import MUTABLE_KEY_RANGE
from spark_backend.formats import cockroachdb, recording
from spark_backend.model import records
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED, demo_world

MetricDirection = Metric.MetricDirection
MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")
PAGES = ("overview", "dag", "watermarks", "transactions", "records")
MUTABLE = "MutableStream"
UNTIMED = "crdb_untimed"
STREAMS = ("DemoStream", MUTABLE, UNTIMED)


def _land_mutable(cache: Cache, world, stream: str, heartbeat_ms: int = 10_000) -> None:
    """A complete read of a MUTABLE_KEY_RANGE world: its recording lines (the protobuf JSON
    mapping) through the recording format's own parser, landed with ``Cache.ingest``."""
    cache.ensure_stream(stream, system="spanner", source="demo", dialect="googlesql",
                        source_stream=world.stream, heartbeat_ms=heartbeat_ms)
    pull_id = cache.begin_pull(stream, "demo", world.start, world.end, heartbeat_ms)
    rows = []
    for line in world.iter_recording(heartbeat_ms):
        token = line.pop("partition_token")
        rows.append(recording.to_row(line, token))
    for p in world.partitions:
        done = p.end is not None and p.end <= world.end
        rows.append(records.partition_end(
            p.token, "finished" if done else "open", p.end if done else world.end,
            read_from=p.start, **({"end": p.end} if done else {})))
    cache.ingest(stream, pull_id, pa.Table.from_batches([records.to_arrow_batch(rows)]))
    cache.finish_pull(pull_id, "complete", waves=1)


def _land_untimed(cache: Cache, stream: str) -> None:
    """The CockroachDB wrapped+diff sample (no ``updated`` time) through its parser."""
    sample = samples.by_key("sample_cockroachdb_diff")
    rows = list(cockroachdb.parse_file(str(sample.file), dict(sample.options)))
    cache.ensure_stream(stream, system="cockroachdb", source="cockroachdb")
    pull_id = cache.begin_pull(stream, "cockroachdb", None, None, None)
    cache.ingest(stream, pull_id, pa.Table.from_batches([records.to_arrow_batch(rows)]))
    cache.finish_pull(pull_id, "complete", waves=1)


@pytest.fixture(scope="module")
def cache_path(tmp_path_factory, landed_caches) -> str:
    path = landed_caches.copy(tmp_path_factory.mktemp("pages") / "streams.duckdb", DEMO_SEED,
                              DEMO_SCALE)
    with Cache(path) as cache:
        _land_mutable(cache, demo_world(DEMO_SEED, 0.3, MUTABLE_KEY_RANGE), MUTABLE)
        _land_untimed(cache, UNTIMED)
        untimed = cache.con.execute(
            "SELECT count(*), count(commit_timestamp) FROM data_change_records WHERE stream = ?",
            [UNTIMED]).fetchone()
    assert untimed[0] >= 1 and untimed[1] == 0, untimed  # the import really carries no time
    return path


def app(cache: str, page: str = "overview", **params: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = cache
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    if page != "overview":
        at.switch_page(f"../pages/{page}.py").run()
    return at


def plain(text: str) -> str:
    """Markdown as the reader sees it: the pages backslash-escape every value they show."""
    return re.sub(r"\\(.)", r"\1", text).replace("\u200b", "")


def clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [plain(e.value) for e in at.error]


def analysed(path: str, stream: str) -> dict:
    """The analysis of the cache the app has open (one connection per file and process)."""
    con = resources.open_cache(path).cursor()
    try:
        summary = analysis.summary(con, stream)
        replay = stalls.watermark_replay(con, stream)
        return {"summary": summary, "parts": analysis.partitions(con, stream),
                "found": stalls.stalls(con, stream, 60.0, replay),
                "now": stalls.current_state(con, stream, replay),
                "heartbeats": systems.has_heartbeats(con, stream, summary["system"])}
    finally:
        con.close()


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("stream", STREAMS)
def test_every_page_shows_every_stream(cache_path, stream, page):
    at = app(cache_path, page, stream=stream)
    clean(at)
    assert at.title, "the page drew its title"


@pytest.mark.parametrize("stream", STREAMS)
def test_overview_agrees_with_its_headline(cache_path, stream):
    at = app(cache_path, stream=stream)
    clean(at)
    truth = analysed(cache_path, stream)
    metrics = {m.label: m for m in at.metric}
    shown = [plain(m.value) for m in at.markdown]
    assert metrics["Partitions"].value == f"{len(truth['parts']):,}"
    assert metrics["Data change records"].value == \
        f"{truth['summary']['records']['data_change']:,}"
    anomalies = int(metrics["Anomalies"].value.replace(",", ""))
    boxes = [plain(s.value) for s in at.success]
    if truth["heartbeats"]:
        lead = next(m for m in shown if m.startswith("#### "))
        assert ("Worst stall" in lead) == bool(truth["found"])
        if truth["found"]:
            assert anomalies >= 1
            assert not any(b.startswith("No anomaly") for b in boxes), boxes
            table = at.dataframe[0].value
            assert "stall" in set(table["kind"])
        assert metrics["Low watermark (UTC)"].value == clock(truth["now"]["low_ns"])
    else:
        # without heartbeats: freshness words, never stall words
        assert not any("stall" in m.lower().split("not a stall")[0] for m in shown), shown
        assert any(m.startswith(("**Freshness:**", "**No times:**")) for m in shown), shown
    if anomalies == 0:
        assert any(b.startswith("No anomaly") for b in boxes)


def test_the_demo_s_worst_stall_is_an_anomaly_and_the_low_watermark_tile_is_the_sentence_s(
        cache_path):
    at = app(cache_path, stream="DemoStream")
    lead = next(plain(m.value) for m in at.markdown if "Worst stall" in m.value)
    now = next(plain(m.value) for m in at.markdown if m.value.startswith("**Now**"))
    low = re.search(r"the low watermark is (\d\d:\d\d:\d\d) UTC", now).group(1)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Low watermark (UTC)"] == low
    assert "recovered" in lead
    table = at.dataframe[0].value
    stall_rows = table[table["kind"] == "stall"]
    assert len(stall_rows) >= 1
    assert int(metrics["Anomalies"]) == len(table)
    # the tiles' second lines are plain counts: no arrow (direction NONE), no colour change
    for m in at.metric:
        if m.delta:
            assert m.proto.direction == MetricDirection.NONE, m.label


def test_untimed_stream_says_so_on_every_page(cache_path):
    at = app(cache_path, stream=UNTIMED)
    caption = plain(at.caption[0].value)
    assert "no times (the source sent none)" in caption
    assert any("carry no commit times" in plain(m.value) for m in at.markdown)
    dag = app(cache_path, "dag", stream=UNTIMED)
    clean(dag)
    assert len(dag.get("plotly_chart")) == 1
    recs = app(cache_path, "records", stream=UNTIMED)
    clean(recs)
    assert any("1 rows match" in plain(c.value) for c in recs.caption)


def test_records_selection_then_a_search_that_matches_nothing(cache_path):
    at = app(cache_path, "records", stream="DemoStream")
    table = next(d for d in at.dataframe if d.key and d.key.startswith("rec_rows_"))
    at.session_state[table.key] = {"selection": {"rows": [5], "columns": [], "cells": []}}
    at.run()
    clean(at)
    assert any(s.value == "Row detail" for s in at.subheader), "the row was opened"
    at.text_input(key="rec_search").input("no-such-value-anywhere-0x5f3759df").run()
    clean(at)
    assert any("0 rows match" in plain(c.value) for c in at.caption)
    assert not any(s.value == "Row detail" for s in at.subheader)


def test_unknown_partition_in_the_records_url_is_a_sentence(cache_path):
    at = app(cache_path, "records", stream="DemoStream", partition="nope")
    assert not at.exception
    errors = [plain(e.value) for e in at.error]
    assert any("No partition 'nope' in DemoStream" in e for e in errors), errors


@pytest.mark.parametrize("params", [
    {"start": "1969-12-31T23:59:59Z"},
    {"start": "9999-12-31T23:59:59.999999999Z"},
    {"end": "9999-12-31T23:59:59Z"},
    {"start": "0001-01-01T00:00:00Z", "end": "2026-01-05T09:30:00Z"},
], ids=["before-the-epoch", "year-9999-start", "year-9999-end", "year-1"])
@pytest.mark.parametrize("page", PAGES)
def test_url_times_work_or_are_one_sentence(cache_path, page, params):
    at = app(cache_path, page, stream="DemoStream", **params)
    assert not at.exception, [e.value for e in at.exception]
    errors = [plain(e.value) for e in at.error]
    if params.get("start", "").startswith("1969"):
        assert errors == []  # a time before the data: the data from its start
        return
    assert len(errors) == 1, errors
    assert "outside the times the cache can hold" in errors[0]
    assert "1678-01-01T00:00:00Z" in errors[0]
    # the app keeps working: the page drew its title
    assert at.title
