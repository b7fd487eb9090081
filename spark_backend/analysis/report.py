"""The report: one JSON-able summary of a stream (the CLI's `report --json`)."""

from __future__ import annotations

import json
from typing import Any

import duckdb
import pandas as pd

from spark_backend.analysis import stalls
from spark_backend.analysis.dag import edges, partitions, range_end_ns
from spark_backend.analysis.transactions import duplicates, transaction_counts
from spark_backend.analysis.watermarks import heartbeat_gaps, low_watermark
from spark_backend.model.timestamps import format_ns


def _ts(ns: Any) -> str | None:
    if ns is None or pd.isna(ns):
        return None
    return format_ns(int(ns))


def _system(con: duckdb.DuckDBPyConnection, stream: str) -> str:
    row = con.execute("SELECT system FROM streams WHERE stream = ?", [stream]).fetchone()
    return row[0] if row else "spanner"


def _systems_module():
    try:
        from spark_backend.analysis import systems
    except ImportError:
        return None
    return systems


# Systems whose partitions vouch for progress with heartbeats and ordered marks.
PROGRESS_SYSTEMS = ("spanner",)


def anomalies(
    con: duckdb.DuckDBPyConnection, stream: str, stall_after_s: float = 60.0,
    with_stalls: bool = True,
) -> list[dict[str, Any]]:
    """Watermark going backwards, ended early without children, child never read, gaps,
    stalled and failed partitions, the stalls of the cached range (``stall``, where the system
    sends heartbeats: ``systems.has_heartbeats``; ``with_stalls=False`` leaves them to a caller
    that replays a range of its own); plus what the stream's own system defines.

    The progress checks (backwards, gaps, stalled) apply where partitions vouch for progress
    (Spanner); other systems define their own in ``systems``.
    """
    out: list[dict[str, Any]] = []
    end = range_end_ns(con, stream)
    system = _system(con, stream)
    progress = system in PROGRESS_SYSTEMS
    for token, at, prev in ([] if not progress else con.execute(
        """WITH m AS (
             SELECT partition_token, pull_id, arrival, commit_timestamp AS ts
               FROM data_change_records WHERE stream = $s AND arrival IS NOT NULL
             UNION ALL SELECT partition_token, pull_id, arrival, timestamp
               FROM heartbeats WHERE stream = $s AND arrival IS NOT NULL),
           o AS (SELECT partition_token, ts, max(ts) OVER (PARTITION BY partition_token, pull_id
                        ORDER BY arrival ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
                 FROM m)
           SELECT partition_token, epoch_ns(ts), epoch_ns(prev) FROM o WHERE ts < prev
           ORDER BY 2 LIMIT 1000""",
        {"s": stream},
    ).fetchall()):
        out.append({"kind": "watermark_backwards", "partition": token, "at": _ts(at),
                    "detail": f"progress mark {_ts(at)} arrived after {_ts(prev)}"})
    for token, ended in con.execute(
        """SELECT token, epoch_ns(end_ts) FROM partitions p WHERE stream = $s
             AND state = 'finished' AND end_ts < make_timestamp_ns($end)
             AND NOT EXISTS (SELECT 1 FROM edges e WHERE e.stream = $s AND e.parent = p.token)
           ORDER BY end_ts""",
        {"s": stream, "end": end or 0},
    ).fetchall():
        out.append({"kind": "ended_without_children", "partition": token, "at": _ts(ended),
                    "detail": "the partition ended before the range end and named no children"})
    for token, start in con.execute(
        """SELECT token, epoch_ns(start_ts) FROM partitions WHERE stream = $s
             AND state = 'pending' AND start_ts <= make_timestamp_ns($end) ORDER BY start_ts""",
        {"s": stream, "end": end or 0},
    ).fetchall():
        out.append({"kind": "child_never_read", "partition": token, "at": _ts(start),
                    "detail": "announced by a child partitions record but never read"})
    for token, error in con.execute(
        "SELECT token, error FROM partitions WHERE stream = ? AND state = 'incomplete'", [stream]
    ).fetchall():
        out.append({"kind": "read_failed", "partition": token, "at": None,
                    "detail": f"reading stopped early: {error or 'unknown error'}"})
    if progress:
        gaps = heartbeat_gaps(con, stream)
        for row in gaps.itertuples():
            out.append({"kind": "heartbeat_gap", "partition": row.partition,
                        "at": _ts(row.from_ns),
                        "detail": f"no progress mark for {row.gap_s:.1f}s until "
                                  f"{_ts(row.to_ns)}"})
        parts = partitions(con, stream, stall_after_s)
        for row in parts[parts["stalled"]].itertuples():
            out.append({"kind": "stalled", "partition": row.token, "at": _ts(row.watermark_ns),
                        "detail": f"watermark {row.lag_s:.1f}s behind the range end"})
    systems = _systems_module()
    if with_stalls and systems is not None and systems.has_heartbeats(con, stream, system):
        replay = stalls.watermark_replay(con, stream)
        out.extend(stalls.as_anomalies(stalls.stalls(con, stream, stall_after_s, replay)))
    if systems is not None and hasattr(systems, "system_anomalies"):
        out.extend(systems.system_anomalies(con, stream, system, stall_after_s=stall_after_s))
    return out


