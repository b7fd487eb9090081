"""Records: data change records (and heartbeats) with filters, keyset paging, export."""

import streamlit as st

from app import queries, resources, state, widgets
from app.formatting import count

PAGE_SIZE = 100

c = widgets.need_stream()
widgets.walkthrough_banner("records")
st.title("Records")
opts = resources.choices(c.path, c.version, c.stream)

cols = st.columns(4)
table = cols[0].selectbox("Table", ["(all)", *opts["tables"]], key="rec_table")
mod = cols[1].selectbox("Mod type", ["(all)", *opts["mod_types"]], key="rec_mod")
wanted = state.selected_partition()
choices = ["(all)", *opts["partitions"]]
partition = cols[2].selectbox("Partition", choices,
                              index=choices.index(wanted) if wanted in choices else 0,
                              key=f"rec_partition_{wanted}")
hide = cols[3].toggle("Hide heartbeats", value=True, key="rec_hide_hb")
k1, k2 = st.columns([3, 1])
key_text = k1.text_input("Key (JSON object of the key columns)", key="rec_key",
                         placeholder='{"AccountId": "acc-0000001"}')
txid = k2.text_input("Transaction id", key="rec_txid")
try:
    key = queries.parse_key(key_text)
except ValueError as e:
    k1.error(str(e))
    key = None
if partition != "(all)" and partition != wanted:
    state.select_partition(partition)
elif partition == "(all)" and wanted:
    state.select_partition(None)

f = queries.RecordFilter(table=None if table == "(all)" else table, key=key,
                         mod_type=None if mod == "(all)" else mod,
                         partition=None if partition == "(all)" else partition,
                         txid=txid.strip() or None, start_ns=c.start_ns, end_ns=c.end_ns,
                         heartbeats=not hide)
total = resources.records_count(c.path, c.version, c.stream, f)

# Keyset paging: a stack of page-start cursors, reset whenever the filter changes.
if st.session_state.get("rec_filter") != f:
    st.session_state["rec_filter"] = f
    st.session_state["rec_cursors"] = [None]
cursors = st.session_state["rec_cursors"]
page = resources.records_page(c.path, c.version, c.stream, f, cursors[-1], PAGE_SIZE)
first = (len(cursors) - 1) * PAGE_SIZE
st.caption(f"{count(total)} rows match · rows {count(first + 1 if len(page) else 0)}–"
           f"{count(first + len(page))}" + ("" if f.heartbeats and not f.data_only else
                                            " · heartbeats hidden" if hide else ""))
st.dataframe(widgets.with_datetimes(page), hide_index=True, width="stretch", height=420)

nav_l, nav_m, nav_r = st.columns([1, 1, 4])
if nav_l.button("◀ Previous", disabled=len(cursors) == 1, key="rec_prev"):
    cursors.pop()
    st.rerun()
if nav_m.button("Next ▶", disabled=first + len(page) >= total, key="rec_next"):
    last = page.iloc[-1]
    cursors.append((int(last["ts_ns"]), str(last["record_key"])))
    st.rerun()

st.subheader("Export the filtered data change records")
e1, e2 = st.columns([1, 3])
fmt = e1.selectbox("Format", queries.EXPORT_FORMATS, key="rec_fmt",
                   format_func={"csv": "CSV", "jsonl": "JSON Lines",
                                "recording": "recording (re-importable)"}.get)
e2.download_button(
    f"Download {fmt}", lambda: resources.export(c.path, c.stream, f, fmt),
    file_name=f"{c.stream}-records.{'csv' if fmt == 'csv' else 'jsonl'}",
    mime="text/csv" if fmt == "csv" else "application/x-ndjson", key="rec_download")
