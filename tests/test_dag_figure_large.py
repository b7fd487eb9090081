"""The DAG figure's two ways of drawing bars: SVG bars up to ``CLICKABLE_BARS`` partitions, one
None-separated path per state above (what chromium draws is checked in
``test_browser_dag_large.py``)."""

from __future__ import annotations

import pandas as pd
import pytest

from spark_backend.analysis import dag_layout, figures

T0 = 1_767_603_600 * 10**9


def _nodes(n: int) -> pd.DataFrame:
    """``n`` partitions in a chain of moves, the last one open."""
    parts = pd.DataFrame({
        "token": [f"p{i:05d}" for i in range(n)],
        "parents": [[] if i == 0 else [f"p{i - 1:05d}"] for i in range(n)],
        "start_ns": [T0 + i * 10**9 for i in range(n)],
        "end_ns": [T0 + (i + 1) * 10**9 if i < n - 1 else None for i in range(n)],
        "watermark_ns": [T0 + (i + 1) * 10**9 for i in range(n)],
        "state": ["finished"] * (n - 1) + ["open"], "error": [None] * n,
        "finished": [i < n - 1 for i in range(n)], "stalled": [False] * n,
        "data_change_records": [1] * n, "heartbeats": [1] * n,
    })
    return dag_layout.layout(parts)


@pytest.mark.parametrize("n", [figures.CLICKABLE_BARS, figures.CLICKABLE_BARS + 1])
def test_bars_are_clickable_up_to_the_limit_and_one_path_per_state_above(n):
    nodes = _nodes(n)
    token = nodes["token"].iat[n // 2]
    fig = figures.dag_figure(nodes, dag_layout.edge_segments(nodes, pd.DataFrame(
        {"parent": [], "child": [], "kind": []})), highlight=[token], holder=token)
    by_name = {t.name.split(" (")[0]: t for t in fig.data if t.name}
    drawn = {k: by_name[k] for k in ("finished", "open", "holding back", "selected")
             if k in by_name}
    assert sum(1 for k in ("finished", "open") if k in drawn) == 2
    if n <= figures.CLICKABLE_BARS:
        assert {t.type for t in drawn.values()} == {"bar"}
        assert sum(len(t.y) for k, t in drawn.items() if k != "selected") == n
        assert drawn["selected"].customdata[0][0] == token
    else:
        assert {t.type for t in drawn.values()} == {"scatter"}
        # two points and a gap per partition, every partition on its lane
        lanes = [y for k, t in drawn.items() if k != "selected" for y in t.y if y == y]
        assert len(lanes) == 2 * n
        assert sorted(set(lanes)) == sorted(set(nodes["lane"]))
        assert drawn["selected"].y[0] == nodes["lane"].iat[n // 2]
    assert drawn["holding back"].marker.color == figures.STATUS_COLOUR["holding back"] or (
        drawn["holding back"].line.color == figures.STATUS_COLOUR["holding back"])
    labels = [t for t in fig.data if t.type == "scatter" and t.mode == "text"]
    assert labels and any(token in s for s in labels[0].text)  # named in red


def _span_nodes(span_ns: int, n: int = 4) -> pd.DataFrame:
    """``n`` open roots from T0, each read to ``span_ns`` after it (0: not read yet)."""
    return dag_layout.layout(pd.DataFrame({
        "token": [f"r{i}" for i in range(n)], "parents": [[] for _ in range(n)],
        "start_ns": [T0] * n, "end_ns": [None] * n,
        "watermark_ns": [T0 + span_ns if span_ns else None] * n,
        "state": ["open"] * n, "error": [None] * n, "finished": [False] * n,
        "stalled": [False] * n, "data_change_records": [0] * n, "heartbeats": [0] * n}))


@pytest.mark.parametrize("span_ns", [0, 300_000_000, 3_000_000, 100_000])
def test_a_dag_axis_spans_its_data_and_a_second_when_no_time_was_read(span_ns):
    """Partitions named but not read (a pull stopped after its first query): bars of no width
    on an axis of no width drew nothing; the axis is a second, the bars 1/40 of it and a line
    says why. Data read over a span (3 ms of a small import) fills the axis, down to a
    millisecond, and says nothing."""
    nodes = _span_nodes(span_ns)
    empty = pd.DataFrame({"parent": [], "child": [], "kind": []})
    fig = figures.dag_figure(nodes, dag_layout.edge_segments(nodes, empty))
    lo, hi = (pd.Timestamp(v).value for v in fig.layout.xaxis.range)
    (bars,) = [t for t in fig.data if t.type == "bar"]
    widths_ms = set(bars.x)
    said = [a.text for a in fig.layout.annotations]
    if span_ns:
        assert max(span_ns, 10**6) <= hi - lo <= max(span_ns, 10**6) * 1.01
        assert widths_ms == {span_ns / 1e6} and said == []
    else:
        assert 10**9 <= hi - lo <= 1.1 * 10**9
        assert widths_ms == {25.0}
        assert said == ["No time read yet: each partition is drawn at its start "
                        "(2026-01-05T09:00:00.000000Z); pull again to read them"]


@pytest.mark.parametrize("n", [1, 15, 100])
def test_the_dags_lanes_are_numbered_from_one_at_most_thirty_labels(n):
    parts = pd.DataFrame({
        "token": [f"r{i:03d}" for i in range(n)], "parents": [[] for _ in range(n)],
        "start_ns": [T0] * n, "end_ns": [None] * n, "watermark_ns": [T0 + 10**9] * n,
        "state": ["open"] * n, "error": [None] * n, "finished": [False] * n,
        "stalled": [False] * n, "data_change_records": [1] * n, "heartbeats": [1] * n,
    })
    nodes = dag_layout.layout(parts)
    lanes = int(nodes["lane"].max()) + 1
    fig = figures.dag_figure(nodes, dag_layout.edge_segments(nodes, pd.DataFrame(
        {"parent": [], "child": [], "kind": []})))
    y = fig.layout.yaxis
    assert y.showticklabels is not False and y.ticktext[0] == "1" and y.tickvals[0] == 0
    assert len(y.ticktext) <= 30 and max(y.tickvals) < lanes
    assert [int(t) - 1 for t in y.ticktext] == list(y.tickvals)
    if lanes <= 30:
        assert list(y.tickvals) == list(range(lanes))
