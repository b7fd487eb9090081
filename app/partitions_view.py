"""The Watermarks page's partition views: the per-partition table and one partition's silence.

:func:`partitions_table` is one SQL query over the cache (a window over each partition's
progress marks); :func:`silence_marks` reads one partition's records and heartbeats around a
silence. Both return integer nanoseconds (``*_ns``) like ``spark_backend.analysis``; the cached
wrappers take ``(path, version, stream, ...)`` as ``app.resources`` does.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from spark_backend.analysis import systems
from spark_backend.analysis.dag import range_end_ns
from spark_backend.analysis.display import clock, duration, html, short, timestamp, to_datetime

from . import nav, resources, state, widgets
from .safe import md

STALLED = "stalled"  # the table's state filter: open partitions lagging past the threshold

_TABLE_SQL = """
WITH p AS (
    SELECT token, state, epoch_ns(start_ts) AS start_ns, epoch_ns(end_ts) AS end_ns,
           epoch_ns(coalesce(watermark, start_ts)) AS watermark_ns,
           data_change_records, heartbeats
    FROM partitions WHERE stream = $stream),
ids AS (  -- a small number per partition: windows over it sort far faster than over tokens
    SELECT token, row_number() OVER () AS pid FROM p),
m AS (  -- every moment a partition vouched for, with its start and its end (open: range end)
    SELECT ids.pid, epoch_ns(ts) AS t FROM progress_marks JOIN ids ON ids.token = partition_token
    WHERE stream = $stream AND ts IS NOT NULL
    UNION ALL SELECT pid, start_ns FROM p JOIN ids USING (token) WHERE start_ns IS NOT NULL
    UNION ALL SELECT pid, coalesce(end_ns, $ref) FROM p JOIN ids USING (token)
    WHERE coalesce(end_ns, $ref) IS NOT NULL AND state <> 'pending'),
g AS (
    SELECT pid, lag(t) OVER (PARTITION BY pid ORDER BY t) AS gap_from_ns, t AS gap_to_ns
    FROM m),
w AS (  -- the longest silence: the partition's worst lag behind its own next mark
    SELECT ids.token, max(gap_to_ns - gap_from_ns) AS gap_ns,
           arg_max(gap_from_ns, gap_to_ns - gap_from_ns) AS gap_from_ns,
           arg_max(gap_to_ns, gap_to_ns - gap_from_ns) AS gap_to_ns
    FROM g JOIN ids USING (pid) WHERE gap_from_ns IS NOT NULL GROUP BY ids.token),
dc AS (SELECT partition_token AS token, epoch_ns(min(commit_timestamp)) AS first_record_ns,
              epoch_ns(max(commit_timestamp)) AS last_record_ns
       FROM data_change_records WHERE stream = $stream GROUP BY 1),
hb AS (SELECT partition_token AS token, epoch_ns(max(timestamp)) AS last_heartbeat_ns
       FROM heartbeats WHERE stream = $stream GROUP BY 1),
par AS (SELECT child AS token, count(DISTINCT parent) AS parents
        FROM edges WHERE stream = $stream AND parent IS NOT NULL GROUP BY child),
kid AS (SELECT parent AS token, count(DISTINCT child) AS children
        FROM edges WHERE stream = $stream AND parent IS NOT NULL GROUP BY parent)
SELECT p.token, p.state,
       CASE WHEN p.state = 'finished' OR $ref IS NULL THEN 0.0
            ELSE greatest(0, $ref - p.watermark_ns) / 1e9 END AS lag_now_s,
       coalesce(w.gap_ns, 0) / 1e9 AS worst_lag_s, w.gap_from_ns, w.gap_to_ns,
       dc.first_record_ns, dc.last_record_ns, hb.last_heartbeat_ns, p.watermark_ns,
       coalesce(par.parents, 0) AS parents, coalesce(kid.children, 0) AS children,
       p.data_change_records AS records, p.heartbeats
FROM p LEFT JOIN w USING (token) LEFT JOIN dc USING (token) LEFT JOIN hb USING (token)
     LEFT JOIN par USING (token) LEFT JOIN kid USING (token)
