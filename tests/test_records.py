"""Decoding every example record of the reference doc, in both dialects' shapes."""

from __future__ import annotations

import json

import pytest

from spark_backend.model.errors import BadInput
from spark_backend.model.records import RecordError, from_change_record
from spark_backend.model.timestamps import format_ns, parse_ns
from spark_backend.spanner.reader import _decoder, query_text, validate_stream_name

DOC_UPDATE = {
    "commit_timestamp": "2022-09-27T12:30:00.123456Z",
    "record_sequence": "00000000",
    "server_transaction_id": "6329047911",
    "is_last_record_in_transaction_in_partition": True,
    "table_name": "AccountBalance",
    "column_types": [
        {"name": "AccountId", "type": {"code": "STRING"}, "is_primary_key": True,
         "ordinal_position": 1},
        {"name": "LastUpdate", "type": {"code": "TIMESTAMP"}, "is_primary_key": False,
         "ordinal_position": 2},
        {"name": "Balance", "type": {"code": "INT"}, "is_primary_key": False,
         "ordinal_position": 3},
    ],
    "mods": [{
        "keys": {"AccountId": "Id1"},
        "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": 1000},
        "old_values": {"LastUpdate": "2022-09-26T11:28:00.189413Z", "Balance": 1500},
    }],
    "mod_type": "UPDATE",
    "value_capture_type": "OLD_AND_NEW_VALUES",
    "number_of_records_in_transaction": 2,
    "number_of_partitions_in_transaction": 2,
    "transaction_tag": "app=banking,env=prod,action=update",
    "is_system_transaction": False,
}


def _with(**changes):
    record = json.loads(json.dumps(DOC_UPDATE))
    record.update(changes)
    return record


# The doc's four value capture type examples: what new_values / old_values hold.
VALUE_CAPTURE_EXAMPLES = {
    "OLD_AND_NEW_VALUES": DOC_UPDATE["mods"],
    "NEW_VALUES": [{"keys": {"AccountId": "Id1"},
                    "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z"},
                    "old_values": {}}],
    "NEW_ROW": [{"keys": {"AccountId": "Id1"},
                 "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z", "Balance": 1000},
                 "old_values": {}}],
    "NEW_ROW_AND_OLD_VALUES": [{"keys": {"AccountId": "Id1"},
                                "new_values": {"LastUpdate": "2022-09-27T12:30:00.123456Z",
                                               "Balance": 1000},
                                "old_values": {"LastUpdate": "2022-09-26T11:28:00.189413Z"}}],
}


def test_data_change_record_fields():
    row = from_change_record({"data_change_record": DOC_UPDATE}, "tok-7")
    assert row["kind"] == "data_change"
    assert row["partition_token"] == "tok-7"
    assert format_ns(row["ts_ns"]) == "2022-09-27T12:30:00.123456Z"
    assert row["record_sequence"] == "00000000"
    assert row["server_transaction_id"] == "6329047911"
    assert row["is_last_record_in_transaction_in_partition"] is True
    assert row["table_name"] == "AccountBalance"
    assert row["mod_type"] == "UPDATE"
    assert row["value_capture_type"] == "OLD_AND_NEW_VALUES"
    assert row["number_of_records_in_transaction"] == 2
    assert row["number_of_partitions_in_transaction"] == 2
    assert row["transaction_tag"] == "app=banking,env=prod,action=update"
    assert row["is_system_transaction"] is False
    assert json.loads(row["column_types"])[2] == {
        "name": "Balance", "type": {"code": "INT"}, "is_primary_key": False,
        "ordinal_position": 3}
    assert json.loads(row["mods"]) == DOC_UPDATE["mods"]


@pytest.mark.parametrize("capture", sorted(VALUE_CAPTURE_EXAMPLES))
def test_every_value_capture_type(capture):
    record = _with(value_capture_type=capture, mods=VALUE_CAPTURE_EXAMPLES[capture])
    row = from_change_record({"data_change_record": record}, "t")
    assert row["value_capture_type"] == capture
    assert json.loads(row["mods"]) == VALUE_CAPTURE_EXAMPLES[capture]


def test_heartbeat_and_child_partitions_records():
    hb = from_change_record({"heartbeat_record": {"timestamp": "2022-09-27T12:35:00.312486Z"}},
                            "t")
    assert (hb["kind"], format_ns(hb["ts_ns"])) == ("heartbeat", "2022-09-27T12:35:00.312486Z")
    cp = from_change_record({"child_partitions_record": {
        "start_timestamp": "2022-09-27T12:40:00.562986Z", "record_sequence": "00000001",
        "child_partitions": [{"token": "child_token_1",
                              "parent_partition_tokens": ["parent_token_1", "parent_token_2"]}],
    }}, "parent_token_1")
    assert cp["kind"] == "child_partitions"
    assert format_ns(cp["ts_ns"]) == "2022-09-27T12:40:00.562986Z"
    assert cp["record_sequence"] == "00000001"
    assert json.loads(cp["child_partitions"]) == [
        {"token": "child_token_1", "parent_partition_tokens": ["parent_token_1", "parent_token_2"]}]


