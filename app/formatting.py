"""Formatting for the pages: timestamps as datetimes and clock times, tokens, sentences."""

from __future__ import annotations

from typing import Any

from spark_backend.analysis.display import (  # noqa: F401  (the pages' names)
    clock,
    duration,
    freshness_text,
    is_missing,
    ns_column,
    parents_text,
    short,
    stall_span,
    timestamp,
    to_datetime,
)

from .safe import md


def count(n: Any) -> str:
    return "-" if is_missing(n) else f"{int(n):,}"


def held_back_sentence(holder: dict[str, Any] | None) -> str:
    """Markdown: 'partition X has held the stream back for 4m12s since 09:40:01'."""
    if not holder:
        return "No partition is holding the stream back: every partition has finished."
    return (
        f"partition {md(holder['partition'])} has held the stream back for "
        f"{duration(holder['held_s'])} since {clock(holder['since_ns'])} UTC"
    )


def held_back_at_sentence(at_ns: int, holder: str | None, since_ns: Any) -> str:
    """Markdown, the replay's sentence: who held the low watermark at a given moment."""
    if holder is None or is_missing(since_ns):
        return f"At {clock(at_ns)} UTC no open partition held the stream back."
    held = (int(at_ns) - int(since_ns)) / 1e9
    return (
        f"At {clock(at_ns)} UTC, partition {md(holder)} held the low watermark: its watermark "
        f"had stayed at {clock(since_ns)} for {duration(held)}."
    )


def stall_sentence(stall: dict[str, Any] | None, threshold_s: float) -> str:
    """Markdown: the worst stall of the range in words (who, from when to when, how much,
    whether it still holds the stream back)."""
    if stall is None:
        return (f"No stall: no partition held the low watermark more than {threshold_s:g}s "
                "behind in this range.")
    tail = stall_span(stall, strong=lambda text: f"**{text}**")
    return (f"**Worst stall:** partition {md(short(stall['partition'], 20))} went silent and "
            f"held the low watermark back {tail} It held it more than {threshold_s:g}s behind "
            f"for {duration(stall['cost_s'])}.")


def current_sentence(now: dict[str, Any] | None, threshold_s: float) -> str:
    """Markdown: the low watermark at the end of the range, and whether that is a stall."""
    if now is None:
        return "No progress marks in this range yet."
    verdict = ("a stall" if now["lag_s"] > threshold_s
               else f"normal (under the {threshold_s:g}s threshold)")
    return (f"**Now** ({clock(now['t_ns'])} UTC): the low watermark is "
            f"{clock(now['low_ns'])} UTC, {duration(now['lag_s'])} behind, held by partition "
            f"{md(short(now['holder'], 20))}: {verdict}.")


def freshness_sentence(system: Any, fresh: dict[str, Any]) -> str:
    """Markdown, for a system without heartbeats (``systems.freshness_summary``): how fresh the
    changes are; never stall words (a quiet table there is only quiet)."""
    return freshness_text(system, fresh, esc=md, strong=lambda text: f"**{text}**")


def range_clip_note(start_ns: Any, end_ns: Any) -> str:
    if is_missing(start_ns) and is_missing(end_ns):
        return ""
    return f" Showing {timestamp(start_ns)} → {timestamp(end_ns)} (the sidebar's range)."


def span_text(start_ns: Any, end_ns: Any) -> str:
    """'2026-01-05 09:00:00 → 10:00:00 UTC' (the date once when both are on one day); times
    the data does not carry are said so."""
    if is_missing(start_ns) and is_missing(end_ns):
        return "no times (the source sent none)"
    a, b = timestamp(start_ns), timestamp(end_ns)
    if a[:10] == b[:10] and not is_missing(start_ns) and not is_missing(end_ns):
        return f"{a[:10]} {_time_of_day(a)} → {_time_of_day(b)} UTC"
    return f"{a} → {b}"


def _time_of_day(rfc3339: str) -> str:
    """'2026-01-05T09:00:00.000000Z' -> '09:00:00'; a fraction the source gave is kept."""
    text = rfc3339[11:].rstrip("Z")
    return text.rstrip("0").rstrip(".") if "." in text else text
