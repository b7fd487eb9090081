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

    @property
    def data_only(self) -> bool:
        return bool(self.table or self.key or self.mod_type or self.txid)


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
    con: duckdb.DuckDBPyConnection, stream: str, points: int = 240
) -> pd.DataFrame:
    """Every partition's watermark at each of ``points`` moments over the covered range.

    One row per (moment t_ns, partition alive at t): watermark_ns is its latest progress mark at
    or before t (its start when it has none yet); finished partitions drop out at their end.
    """
    return con.execute(
        """
        WITH bounds AS (
            SELECT min(start_ts) AS lo,
                   greatest(max(coalesce(end_ts, watermark)), max(read_to)) AS hi
            FROM partitions WHERE stream = $stream),
        grid AS (
            SELECT epoch_ns(lo) + (epoch_ns(hi) - epoch_ns(lo)) * i // $n AS t_ns
            FROM bounds, range(1, $n + 1) r(i) WHERE lo IS NOT NULL),
        alive AS (
            SELECT g.t_ns, p.token, epoch_ns(p.start_ts) AS start_ns
            FROM grid g JOIN partitions p ON p.stream = $stream
              AND epoch_ns(p.start_ts) <= g.t_ns
              AND (p.end_ts IS NULL OR epoch_ns(p.end_ts) > g.t_ns)
              AND p.state <> 'pending'),
        step AS (SELECT greatest(1, (epoch_ns(hi) - epoch_ns(lo)) // $n) AS ns, epoch_ns(lo) AS lo
                 FROM bounds),
        marks AS (  -- the latest mark per partition and grid step: what an ASOF needs
            SELECT partition_token AS token, max(epoch_ns(ts)) AS ts_ns
            FROM progress_marks, step WHERE stream = $stream
            GROUP BY partition_token, (epoch_ns(ts) - step.lo) // step.ns)
        SELECT a.t_ns, a.token AS partition,
               greatest(coalesce(m.ts_ns, a.start_ns), a.start_ns) AS watermark_ns
        FROM alive a ASOF LEFT JOIN marks m ON a.token = m.token AND a.t_ns >= m.ts_ns
        ORDER BY a.t_ns, a.token
        """,
        {"stream": stream, "n": max(2, int(points))},
    ).df()


def low_watermark_over_time(replay: pd.DataFrame) -> pd.DataFrame:
    """Per moment: the low watermark, the partition holding it, and how long it has held it."""
    if replay.empty:
        return pd.DataFrame(columns=["t_ns", "low_ns", "holder", "held_s"])
    idx = replay.sort_values(["t_ns", "watermark_ns", "partition"]).groupby("t_ns").head(1)
    out = idx.rename(columns={"watermark_ns": "low_ns", "partition": "holder"})
    out = out[["t_ns", "low_ns", "holder"]].reset_index(drop=True)
    out["held_s"] = (out["t_ns"] - out["low_ns"]) / 1e9
    return out


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
                "old": _cell(old.get(column)), "new": _cell(new.get(column)),
                "changed": old.get(column) != new.get(column),
            })
    return pd.DataFrame(rows, columns=["record_sequence", "table", "mod_type", "keys", "column",
                                       "old", "new", "changed"])


def _cell(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


# --- the records browser ----------------------------------------------------------------------

_DC_COLUMNS = """commit_timestamp AS ts, record_key, 'data_change' AS kind, partition_token,
    record_sequence, server_transaction_id, table_name, mod_type, mod_count,
    number_of_records_in_transaction, number_of_partitions_in_transaction, transaction_tag,
    copies"""
_HB_COLUMNS = """timestamp AS ts, concat('~hb|', partition_token) AS record_key,
    'heartbeat' AS kind, partition_token, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    copies"""


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
                  AND ($table IS NULL OR table_name = $table)))"""
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
            "txid": f.txid, "start": f.start_ns, "end": f.end_ns, "key": f.key}


def records_count(con: duckdb.DuckDBPyConnection, stream: str, f: RecordFilter) -> int:
    return int(con.execute(f"SELECT count(*) FROM ({_records_sql(f)})",
                           _record_params(stream, f)).fetchone()[0])


def records_page(
    con: duckdb.DuckDBPyConnection, stream: str, f: RecordFilter,
    after: tuple[int, str] | None = None, size: int = 100,
) -> pd.DataFrame:
    """One page in (timestamp, record key) order, after the cursor ``after`` (keyset paging)."""
    params = _record_params(stream, f)
    params.update({"after_ts": None if after is None else int(after[0]),
                   "after_key": None if after is None else after[1], "size": int(size)})
    return con.execute(
        f"""SELECT epoch_ns(ts) AS ts_ns, * EXCLUDE (ts) FROM ({_records_sql(f)})
            WHERE $after_ts IS NULL OR ts > make_timestamp_ns($after_ts)
               OR (ts = make_timestamp_ns($after_ts) AND record_key > $after_key)
            ORDER BY ts, record_key LIMIT $size""",
        params,
    ).df()


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
    df["about"] = df["table"].map(TABLE_DOCS).fillna("")
    return df
