"""The dashboard's own drill-down queries over the cache (parameterized SQL, no UI).

Timestamps come back as integer nanoseconds (``*_ns``), like ``spark_backend.analysis``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

from spark_backend.analysis import stalls
from spark_backend.analysis.display import short
from spark_backend.analysis.transactions import TRANSACTION_FILTER, transaction_filter_params
from spark_backend.cache.schema import TABLE_DOCS
from spark_backend.formats import recording
from spark_backend.model.records import canonical_json

EXPORT_FORMATS = ("csv", "jsonl", "recording")
EXPORT_LIMIT = 1_000_000


@dataclass(frozen=True)
class RecordFilter:
    """What the records browser shows; None means no filter on that field."""

    table: str | None = None
    key: str | None = None  # canonical JSON of the key columns
    mod_type: str | None = None
    partition: str | None = None
    txid: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    heartbeats: bool = False  # the preset "hide heartbeats" is heartbeats=False
    search: str | None = None  # a text to find in keys, new or old values (case-insensitive)

    @property
    def data_only(self) -> bool:
        return bool(self.table or self.key or self.mod_type or self.txid or self.search)


@dataclass(frozen=True)
class TxnFilter:
    table: str | None = None
    tag: str | None = None
    mod_type: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None


def parse_key(text: str | None) -> str | None:
    """'{"AccountId": "a1"}' -> canonical JSON; ValueError with one sentence otherwise."""
    if text is None or not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f'The key is not JSON ({e.msg}); write the key columns as an object, '
            'e.g. {"AccountId": "a1"}.'
        ) from e
    if not isinstance(value, dict) or not value:
        raise ValueError('A key is a JSON object of key columns, e.g. {"AccountId": "a1"}.')
    return canonical_json(value)


# --- choices for the filters ------------------------------------------------------------------


def choices(con: duckdb.DuckDBPyConnection, stream: str) -> dict[str, list[str]]:
    def col(sql: str) -> list[str]:
        return [r[0] for r in con.execute(sql, [stream]).fetchall() if r[0] is not None]

    return {
        "tables": col("SELECT DISTINCT table_name FROM data_change_records WHERE stream = ? "
                      "ORDER BY 1"),
        "tags": col("SELECT DISTINCT transaction_tag FROM data_change_records WHERE stream = ? "
                    "ORDER BY 1"),
        "mod_types": col("SELECT DISTINCT mod_type FROM data_change_records WHERE stream = ? "
                         "ORDER BY 1"),
        "partitions": col("SELECT token FROM partitions WHERE stream = ? "
                          "ORDER BY start_ts NULLS LAST, token"),
    }


def sample_keys(con: duckdb.DuckDBPyConnection, stream: str, table: str,
                limit: int = 20) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT CAST(keys AS VARCHAR) FROM mods WHERE stream = ? AND table_name = ? "
        "GROUP BY keys ORDER BY count(*) DESC, 1 LIMIT ?", [stream, table, limit]
    ).fetchall()]


def cached_streams(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """What is cached, per stream: its source and covered range, counts, the last pull."""
    return con.execute(
        """SELECT s.stream, s.system, s.source, s.dialect, s.location, s.source_stream,
                  s.heartbeat_ms, epoch_ns(s.range_start) AS range_start_ns,
                  epoch_ns(s.range_end) AS range_end_ns,
                  (SELECT count(*) FROM partitions p WHERE p.stream = s.stream) AS partitions,
                  (SELECT count(*) FROM data_change_records d WHERE d.stream = s.stream)
                    AS data_change_records,
                  (SELECT status FROM pulls u WHERE u.stream = s.stream
                    ORDER BY pull_id DESC LIMIT 1) AS last_pull
           FROM streams s ORDER BY s.stream"""
    ).df()


def pulls(con: duckdb.DuckDBPyConnection, stream: str | None) -> pd.DataFrame:
    return con.execute(
        """SELECT pull_id, stream, source, epoch_ns(range_start) AS range_start_ns,
                  epoch_ns(range_end) AS range_end_ns, status, waves, records, error,
                  failed_partition, started_at, finished_at
           FROM pulls WHERE $s IS NULL OR stream = $s ORDER BY pull_id DESC LIMIT 50""",
        {"s": stream},
    ).df()


# --- watermarks replay ------------------------------------------------------------------------


def watermark_replay(
    con: duckdb.DuckDBPyConnection, stream: str, points: int = 240,
    start_ns: int | None = None, end_ns: int | None = None,
) -> pd.DataFrame:
    """Every partition's watermark at each of ``points`` moments (``analysis.stalls``)."""
    return stalls.watermark_replay(con, stream, points, start_ns, end_ns)


