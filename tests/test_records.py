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


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00.000000Z", "0999-06-01T07:08:09.000010Z",
                                  "9999-12-31T23:59:59.999999999Z",
                                  "1970-01-01T00:00:00.000000Z"])
def test_format_ns_writes_four_digit_years_that_read_back(text):
    from spark_backend.model.timestamps import coerce_ns

    assert format_ns(coerce_ns(text)) == text


def test_postgresql_shape_with_string_numbers_and_offsets():
    # The emulator's PostgreSQL JSON: "+00:00" timestamps, JSON numbers for counters.
    record = _with(commit_timestamp="2022-09-27T12:30:00.123456+00:00",
                   number_of_records_in_transaction="2")
    row = from_change_record({"data_change_record": record}, "t")
    assert format_ns(row["ts_ns"]) == "2022-09-27T12:30:00.123456Z"
    assert row["number_of_records_in_transaction"] == 2


def test_googlesql_positional_structs_are_named_from_metadata():
    """The GoogleSQL row as the emulator sends it: STRUCTs as lists, JSON as strings."""
    fields, values = _gsql_shapes()
    decode = _decoder(fields, "googlesql")
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


# --- the direct decoder of GoogleSQL rows (reader._row_decoder) against the general way -------


def _gsql_shapes():
    from pathlib import Path

    from google.cloud.spanner_v1 import ResultSetMetadata

    shapes = Path(__file__).parent.parent / "fixtures" / "emulator_shapes"
    meta = json.loads((shapes / "googlesql_metadata.json").read_text())
    values = json.loads((shapes / "googlesql_values.json").read_text())
    metadata = ResultSetMetadata.from_json(json.dumps(
        {"rowType": {"fields": [_camel(meta["row_type"]["fields"][0])]}}))
    return metadata.row_type.fields, values


def _value(obj):
    from google.protobuf import json_format, struct_pb2

    return json_format.ParseDict(obj, struct_pb2.Value())


def _both_ways(fields, obj, token="p0"):
    """The general way's row (decode, then ``to_row``) and the row decoder's, or the
    ``RecordError`` text of each."""
    from spark_backend.spanner.reader import PartitionMode, _row_decoder, to_row

    row = [_value(obj)]
    out = []
    for way in (lambda: to_row(_decoder(fields, "googlesql")(row), token,
                               PartitionMode.IMMUTABLE),
                lambda: _row_decoder(fields, "googlesql", token)(row)):
        try:
            out.append(way())
        except RecordError as e:
            out.append(("RecordError", str(e)))
    return out


def test_direct_decoder_reads_the_emulators_rows_as_the_general_way():
    from spark_backend.spanner.reader import _fast_gsql, _field_type

    fields, values = _gsql_shapes()
    fast = _fast_gsql(_field_type(fields[0]), "p0")
    assert fast is not None, "the emulator's metadata has the doc's shape"
    kinds = []
    for name in ("initial_query", "partition_0", "partition_1"):
        for obj in values[name]:
            general, direct = _both_ways(fields, obj)
            assert direct == general and list(direct) == list(general)
            row = fast(_value(obj))
            if general["kind"] in ("data_change", "heartbeat"):
                assert row == general  # the direct way, not the general one behind it
            else:
                assert row is None  # child partitions: the general way
            kinds.append(general["kind"])
    assert {"data_change", "heartbeat", "child_partitions"} <= set(kinds)


def _change_with(index, value):
    """The emulator's data change row with its record's field ``index`` set to ``value``."""
    _, values = _gsql_shapes()
    obj = json.loads(json.dumps(values["partition_0"][0]))
    obj[0][0][0][index] = value
    return obj


