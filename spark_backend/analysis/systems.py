"""Analysis that depends on the stream's system (datastream, cockroachdb, bigtable, beam).

All functions take a DuckDB connection to the cache and the stream's name; pure SQL over the
cache (plus ``beam_partitions`` for Beam metadata streams).

- :func:`system_anomalies` -> ``[{"kind", "partition", "at", "detail"}]`` (``at`` RFC 3339)
- :func:`freshness` -> DataFrame: read time minus source time per event (Datastream)
- :func:`beam_states` -> DataFrame: per partition, time in each state, stuck in CREATED/SCHEDULED
- :func:`stream_watermark` -> ``(ns, holding partition)`` where the system's watermark is not the
  generic "min over open partitions of the latest progress mark", else None
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd

from spark_backend.model.timestamps import format_ns

NS = 1_000_000_000


def _ts(ns: Any) -> str | None:
    if ns is None or (isinstance(ns, float) and pd.isna(ns)):
        return None
    return format_ns(int(ns))


def _has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
    ).fetchone()
    return bool(row and row[0])


# --- progress: heartbeats or freshness -----------------------------------------------------------

# Systems whose partitions vouch for progress when nothing changes (Spanner heartbeats, Bigtable
# heartbeats with their low watermarks, Beam's watermark column): there a quiet partition has
# stalled. Datastream sends only changes, so a quiet table is only quiet; a CockroachDB
# changefeed vouches for progress only with resolved timestamps (an option).
HEARTBEAT_SYSTEMS = frozenset({"spanner", "bigtable", "beam"})


def has_heartbeats(con: duckdb.DuckDBPyConnection, stream: str, system: str | None) -> bool:
    """Whether the stream's silence can be a stall: its system sends heartbeats (or resolved
    timestamps, CockroachDB) and words about stalls apply; else freshness words do."""
    if system in HEARTBEAT_SYSTEMS or system is None:
        return True
    if system == "cockroachdb":
        row = con.execute("SELECT count(*) FROM heartbeats WHERE stream = ?", [stream]).fetchone()
        return bool(row and row[0])
    return False


def freshness_summary(con: duckdb.DuckDBPyConnection, stream: str) -> dict[str, Any]:
    """For a stream without heartbeats: how many data change records, how many carry a source
    time, the latest source time (``latest_ns``), and the worst delay from source to read
    (``worst_lag_s``, its ``worst_table`` and ``worst_ns``; None where the system gives no
    read time)."""
    total, timed, latest = con.execute(
        "SELECT count(*), count(commit_timestamp), epoch_ns(max(commit_timestamp)) "
        "FROM data_change_records WHERE stream = ?", [stream]).fetchone()
    worst = con.execute(
        """SELECT table_name, epoch_ns(commit_timestamp),
                  (epoch_ns(read_timestamp) - epoch_ns(commit_timestamp)) / 1e9 AS lag
           FROM data_change_records WHERE stream = ? AND read_timestamp IS NOT NULL
             AND commit_timestamp IS NOT NULL
           ORDER BY lag DESC, table_name LIMIT 1""", [stream]).fetchone()
    return {"records": int(total), "timed": int(timed),
            "latest_ns": None if latest is None else int(latest),
            "worst_lag_s": None if worst is None else float(worst[2]),
            "worst_table": None if worst is None else worst[0],
            "worst_ns": None if worst is None else int(worst[1])}


# --- watermarks ----------------------------------------------------------------------------------


def stream_watermark(
    con: duckdb.DuckDBPyConnection, stream: str, system: str
) -> tuple[int | None, str | None] | None:
    """The stream's watermark where the system defines its own; None: use the generic one.

    - cockroachdb: the highest resolved timestamp seen (resolved is changefeed-wide); no holder.
    - bigtable: the lowest of the per-partition estimated low watermarks (each partition's
      latest) over partitions not finished, and the partition holding it.
    - beam: the lowest Watermark over partitions not FINISHED in the metadata table, and its
      partition (the pipeline's own watermark).
    """
    if system == "cockroachdb":
        row = con.execute(
            "SELECT epoch_ns(max(timestamp)) FROM heartbeats WHERE stream = ?", [stream]
        ).fetchone()
        return (None if row[0] is None else int(row[0])), None
    if system == "bigtable":
        row = con.execute(
            """SELECT h.partition_token, epoch_ns(max(h.timestamp)) AS wm
               FROM heartbeats h LEFT JOIN partitions p
                 ON p.stream = h.stream AND p.token = h.partition_token
               WHERE h.stream = $s AND coalesce(p.state, 'open') <> 'finished'
               GROUP BY h.partition_token ORDER BY wm, h.partition_token LIMIT 1""",
            {"s": stream},
        ).fetchone()
        if row is None:
            return None, None
        return int(row[1]), row[0]
    if system == "beam":
        if not _has_table(con, "beam_partitions"):
            return None, None
        row = con.execute(
            """SELECT partition_token, epoch_ns(watermark) AS wm FROM beam_partitions
               WHERE stream = $s AND state <> 'FINISHED' AND watermark IS NOT NULL
               ORDER BY wm, partition_token LIMIT 1""",
            {"s": stream},
        ).fetchone()
        if row is None:
            return None, None
        return int(row[1]), row[0]
    return None


# --- Datastream ----------------------------------------------------------------------------------


def freshness(con: duckdb.DuckDBPyConnection, stream: str) -> pd.DataFrame:
    """Per event: source time, read time, lag (read - source, seconds), table, phase, uuid;
    ordered by read time (plot lag_s over read_ns)."""
    return con.execute(
        """SELECT table_name, epoch_ns(commit_timestamp) AS source_ns,
                  epoch_ns(read_timestamp) AS read_ns,
                  (epoch_ns(read_timestamp) - epoch_ns(commit_timestamp)) / 1e9 AS lag_s,
                  extra ->> 'phase' AS phase, extra ->> 'read_method' AS read_method,
                  record_id AS uuid, copies
           FROM data_change_records
           WHERE stream = $s AND read_timestamp IS NOT NULL
           ORDER BY read_timestamp, record_id""",
        {"s": stream},
    ).df()


def _datastream_anomalies(con, stream, freshness_lag_s: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # order conflict: in the source's own order (order_key) a key's source time goes back
    for table, keys, at, prev, uuid in con.execute(
        """WITH k AS (
             SELECT d.table_name, m.keys::VARCHAR AS keys, d.order_key, d.record_id,
                    d.commit_timestamp AS ts
             FROM data_change_records d JOIN mods m
               ON m.stream = d.stream AND m.record_key = d.record_key
             WHERE d.stream = $s AND coalesce(d.extra ->> 'phase', 'cdc') <> 'backfill'
               AND m.keys::VARCHAR <> '{}'),
           o AS (SELECT *, max(ts) OVER (PARTITION BY table_name, keys ORDER BY order_key
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM k)
           SELECT table_name, keys, epoch_ns(ts), epoch_ns(prev), record_id FROM o
           WHERE ts < prev ORDER BY table_name, order_key LIMIT 1000""",
        {"s": stream},
    ).fetchall():
        out.append({
            "kind": "order_conflict", "partition": table, "at": _ts(at),
            "detail": f"event {uuid} for key {keys} comes after one at {_ts(prev)} in the "
                      f"source's log order but has an earlier source_timestamp {_ts(at)}",
        })
    for table, worst, worst_at, n in con.execute(
        """SELECT table_name, max(lag) AS worst, arg_max(src, lag), count(*)
           FROM (SELECT table_name, epoch_ns(commit_timestamp) AS src,
                        (epoch_ns(read_timestamp) - epoch_ns(commit_timestamp)) / 1e9 AS lag
                 FROM data_change_records WHERE stream = $s AND read_timestamp IS NOT NULL
                   AND coalesce(extra ->> 'phase', 'cdc') <> 'backfill')
           WHERE lag > $lag GROUP BY table_name ORDER BY table_name""",
        {"s": stream, "lag": freshness_lag_s},
    ).fetchall():
        out.append({
            "kind": "freshness_lag", "partition": table, "at": _ts(worst_at),
            "detail": f"{n} CDC events read more than {freshness_lag_s:g}s after they changed "
                      f"on the source (worst {worst:.1f}s)",
        })
    for table, n, first in con.execute(
        """SELECT table_name, count(*), epoch_ns(min(commit_timestamp))
           FROM data_change_records WHERE stream = $s AND (extra ->> 'phase') = 'supplementation'
           GROUP BY table_name ORDER BY table_name""",
        {"s": stream},
    ).fetchall():
        out.append({
            "kind": "rolled_back_transaction", "partition": table, "at": _ts(first),
            "detail": f"{n} supplementation events: reverse DML of rolled-back transactions",
        })
    return out


# --- CockroachDB ---------------------------------------------------------------------------------

_CRDB_POSITIONS = """
    SELECT d.table_name, m.keys::VARCHAR AS keys, d.commit_timestamp AS ts, d.record_id,
           d.origin, CAST(d.extra ->> 'line' AS BIGINT) AS line,
           coalesce(CAST(d.extra ->> 'batch_index' AS BIGINT), -1) AS idx,
           d.partition_token
    FROM data_change_records d JOIN mods m ON m.stream = d.stream AND m.record_key = d.record_key
    WHERE d.stream = $s AND (d.extra ->> 'timestamp') <> 'none'
"""


def _cockroach_anomalies(con, stream) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # a key going back in time: in delivery order (file, line, batch index; first copy of each
    # version) a previously unseen version older than one already delivered
    for table, keys, token, at, prev, origin, line in con.execute(
        f"""WITH k AS ({_CRDB_POSITIONS}),
           o AS (SELECT *, max(ts) OVER (PARTITION BY table_name, keys ORDER BY origin, line, idx
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev FROM k)
           SELECT table_name, keys, partition_token, epoch_ns(ts), epoch_ns(prev), origin, line
           FROM o WHERE ts < prev ORDER BY origin, line, idx LIMIT 1000""",
        {"s": stream},
    ).fetchall():
        out.append({
            "kind": "key_back_in_time", "partition": token, "at": _ts(at),
            "detail": f"{table} key {keys}: a new version at {_ts(at)} arrived after the version "
                      f"at {_ts(prev)} ({origin} line {line}); per-key ordering was broken",
        })
    # a row below a resolved timestamp delivered before it in the same file
    for table, keys, token, at, resolved, origin, line in con.execute(
        f"""WITH k AS ({_CRDB_POSITIONS}),
           r AS (SELECT extra ->> 'origin' AS origin, CAST(extra ->> 'line' AS BIGINT) AS line,
                        timestamp AS ts
                 FROM heartbeats WHERE stream = $s AND (extra ->> 'origin') IS NOT NULL),
           j AS (SELECT k.*, (SELECT max(r.ts) FROM r WHERE r.origin = k.origin
                              AND r.line < k.line) AS resolved FROM k)
           SELECT table_name, keys, partition_token, epoch_ns(ts), epoch_ns(resolved), origin,
                  line FROM j WHERE ts < resolved ORDER BY origin, line LIMIT 1000""",
        {"s": stream},
    ).fetchall():
        out.append({
            "kind": "below_resolved", "partition": token, "at": _ts(at),
            "detail": f"{table} key {keys}: version at {_ts(at)} arrived after resolved "
                      f"{_ts(resolved)} ({origin} line {line})",
        })
    return out


# --- Bigtable ------------------------------------------------------------------------------------


def _bigtable_anomalies(con, stream, stall_after_s: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for token, wm, lead in con.execute(
        """WITH w AS (SELECT h.partition_token, max(h.timestamp) AS wm
                      FROM heartbeats h WHERE h.stream = $s GROUP BY ALL),
           top AS (SELECT max(wm) AS lead FROM w),
           st AS (SELECT token, state FROM partitions WHERE stream = $s)
           SELECT w.partition_token, epoch_ns(w.wm), epoch_ns(top.lead)
           FROM w CROSS JOIN top LEFT JOIN st ON st.token = w.partition_token
           WHERE coalesce(st.state, 'open') <> 'finished'
             AND epoch_ns(top.lead) - epoch_ns(w.wm) > $ns
           ORDER BY w.wm, w.partition_token""",
        {"s": stream, "ns": int(stall_after_s * NS)},
    ).fetchall():
        out.append({
            "kind": "stalled_watermark", "partition": token, "at": _ts(wm),
            "detail": f"estimated low watermark stuck at {_ts(wm)}, {(lead - wm) / NS:.1f}s "
                      f"behind the most advanced partition ({_ts(lead)}); it holds the "
                      "stream-wide low watermark back",
        })
    return out


# --- Beam ----------------------------------------------------------------------------------------


def beam_states(
    con: duckdb.DuckDBPyConnection, stream: str, stuck_after_s: float = 300.0
) -> pd.DataFrame:
    """Per partition of a Beam metadata stream: state, parents, watermark, the time it spent in
    CREATED, SCHEDULED and RUNNING (up to the read time when still there), and ``stuck``
    (still CREATED or SCHEDULED for more than ``stuck_after_s``)."""
    if not _has_table(con, "beam_partitions"):
        return pd.DataFrame(columns=[
            "token", "state", "parents", "start_ns", "watermark_ns", "created_ns",
            "scheduled_ns", "running_ns", "finished_ns", "read_at_ns", "created_s",
            "scheduled_s", "running_s", "waiting_s", "stuck",
        ])
    df = con.execute(
        """SELECT partition_token AS token, state, parent_tokens::VARCHAR AS parents,
                  epoch_ns(start_timestamp) AS start_ns, epoch_ns(watermark) AS watermark_ns,
                  epoch_ns(created_at) AS created_ns, epoch_ns(scheduled_at) AS scheduled_ns,
                  epoch_ns(running_at) AS running_ns, epoch_ns(finished_at) AS finished_ns,
                  epoch_ns(read_at) AS read_at_ns,
                  (epoch_ns(coalesce(scheduled_at, running_at, finished_at, read_at))
                     - epoch_ns(created_at)) / 1e9 AS created_s,
                  CASE WHEN scheduled_at IS NULL THEN NULL ELSE
                    (epoch_ns(coalesce(running_at, finished_at, read_at))
                     - epoch_ns(scheduled_at)) / 1e9 END AS scheduled_s,
                  CASE WHEN running_at IS NULL THEN NULL ELSE
                    (epoch_ns(coalesce(finished_at, read_at)) - epoch_ns(running_at)) / 1e9
                  END AS running_s,
                  CASE state WHEN 'CREATED' THEN
                         (epoch_ns(read_at) - epoch_ns(created_at)) / 1e9
                       WHEN 'SCHEDULED' THEN
                         (epoch_ns(read_at) - epoch_ns(scheduled_at)) / 1e9
                  END AS waiting_s
           FROM beam_partitions WHERE stream = $s ORDER BY start_timestamp, partition_token""",
        {"s": stream},
    ).df()
    df["stuck"] = df["state"].isin(["CREATED", "SCHEDULED"]) & (
        df["waiting_s"].fillna(0) > stuck_after_s
    )
    return df


def _beam_anomalies(con, stream, stall_after_s: float, stuck_after_s: float) -> list[dict]:
    out: list[dict[str, Any]] = []
    states = beam_states(con, stream, stuck_after_s)
    if states.empty:
        return out
    for r in states[states["stuck"]].itertuples():
        since = r.created_ns if r.state == "CREATED" else r.scheduled_ns
        out.append({
            "kind": f"stuck_{r.state.lower()}", "partition": r.token, "at": _ts(since),
            "detail": f"in {r.state} for {r.waiting_s:.1f}s (read at {_ts(r.read_at_ns)}); the "
                      "pipeline has not started reading it",
        })
    running = states[states["state"] == "RUNNING"]
    if not running.empty:
        lead = states["watermark_ns"].max()
        for r in running.itertuples():
            lag = (lead - r.watermark_ns) / NS
            if lag > stall_after_s:
                out.append({
                    "kind": "stalled", "partition": r.token, "at": _ts(r.watermark_ns),
                    "detail": f"RUNNING with watermark {_ts(r.watermark_ns)}, {lag:.1f}s behind "
                              f"the most advanced partition",
                })
    return out


# --- entry point ---------------------------------------------------------------------------------


def system_anomalies(
    con: duckdb.DuckDBPyConnection, stream: str, system: str, *,
    stall_after_s: float = 60.0, stuck_after_s: float = 300.0, freshness_lag_s: float = 300.0,
) -> list[dict[str, Any]]:
    """What the system itself defines as wrong (the generic anomalies are the report's):

    - datastream: ``order_conflict`` (source log order vs source_timestamp disagree for a key),
      ``freshness_lag`` (CDC events read > ``freshness_lag_s`` after the change, per table),
      ``rolled_back_transaction`` (supplementation events);
    - cockroachdb: ``key_back_in_time`` (per-key ordering broken), ``below_resolved``;
    - bigtable: ``stalled_watermark`` (a partition's estimated low watermark behind the most
      advanced partition by more than ``stall_after_s``);
    - beam: ``stuck_created``/``stuck_scheduled`` (waiting > ``stuck_after_s``), ``stalled``
      (a RUNNING partition's watermark behind by more than ``stall_after_s``).
    """
    if system == "datastream":
        return _datastream_anomalies(con, stream, freshness_lag_s)
    if system == "cockroachdb":
        return _cockroach_anomalies(con, stream)
    if system == "bigtable":
        return _bigtable_anomalies(con, stream, stall_after_s)
    if system == "beam":
        return _beam_anomalies(con, stream, stall_after_s, stuck_after_s)
    return []
