"""Values for people: timestamps as datetimes and RFC 3339 text, tokens shortened, values
escaped for Plotly labels. Shared by the dashboard and the HTML report (no UI imports)."""

from __future__ import annotations

import datetime as dt
import html as _html
from typing import Any

import pandas as pd

from ..model.timestamps import format_duration, format_ns


def html(value: Any) -> str:
    """A value for Plotly text and hover labels (``<``, ``>``, ``&``, quotes escaped): Plotly
    renders ``<a href>``, ``<b>``... in them."""
    return _html.escape(str(value), quote=True)


def is_missing(value: Any) -> bool:
    if value is None or isinstance(value, str):
        return value is None
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False

def to_datetime(ns: Any) -> pd.Timestamp | None:
    """Integer nanoseconds -> a UTC pandas Timestamp (None stays None)."""
    if is_missing(ns):
        return None
    return pd.Timestamp(int(ns), unit="ns", tz="UTC")

def ns_column(series: pd.Series) -> pd.Series:
    """A column of ``*_ns`` integers -> UTC datetimes, for axes and tables."""
    # Microseconds: what a browser shows, and plotly warns when it drops nanoseconds.
    return pd.to_datetime(series.astype("Int64"), unit="ns", utc=True).dt.floor("us")

def timestamp(ns: Any) -> str:
    """Full RFC 3339 with the precision the source gave."""
    return "-" if is_missing(ns) else format_ns(int(ns))

def short(token: Any, n: int = 12) -> str:
    if is_missing(token):
        return "(root)"
    text = str(token)
    return text if len(text) <= n + 1 else text[:n] + "…"

def parents_text(parents: Any) -> str:
    if parents is None or isinstance(parents, float | str):
        return "(root)" if not isinstance(parents, str) else short(parents)
    items = [p for p in list(parents) if p is not None]
    return ", ".join(short(p) for p in items) if items else "(root)"


def clock(ns: Any) -> str:
    """09:40:01 (UTC), the form used in sentences."""
    if is_missing(ns):
        return "-"
    seconds = int(ns) // 1_000_000_000
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC).strftime("%H:%M:%S")


def duration(seconds: float) -> str:
    return format_duration(max(0.0, float(seconds)))


def stall_span(stall: dict[str, Any], strong=lambda text: text) -> str:
    """When and how far a stall held the low watermark back, in words (``strong`` marks the
    words "still does" for the page that renders markup)."""
    since = clock(stall["since_ns"])
    if stall["ongoing"]:
        return (f"since {since} UTC and {strong('still does')}: the low watermark is "
                f"{duration(stall['max_lag_s'])} behind.")
    until = clock(stall["until_ns"] if stall["until_ns"] is not None else stall["last_ns"])
    return (f"from {since} to {until} UTC, up to {duration(stall['max_lag_s'])} behind; "
            f"it recovered at {until} UTC.")


def freshness_text(system: Any, fresh: dict[str, Any], esc=str, strong=lambda text: text) -> str:
    """How fresh a stream without heartbeats is, in words (``systems.freshness_summary``);
    never stall words: without heartbeats a quiet table is only quiet. ``esc`` escapes values
    for the page's markup, ``strong`` marks the lead word."""
    name = esc(system or "this system")
    quiet = (f"{name} sends no heartbeats, so a quiet table or key is not a stall: only how late "
             "changes arrive can be told.")
    if not fresh["records"]:
        return f"No data change records cached yet. {quiet}"
    if not fresh["timed"]:
        return (f"{strong('No times:')} the records ({fresh['records']:,}) carry no commit "
                "times (the source sent none), so neither freshness nor order in time can be "
                f"told. {quiet}")
    latest = timestamp(fresh["latest_ns"])
    lead = f"{strong('Freshness:')} the latest change cached is from {latest}"
    if fresh["worst_lag_s"] is None:
        return f"{lead}; the source gives no read times to measure delay. {quiet}"
    return (f"{lead}; the slowest change reached the reader {duration(fresh['worst_lag_s'])} "
            f"after it happened (table {esc(fresh['worst_table'])}, changed "
            f"{timestamp(fresh['worst_ns'])}). {quiet}")
