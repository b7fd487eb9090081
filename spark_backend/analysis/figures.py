"""Plotly figures for the pages and the HTML report.

SVG traces only (``go.Bar``, ``go.Scatter``): Streamlit's bundled plotly.js drops WebGL line
traces under software GL, which is what most headless and VM browsers have. One trace per kind
(never one per partition), segments joined with None separators; time axes as UTC datetimes.
The DAG's bars are SVG bars (one element each, clickable) up to ``CLICKABLE_BARS`` partitions and
one thick None-separated line per state above it (one ``<path>`` per state).
Every value shown in a label or hover goes through :func:`app.safe.html`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from .dag_layout import EDGE_KINDS, KEY_RANGE_MOVE, STATUSES
from .display import clock, html, ns_column, parents_text, short, timestamp, to_datetime

STATUS_COLOUR = {"finished": "#9aa0a6", "open": "#1e8e3e", "stalled": "#d93025",
                 "incomplete": "#f29900", "holding back": "#d93025"}
EDGE_COLOUR = {"split": "#1a73e8", "merge": "#9334e6", "move": "#5f6368",
               KEY_RANGE_MOVE: "#e37400"}
HIGHLIGHT = "#fbbc04"
_LEGEND = dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0)
_HALO = ", ".join(f"{x}px {y}px 2px white" for x in (-1, 1) for y in (-1, 1))
MAX_LABELS = 30
# Up to this many partitions every bar is its own SVG bar (hover, click to select); above it the
# bars of a status are one SVG path (a thick line per partition, None-separated), which plotly
# draws as a single <path>: no hover or click per bar, the selection comes from the list.
CLICKABLE_BARS = 3000
# Fixed margins with room for the legend and the axis labels: with plotly's automargin the legend
# above the plot pushes the margin, and plotly draws every trace a second time.
_DAG_MARGIN = dict(l=64, r=10, t=110, b=40, autoexpand=False)
# The narrowest time axis the DAG draws: a cache whose partitions were named but not read yet
# (a pull stopped after its first query) has bars that start and end at one instant, which on
# an axis of no width plotly draws as nothing. Data that spans a few milliseconds (a small
# import) keeps its own span, down to a millisecond: plotly's dates resolve little finer, and
# a second's axis would draw it as a sliver.
_DAG_MIN_SPAN_NS = 1_000_000_000
_DAG_MIN_READ_SPAN_NS = 1_000_000


def _dt(ns: pd.Series) -> list:
    return list(ns_column(ns))


def _ms(ns: Any) -> np.ndarray:
    """Nanoseconds -> milliseconds since the epoch (floats): what a date axis takes fastest."""
    return np.asarray(ns, dtype="float64") / 1e6


def _seg_arrays(x0: Any, y0: Any, x1: Any, y1: Any) -> tuple[np.ndarray, np.ndarray]:
    """Segments as one polyline with NaN gaps (x in ms), built without a Python loop."""
    n = len(x0)
    xs = np.full(3 * n, np.nan)
    ys = np.full(3 * n, np.nan)
    xs[0::3], xs[1::3] = _ms(x0), _ms(x1)
    ys[0::3], ys[1::3] = np.asarray(y0, dtype="float64"), np.asarray(y1, dtype="float64")
    return xs, ys


# --- the partition DAG -----------------------------------------------------------------------

_DAG_HOVER = ("<b>%{customdata[1]}</b><br>state: %{customdata[8]}<br>parents: %{customdata[2]}"
              "<br>start: %{customdata[3]}<br>end: %{customdata[4]}"
              "<br>watermark: %{customdata[5]}<br>data change records: %{customdata[6]}"
              "<br>heartbeats: %{customdata[7]}<extra></extra>")


def stall_marks(found: Sequence[dict]) -> tuple[dict[str, str], list[tuple[str, int, int]]]:
    """``notes`` and ``spans`` for ``dag_figure``: the worst of ``found`` (stalls, worst first)
    labelled with when it was silent and its silence drawn on its bar; none without a stall."""
    if not found:
        return {}, []
    w = found[0]
    until = w["until_ns"] or w["last_ns"]
    note = f"silent {clock(w['since_ns'])}–" + ("now" if w["ongoing"] else f"{clock(until)} UTC")
    return {w["partition"]: note}, [(w["partition"], w["since_ns"], until)]


def dag_figure(nodes: pd.DataFrame, segments: pd.DataFrame, highlight: Sequence[str] = (),
               holder: str | None = None, notes: dict[str, str] | None = None,
               spans: Sequence[tuple[str, int, int]] = (), height: int | None = None
               ) -> go.Figure:
    """Partitions as bars on their lanes from start to end (or watermark), edges parent ->
    child coloured by kind; the partition holding the stream back and stalled partitions in red
    with their names; ``highlight`` outlined (the rest stays as it is).

    Every bar is clickable: its point's ``customdata[0]`` is the partition token.
    """
    fig = go.Figure()
    if nodes.empty:
        return fig.update_layout(height=240)
    lo, hi = int(nodes["x0_ns"].min()), int(nodes["x1_ns"].max())
    untimed = "timed" in nodes.columns and not nodes["timed"].any()
    unread = hi == lo  # no partition has a time after its start yet
    least = _DAG_MIN_SPAN_NS if unread else _DAG_MIN_READ_SPAN_NS
    narrow = hi - lo < least
    if narrow:
        hi = lo + least
    # unread: each bar 1/40 of the axis from its start, with a line saying why
    min_w = max(1, (hi - lo) // (40 if unread else 400))
    df = nodes.assign(kind=nodes["status"])
    if holder is not None:
        df.loc[df["token"] == holder, "kind"] = "holding back"
    _dag_edges(fig, segments)
    lanes = int(df["lane"].max()) + 1
    height = height or max(360, min(1400, 110 + lanes * 18))
    clickable = len(df) <= CLICKABLE_BARS
    thick = max(1.0, 0.7 * (height - _DAG_MARGIN["t"] - _DAG_MARGIN["b"]) / lanes)
    for kind in (*STATUSES, "holding back"):
        part = df[df["kind"] == kind]
        if part.empty:
            continue
        name = f"{kind} ({len(part)})"
        fig.add_trace(_bars(part, min_w, name=name, colour=STATUS_COLOUR[kind]) if clickable
                      else _line_bars(part, min_w, name, STATUS_COLOUR[kind], thick))
    picked = df[df["token"].isin(list(highlight))]
    if not picked.empty:
        fig.add_trace(_bars(picked, min_w, name="selected", colour="rgba(0,0,0,0)",
                            outline=HIGHLIGHT) if clickable
                      else _line_bars(picked, min_w, "selected", HIGHLIGHT, max(thick, 4.0)))
    _dag_spans(fig, df, spans, min_w)
    _dag_labels(fig, df, notes)
    # The axis spans the data: names end at their bar's end, inside it (no padding past the
    # last time the data holds).
    fig.update_xaxes(range=[to_datetime(lo - min_w if narrow else lo), to_datetime(hi)])
    _dag_axis_note(fig, lo, untimed=untimed, unread=unread)
    fig.update_layout(
        height=height, barmode="overlay",
        margin=_DAG_MARGIN, legend=_LEGEND, clickmode="event+select",
        dragmode="zoom", hovermode="closest", bargap=0.25,
        xaxis=dict(title=None, type="date"),
        # lane 0 on top; a fixed range (no autorange padding around the thick lines)
        yaxis=dict(title="partition lane", range=[lanes - 0.5, -0.5], zeroline=False,
                   showgrid=False, fixedrange=True, **_lane_ticks(lanes)),
    )
    return fig


def _dag_edges(fig: go.Figure, segments: pd.DataFrame) -> None:
    """One line trace per edge kind that has segments."""
    for kind in (*EDGE_KINDS, KEY_RANGE_MOVE):
        seg = segments[segments["kind"] == kind]
        if seg.empty:
            continue
        xs, ys = _seg_arrays(seg["x0_ns"], seg["y0"], seg["x1_ns"], seg["y1"])
        dash = "dot" if kind == KEY_RANGE_MOVE else None
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=f"{kind} ({len(seg)})",
                                 line=dict(color=EDGE_COLOUR[kind], width=1.4, dash=dash),
                                 hoverinfo="skip", legendgroup="edges",
                                 legendgrouptitle_text="edges"))


def _dag_spans(fig: go.Figure, df: pd.DataFrame, spans: Sequence[tuple[str, int, int]],
               min_w: int) -> None:
    """The stretches a partition went silent (the worst stall), red on its bar."""
    lane_of = dict(zip(df["token"], df["lane"], strict=True))
    known = [(t, a, b) for t, a, b in spans if t in lane_of]
    if not known:
        return
    fig.add_trace(go.Bar(
        orientation="h", y=[lane_of[t] for t, _, _ in known],
        x=[max(min_w, b - a) / 1e6 for _, a, b in known],
        base=[to_datetime(a) for _, a, _ in known], width=0.35, name="silent (stall)",
        marker=dict(color="#d93025"), hoverinfo="skip",
        selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1))))


def _dag_labels(fig: go.Figure, df: pd.DataFrame, notes: dict[str, str] | None) -> None:
    """Names (with a note) at the end of the noted, stalled and holding-back bars."""
    notes = dict(notes or {})
    for t, k in zip(df["token"], df["kind"], strict=True):
        if k in ("stalled", "holding back") and t not in notes:
            notes[t] = "holding the stream back" if k == "holding back" else "stalled"
    labelled = df[df["token"].isin(list(notes))].head(MAX_LABELS)
    if labelled.empty:
        return
    fig.add_trace(go.Scatter(
        x=_dt(labelled["x1_ns"]), y=labelled["lane"], mode="text", showlegend=False,
        text=[f" {html(short(t, 10))} ({html(notes[t])})" for t in labelled["token"]],
        # Drawn over the bar's own colour: a white halo keeps the name readable on it.
        textposition="middle left",
        textfont=dict(color="#a50e0e", size=12, weight="bold", shadow=_HALO),
        hoverinfo="skip", cliponaxis=False))


def _dag_axis_note(fig: go.Figure, lo: int, *, untimed: bool, unread: bool) -> None:
    """Say why the time axis is missing (no times at all) or flat (none read yet)."""
    if not (untimed or unread):
        return
    text = ("These records carry no times (the source sent none): the partitions are drawn "
            "without a time axis" if untimed else
            f"No time read yet: each partition is drawn at its start ({timestamp(lo)}); "
            "pull again to read them")
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=13, color="#5f6368"), bgcolor="rgba(255,255,255,0.8)")
    if untimed:
        fig.update_xaxes(showticklabels=False)


def _lane_ticks(lanes: int, most: int = 30) -> dict:
    """Lane numbers from 1 down the DAG's left edge, at most ``most`` of them."""
    step = max(1, -(-lanes // most))
    vals = list(range(0, lanes, step))
    return dict(tickmode="array", tickvals=vals, ticktext=[str(v + 1) for v in vals],
                tickfont=dict(size=10, color="#5f6368"))


def _bars(part: pd.DataFrame, min_w: int, name: str, colour: str,
          outline: str | None = None) -> go.Bar:
    width_ns = np.maximum(part["x1_ns"].to_numpy("int64") - part["x0_ns"].to_numpy("int64"),
                          min_w)
    return go.Bar(
        orientation="h", y=part["lane"].to_numpy(), x=width_ns / 1e6,
        base=_ms(part["x0_ns"]), width=0.7,
        name=name, marker=dict(color=colour, line=dict(color=outline or colour,
                                                       width=3 if outline else 0)),
        selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1)),
        customdata=_dag_customdata(part), hovertemplate=_DAG_HOVER,
        legendgroup="partitions", legendgrouptitle_text="partitions",
    )


