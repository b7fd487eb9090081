"""The partition DAG laid out in Python: one lane (row) per partition, exports to DOT and SVG.

A partition occupies its lane from its start to its end (finished) or its watermark (open).
A child continues on a parent's lane when that lane is free at its start, so a move or the
first child of a split stays in line with its parent; otherwise it takes the lowest free lane.
O(n log n) in the number of partitions.
"""

from __future__ import annotations

import heapq
from html import escape
from typing import Any

import pandas as pd

from .display import is_missing, timestamp

STATUSES = ("finished", "open", "stalled", "incomplete")
EDGE_KINDS = ("split", "merge", "move")
# MUTABLE_KEY_RANGE: a key range moving out of one partition into another at a commit
# timestamp; drawn as one vertical segment at that moment (both sides' edges give one move).
KEY_RANGE_MOVE = "key-range move"
MOVE_KINDS = ("move_in", "move_out")


def status(row: Any) -> str:
    if row.state in ("incomplete", "pending") or (not is_missing(row.error) and row.error):
        return "incomplete"
    if bool(row.finished):
        return "finished"
    return "stalled" if bool(row.stalled) else "open"


def layout(parts: pd.DataFrame, range_end_ns: int | None = None) -> pd.DataFrame:
    """``analysis.partitions`` rows + lane, x0_ns, x1_ns, status, timed (one row per
    partition). ``timed`` is False for a partition the data gives no time at all (e.g. a
    CockroachDB changefeed without ``updated``): it is drawn at the earliest known time, or at
    ``range_end_ns``, or at 0 when the stream has no time anywhere."""
    if parts.empty:
        return parts.assign(lane=pd.Series(dtype=int), x0_ns=pd.Series(dtype="Int64"),
                            x1_ns=pd.Series(dtype="Int64"), status=pd.Series(dtype=str),
                            timed=pd.Series(dtype=bool))
    df = parts.copy()
    start = df["start_ns"].astype("Int64")
    end = df["end_ns"].astype("Int64").fillna(df["watermark_ns"].astype("Int64"))
    df["timed"] = (start.notna() | end.notna()).astype(bool)
    known = pd.concat([start, end]).dropna()
    if range_end_ns is not None:
        fallback = int(range_end_ns)
    else:
        fallback = int(known.min()) if len(known) else 0
    df["x0_ns"] = start.fillna(end).fillna(fallback).astype("int64")
    df["x1_ns"] = end.fillna(df["x0_ns"]).astype("int64")
    df["x1_ns"] = df[["x0_ns", "x1_ns"]].max(axis=1)
    df["status"] = [status(r) for r in df.itertuples()]
    df["lane"] = _lanes(df)
    return df


def _lanes(df: pd.DataFrame) -> list[int]:
    order = sorted(range(len(df)), key=lambda i: (df["x0_ns"].iat[i], df["token"].iat[i]))
    lane_of: dict[str, int] = {}
    busy: list[tuple[int, int]] = []  # (busy until, lane)
    free: list[int] = []
    free_set: set[int] = set()
    n_lanes = 0
    out = [0] * len(df)
    for i in order:
        x0, x1 = int(df["x0_ns"].iat[i]), int(df["x1_ns"].iat[i])
        while busy and busy[0][0] <= x0:
            _, lane = heapq.heappop(busy)
            heapq.heappush(free, lane)
            free_set.add(lane)
        lane = next((lane_of[p] for p in sorted(df["parents"].iat[i], key=lambda p:
                     lane_of.get(p, 1 << 30)) if p in lane_of and lane_of[p] in free_set), None)
        if lane is None:
            while free and free[0] not in free_set:
                heapq.heappop(free)
            if free:
                lane = heapq.heappop(free)
            else:
                lane, n_lanes = n_lanes, n_lanes + 1
        free_set.discard(lane)
        heapq.heappush(busy, (max(x1, x0 + 1), lane))
        lane_of[df["token"].iat[i]] = lane
        out[i] = lane
    return out


