"""CockroachDB changefeed messages (doc 002): every envelope, updated/resolved, deletes,
at-least-once duplicates, per-key ordering, webhook batches, cloud storage files, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from spark_backend.analysis import systems
from spark_backend.cache.store import Cache
from spark_backend.formats import cockroachdb
from spark_backend.model import records

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples" / "cockroachdb"
CLOUD_FILE = "202311271644562969433000000000000-56087568dba1e6b8-1-72-00000000-employees-1.ndjson"
UPDATED = [
    "1701102296662969433.0000000000", "1701102311425045162.0000000000",
    "1701102305519323705.0000000000", "1701102316388801052.0000000000",
    "1701102320607990564.0000000000", "1701102325724272373.0000000000",
    "1701102330377135318.0000000000", "1701102561022789676.0000000000",
]


def _cache(tmp_path, stream="crdb"):
    cache = Cache(tmp_path / "cache.duckdb")
    cache.ensure_stream(stream, system=cockroachdb.SYSTEM, source="file")
    return cache


def _import(cache, name, options=None, stream="crdb"):
    path = name if isinstance(name, Path) else SAMPLES / name
    rows = list(cockroachdb.parse_file(str(path), options or {}))
    pull = cache.begin_pull(stream, "file", None, None, None)
    stats = cache.ingest(stream, pull, pa.Table.from_batches([records.to_arrow_batch(rows)]),
                         count_existing_as_duplicates=True)
    return rows, stats


def _records(cache, stream="crdb"):
    cur = cache.con.execute(
        """SELECT epoch_ns(d.commit_timestamp) AS ts, d.table_name, d.mod_type, d.record_id,
                  d.order_key, d.extra::VARCHAR AS extra, d.copies, d.partition_token,
                  d.server_transaction_id, m.keys::VARCHAR AS keys,
                  m.new_values::VARCHAR AS new_values, m.old_values::VARCHAR AS old_values
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


def test_updated_and_resolved(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, "employees_updated.ndjson", {"table": "employees"})
    assert stats.data_change == 8 and stats.heartbeats == 2 and stats.duplicates == 0
    got = _records(cache)
    # the changefeed's own order (updated), not the delivery order
    assert [r["extra"]["updated"] for r in got] == sorted(UPDATED)
    for r in got:
        assert r["ts"] == int(r["extra"]["updated"].split(".")[0])
        assert r["table_name"] == "employees" and r["partition_token"] == "changefeed"
        assert r["server_transaction_id"] is None
        assert r["record_id"] == f"crdb|employees|{json.dumps(r['keys'], separators=(',', ':'))}|" \
            + r["order_key"].split("|")[0]
        assert r["extra"]["envelope"] == "wrapped" and r["extra"]["mod_type_inferred"] is True
    terry = [r for r in got if r["keys"] == {"key": [1]}]
    assert [r["new_values"]["name"] for r in terry] == ["Terry", "Terri", "Terrence"]
    assert [r["mod_type"] for r in terry] == ["INSERT", "UPDATE", "UPDATE"]
    assert terry[0]["new_values"] == {"id": 1, "name": "Terry", "office": "new york city"}
    assert terry[0]["order_key"].startswith("01701102296662969433.0000000000|")
    hb = cache.con.execute(
        "SELECT partition_token, epoch_ns(timestamp), extra ->> 'resolved' FROM heartbeats "
        "WHERE stream = 'crdb' ORDER BY timestamp"
    ).fetchall()
    assert hb == [("changefeed", 1701102330377135318, "1701102330377135318.0000000000"),
                  ("changefeed", 1701102561022789676, "1701102561022789676.0000000001")]
    assert systems.stream_watermark(cache.con, "crdb", "cockroachdb") == (1701102561022789676, None)
    assert systems.system_anomalies(cache.con, "crdb", "cockroachdb") == []


