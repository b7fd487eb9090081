"""The live demo world: the recorded world on the wall clock, only what has happened by now,
readable in pieces without losing or repeating a record, served by the real demo server."""

from __future__ import annotations

import pytest

from spark_backend.demo.live import LiveWorld
from spark_backend.demo.world import QueryError, parse_ts
from tests.support.demo_cache import demo_world

NS = 1_000_000_000


class Clock:
    def __init__(self, now: int):
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture(scope="module")
def world():
    return demo_world(7, 1.0)


def live(world, speed: int = 4, stall_in_s: float = 30.0) -> tuple[LiveWorld, Clock]:
    clock = Clock(1_800_000_000 * NS)
    return LiveWorld(world, speed=speed, stall_in_s=stall_in_s, clock=clock), clock


def stamps(rows: list[dict]) -> list[int]:
    out = []
    for row in rows:
        (kind, rec), = row.items()
        out.append(parse_ts(rec.get("commit_timestamp") or rec.get("timestamp")
                            or rec.get("start_timestamp")))
    return out


def test_the_stall_starts_soon_and_lasts_six_minutes_over_speed(world):
    lw, clock = live(world)
    token, silent_from, silent_to = lw.stall
    assert token == world.stall[0]
    assert abs(silent_from - (clock.now + 30 * NS)) < NS
    assert silent_to - silent_from == pytest.approx((world.stall[2] - world.stall[1]) / 4, abs=NS)
    assert lw.start < clock.now < lw.ends_at


def test_only_what_has_happened_exists(world):
    lw, clock = live(world)
    roots = list(lw.query(None, lw.start, None, 10_000))
    token = roots[0]["child_partitions_record"]["child_partitions"][0]["token"]
    rows = list(lw.query(token, lw.start, None, 10_000))
    assert rows and max(stamps(rows)) <= clock.now
    later = clock.now + 120 * NS
    with pytest.raises(QueryError, match="too far in the future"):
        lw.check_query(token, later, None, 10_000)
    clock.now = later  # two minutes on: more has happened
    more = list(lw.query(token, lw.start, None, 10_000))
    assert len(more) >= len(rows) and max(stamps(more)) <= clock.now


def test_read_in_pieces_equals_read_at_once(world):
    lw, clock = live(world)
    clock.now = lw.ends_at  # the whole hour has played
    part = next(p for p in world.partitions if p.end is not None and not p.parents)
    token = part.token
    whole = [r for r in lw.query(token, lw.start, None, 10_000) if "heartbeat_record" not in r]
    cut = (lw.start + lw.wall(part.end)) // 2 // 1000 * 1000
    first = [r for r in lw.query(token, lw.start, cut, 10_000) if "heartbeat_record" not in r]
    rest = [r for r in lw.query(token, cut + 1000, None, 10_000)
            if "heartbeat_record" not in r]
    assert first + rest == whole
    assert stamps(whole) == sorted(stamps(whole))


def test_children_start_where_their_parents_said(world):
    lw, clock = live(world)
    clock.now = lw.ends_at
    parent = next(p for p in world.partitions if p.end is not None)
    rows = list(lw.query(parent.token, lw.start if not parent.parents else
                         lw.wall(parent.start), None, 10_000))
    record = rows[-1]["child_partitions_record"]
    start = parse_ts(record["start_timestamp"])
    child = record["child_partitions"][0]["token"]
    lw.check_query(child, start, None, 10_000)  # a child is readable from its start
    assert list(lw.query(child, start, None, 10_000))


def test_served_by_the_demo_server(world):
    from google.cloud import spanner  # noqa: F401  (the client the pull uses)

    from spark_backend.demo.server import DemoServer

    lw, _ = live(world)
    server = DemoServer(lw, "googlesql")
    try:
        assert server.start()
    finally:
        server.stop()


def test_times_in_mod_values_are_live_times_too(world):
    lw, clock = live(world)
    clock.now = lw.ends_at
    recorded_start, recorded_end = world.start, world.end
    seen = 0
    for part in world.partitions[:40]:
        start = lw.start if not part.parents else lw.wall(part.start)
        for row in lw.query(part.token, start, None, 10_000):
            rec = row.get("data_change_record")
            if rec is None:
                continue
            commit = parse_ts(rec["commit_timestamp"])
            for mod in rec["mods"]:
                for values in (mod["new_values"], mod["old_values"]):
                    for name, value in values.items():
                        if name not in ("LastUpdate", "UpdatedAt", "CreatedAt", "At"):
                            continue
                        ts = parse_ts(value)
                        seen += 1
                        # No recorded time is left: every time is on the live clock, none
                        # after the commit that wrote it.
                        assert not recorded_start <= ts <= recorded_end, (name, value)
                        assert ts <= commit
                        if mod is rec["mods"][0] and values is mod["new_values"] \
                                and rec["mod_type"] == "INSERT" and name in ("CreatedAt", "At"):
                            assert ts == commit
    assert seen > 100