def edge_segments(nodes: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    """Edges between laid-out partitions: parent's end -> child's start, with their kind."""
    pos = nodes.set_index("token")[["lane", "x0_ns", "x1_ns"]]
    e = edges[edges["parent"].notna() & edges["kind"].isin(EDGE_KINDS)]
    e = e[e["parent"].isin(pos.index) & e["child"].isin(pos.index)]
    p = pos.loc[e["parent"]].reset_index(drop=True)
    c = pos.loc[e["child"]].reset_index(drop=True)
    structural = pd.DataFrame({
        "parent": e["parent"].to_numpy(), "child": e["child"].to_numpy(),
        "kind": e["kind"].to_numpy(),
        "x0_ns": p["x1_ns"].to_numpy(), "y0": p["lane"].to_numpy(),
        "x1_ns": c["x0_ns"].to_numpy(), "y1": c["lane"].to_numpy(),
    })
    return pd.concat([structural, _move_segments(pos, edges)], ignore_index=True)


def _move_segments(pos: pd.DataFrame, edges: pd.DataFrame) -> pd.DataFrame:
    """Key-range moves: source lane -> destination lane at the move's commit timestamp."""
    columns = ["parent", "child", "kind", "x0_ns", "y0", "x1_ns", "y1"]
    if "ts_ns" not in edges.columns:
        return pd.DataFrame(columns=columns)
    m = edges[edges["kind"].isin(MOVE_KINDS) & edges["ts_ns"].notna()]
    m = m[m["parent"].isin(pos.index) & m["child"].isin(pos.index)]
    m = m.drop_duplicates(["parent", "child", "ts_ns"])
    if m.empty:
        return pd.DataFrame(columns=columns)
    ts = m["ts_ns"].astype("int64").to_numpy()
    return pd.DataFrame({
        "parent": m["parent"].to_numpy(), "child": m["child"].to_numpy(),
        "kind": KEY_RANGE_MOVE, "x0_ns": ts, "y0": pos.loc[m["parent"], "lane"].to_numpy(),
        "x1_ns": ts, "y1": pos.loc[m["child"], "lane"].to_numpy(),
    })


# --- exports ---------------------------------------------------------------------------------

_STATUS_COLOUR = {"finished": "#5f6368", "open": "#1e8e3e", "stalled": "#d93025",
                  "incomplete": "#f29900"}
_EDGE_COLOUR = {"split": "#1a73e8", "merge": "#9334e6", "move": "#80868b",
                "move_in": "#e37400", "move_out": "#e37400", KEY_RANGE_MOVE: "#e37400"}


def to_dot(nodes: pd.DataFrame, edges: pd.DataFrame, stream: str) -> str:
    """Graphviz DOT: partitions as boxes (colour = status), edges coloured by kind."""
    lines = [f'digraph "{_dot(stream)}" {{', "  rankdir=LR;",
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontsize=10];']
    for r in nodes.itertuples():
        label = f"{r.token[:16]}\\n{timestamp(r.start_ns)}\\n{r.status}"
        lines.append(f'  "{_dot(r.token)}" [label="{label}", color="{_STATUS_COLOUR[r.status]}"];')
    for r in edges.itertuples():
        if is_missing(r.parent):
            continue
        colour = _EDGE_COLOUR.get(r.kind, "#80868b")
        lines.append(f'  "{_dot(r.parent)}" -> "{_dot(r.child)}" [color="{colour}", '
                     f'label="{r.kind}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def to_svg(nodes: pd.DataFrame, segments: pd.DataFrame, width: int = 1600) -> str:
    """A standalone SVG of the laid-out DAG (same lanes and colours as the page's chart)."""
    if nodes.empty:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40"/>'
    lo, hi = int(nodes["x0_ns"].min()), int(nodes["x1_ns"].max())
    span = max(1, hi - lo)
    lane_h, pad = 14, 40
    height = int(nodes["lane"].max() + 1) * lane_h + 2 * pad

    def x(ns: int) -> float:
        return pad + (int(ns) - lo) / span * (width - 2 * pad)

    def y(lane: int) -> float:
        return pad + int(lane) * lane_h + lane_h / 2

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="10">',
           f'<text x="{pad}" y="20">{escape(timestamp(lo))} .. {escape(timestamp(hi))}</text>']
    for r in segments.itertuples():
        out.append(f'<line x1="{x(r.x0_ns):.1f}" y1="{y(r.y0):.1f}" x2="{x(r.x1_ns):.1f}" '
                   f'y2="{y(r.y1):.1f}" stroke="{_EDGE_COLOUR[r.kind]}" stroke-width="1"/>')
    for r in nodes.itertuples():
        w = max(1.5, x(r.x1_ns) - x(r.x0_ns))
        out.append(f'<rect x="{x(r.x0_ns):.1f}" y="{y(r.lane) - 4:.1f}" width="{w:.1f}" '
                   f'height="8" fill="{_STATUS_COLOUR[r.status]}"><title>{escape(r.token)} '
                   f'({r.status})</title></rect>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
