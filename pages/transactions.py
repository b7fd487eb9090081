"""Transactions: a timeline across partitions, completeness, one transaction opened, a key's
history."""

import streamlit as st

from app import dag_layout, figures, queries, resources, state, widgets
from app.formatting import count, ns_column, timestamp

c = widgets.need_stream()
widgets.walkthrough_banner("transactions")
st.title("Transactions")
opts = resources.choices(c.path, c.version, c.stream)

cols = st.columns(4)
table = cols[0].selectbox("Table", ["(all)", *opts["tables"]], key="tx_table")
tag = cols[1].selectbox("Transaction tag", ["(all)", *opts["tags"]], key="tx_tag")
mod = cols[2].selectbox("Mod type", ["(all)", *opts["mod_types"]], key="tx_mod")
limit = cols[3].number_input("Show at most", 100, 20_000, 3_000, step=500, key="tx_limit")
f = queries.TxnFilter(table=None if table == "(all)" else table,
                      tag=None if tag == "(all)" else tag,
                      mod_type=None if mod == "(all)" else mod,
                      start_ns=c.start_ns, end_ns=c.end_ns)

done = resources.completeness(c.path, c.version, c.stream, f)
m = st.columns(4)
m[0].metric("Transactions", count(done["transactions"]),
            f"{count(done['multi_partition'])} across partitions", delta_color="off")
m[1].metric("Complete", count(done["complete"]),
            f"{count(done['transactions'] - done['complete'])} incomplete", delta_color="off")
m[2].metric("Records seen / expected",
            f"{count(done['records_seen'])} / {count(done['records_expected'])}")
m[3].metric("Partitions seen / expected",
            f"{count(done['partitions_seen'])} / {count(done['partitions_expected'])}")

opened = state.opened_transaction()
points = resources.txn_points(c.path, c.version, c.stream, f, int(limit))
nodes = dag_layout.layout(resources.partitions(c.path, c.version, c.stream, c.stall_s))
lanes = dict(zip(nodes["token"], nodes["lane"], strict=True))
event = st.plotly_chart(figures.txn_figure(points, lanes, opened), key="txn_chart",
                        on_select="rerun", selection_mode="points")
picked = next((p["customdata"][0] for p in (event or {}).get("selection", {}).get("points", [])
               if p.get("customdata")), None) if event else None
if picked and picked != opened:
    state.open_transaction(picked)
    opened = picked

txid = st.text_input("Open a transaction (server_transaction_id)", value=opened or "",
                     key=f"tx_open_{opened}").strip()
if txid != (opened or ""):
    state.open_transaction(txid or None)
    opened = txid or None

if opened:
    recs = resources.transaction_records(c.path, c.version, c.stream, opened)
    if recs.empty:
        st.error(f"No transaction {opened!r} in {c.stream}; click one in the chart or paste an "
                 "id from the Records page.")
    else:
        st.subheader(f"Transaction {opened}")
        st.caption(f"{recs['record_sequence'].nunique()} records in "
                   f"{recs['partition'].nunique()} partitions, committed "
                   f"{timestamp(recs['commit_ns'].min())}; in order of "
                   "(commit_timestamp, record_sequence).")
        st.dataframe(recs.assign(commit_timestamp=ns_column(recs["commit_ns"]))
                     .drop(columns=["commit_ns"]), hide_index=True, width="stretch")
        st.markdown("**Old and new values side by side**")
        st.dataframe(queries.side_by_side(recs), hide_index=True, width="stretch")

st.subheader("A key's history")
h1, h2 = st.columns([1, 3])
h_table = h1.selectbox("Table", opts["tables"] or ["(none)"], key="hist_table")
samples = resources.sample_keys(c.path, c.version, c.stream, h_table) if opts["tables"] else []
key_text = h2.text_input("Key (JSON object of the key columns)",
                         value=st.session_state.get("hist_key", samples[0] if samples else ""),
                         key="hist_key_input", help="e.g. " + (samples[0] if samples else "{}"))
st.session_state["hist_key"] = key_text
try:
    key = queries.parse_key(key_text)
except ValueError as e:
    h2.error(str(e))
    key = None
if key and opts["tables"]:
    hist = resources.history(c.path, c.version, c.stream, h_table, key, 5000)
    if hist.empty:
        st.warning(f"No change of {key} in {h_table}.")
    else:
        st.caption(f"{len(hist)} changes of {key} in {h_table}, oldest first.")
        st.dataframe(hist.assign(commit_timestamp=ns_column(hist["commit_ns"]))
                     .drop(columns=["commit_ns"]), hide_index=True, width="stretch")