def _line_bars(part: pd.DataFrame, min_w: int, name: str, colour: str, thick: float
               ) -> go.Scatter:
    """Bars as one polyline: a segment per partition on its lane, ``thick`` pixels wide."""
    x0 = part["x0_ns"].to_numpy("int64")
    x1 = np.maximum(part["x1_ns"].to_numpy("int64"), x0 + min_w)
    lane = part["lane"].to_numpy()
    xs, ys = _seg_arrays(x0, lane, x1, lane)
    return go.Scatter(x=xs, y=ys, mode="lines", name=name, hoverinfo="skip",
                      line=dict(color=colour, width=thick), legendgroup="partitions",
                      legendgrouptitle_text="partitions")


def _dag_customdata(part: pd.DataFrame) -> np.ndarray:
    def text(col: str, missing: str = "-") -> list[str]:
        return [missing if pd.isna(v) else timestamp(v) for v in part[col]]

    return np.array([
        part["token"].to_numpy(object), [html(t) for t in part["token"]],
        [html(parents_text(p)) for p in part["parents"]], text("start_ns"),
        text("end_ns", "(open)"), text("watermark_ns"),
        part["data_change_records"].fillna(0).astype(int).to_numpy(),
        part["heartbeats"].fillna(0).astype(int).to_numpy(), part["status"].to_numpy(object),
    ], dtype=object).T


