"""Partition DAG: partitions on their lanes over time, edges parent -> child by kind."""

import streamlit as st

from app import dag_layout, figures, resources, state, widgets
from app.formatting import range_clip_note, to_datetime

c = widgets.need_stream()
highlight = widgets.walkthrough_banner("dag")
st.title("Partition DAG")

parts = resources.partitions(c.path, c.version, c.stream, c.stall_s)
edges = resources.edges(c.path, c.version, c.stream)
nodes = dag_layout.layout(parts)
segments = dag_layout.edge_segments(nodes, edges)
selected = state.selected_partition()
if selected and selected not in set(nodes["token"]):
    st.error(f"No partition {selected!r} in {c.stream}; choose one in the chart or the list.")
    selected = None

kinds = edges["kind"].value_counts()
st.caption(f"{len(nodes):,} partitions on {int(nodes['lane'].max()) + 1 if len(nodes) else 0} "
           f"lanes · {kinds.get('split', 0)} split edges · {kinds.get('merge', 0)} merge edges · "
           f"{kinds.get('move', 0)} moves · stalled after {c.stall_s:g}s "
           "(threshold on the Watermarks page). Click a partition to drill into it."
           + range_clip_note(c.start_ns, c.end_ns))
marked = [*highlight, *([selected] if selected else [])]
fig = figures.dag_figure(nodes, segments, highlight=marked)
if c.start_ns or c.end_ns:
    fig.update_xaxes(range=[to_datetime(c.start_ns), to_datetime(c.end_ns)])
event = st.plotly_chart(fig, key="dag_chart", on_select="rerun", selection_mode="points",
                        config={"toImageButtonOptions": {"format": "png", "filename": "dag",
                                                         "scale": 2}})
points = (event or {}).get("selection", {}).get("points", []) if event else []
clicked = next((p["customdata"][0] for p in points if p.get("customdata")), None)
if clicked and clicked != selected:
    state.select_partition(clicked)
    selected = clicked

tokens = list(nodes["token"])
pick = st.selectbox("Partition", ["(none)", *tokens],
                    index=tokens.index(selected) + 1 if selected in tokens else 0,
                    key=f"dag_pick_{selected}")
if pick != "(none)" and pick != selected:
    state.select_partition(pick)
    st.rerun()

left, mid, right = st.columns(3)
left.download_button("Export DOT", dag_layout.to_dot(nodes, edges, c.stream),
                     file_name=f"{c.stream}-dag.dot", mime="text/vnd.graphviz")
mid.download_button("Export SVG", dag_layout.to_svg(nodes, segments),
                    file_name=f"{c.stream}-dag.svg", mime="image/svg+xml")
right.caption("PNG: the camera icon of the chart's toolbar.")

merges = edges[edges["kind"] == "merge"].groupby("child")["parent"].apply(list)
with st.expander(f"Merges ({len(merges)}) and splits", expanded=bool(highlight)):
    st.dataframe(edges[edges["kind"].isin(["split", "merge", "move"])], hide_index=True,
                 width="stretch", height=240)

if selected:
    widgets.partition_panel(c, selected)
