"""Datastream events (doc 001): JSON Lines and Avro, every source's metadata, order, duplicates,
freshness, bad files. Each test parses sample files and lands them in a DuckDB cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from spark_backend.analysis import systems
from spark_backend.cache.store import Cache
from spark_backend.formats import datastream
from spark_backend.model import records
from spark_backend.model.timestamps import parse_ns

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples" / "datastream"


def _cache(tmp_path, stream="ds"):
    cache = Cache(tmp_path / "cache.duckdb")
    cache.ensure_stream(stream, system=datastream.SYSTEM, source="file")
    return cache


def _import(cache, path, stream="ds", options=None):
    rows = list(datastream.parse_file(str(path), options or {}))
    pull = cache.begin_pull(stream, "file", None, None, None)
    table = pa.Table.from_batches([records.to_arrow_batch(rows)])
    return rows, cache.ingest(stream, pull, table, count_existing_as_duplicates=True)


def _records(cache, stream="ds"):
    cur = cache.con.execute(
        """SELECT d.record_key, d.partition_token, epoch_ns(d.commit_timestamp) AS ts,
                  epoch_ns(d.read_timestamp) AS read_ns, d.table_name, d.mod_type,
                  d.server_transaction_id, d.record_id, d.order_key, d.extra::VARCHAR AS extra,
                  d.copies, d.value_capture_type, d.column_types::VARCHAR AS column_types,
                  m.keys::VARCHAR AS keys, m.new_values::VARCHAR AS new_values,
                  m.old_values::VARCHAR AS old_values
           FROM data_change_records d JOIN mods m USING (stream, record_key)
           WHERE d.stream = ? ORDER BY d.order_key""",
        [stream],
    )
    names = [c[0] for c in cur.description]
    out = []
    for row in cur.fetchall():
        r = dict(zip(names, row, strict=True))
        for k in ("extra", "keys", "new_values", "old_values"):
            r[k] = json.loads(r[k])
        out.append(r)
    return out


ORACLE = [
    # uuid, source ts, read ts, mod_type, row_id, FIELD1, scn, rs_id, ssn
    ("d7989206-380f-0e81-8056-240501101100", "2019-11-07T02:15:39Z", "2019-11-07T07:37:16.808Z",
     "INSERT", "AAAPwRAALAAMzMBABD", "foo", 15869116216871, "0x0073c9.000a4e4c.01d0", 67),
    ("e6067366-1efc-0a10-a084-0d8701101101", "2019-11-07T02:17:39Z", "2019-11-07T07:37:18.808Z",
     "UPDATE", "AAAGYPAATAAPIC5AAB", None, 15869150473224, "0x006cf4.00056b26.0010", 0),
    ("c504f4bc-0ffc-4a1a-84df-6aba382fa651", "2019-11-07T02:19:39Z", "2019-11-07T07:37:20.808Z",
     "DELETE", "AAAGYPAATAAPIC5AAC", None, 158691504732555, "0x006cf4.00056b26.0011", 0),
]


def _check_oracle(rows):
    assert len(rows) == 3
    for r, (uuid, src, read, mod_type, row_id, field1, scn, rs_id, ssn) in zip(
        rows, ORACLE, strict=True
    ):
        assert r["record_id"] == uuid
        assert r["ts"] == parse_ns(src)
        assert r["read_ns"] == parse_ns(read)
        assert r["table_name"] == "SAMPLE.TBL"
        assert r["partition_token"] == "SAMPLE.TBL"
        assert r["mod_type"] == mod_type
        assert r["server_transaction_id"] is None
        assert r["copies"] == 1
        assert r["value_capture_type"] == "NEW_ROW"
        assert r["keys"] == {"ROWID": row_id}
        row = {"THIS_IS_MY_PK": "1231535353", "FIELD1": field1, "FIELD2": "TLV"}
        if mod_type == "DELETE":
            assert r["new_values"] == {} and r["old_values"] == row
        else:
            assert r["new_values"] == row and r["old_values"] == {}
        ex = r["extra"]
        assert ex["system"] == "datastream" and ex["source"] == "oracle" and ex["phase"] == "cdc"
        assert ex["read_method"] == "oracle-cdc-logminer"
        assert ex["stream_name"] == "projects/myProj/locations/myLoc/streams/Oracle-to-Source"
        assert ex["change_type"] == mod_type
        md = ex["source_metadata"]
        assert md["scn"] == scn and md["rs_id"] == rs_id and md["ssn"] == ssn
        assert md["row_id"] == row_id and md["schema"] == "ROOT" and md["table"] == "SAMPLE"
        assert md["is_deleted"] is (mod_type == "DELETE")
        assert r["order_key"].startswith(f"1|{scn:020d}|")
        assert r["order_key"].endswith(f"|{ssn:020d}|{uuid}")


def test_oracle_doc_example_json(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, SAMPLES / "oracle_events.jsonl")
    assert stats.data_change == 3 and stats.bad == 0 and stats.duplicates == 0
    assert [r["line"] for r in rows] == [1, 2, 3]
    got = _records(cache)
    _check_oracle(got)  # in the source's order: INSERT, UPDATE, DELETE (by scn)
    assert got[0]["extra"]["source_metadata"]["database"] == "DB1"
    assert got[0]["extra"]["source_timestamp"] == "2019-11-07T02:15:39"
    assert got[0]["extra"]["read_timestamp"] == "2019-11-07T07:37:16.808Z"


def test_oracle_doc_example_avro(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, SAMPLES / "oracle_events.avro")
    assert stats.data_change == 3 and stats.bad == 0
    assert [r["line"] for r in rows] == [1, 2, 3]
    got = _records(cache)
    _check_oracle(got)
    cols = json.loads(got[0]["column_types"])
    assert [c["name"] for c in cols] == ["THIS_IS_MY_PK", "FIELD1", "FIELD2"]
    assert cols[1]["type"] == ["null", "string"] and cols[0]["ordinal_position"] == 1
    assert got[0]["extra"]["schema_key"]
    assert got[0]["extra"]["sort_keys"][1] == "0x0073c9.000a4e4c.01d0"
    # the same events in JSON are the same records: all three count as redelivered
    _, again = _import(cache, SAMPLES / "oracle_events.jsonl")
    assert again.data_change == 0 and again.duplicates == 3


def test_mysql_backfill_binlog_order_and_duplicate(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, SAMPLES / "mysql_events.jsonl")
    assert stats.data_change == 4 and stats.duplicates == 1
    got = _records(cache)
    # backfill first, then binlog order: mysql-bin.000009:99999 < .000010:120 < .000010:7200
    assert [r["record_id"][-1] for r in got] == ["1", "2", "3", "4"]
    assert [r["mod_type"] for r in got] == ["INSERT", "INSERT", "UPDATE", "DELETE"]
    assert [r["extra"]["phase"] for r in got] == ["backfill", "cdc", "cdc", "cdc"]
    assert got[0]["order_key"].startswith("0|")
    assert got[1]["order_key"].startswith("1|mysql-bin." + "9".rjust(20, "0") + "|")
    assert got[2]["copies"] == 2 and sum(r["copies"] - 1 for r in got) == 1
    assert got[2]["keys"] == {"id": 7} and got[2]["new_values"] == {"status": "paid", "total": 10}
    assert got[2]["extra"]["change_type"] == "UPDATE-INSERT"
    assert got[3]["keys"] == {"id": 8} and got[3]["old_values"] == {"status": "new", "total": 25}
    assert all(r["server_transaction_id"] is None for r in got)


def test_postgresql_lsn_order_and_transactions(tmp_path):
    cache = _cache(tmp_path)
    _import(cache, SAMPLES / "postgresql_events.jsonl")
    got = _records(cache)
    assert [r["record_id"][-1] for r in got] == ["1", "2", "3"]
    assert [r["server_transaction_id"] for r in got] == ["7701", "7701", "7702"]
    assert got[0]["order_key"] < got[1]["order_key"] < got[2]["order_key"]
    assert got[0]["keys"] == {"id": 1} and got[2]["mod_type"] == "UPDATE"
    (n_tx,) = cache.con.execute(
        "SELECT count(DISTINCT server_transaction_id) FROM data_change_records WHERE stream='ds'"
    ).fetchone()
    assert n_tx == 2


def test_sqlserver_and_salesforce(tmp_path):
    cache = _cache(tmp_path)
    _import(cache, SAMPLES / "sqlserver_events.jsonl")
    _import(cache, SAMPLES / "salesforce_events.jsonl")
    got = {r["record_id"]: r for r in _records(cache)}
    cdc = got["c0000000-0000-0000-0000-000000000001"]
    assert cdc["keys"] == {"item_id": "X1"} and cdc["server_transaction_id"] == "0000:000003f1"
    assert cdc["extra"]["source"] == "sqlserver" and cdc["extra"]["phase"] == "cdc"
    assert "|0000000000000027:0000000000000b68:0000000000000002|" in cdc["order_key"]
    backfill = got["c0000000-0000-0000-0000-000000000002"]
    assert backfill["extra"]["phase"] == "backfill" and backfill["order_key"].startswith("0|")
    sf = got["d0000000-0000-0000-0000-000000000001"]
    assert sf["keys"] == {"Id": "001xx000003DGb2AAG"} and sf["table_name"] == "Account"
    assert sf["extra"]["source"] == "salesforce" and sf["mod_type"] == "UPDATE"


def test_freshness_and_anomalies(tmp_path):
    cache = _cache(tmp_path)
    _import(cache, SAMPLES / "oracle_events.jsonl")
    _import(cache, SAMPLES / "postgresql_events.jsonl")
    df = systems.freshness(cache.con, "ds")
    assert len(df) == 6
    oracle = df[df["table_name"] == "SAMPLE.TBL"].reset_index()
    assert oracle["lag_s"].tolist() == pytest.approx([19297.808, 19179.808, 19061.808])
    assert df["read_ns"].is_monotonic_increasing
    anomalies = systems.system_anomalies(cache.con, "ds", "datastream")
    kinds = {(a["kind"], a["partition"]) for a in anomalies}
    assert ("freshness_lag", "SAMPLE.TBL") in kinds
    assert ("freshness_lag", "public.accounts") not in kinds
    assert systems.stream_watermark(cache.con, "ds", "datastream") is None


def test_order_conflict_anomaly(tmp_path):
    lines = (SAMPLES / "mysql_events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    late = dict(events[3])  # DELETE of id 8, later in the binlog ...
    late["uuid"] = "a0000000-0000-0000-0000-00000000000f"
    late["source_metadata"] = {**late["source_metadata"], "log_position": 9000}
    late["source_timestamp"] = "2024-05-01T09:59:00.000Z"  # ... but stamped earlier
    path = tmp_path / "conflict.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events[:4] + [late]))
    cache = _cache(tmp_path)
    _import(cache, path)
    anomalies = systems.system_anomalies(cache.con, "ds", "datastream")
    conflicts = [a for a in anomalies if a["kind"] == "order_conflict"]
    assert len(conflicts) == 1 and conflicts[0]["partition"] == "shop.orders"
    assert "a0000000-0000-0000-0000-00000000000f" in conflicts[0]["detail"]


def test_bad_files(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, SAMPLES / "bad.jsonl")
    assert stats.data_change == 2 and stats.bad == 2
    q = cache.con.execute(
        "SELECT origin, line, reason FROM quarantine WHERE stream = 'ds' ORDER BY line"
    ).fetchall()
    assert [line for _, line, _ in q] == [2, 3]
    assert all(origin.endswith("bad.jsonl") for origin, _, _ in q)
    assert q[0][2].startswith("not JSON") and "truncated" in q[0][2]
    assert q[1][2].startswith("not a Datastream event") and "--format cockroachdb" in q[1][2]

    rows = list(datastream.parse_file(str(SAMPLES / "bad_no_schema.avro"), {}))
    assert len(rows) == 1 and rows[0]["kind"] == "bad"
    assert rows[0]["origin"].endswith("bad_no_schema.avro")
    assert "schema" in json.loads(rows[0]["extra"])["reason"]

    # an Avro file cut short: the records before the cut are kept, then one bad row
    data = (SAMPLES / "oracle_events.avro").read_bytes()
    cut = tmp_path / "cut.avro"
    cut.write_bytes(data[: len(data) - 40])
    rows = list(datastream.parse_file(str(cut), {}))
    assert rows[-1]["kind"] == "bad" and "cut short" in json.loads(rows[-1]["extra"])["reason"]
    assert all(r["kind"] == "data_change" for r in rows[:-1])

    # a file of another format
    other = tmp_path / "dogs.txt"
    other.write_text('[1] {"after": null}\n')
    rows = list(datastream.parse_file(str(other), {}))
    assert [r["kind"] for r in rows] == ["bad"]
    assert "neither a Datastream JSON Lines file" in json.loads(rows[0]["extra"])["reason"]


def test_gzip_and_keys_option(tmp_path):
    import gzip

    gz = tmp_path / "oracle.jsonl.gz"
    with open(SAMPLES / "oracle_events.jsonl", "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    rows = list(datastream.parse_file(str(gz), {"keys": "THIS_IS_MY_PK"}))
    assert len(rows) == 3
    mods = json.loads(rows[0]["mods"])
    assert mods == [{"keys": {"THIS_IS_MY_PK": "1231535353"},
                     "new_values": {"FIELD1": "foo", "FIELD2": "TLV"}, "old_values": {}}]
