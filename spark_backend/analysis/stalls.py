"""Stalls over a range: the watermarks replayed on a time grid, each partition's lag behind the
frontier over time, and the stalls that held the low watermark back, worst (costliest) first.

Words (DESIGN.md): a partition's **lag** at a moment t is t minus its watermark at t; the **low
watermark** is the minimum over partitions alive at t, held by the partition with that minimum.
A **stall** is a stretch of moments where one partition held the low watermark more than the
threshold behind; its **cost** is how long it did. The worst stall is the one to show first.
"""

from __future__ import annotations

from typing import Any

import duckdb
import pandas as pd

from spark_backend.model.timestamps import format_ns

from .dag import range_end_ns

DEFAULT_POINTS = 240

_REPLAY_SQL = """
WITH data AS (
    SELECT epoch_ns(min(start_ts)) AS lo,
           epoch_ns(greatest(max(coalesce(end_ts, watermark)), max(read_to))) AS hi
    FROM partitions WHERE stream = $stream),
bounds AS (  -- the range asked for, within the time the stream's partitions cover
    SELECT greatest(coalesce($lo, lo), lo) AS lo, least(coalesce($hi, hi), hi) AS hi
    FROM data),
grid AS (  -- 128-bit steps: (hi - lo) * i may pass 64 bits over a range of decades
    SELECT CAST(lo + CAST(hi - lo AS HUGEINT) * i // $n AS BIGINT) AS t_ns
    FROM bounds, range(1, $n + 1) r(i) WHERE lo IS NOT NULL AND hi > lo),
alive AS (
    SELECT g.t_ns, p.token, epoch_ns(p.start_ts) AS start_ns
    FROM grid g JOIN partitions p ON p.stream = $stream
      AND epoch_ns(p.start_ts) <= g.t_ns
      AND (p.end_ts IS NULL OR epoch_ns(p.end_ts) > g.t_ns)
      AND p.state <> 'pending'),
step AS (SELECT greatest(1, (hi - lo) // $n) AS ns, lo FROM bounds),
marks AS (  -- the latest mark per partition and grid step: what an ASOF needs
    SELECT partition_token AS token, max(epoch_ns(ts)) AS ts_ns
    FROM progress_marks, step WHERE stream = $stream AND epoch_ns(ts) <= (SELECT hi FROM bounds)
    GROUP BY partition_token, (epoch_ns(ts) - step.lo) // step.ns)
SELECT a.t_ns, a.token AS partition,
       greatest(coalesce(m.ts_ns, a.start_ns), a.start_ns) AS watermark_ns
FROM alive a ASOF LEFT JOIN marks m ON a.token = m.token AND a.t_ns >= m.ts_ns
ORDER BY a.t_ns, a.token
"""


def watermark_replay(con: duckdb.DuckDBPyConnection, stream: str, points: int = DEFAULT_POINTS,
                     start_ns: int | None = None, end_ns: int | None = None) -> pd.DataFrame:
    """Every partition's watermark at each of ``points`` moments over ``[start_ns, end_ns]``
    within the time the stream's partitions cover (default: all of it). One row per (t_ns,
    partition alive at t): watermark_ns is its latest progress mark at or before t (its start
    when it has none yet)."""
    return con.execute(_REPLAY_SQL, {"stream": stream, "n": max(2, int(points)),
                                     "lo": start_ns, "hi": end_ns}).df()


def low_watermark_over_time(replay: pd.DataFrame) -> pd.DataFrame:
    """Per moment: the low watermark, the partition holding it, and its lag (``held_s``)."""
    if replay.empty:
        return pd.DataFrame({"t_ns": pd.Series(dtype="int64"),
                             "low_ns": pd.Series(dtype="int64"),
                             "holder": pd.Series(dtype=object),
                             "held_s": pd.Series(dtype=float)})
    idx = replay.sort_values(["t_ns", "watermark_ns", "partition"]).groupby("t_ns").head(1)
    out = idx.rename(columns={"watermark_ns": "low_ns", "partition": "holder"})
    out = out[["t_ns", "low_ns", "holder"]].reset_index(drop=True)
    out["held_s"] = (out["t_ns"] - out["low_ns"]) / 1e9
    return out


def lag_over_time(replay: pd.DataFrame, top: int = 12,
                  always: tuple[str, ...] = ()) -> tuple[pd.DataFrame, int]:
    """(t_ns, partition, lag_s) for the ``top`` partitions that lagged most (and those in
    ``always``), and how many partitions there were in all (the chart says what it shows)."""
    if replay.empty:
        return replay.assign(lag_s=pd.Series(dtype=float)), 0
    lag = replay.assign(lag_s=(replay["t_ns"] - replay["watermark_ns"]) / 1e9)
    worst = lag.groupby("partition")["lag_s"].max().sort_values(ascending=False)
    keep = list(worst.index[:top]) + [p for p in always if p in worst.index]
    return lag[lag["partition"].isin(keep)].reset_index(drop=True), len(worst)


