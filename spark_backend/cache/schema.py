"""The DuckDB cache's tables. Documented for users in docs/cache-schema.md.

Timestamps are TIMESTAMP_NS (UTC, full precision). Every table is keyed by ``stream``, the
name the stream has in the cache (one cache file holds several streams).

The tables that grow with the records (``data_change_records``, ``mods``, ``transactions``,
``heartbeats``) carry no PRIMARY KEY and no index. DuckDB keeps a key's ART index in memory
(54 MB in a 1M-record pull) and checks it at every insert, yet it uses no multi-column index to
look a row up: a filter on ``stream`` and ``record_key`` scans the column either way.
``ingest.py`` keeps the records unique itself: a record it knows is counted, not stored again.
"""

from __future__ import annotations

SCHEMA_VERSION = 2

DDL = [
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    """CREATE TABLE IF NOT EXISTS streams (
        stream TEXT PRIMARY KEY,
        system TEXT NOT NULL,            -- spanner | datastream | cockroachdb | bigtable | beam
        source TEXT,                     -- demo | emulator | spanner | recording | file | ...
        dialect TEXT,                    -- googlesql | postgresql (Spanner only)
        location TEXT,                   -- projects/P/instances/I/databases/D, never credentials
        source_stream TEXT,              -- the change stream's name at the source
        heartbeat_ms BIGINT,
        range_start TIMESTAMP_NS,        -- covered range of the pulls so far
        range_end TIMESTAMP_NS,
        created_at TIMESTAMP DEFAULT current_timestamp
    )""",
    """CREATE TABLE IF NOT EXISTS pulls (
        pull_id BIGINT PRIMARY KEY,      -- max + 1 (no sequence: it would not survive a crash)
        stream TEXT NOT NULL,
        source TEXT,
        range_start TIMESTAMP_NS,
        range_end TIMESTAMP_NS,
        heartbeat_ms BIGINT,
        started_at TIMESTAMP,
        finished_at TIMESTAMP,
        status TEXT,                     -- running | complete | failed | nothing-to-do
                                         -- | interrupted (ended by the user, killed)
        waves INTEGER DEFAULT 0,
        records BIGINT DEFAULT 0,
        error TEXT,
        failed_partition TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS partitions (
        stream TEXT NOT NULL,
        token TEXT NOT NULL,
        start_ts TIMESTAMP_NS,           -- start_timestamp of the record that announced it
        end_ts TIMESTAMP_NS,             -- when it ended (its child partitions record); NULL: open
        read_from TIMESTAMP_NS,          -- records are cached from here ...
        read_to TIMESTAMP_NS,            -- ... up to here (inclusive)
        state TEXT NOT NULL,             -- pending | open | finished | incomplete
        watermark TIMESTAMP_NS,          -- latest progress mark (finished: its end)
        data_change_records BIGINT DEFAULT 0,
        heartbeats BIGINT DEFAULT 0,
        attempts INTEGER DEFAULT 0,
        error TEXT,
        first_pull BIGINT,
        last_pull BIGINT,
        PRIMARY KEY (stream, token)
    )""",
    """CREATE TABLE IF NOT EXISTS edges (
        stream TEXT NOT NULL,
        parent TEXT,                     -- NULL: a child of the initial query (the virtual root)
        child TEXT NOT NULL,
        start_ts TIMESTAMP_NS,
        record_sequence TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS data_change_records (
        stream TEXT NOT NULL,
        record_key TEXT NOT NULL,        -- identity: record_id, or partition|commit|txn|sequence
        partition_token TEXT,
        commit_timestamp TIMESTAMP_NS,   -- NULL: the source gave no time (never the epoch)
        record_sequence TEXT,
        server_transaction_id TEXT,
        is_last_record_in_transaction_in_partition BOOLEAN,
        table_name TEXT,
        value_capture_type TEXT,
        column_types JSON,
        mod_type TEXT,
        number_of_records_in_transaction BIGINT,
        number_of_partitions_in_transaction BIGINT,
        transaction_tag TEXT,
        is_system_transaction BOOLEAN,
        record_id TEXT,                  -- another system's own identity (Datastream uuid, ...)
        order_key TEXT,                  -- another system's own order within a source
        read_timestamp TIMESTAMP_NS,     -- when another system read it (freshness)
        extra JSON,                      -- another system's metadata
        mod_count INTEGER,
        copies INTEGER NOT NULL,         -- how often the source delivered it (>1: duplicate)
        pull_id BIGINT,
        origin TEXT,
        arrival BIGINT                   -- position in the read that returned it (order check)
    )""",
    """CREATE TABLE IF NOT EXISTS mods (
        stream TEXT NOT NULL,
        record_key TEXT NOT NULL,
        mod_index INTEGER NOT NULL,
        table_name TEXT,
        commit_timestamp TIMESTAMP_NS,
        keys JSON,                       -- canonical JSON (sorted keys) so a key can be looked up
        new_values JSON,
        old_values JSON
    )""",
    """CREATE TABLE IF NOT EXISTS transactions (
        stream TEXT NOT NULL,
        server_transaction_id TEXT NOT NULL,
        commit_timestamp TIMESTAMP_NS,   -- first commit timestamp seen
        records_seen BIGINT,
        records_expected BIGINT,         -- number_of_records_in_transaction
        partitions VARCHAR[],            -- partitions it was seen in
        partitions_expected BIGINT,      -- number_of_partitions_in_transaction
        tables VARCHAR[],
        mod_types VARCHAR[],
        transaction_tag TEXT,
        mods BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS heartbeats (
        stream TEXT NOT NULL,
        partition_token TEXT NOT NULL,
        timestamp TIMESTAMP_NS NOT NULL,
        extra JSON,
        copies INTEGER NOT NULL,
        pull_id BIGINT,
        arrival BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS child_partitions_records (
        stream TEXT NOT NULL,
        partition_token TEXT,            -- NULL: returned by the initial query
        start_timestamp TIMESTAMP_NS,    -- NULL: the source gave no time (never the epoch)
        record_sequence TEXT,
        child_partitions JSON,
        copies INTEGER NOT NULL,
        pull_id BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS partition_records (
        stream TEXT NOT NULL,
        partition_token TEXT,            -- NULL: returned by the initial query
        kind TEXT NOT NULL,              -- partition_start | partition_event | partition_end
        timestamp TIMESTAMP_NS NOT NULL, -- start_timestamp | commit_timestamp | end_timestamp
        record_sequence TEXT,
        partition_tokens JSON,           -- partition_start: the partitions to read next
        move_in JSON,                    -- partition_event: partitions key ranges moved in from
        move_out JSON,                   -- partition_event: partitions key ranges moved out to
        copies INTEGER NOT NULL,
        pull_id BIGINT
    )""",
    """CREATE TABLE IF NOT EXISTS quarantine (
        stream TEXT,
        origin TEXT,                     -- file path, or partition token
        line BIGINT,
        reason TEXT,
        raw TEXT,                        -- a preview: at most 200 characters, escaped
        pull_id BIGINT,
        quarantined_at TIMESTAMP DEFAULT current_timestamp
    )""",
    # The bad line's (a file's, for a file not of its format) size and SHA-256. Added by an
    # ALTER, in new caches too, so that a cache made before them is not taken for one changed
    # outside the tool (``store._check_columns`` counts CREATE TABLE columns only).
    "ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS raw_bytes BIGINT",
    "ALTER TABLE quarantine ADD COLUMN IF NOT EXISTS raw_sha256 TEXT",
    """CREATE TABLE IF NOT EXISTS imports (
        stream TEXT NOT NULL,
        path TEXT,
        sha256 TEXT,
        format TEXT,
        records BIGINT,
        bad BIGINT,
        pull_id BIGINT,
        imported_at TIMESTAMP DEFAULT current_timestamp
    )""",
    # IF NOT EXISTS: re-creating the view at every open rewrote the catalog (a read-only
    # command changed the file); change its definition with a migration, not here.
    """CREATE VIEW IF NOT EXISTS progress_marks AS
        SELECT stream, partition_token, commit_timestamp AS ts, 'data_change' AS kind
            FROM data_change_records
        UNION ALL
        SELECT stream, partition_token, timestamp AS ts, 'heartbeat' AS kind FROM heartbeats
        UNION ALL
        SELECT stream, partition_token, start_timestamp AS ts, 'child_partitions' AS kind
            FROM child_partitions_records WHERE partition_token IS NOT NULL""",
]