def test_at_least_once_duplicates(tmp_path):
    cache = _cache(tmp_path)
    _, stats = _import(cache, "employees_at_least_once.ndjson", {"table": "employees"})
    assert stats.data_change == 8 and stats.duplicates == 2
    got = {r["extra"]["updated"]: r for r in _records(cache)}
    assert got[UPDATED[3]]["copies"] == 2 and got[UPDATED[4]]["copies"] == 2
    assert sum(r["copies"] for r in got.values()) == 10
    # redelivery is not an ordering anomaly
    assert systems.system_anomalies(cache.con, "crdb", "cockroachdb") == []
    # importing the clean feed again: everything is a copy already seen
    _, again = _import(cache, "employees_updated.ndjson", {"table": "employees"})
    assert again.data_change == 0 and again.duplicates == 8


def test_key_back_in_time(tmp_path):
    cache = _cache(tmp_path)
    _import(cache, "employees_back_in_time.ndjson", {"table": "employees"})
    anomalies = systems.system_anomalies(cache.con, "crdb", "cockroachdb")
    back = [a for a in anomalies if a["kind"] == "key_back_in_time"]
    assert len(back) == 1
    assert back[0]["partition"] == "changefeed"
    assert back[0]["at"] == "2023-11-27T16:25:11.425045162Z"
    assert '{"key":[1]}' in back[0]["detail"] and "line 3" in back[0]["detail"]
    below = {a["at"] for a in anomalies if a["kind"] == "below_resolved"}
    assert below == {"2023-11-27T16:25:11.425045162Z", "2023-11-27T16:25:05.519323705Z"}


def test_wrapped_envelopes(tmp_path):
    rows = list(cockroachdb.parse_file(str(SAMPLES / "wrapped_cloud_storage.ndjson"),
                                       {"table": "vehicles"}))
    (r,) = rows
    mod = json.loads(r["mods"])[0]
    assert mod["keys"] == {"key": ["seattle", "68ee1f95-3137-48e2-8ce3-34ac2d18c7c8"]}
    assert mod["new_values"]["current_location"] == "86359 Jeffrey Ranch"
    assert mod["new_values"]["ext"] == {"color": "yellow"} and mod["old_values"] == {}
    assert r["mod_type"] == "INSERT" and r["table_name"] == "vehicles"
    assert r["ts_ns"] is None  # the sample carries no time: unknown, never 1970
    assert json.loads(r["extra"])["timestamp"] == "none"

    kafka = list(cockroachdb.parse_file(str(SAMPLES / "wrapped_kafka.ndjson"), {}))
    assert json.loads(kafka[0]["mods"])[0]["keys"] == {}
    assert json.loads(kafka[1]["mods"])[0]["keys"] == {
        "key": ["washington dc", "298cc7a0-de6b-4659-ae57-eaa2de9d99c3"]}
    assert kafka[0]["table_name"] is None

    (diff,) = cockroachdb.parse_file(str(SAMPLES / "wrapped_diff.ndjson"), {"table": "rides"})
    mod = json.loads(diff["mods"])[0]
    assert diff["mod_type"] == "UPDATE" and diff["value_capture_type"] == "NEW_ROW_AND_OLD_VALUES"
    assert mod["new_values"]["start_address"] == "2 Michael Field"
    assert mod["old_values"]["start_address"] == "5 Michael Field"
    assert mod["new_values"]["revenue"] == 25.0
    assert json.loads(diff["extra"])["diff"] is True


