"""Overview: the stream at a glance, each number linking to the page that explains it."""

import pandas as pd
import streamlit as st

from app import nav, resources, widgets
from app.formatting import count, held_back_sentence, timestamp

c = widgets.need_stream()
widgets.walkthrough_banner("overview")
s = resources.summary(c.path, c.version, c.stream)
parts = resources.partitions(c.path, c.version, c.stream, c.stall_s)
low, _ = resources.low_watermark(c.path, c.version, c.stream)
holder = resources.holding_back(c.path, c.version, c.stream)
found = resources.anomalies(c.path, c.version, c.stream, c.stall_s)
link = {"stream": c.stream}

st.title(c.stream)
st.caption(f"{s['system']} · source {s['source']} · cached "
           f"{timestamp(s['range_start_ns'])} → {timestamp(s['range_end_ns'])}")

tiles = st.columns(5)
live = int((~parts["finished"]).sum()) if not parts.empty else 0
tiles[0].metric("Partitions", count(len(parts)), f"{live} live · {len(parts) - live} finished",
                delta_color="off")
tiles[0].page_link(nav.page("dag"), label="Partition DAG", query_params=link)
tiles[1].metric("Data change records", count(s["records"]["data_change"]),
                f"{count(s['records']['heartbeat'])} heartbeats", delta_color="off")
tiles[1].page_link(nav.page("records"), label="Records", query_params=link)
tiles[2].metric("Transactions", count(s["transactions"]))
tiles[2].page_link(nav.page("transactions"), label="Transactions", query_params=link)
tiles[3].metric("Low watermark", timestamp(low)[11:23] if low else "-")
tiles[3].page_link(nav.page("watermarks"), label="Watermarks", query_params=link)
tiles[4].metric("Anomalies", count(len(found)),
                f"{s['quarantined']} quarantined lines", delta_color="off")
tiles[4].page_link(nav.page("sql"), label="Ask the cache (SQL)", query_params=link)

st.markdown(f"**Low watermark:** {timestamp(low)} — {held_back_sentence(holder)}.")

st.subheader("Anomalies")
if not found:
    st.success("No anomaly: no stall, no heartbeat gap, no partition read incompletely.")
else:
    table = pd.DataFrame(found)
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={"detail": st.column_config.TextColumn(width="large")})
    pages = {"stalled": "watermarks", "heartbeat_gap": "watermarks",
             "watermark_backwards": "watermarks", "ended_without_children": "dag",
             "child_never_read": "dag", "read_failed": "sources"}
    for kind, n in table["kind"].value_counts().sort_index().items():
        target = pages.get(kind, "records")
        first = table[table["kind"] == kind].iloc[0]
        st.page_link(nav.page(target), label=f"{kind.replace('_', ' ')} ({n}): explain",
                     query_params={**link, "partition": first["partition"]}
                     if isinstance(first.get("partition"), str) else link)
