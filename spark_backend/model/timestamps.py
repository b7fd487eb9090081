"""RFC 3339 timestamps with full (nanosecond) precision, as integer nanoseconds since the epoch."""

from __future__ import annotations

import datetime as dt
import re

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r"(Z|z|[+-]\d{2}:?\d{2})?$"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
NS_PER_S = 1_000_000_000
# The seconds of the first and the last UTC second a timestamp may name (what format_ns writes).
_FIRST_S = (dt.datetime(1, 1, 1, tzinfo=dt.UTC) - _EPOCH) // dt.timedelta(seconds=1)
_LAST_S = (dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.UTC) - _EPOCH) // dt.timedelta(seconds=1)


class TimestampError(ValueError):
    """A timestamp that is not RFC 3339."""


def parse_ns(text: str) -> int:
    """'2022-09-27T12:30:00.123456789Z' -> nanoseconds since the epoch (UTC if no offset)."""
    # Spanner's own form, 'YYYY-MM-DDTHH:MM:SS.fffffffffZ': the records of a stream share
    # their seconds, so the seconds of a date and time already read are looked up.
    spanner_form = len(text) > 21 and text[-1] == "Z" and text[19] == "."
    if spanner_form:
        seconds = _SECONDS.get(text[:19])
        frac = text[20:-1]
        if seconds is not None and len(frac) <= 9 and frac.isdecimal():
            return seconds + int(frac.ljust(9, "0"))
    ns = _parse_ns(text)
    if spanner_form and text[0].isdecimal():
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        _SECONDS[text[:19]] = ns - ns % NS_PER_S
    return ns


# 'YYYY-MM-DDTHH:MM:SS' of a valid timestamp read before -> its seconds, in nanoseconds
_SECONDS: dict[str, int] = {}


def _parse_ns(text: str) -> int:
    m = _RFC3339.match(text.strip())
    if not m:
        raise TimestampError(
            f"{text!r} is not a timestamp; use RFC 3339, e.g. 2022-09-27T12:30:00.123456Z"
        )
    year, month, day, hour, minute, second, frac, zone = m.groups()
    try:
        base = dt.datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second),
            tzinfo=dt.UTC,
        )
    except ValueError as e:
        raise TimestampError(f"{text!r} is not a valid date/time: {e}") from e
    offset_s = 0
    if zone and zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        if int(digits[:2]) > 23 or int(digits[2:]) > 59:
            raise TimestampError(f"{text!r} has the offset {zone}; an offset is -23:59 to "
                                 "+23:59")
        offset_s = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    seconds = (base - _EPOCH) // dt.timedelta(seconds=1) - offset_s
    nanos = int((frac or "").ljust(9, "0")) if frac else 0
    if not _FIRST_S <= seconds <= _LAST_S:  # its offset took it out of the years 1-9999
        raise TimestampError(f"{text!r} is outside 0001-01-01T00:00:00Z to "
                             "9999-12-31T23:59:59.999999999Z in UTC")
    return seconds * NS_PER_S + nanos


def format_ns(ns: int) -> str:
    """Nanoseconds -> RFC 3339 UTC; 6 fraction digits unless nanoseconds are needed."""
    seconds, nanos = divmod(int(ns), NS_PER_S)
    t = _EPOCH + dt.timedelta(seconds=seconds)
    # not strftime: its %Y does not pad the years before 1000 to four digits (glibc)
    base = f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
    if nanos % 1000:
        return f"{base}.{nanos:09d}Z"
    return f"{base}.{nanos // 1000:06d}Z"


def from_datetime(value: dt.datetime) -> int:
    """A datetime (naive = UTC; DatetimeWithNanoseconds keeps its nanoseconds) -> nanoseconds."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - _EPOCH
    ns = (delta.days * 86_400 + delta.seconds) * NS_PER_S
    nanosecond = getattr(value, "nanosecond", None)
    return ns + (nanosecond if nanosecond is not None else delta.microseconds * 1000)


def to_datetime(ns: int):
    """Nanoseconds -> google.api_core DatetimeWithNanoseconds (keeps full precision)."""
    from google.api_core.datetime_helpers import DatetimeWithNanoseconds

    seconds, nanos = divmod(int(ns), NS_PER_S)
    base = _EPOCH + dt.timedelta(seconds=seconds)
    return DatetimeWithNanoseconds(
        base.year, base.month, base.day, base.hour, base.minute, base.second,
        nanosecond=nanos, tzinfo=dt.UTC,
    )


def now_ns() -> int:
    return from_datetime(dt.datetime.now(dt.UTC))


def coerce_ns(value) -> int:
    """Accept RFC 3339 text, a datetime or integer nanoseconds."""
    if isinstance(value, bool):
        raise TimestampError(f"{value!r} is not a timestamp")
    if isinstance(value, int):
        return value
    if isinstance(value, dt.datetime):
        return from_datetime(value)
    if isinstance(value, str):
        return parse_ns(value)
    raise TimestampError(f"{value!r} is not a timestamp; use RFC 3339 text")


def format_duration(seconds: float) -> str:
    """4m12s style."""
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"
