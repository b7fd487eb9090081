"""Set-based SQL that lands a batch of record rows (``records.RECORD_FIELDS``) in the cache.

Runs inside the caller's transaction. A batch (Arrow in memory, read where it is; Parquet, read
through a view; anything else, copied to a temporary table) is grouped by record identity and
merged into the tables: new records are inserted, known ones are not stored again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import duckdb

from spark_backend.cache.store import IngestStats, rebuild_transactions
from spark_backend.model.records import RECORD_FIELDS

_KEY = (
    "coalesce(record_id, concat_ws('|', coalesce(partition_token, ''), ts_ns::VARCHAR, "
    "coalesce(server_transaction_id, ''), coalesce(record_sequence, '')))"
)


# The batch's columns as a table (``records.RECORD_FIELDS``).
_BATCH_DDL = ", ".join(f"{name} {dict(string='VARCHAR', int64='BIGINT', bool='BOOLEAN')[kind]}"
                       for name, kind in RECORD_FIELDS)


def _stage(con: duckdb.DuckDBPyConnection, batch: Any, copy: bool = False) -> str:
    """Make the batch readable as ``_batch``; returns what it is (VIEW, ARROW or TABLE).

    ``copy``: an Arrow batch is copied into a temporary table. DuckDB keeps every Arrow object
    registered in a transaction alive until the transaction ends: a long transaction of many
    chunks (a file import) would hold all of them in this process's memory; a copy made
    through a relation holds none. The copies, like the other tables a chunk makes, are kept
    until the commit too, but as DuckDB data: beyond its memory limit they go to its temporary
    folder (for a file import, about as many bytes as the file)."""
    if copy:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _batch ({_BATCH_DDL})")
        con.from_arrow(batch).insert_into("_batch")
        return "TABLE"
    if isinstance(batch, str | Path):
        # A view, not a copy: Parquet is re-read per step instead of held in memory. (A view
        # cannot take parameters; the path is our own staging folder, quoted.)
        quoted = str(batch).replace("'", "''")
        con.execute(f"CREATE OR REPLACE TEMP VIEW _batch AS SELECT * FROM read_parquet('{quoted}')")
        return "VIEW"
    import pyarrow as pa

    if isinstance(batch, pa.Table | pa.RecordBatch):
        # In memory already: every step scans it where it is (a copy in a temporary table
        # took as much memory again, until the landing's commit, and time).
        con.register("_batch", batch)
        return "ARROW"
    con.register("_batch_arrow", batch)  # e.g. a dataset: read once
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _batch AS SELECT * FROM _batch_arrow")
    finally:
        con.unregister("_batch_arrow")
    return "TABLE"


def begin_ingest(con: duckdb.DuckDBPyConnection) -> None:
    """Before the chunks of one ingest: remember what they insert, so that a record repeated
    in a later chunk still counts as a duplicate delivered by the source, and which
    transactions they add records to."""
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_dc (record_key TEXT)")
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_hb (partition_token TEXT, ts_ns BIGINT)")
    con.execute("CREATE OR REPLACE TEMP TABLE _ingest_tx (id TEXT)")


def end_ingest(con: duckdb.DuckDBPyConnection, stream: str) -> None:
    """After the chunks of one ingest: rebuild the ``transactions`` rows its chunks added
    records to (chunks landed with ``summarize``), once, from all their records."""
    (touched,) = con.execute("SELECT count(*) FROM _ingest_tx").fetchone()
    if touched:  # ids repeat across chunks: the rebuild reads them through IN
        rebuild_transactions(con, stream, "_ingest_tx")
    for name in ("_ingest_dc", "_ingest_hb", "_ingest_tx"):
        con.execute(f"DROP TABLE IF EXISTS {name}")


def ingest_batch(
    con: duckdb.DuckDBPyConnection,
    stream: str,
    pull_id: int | None,
    batch: Any,
    *,
    count_existing_as_duplicates: bool,
    summarize: bool = True,
    copy: bool = False,
) -> IngestStats:
    """``summarize``: ``end_ingest`` brings ``transactions`` up to date with the new records
    (False: the caller marked them for ``Cache.summarize_transactions``); ``copy``: as for
    ``_stage``."""
    staged = _stage(con, batch, copy)
    _allow_unknown_times(con)
    stats = IngestStats()
    stats.data_change, dup_dc = _data_change(con, stream, pull_id, count_existing_as_duplicates,
                                             summarize)
    stats.heartbeats, dup_hb = _heartbeats(con, stream, pull_id, count_existing_as_duplicates)
    stats.child_partitions = _child_partitions(con, stream, pull_id)
    stats.duplicates = dup_dc + dup_hb
    _partition_records(con, stream, pull_id)
    _partition_counters(con, stream, pull_id)
    _finished_by_children(con, stream)
    _finished_by_end_records(con, stream)
    stats.partitions_ended = _partition_ends(con, stream, pull_id)
    stats.bad = _quarantine(con, stream, pull_id)
    if staged == "ARROW":
        con.unregister("_batch")
    else:
        con.execute(f"DROP {staged} IF EXISTS _batch")
    for name in ("_dc", "_hb", "_cp", "_new_marks", "_pr"):
        con.execute(f"DROP TABLE IF EXISTS {name}")
    return stats


# Columns that hold NULL when the source gives no time (never the epoch); caches made before
# had them NOT NULL, and are changed the first time such a record arrives (not at every open:
# an ALTER rewrites the file).
_UNKNOWN_TIME_COLUMNS = (("data_change_records", "commit_timestamp", "data_change"),
                         ("child_partitions_records", "start_timestamp", "child_partitions"))


def _allow_unknown_times(con: duckdb.DuckDBPyConnection) -> None:
    for table, column, kind in _UNKNOWN_TIME_COLUMNS:
        (without_time,) = con.execute(
            "SELECT count(*) FROM _batch WHERE kind = ? AND ts_ns IS NULL", [kind]).fetchone()
        if not without_time:
            continue
        (nullable,) = con.execute(
            "SELECT is_nullable FROM information_schema.columns WHERE table_name = ? "
            "AND column_name = ?", [table, column]).fetchone()
        if nullable == "NO":
            con.execute(f"ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL")


# Whether a record of the batch (``g``) can be in the cache already; only those are looked up
# among the stored records, whose scan grows with the cache (and filled DuckDB's buffer pool
# with their keys: its memory grew with every landing of a pull). A record is known by its
# partition and time (``by_id``: rows always looked up, those with another identity or, for
# heartbeats, with no partition), and a partition holds no record later than its watermark:
# ingest only ever raises the watermark to the newest record it stores, except where a
# partition ends (``end_ts`` set), whose records are always looked up. So a fresh pull,
# which reads each partition on from where it stopped, looks up nothing; a resumed one looks
# up what it reads again.
_MAY_BE_CACHED = """({by_id} OR g.partition_token IS NULL OR g.ts_ns IS NULL
    OR EXISTS (SELECT 1 FROM partitions p WHERE p.stream = $stream
               AND p.token = g.partition_token
               AND (p.end_ts IS NOT NULL
                    OR g.ts_ns <= epoch_ns(p.watermark)
                    OR (p.watermark IS NULL
                        AND p.data_change_records + p.heartbeats > 0))))"""


def _mark_known(con, staged: str, found: str, match: str, stream: str) -> None:
    """Set ``known`` on the staged rows that may be cached and are (see ``_MAY_BE_CACHED``).

    ``found``: the stored rows' keys SEMI JOIN ``maybe`` (the staged rows that may be cached),
    so that the join's hash table holds the batch's keys. Looked up the other way round
    (``EXISTS`` from the staged rows) the table holds the cache's keys, and an import whose
    records all carry their own identity (a changefeed's, all ``maybe``) ran out of its
    128 MB of DuckDB memory after 1.6 million records. ``match``: a staged row (``s``)
    against a found one (``f``)."""
    (maybe,) = con.execute(f"SELECT count(*) FROM {staged} WHERE maybe").fetchone()
    if maybe:
        con.execute(f"CREATE OR REPLACE TEMP TABLE _found AS "
                    f"WITH maybe AS (SELECT * FROM {staged} WHERE maybe) {found}", [stream])
        con.execute(f"UPDATE {staged} s SET known = true WHERE maybe AND EXISTS "
                    f"(SELECT 1 FROM _found f WHERE {match})")
        con.execute("DROP TABLE _found")


# A batch's data change records (``_dc``), one row per record key: its first copy and how
# many copies the batch holds (``_DC_GROUPED``). A batch that repeats no key (a pull's: each
# partition read once from where it stopped; most chunks of an import) needs no grouping:
# ``_dc`` keeps only the narrow columns (``_DC_NARROW``) and the records go from the batch
# to the stored tables as they are (``_DC_AS_THEY_ARE``), less those found stored already:
# grouping and copying every column would fill a pull's DuckDB memory and spill to temporary
# files (benchmarks/MEMORY.md).
_DC_WIDE = """partition_token, ts_ns, record_sequence, server_transaction_id,
    is_last_record_in_transaction_in_partition AS is_last, table_name,
    value_capture_type AS vct, column_types, mods, mod_type,
    number_of_records_in_transaction AS n_records,
    number_of_partitions_in_transaction AS n_partitions, transaction_tag,
    is_system_transaction AS is_system, record_id, order_key, read_ts_ns, extra, origin"""
_DC_GROUPED = f"""SELECT {_KEY} AS record_key, count(*) AS n,
    {", ".join(f"first({column.split(' AS ')[0].strip()}) AS {column.split(' AS ')[-1].strip()}"
               for column in _DC_WIDE.split(","))},
    min(line) AS line
    FROM _batch WHERE kind = 'data_change' GROUP BY record_key"""
_DC_NARROW = f"""SELECT {_KEY} AS record_key, CAST(1 AS BIGINT) AS n, partition_token, ts_ns,
    record_id, server_transaction_id, line
    FROM _batch WHERE kind = 'data_change'"""
_DC_AS_THEY_ARE = f"""(SELECT {_KEY} AS record_key, CAST(1 AS BIGINT) AS n, false AS known,
    {_DC_WIDE}, line FROM _batch WHERE kind = 'data_change')"""


# Whether a record of the batch was inserted by an earlier chunk of this ingest (``here``): the
# keys ``_ingest_*`` remembered are first narrowed to the batch's (``seen``, a semi join whose
# hash table holds the batch's keys), then the batch's are looked up among those. Looked up
# among all remembered keys at once, the hash table held every key the ingest had inserted
# so far: a long ingest (a 1 GB file import) ran out of its DuckDB memory there. The first
# chunk of an ingest (a pull's landing is mostly one) has nothing to look up.
_SEEN_DC = "seen AS (SELECT i.record_key FROM _ingest_dc i SEMI JOIN g USING (record_key))"
_HERE_DC = "g.record_key IN (SELECT record_key FROM seen)"
_SEEN_HB = """seen AS (SELECT i.partition_token, i.ts_ns FROM _ingest_hb i
    SEMI JOIN g ON i.partition_token = g.partition_token AND i.ts_ns = g.ts_ns)"""
_HERE_HB = """EXISTS (SELECT 1 FROM seen i WHERE i.partition_token = g.partition_token
    AND i.ts_ns = g.ts_ns)"""


def _remembers(con, table: str) -> bool:
    return con.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]


def _stage_data_change(con, stream: str, grouped: bool) -> None:
    remembers = _remembers(con, "_ingest_dc")
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _dc AS
        WITH g AS ({_DC_GROUPED if grouped else _DC_NARROW})
             {f", {_SEEN_DC}" if remembers else ""}
        SELECT g.*, false AS known, {_MAY_BE_CACHED.format(by_id="g.record_id IS NOT NULL")}
                 AS maybe,
               {_HERE_DC if remembers else "false"} AS here
        FROM g""",
        {"stream": stream},
    )


