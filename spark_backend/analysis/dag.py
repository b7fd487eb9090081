"""The partition DAG: partitions with their parents and children, edges with their kind."""

from __future__ import annotations

import duckdb
import pandas as pd

from spark_backend.analysis.systems import has_heartbeats
from spark_backend.model.enums import EdgeKind

EDGE_KINDS = tuple(k.value for k in (EdgeKind.ROOT, EdgeKind.SPLIT, EdgeKind.MERGE, EdgeKind.MOVE,
                                      EdgeKind.MOVE_IN, EdgeKind.MOVE_OUT))

_EDGES_SQL = """
WITH e AS (SELECT parent, child, min(start_ts) AS ts FROM edges WHERE stream = $stream
           GROUP BY ALL),
     n_parents AS (SELECT child, count(parent) AS n FROM e GROUP BY child),
     n_children AS (SELECT parent, count(*) AS n FROM e WHERE parent IS NOT NULL GROUP BY parent),
     -- MUTABLE_KEY_RANGE: key ranges moving between partitions (partition event records)
     moves AS (
        SELECT partition_token AS parent, unnest(from_json(move_out, '["VARCHAR"]')) AS child,
               'move_out' AS kind, timestamp AS ts
        FROM partition_records WHERE stream = $stream AND kind = 'partition_event'
        UNION ALL
        SELECT unnest(from_json(move_in, '["VARCHAR"]')) AS parent, partition_token AS child,
               'move_in' AS kind, timestamp AS ts
        FROM partition_records WHERE stream = $stream AND kind = 'partition_event')
SELECT parent, child, kind, ts_ns FROM (
    SELECT e.parent, e.child,
           CASE WHEN e.parent IS NULL THEN 'root'
                WHEN np.n > 1 THEN 'merge'
                WHEN nc.n > 1 THEN 'split'
                ELSE 'move' END AS kind,
           epoch_ns(e.ts) AS ts_ns, 0 AS o
    FROM e JOIN n_parents np USING (child) LEFT JOIN n_children nc ON nc.parent = e.parent
    UNION ALL
    SELECT DISTINCT parent, child, kind, epoch_ns(ts) AS ts_ns, 1 AS o FROM moves)
ORDER BY o, parent NULLS FIRST, child, ts_ns, kind
"""


def edges(con: duckdb.DuckDBPyConnection, stream: str) -> pd.DataFrame:
    """parent (None for children of the initial query), child, kind, ts_ns.

    Kinds: root/split/merge/move from the records that announced partitions (``ts_ns``: the
    child's start); ``move_out``/``move_in`` for MUTABLE_KEY_RANGE key-range moves, one edge
    per partition event record side (parent: the partition the range moved out of, child: the
    one it moved into, ``ts_ns``: the commit timestamp of the move)."""
    return con.execute(_EDGES_SQL, {"stream": stream}).df()


def key_range_moves(con: duckdb.DuckDBPyConnection, stream: str) -> pd.DataFrame:
    """MUTABLE_KEY_RANGE key-range moves: ``source``, ``destination``, ``ts_ns``, and whether
    each side's partition event record was read (``move_out_seen``, ``move_in_seen``)."""
    df = edges(con, stream)
    moves = df[df["kind"].isin([EdgeKind.MOVE_IN.value, EdgeKind.MOVE_OUT.value])]
    if moves.empty:
        return pd.DataFrame({"source": [], "destination": [], "ts_ns": [],
                             "move_out_seen": [], "move_in_seen": []})
    out = (moves.assign(seen=True)
           .pivot_table(index=["parent", "child", "ts_ns"], columns="kind", values="seen",
                        aggfunc="any", fill_value=False)
           .reset_index().rename(columns={"parent": "source", "child": "destination"}))
    for side in ("move_out", "move_in"):
        out[f"{side}_seen"] = out[side].astype(bool) if side in out else False
    return out[["source", "destination", "ts_ns", "move_out_seen", "move_in_seen"]]