def test_bare_key_only_row_and_kafka_print(tmp_path):
    bare = list(cockroachdb.parse_file(str(SAMPLES / "bare.ndjson"), {"table": "vehicles"}))
    m0 = json.loads(bare[0]["mods"])[0]
    assert m0["keys"] == {"key": ["washington dc", "cd48e501-e86d-4019-9923-2fc9a964b264"]}
    assert "__crdb__" not in m0["new_values"] and m0["new_values"]["type"] == "bike"
    assert json.loads(bare[0]["extra"])["envelope"] == "bare"
    assert bare[1]["table_name"] == "vehicles"
    assert json.loads(bare[1]["mods"])[0]["new_values"] == {"city": "los angeles",
                                                            "type": "skateboard"}

    (q,) = cockroachdb.parse_file(str(SAMPLES / "cdc_query.ndjson"), {})
    assert json.loads(q["extra"])["envelope"] == "row"

    ko = list(cockroachdb.parse_file(str(SAMPLES / "key_only.ndjson"), {}))
    assert [r["mod_type"] for r in ko] == ["UPDATE", "UPDATE"]
    assert json.loads(ko[0]["mods"])[0]["keys"] == {
        "key": ["boston", "22222222-2222-4200-8000-000000000002"]}
    assert ko[1]["table_name"] == "users"
    assert json.loads(ko[1]["mods"])[0]["keys"] == {
        "key": ["seattle", "fff726cc-13b3-475f-ad92-a21cafee5d3f"]}
    assert all(json.loads(r["extra"])["envelope"] == "key_only" for r in ko)

    (row,) = cockroachdb.parse_file(str(SAMPLES / "row.ndjson"), {"table": "vehicles"})
    assert json.loads(row["mods"])[0]["new_values"]["id"] == "d3b37607-1e9f-4e25-b772-efb9374b08e3"

    dogs = list(cockroachdb.parse_file(str(SAMPLES / "office_dogs_kafka.txt"),
                                       {"table": "office_dogs", "primary_key": "id"}))
    assert [r["mod_type"] for r in dogs] == ["INSERT", "DELETE"]
    assert [json.loads(r["mods"])[0] for r in dogs] == [
        {"keys": {"id": 1}, "new_values": {"name": "Petee"}, "old_values": {}},
        {"keys": {"id": 1}, "new_values": {}, "old_values": {}},
    ]


def test_schema_change_copies_are_duplicates(tmp_path):
    cache = _cache(tmp_path)
    _, stats = _import(cache, "office_dogs_schema_change.txt", {"table": "office_dogs"})
    assert stats.data_change == 6 and stats.duplicates == 3


def test_webhook_batch(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, "webhook_batch.json")
    assert stats.data_change == 2 and stats.bad == 0
    assert [json.loads(r["extra"])["batch_index"] for r in rows] == [0, 1]
    assert all(r["line"] == 1 and r["table_name"] == "foo" for r in rows)
    assert [json.loads(r["mods"])[0]["new_values"]["b"] for r in rows] == ["a", "b"]
    assert [r["mod_type"] for r in rows] == ["INSERT", "UPDATE"]
    bad = tmp_path / "short.json"
    bad.write_text('{"payload": [{"after": {"a": 1}, "key": [1], "topic": "foo"}], "length": 2}\n')
    rows = list(cockroachdb.parse_file(str(bad), {}))
    assert [r["kind"] for r in rows] == ["data_change", "bad"]
    assert "length 2 but holds 1" in json.loads(rows[1]["extra"])["reason"]


def test_cloud_storage_files(tmp_path):
    cache = _cache(tmp_path)
    _, stats = _import(cache, CLOUD_FILE)
    assert stats.data_change == 3
    _, stats = _import(cache, "202311271645303771353180000000000.RESOLVED")
    assert stats.heartbeats == 1
    got = _records(cache)
    assert {r["table_name"] for r in got} == {"employees"}  # from the file name
    delete = [r for r in got if r["mod_type"] == "DELETE"]
    assert len(delete) == 1 and delete[0]["keys"] == {"key": [2]}
    assert delete[0]["extra"]["updated"] == "1701102330000000000.0000000002"
    assert delete[0]["order_key"].startswith("01701102330000000000.0000000002|")
    assert systems.stream_watermark(cache.con, "crdb", "cockroachdb") == (1701102330377135318, None)


def test_bad_file(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, "bad.ndjson", {"table": "employees"})
    assert stats.data_change == 2 and stats.bad == 4
    q = cache.con.execute(
        "SELECT line, reason FROM quarantine WHERE stream = 'crdb' ORDER BY line"
    ).fetchall()
    assert [line for line, _ in q] == [2, 3, 4, 5]
    assert {o for (o,) in cache.con.execute("SELECT origin FROM quarantine").fetchall()} == {
        str(SAMPLES / "bad.ndjson")}
    assert "not JSON" in q[0][1]
    assert "unknown envelope" in q[1][1] and "unknown envelope" in q[2][1]
    assert "Datastream event" in q[3][1]
    avro = tmp_path / "x.avro"
    avro.write_bytes(b"Obj\x01rest")
    (row,) = cockroachdb.parse_file(str(avro), {})
    assert row["kind"] == "bad" and "Avro" in json.loads(row["extra"])["reason"]
