"""Records: data change records (and heartbeats) with filters, search in values, keyset
paging, a row's detail (old and new values side by side, pretty JSON), export."""

import json

import pandas as pd
import streamlit as st

from app import queries, resources, state, widgets
from app.formatting import count, timestamp
from app.safe import md

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
if wanted and wanted not in choices:
    st.error(md(f"No partition {wanted!r} in {c.stream}; showing all partitions (choose one "
                "in the Partition list)."))
partition = cols[2].selectbox("Partition", choices,
                              index=choices.index(wanted) if wanted in choices else 0,
                              key=f"rec_partition_{wanted}")
hide = cols[3].toggle("Hide heartbeats", value=True, key="rec_hide_hb")
k1, k2, k3 = st.columns([2, 2, 1])
columns = resources.key_columns(c.path, c.version, c.stream)
chosen_table = None if table == "(all)" else table
sample = (resources.sample_keys(c.path, c.version, c.stream, chosen_table)[:1]
          if chosen_table else [])
key_text = k1.text_input("Key (JSON object of the key columns)", key="rec_key",
                         placeholder=queries.key_placeholder(columns, chosen_table,
                                                             sample[0] if sample else None))
search = k2.text_input("Search in keys and values", key="rec_search",
                       placeholder="any text, e.g. a name or an amount")
txid = k3.text_input("Transaction id", key="rec_txid")
try:
    key = queries.parse_key(key_text)
except ValueError as e:
    k1.error(md(str(e)))
    key = None
if partition != "(all)" and partition != wanted:
    state.select_partition(partition)
elif partition == "(all)" and wanted in choices:
    state.select_partition(None)

f = queries.RecordFilter(table=None if table == "(all)" else table, key=key,
                         mod_type=None if mod == "(all)" else mod,
                         partition=None if partition == "(all)" else partition,
                         txid=txid.strip() or None, start_ns=c.start_ns, end_ns=c.end_ns,
                         heartbeats=not hide, search=search.strip() or None)
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
# The commit time as text, to the nanosecond the source gave: a browser's dates stop at the
# millisecond, and the records of one transaction often share it.
shown = widgets.with_datetimes(page.drop(columns=["cursor_ns", "ts_ns"])).assign(
    time=[timestamp(ns) for ns in page["ts_ns"]])
shown = shown[["time", *[col for col in shown.columns if col != "time"]]]
# A new filter or page is a new table: its selection starts empty (a row picked in another
# table is no row of this one).
event = st.dataframe(shown, hide_index=True, width="stretch", height=420,
                     on_select="rerun", selection_mode="single-row",
                     key=f"rec_rows_{abs(hash(f)) % 10**12}_{len(cursors)}",
                     column_config={"time": st.column_config.TextColumn("time (UTC)")})
rows = [r for r in (event.selection.rows if event is not None else []) if 0 <= r < len(page)]
if rows:
    picked = page.drop(columns=["cursor_ns"]).iloc[rows[0]]
    if picked["kind"] == "heartbeat":
        st.info("A heartbeat: no values, only the partition's progress mark.")
    else:
        mods = resources.record_detail(c.path, c.version, c.stream, picked["record_key"])
        st.subheader("Row detail")
        st.caption("Old and new values side by side, one table per mod; the record as JSON "
                   "below.")
        for m in mods.itertuples():
            old = json.loads(m.old_values) if m.old_values else {}
            new = json.loads(m.new_values) if m.new_values else {}
            cols_ = sorted(set(old) | set(new))
            st.text(f"mod {m.mod_index}: keys {m.keys}")
            st.dataframe(pd.DataFrame({
                "column": cols_, "old": [queries.cell(old.get(x)) for x in cols_],
                "new": [queries.cell(new.get(x)) for x in cols_],
                "changed": [old.get(x) != new.get(x) for x in cols_]}),
                hide_index=True, width="stretch")
        record = {k: (v.item() if hasattr(v, "item") else v) for k, v in picked.items()
                  if not pd.isna(v)}
        record["mods"] = [{"keys": json.loads(m.keys),
                           "old_values": json.loads(m.old_values) if m.old_values else None,
                           "new_values": json.loads(m.new_values) if m.new_values else None}
                          for m in mods.itertuples()]
        st.code(json.dumps(record, indent=2, default=str, ensure_ascii=False), language="json")
else:
    st.caption("Click a row's left edge to see its detail.")

nav_l, nav_m, nav_r = st.columns([1, 1, 4])
if nav_l.button("◀ Previous", disabled=len(cursors) == 1, key="rec_prev"):
    cursors.pop()
    st.rerun()
if nav_m.button("Next ▶", disabled=first + len(page) >= total, key="rec_next"):
    last = page.iloc[-1]
    cursors.append((int(last["cursor_ns"]), str(last["record_key"])))
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
