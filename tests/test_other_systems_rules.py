"""The other systems as their own docs say (reference docs 001-003): CockroachDB's row envelope
(resolved messages, tombstones), no epoch for a time the data does not carry, Datastream
without a watermark, dumps as backfill INSERTs, transactions without a count are unknown,
Avro values as Datastream's consumers see them, Bigtable close-stream without a time."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import pyarrow as pa

from spark_backend import analysis
from spark_backend.cache.store import Cache
from spark_backend.formats import bigtable, cockroachdb, datastream
from spark_backend.model import records

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"


def _land(tmp_path, system, rows, stream="s"):
    cache = Cache(tmp_path / f"{system}.duckdb")
    cache.ensure_stream(stream, system=system, source="file")
    pull = cache.begin_pull(stream, "file", None, None, None)
    cache.ingest(stream, pull, pa.Table.from_batches([records.to_arrow_batch(rows)]),
                 count_existing_as_duplicates=True)
    return cache


# --- CockroachDB -----------------------------------------------------------------------------


def test_row_envelope_resolved_and_tombstones(tmp_path):
    """Doc 002: envelope=row emits the row alone; resolved messages still arrive; a delete is
    the key with a null (empty) value."""
    path = tmp_path / "row.ndjson"
    path.write_text("\n".join([
        '{"city": "washington dc", "id": "d3b3", "type": "skateboard"}',
        '{"__crdb__": {"resolved": "1701102561022789676.0000000000"}}',
        '{"key":"[\\"washington dc\\", \\"d3b3\\"]","table":"vehicles","value":""}',
        '["boston", "2222"] null',
    ]) + "\n")
    rows = list(cockroachdb.parse_file(str(path), {"envelope": "row"}))
    assert [r["kind"] for r in rows] == ["data_change", "heartbeat", "data_change",
                                         "data_change"]
    assert rows[0]["mod_type"] == "INSERT"
    assert rows[1]["ts_ns"] == 1701102561022789676
    assert [r["mod_type"] for r in rows[2:]] == ["DELETE", "DELETE"]
    assert json.loads(rows[2]["mods"])[0]["keys"] == {"key": ["washington dc", "d3b3"]}
    assert rows[2]["table_name"] == "vehicles"
    cache = _land(tmp_path, "cockroachdb", rows)
    (resolved,) = cache.con.execute("SELECT count(*) FROM heartbeats").fetchone()
    assert resolved == 1
    (inserted_resolved,) = cache.con.execute(
        "SELECT count(*) FROM data_change_records WHERE mod_type = 'INSERT'").fetchone()
    assert inserted_resolved == 1  # only the row, not the resolved message


def test_a_message_without_time_is_unknown_not_1970(tmp_path):
    rows = list(cockroachdb.parse_file(str(SAMPLES / "cockroachdb" / "wrapped_diff.ndjson"), {}))
    assert rows and all(r["ts_ns"] is None for r in rows if r["kind"] == "data_change")
    cache = _land(tmp_path, "cockroachdb", rows)
    stamps = cache.con.execute(
        "SELECT DISTINCT commit_timestamp FROM data_change_records").fetchall()
    assert stamps == [(None,)]
    counts = analysis.summary(cache.con, "s")["records"]
    assert counts["data_change_without_time"] == counts["data_change"] == len(rows)
    starts = cache.con.execute("SELECT start_ts FROM partitions").fetchall()
    assert all(s is None or s.year > 1970 for (s,) in starts)


# --- Datastream ------------------------------------------------------------------------------


def _event(uuid, **md):
    return {"stream_name": "projects/p/locations/l/streams/s", "read_method": md.pop(
        "read_method", "oracle-cdc-logminer"), "object": "SAMPLE.TBL", "uuid": uuid,
        "read_timestamp": "2024-05-01T10:00:01Z", "source_timestamp": "2024-05-01T10:00:00Z",
        "source_metadata": md, "payload": {"ID": "1", "V": "a"}}


def test_oracle_dump_is_a_backfill_insert():
    row = datastream.event_row(_event("u1", change_type="oracle_dump", row_id="AAA", scn=1,
                                      read_method="oracle-backfill"))
    assert row["mod_type"] == "INSERT"
    row = datastream.event_row(_event("u2", change_type="oracle_dump", row_id="AAA", scn=1))
    assert row["mod_type"] == "INSERT"


def test_datastream_has_no_watermark_and_transactions_are_unknown(tmp_path):
    """Doc 001 gives no watermark and no record count per transaction."""
    rows = list(datastream.parse_file(str(SAMPLES / "datastream" / "postgresql_events.jsonl")))
    assert any(r["server_transaction_id"] for r in rows)
    cache = _land(tmp_path, "datastream", rows)
    assert analysis.low_watermark(cache.con, "s") == (None, None)
    assert analysis.holding_back(cache.con, "s") is None
    assert analysis.heartbeat_gaps(cache.con, "s").empty
    assert analysis.watermark_series(cache.con, "s").empty
    txns = analysis.transactions(cache.con, "s")
    assert len(txns) > 0 and set(txns["state"]) == {"unknown"}
    report = analysis.build_report(cache.con, "s")
    assert report["transactions"]["incomplete"] == []
    assert report["transactions"]["unknown"] == len(txns)
    assert not any(a["kind"] in ("heartbeat_gap", "stalled") for a in report["anomalies"])


def test_avro_custom_types_unwrapped_and_bytes_base64(tmp_path):
    import fastavro

    tz = {"type": "record", "name": "timestampTz", "fields": [
        {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "offset", "type": {"type": "int", "logicalType": "time-millis"}}]}
    varchar = {"type": "record", "name": "varchar", "fields": [
        {"name": "value", "type": "string"}, {"name": "length", "type": "int"}]}
    schema = fastavro.parse_schema({"type": "record", "name": "event", "fields": [
        {"name": "uuid", "type": "string"}, {"name": "object", "type": "string"},
        {"name": "read_method", "type": "string"},
        {"name": "source_timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "source_metadata", "type": {"type": "record", "name": "md", "fields": [
            {"name": "change_type", "type": "string"}, {"name": "tx_id", "type": "string"},
            {"name": "lsn", "type": "string"}]}},
        {"name": "payload", "type": {"type": "record", "name": "payload", "fields": [
            {"name": "id", "type": "long"}, {"name": "name", "type": varchar},
            {"name": "at", "type": tz}, {"name": "blob", "type": "bytes"}]}}]})
    when = dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.UTC)
    path = tmp_path / "events.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, schema, [{
            "uuid": "a1", "object": "public.t", "read_method": "postgres-cdc-wal",
            "source_timestamp": when,
            "source_metadata": {"change_type": "INSERT", "tx_id": "9", "lsn": "0/1"},
            "payload": {"id": 1, "name": {"value": "Ada", "length": 3},
                        "at": {"timestamp": when, "offset": dt.time(2, 0)},
                        "blob": b"\x00\x01hi"}}])
    (row,) = list(datastream.parse_file(str(path)))
    values = json.loads(row["mods"])[0]["new_values"]
    assert values["name"] == "Ada"
    assert values["at"] == "2024-05-01T12:00:00+02:00"
    assert values["blob"] == base64.b64encode(b"\x00\x01hi").decode()


# --- Bigtable --------------------------------------------------------------------------------


def test_close_stream_without_any_time_is_unknown_not_1970(tmp_path):
    path = tmp_path / "close.jsonl"
    # a wrapped response without "timestamp", and nothing earlier in the file for the partition
    path.write_text(json.dumps({
        "partition": {"rowRange": {}}, "table": "fruits",
        "response": {"closeStream": {
            "status": {"code": 11, "message": "Change stream partitions have changed"},
            "continuationTokens": [{"partition": {"rowRange": {"endKeyOpen": "bQ=="}},
                                    "token": "tok-l-0"}],
            "newPartitions": [{"rowRange": {"endKeyOpen": "bQ=="}},
                              {"rowRange": {"startKeyClosed": "bQ=="}}]}}}) + "\n")
    rows = list(bigtable.parse_file(str(path), {}))
    assert not [r for r in rows if r["kind"] == "bad"], rows
    ends = [r for r in rows if r["kind"] == "partition_end"]
    assert ends and all(r["ts_ns"] is None for r in ends)
    assert json.loads(ends[0]["extra"])["close_time"] == "unknown"
    cache = _land(tmp_path, "bigtable", rows)
    for (ts,) in cache.con.execute(
            "SELECT end_ts FROM partitions UNION ALL SELECT start_ts FROM partitions "
            "UNION ALL SELECT start_timestamp FROM child_partitions_records").fetchall():
        assert ts is None or ts.year > 1970
