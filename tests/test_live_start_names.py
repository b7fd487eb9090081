"""A live stream's name is fixed when its start is asked for (``app.live``): the runner that
start makes takes that name; a start that never began frees it."""

from __future__ import annotations

from app import live
from spark_backend.model.timestamps import parse_ns

T = parse_ns("2026-12-03T19:22:59Z")


def test_the_runner_takes_the_name_reserved_at_the_click():
    name = live.reserve_stream_name(T)
    assert name == "LiveDemo_192259"
    assert live.is_reserved(name) and live.is_starting(name, None)
    # a second click while the first start runs names the same stream
    assert live.reserve_stream_name(T + 5 * 10**9) == name
    # the runner is made seconds later: it still gets the name shown since the click
    assert live.new_stream_name(T + 17 * 10**9) == name
    assert not live.is_reserved(name) and not live.is_starting(name, None)
    assert live.new_stream_name(T + 17 * 10**9) == "LiveDemo_192316"


def test_a_start_that_never_began_frees_its_name():
    name = live.reserve_stream_name(T, live.LIVE_EMULATOR_PREFIX)
    assert name == "LiveEmulator_192259"
    assert live.cancel_reservation(name)
    assert not live.is_reserved(name)
    assert not live.cancel_reservation(name)
    assert live.new_stream_name(T + 10**9, live.LIVE_EMULATOR_PREFIX) == "LiveEmulator_192300"
