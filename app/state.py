"""Shared session state and shareable URLs.

The stream, the range, the selected partition and the opened transaction live in
``st.query_params`` (so a URL can be shared); the stream and range are also widgets' values,
and the selected partition is kept in ``st.session_state`` for the pages a sidebar link opens
without parameters.
``main.py`` calls :func:`load` once per run; pages read :func:`ctx` and call the setters.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from spark_backend.model.timestamps import TimestampError, format_ns, parse_ns

PARAMS = ("stream", "start", "end", "partition", "txn", "step", "at", "stall")
DEFAULT_STALL_S = 60.0
LIVE_STALL_S = 15.0  # the live demo world runs 4x faster than life
MIN_STALL_S, MAX_STALL_S = 1.0, 86_400.0


@dataclass(frozen=True)
class Ctx:
    """What every page needs to query the cache."""

    path: str
    version: int
    stream: str | None
    start_ns: int | None  # the range shown (None: the stream's whole cached range)
    end_ns: int | None
    stall_s: float
    starting: bool = False  # a live stream this session started that is not cached yet


def ctx() -> Ctx:
    return st.session_state["ctx"]


def set_ctx(value: Ctx) -> None:
    st.session_state["ctx"] = value


def param(name: str) -> str | None:
    value = st.query_params.get(name)
    return value if value else None


def set_param(name: str, value: str | None) -> None:
    """Put one value in the URL (None removes it); others stay."""
    if value in (None, ""):
        if name in st.query_params:
            del st.query_params[name]
    elif st.query_params.get(name) != str(value):
        st.query_params[name] = str(value)


def choose_stream(name: str) -> None:
    """Show ``name`` from the next run on (the sidebar's selectbox is already drawn in this
    one, so the choice waits for ``main`` to apply it before drawing it again)."""
    st.session_state["chosen_stream"] = name


def take_chosen_stream() -> str | None:
    return st.session_state.pop("chosen_stream", None)


def selected_partition() -> str | None:
    """The partition the URL names; without one, the one this session last selected on the
    same stream, put back in the URL: the sidebar's page links carry no URL parameters, and
    the partition travels with the user from page to page."""
    stream, token = param("stream"), param("partition")
    if token:
        st.session_state["partition"] = (stream, token)
        return token
    kept = st.session_state.get("partition")
    if kept and kept[0] == stream:
        set_param("partition", kept[1])
        return kept[1]
    return None


def select_partition(token: str | None) -> None:
    """Select ``token`` (None: no partition) in the URL and for the session's next pages."""
    set_param("partition", token)
    st.session_state["partition"] = (param("stream"), token) if token else None


def opened_transaction() -> str | None:
    return param("txn")


def open_transaction(txid: str | None) -> None:
    set_param("txn", txid)


# The times the cache can hold and query: DuckDB's TIMESTAMP_NS (and pandas) count
# nanoseconds in 64 bits, so about 1677-09-21 to 2262-04-11; whole years inside that.
TIME_MIN_NS = parse_ns("1678-01-01T00:00:00Z")
TIME_MAX_NS = parse_ns("2261-12-31T23:59:59.999999999Z")
TIME_DOMAIN = "from 1678-01-01T00:00:00Z to 2261-12-31T23:59:59.999999999Z"


def parse_time(text: str) -> int:
    """RFC 3339 -> ns; TimestampError with one sentence for text that is no timestamp or a time
    outside what the cache can hold."""
    ns = parse_ns(text.strip())
    if not TIME_MIN_NS <= ns <= TIME_MAX_NS:
        raise TimestampError(f"{text.strip()!r} is outside the times the cache can hold; give "
                             f"a time {TIME_DOMAIN}")
    return ns


def parse_range_bound(text: str, label: str) -> int | None:
    """'' -> None, RFC 3339 -> ns; ValueError with one sentence naming the field."""
    if not text or not text.strip():
        return None
    try:
        return parse_time(text)
    except TimestampError as e:
        raise ValueError(f"{label}: {e}.") from e


def range_text(ns: int | None) -> str:
    return "" if ns is None else format_ns(ns)


def stall_threshold(default: float | None = None) -> tuple[float, str | None]:
    """The stall threshold from the URL (``stall``, seconds); an error sentence when bad.
    Without one: the threshold chosen in this session, else ``default`` (else 60 s)."""
    text = param("stall")
    if text is None:
        if default is not None and "stall_s" not in st.session_state:
            return default, None
        return float(st.session_state.get("stall_s", DEFAULT_STALL_S)), None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not MIN_STALL_S <= value <= MAX_STALL_S:  # also NaN
        return DEFAULT_STALL_S, (f"The stall threshold in the URL must be a number of seconds "
                                 f"from {MIN_STALL_S:g} to {MAX_STALL_S:g}; using "
                                 f"{DEFAULT_STALL_S:g}.")
    return value, None


def set_stall_threshold(value: float) -> None:
    st.session_state["stall_s"] = float(value)
    set_param("stall", None if float(value) == DEFAULT_STALL_S else f"{float(value):g}")


def replay_moment() -> tuple[int | None, str | None]:
    """The replay moment from the URL (``at``, RFC 3339); an error sentence when bad."""
    text = param("at")
    if text is None:
        return None, None
    try:
        return parse_time(text), None
    except TimestampError as e:
        return None, f"The replay moment in the URL (at) is not usable: {e}."


def set_replay_moment(ns: int | None) -> None:
    set_param("at", None if ns is None else format_ns(int(ns)))
