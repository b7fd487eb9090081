"""Watermarks: every partition's watermark over time, the low watermark and who holds it."""

import streamlit as st

from app import figures, queries, resources, state, widgets
from app.formatting import clock, held_back_at_sentence, held_back_sentence, ns_column

c = widgets.need_stream()
widgets.walkthrough_banner("watermarks")
st.title("Watermarks")

holder = resources.holding_back(c.path, c.version, c.stream)
sentence = held_back_sentence(holder)
st.markdown(f"#### {sentence[0].upper()}{sentence[1:]}")

threshold = st.number_input(
    "Stall threshold (seconds behind)", min_value=1.0, max_value=86_400.0, step=5.0,
    value=float(st.session_state.get("stall_s", state.DEFAULT_STALL_S)), key="stall_input",
    help="A partition that is not finished and lags by more than this is stalled.")
st.session_state["stall_s"] = threshold

replay = resources.watermark_replay(c.path, c.version, c.stream, 240)
low = queries.low_watermark_over_time(replay)
if low.empty:
    st.info("No progress marks cached yet for this stream.")
    st.stop()
moments = list(low["t_ns"])
wanted = st.session_state.get("replay_at") or moments[-1]
index = min(range(len(moments)), key=lambda i: abs(moments[i] - wanted))
at = st.select_slider("Replay: the watermarks as they stood at", options=moments,
                      value=moments[index], format_func=clock, key=f"replay_{wanted}")
st.session_state["replay_at"] = at
now = low[low["t_ns"] == at].iloc[0]
st.markdown(held_back_at_sentence(at, now["holder"], now["low_ns"]))

gaps = resources.heartbeat_gaps(c.path, c.version, c.stream, 3.0)
fig = figures.watermark_figure(replay, low, at_ns=at, highlight=now["holder"], gaps=gaps)
st.plotly_chart(fig, key="wm_chart")

lag = queries.lag_at(replay, at)
stalled = lag[lag["lag_s"] > threshold]
left, right = st.columns([3, 2])
with left:
    st.subheader(f"Stalled at {clock(at)} ({len(stalled)})")
    if stalled.empty:
        st.success(f"No open partition lagged more than {threshold:g}s at {clock(at)}.")
    else:
        st.dataframe(stalled.assign(watermark=ns_column(stalled["watermark_ns"]))
                     [["partition", "lag_s", "watermark"]], hide_index=True, width="stretch")
    st.subheader(f"Heartbeat gaps ({len(gaps)})")
    st.caption("Two consecutive progress marks of a partition more than 3 × the heartbeat "
               "interval apart (shaded on the chart).")
    st.dataframe(widgets.with_datetimes(gaps), hide_index=True, width="stretch")
with right:
    st.subheader("Lag behind the moment shown")
    st.plotly_chart(figures.lag_figure(lag, threshold), key="lag_chart")