def _data_change(con, stream, pull_id, count_existing, summarize) -> tuple[int, int]:
    (repeated,) = con.execute(
        f"SELECT count(*) - count(DISTINCT {_KEY}) FROM _batch WHERE kind = 'data_change'"
    ).fetchone()
    _stage_data_change(con, stream, grouped=bool(repeated))
    _mark_known(con, "_dc",
                "SELECT d.record_key FROM data_change_records d SEMI JOIN maybe m "
                "ON d.record_key = m.record_key WHERE d.stream = ?",
                "f.record_key = s.record_key", stream)
    counted = "known" if count_existing else "here"
    known_n, new_n, new_dups, stored = con.execute(
        f"SELECT coalesce(sum(n) FILTER (WHERE {counted}), 0), count(*) FILTER (WHERE NOT known), "
        "coalesce(sum(n - 1) FILTER (WHERE NOT known), 0), count(*) FILTER (WHERE known) FROM _dc"
    ).fetchone()
    if repeated:
        rows = "_dc"
    elif stored:
        rows = (f"(SELECT * FROM {_DC_AS_THEY_ARE} WHERE record_key NOT IN "
                "(SELECT record_key FROM _dc WHERE known))")
    else:  # every record (if any) is new, one copy each: straight from the batch
        rows = _DC_AS_THEY_ARE
    duplicates = int(new_dups)
    if known_n:
        con.execute(
            "UPDATE data_change_records d SET copies = d.copies + _dc.n FROM _dc "
            f"WHERE _dc.{counted} AND d.stream = ? AND d.record_key = _dc.record_key",
            [stream],
        )
        duplicates += int(known_n)
    con.execute("INSERT INTO _ingest_dc SELECT record_key FROM _dc WHERE NOT known")
    # Each record's mods are parsed once: the list of mods with each mod's number beside it
    # (``unnest`` and ``generate_subscripts`` over ``from_json`` would parse it twice).
    con.execute(
        f"""INSERT INTO mods
        SELECT $stream, record_key, CAST(u.i - 1 AS INTEGER), table_name,
               make_timestamp_ns(ts_ns),
               u.m -> 'keys', u.m -> 'new_values', u.m -> 'old_values'
        FROM (SELECT record_key, table_name, ts_ns,
                     unnest(list_transform(from_json(mods, '["JSON"]'),
                                           lambda m, i: {{'m': m, 'i': i}})) AS u
              FROM {rows} d WHERE NOT known AND mods IS NOT NULL)""",
        {"stream": stream},
    )
    con.execute(
        f"""INSERT INTO data_change_records
        SELECT $stream, record_key, partition_token, make_timestamp_ns(ts_ns), record_sequence,
               server_transaction_id, is_last, table_name, vct, column_types, mod_type,
               n_records, n_partitions, transaction_tag, is_system, record_id, order_key,
               make_timestamp_ns(read_ts_ns), extra,
               CAST(coalesce(json_array_length(mods), 0) AS INTEGER), CAST(n AS INTEGER),
               $pull, origin, line
        FROM {rows} d WHERE NOT known""",
        {"stream": stream, "pull": pull_id},
    )
    if summarize:
        con.execute("INSERT INTO _ingest_tx SELECT DISTINCT server_transaction_id FROM _dc "
                    "WHERE NOT known AND server_transaction_id IS NOT NULL")
    return int(new_n), duplicates