def stalls(con: duckdb.DuckDBPyConnection, stream: str, threshold_s: float,
           replay: pd.DataFrame) -> list[dict[str, Any]]:
    """The stalls of the replayed range, costliest first.

    Each: partition, since_ns (its watermark: the last progress mark before it went quiet),
    until_ns (its next progress mark, None when it has none yet), ongoing (still holding the
    low watermark back at the end of the range), max_lag_s (how far the low watermark fell
    behind), cost_s (how long it held the low watermark more than ``threshold_s`` behind),
    first_ns / last_ns (the first and last moment of the replay it did).
    """
    low = low_watermark_over_time(replay)
    if len(low) < 2:
        return []
    step_s = float(low["t_ns"].diff().median()) / 1e9
    over = low[low["held_s"] > threshold_s]
    if over.empty:
        return []
    last_t = int(low["t_ns"].iloc[-1])
    out = []
    for (holder, since), group in over.groupby(["holder", "low_ns"], sort=False):
        until = _next_mark(con, stream, holder, int(since))
        last_ns = int(group["t_ns"].max())
        ongoing = last_ns == last_t and (until is None or until > last_t)
        out.append({
            "partition": holder, "since_ns": int(since),
            "until_ns": None if until is None or until > last_t else until,
            "ongoing": bool(ongoing), "max_lag_s": float(group["held_s"].max()),
            "cost_s": len(group) * step_s, "first_ns": int(group["t_ns"].min()),
            "last_ns": last_ns,
        })
    out.sort(key=lambda s: (-s["cost_s"], s["since_ns"], s["partition"]))
    return out


def _next_mark(con: duckdb.DuckDBPyConnection, stream: str, token: str,
               after_ns: int) -> int | None:
    """The partition's first progress mark (or its end) after ``after_ns``."""
    row = con.execute(
        """SELECT least(
               (SELECT min(epoch_ns(ts)) FROM progress_marks
                WHERE stream = $s AND partition_token = $t AND epoch_ns(ts) > $a),
               (SELECT epoch_ns(end_ts) FROM partitions
                WHERE stream = $s AND token = $t AND epoch_ns(end_ts) > $a))""",
        {"s": stream, "t": token, "a": int(after_ns)},
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def worst_stall(con: duckdb.DuckDBPyConnection, stream: str, threshold_s: float = 60.0,
                start_ns: int | None = None, end_ns: int | None = None,
                points: int = DEFAULT_POINTS) -> dict[str, Any] | None:
    """The costliest stall of the range (None: no partition held the low watermark back more
    than ``threshold_s``)."""
    replay = watermark_replay(con, stream, points, start_ns, end_ns)
    found = stalls(con, stream, threshold_s, replay)
    return found[0] if found else None


def current_state(con: duckdb.DuckDBPyConnection, stream: str,
                  replay: pd.DataFrame) -> dict[str, Any] | None:
    """The low watermark at the last moment of the replay: when, who, how far behind."""
    low = low_watermark_over_time(replay)
    if low.empty:
        return None
    last = low.iloc[-1]
    return {"t_ns": int(last["t_ns"]), "low_ns": int(last["low_ns"]),
            "holder": last["holder"], "lag_s": float(last["held_s"]),
            "range_end_ns": range_end_ns(con, stream)}


def holding_back(now: dict[str, Any] | None, stall_s: float) -> str | None:
    """The partition holding the low watermark more than ``stall_s`` behind at the moment of
    ``now`` (a :func:`current_state`), or None."""
    return now["holder"] if now is not None and now["lag_s"] > stall_s else None


def as_anomalies(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stalls of :func:`stalls` as anomalies (kind ``stall``), costliest first: a stall is
    an anomaly wherever it is shown."""
    out = []
    for s in found:
        end = "still holds it back" if s["ongoing"] else (
            f"until {format_ns(s['until_ns'] if s['until_ns'] is not None else s['last_ns'])}")
        out.append({"kind": "stall", "partition": s["partition"],
                    "at": format_ns(int(s["since_ns"])),
                    "detail": f"held the low watermark up to {s['max_lag_s']:.1f}s behind, "
                              f"more than the threshold for {s['cost_s']:.1f}s; {end}"})
    return out
