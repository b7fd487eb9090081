"""The Overview's numbers, all from ONE read of the cache.

The header, the lead sentences, the lag chart, the tiles and the anomalies box are computed in
one DuckDB transaction (a snapshot: a pull landing meanwhile is not half seen), so they cannot
contradict each other; the page draws them from the :class:`View` alone, in the fragment that
follows new data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd
import streamlit as st

from spark_backend import analysis
from spark_backend.analysis import stalls, systems

from . import queries, resources


@dataclass(frozen=True)
class View:
    """What the Overview shows of one stream at one version of the cache."""

    version: int
    summary: dict[str, Any]
    heartbeats: bool              # the system vouches for progress: stall words apply
    parts: pd.DataFrame
    edges: pd.DataFrame
    replay: pd.DataFrame
    found: list[dict[str, Any]]   # the stalls of the range, costliest first ([] without beats)
    now: dict[str, Any] | None    # the low watermark at the end of the range
    anomalies: list[dict[str, Any]]
    records: int                  # data change records in the range
    transactions: int             # transactions in the range
    freshness: dict[str, Any] | None  # systems without heartbeats (``systems.freshness_summary``)

    @property
    def worst(self) -> dict[str, Any] | None:
        return self.found[0] if self.found else None

    @property
    def alive(self) -> int:
        return int((~self.parts["finished"].astype(bool)).sum()) if len(self.parts) else 0


def snapshot(con: duckdb.DuckDBPyConnection, stream: str, stall_s: float,
             start_ns: int | None, end_ns: int | None) -> View:
    """Everything the Overview shows, read in one transaction of ``con``."""
    con.execute("BEGIN TRANSACTION")
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
        summary = analysis.summary(con, stream)
        beats = systems.has_heartbeats(con, stream, summary["system"])
        replay = stalls.watermark_replay(con, stream, stalls.DEFAULT_POINTS, start_ns, end_ns)
        found = stalls.stalls(con, stream, stall_s, replay) if beats else []
        ranged = start_ns is not None or end_ns is not None
        return View(
            version=int(row[0]) if row else 0, summary=summary, heartbeats=beats,
            parts=analysis.partitions(con, stream, stall_s), edges=analysis.edges(con, stream),
            replay=replay, found=found,
            now=stalls.current_state(con, stream, replay) if beats else None,
            # the stalls of the range shown (the headline's), then the stream's other kinds
            anomalies=stalls.as_anomalies(found)
            + analysis.anomalies(con, stream, stall_s, with_stalls=False),
            records=(queries.records_count(con, stream, queries.RecordFilter(
                start_ns=start_ns, end_ns=end_ns)) if ranged
                else summary["records"]["data_change"]),
            transactions=(queries.completeness(con, stream, queries.TxnFilter(
                start_ns=start_ns, end_ns=end_ns))["transactions"] if ranged
                else summary["transactions"]),
            freshness=None if beats else systems.freshness_summary(con, stream),
        )
    finally:
        con.execute("ROLLBACK")


@st.cache_data(show_spinner=False, max_entries=resources.QUERY_CACHE_ENTRIES)
def view(path: str, ver: int, stream: str, stall_s: float, start_ns: int | None,
         end_ns: int | None) -> View:
    """:func:`snapshot`, cached by the cache's version (``resources``' convention)."""
    with resources.cursor(path) as con:
        return snapshot(con, stream, stall_s, start_ns, end_ns)


@dataclass(frozen=True)
class Drawn:
    """The Overview's figures of one :class:`View`, built ahead of drawing them."""

    view: View
    lag: Any | None            # lag over time (None without heartbeats or watermarks)
    dag: Any | None            # the live DAG (live streams only)
    said: list[str]            # live: what happened in the last 3 minutes


@st.cache_data(show_spinner=False, max_entries=resources.QUERY_CACHE_ENTRIES)
def drawn(path: str, ver: int, stream: str, stall_s: float, start_ns: int | None,
          end_ns: int | None, live_now: bool) -> Drawn:
    """:func:`view` and the figures made of it, cached by version: a live Overview's fragment
    only draws them (a runner's follower builds them after each refresh)."""
    from . import dag_layout, figures, live

    v = view(path, ver, stream, stall_s, start_ns, end_ns)
    lag = dag = None
    said: list[str] = []
    if v.heartbeats:
        low = queries.low_watermark_over_time(v.replay)
        if not low.empty:
            by_partition, total = queries.lag_over_time(v.replay, top=12)
            lag = figures.lag_over_time_figure(by_partition, low, stall_s, total, stall=v.worst)
            lag.update_layout(height=300)
        if live_now and v.now is not None:
            said = live.events(v.parts, v.edges, v.found, v.now["t_ns"] - 180 * 10**9)
            nodes = dag_layout.layout(v.parts)
            dag = figures.dag_figure(nodes, dag_layout.edge_segments(nodes, v.edges),
                                     holder=stalls.holding_back(v.now, stall_s))
    return Drawn(v, lag, dag, said)


@dataclass(frozen=True)
class Freshness:
    """How a stream vouches for progress: heartbeats (stall words apply) or, without them,
    how fresh its changes are (``summary``: ``systems.freshness_summary``; ``events``:
    ``systems.freshness``)."""

    system: str | None
    heartbeats: bool
    summary: dict[str, Any] | None
    events: pd.DataFrame | None


@st.cache_data(show_spinner=False, max_entries=resources.QUERY_CACHE_ENTRIES)
def freshness(path: str, ver: int, stream: str) -> Freshness:
    """The stream's :class:`Freshness`, read in one transaction, cached by version."""
    with resources.cursor(path) as con:
        con.execute("BEGIN TRANSACTION")
        try:
            row = con.execute("SELECT system FROM streams WHERE stream = ?", [stream]).fetchone()
            system = row[0] if row else None
            if systems.has_heartbeats(con, stream, system):
                return Freshness(system, True, None, None)
            return Freshness(system, False, systems.freshness_summary(con, stream),
                             systems.freshness(con, stream))
        finally:
            con.execute("ROLLBACK")