ORDER BY lag_now_s DESC, worst_lag_s DESC, p.token
"""


def partitions_table(con: duckdb.DuckDBPyConnection, stream: str,
                     stall_s: float) -> pd.DataFrame:
    """One row per partition: token, state, lag_now_s (behind the range end; 0 when finished),
    worst_lag_s with gap_from_ns / gap_to_ns (its longest silence between two progress marks,
    its start and its end or the range end), first_record_ns, last_record_ns,
    last_heartbeat_ns, watermark_ns, parents, children, records, heartbeats, stalled (open,
    lagging more than ``stall_s``, on a system that sends heartbeats: ``analysis.partitions``'
    rule). Most behind now first."""
    ref = range_end_ns(con, stream)
    df = con.execute(_TABLE_SQL, {"stream": stream, "ref": ref}).df()
    system = con.execute("SELECT system FROM streams WHERE stream = ?", [stream]).fetchone()
    beats = systems.has_heartbeats(con, stream, system[0] if system else None)
    df["stalled"] = (df["state"] != "finished") & (df["lag_now_s"] > stall_s) & beats
    return df


def silence_marks(con: duckdb.DuckDBPyConnection, stream: str, token: str, lo_ns: int,
                  hi_ns: int) -> pd.DataFrame:
    """The partition's records and heartbeats from ``lo_ns`` to ``hi_ns``: t_ns, kind."""
    return con.execute(
        """SELECT epoch_ns(commit_timestamp) AS t_ns, 'data change record' AS kind
           FROM data_change_records WHERE stream = $s AND partition_token = $t
             AND commit_timestamp BETWEEN make_timestamp_ns($lo) AND make_timestamp_ns($hi)
           UNION ALL
           SELECT epoch_ns(timestamp), 'heartbeat' FROM heartbeats
           WHERE stream = $s AND partition_token = $t
             AND timestamp BETWEEN make_timestamp_ns($lo) AND make_timestamp_ns($hi)
           ORDER BY 1, 2""",
        {"s": stream, "t": token, "lo": int(lo_ns), "hi": int(hi_ns)},
    ).df()


@st.cache_data(show_spinner=False, max_entries=resources.QUERY_CACHE_ENTRIES)
def table(path: str, ver: int, stream: str, stall_s: float) -> pd.DataFrame:
    """:func:`partitions_table`, cached by the cache's version."""
    with resources.cursor(path) as con:
        return partitions_table(con, stream, stall_s)


@st.cache_data(show_spinner=False, max_entries=resources.QUERY_CACHE_ENTRIES)
def marks(path: str, ver: int, stream: str, token: str, lo_ns: int, hi_ns: int) -> pd.DataFrame:
    """:func:`silence_marks`, cached by the cache's version."""
    with resources.cursor(path) as con:
        return silence_marks(con, stream, token, lo_ns, hi_ns)


def display_table(df: pd.DataFrame) -> pd.DataFrame:
    """The table as people read it: short tokens first, times as UTC datetimes, the whole
    token last (a row's selection shows it whole too)."""
    def when(col: str) -> pd.Series:
        return pd.to_datetime(df[col].astype("Int64"), unit="ns", utc=True).dt.floor("s")

    return pd.DataFrame({
        "partition": [short(t, 12) for t in df["token"]],
        "state": [STALLED if s else state for s, state in zip(df["stalled"], df["state"],
                                                              strict=True)],
        "lag now (s)": df["lag_now_s"].round(1), "worst lag (s)": df["worst_lag_s"].round(1),
        "last record": when("last_record_ns"), "last heartbeat": when("last_heartbeat_ns"),
        "parents": df["parents"], "children": df["children"], "records": df["records"],
        "token": df["token"],
    })


def filter_table(df: pd.DataFrame, states: list[str], search: str) -> pd.DataFrame:
    """Rows whose shown state is one of ``states`` (all when empty) and whose token contains
    ``search`` (case-insensitive)."""
    keep = pd.Series(True, index=df.index)
    if states:
        keep &= df["state"].isin(states)
    if search.strip():
        keep &= df["token"].str.contains(search.strip(), case=False, regex=False)
    return df[keep]


