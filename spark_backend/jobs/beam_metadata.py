"""The ``beam-metadata`` source: a Dataflow/Beam SpannerIO change stream pipeline's partition
metadata table, read from Spanner and shown as the same DAG.

The connector's table (GoogleSQL; PostgreSQL databases use the same quoted column names)::

    PartitionToken STRING(MAX) NOT NULL, ParentTokens ARRAY<STRING(MAX)> NOT NULL,
    StartTimestamp TIMESTAMP NOT NULL, EndTimestamp TIMESTAMP NOT NULL,
    HeartbeatMillis INT64 NOT NULL, State STRING(MAX) NOT NULL, Watermark TIMESTAMP NOT NULL,
    CreatedAt TIMESTAMP NOT NULL, ScheduledAt TIMESTAMP, RunningAt TIMESTAMP,
    FinishedAt TIMESTAMP   -- PRIMARY KEY (PartitionToken)

States: CREATED -> SCHEDULED -> RUNNING -> FINISHED. The connector's first row is its initial
partition (``Parent0``, no parents); the change stream's partitions name their parents.

How it lands in the cache (one pull, one transaction):

- every partition with parents -> ``child_partitions`` rows (one per parent and start time,
  listing its children with all their parents): the ``edges`` and ``partitions`` tables; a
  partition without parents is a child of the virtual root;
- its watermark -> a ``heartbeat`` row (``extra.source = 'beam-watermark'``), so the generic
  per-partition watermark and low watermark are the pipeline's own (min over unfinished);
- its state -> a ``partition_end`` row: FINISHED -> finished (end = its children's start, else
  its watermark), RUNNING -> open, CREATED/SCHEDULED -> pending;
- the table's rows as read -> ``beam_partitions`` (this module's table, one row per partition,
  replaced on every pull) with state, parents, the CreatedAt/ScheduledAt/RunningAt/FinishedAt
  times and ``read_at`` (the database's time of the read, used as "now" by the analysis).
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

from spark_backend.model import config
from spark_backend.model.errors import BadInput, SourceError
from spark_backend.model.records import canonical_json, partition_end
from spark_backend.model.timestamps import format_ns, from_datetime
from spark_backend.spanner import connect

SYSTEM = "beam"
SOURCE = "beam-metadata"
COLUMNS = [
    "PartitionToken", "ParentTokens", "StartTimestamp", "EndTimestamp", "HeartbeatMillis",
    "State", "Watermark", "CreatedAt", "ScheduledAt", "RunningAt", "FinishedAt",
]
STATES = ("CREATED", "SCHEDULED", "RUNNING", "FINISHED")
_STATE_MAP = {"CREATED": "pending", "SCHEDULED": "pending", "RUNNING": "open",
              "FINISHED": "finished"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

BEAM_DDL = [
    """CREATE TABLE IF NOT EXISTS beam_partitions (
        stream TEXT NOT NULL,
        partition_token TEXT NOT NULL,
        parent_tokens JSON,
        start_timestamp TIMESTAMP_NS,
        end_timestamp TIMESTAMP_NS,
        heartbeat_millis BIGINT,
        state TEXT,                      -- CREATED | SCHEDULED | RUNNING | FINISHED
        watermark TIMESTAMP_NS,
        created_at TIMESTAMP_NS,
        scheduled_at TIMESTAMP_NS,
        running_at TIMESTAMP_NS,
        finished_at TIMESTAMP_NS,
        read_at TIMESTAMP_NS,            -- the database's time when the table was read
        pull_id BIGINT,
        PRIMARY KEY (stream, partition_token)
    )""",
]


def validate_table_name(name: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise BadInput(
            f"{name!r} is not a valid metadata table name; use letters, digits and '_' "
            "(starting with a letter or '_')"
        )
    return name


def ensure_tables(con: Any) -> None:
    for stmt in BEAM_DDL:
        con.execute(stmt)


# --- connecting ------------------------------------------------------------------------------


def _database(project: str, instance: str, database: str, emulator_host: str | None) -> Any:
    client = connect.make_client(project, emulator_host)
    return client.instance(instance).database(database)


def _is_postgresql(db: Any) -> bool:
    from google.cloud.spanner_admin_database_v1.types import DatabaseDialect

    with contextlib.suppress(Exception):
        db.reload()
    return db.database_dialect == DatabaseDialect.POSTGRESQL


_INT64_MAX = 2**63 - 1


def _ns(value: Any) -> int | None:
    """A timestamp -> ns; None for NULL and for times past 2262 (e.g. the connector's
    end-of-time EndTimestamp 9999-12-31, which does not fit in nanoseconds)."""
    if value is None:
        return None
    ns = from_datetime(value)
    return ns if -_INT64_MAX <= ns <= _INT64_MAX else None


def read_metadata_table(
    *, project: str, instance: str, database: str, table: str,
    emulator_host: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The metadata table's rows (timestamps as ns) and the database's read time (ns)."""
    validate_table_name(table)
    from google.api_core import exceptions as gexc

    db = _database(project, instance, database, emulator_host)
    pg = _is_postgresql(db)
    q = '"' if pg else "`"
    cols = ", ".join(f"{q}{c}{q}" for c in COLUMNS)
    now = "CURRENT_TIMESTAMP" if pg else "CURRENT_TIMESTAMP()"
    sql = f"SELECT {cols}, {now} AS ReadAt FROM {q}{table}{q} ORDER BY {q}StartTimestamp{q}, " \
          f"{q}PartitionToken{q}"
    try:
        with db.snapshot() as snap:
            result = list(snap.execute_sql(sql))
    except gexc.NotFound as e:
        raise SourceError(
            f"No metadata table {table!r} in projects/{project}/instances/{instance}/databases/"
            f"{database} ({e.message})."
        ) from e
    except gexc.InvalidArgument as e:
        raise SourceError(
            f"Table {table!r} does not have the Beam connector's metadata columns ({e.message})."
        ) from e
    rows = []
    read_at = None
    for r in result:
        values = dict(zip([*COLUMNS, "ReadAt"], r, strict=True))
        read_at = _ns(values.pop("ReadAt"))
        row = {
            "PartitionToken": values["PartitionToken"],
            "ParentTokens": list(values["ParentTokens"] or []),
            "HeartbeatMillis": None if values["HeartbeatMillis"] is None
            else int(values["HeartbeatMillis"]),
            "State": values["State"],
        }
        for c in ("StartTimestamp", "EndTimestamp", "Watermark", "CreatedAt", "ScheduledAt",
                  "RunningAt", "FinishedAt"):
            row[c] = _ns(values[c])
        rows.append(row)
    if read_at is None:
        from spark_backend.model.timestamps import now_ns

        read_at = now_ns()
    return rows, read_at


