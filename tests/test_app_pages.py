"""Every page under AppTest on the demo cache: what the page shows, checked against the demo
world's ground truth; bad input shows a message in place and the app keeps working.

The demo cache is landed without Spark (``land_world``: the world's recording as record rows,
what a complete demo pull lands); the pull itself, through Spark, is tested in
tests/test_pull_demo.py and here by the Sources page's demo pull (marked slow)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

sys.path.insert(0, str(Path(__file__).parent))
from app import pulling, queries, samples, sql_console
from app.formatting import short
from spark_backend import analysis
from spark_backend.cache.store import Cache
from spark_backend.jobs import files
from spark_backend.model.errors import BadInput
from spark_backend.model.timestamps import format_ns
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED, demo_world

MAIN = str(Path(__file__).resolve().parent.parent / "app" / "main.py")


@pytest.fixture(scope="module")
def world():
    return demo_world(DEMO_SEED, DEMO_SCALE)


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory, landed_caches) -> str:
    """The demo world landed without Spark (a copy of the session's landed cache)."""
    return landed_caches.copy(tmp_path_factory.mktemp("app") / "demo.duckdb", DEMO_SEED,
                              DEMO_SCALE)


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory, landed_caches) -> str:
    """A tenth of the demo world, landed the same way: for checks that need a cache, not its
    size."""
    return landed_caches.copy(tmp_path_factory.mktemp("app") / "small.duckdb", DEMO_SEED, 0.1)


@pytest.fixture(scope="module")
def truth(demo_cache):
    with Cache(demo_cache) as cache:
        return {
            "holder": analysis.holding_back(cache.con, "DemoStream"),
            "parts": analysis.partitions(cache.con, "DemoStream"),
            "replay": queries.watermark_replay(cache.con, "DemoStream", 240),
        }


def app(cache: str, page: str | None = None, **params: str) -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = cache
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    if page:
        at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def plain(text: str) -> str:
    """Markdown as the reader sees it: the pages backslash-escape every value they show."""
    return re.sub(r"\\(.)", r"\1", text).replace("\u200b", "")


def vals(elements) -> list[str]:
    return [plain(e.value) for e in elements]


def texts(at: AppTest) -> str:
    return "\n".join(vals(at.markdown) + vals(at.caption) + vals(at.info) + vals(at.error))


def frames(at: AppTest):
    return [d.value for d in at.dataframe]


def test_overview_shows_the_stream_at_a_glance(demo_cache, world, truth):
    at = app(demo_cache)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Partitions"] == str(len(world.partitions))
    assert metrics["Data change records"] == f"{world.num_data_change_records:,}"
    assert metrics["Transactions"] == f"{len(world.transactions):,}"
    shown = texts(at)
    token, stall_from, stall_to = world.stall
    # The worst stall leads (not the normal lag at the range end), then the state now.
    lead = [m for m in vals(at.markdown) if "Worst stall" in m][0]
    assert short(token, 20) in lead and "recovered" in lead
    assert f"held by partition {short(truth['holder']['partition'], 20)}" in shown
    assert at.title[0].value == "DemoStream"
    assert len(at.get("plotly_chart")) >= 1, "the landing page has a chart"


def test_dag_lists_the_merge_and_drills_into_a_partition(demo_cache, world):
    merge = next(p for p in world.partitions if len(p.parents) >= 2)
    at = app(demo_cache, "dag", partition=merge.token)
    shown = texts(at)
    assert f"Partition {merge.token}" in shown
    edges = frames(at)[0]
    merged = edges[(edges["child"] == merge.token) & (edges["kind"] == "merge")]
    assert sorted(merged["parent"]) == sorted(merge.parents)
    labels = [plain(b.label) for b in at.button]
    for parent in merge.parents:
        assert f"↑ {short(parent, 24)}" in labels
    assert len(at.get("plotly_chart")) == 1
    # A parent button drills into that parent.
    at.button(key=f"parent-{merge.parents[0]}").click().run()
    assert at.query_params["partition"] == merge.parents[0]
    assert f"Partition {merge.parents[0]}" in texts(at)


def test_dag_unknown_partition_is_a_message(demo_cache):
    at = app(demo_cache, "dag", partition="no-such-token")
    assert any("No partition 'no-such-token'" in e for e in vals(at.error))


