"""Watermarks: the worst stall of the range first, then the state now; each partition's lag
behind the frontier over time; a replay of any moment (in the URL: ``at``)."""

import streamlit as st

from app import figures, overview_view, partitions_view, queries, resources, state, widgets
from app.formatting import (
    clock,
    current_sentence,
    freshness_sentence,
    held_back_at_sentence,
    ns_column,
    range_clip_note,
    short,
    stall_sentence,
)
from app.safe import md

c = widgets.need_stream()
widgets.walkthrough_banner("watermarks")
st.title("Watermarks")
fresh = overview_view.freshness(c.path, c.version, c.stream)
if not fresh.heartbeats:
    # Datastream, a CockroachDB changefeed without resolved timestamps: changes only, so a
    # quiet table is no stall; how late changes arrive is what can be told.
    st.markdown(freshness_sentence(fresh.system, fresh.summary))
    if fresh.events is not None and not fresh.events.empty:
        st.plotly_chart(figures.freshness_figure(fresh.events), key="wm_freshness")
        st.caption("Each change's delay from the source to the reader, over the time it was "
                   "read, one colour per table.")
    st.stop()
head = st.container()  # the worst stall and the state now lead; the threshold comes after

threshold = st.number_input(
    "Stall threshold (seconds behind)", min_value=state.MIN_STALL_S,
    max_value=state.MAX_STALL_S, step=5.0, value=float(c.stall_s), key=f"stall_{c.stall_s:g}",
    help="A partition that is not finished and lags by more than this is stalled; a stall is "
         "a stretch where one partition held the low watermark more than this behind.")
if threshold != c.stall_s:
    state.set_stall_threshold(threshold)
    st.rerun()

found = resources.stalls(c.path, c.version, c.stream, threshold, c.start_ns, c.end_ns)
worst = found[0] if found else None
now = resources.current_state(c.path, c.version, c.stream, c.start_ns, c.end_ns)
head.markdown("#### " + stall_sentence(worst, threshold))
head.markdown(current_sentence(now, threshold))
if len(found) > 1:
    head.caption(f"{len(found)} stalls in this range; the table below lists them, costliest "
               "first." + range_clip_note(c.start_ns, c.end_ns))
chosen = state.selected_partition()
if worst is not None and chosen != worst["partition"]:
    head.button("What was the stalled partition doing?", key="wm_explain",
                icon=":material/arrow_downward:", on_click=state.select_partition,
                args=(worst["partition"],))

# The partitions, sortable and filterable; the selected one (?partition=) drilled into first.
parts = partitions_view.table(c.path, c.version, c.stream, threshold)
if chosen:
    row = parts[parts["token"] == chosen]
    if row.empty:
        st.error(md(f"No partition {chosen!r} in {c.stream}; choose one in the Partitions "
                    "table."))
    else:
        partitions_view.show_silence(c, row.iloc[0], worst)
st.subheader(f"Partitions ({len(parts):,})")
partitions_view.show_table(c, parts, chosen)

replay = resources.watermark_replay(c.path, c.version, c.stream, 240, c.start_ns, c.end_ns)
low = queries.low_watermark_over_time(replay)
if low.empty:
    st.info("No progress marks cached yet for this stream (or in the sidebar's range).")
    st.stop()
moments = [int(t) for t in low["t_ns"]]


def snap(ns: int) -> int:
    return min(moments, key=lambda m: abs(m - ns))


url_at, at_error = state.replay_moment()
if at_error:
    st.error(md(at_error))
default = worst["last_ns"] if worst else moments[-1]
desired = snap(url_at if url_at is not None else default)
if st.session_state.get("wm_at") not in moments or (
        url_at is not None and st.session_state.get("wm_at") != desired):
    st.session_state["wm_at"] = desired


def _moved() -> None:
    state.set_replay_moment(st.session_state["wm_at"])


at = st.select_slider("Replay: the watermarks as they stood at (UTC)", options=moments,
                      format_func=clock, key="wm_at", on_change=_moved,
                      help="Arrow keys step through the moments; the moment is in the URL "
                           "(at=...), so a shared link opens here.")
row = low[low["t_ns"] == at].iloc[0]
st.markdown(held_back_at_sentence(at, row["holder"], row["low_ns"]))

lag, total = queries.lag_over_time(replay, top=12, always=(chosen,) if chosen else ())
st.plotly_chart(figures.lag_over_time_figure(lag, low, threshold, total, stall=worst, at_ns=at,
                                             highlight=chosen or None),
                key="wm_lag_over_time")
st.caption("Each partition's lag behind the frontier (the moment on the x axis) over time: a "
           "partition that goes quiet climbs in a straight line until it speaks again. The "
           "dashed line is the low watermark's lag; shaded: the worst stall; the blue line: the "
           "replay moment.")

lag_now = queries.lag_at(replay, at)
stalled = lag_now[lag_now["lag_s"] > threshold]
left, right = st.columns([3, 2])
with left:
    st.subheader(f"Stalls in the range ({len(found)})")
    if found:
        table = queries.stalls_table(found)
        st.dataframe(table, hide_index=True, width="stretch",
                     column_config={"partition": st.column_config.TextColumn(width="small")})
    st.subheader(f"Stalled at {clock(at)} UTC ({len(stalled)})")
    if stalled.empty:
        st.success(f"No open partition lagged more than {threshold:g}s at {clock(at)} UTC.")
    else:
        st.dataframe(stalled.assign(watermark=ns_column(stalled["watermark_ns"]))
                     [["partition", "lag_s", "watermark"]], hide_index=True, width="stretch",
                     column_config={"partition": st.column_config.TextColumn(width="small")})
    gaps = resources.heartbeat_gaps(c.path, c.version, c.stream, 3.0)
    st.subheader(f"Heartbeat gaps ({len(gaps)})")
    st.caption("Two consecutive progress marks of a partition more than 3 × the heartbeat "
               "interval apart.")
    st.dataframe(widgets.with_datetimes(gaps.assign(partition=[short(t) for t in
                                                               gaps["partition"]])),
                 hide_index=True, width="stretch")
with right:
    st.subheader(f"Lag behind {clock(at)} UTC")
    st.plotly_chart(figures.lag_figure(lag_now, threshold), key="wm_lag_at")