# --- into record rows ---------------------------------------------------------------------------


def metadata_rows(rows: list[dict[str, Any]], origin: str) -> list[dict[str, Any]]:
    """Metadata table rows -> record rows (child_partitions, heartbeat, partition_end)."""
    out: list[dict[str, Any]] = []
    children_of: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        for parent in r["ParentTokens"]:
            children_of.setdefault(parent, []).append(r)
    # child_partitions: roots under the virtual root; others grouped by (parent, start)
    roots = [r for r in rows if not r["ParentTokens"]]
    by_start: dict[int, list[dict[str, Any]]] = {}
    for r in roots:
        by_start.setdefault(r["StartTimestamp"], []).append(r)
    for start, group in sorted(by_start.items()):
        out.append({
            "partition_token": None, "kind": "child_partitions", "ts_ns": start,
            "child_partitions": canonical_json(
                [{"token": g["PartitionToken"], "parent_partition_tokens": []} for g in group]
            ),
            "origin": origin,
        })
    for parent, kids in sorted(children_of.items()):
        groups: dict[int, list[dict[str, Any]]] = {}
        for k in kids:
            groups.setdefault(k["StartTimestamp"], []).append(k)
        for start, group in sorted(groups.items()):
            out.append({
                "partition_token": parent, "kind": "child_partitions", "ts_ns": start,
                "child_partitions": canonical_json([
                    {"token": g["PartitionToken"],
                     "parent_partition_tokens": sorted(g["ParentTokens"])}
                    for g in sorted(group, key=lambda g: g["PartitionToken"])
                ]),
                "origin": origin,
            })
    for r in rows:
        token = r["PartitionToken"]
        if r["Watermark"] is not None:
            out.append({
                "partition_token": token, "kind": "heartbeat", "ts_ns": r["Watermark"],
                "extra": canonical_json({"system": "beam", "source": "beam-watermark",
                                         "state": r["State"]}),
                "origin": origin,
            })
        state = _STATE_MAP.get(r["State"], "open")
        detail: dict[str, Any] = {"read_from": r["StartTimestamp"], "beam_state": r["State"]}
        if state == "finished":
            kid_starts = [k["StartTimestamp"] for k in children_of.get(token, [])]
            end = min(kid_starts) if kid_starts else r["Watermark"]
            detail["end"] = end
        out.append({**partition_end(token, state, r["Watermark"], **detail), "origin": origin})
    return out


