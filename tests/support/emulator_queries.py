"""Raw change stream queries against the emulator, for tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from spark_backend.demo.emulator import DEFAULT_STREAM, Dialect


def change_stream_sql(dialect: Dialect, stream: str = DEFAULT_STREAM) -> str:
    if dialect == "googlesql":
        return (
            f"SELECT ChangeRecord FROM READ_{stream}(start_timestamp => @s, end_timestamp => @e, "
            "partition_token => @t, heartbeat_milliseconds => @h)"
        )
    return f'SELECT * FROM "spanner"."read_json_{stream}"($1, $2, $3, $4, null)'


def query_change_stream(
    database: Any,
    dialect: Dialect,
    stream: str,
    start: dt.datetime,
    end: dt.datetime | None,
    token: str | None,
    heartbeat_ms: int = 1000,
) -> Iterator[Any]:
    """Rows of one change stream query in a single-use strong read-only transaction."""
    from google.cloud.spanner_v1 import param_types

    if dialect == "googlesql":
        names = ("s", "e", "t", "h")
    else:
        names = ("p1", "p2", "p3", "p4")
    types = (param_types.TIMESTAMP, param_types.TIMESTAMP, param_types.STRING, param_types.INT64)
    params = dict(zip(names, (start, end, token, heartbeat_ms), strict=True))
    with database.snapshot() as snap:
        yield from snap.execute_sql(
            change_stream_sql(dialect, stream),
            params=params,
            param_types=dict(zip(names, types, strict=True)),
        )
