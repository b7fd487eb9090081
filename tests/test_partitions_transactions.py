"""The Transactions page read by default: the widest transactions as a table, one transaction
on labelled partition lanes, the density's lanes named, the metrics saying what they count.
AppTest on the demo world landed without Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app import partitions_transactions
from app.formatting import short
from app.queries import TxnFilter
from spark_backend.cache.store import Cache
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED, demo_world

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def world():
    return demo_world(DEMO_SEED, DEMO_SCALE)


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory, landed_caches) -> str:
    return landed_caches.copy(tmp_path_factory.mktemp("txns") / "demo.duckdb",
                              DEMO_SEED, DEMO_SCALE)


def app(cache: str, **params: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = cache
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    at.switch_page("../pages/transactions.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_widest_are_the_world_s_widest(demo_cache, world):
    with Cache(demo_cache) as cache:
        wide = partitions_transactions.widest(cache.con, "DemoStream", TxnFilter())
    assert len(wide) == partitions_transactions.WIDEST
    widths = sorted((len(i.partitions) for i in world.transactions.values()), reverse=True)
    assert list(wide["partitions"]) == widths[:partitions_transactions.WIDEST]
    for row in wide.itertuples():
        info = world.transactions[row.txid]
        assert row.records == info.num_records and row.partitions == len(info.partitions)


def test_the_page_leads_with_the_widest_table_and_names_its_counts(demo_cache, world):
    at = app(demo_cache)
    table = next(d.value for d in at.dataframe if "transaction" in d.value.columns)
    assert len(table) == partitions_transactions.WIDEST
    first = world.transactions[table["transaction"][0]]
    assert table["partitions seen / expected"][0].startswith(f"{len(first.partitions)} / ")
    labels = [m.label for m in at.metric]
    assert "Transaction × partition pairs seen" in labels
    assert not any(label.startswith("Partitions seen") for label in labels)
    pairs = {m.label: m for m in at.metric}["Transaction × partition pairs seen"]
    expected = sum(len(t.partitions) for t in world.transactions.values())
    assert (pairs.value, pairs.delta) == (f"{expected:,}", f"of {expected:,} expected")
    # The timeline waits for the toggle: nothing of it is queried or drawn before.
    def heatmaps() -> list[dict]:
        specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
        return [sp for sp in specs if any(t.get("type") == "heatmap" for t in sp["data"])]

    assert heatmaps() == []
    at.toggle(key="tx_timeline").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    # The density (more transactions than drawn one by one) names its lanes.
    (heat,) = heatmaps()
    ticks = heat["layout"]["yaxis"]["ticktext"]
    tokens = {p.token for p in world.partitions}
    assert ticks and all(any(t.startswith(short(tok, 8).rstrip("…")) for tok in tokens)
                         for t in (tick.split(" +")[0] for tick in ticks))


def test_an_opened_transaction_is_drawn_on_labelled_partition_lanes(demo_cache, world):
    txid, info = max(sorted(world.transactions.items()), key=lambda kv: len(kv[1].partitions))
    at = app(demo_cache, txn=txid)
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "its records across" in c.proto.spec)
    trace = spec["data"][0]
    assert len(trace["x"]) == info.num_records
    lanes = spec["layout"]["yaxis"]["categoryarray"]
    assert len(lanes) == len(info.partitions)
    assert {lane.split(" (")[0] for lane in lanes} == {short(p, 10) for p in info.partitions}


def test_with_none_opened_the_widest_is_drawn(demo_cache, world):
    at = app(demo_cache)
    with Cache(demo_cache) as cache:
        first = str(partitions_transactions.widest(cache.con, "DemoStream", TxnFilter())
                    ["txid"][0])
    assert any(h.value.endswith(first) and h.value.startswith("The widest transaction")
               for h in at.subheader), [h.value for h in at.subheader]
    spec = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "its records across" in c.proto.spec)
    assert len(spec["data"][0]["x"]) == world.transactions[first].num_records
    assert "txn" not in at.query_params  # shown, not chosen: the URL keeps no transaction