def silence_of(row: pd.Series, stall: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """The silence to show for a partition: the stall's (its last mark before, its next mark
    after; the range's last moment while it lasts) when the stall is this partition's, else its
    longest silence from the table."""
    if stall is not None and stall["partition"] == row["token"]:
        until = stall["until_ns"] if stall["until_ns"] is not None else stall["last_ns"]
        return int(stall["since_ns"]), int(until)
    if pd.isna(row["gap_from_ns"]) or pd.isna(row["gap_to_ns"]):
        return None, None
    return int(row["gap_from_ns"]), int(row["gap_to_ns"])


def silence_figure(points: pd.DataFrame, token: str, gap: tuple[int, int]) -> go.Figure:
    """The partition's progress marks as dots on two labelled rows, the silence shaded."""
    def at(ns: int) -> pd.Timestamp:
        return to_datetime(ns).floor("us")  # what a browser shows; plotly drops nanoseconds

    fig = go.Figure()
    colours = {"data change record": "#1f77b4", "heartbeat": "#7f7f7f"}
    for kind, colour in colours.items():
        rows = points[points["kind"] == kind]
        fig.add_trace(go.Scatter(
            x=[at(t) for t in rows["t_ns"]], y=[kind] * len(rows), mode="markers",
            name=f"{kind}s ({len(rows)})", marker={"color": colour, "size": 7},
            hovertemplate="%{x|%H:%M:%S.%f} UTC<extra>" + html(kind) + "</extra>"))
    fig.add_vrect(x0=at(gap[0]), x1=at(gap[1]), fillcolor="#d62728",
                  opacity=0.15, line_width=0, annotation_text="silent",
                  annotation_position="top left")
    fig.update_layout(height=220, margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      title={"text": f"Progress marks of {html(short(token, 20))}",
                             "font": {"size": 13}},
                      yaxis={"categoryorder": "array",
                             "categoryarray": list(colours)},
                      xaxis_title="UTC", legend={"orientation": "h", "y": -0.3})
    return fig


def show_table(c: state.Ctx, parts: pd.DataFrame, chosen: str | None) -> None:
    """The Partitions table with its filters; selecting a row drills into that partition."""
    shown = display_table(parts)
    left, right = st.columns([2, 3])
    states = left.multiselect("State", sorted(set(shown["state"])), key="wm_parts_state",
                              placeholder="all states")
    search = right.text_input("Search a token", key="wm_parts_search",
                              placeholder="part of a partition token")
    rows = filter_table(shown, states, search).reset_index(drop=True)
    event = st.dataframe(
        rows, hide_index=True, width="stretch", height=320, key=f"wm_parts_{chosen}",
        on_select="rerun", selection_mode="single-row",
        column_config={
            "lag now (s)": st.column_config.NumberColumn(
                help="behind the range end (0 when finished)"),
            "worst lag (s)": st.column_config.NumberColumn(
                help="its longest silence: no record, heartbeat or child partitions record"),
            "last record": st.column_config.DatetimeColumn(
                "last record (UTC)", format="YYYY-MM-DD HH:mm:ss",
                help="its last data change record; empty: none in the range"),
            "last heartbeat": st.column_config.DatetimeColumn(
                "last heartbeat (UTC)", format="YYYY-MM-DD HH:mm:ss",
                help="its last heartbeat; empty: none in the range"),
            "token": st.column_config.TextColumn("whole token", width="small")})
    st.caption(f"{len(rows):,} of {len(shown):,} partitions; click a column to sort, select "
               "a row to see what that partition was doing.")
    picked = event.selection.rows if event is not None else []
    if picked and picked[0] < len(rows) and rows["token"][picked[0]] != chosen:
        state.select_partition(str(rows["token"][picked[0]]))
        st.rerun()


def show_silence(c: state.Ctx, row: pd.Series, stall: dict[str, Any] | None) -> None:
    """One partition around its silence: a sentence, its marks with the gap shaded, a DAG
    link; then its numbers, parents, children and records (``widgets.partition_panel``)."""
    token = str(row["token"])
    st.subheader(f"What partition {md(short(token, 20))} was doing")
    lo, hi = silence_of(row, stall)
    if lo is None or hi is None:
        st.caption("No progress mark of this partition is cached yet.")
    else:
        words = (f"No record or heartbeat from {clock(lo)} to {clock(hi)} UTC "
                 f"({duration((hi - lo) / 1e9)} silent"
                 + ("; the range ends before it spoke again)." if stall is not None
                    and stall["partition"] == token and stall["ongoing"] else ")."))
        first = row["first_record_ns"]
        if pd.isna(first):
            words += " It has no data change record in the cache: only heartbeats."
        elif int(first) >= hi:
            words += (f" Its first data change record in the cache is from "
                      f"{timestamp(first)}, after the silence.")
        st.markdown(words)
        pad = max(60 * 10**9, (hi - lo) // 4)
        points = marks(c.path, c.version, c.stream, token, lo - pad, hi + pad)
        st.plotly_chart(silence_figure(points, token, (lo, hi)), key="wm_silence")
        st.caption(f"Its records and heartbeats from {clock(lo - pad)} to {clock(hi + pad)} "
                   "UTC; shaded: the silence.")
    st.page_link(nav.page("dag"), label="Show it in the DAG", icon=":material/account_tree:",
                 query_params={k: v for k, v in {"stream": c.stream,
                                                 "start": state.param("start"),
                                                 "end": state.param("end"),
                                                 "partition": token}.items() if v})
    widgets.partition_panel(c, token)