def _heartbeats(con, stream, pull_id, count_existing) -> tuple[int, int]:
    remembers = _remembers(con, "_ingest_hb")
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _hb AS
        WITH g AS (SELECT coalesce(partition_token, '') AS partition_token, ts_ns,
                          count(*) AS n, first(extra ORDER BY origin, line) AS extra,
                          min(line) AS line
                   FROM _batch WHERE kind = 'heartbeat' GROUP BY ALL)
             {f", {_SEEN_HB}" if remembers else ""}
        SELECT g.*, false AS known, {_MAY_BE_CACHED.format(by_id="g.partition_token = ''")}
                 AS maybe,
               {_HERE_HB if remembers else "false"} AS here
        FROM g""",
        {"stream": stream},
    )
    _mark_known(con, "_hb",
                "SELECT h.partition_token, h.timestamp FROM heartbeats h SEMI JOIN maybe m "
                "ON h.partition_token = m.partition_token "
                "AND h.timestamp = make_timestamp_ns(m.ts_ns) WHERE h.stream = ?",
                "f.partition_token = s.partition_token "
                "AND f.timestamp = make_timestamp_ns(s.ts_ns)", stream)
    counted = "known" if count_existing else "here"
    new_n, new_dups, known_n = con.execute(
        "SELECT count(*) FILTER (WHERE NOT known), "
        "coalesce(sum(n - 1) FILTER (WHERE NOT known), 0),"
        f" coalesce(sum(n) FILTER (WHERE {counted}), 0) FROM _hb"
    ).fetchone()
    duplicates = int(new_dups)
    con.execute("INSERT INTO _ingest_hb SELECT partition_token, ts_ns FROM _hb WHERE NOT known")
    if known_n:
        con.execute(
            f"UPDATE heartbeats h SET copies = h.copies + _hb.n FROM _hb WHERE _hb.{counted} "
            "AND h.stream = ? AND h.partition_token = _hb.partition_token "
            "AND h.timestamp = make_timestamp_ns(_hb.ts_ns)",
            [stream],
        )
        duplicates += int(known_n)
    con.execute(
        "INSERT INTO heartbeats SELECT $stream, partition_token, make_timestamp_ns(ts_ns), extra, "
        "CAST(n AS INTEGER), $pull, line FROM _hb WHERE NOT known",
        {"stream": stream, "pull": pull_id},
    )
    return int(new_n), duplicates


def _child_partitions(con, stream, pull_id) -> int:
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _cp AS
        SELECT kind, partition_token, ts_ns, record_sequence, first(child_partitions) AS children,
               count(*) AS n
        FROM _batch b WHERE (kind = 'child_partitions'
          AND NOT EXISTS (SELECT 1 FROM child_partitions_records c WHERE c.stream = $stream
                AND c.partition_token IS NOT DISTINCT FROM b.partition_token
                AND c.start_timestamp IS NOT DISTINCT FROM make_timestamp_ns(b.ts_ns)
                AND c.record_sequence IS NOT DISTINCT FROM b.record_sequence))
          -- MUTABLE_KEY_RANGE: partition start records announce partitions the same way
          OR (kind = 'partition_start'
          AND NOT EXISTS (SELECT 1 FROM partition_records c WHERE c.stream = $stream
                AND c.kind = 'partition_start'
                AND c.partition_token IS NOT DISTINCT FROM b.partition_token
                AND c.timestamp = make_timestamp_ns(b.ts_ns)
                AND c.record_sequence IS NOT DISTINCT FROM b.record_sequence))
        GROUP BY ALL""",
        {"stream": stream},
    )
    (count,) = con.execute("SELECT count(*) FROM _cp").fetchone()
    con.execute(
        "INSERT INTO child_partitions_records SELECT $stream, partition_token, "
        "make_timestamp_ns(ts_ns), record_sequence, children, CAST(n AS INTEGER), $pull FROM _cp "
        "WHERE kind = 'child_partitions'",
        {"stream": stream, "pull": pull_id},
    )
    # One row per (child, parent); a child of the initial query has no parents -> NULL parent.
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _kids AS
        SELECT DISTINCT c ->> 'token' AS child, ts_ns, record_sequence,
               unnest(CASE WHEN json_array_length(c -> 'parent_partition_tokens') = 0
                           THEN [NULL::VARCHAR]
                           ELSE from_json(c -> 'parent_partition_tokens', '["VARCHAR"]') END)
                 AS parent
        FROM (SELECT ts_ns, record_sequence, unnest(from_json(children, '["JSON"]')) AS c
              FROM _cp)"""
    )
    con.execute(
        """INSERT INTO edges
        SELECT DISTINCT $stream, parent, child, make_timestamp_ns(ts_ns), record_sequence
        FROM _kids k WHERE NOT EXISTS (SELECT 1 FROM edges e WHERE e.stream = $stream
              AND e.child = k.child AND e.parent IS NOT DISTINCT FROM k.parent)""",
        {"stream": stream},
    )
    con.execute(
        """INSERT INTO partitions (stream, token, start_ts, state, first_pull)
        SELECT $stream, child, make_timestamp_ns(min(ts_ns)), 'pending', $pull FROM _kids
        WHERE child NOT IN (SELECT token FROM partitions WHERE stream = $stream)
        GROUP BY child""",
        {"stream": stream, "pull": pull_id},
    )
    con.execute("DROP TABLE _kids")
    return int(count)


def _finished_by_children(con, stream) -> None:
    # A partition that returned child partitions records has ended at their start_timestamp.
    con.execute(
        """UPDATE partitions p SET state = 'finished', end_ts = make_timestamp_ns(c.ts),
             watermark = make_timestamp_ns(c.ts)
           FROM (SELECT partition_token, max(ts_ns) AS ts FROM _cp
                 WHERE partition_token IS NOT NULL AND kind = 'child_partitions' GROUP BY ALL) c
           WHERE p.stream = $stream AND p.token = c.partition_token""",
        {"stream": stream},
    )



def _partition_records(con, stream, pull_id) -> None:
    """MUTABLE_KEY_RANGE partition start, event and end records, each stored once."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _pr AS
        SELECT CASE kind WHEN 'partition_end_record' THEN 'partition_end' ELSE kind END
                 AS record_kind,
               partition_token, ts_ns, record_sequence,
               CASE WHEN kind = 'partition_start' THEN to_json(json_extract_string(
                   first(child_partitions), '$[*].token')) END AS tokens,
               CASE WHEN kind = 'partition_event' THEN first(extra) -> 'move_in' END AS move_in,
               CASE WHEN kind = 'partition_event' THEN first(extra) -> 'move_out' END AS move_out,
               count(*) AS n
        FROM _batch b
        WHERE kind IN ('partition_start', 'partition_event', 'partition_end_record')
          AND NOT EXISTS (SELECT 1 FROM partition_records r WHERE r.stream = $stream
                AND r.kind = CASE b.kind WHEN 'partition_end_record' THEN 'partition_end'
                                         ELSE b.kind END
                AND r.partition_token IS NOT DISTINCT FROM b.partition_token
                AND r.timestamp = make_timestamp_ns(b.ts_ns)
                AND r.record_sequence IS NOT DISTINCT FROM b.record_sequence)
        GROUP BY kind, partition_token, ts_ns, record_sequence""",
        {"stream": stream},
    )
    con.execute(
        "INSERT INTO partition_records SELECT $stream, partition_token, record_kind, "
        "make_timestamp_ns(ts_ns), record_sequence, tokens, move_in, move_out, "
        "CAST(n AS INTEGER), $pull FROM _pr",
        {"stream": stream, "pull": pull_id},
    )


def _finished_by_end_records(con, stream) -> None:
    # MUTABLE_KEY_RANGE: a partition end record is the last record of its partition.
    con.execute(
        """UPDATE partitions p SET state = 'finished', end_ts = make_timestamp_ns(e.ts),
             watermark = make_timestamp_ns(e.ts)
           FROM (SELECT partition_token, max(ts_ns) AS ts FROM _pr
                 WHERE partition_token IS NOT NULL AND record_kind = 'partition_end'
                 GROUP BY ALL) e
           WHERE p.stream = $stream AND p.token = e.partition_token""",
        {"stream": stream},
    )


def _partition_counters(con, stream, pull_id) -> None:
    """Watermarks and counts from this batch's new records; unknown partitions appear as open."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _new_marks AS
        SELECT partition_token, max(ts_ns) AS mark, min(ts_ns) AS first_mark,
               count(*) FILTER (WHERE kind = 'data_change') AS dc,
               count(*) FILTER (WHERE kind = 'heartbeat') AS hb
        FROM (SELECT partition_token, ts_ns, 'data_change' AS kind FROM _dc WHERE NOT known
              UNION ALL SELECT partition_token, ts_ns, 'heartbeat' FROM _hb WHERE NOT known
              UNION ALL SELECT partition_token, ts_ns, 'child_partitions' FROM _batch
                        WHERE kind IN ('child_partitions', 'partition_start',
                                       'partition_event', 'partition_end_record'))
        WHERE partition_token IS NOT NULL GROUP BY partition_token"""
    )
    con.execute(
        """INSERT INTO partitions (stream, token, start_ts, state, first_pull)
        SELECT $stream, partition_token, make_timestamp_ns(first_mark), 'open', $pull
        FROM _new_marks
        WHERE partition_token NOT IN (SELECT token FROM partitions WHERE stream = $stream)""",
        {"stream": stream, "pull": pull_id},
    )
    con.execute(
        """UPDATE partitions p SET
             watermark = CASE WHEN p.watermark IS NULL THEN make_timestamp_ns(m.mark)
                              ELSE greatest(p.watermark, make_timestamp_ns(m.mark)) END,
             state = CASE WHEN p.state = 'pending' THEN 'open' ELSE p.state END,
             data_change_records = p.data_change_records + m.dc,
             heartbeats = p.heartbeats + m.hb,
             last_pull = $pull
           FROM _new_marks m WHERE p.stream = $stream AND p.token = m.partition_token""",
        {"stream": stream, "pull": pull_id},
    )


def _partition_ends(con, stream, pull_id) -> int:
    """Apply the readers' partition_end rows: state, the range read, the end of a finished one."""
    con.execute(
        """CREATE OR REPLACE TEMP TABLE _ends AS
        SELECT partition_token, extra ->> 'state' AS state, ts_ns AS read_to,
               CAST(extra ->> 'read_from' AS BIGINT) AS read_from,
               CAST(extra ->> 'end' AS BIGINT) AS end_ns,
               extra ->> 'error' AS error, coalesce(CAST(extra ->> 'attempts' AS INTEGER), 1)
                 AS attempts
        FROM _batch WHERE kind = 'partition_end' AND partition_token IS NOT NULL"""
    )
    (count,) = con.execute("SELECT count(*) FROM _ends").fetchone()
    con.execute(
        """INSERT INTO partitions (stream, token, start_ts, state, first_pull)
        SELECT $stream, partition_token, make_timestamp_ns(read_from), 'pending', $pull FROM _ends
        WHERE partition_token NOT IN (SELECT token FROM partitions WHERE stream = $stream)""",
        {"stream": stream, "pull": pull_id},
    )
    con.execute(
        """UPDATE partitions p SET
             state = e.state,
             read_from = CASE WHEN e.read_from IS NULL THEN p.read_from
                              WHEN p.read_from IS NULL THEN make_timestamp_ns(e.read_from)
                              ELSE least(p.read_from, make_timestamp_ns(e.read_from)) END,
             read_to = CASE WHEN e.read_to IS NULL THEN p.read_to
                            WHEN p.read_to IS NULL THEN make_timestamp_ns(e.read_to)
                            ELSE greatest(p.read_to, make_timestamp_ns(e.read_to)) END,
             end_ts = CASE WHEN e.end_ns IS NOT NULL THEN make_timestamp_ns(e.end_ns)
                           ELSE p.end_ts END,
             watermark = CASE WHEN e.end_ns IS NOT NULL THEN make_timestamp_ns(e.end_ns)
                              ELSE p.watermark END,
             error = e.error,
             attempts = p.attempts + e.attempts,
             last_pull = $pull
           FROM _ends e WHERE p.stream = $stream AND p.token = e.partition_token""",
        {"stream": stream, "pull": pull_id},
    )
    con.execute("DROP TABLE _ends")
    return int(count)