def _beam_table_rows(stream: str, rows: list[dict[str, Any]], read_at: int, pull_id: int):
    import pyarrow as pa

    def col(name):
        return [r[name] for r in rows]

    ts = pa.timestamp("ns")
    return pa.table({
        "stream": pa.array([stream] * len(rows), pa.string()),
        "partition_token": pa.array(col("PartitionToken"), pa.string()),
        "parent_tokens": pa.array([canonical_json(r["ParentTokens"]) for r in rows], pa.string()),
        "start_timestamp": pa.array(col("StartTimestamp"), pa.int64()).cast(ts),
        "end_timestamp": pa.array(col("EndTimestamp"), pa.int64()).cast(ts),
        "heartbeat_millis": pa.array(col("HeartbeatMillis"), pa.int64()),
        "state": pa.array(col("State"), pa.string()),
        "watermark": pa.array(col("Watermark"), pa.int64()).cast(ts),
        "created_at": pa.array(col("CreatedAt"), pa.int64()).cast(ts),
        "scheduled_at": pa.array(col("ScheduledAt"), pa.int64()).cast(ts),
        "running_at": pa.array(col("RunningAt"), pa.int64()).cast(ts),
        "finished_at": pa.array(col("FinishedAt"), pa.int64()).cast(ts),
        "read_at": pa.array([read_at] * len(rows), pa.int64()).cast(ts),
        "pull_id": pa.array([pull_id] * len(rows), pa.int64()),
    })


def land_metadata(
    cache: Any, stream: str, rows: list[dict[str, Any]], read_at: int, *, location: str,
) -> dict[str, Any]:
    """Put metadata table rows into the cache as one pull (idempotent on re-reads)."""
    import pyarrow as pa

    from spark_backend.model.records import to_arrow_batch

    cache.ensure_stream(stream, system=SYSTEM, source=SOURCE, location=location)
    ensure_tables(cache.con)
    starts = [r["StartTimestamp"] for r in rows if r["StartTimestamp"] is not None]
    pull_id = cache.begin_pull(stream, SOURCE, min(starts) if starts else None, read_at, None)
    try:
        records = metadata_rows(rows, location)
        stats = cache.ingest(stream, pull_id, pa.Table.from_batches([to_arrow_batch(records)]))
        table = _beam_table_rows(stream, rows, read_at, pull_id)
        with cache.transaction():
            cache.con.register("_beam_rows", table)
            try:
                cache.con.execute(
                    "DELETE FROM beam_partitions WHERE stream = ? AND partition_token IN "
                    "(SELECT partition_token FROM _beam_rows)", [stream],
                )
                cache.con.execute("INSERT INTO beam_partitions SELECT * FROM _beam_rows")
            finally:
                cache.con.unregister("_beam_rows")
            cache.con.execute(
                "UPDATE pulls SET records = ? WHERE pull_id = ?", [len(rows), pull_id]
            )
    except Exception as e:
        cache.finish_pull(pull_id, "failed", error=str(e))
        raise
    cache.finish_pull(pull_id, "complete", waves=1)
    states: dict[str, int] = {}
    for r in rows:
        states[r["State"]] = states.get(r["State"], 0) + 1
    unfinished = [r for r in rows if r["State"] != "FINISHED" and r["Watermark"] is not None]
    holder = min(unfinished, key=lambda r: (r["Watermark"], r["PartitionToken"])) \
        if unfinished else None
    return {
        "stream": stream,
        "pull_id": pull_id,
        "partitions": len(rows),
        "states": states,
        "child_partitions": stats.child_partitions,
        "read_at": format_ns(read_at),
        "pipeline_watermark": format_ns(holder["Watermark"]) if holder else None,
        "holding_back": holder["PartitionToken"] if holder else None,
    }


def pull_beam_metadata(
    cache: Any, stream: str, *, project: str, instance: str, database: str, table: str,
    emulator_host: str | None = None,
) -> dict[str, Any]:
    """Read the pipeline's metadata table and land it in ``cache`` under ``stream``.

    ``emulator_host`` (``host:port``) talks plain text to an emulator; without it the client
    uses Application Default Credentials, or ``SPANNER_EMULATOR_HOST`` when that is set.
    """
    validate_table_name(table)
    if emulator_host is None:
        import os

        emulator_host = os.environ.get(config.EMULATOR_HOST_ENVVAR) or None
    rows, read_at = read_metadata_table(
        project=project, instance=instance, database=database, table=table,
        emulator_host=emulator_host,
    )
    location = f"projects/{project}/instances/{instance}/databases/{database}"
    summary = land_metadata(cache, stream, rows, read_at, location=f"{location}#{table}")
    summary["table"] = table
    return summary