def test_watermarks_lead_with_the_worst_stall_and_restore_the_moment(demo_cache, world):
    from spark_backend.model.timestamps import format_ns

    token, stall_from, stall_to = world.stall
    at = app(demo_cache, "watermarks")
    lead = [m for m in vals(at.markdown) if "Worst stall" in m][0]
    assert short(token, 20) in lead and "recovered" in lead
    # A shared URL with the moment (mid-stall) opens on it: the stalled partition holds it.
    middle = format_ns((stall_from + stall_to) // 2)
    at = app(demo_cache, "watermarks", at=middle, partition=token)
    assert f"partition {token} held the low watermark" in texts(at)
    assert at.select_slider(key="wm_at").value <= (stall_from + stall_to) // 2 + 20 * 10**9
    # The threshold goes to the URL; the stalled-at-the-moment table lists the stalled one.
    at.number_input(key="stall_60").set_value(30.0).run()
    assert at.query_params["stall"] in ("30", ["30"])
    stalled = [f for f in frames(at) if "lag_s" in f.columns][0]
    assert token in set(stalled["partition"])
    assert list(stalled["lag_s"]) == sorted(stalled["lag_s"], reverse=True)


def test_bad_url_values_are_messages(demo_cache):
    at = app(demo_cache, "watermarks", at="yesterday", stall="-3")
    shown = vals(at.error) + vals(at.sidebar.error)
    assert any("replay moment in the URL" in e for e in shown)
    assert any("stall threshold in the URL" in e for e in shown)


def test_transaction_records_in_order(demo_cache, world):
    txid, info = next((t, i) for t, i in sorted(world.transactions.items())
                      if len(i.partitions) >= 3)
    at = app(demo_cache, "transactions", txn=txid)
    assert f"Transaction {txid}" in vals(at.subheader)
    records = frames(at)[0]
    assert records["record_sequence"].nunique() == info.num_records
    assert set(records["partition"]) == set(info.partitions)
    order = list(zip(records["commit_timestamp"], records["record_sequence"], strict=True))
    assert order == sorted(order)
    side = frames(at)[1]
    assert {"old", "new", "column"} <= set(side.columns)


def test_transaction_filters_and_key_history(demo_cache):
    at = app(demo_cache, "transactions")
    at.selectbox(key="tx_table").set_value("Accounts").run()
    assert not at.exception
    at.text_input(key="hist_key_input").set_value("{not json").run()
    assert any("The key is not JSON" in e for e in vals(at.error))
    at.text_input(key="hist_key_input").set_value('{"AccountId": "acc-0000001"}').run()
    hist = frames(at)[-1]
    assert len(hist) > 0 and (hist["keys"] == '{"AccountId":"acc-0000001"}').all()


def test_records_filters_paging_and_bad_key(demo_cache, world):
    at = app(demo_cache, "records")
    assert f"{world.num_data_change_records:,} rows match" in texts(at)
    assert "rows 1–100" in texts(at)
    # Each row's time is its commit time to the nanosecond, as the cache holds it.
    with Cache(demo_cache) as cache:
        stored = {format_ns(t) for (t,) in cache.con.execute(
            "SELECT epoch_ns(commit_timestamp) FROM data_change_records").fetchall()}
    shown = list(frames(at)[0]["time"])
    assert len(shown) == 100 and set(shown) <= stored
    at.button(key="rec_next").click().run()
    assert "rows 101–200" in texts(at)
    at.toggle(key="rec_hide_hb").set_value(False).run()
    page = frames(at)[0]
    assert "heartbeat" in set(page["kind"]) or "rows 1–100" in texts(at)
    at.text_input(key="rec_key").set_value("[1, 2]").run()
    assert any("A key is a JSON object" in e for e in vals(at.error))


def test_sql_console_runs_and_refuses(demo_cache):
    at = app(demo_cache, "sql")
    assert frames(at), "the default query shows rows"
    at.selectbox(key="sql_ex").set_value("Partitions by state").run()
    states = frames(at)[0]
    assert set(states["state"]) <= {"open", "finished", "pending", "incomplete"}
    shown = [t for t in at.text_area if t.key.startswith("sql_text")][0].value
    assert "WHERE stream = 'DemoStream'" in shown, shown
    at.selectbox(key="sql_ex").set_value("(write your own)").run()
    text = [t for t in at.text_area if t.key.startswith("sql_text")][0]
    text.set_value("DROP TABLE partitions").run()
    at.button(key="sql_run").click().run()
    assert any("read-only" in e for e in vals(at.error))


# The console's refusals and escapes: tests/test_console.py.


def test_sql_console_accepts_plain_queries(small_cache):
    with Cache(small_cache) as cache:
        examples = sql_console.examples(cache.streams()[0])
        for sql in [*examples.values(), "SHOW TABLES", "SUMMARIZE edges",
                    "EXPLAIN SELECT * FROM partitions", "FROM streams"]:
            assert len(sql_console.run(cache.cursor(), sql).frame) > 0, sql


def test_sources_errors_next_to_their_field(demo_cache):
    at = app(demo_cache, "sources")
    listed = frames(at)[0]
    assert "DemoStream" in set(listed["stream"])
    at.text_input(key="src_start").set_value("yesterday")
    at.number_input(key="src_heartbeat").set_value(0)
    at.button(key="src_go").click().run()
    assert not at.exception
    errors = vals(at.error)
    assert any("'yesterday' is not a timestamp" in e for e in errors)
    assert any("The heartbeat must be between 1000 and 300000 ms." in e for e in errors)
    at.radio(key="src_source").set_value("spanner").run()
    at.button(key="src_go").click().run()
    assert any("Cloud Spanner needs the project." in e for e in vals(at.error))


def test_unknown_stream_and_bad_range_keep_working(demo_cache):
    at = app(demo_cache, stream="Nope", start="not-a-time")
    errors = vals(at.sidebar.error)
    assert any("No stream 'Nope'" in e for e in errors)
    assert any("Range start" in e for e in errors)
    assert at.title[0].value == "DemoStream"


def test_unusable_cache_is_a_message(tmp_path):
    bad = tmp_path / "not-a-cache.duckdb"
    bad.write_text("this is not a DuckDB file")
    at = AppTest.from_file(MAIN, default_timeout=60)
    at.session_state["cache_path"] = str(bad)
    at.run()
    assert not at.exception
    assert at.sidebar.error and "not-a-cache.duckdb" in vals(at.sidebar.error)[0]


@pytest.mark.slow  # integration-heavy: five app reruns over the full world, a page a step
def test_walkthrough_steps_highlight_what_they_talk_about(demo_cache, world):
    at = app(demo_cache)
    at.sidebar.toggle[0].set_value(True).run()
    titles = []
    for _ in range(5):
        assert not at.exception
        info = [i for i in vals(at.info) if "Walkthrough" in i]
        assert info, "each step explains itself on its page"
        titles.append(info[0])
        nxt = at.button(key="wt_next")
        if nxt.disabled:
            break
        nxt.click().run()
    joined = "\n".join(titles)
    for title in ("A split", "A merge", "A transaction across partitions",
                  "The stall holding the watermark back"):
        assert title in joined
    assert short(world.stall[0], 20) in titles[-1]


# --- Sources: one-click samples, errors placed by their field, the shared demo server ---------


def fresh_app(tmp_path, page: str = "sources") -> AppTest:
    """An empty cache whose bootstrap (the demo pull) is skipped."""
    at = AppTest.from_file(MAIN, default_timeout=180)
    at.session_state["cache_path"] = str(tmp_path / "fresh.duckdb")
    at.session_state["bootstrapped"] = True
    at.run()
    at.switch_page(f"../pages/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def next_to(at: AppTest, key: str) -> list[str]:
    """The messages drawn right after the widget ``key``, in the same column."""
    for col in at.columns:
        kids = list(col.children.values())
        for i, kid in enumerate(kids):
            if getattr(kid, "key", None) == key:
                out = []
                for after in kids[i + 1:]:
                    if type(after).__name__ != "Error":
                        break
                    out.append(plain(after.value))
                return out
    raise AssertionError(f"no widget {key!r} in a column")


@pytest.mark.slow  # the import runs in Spark
@pytest.mark.parametrize("sample", samples.SAMPLES, ids=[s.key for s in samples.SAMPLES])
def test_sample_button_imports_and_selects_the_stream(tmp_path, sample):
    assert sample.file.is_file(), sample.path
    at = fresh_app(tmp_path)
    at.button(key=sample.key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    with Cache(str(tmp_path / "fresh.duckdb")) as cache:
        landed = cache.con.execute(
            "SELECT (SELECT count(*) FROM data_change_records WHERE stream = $s)"
            " + (SELECT count(*) FROM heartbeats WHERE stream = $s)"
            " + (SELECT count(*) FROM child_partitions_records WHERE stream = $s),"
            " (SELECT count(*) FROM quarantine WHERE stream = $s)", {"s": sample.stream}
        ).fetchone()
        system = cache.con.execute("SELECT system FROM streams WHERE stream = ?",
                                   [sample.stream]).fetchone()
    assert system == (sample.fmt,)
    records, bad = landed
    assert records > 0
    said = vals(at.success)
    counted = f"{records:,} record{'' if records == 1 else 's'}"
    assert any(f"Imported {counted} into {sample.stream}" in m
               and f"{bad} bad line" in m for m in said), said
    # ... and the stream is the one shown.
    assert at.sidebar.selectbox[0].value == sample.stream
    assert not at.warning, [w.value for w in at.warning]
    assert at.query_params["stream"] == [sample.stream] or \
        at.query_params["stream"] == sample.stream
    # Again: the same file adds nothing, and says so.
    at.button(key=sample.key).click().run()
    assert any("Nothing new" in m for m in vals(at.success))


def test_sample_with_a_missing_file_is_a_message(tmp_path, monkeypatch):
    monkeypatch.setattr(samples, "ROOT", tmp_path / "elsewhere")
    at = fresh_app(tmp_path)
    at.button(key=samples.SAMPLES[0].key).click().run()
    assert not at.exception
    assert any("does not exist" in e for e in vals(at.error))


@pytest.mark.slow  # the import runs in Spark
def test_cockroachdb_sample_names_its_table(tmp_path):
    sample = samples.by_key("sample_cockroachdb_diff")
    with Cache(str(tmp_path / "c.duckdb")) as cache:
        outcome = samples.load(cache, sample)
        assert outcome.ok, outcome.message
        tables = cache.con.execute(
            "SELECT DISTINCT table_name FROM data_change_records WHERE stream = ?",
            [sample.stream]).fetchall()
    assert tables == [(sample.options["table"],)]


def test_bad_start_is_shown_next_to_the_start_field(demo_cache):
    at = app(demo_cache, "sources")
    at.text_input(key="src_start").set_value("yesterday")
    at.button(key="src_go").click().run()
    assert not at.exception
    beside = next_to(at, "src_start")
    assert any("'yesterday' is not a timestamp" in e for e in beside), beside
    assert next_to(at, "src_end") == [] and next_to(at, "src_stream") == []


def test_backend_bad_start_lands_by_its_field_before_anything_starts(tmp_path):
    """Unvalidated by the form, the backend's BadInput(field="start") places the message; the
    pull is refused before Spark or a demo server is prepared."""
    prepared = []
    with Cache(str(tmp_path / "c.duckdb")) as cache:
        outcome = pulling.pull(cache, pulling.PullForm(source="demo", start="yesterday"),
                               lambda p: None, prepare=prepared.append)
    assert not outcome.ok and outcome.field == "start"
    assert "'yesterday' is not a timestamp" in outcome.message
    assert prepared == []


def test_the_field_attribute_wins_over_the_words(tmp_path, monkeypatch):
    import spark_backend.jobs.pull as backend

    def refuse(cache, request, progress=None):
        raise BadInput("The heartbeat of this stream does not allow that range.", field="end")

    monkeypatch.setattr(backend, "run_pull", refuse)
    form = pulling.PullForm(source="demo")
    with Cache(str(tmp_path / "c.duckdb")) as cache:
        outcome = pulling.pull(cache, form, lambda p: None)
    assert (outcome.ok, outcome.field) == (False, "end")
    # Without a field the words still place it; a field the form does not show is general.
    assert pulling.error_field(BadInput("The heartbeat is 5 ms."), form) == "heartbeat_ms"
    assert pulling.error_field(BadInput("No such project.", field="project"), form) == "general"
    spanner = pulling.PullForm(source="spanner")
    assert pulling.error_field(BadInput("x", field="project"), spanner) == "project"
    assert pulling.error_field(BadInput("x", field="stream"), spanner) == "source_stream"
    files = pulling.PullForm(source="files")
    assert pulling.error_field(BadInput("x", field="stream"), files) == "stream"


@pytest.mark.slow  # the demo pull runs in Spark
def test_demo_pull_uses_the_shared_demo_server(tmp_path, world):
    from app import resources

    at = fresh_app(tmp_path)
    at.text_input(key="src_stream").set_value("DemoAgain")
    at.button(key="src_go").click().run()
    assert not at.exception, [e.value for e in at.exception]
    said = vals(at.success)
    assert any("Pulled" in m and "DemoAgain" in m for m in said), said + vals(at.error)
    from spark_backend.jobs.pull import serving_address

    server = resources.demo_server(DEMO_SEED, DEMO_SCALE, "googlesql", serving_address())
    assert server.address and server.queries_served > 0
    with Cache(str(tmp_path / "fresh.duckdb")) as cache:
        n = cache.con.execute("SELECT count(*) FROM data_change_records WHERE stream = ?",
                              ["DemoAgain"]).fetchone()[0]
    assert n == world.num_data_change_records


# --- the fixes under AppTest ------------------------------------------------------------


def test_transactions_draw_the_window_of_the_opened_one(demo_cache, world):
    """More transactions than can be drawn: the density over the whole range, and the window
    drawn is the one holding the opened transaction (never a silent cut at the first 3,000)."""
    with Cache(demo_cache) as cache:
        (txid,) = cache.con.execute(
            "SELECT server_transaction_id FROM transactions "
            "WHERE stream = 'DemoStream' AND len(partitions) > 1 "
            "ORDER BY commit_timestamp DESC LIMIT 1 OFFSET 100").fetchone()
    at = app(demo_cache, "transactions", txn=txid)
    at.toggle(key="tx_timeline").set_value(True).run()  # the timeline waits for its toggle
    assert not at.exception, [e.value for e in at.exception]
    said = texts(at)
    assert f"{len(world.transactions):,} transactions in the range" in said
    assert "drawn one by one" in said
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert any(txid in spec for spec in specs), "the opened transaction is on the chart"


def test_records_search_in_values_and_the_stream_s_own_placeholder(demo_cache):
    at = app(demo_cache, "records")
    assert "AccountId" in at.text_input(key="rec_key").placeholder
    at.text_input(key="rec_search").set_value("acc-0000001").run()
    assert not at.exception
    page = frames(at)[0]
    assert len(page) > 0 and list(page.columns[:4]) == ["time", "table_name", "keys", "mod_type"]
    shown = texts(at)
    assert "rows match" in shown


@pytest.mark.parametrize("payload", ["[Your session expired](http://evil.example/)",
                                     "![x](http://evil.example/x.png)", "<b>bold</b>"])
def test_url_values_are_escaped_markdown(demo_cache, payload):
    at = app(demo_cache, "dag", stream=payload, partition=payload)
    raw = [e.value for e in at.sidebar.error] + [e.value for e in at.error]
    assert raw, "a message for each bad value"
    for value in raw:
        assert "](" not in value and "![" not in value, value  # no link or image can form
    assert any(payload in plain(v) for v in raw)


def test_stalls_find_the_demo_s_stall(demo_cache, world):
    from spark_backend.analysis import stalls

    token, silent_from, silent_to = world.stall
    with Cache(demo_cache) as cache:
        worst = stalls.worst_stall(cache.con, "DemoStream", 60.0)
    assert worst["partition"] == token and not worst["ongoing"]
    assert worst["since_ns"] <= silent_from and worst["until_ns"] >= silent_to
    assert worst["max_lag_s"] > (silent_to - silent_from) / 1e9


def test_cloud_spanner_form_needs_no_dialect():
    """The form's dialect is the database's own unless the user overrides it."""
    form = pulling.PullForm(source="spanner", project="p", instance="i", database="d",
                            source_stream="S", start="2026-01-05T09:00:00Z")
    assert form.dialect == "" and "dialect" not in pulling.validate(form)
    assert pulling.request_for(form).source.dialect is None  # asked from the database by the pull
    form.dialect = "postgresql"
    assert pulling.request_for(form).source.dialect == "postgresql"


@pytest.mark.parametrize("error, said", [
    (duckdb.IOException("IO Error: No space left on device"), "is full"),
    (PermissionError(13, "Permission denied", "/srv/in/x.jsonl"),
     "Could not use /srv/in/x.jsonl: Permission denied"),
])
def test_an_import_that_fails_below_the_page_answers_in_a_sentence(tmp_path, monkeypatch,
                                                                   error, said):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(files, "import_files", fail)
    form = pulling.PullForm(source="files", stream="S", file_format="datastream")
    with Cache(tmp_path / "c.duckdb") as cache:
        outcome = pulling.pull(cache, form, lambda p: None)
    assert not outcome.ok and said in outcome.message and "\n" not in outcome.message