# --- lag over time ---------------------------------------------------------------------------


def lag_over_time_figure(lag: pd.DataFrame, low: pd.DataFrame, threshold_s: float,
                         total: int, stall: dict | None = None, at_ns: int | None = None,
                         highlight: str | None = None) -> go.Figure:
    """Each shown partition's lag behind the frontier over time (thin), the low watermark's
    (thick), the threshold, the worst stall shaded, the replay moment as a line.

    Times go to plotly as milliseconds since the epoch on a date axis, and the threshold, the
    stall and the moment as plain layout shapes: plotly's ``add_hline``/``add_vrect`` and
    per-point datetimes cost more than the rest of the page."""
    fig = go.Figure()
    red = highlight or (stall or {}).get("partition")
    others = lag[lag["partition"] != red].sort_values(["partition", "t_ns"], kind="stable")
    # one polyline with a NaN gap after each partition: lines within a partition only
    ends = others["partition"].ne(others["partition"].shift(-1)).to_numpy()
    pos = np.arange(len(others)) + np.concatenate([[0], np.cumsum(ends)[:-1]]).astype(int)
    xs = np.full(len(others) + int(ends.sum()), np.nan)
    ys = np.full_like(xs, np.nan)
    xs[pos], ys[pos] = _ms(others["t_ns"]), others["lag_s"].to_numpy(dtype="float64")
    shown = lag["partition"].nunique()
    fig.add_trace(go.Scatter(
        x=xs, y=ys, mode="lines", line=dict(color="rgba(26,115,232,0.45)", width=1),
        name=f"partitions ({shown} that lagged most of {total})", hoverinfo="skip",
        connectgaps=False))
    if red is not None:
        mine = lag[lag["partition"] == red]
        if not mine.empty:
            fig.add_trace(go.Scatter(
                x=_ms(mine["t_ns"]), y=mine["lag_s"].to_numpy(dtype="float64"), mode="lines",
                name=f"partition {html(short(red, 16))}", line=dict(color="#d93025", width=2.5),
                hovertemplate="%{x}<br>lag %{y:.1f}s<extra></extra>"))
    fig.add_trace(go.Scatter(
        x=_ms(low["t_ns"]), y=low["held_s"].to_numpy(dtype="float64"), mode="lines",
        name="low watermark", line=dict(color="#202124", width=2, dash="dash"),
        customdata=[[html(short(h, 16))] for h in low["holder"]],
        hovertemplate="%{x}<br>low watermark %{y:.1f}s behind<br>held by %{customdata[0]}"
                      "<extra></extra>"))
    shapes: list[dict] = [dict(type="line", xref="x domain", x0=0, x1=1, yref="y",
                               y0=threshold_s, y1=threshold_s,
                               line=dict(color="#f29900", dash="dot", width=1))]
    if stall is not None:
        x1 = stall["until_ns"] if stall["until_ns"] is not None else stall["last_ns"]
        shapes.append(dict(type="rect", xref="x", x0=float(_ms(stall["since_ns"])),
                           x1=float(_ms(x1)), yref="y domain", y0=0, y1=1,
                           fillcolor="#d93025", opacity=0.08, line_width=0))
    if at_ns is not None:
        shapes.append(dict(type="line", xref="x", x0=float(_ms(at_ns)), x1=float(_ms(at_ns)),
                           yref="y domain", y0=0, y1=1,
                           line=dict(color="#1a73e8", width=1.5)))
    fig.update_layout(height=380, margin=dict(l=10, r=10, t=50, b=10), legend=_LEGEND,
                      hovermode="closest", xaxis=dict(title=None, type="date"),
                      yaxis=dict(title="lag behind the frontier (s)", rangemode="tozero"),
                      shapes=shapes,
                      annotations=[dict(text=f"stall threshold {threshold_s:g}s",
                                        xref="x domain", x=0, xanchor="left", yref="y",
                                        y=threshold_s, yanchor="bottom", showarrow=False)])
    return fig