def range_end_ns(con: duckdb.DuckDBPyConnection, stream: str) -> int | None:
    row = con.execute(
        """SELECT epoch_ns(greatest(
                 (SELECT range_end FROM streams WHERE stream = $stream),
                 (SELECT max(read_to) FROM partitions WHERE stream = $stream),
                 (SELECT max(watermark) FROM partitions WHERE stream = $stream)))""",
        {"stream": stream},
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def partitions(
    con: duckdb.DuckDBPyConnection, stream: str, stall_after_s: float = 60.0
) -> pd.DataFrame:
    """One row per partition: token, parents, children, start/end/watermark (ns), state,
    finished, counts, lag_s behind the range end, stalled (never for a system without
    heartbeats: ``systems.has_heartbeats``)."""
    reference = range_end_ns(con, stream)
    df = con.execute(
        """
        WITH par AS (SELECT child AS token, list(DISTINCT parent ORDER BY parent)
                            FILTER (WHERE parent IS NOT NULL) AS parents
                     FROM edges WHERE stream = $stream GROUP BY child),
             kid AS (SELECT parent AS token, list(DISTINCT child ORDER BY child) AS children
                     FROM edges WHERE stream = $stream AND parent IS NOT NULL GROUP BY parent)
        SELECT p.token, coalesce(par.parents, []) AS parents,
               coalesce(kid.children, []) AS children,
               epoch_ns(p.start_ts) AS start_ns, epoch_ns(p.end_ts) AS end_ns,
               epoch_ns(coalesce(p.watermark, p.start_ts)) AS watermark_ns,
               epoch_ns(p.read_to) AS read_to_ns,
               p.state, p.state = 'finished' AS finished,
               p.data_change_records, p.heartbeats, p.attempts, p.error
        FROM partitions p LEFT JOIN par USING (token) LEFT JOIN kid USING (token)
        WHERE p.stream = $stream
        ORDER BY p.start_ts NULLS LAST, p.token
        """,
        {"stream": stream},
    ).df()
    if reference is None or df.empty:
        # No time read yet (a pull killed after its first query named the partitions): no lag
        df["lag_s"] = pd.Series(0.0, index=df.index, dtype=float)
        df["stalled"] = pd.Series(False, index=df.index, dtype=bool)
        return df
    lag = (reference - df["watermark_ns"].astype("float64")) / 1e9
    df["lag_s"] = lag.where(~df["finished"], 0.0).fillna(0.0)
    # Only where partitions vouch for progress (heartbeats) is a quiet one stalled.
    beats = has_heartbeats(con, stream, _system(con, stream))
    df["stalled"] = (~df["finished"]) & (df["lag_s"] > stall_after_s) & beats
    return df


def _system(con: duckdb.DuckDBPyConnection, stream: str) -> str | None:
    row = con.execute("SELECT system FROM streams WHERE stream = ?", [stream]).fetchone()
    return row[0] if row else None


def partition_detail(con: duckdb.DuckDBPyConnection, stream: str, token: str) -> dict:
    """Everything about one partition for a drill-down: its row, records, heartbeats, children."""
    row = con.execute(
        "SELECT * EXCLUDE (stream) FROM partitions WHERE stream = ? AND token = ?", [stream, token]
    ).df()
    records = con.execute(
        """SELECT commit_timestamp, record_sequence, server_transaction_id, table_name, mod_type,
                  mod_count, number_of_records_in_transaction,
                  number_of_partitions_in_transaction, transaction_tag, copies
           FROM data_change_records WHERE stream = ? AND partition_token = ?
           ORDER BY commit_timestamp, record_sequence LIMIT 500""",
        [stream, token],
    ).df()
    beats = con.execute(
        "SELECT timestamp FROM heartbeats WHERE stream = ? AND partition_token = ? "
        "ORDER BY timestamp",
        [stream, token],
    ).df()
    kids = con.execute(
        "SELECT child, start_ts FROM edges WHERE stream = ? AND parent = ? ORDER BY child",
        [stream, token],
    ).df()
    parents = con.execute(
        "SELECT parent FROM edges WHERE stream = ? AND child = ? ORDER BY parent", [stream, token]
    ).df()
    return {"partition": row, "records": records, "heartbeats": beats, "children": kids,
            "parents": parents}