def test_initial_query_children_have_no_parents():
    # The doc writes the first generation's parents as [NULL].
    cp = from_change_record({"child_partitions_record": {
        "start_timestamp": "2022-05-01T09:00:01Z", "record_sequence": "1000012389",
        "child_partitions": [{"token": "child_token_1", "parent_partition_tokens": [None]},
                             {"token": "child_token_2", "parent_partition_tokens": [None]}],
    }}, None)
    assert cp["partition_token"] is None
    assert [c["parent_partition_tokens"] for c in json.loads(cp["child_partitions"])] == [[], []]


def test_nanosecond_precision_kept():
    ns = parse_ns("2022-09-27T12:30:00.123456789Z")
    assert ns % 1000 == 789
    assert format_ns(ns) == "2022-09-27T12:30:00.123456789Z"


def test_postgresql_shape_with_string_numbers_and_offsets():
    # The emulator's PostgreSQL JSON: "+00:00" timestamps, JSON numbers for counters.
    record = _with(commit_timestamp="2022-09-27T12:30:00.123456+00:00",
                   number_of_records_in_transaction="2")
    row = from_change_record({"data_change_record": record}, "t")
    assert format_ns(row["ts_ns"]) == "2022-09-27T12:30:00.123456Z"
    assert row["number_of_records_in_transaction"] == 2


def test_googlesql_positional_structs_are_named_from_metadata():
    """The GoogleSQL row as the emulator sends it: STRUCTs as lists, JSON as strings."""
    from pathlib import Path

    from google.cloud.spanner_v1 import ResultSetMetadata

    shapes = Path(__file__).parent.parent / "fixtures" / "emulator_shapes"
    meta = json.loads((shapes / "googlesql_metadata.json").read_text())
    values = json.loads((shapes / "googlesql_values.json").read_text())
    metadata = ResultSetMetadata.from_json(json.dumps(
        {"rowType": {"fields": [_camel(meta["row_type"]["fields"][0])]}}))
    decode = _decoder(metadata.row_type.fields, "googlesql")
    record = decode([values["partition_0"][0]])
    dc = record["data_change_record"]
    assert dc["table_name"] == "Accounts" and dc["mod_type"] == "UPDATE"
    assert dc["column_types"][0]["name"] == "AccountId"
    row = from_change_record(record, "p0")
    assert json.loads(row["mods"])[0]["keys"] == {"AccountId": "a1"}
    assert json.loads(row["column_types"])[0]["type"] == {"code": "STRING"}
    heartbeat = decode([values["partition_1"][0]])
    assert from_change_record(heartbeat, "p1")["kind"] == "heartbeat"
    initial = decode([values["initial_query"][0]])
    assert from_change_record(initial, None)["kind"] == "child_partitions"


def _camel(obj):
    """The captured metadata uses proto-plus names (type_); the JSON mapping wants camelCase."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            key = {"type_": "type", "array_element_type": "arrayElementType",
                   "struct_type": "structType", "type_annotation": "typeAnnotation"}.get(k, k)
            out[key] = _camel(v)
        return out
    if isinstance(obj, list):
        return [_camel(v) for v in obj]
    return obj


@pytest.mark.parametrize("bad,reason", [
    ({"data_change_record": _with(mod_type="UPSERT")}, "mod_type 'UPSERT'"),
    ({"data_change_record": _with(commit_timestamp="yesterday")}, "is not a timestamp"),
    ({"heartbeat_record": {}}, "malformed change record"),
    ({"something_else": {}}, "expected one of"),
])
def test_malformed_records_say_what_is_wrong(bad, reason):
    with pytest.raises(RecordError, match=reason):
        from_change_record(bad, "t")


def test_stream_name_validated_before_it_reaches_the_query():
    assert query_text("googlesql", "SingersNameStream").startswith(
        "SELECT ChangeRecord FROM READ_SingersNameStream (")
    assert query_text("postgresql", "SingersNameStream") == (
        'SELECT * FROM "spanner"."read_json_SingersNameStream" ($1, $2, $3, $4, null)')
    for bad in ["x; DROP TABLE t", "1abc", "a b", "", "x" * 200, 'a"b']:
        with pytest.raises(BadInput, match="not a valid change stream name"):
            validate_stream_name(bad)
