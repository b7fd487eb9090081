"""Partition DAG: partitions as bars on their lanes over time, edges parent -> child by kind."""

import streamlit as st

from app import figures, nav, overview_view, queries, resources, state, widgets
from app.formatting import range_clip_note, to_datetime
from app.safe import md

c = widgets.need_stream()
highlight = widgets.walkthrough_banner("dag")
st.title("Partition DAG")

drawn = resources.dag(c.path, c.version, c.stream, c.stall_s)  # laid out once per version
nodes, edges, segments = drawn["nodes"], drawn["edges"], drawn["segments"]
tokens = set(nodes["token"])
selected = state.selected_partition()

# A click selects a partition every time: the chart's widget key changes after each click, so
# the next click starts a fresh selection (plotly toggles a re-clicked point off otherwise).
n = st.session_state.setdefault("dag_chart_n", 0)
clicked = widgets.clicked_point(f"dag_chart_{n}")
if clicked is not None:
    st.session_state["dag_chart_n"] = n = n + 1
    if clicked in tokens:
        state.select_partition(clicked)
        selected = clicked
if selected and selected not in tokens:
    st.error(md(f"No partition {selected!r} in {c.stream}; choose one in the chart or the "
                "list."))
    selected = None

# Without heartbeats (Datastream, ...) a quiet partition is only quiet: no stall marks.
beats = overview_view.freshness(c.path, c.version, c.stream).heartbeats
now = (resources.current_state(c.path, c.version, c.stream, c.start_ns, c.end_ns) if beats
       else None)
holder = queries.holding_back(now, c.stall_s)
found = (resources.stalls(c.path, c.version, c.stream, c.stall_s, c.start_ns, c.end_ns)
         if beats else [])
notes, spans = figures.stall_marks(found)

kinds = edges["kind"].value_counts()
st.caption(f"{len(nodes):,} partitions on {int(nodes['lane'].max()) + 1 if len(nodes) else 0} "
           f"lanes · {kinds.get('split', 0)} split edges · {kinds.get('merge', 0)} merge edges · "
           f"{kinds.get('move', 0)} moves · stalled after {c.stall_s:g}s. Each bar runs from a "
           "partition's start to its end (or watermark); "
           + ("click a bar to drill into it" if len(nodes) <= figures.CLICKABLE_BARS else
              f"above {figures.CLICKABLE_BARS:,} partitions the bars are drawn as one path per "
              "state, so choose a partition in the list below the chart")
           + ", drag to zoom in time, double-click to zoom out."
           + range_clip_note(c.start_ns, c.end_ns))
marked = [*highlight, *([selected] if selected else [])]
fig = figures.dag_figure(nodes, segments, highlight=marked, holder=holder, notes=notes,
                         spans=spans)
if (c.start_ns is not None or c.end_ns is not None) and len(nodes):
    # the sidebar's range, within the partitions' own span (a range of decades around an
    # hour of data would draw the bars as dots)
    lo, hi = int(nodes["x0_ns"].min()), int(nodes["x1_ns"].max())
    shown_lo = lo if c.start_ns is None else min(max(c.start_ns, lo), hi)
    shown_hi = hi if c.end_ns is None else max(min(c.end_ns, hi), shown_lo)
    if shown_hi > shown_lo:
        fig.update_xaxes(range=[to_datetime(shown_lo), to_datetime(shown_hi)])
st.plotly_chart(fig, key=f"dag_chart_{n}", on_select="rerun", selection_mode="points",
                config={"toImageButtonOptions": {"format": "png", "filename": "dag",
                                                 "scale": 2}})

ordered = list(nodes.sort_values(["lane", "x0_ns"])["token"])
pick = st.selectbox("Partition", ["(none)", *ordered],
                    index=ordered.index(selected) + 1 if selected in ordered else 0,
                    key=f"dag_pick_{selected}")
if pick != (selected or "(none)"):  # another partition, or "(none)": none selected
    state.select_partition(None if pick == "(none)" else pick)
    st.rerun()

left, mid, right = st.columns(3)
left.download_button("Export DOT", drawn["dot"],
                     file_name="dag.dot", mime="text/vnd.graphviz")
mid.download_button("Export SVG", drawn["svg"],
                    file_name="dag.svg", mime="image/svg+xml")
right.caption("PNG: the camera icon of the chart's toolbar.")

merges = edges[edges["kind"] == "merge"].groupby("child")["parent"].apply(list)
with st.expander(f"Merges ({len(merges)}) and splits", expanded=bool(highlight)):
    st.dataframe(edges[edges["kind"].isin(["split", "merge", "move"])], hide_index=True,
                 width="stretch", height=240)

if selected:
    if beats:
        st.page_link(nav.page("watermarks"), label="What was it doing? (its silences)",
                     icon=":material/timeline:",
                     query_params={k: v for k, v in {"stream": c.stream,
                                                     "start": state.param("start"),
                                                     "end": state.param("end"),
                                                     "partition": selected}.items() if v})
    widgets.partition_panel(c, selected)
