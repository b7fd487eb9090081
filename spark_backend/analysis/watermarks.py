"""Watermarks: per partition, the stream's low watermark and who holds it, gaps."""

from __future__ import annotations

import duckdb
import pandas as pd

from spark_backend.analysis.dag import range_end_ns

# Every progress mark: the cache's view plus MUTABLE_KEY_RANGE partition start/event/end records
# (kept out of the view, whose definition is re-created at every open of the cache).
_MARKS = """(SELECT stream, partition_token, ts, kind FROM progress_marks
             UNION ALL
             SELECT stream, partition_token, timestamp AS ts, kind FROM partition_records
             WHERE partition_token IS NOT NULL)"""

# Systems without a watermark of their own: Datastream events carry none (reference doc 001;
# its consumers see freshness, ``systems.freshness``), so no low watermark, nobody holding the
# stream back and no heartbeat gaps are made up for them.
NO_WATERMARK_SYSTEMS = ("datastream",)


def has_watermark(con: duckdb.DuckDBPyConnection, stream: str) -> bool:
    row = con.execute("SELECT system FROM streams WHERE stream = ?", [stream]).fetchone()
    return row is None or row[0] not in NO_WATERMARK_SYSTEMS


def low_watermark(
    con: duckdb.DuckDBPyConnection, stream: str
) -> tuple[int | None, str | None]:
    """(low watermark ns, the partition holding it) over partitions that are not finished.

    With every partition finished the stream has no low watermark to wait on: the latest end
    is returned and nobody holds it back. A system without a watermark: (None, None).
    """
    if not has_watermark(con, stream):
        return None, None
    row = con.execute(
        """SELECT token, epoch_ns(coalesce(watermark, start_ts)) AS wm FROM partitions
           WHERE stream = $stream AND state <> 'finished'
           ORDER BY wm NULLS FIRST, token LIMIT 1""",
        {"stream": stream},
    ).fetchone()
    if row is not None:
        return (None if row[1] is None else int(row[1])), row[0]
    row = con.execute(
        "SELECT epoch_ns(max(watermark)) FROM partitions WHERE stream = $stream",
        {"stream": stream},
    ).fetchone()
    return (None if row is None or row[0] is None else int(row[0])), None


def holding_back(
    con: duckdb.DuckDBPyConnection, stream: str
) -> dict | None:
    """The partition holding the stream back, since when and for how long (vs the range end)."""
    wm, token = low_watermark(con, stream)
    if token is None or wm is None:
        return None
    end = range_end_ns(con, stream)
    held_s = max(0.0, ((end or wm) - wm) / 1e9)
    return {"partition": token, "since_ns": wm, "held_s": held_s, "range_end_ns": end}


def heartbeat_gaps(
    con: duckdb.DuckDBPyConnection, stream: str, k: float = 3.0, heartbeat_ms: int | None = None
) -> pd.DataFrame:
    """Consecutive progress marks of a partition further apart than k x heartbeat interval
    (none for a system without a watermark: its events are not progress marks)."""
    if not has_watermark(con, stream):
        return pd.DataFrame({"partition": pd.Series(dtype=str),
                             "from_ns": pd.Series(dtype="int64"),
                             "to_ns": pd.Series(dtype="int64"),
                             "gap_s": pd.Series(dtype=float)})
    if heartbeat_ms is None:
        row = con.execute(
            "SELECT coalesce((SELECT heartbeat_ms FROM streams WHERE stream = ?), 10000)", [stream]
        ).fetchone()
        heartbeat_ms = int(row[0])
    threshold_ns = max(0, int(k * heartbeat_ms * 1_000_000))
    return con.execute(
        """
        WITH marks AS (
            SELECT partition_token, ts FROM """ + _MARKS + """ WHERE stream = $stream
            UNION ALL
            SELECT token, start_ts FROM partitions
            WHERE stream = $stream AND start_ts IS NOT NULL AND state <> 'pending'),
        -- no DISTINCT first: a repeated mark follows its twin at a gap of 0, never above the
        -- threshold, so the gaps are the same, and DuckDB windows the marks far faster as they are
        ordered AS (
            SELECT partition_token, ts,
                   lag(ts) OVER (PARTITION BY partition_token ORDER BY ts) AS prev
            FROM marks)
        SELECT partition_token AS partition, epoch_ns(prev) AS from_ns, epoch_ns(ts) AS to_ns,
               (epoch_ns(ts) - epoch_ns(prev)) / 1e9 AS gap_s
        FROM ordered WHERE prev IS NOT NULL AND epoch_ns(ts) - epoch_ns(prev) > $threshold
        ORDER BY gap_s DESC, partition, from_ns
        """,
        {"stream": stream, "threshold": threshold_ns},
    ).df()


def watermark_series(
    con: duckdb.DuckDBPyConnection, stream: str, bucket_s: float = 10.0
) -> pd.DataFrame:
    """Each partition's watermark over time, one point per partition and bucket (max mark);
    empty for a system without a watermark."""
    bucket_ns = max(1, int(bucket_s * 1e9))
    if not has_watermark(con, stream):
        return pd.DataFrame({"partition": pd.Series(dtype=str),
                             "bucket_ns": pd.Series(dtype="int64"),
                             "watermark_ns": pd.Series(dtype="int64")})
    return con.execute(
        """SELECT partition_token AS partition,
                  (epoch_ns(ts) // $b) * $b AS bucket_ns, max(epoch_ns(ts)) AS watermark_ns
           FROM """ + _MARKS + """ WHERE stream = $stream
           GROUP BY ALL ORDER BY partition, bucket_ns""",
        {"stream": stream, "b": bucket_ns},
    ).df()
