"""The faster forms of the pages' queries and charts give what their plain forms give, on the
demo world landed without Spark (a real DuckDB file): heartbeat gaps without a DISTINCT first,
the Partitions table's longest silences windowed by a partition number, a transaction's records
with its mods read within its commit times, and the lag chart drawn from millisecond arrays."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from app import partitions_view
from spark_backend import analysis
from spark_backend.analysis import figures, stalls
from spark_backend.analysis.dag import range_end_ns
from spark_backend.analysis.transactions import transaction_records
from spark_backend.cache.store import Cache
from tests.support.demo_cache import DEMO_SCALE, DEMO_SEED

STREAM = "DemoStream"


@pytest.fixture(scope="module")
def cache(tmp_path_factory, landed_caches):
    path = landed_caches.copy(tmp_path_factory.mktemp("fastq") / "demo.duckdb",
                              DEMO_SEED, DEMO_SCALE)
    with Cache(path) as c:
        # repeated marks, as a re-delivered heartbeat leaves them: gaps must not change
        c.con.execute("INSERT INTO heartbeats SELECT * FROM heartbeats WHERE stream = ? "
                      "USING SAMPLE 20 ROWS", [STREAM])
        yield c


def _plain_gaps(con, threshold_ns: int) -> pd.DataFrame:
    """The definition: consecutive distinct progress marks (and starts) of a partition."""
    return con.execute(
        """WITH marks AS (
               SELECT partition_token, ts FROM progress_marks WHERE stream = $s
               UNION ALL SELECT partition_token, timestamp FROM partition_records
               WHERE stream = $s AND partition_token IS NOT NULL
               UNION ALL SELECT token, start_ts FROM partitions
               WHERE stream = $s AND start_ts IS NOT NULL AND state <> 'pending'),
           d AS (SELECT DISTINCT partition_token, ts FROM marks),
           o AS (SELECT partition_token, ts,
                        lag(ts) OVER (PARTITION BY partition_token ORDER BY ts) AS prev FROM d)
           SELECT partition_token AS partition, epoch_ns(prev) AS from_ns,
                  epoch_ns(ts) AS to_ns FROM o
           WHERE prev IS NOT NULL AND epoch_ns(ts) - epoch_ns(prev) > $t""",
        {"s": STREAM, "t": threshold_ns}).df()


@pytest.mark.parametrize("k", [0.3, 1.5, 3.0])
def test_heartbeat_gaps_are_the_gaps_between_distinct_marks(cache, k):
    beat_ms = cache.con.execute("SELECT heartbeat_ms FROM streams WHERE stream = ?",
                                [STREAM]).fetchone()[0]
    got = analysis.heartbeat_gaps(cache.con, STREAM, k)
    want = _plain_gaps(cache.con, int(k * beat_ms * 1_000_000))
    assert len(got) == len(want)
    key = ["partition", "from_ns", "to_ns"]
    assert (got[key].sort_values(key).reset_index(drop=True)
            .equals(want[key].sort_values(key).reset_index(drop=True)))
    assert list(got["gap_s"]) == sorted(got["gap_s"], reverse=True)
    if k == 0.3:
        assert len(got) > 10  # the check above compared something


def test_partitions_table_longest_silence_is_that_of_each_partition(cache):
    ref = range_end_ns(cache.con, STREAM)
    table = partitions_view.partitions_table(cache.con, STREAM, 60.0).set_index("token")
    plain = cache.con.execute(
        """WITH p AS (SELECT token, state, epoch_ns(start_ts) AS s, epoch_ns(end_ts) AS e
                      FROM partitions WHERE stream = $st),
           m AS (SELECT partition_token AS token, epoch_ns(ts) AS t FROM progress_marks
                 WHERE stream = $st AND ts IS NOT NULL AND partition_token IS NOT NULL
                 UNION ALL SELECT token, s FROM p WHERE s IS NOT NULL
                 UNION ALL SELECT token, coalesce(e, $ref) FROM p
                 WHERE coalesce(e, $ref) IS NOT NULL AND state <> 'pending'),
           g AS (SELECT token, t - lag(t) OVER (PARTITION BY token ORDER BY t) AS gap FROM m)
           SELECT token, max(gap) AS gap FROM g GROUP BY token""",
        {"st": STREAM, "ref": ref}).df().set_index("token")
    assert len(table) == len(plain) > 10
    for token, row in table.iterrows():
        gap = plain.loc[token, "gap"]
        want = 0.0 if pd.isna(gap) else gap / 1e9
        assert math.isclose(row["worst_lag_s"], want, abs_tol=1e-9), token
        if not pd.isna(gap):
            assert row["gap_to_ns"] - row["gap_from_ns"] == gap, token


def test_a_transactions_records_carry_all_their_mods(cache):
    txids = [r[0] for r in cache.con.execute(
        "SELECT server_transaction_id FROM transactions WHERE stream = ? "
        "ORDER BY len(partitions) DESC, records_seen DESC, server_transaction_id LIMIT 8",
        [STREAM]).fetchall()]
    for txid in [*txids, "no such transaction"]:
        got = transaction_records(cache.con, STREAM, txid)
        want = cache.con.execute(
            """SELECT d.record_key, m.mod_index, m.keys, m.new_values
               FROM data_change_records d LEFT JOIN mods m
                 ON m.stream = d.stream AND m.record_key = d.record_key
               WHERE d.stream = ? AND d.server_transaction_id = ?""",
            [STREAM, txid]).df()
        assert len(got) == len(want), txid
        assert int(got["mod_index"].notna().sum()) == int(want["mod_index"].notna().sum())
        assert (sorted(map(str, got["new_values"].dropna()))
                == sorted(map(str, want["new_values"].dropna())))
    assert len(transaction_records(cache.con, STREAM, txids[0])) > 1


def test_the_lag_chart_draws_every_point_and_marks(cache):
    replay = stalls.watermark_replay(cache.con, STREAM, 120)
    low = stalls.low_watermark_over_time(replay)
    lag, total = stalls.lag_over_time(replay, top=12)
    worst = stalls.stalls(cache.con, STREAM, 30.0, replay)
    stall = worst[0] if worst else None
    at = int(low["t_ns"].iloc[len(low) // 2])
    fig = figures.lag_over_time_figure(lag, low, 30.0, total, stall=stall, at_ns=at)
    thin = fig.data[0]
    red = stall["partition"] if stall else None
    others = lag[lag["partition"] != red]
    xs = np.asarray(thin.x, dtype="float64")
    assert int(np.isfinite(xs).sum()) == len(others)
    # a gap after each partition's line: as many NaNs as partitions drawn thin
    assert int(np.isnan(xs).sum()) == others["partition"].nunique()
    first = others[others["partition"] == sorted(others["partition"].unique())[0]]
    assert list(xs[:len(first)]) == list(first.sort_values("t_ns")["t_ns"] / 1e6)
    shapes = fig.layout.shapes
    assert shapes[0].y0 == shapes[0].y1 == 30.0
    assert shapes[-1].x0 == shapes[-1].x1 == at / 1e6
    if stall is not None:
        assert shapes[1].x0 == stall["since_ns"] / 1e6
    assert fig.layout.xaxis.type == "date"
    assert f"of {total})" in thin.name
