"""Bigtable change stream records (ReadChangeStreamResponse, JSON mapping): data changes with
chunks, user vs garbage collection, heartbeats, close-stream split/merge DAG, watermarks, bad."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pyarrow as pa

from spark_backend.analysis import systems
from spark_backend.cache.store import Cache
from spark_backend.formats import bigtable
from spark_backend.model import records
from spark_backend.model.timestamps import parse_ns

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples" / "bigtable"


def _cache(tmp_path, stream="bt"):
    cache = Cache(tmp_path / "cache.duckdb")
    cache.ensure_stream(stream, system=bigtable.SYSTEM, source="file")
    return cache


def _import(cache, name, options=None, stream="bt"):
    path = name if isinstance(name, Path) else SAMPLES / name
    rows = list(bigtable.parse_file(str(path), options or {}))
    pull = cache.begin_pull(stream, "file", None, None, None)
    stats = cache.ingest(stream, pull, pa.Table.from_batches([records.to_arrow_batch(rows)]),
                         count_existing_as_duplicates=True)
    return rows, stats


def test_split_merge_dag(tmp_path):
    cache = _cache(tmp_path)
    _, stats = _import(cache, "split_merge.jsonl")
    assert stats.bad == 0 and stats.data_change == 5 and stats.duplicates == 1
    edges = set(cache.con.execute(
        "SELECT parent, child FROM edges WHERE stream = 'bt'").fetchall())
    assert edges == {(None, "[,)"), ("[,)", "[,m)"), ("[,)", "[m,)"),
                     ("[,m)", "[,)#2"), ("[m,)", "[,)#2")}
    parts = {r[0]: r[1:] for r in cache.con.execute(
        "SELECT token, state, epoch_ns(start_ts), epoch_ns(end_ts), epoch_ns(watermark) "
        "FROM partitions WHERE stream = 'bt'").fetchall()}
    t = parse_ns
    assert parts["[,)"] == ("finished", t("2024-05-01T10:00:00Z"), t("2024-05-01T10:00:03Z"),
                            t("2024-05-01T10:00:03Z"))
    assert parts["[,m)"][:3] == ("finished", t("2024-05-01T10:00:03Z"), t("2024-05-01T10:00:08Z"))
    assert parts["[m,)"][:3] == ("finished", t("2024-05-01T10:00:03Z"), t("2024-05-01T10:00:08Z"))
    assert parts["[,)#2"] == ("open", t("2024-05-01T10:00:08Z"), None, t("2024-05-01T10:00:09Z"))
    (cp,) = cache.con.execute(
        "SELECT child_partitions::VARCHAR FROM child_partitions_records WHERE stream = 'bt' "
        "AND partition_token = '[,)'").fetchone()
    assert json.loads(cp) == [{"parent_partition_tokens": ["[,)"], "token": "[,m)"},
                              {"parent_partition_tokens": ["[,)"], "token": "[m,)"}]
    # the stream-wide low watermark: the only open partition's estimated low watermark
    assert systems.stream_watermark(cache.con, "bt", "bigtable") == (
        t("2024-05-01T10:00:08.5Z"), "[,)#2")


def test_data_change_fields(tmp_path):
    cache = _cache(tmp_path)
    rows, _ = _import(cache, "split_merge.jsonl")
    got = {r[0]: r[1:] for r in cache.con.execute(
        """SELECT d.record_id, d.partition_token, epoch_ns(d.commit_timestamp), d.table_name,
                  d.mod_type, d.order_key, d.copies, d.extra::VARCHAR, m.keys::VARCHAR,
                  m.new_values::VARCHAR, d.server_transaction_id
           FROM data_change_records d JOIN mods m USING (stream, record_key)
           WHERE d.stream = 'bt'""").fetchall()}
    apple = got["bt|c1|1714557601000000001|1|" + base64.b64encode(b"apple").decode()]
    assert apple[:5] == ("[,)", 1714557601000000001, "fruits", "UPDATE",
                         "01714557601000000001|2147483649|c1|6170706c65")
    extra = json.loads(apple[6])
    assert extra["type"] == "USER" and extra["source_cluster_id"] == "c1"
    assert extra["commit_timestamp"] == "2024-05-01T10:00:01.000000001Z"
    assert extra["tiebreaker"] == 1 and extra["token"] == "tok-w-1"
    assert extra["estimated_low_watermark"] == "2024-05-01T10:00:00.500000Z"
    assert extra["mutations"][0]["set_cell"]["family_name"] == "cf"
    assert json.loads(apple[7]) == {"row_key": "apple"}
    assert json.loads(apple[8]) == {"cf:color": "red"} and apple[9] is None

    banana = got["bt|c1|1714557604000000000|0|" + base64.b64encode(b"banana").decode()]
    assert json.loads(banana[8]) == {"cf:blob": "0123456789" * 3}  # two chunks joined
    assert json.loads(banana[6])["messages"] == 2

    pear = got["bt|c2|1714557605000000000|-3|" + base64.b64encode(b"pear").decode()]
    assert pear[3] == "DELETE" and pear[4].startswith("01714557605000000000|2147483645|")
    assert json.loads(pear[8]) == {}

    plum = got["bt|c2|1714557606000000000|0|" + base64.b64encode(b"plum").decode()]
    assert json.loads(plum[6])["type"] == "GARBAGE_COLLECTION"
    assert plum[3] == "UPDATE" and json.loads(plum[8]) == {"cf:color": None}
    assert plum[5] == 2  # redelivered once

    hb = cache.con.execute(
        "SELECT partition_token, epoch_ns(timestamp), extra ->> 'source' FROM heartbeats "
        "WHERE stream = 'bt' AND partition_token = '[,)' ORDER BY timestamp").fetchall()
    assert hb == [("[,)", parse_ns("2024-05-01T10:00:00.5Z"), "data_change"),
                  ("[,)", parse_ns("2024-05-01T10:00:02Z"), "heartbeat")]
    ends = [r for r in rows if r["kind"] == "partition_end"]
    first = json.loads(ends[0]["extra"])
    assert first["state"] == "finished" and first["status"]["code"] == 11
    assert first["continuation_tokens"] == [{"partition": "[,m)", "token": "tok-l-0"},
                                            {"partition": "[m,)", "token": "tok-r-0"}]


def test_stalled_partition(tmp_path):
    cache = _cache(tmp_path)
    _, stats = _import(cache, "stalled.jsonl")
    assert stats.duplicates == 0  # a stalled partition's repeated watermark is not a copy
    wm = systems.stream_watermark(cache.con, "bt", "bigtable")
    assert wm == (parse_ns("2024-05-01T10:01:00Z"), "[m,)")
    anomalies = systems.system_anomalies(cache.con, "bt", "bigtable", stall_after_s=60)
    assert [(a["kind"], a["partition"], a["at"]) for a in anomalies] == [
        ("stalled_watermark", "[m,)", "2024-05-01T10:01:00.000000Z")]
    assert "240.0s behind" in anomalies[0]["detail"]


def test_bare_responses(tmp_path):
    rows = list(bigtable.parse_file(str(SAMPLES / "bare_responses.jsonl"), {"table": "fruits"}))
    assert [r["kind"] for r in rows] == ["heartbeat", "data_change", "heartbeat"]
    assert {r["partition_token"] for r in rows} == {"[m,)"}
    dc = rows[1]
    assert dc["ts_ns"] == parse_ns("2024-05-01T10:00:01.123456789Z")
    assert dc["table_name"] == "fruits"
    assert json.loads(dc["mods"])[0]["new_values"] == {"cf:color": "yellow"}
    # with no partition named anywhere, bare responses belong to the whole table
    lone = tmp_path / "lone.jsonl"
    lone.write_text((SAMPLES / "bare_responses.jsonl").read_text().splitlines()[1] + "\n")
    (r,) = [x for x in bigtable.parse_file(str(lone), {}) if x["kind"] == "data_change"]
    assert r["partition_token"] == "[,)"


def test_render_partition_escapes():
    from spark_backend.formats.bigtable import render_key

    assert render_key(b"a,b") == "a\\x2cb"
    assert render_key(b"\x00z") == "\\x00z"
    assert render_key(b"user#1") == "user#1"


def test_bad_file(tmp_path):
    cache = _cache(tmp_path)
    rows, stats = _import(cache, "bad.jsonl")
    assert stats.bad == 6 and stats.data_change == 1
    q = cache.con.execute(
        "SELECT line, reason FROM quarantine WHERE stream = 'bt' ORDER BY line").fetchall()
    assert [line for line, _ in q] == [2, 3, 4, 5, 6, 8]
    assert {o for (o,) in cache.con.execute("SELECT origin FROM quarantine").fetchall()} == {
        str(SAMPLES / "bad.jsonl")}
    assert "not JSON" in q[0][1]
    assert 'no field named "colour"' in q[1][1]
    assert "CONTINUATION" in q[2][1]
    assert "Datastream event" in q[3][1]
    assert "without estimated_low_watermark" in q[4][1]
    assert "never finished" in q[5][1]