low_watermark_over_time = stalls.low_watermark_over_time
lag_over_time = stalls.lag_over_time
holding_back = stalls.holding_back


def stalls_table(found: list[dict]) -> pd.DataFrame:
    """The stalls as a table: partition (its token shortened, so the other columns fit),
    from, until, worst lag, cost, still now."""
    df = pd.DataFrame(found)
    return pd.DataFrame({
        "partition": [short(t) for t in df["partition"]],
        "from": pd.to_datetime(df["since_ns"], unit="ns", utc=True),
        "until": pd.to_datetime(df["until_ns"].astype("Int64"), unit="ns", utc=True),
        "still now": df["ongoing"], "worst lag (s)": df["max_lag_s"].round(1),
        "held more than the threshold (s)": df["cost_s"].round(1),
    })


def lag_at(replay: pd.DataFrame, t_ns: int) -> pd.DataFrame:
    """Partitions alive at the moment ``t_ns`` with their lag behind it, worst first."""
    at = replay[replay["t_ns"] == t_ns].copy()
    at["lag_s"] = (at["t_ns"] - at["watermark_ns"]) / 1e9
    return at.sort_values(["lag_s", "partition"], ascending=[False, True]).reset_index(drop=True)


# --- transactions -----------------------------------------------------------------------------

_TXN_WHERE_BASE = """
    stream = $stream AND server_transaction_id IS NOT NULL
    AND ($start IS NULL OR commit_timestamp >= make_timestamp_ns($start))
    AND ($end IS NULL OR commit_timestamp <= make_timestamp_ns($end))"""
_TXN_WHERE_FILTERED = _TXN_WHERE_BASE + """
    AND server_transaction_id IN (
        SELECT server_transaction_id FROM data_change_records
        WHERE stream = $stream
          AND ($table IS NULL OR table_name = $table)
          AND ($tag IS NULL OR transaction_tag = $tag)
          AND ($mod IS NULL OR mod_type = $mod))"""


def _txn_where(f: TxnFilter) -> str:
    """A transaction matches when any of its records matches the table/tag/mod filter."""
    return _TXN_WHERE_FILTERED if (f.table or f.tag or f.mod_type) else _TXN_WHERE_BASE


def _txn_params(stream: str, f: TxnFilter) -> dict[str, Any]:
    params = {"stream": stream, "start": f.start_ns, "end": f.end_ns}
    if f.table or f.tag or f.mod_type:
        params.update({"table": f.table, "tag": f.tag, "mod": f.mod_type})
    return params


def txn_points(
    con: duckdb.DuckDBPyConnection, stream: str, f: TxnFilter, limit: int = 3000
) -> pd.DataFrame:
    """One row per (transaction, partition it touched) for the first ``limit`` transactions."""
    return con.execute(
        f"""
        WITH d AS (SELECT * FROM data_change_records WHERE {_txn_where(f)}),
             t AS (SELECT server_transaction_id, min(commit_timestamp) AS c FROM d
                   GROUP BY ALL ORDER BY c, server_transaction_id LIMIT $limit)
        SELECT d.server_transaction_id AS txid, d.partition_token AS partition,
               epoch_ns(min(d.commit_timestamp)) AS commit_ns, count(*) AS records,
               max(d.number_of_records_in_transaction) AS records_expected,
               max(d.number_of_partitions_in_transaction) AS partitions_expected,
               any_value(d.transaction_tag) AS tag
        FROM d JOIN t USING (server_transaction_id)
        GROUP BY ALL ORDER BY commit_ns, txid, partition
        """,
        {**_txn_params(stream, f), "limit": int(limit)},
    ).df()


def _tparams(stream: str, f: TxnFilter) -> dict[str, Any]:
    return transaction_filter_params(stream, f.table, f.tag, f.mod_type, f.start_ns, f.end_ns)


def _txn_bounds(con: duckdb.DuckDBPyConnection, stream: str, f: TxnFilter) -> tuple[int, int]:
    row = con.execute(
        "SELECT epoch_ns(min(commit_timestamp)), epoch_ns(max(commit_timestamp)) "
        "FROM transactions WHERE " + TRANSACTION_FILTER, _tparams(stream, f)).fetchone()
    lo = f.start_ns if f.start_ns is not None else row[0]
    hi = f.end_ns if f.end_ns is not None else row[1]
    return (lo, hi) if lo is not None and hi is not None else (0, 0)