@pytest.mark.parametrize("index,value", [
    (0, None), (0, "yesterday"), (0, "2026-11-21T19:45:47.8446891234Z"), (0, True),
    (0, "2026-11-21T19:45:47Z"), (0, " 2026-11-21T19:45:47.5Z"),
    (1, None), (1, 5), (2, None),
    (3, None), (3, "true"), (3, False),
    (4, None), (4, ""), (4, 7),
    (5, None), (5, "x"), (5, []), (5, [["A", "not json", True, "1"]]),
    (5, [["A", '{"code":"STRING"}', True, "first"]]), (5, [None]),
    (6, None), (6, []), (6, "x"), (6, [None]), (6, [["{}", "{}"]]),
    (6, [["not json", "{}", "{}"]]), (6, [[' {"a":1} ', "", None]]), (6, [["{}", 5, "{}"]]),
    (6, [['{"a":1}', '{"b":[1,2.5,"\u00e9"]}', "{}"], ['{"z":1,"a":2}', "{}", "{}"]]),
    (6, [['{"a":1} x', "{}", "{}"]]), (6, [["\ufeff{}", "{}", "{}"]]),
    (7, None), (7, "UPSERT"), (7, "DELETE"),
    (8, None), (8, 3),
    (9, None), (9, "x"), (9, ""), (9, " 4 "), (10, None), (10, True),
    (11, None), (11, "tag"), (12, None), (12, "false"), (12, True),
])
def test_direct_decoder_matches_the_general_way_on_odd_values(index, value):
    """Whatever a value is, the row decoder gives the general way's row, or its error; and
    where the direct way takes a row itself, it gives that same row."""
    from spark_backend.spanner.reader import _fast_gsql, _field_type

    fields, _ = _gsql_shapes()
    obj = _change_with(index, value)
    general, direct = _both_ways(fields, obj)
    assert direct == general
    row = _fast_gsql(_field_type(fields[0]), "p0")(_value(obj))
    if row is not None:
        assert row == general
    if (index, value) in _TAKEN_DIRECTLY:
        assert row is not None


# odd values that are still the doc's kinds: the direct way reads them itself
_TAKEN_DIRECTLY = [(0, "2026-11-21T19:45:47Z"), (3, None), (3, False), (4, None), (4, ""),
                   (7, "DELETE"), (9, " 4 "), (10, None), (11, None), (12, None), (12, True),
                   (6, None), (6, []), (5, []), (8, None)]


@pytest.mark.parametrize("obj", [
    None, [], [None], [[]], [[None, [], []]], [[[], [], []]], [[[None], [], []]],
    [[[], [["2026-11-21T19:45:48Z"]], []]], [[[], [[None]], []]], [[None, [["x"]], None]],
    [[[], [["2026-11-21T19:45:48.25Z", "extra"]], []]],
])
def test_direct_decoder_matches_the_general_way_on_odd_records(obj):
    fields, _ = _gsql_shapes()
    general, direct = _both_ways(fields, obj)
    assert direct == general


def test_parse_ns_remembers_seconds_but_checks_every_text():
    from spark_backend.model import timestamps
    from spark_backend.model.timestamps import TimestampError

    timestamps._SECONDS.clear()
    first = parse_ns("2026-11-21T19:45:47.844689Z")
    assert timestamps._SECONDS  # the second is remembered
    assert parse_ns("2026-11-21T19:45:47.844689Z") == first
    assert parse_ns("2026-11-21T19:45:47.5Z") == first - 344_689_000
    assert parse_ns("2026-11-21T19:45:47.123456789Z") == first - 721_232_211
    assert parse_ns("1969-12-31T23:59:59.5Z") == -500_000_000
    assert parse_ns("1969-12-31T23:59:59.25Z") == -750_000_000  # its second remembered
    for bad in ("2026-11-21T19:45:47.1234567891Z", "2026-11-21T19:45:47.12x4Z",
                "2026-11-21T19:45:47.Z", "2026-11-21T19:45:47.\u00b2Z"):
        with pytest.raises(TimestampError):
            parse_ns(bad)
    # other forms are read as before
    assert parse_ns("2026-11-21T19:45:47Z") == first - 844_689_000
    assert parse_ns("2026-11-21T20:45:47.844689+01:00") == first
    assert parse_ns(" 2026-11-21T19:45:47.844689Z ") == first


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


@pytest.mark.parametrize("value", [
    None, True, 0, -7, 2.5, float("nan"), float("inf"), 1e300, "é\u2028\"\\", [], {},
    [{"keys": {"z": 1, "a": [1, 2.0, None, "x"]}, "new_values": {}, "old_values": {"b": True}}],
    {"b": {"d": 1, "c": [{"y": 1, "x": 2}]}, "a": "\u00e9\ud83d\ude00"},
])
def test_canonical_json_is_json_dumps_with_sorted_keys(value):
    """The shared C encoder writes what ``json.dumps`` writes with the canonical options."""
    from spark_backend.model.records import canonical_json

    assert canonical_json(value) == json.dumps(value, sort_keys=True, separators=(",", ":"),
                                               ensure_ascii=False)
