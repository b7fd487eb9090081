"""A sample Beam/Dataflow partition metadata table on the emulator, for tests."""

from __future__ import annotations

import contextlib
from typing import Any

from spark_backend.jobs.beam_metadata import COLUMNS, validate_table_name
from spark_backend.spanner import connect


def metadata_table_ddl(table: str) -> str:
    validate_table_name(table)
    return (
        f"CREATE TABLE {table} (PartitionToken STRING(MAX) NOT NULL, "
        "ParentTokens ARRAY<STRING(MAX)> NOT NULL, StartTimestamp TIMESTAMP NOT NULL, "
        "EndTimestamp TIMESTAMP NOT NULL, HeartbeatMillis INT64 NOT NULL, "
        "State STRING(MAX) NOT NULL, Watermark TIMESTAMP NOT NULL, "
        "CreatedAt TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true), "
        "ScheduledAt TIMESTAMP OPTIONS (allow_commit_timestamp = true), "
        "RunningAt TIMESTAMP OPTIONS (allow_commit_timestamp = true), "
        "FinishedAt TIMESTAMP OPTIONS (allow_commit_timestamp = true)) "
        "PRIMARY KEY (PartitionToken)"
    )


END_OF_TIME = "9999-12-31T23:59:59.999999999Z"


def sample_rows(base_ns: int) -> list[dict[str, Any]]:
    """A pipeline's bookkeeping, times relative to ``base_ns`` (seconds offsets):

    Parent0 (initial) -> tokA, tokB (split at +10s); tokA -> tokA1, tokA2 (split at +30s);
    tokA2 + tokB -> tokC (merge at +50s). tokA1 RUNNING far behind (holds the pipeline back),
    tokC RUNNING, tokD CREATED long ago (stuck), tokE SCHEDULED long ago (stuck).
    """
    s = 1_000_000_000

    def t(sec: float | None) -> int | None:
        return None if sec is None else base_ns + int(sec * s)

    def row(token, parents, start, state, wm, created, scheduled=None, running=None,
            finished=None):
        return {"PartitionToken": token, "ParentTokens": parents, "StartTimestamp": t(start),
                "EndTimestamp": END_OF_TIME, "HeartbeatMillis": 2000, "State": state,
                "Watermark": t(wm), "CreatedAt": t(created), "ScheduledAt": t(scheduled),
                "RunningAt": t(running), "FinishedAt": t(finished)}

    return [
        row("Parent0", [], 0, "FINISHED", 10, -600, -599, -598, -590),
        row("tokA", ["Parent0"], 10, "FINISHED", 30, -590, -589, -588, -570),
        row("tokB", ["Parent0"], 10, "FINISHED", 50, -590, -585, -580, -550),
        row("tokA1", ["tokA"], 30, "RUNNING", 35, -570, -569, -568),
        row("tokA2", ["tokA"], 30, "FINISHED", 50, -570, -569, -568, -550),
        row("tokC", ["tokA2", "tokB"], 50, "RUNNING", 290, -550, -549, -548),
        row("tokD", ["tokC"], 300, "CREATED", 300, -500),
        row("tokE", ["tokC"], 300, "SCHEDULED", 300, -500, -400),
    ]


def create_sample_metadata_table(
    *, emulator_host: str, project: str, instance: str, database: str, table: str,
    base_ns: int | None = None,
) -> list[dict[str, Any]]:
    """Create instance/database (if missing) and a metadata table filled with ``sample_rows``.

    Times are written explicitly (commit-timestamp columns accept past values). ``base_ns``
    defaults to 15 minutes ago, so the sample's CreatedAt times lie in the past. Returns the rows
    written (timestamps as ns; ``EndTimestamp`` as its RFC 3339 text).
    """
    from google.api_core.exceptions import AlreadyExists

    from spark_backend.demo.emulator import EMULATOR_INSTANCE_CONFIG
    from spark_backend.model.timestamps import now_ns, parse_ns, to_datetime

    validate_table_name(table)
    if base_ns is None:
        base_ns = now_ns() - 900 * 1_000_000_000
    client = connect.make_client(project, emulator_host)
    inst = client.instance(
        instance, configuration_name=f"projects/{project}/instanceConfigs/"
                                     f"{EMULATOR_INSTANCE_CONFIG}",
        display_name=instance, node_count=1,
    )
    with contextlib.suppress(AlreadyExists):
        inst.create().result(timeout=60)
    db = inst.database(database)
    with contextlib.suppress(AlreadyExists):
        db.create().result(timeout=60)
    db.update_ddl([metadata_table_ddl(table)]).result(timeout=60)
    rows = sample_rows(base_ns)
    values = []
    for r in rows:
        values.append([
            r["PartitionToken"], r["ParentTokens"], to_datetime(r["StartTimestamp"]),
            to_datetime(parse_ns(r["EndTimestamp"])), r["HeartbeatMillis"], r["State"],
            to_datetime(r["Watermark"]),
            *[None if r[c] is None else to_datetime(r[c])
              for c in ("CreatedAt", "ScheduledAt", "RunningAt", "FinishedAt")],
        ])
    with db.batch() as batch:
        batch.insert(table=table, columns=COLUMNS, values=values)
    return rows
