"""The demo world: determinism, DAG and transaction invariants, record shapes, query semantics."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

from spark_backend.demo.world import (
    DEMO_STREAM,
    QueryError,
    build_world,
    format_ts,
    parse_ts,
)
from tests.support.demo_cache import demo_world

TS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
MIN = 60 * 10**9


@pytest.fixture(scope="module")
def world():
    return demo_world(7)


def test_same_seed_same_world_different_seed_different_world():
    # A fifth of the demo world: the same simulation, a fifth of the fingerprinting.
    world = build_world(7, 0.2)
    assert build_world(7, 0.2).fingerprint() == world.fingerprint()
    assert build_world(8, 0.2).fingerprint() != world.fingerprint()


def test_timestamps_roundtrip():
    ns = parse_ts("2026-01-05T09:00:00.123456Z")
    assert format_ts(ns) == "2026-01-05T09:00:00.123456Z"
    assert parse_ts("2026-01-05T10:00:00.123456789+01:00") == ns + 789
    assert format_ts(parse_ts("2026-01-05T09:00:00Z")) == "2026-01-05T09:00:00.000000Z"


def test_size_and_shape(world):
    assert world.stream == DEMO_STREAM
    assert format_ts(world.start) == "2026-01-05T09:00:00.000000Z"
    assert world.end - world.start == 3600 * 10**9
    assert 15_000 <= world.num_data_change_records <= 60_000
    assert 25 <= len(world.partitions) <= 80
    assert max(p.generation for p in world.partitions) >= 3


def test_partition_dag(world):
    tokens = {p.token for p in world.partitions}
    assert len(tokens) == len(world.partitions)
    children = defaultdict(list)
    for parent, child in world.edges:
        assert child in tokens and (parent is None or parent in tokens)
        children[parent].append(child)
    roots = [p for p in world.partitions if not p.parents]
    assert roots and all(p.start == world.start for p in roots)
    assert sorted(children[None]) == sorted(p.token for p in roots)
    by = {p.token: p for p in world.partitions}
    n_split = n_merge = n_move = 0
    for p in world.partitions:
        for parent in p.parents:
            assert by[parent].end == p.start  # a child starts where its parents end
        if len(p.parents) >= 2:
            n_merge += 1
        kids = children[p.token]
        if p.end is None:
            assert not kids
            continue
        assert kids, "an ended partition has children"
        if len(kids) >= 2:
            n_split += 1
            assert all(by[k].parents == (p.token,) for k in kids)
        elif len(by[kids[0]].parents) == 1:
            n_move += 1
    assert n_split >= 3 and n_merge >= 2
    # the roots tile the key space, and so do the partitions alive at any instant
    for t in (world.start, world.start + 17 * MIN, world.start + 41 * MIN, world.end - 1):
        alive = sorted(world.partitions_alive_at(t), key=lambda p: p.key_range)
        assert alive[0].key_range[0] == 0.0 and alive[-1].key_range[1] == 1.0
        for a, b in zip(alive, alive[1:]):
            assert a.key_range[1] == b.key_range[0]


def test_merge_parents_return_the_same_child_partitions_record(world):
    merges = [p for p in world.partitions if len(p.parents) >= 2]
    assert merges
    for child in merges:
        tails = [[r for r in world.records_for(t) if "child_partitions_record" in r]
                 for t in child.parents]
        assert all(t == tails[0] for t in tails)
        (cpr,) = tails[0]
        (entry,) = cpr["child_partitions_record"]["child_partitions"]
        assert entry == {"token": child.token, "parent_partition_tokens": list(child.parents)}
        assert cpr["child_partitions_record"]["start_timestamp"] == format_ts(child.start)


def test_transactions_are_complete_and_consistent(world):
    seen = defaultdict(list)
    for token, rec in world.all_data_change_records():
        d = rec["data_change_record"]
        seen[d["server_transaction_id"]].append((token, d))
    assert set(seen) == set(world.transactions)
    multi = 0
    for stid, recs in seen.items():
        info = world.transactions[stid]
        parts = {t for t, _ in recs}
        assert len(recs) == info.num_records
        assert len(parts) == len(info.partitions) == len(set(info.partitions))
        assert parts == set(info.partitions)
        for _, d in recs:
            assert d["number_of_records_in_transaction"] == len(recs)
            assert d["number_of_partitions_in_transaction"] == len(parts)
            assert d["commit_timestamp"] == info.commit_timestamp
        seqs = sorted(d["record_sequence"] for _, d in recs)
        assert len(set(seqs)) == len(seqs)
        assert all(re.fullmatch(r"\d{8}", s) for s in seqs)
        for part in parts:
            in_part = sorted((d for t, d in recs if t == part), key=lambda d: d["record_sequence"])
            assert [d["is_last_record_in_transaction_in_partition"] for d in in_part] == \
                [False] * (len(in_part) - 1) + [True]
        multi += len(parts) > 1
    assert multi > len(seen) * 0.25  # multi-partition transactions are common
    assert any(i.is_system_transaction for i in world.transactions.values())


def test_record_shapes_follow_value_capture_types(world):
    seen_types = set()
    for p in world.partitions:
        prev = None
        for rec in world.records_for(p.token):
            if "child_partitions_record" in rec:
                continue
            d = rec["data_change_record"]
            assert TS_RE.match(d["commit_timestamp"])
            ts = parse_ts(d["commit_timestamp"])
            assert p.start <= ts and (p.end is None or ts < p.end)
            assert prev is None or prev <= ts
            prev = ts
            vct = d["value_capture_type"]
            seen_types.add(vct)
            assert [c["ordinal_position"] for c in d["column_types"]] == \
                sorted(c["ordinal_position"] for c in d["column_types"])
            key_cols = {c["name"] for c in d["column_types"] if c["is_primary_key"]}
            nonkey = {c["name"] for c in d["column_types"] if not c["is_primary_key"]}
            assert len(key_cols) == 1
            for m in d["mods"]:
                assert set(m["keys"]) == key_cols
                nv, ov = m["new_values"], m["old_values"]
                assert not (key_cols & set(nv)) and not (key_cols & set(ov))
                mt = d["mod_type"]
                if mt == "INSERT":
                    assert set(nv) == nonkey and ov == {}
                elif mt == "DELETE":
                    assert nv == {}
                    if vct in ("OLD_AND_NEW_VALUES", "NEW_ROW_AND_OLD_VALUES"):
                        assert set(ov) == nonkey
                    else:
                        assert ov == {}
                else:
                    if vct == "OLD_AND_NEW_VALUES":
                        assert set(nv) == set(ov) == nonkey
                    elif vct == "NEW_VALUES":
                        assert set(nv) == nonkey and ov == {}
                    elif vct == "NEW_ROW":
                        assert set(nv) == nonkey and ov == {}
                    else:  # NEW_ROW_AND_OLD_VALUES: full new row, old values of changed cols
                        assert set(nv) == nonkey and ov and set(ov) < nonkey
    assert seen_types == {"OLD_AND_NEW_VALUES", "NEW_ROW", "NEW_VALUES", "NEW_ROW_AND_OLD_VALUES"}


def test_stall_window_is_silent(world):
    token, t0, t1 = world.stall
    assert t1 - t0 >= 5 * MIN
    p = world.partition(token)
    assert p.start <= t0 and (p.end is None or p.end > t1)
    ts = [parse_ts(r["data_change_record"]["commit_timestamp"])
          for r in world.records_for(token) if "data_change_record" in r]
    assert ts and not [t for t in ts if t0 <= t <= t1]
    rows = list(world.query(token, p.start, p.end, 1000))
    hbs = [parse_ts(r["heartbeat_record"]["timestamp"]) for r in rows if "heartbeat_record" in r]
    assert not [h for h in hbs if t0 < h < t1]
    assert t1 in hbs  # recovers with a heartbeat at the end of the stall


def test_query_semantics(world):
    # the initial query returns the first generation, one record each
    rows = list(world.query(None, world.start, None, 10_000))
    roots = [p.token for p in world.roots]
    assert [r["child_partitions_record"]["child_partitions"][0]["token"] for r in rows] == roots
    for i, r in enumerate(rows):
        c = r["child_partitions_record"]
        assert c["start_timestamp"] == format_ts(world.start)
        assert c["record_sequence"] == f"{i:08d}"
        assert c["child_partitions"][0]["parent_partition_tokens"] == []
    # mid-world: the partitions alive then
    mid = world.start + 30 * MIN + 123_000
    rows = list(world.query(None, mid, None, 10_000))
    assert {r["child_partitions_record"]["child_partitions"][0]["token"] for r in rows} == \
        {p.token for p in world.partitions_alive_at(mid)}

    # an ended partition: data in range, heartbeats in gaps, child record last
    ended = next(p for p in world.partitions if p.end is not None and p.parents)
    rows = list(world.query(ended.token, ended.start, None, 1000))
    assert "child_partitions_record" in rows[-1]
    assert rows[-1] == world.records_for(ended.token)[-1]
    data = [r for r in rows if "data_change_record" in r]
    assert data == [r for r in world.records_for(ended.token) if "data_change_record" in r]
    marks = [ended.start]
    for r in rows[:-1]:
        kind, body = next(iter(r.items()))
        marks.append(parse_ts(body["timestamp" if kind == "heartbeat_record"
                                   else "commit_timestamp"]))
        if kind == "heartbeat_record":
            assert marks[-1] - marks[-2] == 10**9  # exactly one interval after the last mark
    assert all(b - a <= 10**9 for a, b in zip(marks, marks[1:]))

    # a window that ends before the partition does: no child record, heartbeat up to the end
    end = ended.start + (ended.end - ended.start) // 2
    rows = list(world.query(ended.token, ended.start, end, 5000))
    assert not [r for r in rows if "child_partitions_record" in r]
    assert all(parse_ts(next(iter(r.values())).get("commit_timestamp")
                        or next(iter(r.values()))["timestamp"]) <= end for r in rows)


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (("tok", 0, None, 500), "OUT_OF_RANGE", "heartbeat_milliseconds must be within"),
        (("tok", 0, None, 300_001), "OUT_OF_RANGE", "heartbeat_milliseconds must be within"),
        (("tok", 10 * MIN, 5 * MIN, 1000), "INVALID_ARGUMENT", "start_timestamp must be <="),
        (("nope", 0, None, 1000), "INVALID_ARGUMENT", "partition_token is invalid"),
        ((None, -1, None, 1000), "OUT_OF_RANGE", "too far in the past"),
        ((None, 61 * MIN, None, 1000), "OUT_OF_RANGE", "too far in the future"),
    ],
)
def test_query_errors(world, args, code, text):
    token, start, end, hb = args
    if token == "tok":
        token = world.roots[0].token
    with pytest.raises(QueryError) as e:
        world.query(token, world.start + start, None if end is None else world.start + end, hb)
    assert e.value.code == code and text in e.value.message


def test_partition_token_outside_its_lifetime(world):
    child = next(p for p in world.partitions if p.parents and p.end is not None)
    with pytest.raises(QueryError, match="before the start of the partition"):
        world.query(child.token, child.start - 10**9, None, 1000)
    with pytest.raises(QueryError, match="after the end of the partition"):
        world.query(child.token, child.end + 10**9, None, 1000)
    # starting exactly at the end returns the child partitions record at once
    rows = list(world.query(child.token, child.end, None, 1000))
    assert rows and all("child_partitions_record" in r for r in rows)
