"""The Transactions page's readable views: the widest transactions of a window as a table, one
transaction's records on labelled partition lanes, and lane labels for the density heatmap."""

from __future__ import annotations

import duckdb
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from spark_backend.analysis.display import html, short
from spark_backend.analysis.transactions import TRANSACTION_FILTER, transaction_filter_params

from . import resources
from .queries import TxnFilter

WIDEST = 20


def widest(con: duckdb.DuckDBPyConnection, stream: str, f: TxnFilter,
           limit: int = WIDEST) -> pd.DataFrame:
    """The ``limit`` transactions touching most partitions (then most records, then first
    committed) among the filtered ones: txid, commit_ns, partitions, partitions_expected,
    records, records_expected, tables, tag. From the per-transaction summary of the cache."""
    return con.execute(
        """SELECT server_transaction_id AS txid, epoch_ns(commit_timestamp) AS commit_ns,
                  len(partitions) AS partitions, partitions_expected,
                  records_seen AS records, records_expected,
                  array_to_string(tables, ', ') AS tables, transaction_tag AS tag
           FROM transactions WHERE """ + TRANSACTION_FILTER + """
           ORDER BY len(partitions) DESC, records_seen DESC, commit_timestamp, txid
           LIMIT $limit""",
        {**transaction_filter_params(stream, f.table, f.tag, f.mod_type, f.start_ns, f.end_ns),
         "limit": int(limit)},
    ).df()


@st.cache_data(show_spinner=False, max_entries=resources.QUERY_CACHE_ENTRIES)
def widest_cached(path: str, ver: int, stream: str, f: TxnFilter) -> pd.DataFrame:
    """:func:`widest`, cached by the cache's version."""
    with resources.cursor(path) as con:
        return widest(con, stream, f)


def widest_display(df: pd.DataFrame) -> pd.DataFrame:
    """The widest transactions as people read them (UTC times, 'seen / expected' counts)."""
    def of(seen: pd.Series, expected: pd.Series) -> list[str]:
        return [f"{int(s)} / {'?' if pd.isna(e) else int(e)}"
                for s, e in zip(seen, expected, strict=True)]

    return pd.DataFrame({
        "committed": pd.to_datetime(df["commit_ns"].astype("Int64"), unit="ns",
                                    utc=True).dt.floor("us"),
        "partitions seen / expected": of(df["partitions"], df["partitions_expected"]),
        "records seen / expected": of(df["records"], df["records_expected"]),
        "tables": df["tables"], "tag": df["tag"], "transaction": df["txid"],
    })


def lanes_figure(recs: pd.DataFrame, txid: str) -> go.Figure:
    """One transaction's records in commit order (x: position in (commit_timestamp,
    record_sequence) order), one labelled row per partition it was read from."""
    rows = recs.drop_duplicates(["partition", "record_sequence"]).reset_index(drop=True)
    order = list(dict.fromkeys(rows["partition"]))
    labels = {p: f"{short(p, 10)} ({i + 1})" for i, p in enumerate(order)}
    fig = go.Figure(go.Scatter(
        x=list(range(1, len(rows) + 1)), y=[labels[p] for p in rows["partition"]],
        mode="markers+text", marker={"size": 12, "color": "#1a73e8"},
        text=[html(f"{t} {m}") for t, m in zip(rows["table_name"], rows["mod_type"],
                                               strict=True)],
        textposition="top center", customdata=[[html(p), html(s)] for p, s in
                                               zip(rows["partition"], rows["record_sequence"],
                                                   strict=True)],
        hovertemplate="record %{x} in commit order<br>sequence %{customdata[1]}<br>"
                      "partition %{customdata[0]}<extra></extra>"))
    fig.update_layout(
        height=max(200, 90 + 45 * len(order)), margin={"l": 10, "r": 10, "t": 40, "b": 10},
        title={"text": f"Transaction {html(short(txid, 24))}: its records across "
                       f"{len(order)} partitions", "font": {"size": 13}},
        xaxis={"title": "record, in commit order", "dtick": 1},
        # the first row on top, with room above it for its records' labels (drawn above the
        # markers, they were cut off by the plot's edge)
        yaxis={"title": "partition", "categoryorder": "array",
               "categoryarray": [labels[p] for p in order],
               "range": [len(order) - 0.5, -0.8]})
    return fig


def label_lanes(fig: go.Figure, lanes: dict[str, int], density: pd.DataFrame) -> go.Figure:
    """The density heatmap's rows named by the partitions on them (a lane holds partitions
    one after another: the first named, how many more said)."""
    if density.empty:
        return fig
    on_lane: dict[int, list[str]] = {}
    for token in density["partition"].drop_duplicates():
        if token in lanes:
            on_lane.setdefault(int(lanes[token]), []).append(str(token))
    shown = sorted(on_lane)
    text = [short(on_lane[k][0], 8) + (f" +{len(on_lane[k]) - 1}" if len(on_lane[k]) > 1
                                       else "") for k in shown]
    fig.update_yaxes(title="partition lane", showticklabels=True, tickmode="array",
                     tickvals=shown, ticktext=text, tickfont={"size": 9})
    return fig
