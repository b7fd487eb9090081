"""Plotly figures for the pages. WebGL traces, one trace per kind (never one per partition),
segments joined with None separators; time axes as UTC datetimes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from .dag_layout import EDGE_KINDS, STATUSES
from .formatting import ns_column, parents_text, short, timestamp, to_datetime

STATUS_COLOUR = {"finished": "#5f6368", "open": "#1e8e3e", "stalled": "#d93025",
                 "incomplete": "#f29900"}
EDGE_COLOUR = {"split": "#1a73e8", "merge": "#9334e6", "move": "#80868b"}
HIGHLIGHT = "#fbbc04"
_LEGEND = dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0)


def _segments(x0: Iterable, y0: Iterable, x1: Iterable, y1: Iterable) -> tuple[list, list]:
    xs: list[Any] = []
    ys: list[Any] = []
    for a, b, c, d in zip(x0, y0, x1, y1, strict=True):
        xs += [a, c, None]
        ys += [b, d, None]
    return xs, ys


def _dt(ns: pd.Series) -> list:
    return list(ns_column(ns))


# --- the partition DAG -----------------------------------------------------------------------

_DAG_HOVER = ("<b>%{customdata[0]}</b><br>state: %{customdata[7]}<br>parents: %{customdata[1]}"
              "<br>start: %{customdata[2]}<br>end: %{customdata[3]}"
              "<br>watermark: %{customdata[4]}<br>data change records: %{customdata[5]}"
              "<br>heartbeats: %{customdata[6]}<extra></extra>")


def dag_figure(nodes: pd.DataFrame, segments: pd.DataFrame,
               highlight: Sequence[str] = (), height: int | None = None) -> go.Figure:
    """Partitions as bars on their lanes, edges parent -> child coloured by kind."""
    fig = go.Figure()
    for kind in EDGE_KINDS:
        seg = segments[segments["kind"] == kind]
        if seg.empty:
            continue
        xs, ys = _segments(_dt(seg["x0_ns"]), seg["y0"], _dt(seg["x1_ns"]), seg["y1"])
        fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name=f"{kind} ({len(seg)})",
                                   line=dict(color=EDGE_COLOUR[kind], width=1.5),
                                   hoverinfo="skip", legendgroup="edges",
                                   legendgrouptitle_text="edges"))
    for state in STATUSES:
        part = nodes[nodes["status"] == state]
        if part.empty:
            continue
        xs, ys = _segments(_dt(part["x0_ns"]), part["lane"], _dt(part["x1_ns"]), part["lane"])
        fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                   line=dict(color=STATUS_COLOUR[state], width=6),
                                   legendgroup=state))
        fig.add_trace(go.Scattergl(
            x=_dt(part["x0_ns"]), y=part["lane"], mode="markers",
            name=f"{state} ({len(part)})", legendgroup=state, legendgrouptitle_text="partitions",
            marker=dict(color=STATUS_COLOUR[state], size=9,
                        symbol="x" if state == "stalled" else "circle",
                        line=dict(color="white", width=1)),
            customdata=_dag_customdata(part), hovertemplate=_DAG_HOVER,
        ))
    picked = nodes[nodes["token"].isin(list(highlight))]
    if not picked.empty:
        fig.add_trace(go.Scattergl(
            x=_dt(picked["x0_ns"]), y=picked["lane"], mode="markers", name="selected",
            marker=dict(size=18, color="rgba(0,0,0,0)", line=dict(color=HIGHLIGHT, width=3)),
            customdata=_dag_customdata(picked), hovertemplate=_DAG_HOVER,
        ))
    lanes = int(nodes["lane"].max()) + 1 if not nodes.empty else 1
    fig.update_layout(
        height=height or max(360, min(1400, 90 + lanes * 16)),
        margin=dict(l=10, r=10, t=40, b=10), legend=_LEGEND, clickmode="event+select",
        dragmode="pan", xaxis=dict(title=None, type="date"),
        yaxis=dict(title="partition lane", showticklabels=False, autorange="reversed",
                   zeroline=False, showgrid=False),
        uirevision="dag",
    )
    return fig


def _dag_customdata(part: pd.DataFrame) -> list[list[Any]]:
    return [
        [r.token, parents_text(r.parents), timestamp(r.start_ns),
         timestamp(r.end_ns) if not pd.isna(r.end_ns) else "(open)", timestamp(r.watermark_ns),
         int(r.data_change_records), int(r.heartbeats), r.status]
        for r in part.itertuples()
    ]


# --- watermarks ------------------------------------------------------------------------------


def watermark_figure(replay: pd.DataFrame, low: pd.DataFrame, at_ns: int | None = None,
                     highlight: str | None = None, gaps: pd.DataFrame | None = None,
                     max_gaps: int = 40) -> go.Figure:
    """Each partition's watermark (y) over time (x), the low watermark, the holder highlighted."""
    fig = go.Figure()
    shown = replay if at_ns is None else replay[replay["t_ns"] <= at_ns]
    xs: list[Any] = []
    ys: list[Any] = []
    for _, group in shown.groupby("partition", sort=True):
        xs += _dt(group["t_ns"]) + [None]
        ys += _dt(group["watermark_ns"]) + [None]
    fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name="partition watermarks",
                               line=dict(color="rgba(95,99,104,0.45)", width=1),
                               hoverinfo="skip"))
    low_shown = low if at_ns is None else low[low["t_ns"] <= at_ns]
    fig.add_trace(go.Scattergl(
        x=_dt(low_shown["t_ns"]), y=_dt(low_shown["low_ns"]), mode="lines",
        name="low watermark", line=dict(color="#202124", width=2, dash="dash"),
        customdata=list(zip(low_shown["holder"], strict=True)),
        hovertemplate="%{x}<br>low watermark %{y}<br>held by %{customdata[0]}<extra></extra>",
    ))
    if highlight:
        mine = shown[shown["partition"] == highlight]
        fig.add_trace(go.Scattergl(
            x=_dt(mine["t_ns"]), y=_dt(mine["watermark_ns"]), mode="lines+markers",
            name=f"holding back: {short(highlight)}", line=dict(color="#d93025", width=3),
            marker=dict(size=4), hovertemplate=f"{highlight}<br>%{{y}}<extra></extra>",
        ))
    for gap in (gaps.head(max_gaps).itertuples() if gaps is not None else ()):
        fig.add_vrect(x0=to_datetime(gap.from_ns), x1=to_datetime(gap.to_ns),
                      fillcolor="#fbbc04", opacity=0.15, line_width=0)
    if at_ns is not None:
        fig.add_vline(x=to_datetime(at_ns), line=dict(color="#1a73e8", width=1))
    fig.update_layout(height=460, margin=dict(l=10, r=10, t=40, b=10), legend=_LEGEND,
                      xaxis=dict(title="time", type="date"),
                      yaxis=dict(title="watermark", type="date"), uirevision="wm")
    return fig


