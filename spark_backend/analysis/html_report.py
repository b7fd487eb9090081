"""A self-contained HTML report of a stream, to attach to a bug report or mail to stakeholders:
the worst stall in words, the partition DAG, the lag over time, the anomalies, a transactions
summary. The plotly library is embedded once: the file opens offline, nothing is fetched.

Every value from the cache is HTML-escaped; the figures escape theirs (``display.html``).
"""

from __future__ import annotations

import datetime as dt
from html import escape
from typing import Any

import duckdb
import pandas as pd
import plotly.graph_objects as go

from ..model.timestamps import format_duration, format_ns
from . import dag_layout, figures, stalls, systems
from .dag import edges, partitions
from .display import clock, freshness_text, stall_span, timestamp
from .report import anomalies, summary

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #202124; }
h1 { margin-bottom: 0.1em; } .sub { color: #5f6368; margin-top: 0; }
.lead { font-size: 1.25em; font-weight: 600; } .now { font-size: 1.05em; }
table { border-collapse: collapse; width: 100%; font-size: 0.9em; }
th, td { border-bottom: 1px solid #dadce0; padding: 4px 8px; text-align: left; }
th { background: #f1f3f4; } .tiles { display: flex; gap: 2em; margin: 1em 0; }
.tile b { display: block; font-size: 1.6em; }
"""


def stall_text(stall: dict[str, Any] | None, threshold_s: float) -> str:
    """The worst stall in one plain sentence (no markup)."""
    if stall is None:
        return (f"No stall: no partition held the low watermark more than {threshold_s:g}s "
                "behind in this range.")
    tail = stall_span(stall)
    return (f"Worst stall: partition {stall['partition']} went silent and held the low "
            f"watermark back {tail}")


def _table(df: pd.DataFrame, limit: int = 200) -> str:
    if df.empty:
        return "<p>None.</p>"
    head = "".join(f"<th>{escape(str(c))}</th>" for c in df.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{escape('' if pd.isna(v) else str(v))}</td>" for v in row)
        + "</tr>" for row in df.head(limit).itertuples(index=False))
    more = f"<p>… and {len(df) - limit:,} more.</p>" if len(df) > limit else ""
    return f"<table><tr>{head}</tr>{rows}</table>{more}"


def _txn_per_minute(con: duckdb.DuckDBPyConnection, stream: str) -> pd.DataFrame:
    return con.execute(
        """SELECT epoch_ns(time_bucket(INTERVAL 1 MINUTE, commit_timestamp)) AS bucket_ns,
                  count(*) AS transactions
           FROM transactions WHERE stream = ? AND commit_timestamp IS NOT NULL
           GROUP BY 1 ORDER BY 1""", [stream]).df()


def build_html(con: duckdb.DuckDBPyConnection, stream: str, stall_after_s: float = 60.0,
               start_ns: int | None = None, end_ns: int | None = None) -> str:
    """The report of ``stream`` (over ``[start_ns, end_ns]``, default its cached range)."""
    info = summary(con, stream)
    beats = systems.has_heartbeats(con, stream, info["system"])
    parts = partitions(con, stream, stall_after_s)
    nodes = dag_layout.layout(parts)
    segs = dag_layout.edge_segments(nodes, edges(con, stream))
    replay = stalls.watermark_replay(con, stream, stalls.DEFAULT_POINTS, start_ns, end_ns)
    # Without heartbeats a quiet table is no stall: the report speaks of freshness instead.
    found = stalls.stalls(con, stream, stall_after_s, replay) if beats else []
    worst = found[0] if found else None
    now = stalls.current_state(con, stream, replay) if beats else None
    low = stalls.low_watermark_over_time(replay)
    lag, total = stalls.lag_over_time(replay)
    notes, spans = figures.stall_marks(found)
    dag = figures.dag_figure(nodes, segs, holder=stalls.holding_back(now, stall_after_s),
                             notes=notes, spans=spans)
    lag_fig = figures.lag_over_time_figure(lag, low, stall_after_s, total, stall=worst)
    per_minute = _txn_per_minute(con, stream)
    txn_fig = go.Figure(go.Bar(x=pd.to_datetime(per_minute["bucket_ns"], unit="ns", utc=True),
                               y=per_minute["transactions"], marker_color="#1a73e8"))
    txn_fig.update_layout(height=220, margin=dict(l=10, r=10, t=10, b=10),
                          yaxis_title="transactions / minute")
    for fig in (dag, lag_fig, txn_fig):
        fig.update_layout(template="plotly_white")
    # the stalls of the range reported (the lead's), then the stream's other kinds
    found_anomalies = pd.DataFrame(stalls.as_anomalies(found) + anomalies(
        con, stream, stall_after_s, with_stalls=False))
    if not beats:
        lead = freshness_text(info["system"], systems.freshness_summary(con, stream))
        now_text = ""
    else:
        lead = stall_text(worst, stall_after_s)
        now_text = ("No progress marks." if now is None else
                    f"Now ({clock(now['t_ns'])} UTC): the low watermark is "
                    f"{clock(now['low_ns'])} UTC, {format_duration(now['lag_s'])} behind, held "
                    f"by partition {now['holder']}.")
    stall_table = (pd.DataFrame([{
        "partition": s["partition"], "from": format_ns(s["since_ns"]),
        "until": "still now" if s["ongoing"] else format_ns(s["until_ns"] or s["last_ns"]),
        "worst lag (s)": round(s["max_lag_s"], 1),
        "held more than the threshold (s)": round(s["cost_s"], 1)} for s in found])
        if found else pd.DataFrame())
    rng = (f"{timestamp(info['range_start_ns'])} → {timestamp(info['range_end_ns'])}"
           if info["range_start_ns"] is not None or info["range_end_ns"] is not None
           else "no times (the source sent none)")
    tiles = [("partitions", f"{len(parts):,}"),
             ("data change records", f"{info['records']['data_change']:,}"),
             ("heartbeats", f"{info['records']['heartbeat']:,}"),
             ("transactions", f"{info['transactions']:,}"),
             ("anomalies", f"{len(found_anomalies):,}")]
    body = [
        f"<h1>{escape(stream)}</h1>",
        f"<p class='sub'>{escape(str(info['system']))} · source {escape(str(info['source']))} · "
        f"{escape(rng)} · stall threshold {stall_after_s:g}s · report made "
        f"{escape(format_ns(int(dt.datetime.now(dt.UTC).timestamp() * 1e9)))}</p>",
        f"<p class='lead'>{escape(lead)}</p>",
        f"<p class='now'>{escape(now_text)}</p>",
        "<div class='tiles'>" + "".join(f"<div class='tile'><b>{v}</b>{escape(k)}</div>"
                                        for k, v in tiles) + "</div>",
        "<h2>Lag behind the frontier over time</h2>",
        lag_fig.to_html(full_html=False, include_plotlyjs=True),
        "<h2>Partition DAG</h2>",
        "<p>Each bar runs from a partition's start to its end (or watermark); edges join a "
        "parent's end to its children's start (blue split, purple merge, grey move).</p>",
        dag.to_html(full_html=False, include_plotlyjs=False),
        f"<h2>Stalls ({len(found)})</h2>", _table(stall_table),
        f"<h2>Anomalies ({len(found_anomalies)})</h2>", _table(found_anomalies),
        "<h2>Transactions</h2>",
        txn_fig.to_html(full_html=False, include_plotlyjs=False),
    ]
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{escape(stream)}: change stream report</title><style>{_CSS}</style>"
            "</head><body>" + "\n".join(body) + "</body></html>\n")