def lag_figure(lag: pd.DataFrame, threshold_s: float, top: int = 40) -> go.Figure:
    """Lag behind the moment shown, worst partitions first; bars past the threshold in red."""
    lag = lag.head(top)
    colours = ["#d93025" if v > threshold_s else "#1e8e3e" for v in lag["lag_s"]]
    fig = go.Figure(go.Bar(x=lag["lag_s"], y=[html(short(t)) for t in lag["partition"]],
                           orientation="h", marker_color=colours,
                           customdata=[[html(t)] for t in lag["partition"]],
                           hovertemplate="%{customdata[0]}<br>%{x:.1f}s<extra></extra>"))
    fig.update_layout(height=max(240, 22 * len(lag) + 60), margin=dict(l=10, r=10, t=10, b=10),
                      shapes=[dict(type="line", xref="x", x0=threshold_s, x1=threshold_s,
                                   yref="y domain", y0=0, y1=1,
                                   line=dict(color="#202124", dash="dot"))],
                      xaxis_title="lag (s)", yaxis=dict(autorange="reversed"))
    return fig


# --- transactions ----------------------------------------------------------------------------


def txn_figure(points: pd.DataFrame, lanes: dict[str, int], selected: str | None = None
               ) -> go.Figure:
    """Transactions across partitions: a dot per (transaction, partition), joined per txn."""
    fig = go.Figure()
    if points.empty:
        return fig.update_layout(height=300)
    df = points.assign(y=points["partition"].map(lanes).fillna(-1).astype(int),
                       x=ns_column(points["commit_ns"]))
    multi = df[df.groupby("txid")["partition"].transform("count") > 1].sort_values(["txid", "y"])
    if not multi.empty:
        # one None row after each transaction's points: lines within a txn, gaps between
        ends = multi["txid"].ne(multi["txid"].shift(-1)).to_numpy()
        xs = np.empty(len(multi) + int(ends.sum()), dtype=object)
        ys = np.empty_like(xs)
        pos = np.arange(len(multi)) + np.concatenate([[0], np.cumsum(ends)[:-1]])
        xs[pos], ys[pos] = multi["x"].to_numpy(object), multi["y"].to_numpy(object)
        gaps = pos[ends] + 1
        xs[gaps], ys[gaps] = None, None
        fig.add_trace(go.Scatter(x=list(xs), y=list(ys), mode="lines", name="across partitions",
                                 line=dict(color="rgba(26,115,232,0.35)", width=1),
                                 hoverinfo="skip"))
    complete = (df.groupby("txid")["records"].transform("sum") == df["records_expected"])
    for name, part, colour in (("complete", df[complete], "#1a73e8"),
                               ("incomplete", df[~complete], "#d93025")):
        if part.empty:
            continue
        fig.add_trace(go.Scatter(
            x=part["x"], y=part["y"], mode="markers", name=f"{name} ({part['txid'].nunique()})",
            marker=dict(color=colour, size=7),
            selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1)),
            customdata=np.column_stack([
                part["txid"].to_numpy(object),
                [html(t) for t in part["txid"]], [html(short(p)) for p in part["partition"]],
                part["records"].to_numpy(), part["records_expected"].to_numpy(),
                [html(t) if isinstance(t, str) else "" for t in part["tag"]]]),
            hovertemplate=("txn %{customdata[1]}<br>partition %{customdata[2]}<br>"
                           "%{customdata[3]} of %{customdata[4]} records<br>%{customdata[5]}"
                           "<br>%{x}<extra></extra>"),
        ))
    if selected is not None:
        mine = df[df["txid"] == selected]
        fig.add_trace(go.Scatter(
            x=mine["x"], y=mine["y"], mode="lines+markers", name="opened",
            marker=dict(size=15, color="rgba(0,0,0,0)", line=dict(color=HIGHLIGHT, width=3)),
            line=dict(color=HIGHLIGHT, width=3), hoverinfo="skip",
        ))
    fig.update_layout(height=max(320, min(900, 80 + 14 * (max(lanes.values(), default=0) + 1))),
                      margin=dict(l=10, r=10, t=40, b=10), legend=_LEGEND,
                      clickmode="event+select", dragmode="zoom", hovermode="closest",
                      xaxis=dict(title="commit time", type="date"),
                      yaxis=dict(title="partition lane", showticklabels=False,
                                 autorange="reversed", fixedrange=True))
    return fig