def lag_figure(lag: pd.DataFrame, threshold_s: float, top: int = 40) -> go.Figure:
    """Lag behind the moment shown, worst partitions first; bars past the threshold in red."""
    lag = lag.head(top)
    colours = ["#d93025" if v > threshold_s else "#1e8e3e" for v in lag["lag_s"]]
    fig = go.Figure(go.Bar(x=lag["lag_s"], y=[short(t) for t in lag["partition"]],
                           orientation="h", marker_color=colours,
                           customdata=list(zip(lag["partition"], strict=True)),
                           hovertemplate="%{customdata[0]}<br>%{x:.1f}s<extra></extra>"))
    fig.add_vline(x=threshold_s, line=dict(color="#202124", dash="dot"))
    fig.update_layout(height=max(240, 22 * len(lag) + 60), margin=dict(l=10, r=10, t=10, b=10),
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
    xs: list[Any] = []
    ys: list[Any] = []
    for _, group in multi.groupby("txid", sort=False):
        xs += list(group["x"]) + [None]
        ys += list(group["y"]) + [None]
    fig.add_trace(go.Scattergl(x=xs, y=ys, mode="lines", name="across partitions",
                               line=dict(color="rgba(26,115,232,0.35)", width=1),
                               hoverinfo="skip"))
    complete = (df.groupby("txid")["records"].transform("sum") == df["records_expected"])
    for name, part, colour in (("complete", df[complete], "#1a73e8"),
                               ("incomplete", df[~complete], "#d93025")):
        if part.empty:
            continue
        fig.add_trace(go.Scattergl(
            x=part["x"], y=part["y"], mode="markers", name=f"{name} ({part['txid'].nunique()})",
            marker=dict(color=colour, size=6),
            customdata=list(zip(part["txid"], part["partition"], part["records"],
                                part["records_expected"], part["tag"], strict=True)),
            hovertemplate=("txn %{customdata[0]}<br>partition %{customdata[1]}<br>"
                           "%{customdata[2]} of %{customdata[3]} records<br>%{customdata[4]}"
                           "<br>%{x}<extra></extra>"),
        ))
    if selected is not None:
        mine = df[df["txid"] == selected]
        fig.add_trace(go.Scattergl(
            x=mine["x"], y=mine["y"], mode="lines+markers", name="opened",
            marker=dict(size=14, color="rgba(0,0,0,0)", line=dict(color=HIGHLIGHT, width=3)),
            line=dict(color=HIGHLIGHT, width=3),
            customdata=list(zip(mine["txid"], mine["partition"], mine["records"],
                                mine["records_expected"], mine["tag"], strict=True)),
            hoverinfo="skip",
        ))
    fig.update_layout(height=max(320, min(900, 80 + 14 * (max(lanes.values(), default=0) + 1))),
                      margin=dict(l=10, r=10, t=40, b=10), legend=_LEGEND,
                      clickmode="event+select", dragmode="pan",
                      xaxis=dict(title="commit time", type="date"),
                      yaxis=dict(title="partition lane", showticklabels=False,
                                 autorange="reversed"), uirevision="txn")
    return fig