def summary(con: duckdb.DuckDBPyConnection, stream: str) -> dict[str, Any]:
    """Counts for the overview: records by kind, partitions by state, range."""
    dc, dc_tx, no_time = con.execute(
        "SELECT count(*), count(DISTINCT server_transaction_id), "
        "count(*) FILTER (WHERE commit_timestamp IS NULL) FROM data_change_records "
        "WHERE stream = ?", [stream]
    ).fetchone()
    (hb,) = con.execute("SELECT count(*) FROM heartbeats WHERE stream = ?", [stream]).fetchone()
    (cp,) = con.execute(
        "SELECT count(*) FROM child_partitions_records WHERE stream = ?", [stream]
    ).fetchone()
    pr = dict(con.execute(  # MUTABLE_KEY_RANGE partition start / event / end records
        "SELECT kind, count(*) FROM partition_records WHERE stream = ? GROUP BY ALL", [stream]
    ).fetchall())
    states = dict(con.execute(
        "SELECT state, count(*) FROM partitions WHERE stream = ? GROUP BY ALL", [stream]
    ).fetchall())
    (bad,) = con.execute("SELECT count(*) FROM quarantine WHERE stream = ?", [stream]).fetchone()
    rng = con.execute(
        "SELECT epoch_ns(range_start), epoch_ns(range_end), system, source FROM streams "
        "WHERE stream = ?", [stream]
    ).fetchone()
    return {
        "records": {"data_change": int(dc), "heartbeat": int(hb), "child_partitions": int(cp),
                    **{k: int(v) for k, v in sorted(pr.items())},
                    # the source gave no time for these (shown as unknown, never the epoch)
                    "data_change_without_time": int(no_time)},
        "transactions": int(dc_tx),
        "partitions": {k: int(v) for k, v in states.items()},
        "quarantined": int(bad),
        "range_start_ns": rng[0] if rng else None,
        "range_end_ns": rng[1] if rng else None,
        "system": rng[2] if rng else None,
        "source": rng[3] if rng else None,
    }


def build_report(
    con: duckdb.DuckDBPyConnection, stream: str, stall_after_s: float = 60.0
) -> dict[str, Any]:
    """The `report --json` object (keys documented in docs/command-line.md)."""
    parts = partitions(con, stream, stall_after_s)
    edge_df = edges(con, stream)
    wm, holder = low_watermark(con, stream)
    systems = _systems_module()
    system = _system(con, stream)
    special = None
    if systems is not None and hasattr(systems, "stream_watermark"):
        special = systems.stream_watermark(con, stream, system)
    if special is not None:
        wm, holder = special
    elif system not in PROGRESS_SYSTEMS:
        wm, holder = None, None  # e.g. Datastream: events carry no watermark
    counts = summary(con, stream)
    return {
        "stream": stream,
        "system": system,
        "range": {"start": _ts(counts["range_start_ns"]), "end": _ts(counts["range_end_ns"])},
        "partitions": [
            {
                "token": r.token,
                "parents": list(r.parents),
                "start": _ts(r.start_ns),
                "end": _ts(r.end_ns),
                "finished": bool(r.finished),
                "state": r.state,
                "watermark": _ts(r.watermark_ns),
                "data_change_records": int(r.data_change_records),
                "heartbeats": int(r.heartbeats),
                "stalled": bool(r.stalled),
            }
            for r in parts.itertuples()
        ],
        "edges": [
            {"parent": None if pd.isna(r.parent) else r.parent,
             "child": r.child, "kind": r.kind}
            for r in edge_df.itertuples()
        ],
        "low_watermark": _ts(wm),
        "holding_back": holder,
        "records": counts["records"],
        "duplicates": duplicates(con, stream),
        "transactions": transaction_counts(con, stream),
        "anomalies": anomalies(con, stream, stall_after_s),
        "quarantined": counts["quarantined"],
    }


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=False)
