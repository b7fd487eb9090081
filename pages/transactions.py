"""Transactions: a timeline across partitions, completeness, one transaction opened, a key's
history."""

import dataclasses

import streamlit as st

from app import (
    figures,
    partitions_transactions,
    queries,
    resources,
    state,
    widgets,
)
from app.formatting import clock, count, ns_column, timestamp
from app.safe import md

MAX_DRAWN = 3000  # transactions drawn one by one; more are shown as a density and a window

c = widgets.need_stream()
widgets.walkthrough_banner("transactions")
st.title("Transactions")
opts = resources.choices(c.path, c.version, c.stream)

cols = st.columns(3)
table = cols[0].selectbox("Table", ["(all)", *opts["tables"]], key="tx_table")
tag = cols[1].selectbox("Transaction tag", ["(all)", *opts["tags"]], key="tx_tag")
mod = cols[2].selectbox("Mod type", ["(all)", *opts["mod_types"]], key="tx_mod")
f = queries.TxnFilter(table=None if table == "(all)" else table,
                      tag=None if tag == "(all)" else tag,
                      mod_type=None if mod == "(all)" else mod,
                      start_ns=c.start_ns, end_ns=c.end_ns)

done = resources.completeness(c.path, c.version, c.stream, f)
m = st.columns(4)
m[0].metric("Transactions", count(done["transactions"]),
            f"{count(done['multi_partition'])} across partitions", delta_color="off",
            delta_arrow="off")
m[1].metric("Complete", count(done["complete"]),
            f"{count(done['transactions'] - done['complete'])} incomplete", delta_color="off",
            delta_arrow="off")
# The expected counts go below the seen ones (as the other tiles' details): "seen / expected"
# in one value did not fit a quarter of the page at a million records.
m[2].metric("Records seen", count(done["records_seen"]),
            f"of {count(done['records_expected'])} expected", delta_color="off",
            delta_arrow="off")
m[3].metric("Transaction × partition pairs seen", count(done["partitions_seen"]),
            f"of {count(done['partitions_expected'])} expected", delta_color="off",
            delta_arrow="off",
            help="Summed over the transactions: the partitions each one's records were read "
                 "from, against its number_of_partitions_in_transaction. Not a count of "
                 "partitions.")

opened = state.opened_transaction()
txid = st.text_input("Open a transaction (server_transaction_id)", value=opened or "",
                     key=f"tx_open_{opened}").strip()
if txid != (opened or ""):
    state.open_transaction(txid or None)
    opened = txid or None

wide = partitions_transactions.widest_cached(c.path, c.version, c.stream, f)
# With none opened, the widest one is drawn: a person sees a transaction across its
# partitions at once (the URL keeps no ``txn`` until one is chosen).
shown = opened or (str(wide["txid"][0]) if len(wide) else None)
if shown:
    recs = resources.transaction_records(c.path, c.version, c.stream, shown)
    if recs.empty:
        st.error(md(f"No transaction {shown!r} in {c.stream}; choose one in the table below "
                    "or paste an id from the Records page."))
    else:
        st.subheader(f"Transaction {md(shown)}" if opened else
                     f"The widest transaction, {md(shown)}")
        st.caption(f"{recs['record_sequence'].nunique()} records in "
                   f"{recs['partition'].nunique()} partitions, committed "
                   f"{timestamp(recs['commit_ns'].min())}; in order of "
                   "(commit_timestamp, record_sequence)."
                   + ("" if opened else " Select another in the table below."))
        st.dataframe(recs.assign(commit_timestamp=ns_column(recs["commit_ns"]))
                     .drop(columns=["commit_ns"]), hide_index=True, width="stretch")
        st.plotly_chart(partitions_transactions.lanes_figure(recs, shown), key="txn_lanes")
        st.markdown("**Old and new values side by side**")
        st.dataframe(queries.side_by_side(recs), hide_index=True, width="stretch")


st.subheader(f"The {partitions_transactions.WIDEST} widest transactions")
event = st.dataframe(partitions_transactions.widest_display(wide), hide_index=True,
                     width="stretch", key=f"tx_widest_{opened}", on_select="rerun",
                     selection_mode="single-row")
st.caption("Those touching most partitions, then most records, of the filtered range; select "
           "a row to open it.")
rows = event.selection.rows if event is not None else []
if rows and rows[0] < len(wide) and wide["txid"][rows[0]] != opened:
    state.open_transaction(str(wide["txid"][rows[0]]))
    st.rerun()

