"""Overview: the worst stall of the range first, then the state now, the lag chart, the stream
at a glance; each number links to the page that explains it."""

from datetime import timedelta

import pandas as pd
import streamlit as st

from app import dag_layout, figures, live, nav, queries, resources, widgets
from app.formatting import count, current_sentence, range_clip_note, stall_sentence, timestamp
from app.safe import md

c = widgets.need_stream()
widgets.walkthrough_banner("overview")
s = resources.summary(c.path, c.version, c.stream)
parts = resources.partitions(c.path, c.version, c.stream, c.stall_s)
found = resources.stalls(c.path, c.version, c.stream, c.stall_s, c.start_ns, c.end_ns)
now = resources.current_state(c.path, c.version, c.stream, c.start_ns, c.end_ns)
anomalies = resources.anomalies(c.path, c.version, c.stream, c.stall_s)
link = {"stream": c.stream}
if c.start_ns is not None or c.end_ns is not None:
    link |= {k: v for k, v in (("start", timestamp(c.start_ns) if c.start_ns else None),
                               ("end", timestamp(c.end_ns) if c.end_ns else None)) if v}

st.title(md(c.stream))
st.caption(f"{md(s['system'])} · source {md(s['source'])} · cached "
           f"{timestamp(s['range_start_ns'])} → {timestamp(s['range_end_ns'])}"
           + range_clip_note(c.start_ns, c.end_ns))

runner = resources.live_runner(c.stream)


def lead(version: int) -> None:
    """The worst stall, the state now, the lag chart (and, live, what just happened)."""
    found = resources.stalls(c.path, version, c.stream, c.stall_s, c.start_ns, c.end_ns)
    worst = found[0] if found else None
    now = resources.current_state(c.path, version, c.stream, c.start_ns, c.end_ns)
    if runner is not None:
        st.text(runner.status())
    st.markdown("#### " + stall_sentence(worst, c.stall_s))
    st.markdown(current_sentence(now, c.stall_s))
    if worst is not None:
        st.page_link(nav.page("watermarks"), label="Explain the worst stall",
                     icon=":material/arrow_forward:",
                     query_params={**link, "partition": worst["partition"],
                                   "at": timestamp(worst["last_ns"])})
    replay = resources.watermark_replay(c.path, version, c.stream, 240, c.start_ns, c.end_ns)
    low = queries.low_watermark_over_time(replay)
    if not low.empty:
        lag, total = queries.lag_over_time(replay, top=12)
        fig = figures.lag_over_time_figure(lag, low, c.stall_s, total, stall=worst)
        fig.update_layout(height=300)
        st.plotly_chart(fig, key="ov_lag")
    if runner is not None and now is not None:
        parts_now = resources.partitions(c.path, version, c.stream, c.stall_s)
        edges_now = resources.edges(c.path, version, c.stream)
        said = live.events(parts_now, edges_now, found, now["t_ns"] - 180 * 10**9)
        st.markdown("**In the last 3 minutes:**  \n" + ("  \n".join(said[:8]) if said
                                                        else "nothing new."))
        nodes = dag_layout.layout(parts_now)
        dag = figures.dag_figure(nodes, dag_layout.edge_segments(nodes, edges_now),
                                 holder=now["holder"] if now["lag_s"] > c.stall_s else None)
        st.plotly_chart(dag, key="ov_live_dag")


boot = resources.bootstrap_of(c.path)


def following() -> None:
    """Rerun by itself while data lands: the bootstrap's progress, then the lead."""
    if boot is not None and (boot.running or boot.error):
        if boot.error:
            st.error(md(boot.error))
        else:
            st.progress(boot.fraction, text=md(boot.progress_text()))
    lead(resources.version(c.path))


if (runner is not None and runner.running) or (boot is not None and boot.running):
    every = 2.0 if boot is not None and boot.running else live.DEFAULT_EVERY_S
    st.fragment(run_every=timedelta(seconds=every))(following)()
else:
    lead(c.version)

st.download_button(
    "Download the HTML report", lambda: resources.html_report(c.path, c.stream, c.stall_s,
                                                              c.start_ns, c.end_ns),
    file_name="change-stream-report.html", mime="text/html", key="ov_report",
    icon=":material/download:",
    help="One self-contained file (the DAG, lag over time, the worst stall, anomalies, "
         "transactions; plotly embedded, opens offline) for a bug report or an email.")

ranged = c.start_ns is not None or c.end_ns is not None
records = (resources.records_count(c.path, c.version, c.stream, queries.RecordFilter(
    start_ns=c.start_ns, end_ns=c.end_ns)) if ranged else s["records"]["data_change"])
txns = (resources.completeness(c.path, c.version, c.stream, queries.TxnFilter(
    start_ns=c.start_ns, end_ns=c.end_ns))["transactions"] if ranged else s["transactions"])
tiles = st.columns(5)
alive = int((~parts["finished"]).sum()) if not parts.empty else 0
tiles[0].metric("Partitions", count(len(parts)), f"{alive} live · {len(parts) - alive} finished",
                delta_color="off")
tiles[0].page_link(nav.page("dag"), label="Partition DAG", query_params=link)
tiles[1].metric("Data change records", count(records),
                f"{count(s['records']['heartbeat'])} heartbeats",
                delta_color="off")
tiles[1].page_link(nav.page("records"), label="Records", query_params=link)
tiles[2].metric("Transactions", count(txns))
tiles[2].page_link(nav.page("transactions"), label="Transactions", query_params=link)
tiles[3].metric("Low watermark", timestamp(now["low_ns"])[11:19] if now else "-")
tiles[3].page_link(nav.page("watermarks"), label="Watermarks", query_params=link)
tiles[4].metric("Anomalies", count(len(anomalies)),
                f"{s['quarantined']} quarantined lines", delta_color="off")
tiles[4].page_link(nav.page("sql"), label="Ask the cache (SQL)", query_params=link)

st.subheader("Anomalies")
if not anomalies:
    st.success("No anomaly: no stall, no heartbeat gap, no partition read incompletely.")
else:
    table = pd.DataFrame(anomalies)
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={"detail": st.column_config.TextColumn(width="large")})
    by_partition = {f["partition"]: f for f in found}
    for kind, n in table["kind"].value_counts().sort_index().items():
        target = widgets.ANOMALY_PAGES.get(kind, "records")
        first = table[table["kind"] == kind].iloc[0]
        params = dict(link)
        token = first.get("partition")
        if isinstance(token, str):
            params["partition"] = token
            if target == "watermarks":
                moment = by_partition.get(token, {}).get("last_ns")
                params["at"] = timestamp(moment) if moment else first.get("at")
        st.page_link(nav.page(target), label=f"{kind.replace('_', ' ')} ({n}): explain",
                     query_params={k: v for k, v in params.items() if isinstance(v, str)})
