"""Overview: the worst stall of the range first (or, for systems without heartbeats, how fresh
the changes are), then the state now, the lag chart, the stream at a glance; each number links
to the page that explains it. Every figure comes from one read of the cache
(``app.overview_view``) and follows new data in the same fragment."""

from datetime import timedelta

import pandas as pd
import streamlit as st

from app import live, nav, overview_view, resources, widgets
from app.formatting import (
    clock,
    count,
    current_sentence,
    freshness_sentence,
    range_clip_note,
    span_text,
    stall_sentence,
    timestamp,
)
from app.safe import md

c = widgets.need_stream()
widgets.walkthrough_banner("overview")
link = {"stream": c.stream}
if c.start_ns is not None or c.end_ns is not None:
    link |= {k: v for k, v in (("start", timestamp(c.start_ns) if c.start_ns else None),
                               ("end", timestamp(c.end_ns) if c.end_ns else None)) if v}
runner = resources.live_runner(c.stream)
boot = resources.bootstrap_of(c.path)


def lead(d: overview_view.Drawn) -> None:
    """The worst stall (or freshness), the state now, the lag chart (and, live, what just
    happened)."""
    v = d.view
    if runner is not None:
        st.text(runner.status())
    if not v.heartbeats:
        st.markdown(freshness_sentence(v.summary["system"], v.freshness))
        return
    st.markdown("#### " + stall_sentence(v.worst, c.stall_s))
    st.markdown(current_sentence(v.now, c.stall_s))
    if v.worst is not None:
        st.page_link(nav.page("watermarks"), label="Explain the worst stall",
                     icon=":material/arrow_forward:",
                     query_params={**link, "partition": v.worst["partition"],
                                   "at": timestamp(v.worst["last_ns"])})
    if d.lag is not None:
        st.plotly_chart(d.lag, key="ov_lag")
    if runner is not None and v.now is not None:
        st.markdown("**In the last 3 minutes:**  \n" + ("  \n".join(d.said[:8]) if d.said
                                                        else "nothing new."))
        if d.dag is not None:
            st.plotly_chart(d.dag, key="ov_live_dag")


def tiles(v: overview_view.View) -> None:
    s = v.summary
    cols = st.columns(5)
    cols[0].metric("Partitions", count(len(v.parts)),
                   f"{v.alive} live · {len(v.parts) - v.alive} finished",
                   delta_color="off", delta_arrow="off")
    cols[0].page_link(nav.page("dag"), label="Partition DAG", query_params=link)
    cols[1].metric("Data change records", count(v.records),
                   f"{count(s['records']['heartbeat'])} heartbeats",
                   delta_color="off", delta_arrow="off")
    cols[1].page_link(nav.page("records"), label="Records", query_params=link)
    cols[2].metric("Transactions", count(v.transactions))
    cols[2].page_link(nav.page("transactions"), label="Transactions", query_params=link)
    if v.heartbeats:
        # UTC in the label: a clock time and its zone do not fit a fifth of the page's width.
        cols[3].metric("Low watermark (UTC)", clock(v.now["low_ns"]) if v.now else "-")
    else:
        latest = v.freshness["latest_ns"] if v.freshness else None
        cols[3].metric("Latest change (UTC)", clock(latest) if latest is not None else "-")
    cols[3].page_link(nav.page("watermarks"), label="Watermarks", query_params=link)
    cols[4].metric("Anomalies", count(len(v.anomalies)),
                   f"{count(s['quarantined'])} quarantined lines",
                   delta_color="off", delta_arrow="off")
    cols[4].page_link(nav.page("sql"), label="Ask the cache (SQL)", query_params=link)


def anomalies_box(v: overview_view.View) -> None:
    st.subheader("Anomalies")
    if not v.anomalies:
        words = ("no stall, no heartbeat gap, no partition read incompletely" if v.heartbeats
                 else "nothing the system's own rules flag, no partition read incompletely")
        st.success(f"No anomaly: {words}.")
        return
    table = pd.DataFrame(v.anomalies)
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={"detail": st.column_config.TextColumn(width="large"),
                                "partition": st.column_config.TextColumn(width="small")})
    by_partition = {f["partition"]: f for f in v.found}
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


def overview(version: int) -> None:
    """The whole page at ``version`` of the cache, from one read."""
    d = overview_view.drawn(c.path, version, c.stream, c.stall_s, c.start_ns, c.end_ns,
                            runner is not None)
    v = d.view
    s = v.summary
    st.title(md(c.stream))
    st.caption(f"{md(s['system'])} · source {md(s['source'])} · cached "
               f"{span_text(s['range_start_ns'], s['range_end_ns'])}"
               + range_clip_note(c.start_ns, c.end_ns))
    lead(d)
    tiles(v)
    anomalies_box(v)


def _prepare() -> int:
    """After a live refresh, off the page's run: the Overview at the new version, read and
    drawn into the cache, so the fragment's next run only puts it on screen (a run that reads
    and draws for seconds greys the page out meanwhile). Returns that version."""
    version = resources.version(c.path)
    overview_view.drawn(c.path, version, c.stream, c.stall_s, c.start_ns, c.end_ns, True)
    return version


def following() -> None:
    """Rerun by itself while data lands: the bootstrap's progress, then the page as it is
    now. Live, the version shown is the newest one the runner has prepared."""
    if boot is not None and (boot.running or boot.error):
        if boot.error:
            st.error(md(boot.error))
        else:
            st.progress(boot.fraction, text=md(boot.progress_text()))
    ready = runner.prepared.get(follower) if runner is not None else None
    overview(ready if ready is not None else resources.version(c.path))


follower = ("overview", c.stall_s, c.start_ns, c.end_ns)
if runner is not None and runner.running:
    runner.follow(follower, _prepare)
# While the fragment redraws (well under a second: it only draws what the runner prepared),
# Streamlit marks its elements stale and fades them after half a second; on a view that
# refreshes every few seconds by itself that fade is flicker, not news. A fixed style, no data.
KEEP_LIVE_OPAQUE = ("<style>[data-testid='stMain'] [data-stale='true']"
                    "{opacity: 1 !important; transition: none !important;}</style>")
if (runner is not None and runner.running) or (boot is not None and boot.running):
    st.html(KEEP_LIVE_OPAQUE)
    every = 2.0 if boot is not None and boot.running else live.DEFAULT_EVERY_S
    st.fragment(run_every=timedelta(seconds=every))(following)()
else:
    overview(c.version)

st.download_button(
    "Download the HTML report", lambda: resources.html_report(c.path, c.stream, c.stall_s,
                                                              c.start_ns, c.end_ns),
    file_name="change-stream-report.html", mime="text/html", key="ov_report",
    icon=":material/download:",
    help="One self-contained file (the DAG, lag over time, the worst stall, anomalies, "
         "transactions; plotly embedded, opens offline) for a bug report or an email.")