# Every transaction as a dot is a wall at thousands; it waits behind the table above, and is
# neither queried nor drawn until asked for (a collapsed expander would still do both).
if st.toggle(f"Timeline: every transaction ({count(done['transactions'])}) by partition lane",
             key="tx_timeline"):
    opened_recs = (resources.transaction_records(c.path, c.version, c.stream, opened)
                   if opened else None)
    nodes = resources.dag(c.path, c.version, c.stream, c.stall_s)["nodes"]
    lanes = dict(zip(nodes["token"], nodes["lane"], strict=True))
    total = done["transactions"]
    window_f = f
    if total > MAX_DRAWN:
        # Too many to draw one by one: the density over the whole range, then a window.
        buckets = resources.txn_buckets(c.path, c.version, c.stream, f, 120)
        starts = [int(b) for b in buckets["bucket_ns"]]
        counts = [int(n) for n in buckets["transactions"]]
        width = starts[1] - starts[0] if len(starts) > 1 else 1
        focus = (int(opened_recs["commit_ns"].min()) if opened_recs is not None
                 and not opened_recs.empty else None)
        default = 0 if focus is None else max([0, *(i for i, b in enumerate(starts) if b <= focus)])
        if st.session_state.get("tx_focus") != focus:  # a newly opened one moves the window
            st.session_state["tx_focus"] = focus
            st.session_state["tx_window"] = starts[default]
        if st.session_state.get("tx_window") not in starts:
            st.session_state["tx_window"] = starts[default]
        first = st.select_slider("Window start, UTC (drag, or arrow keys)", options=starts,
                                 format_func=clock, key="tx_window")
        k = starts.index(first)
        last, drawn = k, counts[k]
        while last + 1 < len(starts) and drawn + counts[last + 1] <= MAX_DRAWN:
            last += 1
            drawn += counts[last]
        lo, hi = starts[k], starts[last] + width - 1
        window_f = dataclasses.replace(f, start_ns=max(lo, f.start_ns or lo),
                                       end_ns=min(hi, f.end_ns or hi))
        density = resources.txn_density(c.path, c.version, c.stream, f, 120)
        heat = figures.txn_density_figure(density, lanes, (lo, hi))
        st.plotly_chart(partitions_transactions.label_lanes(heat, lanes, density),
                        key="txn_density")
        st.caption(f"{count(total)} transactions in the range, more than the {count(MAX_DRAWN)} "
                   "drawn one by one: above, how many began per partition lane and time bucket "
                   "over the whole range. Below: "
                   + (f"the {count(drawn)}" if drawn <= MAX_DRAWN else
                      f"the first {count(MAX_DRAWN)} of the {count(drawn)}")
                   + f" that began from {clock(lo)} to {clock(hi)} UTC (outlined above), one "
                   "dot per partition each touched; move the window to see others.")
    else:
        st.caption(f"All {count(total)} transactions of the range, one dot per partition each "
                   "touched; lines join a transaction's partitions. Click a dot to open it.")
    points = resources.txn_points(c.path, c.version, c.stream, window_f, MAX_DRAWN)
    n = st.session_state.setdefault("txn_chart_n", 0)
    picked = widgets.clicked_point(f"txn_chart_{n}")
    if picked is not None:
        st.session_state["txn_chart_n"] = n = n + 1
        if picked != opened:
            state.open_transaction(picked)
            st.rerun()
    st.plotly_chart(figures.txn_figure(points, lanes, opened), key=f"txn_chart_{n}",
                    on_select="rerun", selection_mode="points")

st.subheader("A key's history")
h1, h2 = st.columns([1, 3])
h_table = h1.selectbox("Table", opts["tables"] or ["(none)"], key="hist_table")
samples = resources.sample_keys(c.path, c.version, c.stream, h_table) if opts["tables"] else []
key_text = h2.text_input("Key (JSON object of the key columns)",
                         value=st.session_state.get("hist_key", samples[0] if samples else ""),
                         key="hist_key_input", help="e.g. " + md(samples[0] if samples else "{}"))
st.session_state["hist_key"] = key_text
try:
    key = queries.parse_key(key_text)
except ValueError as e:
    h2.error(md(str(e)))
    key = None
if key and opts["tables"]:
    hist = resources.history(c.path, c.version, c.stream, h_table, key, 5000)
    if hist.empty:
        st.warning(md(f"No change of {key} in {h_table}."))
    else:
        st.caption(md(f"{len(hist)} changes of {key} in {h_table}, oldest first."))
        st.dataframe(hist.assign(commit_timestamp=ns_column(hist["commit_ns"]))
                     .drop(columns=["commit_ns"]), hide_index=True, width="stretch")
