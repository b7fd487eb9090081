"""UI pieces several pages share: the stream guard, the partition panel, the walkthrough."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd
import streamlit as st

from . import live, nav, resources, state, walkthrough
from .formatting import clock, count, ns_column, short, timestamp
from .queries import TxnFilter
from .safe import md

ANOMALY_PAGES = {"stall": "watermarks", "stalled": "watermarks", "heartbeat_gap": "watermarks",
                 "watermark_backwards": "watermarks", "ended_without_children": "dag",
                 "child_never_read": "dag", "read_failed": "sources"}


def clicked_point(key: str) -> str | None:
    """The ``customdata[0]`` of the point a chart's last selection event carried (read from
    the widget's state before the chart is drawn again), None without one."""
    event = st.session_state.get(key)
    if not event:
        return None
    try:
        points = event["selection"]["points"]
    except (KeyError, TypeError):
        return None
    for p in points or []:
        data = p.get("customdata")
        if data:
            return str(data[0])
    return None


def need_stream() -> state.Ctx:
    """The context, or a message in place and the page stops (empty or unusable cache)."""
    c = state.ctx()
    if c.stream is None:
        error = st.session_state.get("cache_error")
        if error:
            st.error(md(error))
        else:
            st.info("The cache holds no stream yet. Pull or import one on the Sources page.")
        st.page_link(nav.page("sources"), label="Go to Sources and pull",
                     icon=":material/arrow_forward:")
        st.stop()
    if c.starting:
        st.title(md(c.stream))
        st.fragment(run_every=timedelta(seconds=1))(_starting)(c)
        st.stop()
    return c


def _starting(c: state.Ctx) -> None:
    """A live stream asked for and not cached yet: say so, and rerun the app once it has
    landed (or its start has ended), so every page then shows it."""
    runner = resources.live_runner(c.stream)
    if not live.is_starting(c.stream, runner):
        st.rerun()
    st.info(md(f"{c.stream} is starting: its source and its first pull. This page shows it "
               "as soon as the first pull has landed."))
    if runner is not None:
        st.text(runner.status())


def with_datetimes(df: pd.DataFrame) -> pd.DataFrame:
    """``*_ns`` columns shown as UTC datetimes (renamed without the suffix)."""
    out = df.copy()
    for col in [c for c in out.columns if c.endswith("_ns")]:
        out[col[:-3]] = ns_column(out[col])
        out = out.drop(columns=[col])
    return out


def partition_panel(c: state.Ctx, token: str) -> None:
    """One partition drilled into: its numbers, records, heartbeats, parents and children."""
    detail = resources.partition_detail(c.path, c.version, c.stream, token)
    row = detail["partition"]
    if row.empty:
        st.warning(md(f"No partition {token!r} in {c.stream}; choose one in the chart or the "
                      "list."))
        return
    r = row.iloc[0]
    st.markdown(f"#### Partition {md(token)}")
    cols = st.columns(5)
    cols[0].metric("state", r["state"])
    cols[1].metric("data change records", count(r["data_change_records"]))
    cols[2].metric("heartbeats", count(r["heartbeats"]))
    # Clock times in the tiles (a tile cuts longer text); the full times in the caption.
    cols[3].metric("start (UTC)", clock(_ns(r["start_ts"])))
    cols[4].metric("end / watermark (UTC)", clock(_ns(r["end_ts"] if not pd.isna(r["end_ts"])
                                                      else r["watermark"])))
    st.caption(f"start {timestamp(_ns(r['start_ts']))} · end "
               f"{timestamp(_ns(r['end_ts'])) if not pd.isna(r['end_ts']) else '(open)'} · "
               f"watermark {timestamp(_ns(r['watermark']))}"
               + (f" · error: {md(r['error'])}" if r.get("error") else ""))
    left, right = st.columns(2)
    with left:
        st.markdown("**Parents**")
        parents = [p for p in detail["parents"]["parent"] if p is not None and not pd.isna(p)]
        if not parents:
            st.write("the virtual root (a child of the initial query)")
        for p in parents:
            st.button(f"↑ {md(short(p, 24))}", key=f"parent-{p}", on_click=state.select_partition,
                      args=(p,))
    with right:
        st.markdown("**Children**")
        kids = list(detail["children"]["child"])
        if not kids:
            st.write("none (still open, or ended at the range end)")
        for k in kids:
            st.button(f"↓ {md(short(k, 24))}", key=f"child-{k}", on_click=state.select_partition,
                      args=(k,))
    tab_records, tab_beats = st.tabs([f"Records ({count(r['data_change_records'])})",
                                      f"Heartbeats ({count(r['heartbeats'])})"])
    with tab_records:
        recs = detail["records"]
        st.dataframe(recs, hide_index=True, width="stretch", height=260)
        if len(recs) >= 500:
            st.caption("The first 500 records; the Records page pages through all of them.")
        st.page_link(nav.page("records"), label="Browse this partition's records",
                     query_params={"stream": c.stream, "partition": token})
    with tab_beats:
        beats = detail["heartbeats"]
        # The silence between heartbeats is what a reader looks for: said per row.
        gap = beats["timestamp"].diff().dt.total_seconds().round(1)
        st.dataframe(beats.assign(**{"seconds since the previous": gap}), hide_index=True,
                     width="stretch", height=260,
                     column_config={"seconds since the previous": st.column_config.ProgressColumn(
                         format="%.1f", min_value=0.0,
                         max_value=float(gap.max()) if gap.notna().any() else 1.0)})


def _ns(value) -> int | None:
    if value is None or pd.isna(value):
        return None
    return int(pd.Timestamp(value).value)


# --- the walkthrough --------------------------------------------------------------------------


def walkthrough_steps(c: state.Ctx) -> list[walkthrough.Step]:
    if c.stream is None:
        return []
    parts = resources.partitions(c.path, c.version, c.stream, c.stall_s)
    edges = resources.edges(c.path, c.version, c.stream)
    txns = resources.transactions(c.path, c.version, c.stream, TxnFilter(), 20000)
    found = resources.stalls(c.path, c.version, c.stream, c.stall_s)
    return walkthrough.steps(parts, edges, txns, found[0] if found else None)


def go_to_step(steps: list[walkthrough.Step], index: int) -> None:
    index = max(0, min(len(steps) - 1, index))
    step = steps[index]
    params = {k: v for k, v in st.query_params.items() if k not in ("partition", "txn", "at")}
    params["step"] = str(index)
    if step.at_ns is not None:
        params["at"] = timestamp(step.at_ns)
    if step.partition:
        params["partition"] = step.partition
    state.select_partition(step.partition)  # a step without one shows none, even remembered
    if step.txn:
        params["txn"] = step.txn
    st.session_state["highlight"] = step.highlight
    st.switch_page(nav.page(step.page), query_params=params)


def current_step(steps: list[walkthrough.Step]) -> tuple[int, walkthrough.Step] | None:
    if not st.session_state.get("walkthrough") or not steps:
        return None
    try:
        index = int(state.param("step") or 0)
    except ValueError:
        index = 0
    index = max(0, min(len(steps) - 1, index))
    return index, steps[index]


def walkthrough_banner(page_name: str) -> tuple[str, ...]:
    """On the page a walkthrough step talks about: its text; returns what to highlight."""
    if not st.session_state.get("walkthrough"):
        return ()
    c = state.ctx()
    found = current_step(walkthrough_steps(c))
    if found is None or found[1].page != page_name:
        return ()
    index, step = found
    st.info(f"**Walkthrough {index + 1}: {md(step.title)}.** {step.text}",
            icon=":material/tour:")
    return tuple(st.session_state.get("highlight") or step.highlight)