def txn_density_figure(density: pd.DataFrame, lanes: dict[str, int],
                       window: tuple[int, int] | None = None) -> go.Figure:
    """Transactions per (time bucket x partition lane), when there are too many to draw."""
    fig = go.Figure()
    if density.empty:
        return fig.update_layout(height=300)
    df = density.assign(y=density["partition"].map(lanes).fillna(-1).astype(int))
    grid = df.groupby(["y", "bucket_ns"])["transactions"].sum().unstack(fill_value=0)
    fig.add_trace(go.Heatmap(
        z=grid.to_numpy(), x=_dt(pd.Series(grid.columns)), y=list(grid.index),
        colorscale="Blues", colorbar=dict(title="txns"),
        hovertemplate="%{x}<br>lane %{y}<br>%{z} transactions<extra></extra>"))
    if window is not None:
        fig.add_vrect(x0=to_datetime(window[0]), x1=to_datetime(window[1]),
                      line=dict(color=HIGHLIGHT, width=3), fillcolor="rgba(0,0,0,0)")
    fig.update_layout(height=max(260, min(600, 80 + 12 * (len(grid.index) + 1))),
                      margin=dict(l=10, r=10, t=30, b=10),
                      xaxis=dict(title="commit time", type="date"),
                      yaxis=dict(title="partition lane", showticklabels=False,
                                 autorange="reversed"))
    return fig


