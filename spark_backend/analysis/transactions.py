"""Transactions across partitions, duplicates, and the history of a table or key."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pandas as pd

from spark_backend.model.records import canonical_json

# Which transactions a filter keeps, over the per-transaction summary table (bound values).
TRANSACTION_FILTER = """stream = $stream
          AND ($table IS NULL OR list_contains(tables, $table))
          AND ($tag IS NULL OR transaction_tag = $tag)
          AND ($mod IS NULL OR list_contains(mod_types, $mod))
          AND ($start IS NULL OR commit_timestamp >= make_timestamp_ns($start))
          AND ($end IS NULL OR commit_timestamp <= make_timestamp_ns($end))"""


def transaction_filter_params(
    stream: str, table: str | None = None, tag: str | None = None, mod_type: str | None = None,
    start_ns: int | None = None, end_ns: int | None = None,
) -> dict[str, Any]:
    return {"stream": stream, "table": table, "tag": tag, "mod": mod_type, "start": start_ns,
            "end": end_ns}


def transactions(
    con: duckdb.DuckDBPyConnection,
    stream: str,
    *,
    table: str | None = None,
    tag: str | None = None,
    mod_type: str | None = None,
    start_ns: int | None = None,
    end_ns: int | None = None,
    limit: int | None = None,
) -> pd.DataFrame:
    """One row per server_transaction_id: when, where, how complete (from the summary
    table the ingest keeps, so it stays fast at a million records)."""
    return con.execute(
        """
        SELECT server_transaction_id, epoch_ns(commit_timestamp) AS commit_ns, records_seen,
               records_expected, len(partitions) AS partitions_seen, partitions_expected,
               partitions, tables, mod_types, transaction_tag, mods,
               records_expected IS NOT NULL AND records_seen = records_expected AS complete,
               -- a system that gives no record count (Datastream's tx_id): unknown, never
               -- incomplete
               CASE WHEN records_expected IS NULL THEN 'unknown'
                    WHEN records_seen = records_expected THEN 'complete'
                    ELSE 'incomplete' END AS state
        FROM transactions
        WHERE """ + TRANSACTION_FILTER + """
        ORDER BY commit_timestamp, server_transaction_id
        """ + ("LIMIT $limit" if limit else ""),
        {**transaction_filter_params(stream, table, tag, mod_type, start_ns, end_ns),
         **({"limit": limit} if limit else {})},
    ).df()


def transaction_counts(con: duckdb.DuckDBPyConnection, stream: str) -> dict[str, Any]:
    """Complete: records seen = the count the system gave; incomplete: fewer or more;
    unknown: the system gives no count (never counted as incomplete)."""
    total, complete, unknown = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE records_seen = records_expected), "
        "count(*) FILTER (WHERE records_expected IS NULL) "
        "FROM transactions WHERE stream = ?", [stream]).fetchone()
    incomplete = [r[0] for r in con.execute(
        "SELECT server_transaction_id FROM transactions WHERE stream = ? "
        "AND records_expected IS NOT NULL AND records_seen <> records_expected ORDER BY 1",
        [stream]).fetchall()]
    return {"total": int(total), "complete": int(complete), "incomplete": incomplete,
            "unknown": int(unknown)}


def transaction_records(
    con: duckdb.DuckDBPyConnection, stream: str, server_transaction_id: str
) -> pd.DataFrame:
    """A transaction's records in order (commit_timestamp, record_sequence), mods side by side."""
    # Its mods are read within its records' commit times: ``mods`` is stored in about commit
    # order, so DuckDB skips most of it instead of joining all of it.
    lo, hi = con.execute(
        "SELECT min(commit_timestamp), max(commit_timestamp) FROM data_change_records "
        "WHERE stream = ? AND server_transaction_id = ?", [stream, server_transaction_id]
    ).fetchone()
    return con.execute(
        """SELECT epoch_ns(d.commit_timestamp) AS commit_ns, d.record_sequence,
                  d.partition_token AS partition, d.table_name, d.mod_type, m.mod_index,
                  m.keys, m.old_values, m.new_values, d.value_capture_type,
                  d.is_last_record_in_transaction_in_partition AS last_in_partition
           FROM data_change_records d
           LEFT JOIN (SELECT * FROM mods WHERE stream = $s
                      AND commit_timestamp BETWEEN $lo AND $hi) m
             ON m.record_key = d.record_key
           WHERE d.stream = $s AND d.server_transaction_id = $t
           ORDER BY d.commit_timestamp, d.record_sequence, m.mod_index""",
        {"s": stream, "t": server_transaction_id, "lo": lo, "hi": hi},
    ).df()


def duplicates(con: duckdb.DuckDBPyConnection, stream: str) -> int:
    """Extra copies delivered: records seen more than once count copies - 1."""
    row = con.execute(
        """SELECT (SELECT coalesce(sum(copies - 1), 0) FROM data_change_records WHERE stream = $s)
                + (SELECT coalesce(sum(copies - 1), 0) FROM heartbeats WHERE stream = $s)""",
        {"s": stream},
    ).fetchone()
    return int(row[0])


def _key_json(key: str | dict | None) -> str | None:
    if key is None:
        return None
    value = json.loads(key) if isinstance(key, str) else key
    if not isinstance(value, dict):
        raise ValueError('a key is a JSON object of key columns, e.g. {"AccountId": "Id1"}')
    return canonical_json(value)


def history(
    con: duckdb.DuckDBPyConnection, stream: str, table: str, key: str | dict | None = None,
    limit: int | None = None,
) -> pd.DataFrame:
    """Every change of a table (or of one key) in the system's order."""
    key_text = _key_json(key)
    return con.execute(
        """SELECT epoch_ns(d.commit_timestamp) AS commit_ns, d.mod_type, m.keys,
                  m.old_values, m.new_values, d.server_transaction_id AS transaction_id,
                  d.partition_token AS partition, d.record_sequence, d.order_key
           FROM mods m JOIN data_change_records d
             ON d.stream = m.stream AND d.record_key = m.record_key
           WHERE m.stream = $stream AND m.table_name = $table
             AND ($key IS NULL OR m.keys = CAST($key AS JSON))
           ORDER BY d.order_key NULLS LAST, d.commit_timestamp, d.server_transaction_id,
                    d.record_sequence, m.mod_index
        """ + ("LIMIT $limit" if limit else ""),
        {"stream": stream, "table": table, "key": key_text, **({"limit": limit} if limit else {})},
    ).df()