_NICE_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def bucket_width(lo: int, hi: int, buckets: int) -> int:
    """A round bucket width (1s, 5s, 1m, 5m, ...) giving at most ``buckets`` buckets."""
    want = (hi - lo) / max(1, int(buckets)) / 1e9
    seconds = next((n for n in _NICE_S if n >= want), None)
    return int(seconds * 1e9) if seconds else max(1, int(want * 1e9) + 1)


def txn_buckets(con: duckdb.DuckDBPyConnection, stream: str, f: TxnFilter,
                buckets: int = 120) -> pd.DataFrame:
    """Transactions (by their first commit) per time bucket over the filtered range: every
    bucket of the range, empty ones with 0 (bucket_ns, transactions). From the per-transaction
    summary the cache keeps, not the records."""
    lo, hi = _txn_bounds(con, stream, f)
    width = bucket_width(lo, hi, buckets)
    lo -= lo % width
    return con.execute(
        """WITH b AS (SELECT (epoch_ns(commit_timestamp) - $lo) // $w AS i, count(*) AS n
                      FROM transactions WHERE """ + TRANSACTION_FILTER + """ GROUP BY 1)
            SELECT $lo + r.i * $w AS bucket_ns, coalesce(b.n, 0) AS transactions
            FROM range(0, $k) r(i) LEFT JOIN b ON b.i = r.i ORDER BY 1""",
        {**_tparams(stream, f), "lo": int(lo), "w": int(width),
         "k": int((hi - lo) // width + 1)},
    ).df()


def txn_density(con: duckdb.DuckDBPyConnection, stream: str, f: TxnFilter,
                buckets: int = 120) -> pd.DataFrame:
    """Transactions per (time bucket, partition touched): bucket_ns, partition, transactions."""
    lo, hi = _txn_bounds(con, stream, f)
    width = bucket_width(lo, hi, buckets)
    lo -= lo % width
    return con.execute(
        """WITH t AS (SELECT $lo + ((epoch_ns(commit_timestamp) - $lo) // $w) * $w AS bucket_ns,
                             unnest(partitions) AS partition
                      FROM transactions WHERE """ + TRANSACTION_FILTER + """)
           SELECT bucket_ns, partition, count(*) AS transactions FROM t
           GROUP BY ALL ORDER BY 1, 2""",
        {**_tparams(stream, f), "lo": int(lo), "w": int(width)},
    ).df()


def completeness(con: duckdb.DuckDBPyConnection, stream: str, f: TxnFilter) -> dict[str, int]:
    """Records seen / expected and partitions seen / expected over the filtered transactions
    (from the per-transaction summary the cache keeps at ingest)."""
    row = con.execute(
        """SELECT count(*), coalesce(sum(records_seen), 0), coalesce(sum(records_expected), 0),
               coalesce(sum(len(partitions)), 0), coalesce(sum(partitions_expected), 0),
               count(*) FILTER (WHERE records_expected IS NOT NULL
                                AND records_seen = records_expected),
               count(*) FILTER (WHERE len(partitions) > 1)
        FROM transactions WHERE """ + TRANSACTION_FILTER,
        transaction_filter_params(stream, f.table, f.tag, f.mod_type, f.start_ns, f.end_ns),
    ).fetchone()
    keys = ("transactions", "records_seen", "records_expected", "partitions_seen",
            "partitions_expected", "complete", "multi_partition")
    return {k: int(v) for k, v in zip(keys, row, strict=True)}


def side_by_side(records: pd.DataFrame) -> pd.DataFrame:
    """A transaction's records with each column's old and new value next to each other."""
    rows = []
    for r in records.itertuples():
        old = json.loads(r.old_values) if isinstance(r.old_values, str) else {}
        new = json.loads(r.new_values) if isinstance(r.new_values, str) else {}
        for column in sorted(set(old) | set(new)):
            rows.append({
                "record_sequence": r.record_sequence, "table": r.table_name,
                "mod_type": r.mod_type, "keys": r.keys, "column": column,
                "old": cell(old.get(column)), "new": cell(new.get(column)),
                "changed": old.get(column) != new.get(column),
            })
    return pd.DataFrame(rows, columns=["record_sequence", "table", "mod_type", "keys", "column",
                                       "old", "new", "changed"])


def cell(value: Any) -> str:
    """A value as a table cell: strings as they are, the rest as JSON."""
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


# --- the records browser ----------------------------------------------------------------------

# What an engineer reads first: time, table, (keys,) mod type; the ids after.
_DC_COLUMNS = """commit_timestamp AS ts, table_name, mod_type, mod_count, transaction_tag,
    'data_change' AS kind, server_transaction_id, record_sequence, partition_token,
    number_of_records_in_transaction, number_of_partitions_in_transaction, copies, record_key"""
_HB_COLUMNS = """timestamp AS ts, NULL, NULL, NULL, NULL, 'heartbeat' AS kind, NULL, NULL,
    partition_token, NULL, NULL, copies, concat('~hb|', partition_token) AS record_key"""


def _records_sql(f: RecordFilter) -> str:
    dc = f"""SELECT {_DC_COLUMNS} FROM data_change_records
        WHERE stream = $stream
          AND ($table IS NULL OR table_name = $table)
          AND ($mod IS NULL OR mod_type = $mod)
          AND ($partition IS NULL OR partition_token = $partition)
          AND ($txid IS NULL OR server_transaction_id = $txid)
          AND ($start IS NULL OR commit_timestamp >= make_timestamp_ns($start))
          AND ($end IS NULL OR commit_timestamp <= make_timestamp_ns($end))
          AND ($key IS NULL OR record_key IN (SELECT record_key FROM mods
                WHERE stream = $stream AND keys = CAST($key AS JSON)
                  AND ($table IS NULL OR table_name = $table)))
          AND ($search IS NULL OR record_key IN (SELECT record_key FROM mods
                WHERE stream = $stream AND ($table IS NULL OR table_name = $table)
                  AND (contains(lower(CAST(keys AS VARCHAR)), $search)
                       OR contains(lower(coalesce(CAST(new_values AS VARCHAR), '')), $search)
                       OR contains(lower(coalesce(CAST(old_values AS VARCHAR), '')), $search))))"""
    if not f.heartbeats or f.data_only:
        return dc
    return dc + f"""
        UNION ALL SELECT {_HB_COLUMNS} FROM heartbeats
        WHERE stream = $stream
          AND ($partition IS NULL OR partition_token = $partition)
          AND ($start IS NULL OR timestamp >= make_timestamp_ns($start))
          AND ($end IS NULL OR timestamp <= make_timestamp_ns($end))"""


def _record_params(stream: str, f: RecordFilter) -> dict[str, Any]:
    return {"stream": stream, "table": f.table, "mod": f.mod_type, "partition": f.partition,
            "txid": f.txid, "start": f.start_ns, "end": f.end_ns, "key": f.key,
            "search": f.search.lower() if f.search else None}


def records_count(con: duckdb.DuckDBPyConnection, stream: str, f: RecordFilter) -> int:
    return int(con.execute(f"SELECT count(*) FROM ({_records_sql(f)})",
                           _record_params(stream, f)).fetchone()[0])


# Records without a time (a source that sent none) sort after every timed one.
_UNTIMED = 2**63 - 1


def records_page(
    con: duckdb.DuckDBPyConnection, stream: str, f: RecordFilter,
    after: tuple[int, str] | None = None, size: int = 100,
) -> pd.DataFrame:
    """One page in (timestamp, record key) order, records without a time last, after the
    cursor ``after`` (keyset paging: a row's ``cursor_ns`` and ``record_key``)."""
    params = _record_params(stream, f)
    params.update({"after_ts": None if after is None else int(after[0]),
                   "after_key": None if after is None else after[1], "size": int(size),
                   "untimed": _UNTIMED})
    page = con.execute(
        f"""SELECT * FROM (
              SELECT epoch_ns(ts) AS ts_ns, coalesce(epoch_ns(ts), $untimed) AS cursor_ns,
                     * EXCLUDE (ts) FROM ({_records_sql(f)}))
            WHERE $after_ts IS NULL OR cursor_ns > $after_ts
               OR (cursor_ns = $after_ts AND record_key > $after_key)
            ORDER BY cursor_ns, record_key LIMIT $size""",
        params,
    ).df()
    data = page[page["kind"] == "data_change"]
    timed = data["ts_ns"].dropna()
    keys = con.execute(  # the page's time window first: zone maps skip the rest of mods
        """SELECT record_key, CAST(keys AS VARCHAR) AS keys FROM mods
           WHERE stream = $stream AND mod_index = 0
             AND (($lo IS NOT NULL AND commit_timestamp
                   BETWEEN make_timestamp_ns($lo) AND make_timestamp_ns($hi))
                  OR ($untimed_rows AND commit_timestamp IS NULL))
             AND list_contains($k, record_key)""",
        {"stream": stream, "k": list(data["record_key"]),
         "lo": int(timed.min()) if len(timed) else None,
         "hi": int(timed.max()) if len(timed) else None,
         "untimed_rows": bool(len(timed) < len(data))},
    ).df()
    page = page.merge(keys, on="record_key", how="left")
    front = ["ts_ns", "table_name", "keys", "mod_type"]
    return page[front + [c for c in page.columns if c not in front]]


def record_detail(con: duckdb.DuckDBPyConnection, stream: str, record_key: str) -> pd.DataFrame:
    """One data change record's mods: keys, old and new values (JSON text), in mod order."""
    return con.execute(
        """SELECT mod_index, CAST(keys AS VARCHAR) AS keys,
                  CAST(old_values AS VARCHAR) AS old_values,
                  CAST(new_values AS VARCHAR) AS new_values
           FROM mods WHERE stream = $s AND record_key = $k ORDER BY mod_index""",
        {"s": stream, "k": record_key},
    ).df()


def key_columns(con: duckdb.DuckDBPyConnection, stream: str) -> dict[str, list[str]]:
    """Per table of the stream, the names of its key columns (from its records' keys)."""
    rows = con.execute(
        """SELECT table_name, any_value(json_keys(keys)) FROM mods WHERE stream = ?
           GROUP BY table_name ORDER BY table_name""", [stream]).fetchall()
    return {t: list(k or []) for t, k in rows}


def key_placeholder(columns: dict[str, list[str]], table: str | None,
                    sample: str | None = None) -> str:
    """The key field's example: a real key of the table when there is one, else its columns."""
    if sample:
        return sample
    names = columns.get(table or "") or next(iter(columns.values()), [])
    if not names:
        return '{"column": "value"}'
    return json.dumps({n: "…" for n in names}, ensure_ascii=False)


def export_records(
    con: duckdb.DuckDBPyConnection, stream: str, f: RecordFilter, fmt: str,
    limit: int = EXPORT_LIMIT,
) -> bytes:
    """The filtered data change records as CSV, JSON Lines, or the recording format."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(
            f"Unknown export format {fmt!r}; choose one of {', '.join(EXPORT_FORMATS)}.")
    params = {**_record_params(stream, f), "limit": int(limit)}
    data_only = RecordFilter(**{**f.__dict__, "heartbeats": False})
    keys = f"SELECT record_key FROM ({_records_sql(data_only)})"
    df = con.execute(
        f"""SELECT epoch_ns(d.commit_timestamp) AS commit_ns, d.* EXCLUDE (stream),
                   (SELECT list(struct_pack(keys := m.keys, new_values := m.new_values,
                                            old_values := m.old_values) ORDER BY m.mod_index)
                    FROM mods m WHERE m.stream = d.stream AND m.record_key = d.record_key) AS mods
            FROM data_change_records d
            WHERE d.stream = $stream AND d.record_key IN ({keys})
            ORDER BY d.commit_timestamp, d.record_key LIMIT $limit""",
        params,
    ).df()
    if fmt == "csv":
        buf = io.StringIO()
        out = df.drop(columns=["mods"]).assign(
            commit_timestamp=[recording.format_ns(v) for v in df["commit_ns"]],
            mods=[json.dumps(_mods(v)) for v in df["mods"]])
        out.to_csv(buf, index=False, quoting=csv.QUOTE_MINIMAL)
        return buf.getvalue().encode()
    lines = []
    for row in df.to_dict("records"):
        mods = _mods(row["mods"])
        if fmt == "recording":
            lines.append(recording.data_change_line(row, mods))
        else:
            row = {k: _plain(v) for k, v in row.items() if k != "mods"}
            row["commit_timestamp"] = recording.format_ns(row["commit_ns"])
            lines.append({**row, "mods": mods})
    return "".join(json.dumps(line, default=str) + "\n" for line in lines).encode()


def _mods(value: Any) -> list[dict[str, Any]]:
    out = []
    for m in list(value) if value is not None else []:
        out.append({k: json.loads(m[k]) if isinstance(m[k], str) else m[k]
                    for k in ("keys", "new_values", "old_values")})
    return out


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, str | int | float | bool):
        return None if isinstance(value, float) and pd.isna(value) else value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


# --- schema for the SQL console ---------------------------------------------------------------


def schema(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    df = con.execute(
        """SELECT table_name AS "table", column_name AS "column", data_type AS type
           FROM duckdb_columns() WHERE database_name = current_database()
             AND schema_name = 'main' AND NOT internal
           ORDER BY table_name, column_index"""
    ).df()
    # The cache's own tables only (what the console is for), nothing stray of the file.
    df = df[df["table"].isin(TABLE_DOCS)].reset_index(drop=True)
    df["about"] = df["table"].map(TABLE_DOCS)
    return df