def txn_count_figure(buckets: pd.DataFrame, window: tuple[int, int] | None = None) -> go.Figure:
    """Transactions per time bucket over the whole range; the window drawn above shaded."""
    fig = go.Figure(go.Bar(x=_dt(buckets["bucket_ns"]), y=buckets["transactions"],
                           marker_color="#1a73e8",
                           hovertemplate="%{x}<br>%{y} transactions<extra></extra>"))
    if window is not None:
        fig.add_vrect(x0=to_datetime(window[0]), x1=to_datetime(window[1]),
                      fillcolor=HIGHLIGHT, opacity=0.25, line_width=0)
    fig.update_layout(height=160, margin=dict(l=10, r=10, t=10, b=10), bargap=0,
                      xaxis=dict(type="date"), yaxis=dict(title="txns"))
    return fig


def freshness_figure(events: pd.DataFrame) -> go.Figure:
    """Systems without heartbeats: each change's delay from the source to the reader (lag_s)
    over the time it was read, one colour per table."""
    fig = go.Figure()
    for table, part in events.groupby("table_name", sort=True):
        fig.add_trace(go.Scatter(
            x=_dt(part["read_ns"]), y=part["lag_s"], mode="markers", name=html(table),
            hovertemplate="read %{x}<br>%{y:.1f}s after the change<extra></extra>"))
    fig.update_layout(height=320, margin=dict(l=10, r=10, t=30, b=10), legend=_LEGEND,
                      xaxis=dict(title="read at (UTC)", type="date"),
                      yaxis=dict(title="delay from the source (s)", rangemode="tozero"))
    return fig