# Schema 1 -> 2: the tables that lost their PRIMARY KEY (DuckDB cannot drop one: each is
# rebuilt) and the index that went. ``Cache`` runs it at a read-write open, in one transaction.
UNKEYED_IN_2 = ("data_change_records", "transactions", "heartbeats")
DROPPED_IN_2 = ("mods_by_key",)

TABLE_DOCS = {
    "streams": "one row per stream in the cache: its system, source and covered range",
    "pulls": "every pull or import: range, status, records, the partition that failed",
    "partitions": "one row per partition: start, end, state, watermark, counts",
    "edges": "parent -> child partition edges (parent NULL for children of the initial query)",
    "data_change_records": "data change records (one row each; copies > 1 means duplicates)",
    "mods": "one row per mod of a data change record: keys, new_values, old_values",
    "transactions": "one row per server_transaction_id (rebuilt when a pull or import ends)",
    "heartbeats": "heartbeat records (and other systems' watermarks)",
    "child_partitions_records": "child partitions records as returned",
    "partition_records": "MUTABLE_KEY_RANGE streams: partition start, event (key-range moves "
                         "in and out) and end records as returned",
    "progress_marks": "view: every timestamp a partition vouched for",
    "beam_partitions": "a Beam/Dataflow connector's partition metadata rows, one per partition",
    "quarantine": "input that could not be decoded: the reason, a preview of at most 200 "
                  "characters, the size and SHA-256 of the line (never the line whole)",
    "imports": "files imported, by content hash (a file imported twice adds nothing)",
}