def _quarantine(con, stream, pull_id) -> int:
    (count,) = con.execute("SELECT count(*) FROM _batch WHERE kind = 'bad'").fetchone()
    if count:
        con.execute(
            "INSERT INTO quarantine (stream, origin, line, reason, raw, pull_id, raw_bytes, "
            "raw_sha256) "
            "SELECT $stream, coalesce(origin, partition_token), line, extra ->> 'reason', raw, "
            "$pull, CAST(extra ->> 'raw_bytes' AS BIGINT), extra ->> 'raw_sha256' "
            "FROM _batch WHERE kind = 'bad'",
            {"stream": stream, "pull": pull_id},
        )
    return int(count)


def ingest_stream(
    cache: Any,
    stream: str,
    pull_id: int | None,
    batches: Iterable[Any],
    *,
    chunk_rows: int = 50_000,
    on_chunk: Callable[[Any], None] | None = None,
    extra_sql: Callable[[], list[tuple[str, list[Any]]]] | None = None,
    count_existing_as_duplicates: bool = False,
    sort_by: list[tuple[str, str]] | None = None,
    copy: bool = False,
) -> IngestStats:
    """Land a stream of Arrow record batches (``records.RECORD_FIELDS``) in ONE transaction,
    ``chunk_rows`` at a time: memory holds one chunk, never the whole stream.

    ``on_chunk(table)`` sees each chunk after it landed (progress); ``extra_sql()`` gives
    statements run at the end in the same transaction (e.g. counting the pull's records).
    ``count_existing_as_duplicates``: as for ``Cache.ingest`` (file imports). ``sort_by``
    orders each chunk before it lands (pyarrow ``sort_by`` keys, stable): batches arrive in
    no particular order, and which copy of a repeated record is kept follows the order.
    ``copy``: each chunk is copied into DuckDB before it lands (``_stage``), so that memory
    holds one chunk however many chunks the transaction lands.

    With a ``pull_id``, the ``transactions`` summary is left to ``Cache.finish_pull``
    (``Cache.summarize_transactions``): a pull's landings only mark it out of date.
    """
    import pyarrow as pa

    stats = IngestStats()
    pending: list[Any] = []
    size = 0

    def land() -> None:
        nonlocal pending, size
        table = pa.Table.from_batches(pending)
        pending, size = [], 0
        if sort_by:
            table = table.sort_by(sort_by)
        part = ingest_batch(cache.con, stream, pull_id, table,
                            count_existing_as_duplicates=count_existing_as_duplicates,
                            summarize=pull_id is None, copy=copy)
        for name in vars(stats):
            setattr(stats, name, getattr(stats, name) + getattr(part, name))
        if on_chunk is not None:
            on_chunk(table)

    with cache.transaction():
        if pull_id is not None:
            cache.defer_transactions(stream, pull_id)
        begin_ingest(cache.con)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            pending.append(batch)
            size += batch.num_rows
            if size >= chunk_rows:
                land()
        if pending:
            land()
        end_ingest(cache.con, stream)
        for sql, params in (extra_sql() if extra_sql else []):
            cache.con.execute(sql, params)
        cache._bump()
    return stats
