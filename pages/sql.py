"""SQL: a read-only console on the cache, the schema beside it, example queries."""

import streamlit as st

from app import resources, sql_console, widgets
from app.safe import md

c = widgets.need_stream()
# The console reads a snapshot of the cache: start copying it while the user writes a query.
sql_console.prepare(resources.open_cache(c.path).cursor)
st.title("SQL")
main, side = st.columns([3, 2])
with side:
    st.subheader("Schema")
    schema = resources.schema(c.path, c.version)
    for table, cols in schema.groupby("table", sort=True):
        with st.expander(md(table)):
            st.caption(cols["about"].iloc[0])
            st.dataframe(cols[["column", "type"]], hide_index=True, width="stretch")
with main:
    examples = sql_console.examples(c.stream)
    example = st.selectbox(f"Examples (on {c.stream})", ["(write your own)", *examples],
                           key="sql_ex")
    default = examples.get(example, "SELECT * FROM partitions LIMIT 20")
    sql = st.text_area("Query (read-only: SELECT, WITH, DESCRIBE, SHOW, SUMMARIZE, PIVOT, EXPLAIN; "
                       f"at most {sql_console.MAX_SECONDS:g} s, "
                       f"{sql_console.MAX_MEMORY_BYTES >> 20:,} MB of memory and "
                       f"{sql_console.MAX_RESULT_BYTES >> 20:,} MB of answer)",
                       value=default, height=180, key=f"sql_text_{example}_{c.stream}")
    if st.button("Run", type="primary", key="sql_run") or example != "(write your own)":
        with resources.cursor(c.path) as con:
            try:
                result = sql_console.run(con, sql)
            except sql_console.Refused as e:
                st.error(md(str(e)))
            else:
                st.dataframe(result.frame, hide_index=True, width="stretch")
                st.caption(f"{len(result.frame):,} rows"
                           + (f" (the first {sql_console.MAX_ROWS:,})" if result.truncated
                              else ""))
