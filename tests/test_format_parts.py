"""A file read in parts lands what it lands read in one piece, for every format: parts read
independently (recording, Datastream JSON Lines, CockroachDB with its ``import_sql``) or one
after another with the parser handed on (Bigtable, ``formats.in_order``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_backend import formats
from spark_backend.cache.ingest import ingest_stream
from spark_backend.cache.store import Cache
from spark_backend.formats import bigtable, cockroachdb, lines
from spark_backend.jobs.import_plan import plan_file
from spark_backend.model.records import batched, to_arrow_batch

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"


def _in_parts(module, path: str, range_bytes: int) -> tuple[list[dict], int]:
    """(the rows of ``path`` read part by part as an import reads them, how many parts)."""
    planned = plan_file(path, module, range_bytes)
    rows: list[dict] = []
    state = None
    for part in planned.parts:
        seen: dict = {}
        rows += lines.read_part(module, path, None, part.start, part.end, part.first_line,
                                seen=seen, state=state if part.follows else None,
                                last=part.last)
        assert (seen["bytes"], seen["sha256"]) == (part.end - part.start, part.sha256)
        state = seen.get("state")
        assert (state is not None) == (not part.last)  # only in-order files have last=False
    return rows, len(planned.parts)


def _samples(fmt: str) -> list[Path]:
    return sorted(p for p in (SAMPLES / fmt).iterdir() if p.is_file())


@pytest.mark.parametrize("path", _samples("bigtable"), ids=lambda p: p.name)
def test_a_bigtable_file_read_in_parts_one_after_another_gives_the_same_rows(path):
    whole = list(formats.read_file("bigtable", str(path)))
    parts, count = _in_parts(bigtable, str(path), 64)
    assert count > 1 and parts == whole


def test_a_bigtable_part_hands_on_a_pending_data_change(tmp_path):
    """A data change whose CONTINUATION messages are in the next part is assembled whole."""
    src = (SAMPLES / "bigtable" / "split_merge.jsonl").read_bytes().splitlines(keepends=True)
    whole = list(formats.read_file("bigtable", str(SAMPLES / "bigtable" / "split_merge.jsonl")))
    for cut in range(1, len(src)):  # a part boundary after every line in turn
        path = tmp_path / f"f{cut}.jsonl"
        path.write_bytes(b"".join(src))
        parts, _ = _in_parts(bigtable, str(path), sum(map(len, src[:cut])))
        assert [{**r, "origin": None} for r in parts] == [{**r, "origin": None} for r in whole]


@pytest.mark.parametrize("path", _samples("datastream"), ids=lambda p: p.name)
def test_datastream_files_read_in_independent_parts_give_the_same_rows(path):
    whole = list(formats.read_file("datastream", str(path)))
    assert _in_parts(formats.get("datastream"), str(path), 64)[0] == whole


def _landed(tmp_path: Path, name: str, rows: list[dict]) -> list[tuple]:
    with Cache(tmp_path / f"{name}.duckdb") as cache:
        cache.ensure_stream("c", system="cockroachdb", source="cockroachdb")
        pull = cache.begin_pull("c", "import:cockroachdb", None, None, None)
        ingest_stream(cache, "c", pull, (to_arrow_batch(b) for b in batched(rows, 7)),
                      extra_sql=lambda: cockroachdb.import_sql("c", pull),
                      count_existing_as_duplicates=True,
                      sort_by=[("origin", "ascending"), ("line", "ascending")])
        return cache.con.execute(
            "SELECT record_key, mod_type, copies FROM data_change_records "
            "ORDER BY record_key").fetchall()


@pytest.mark.parametrize("path", [p for p in _samples("cockroachdb") if p.suffix != ".RESOLVED"],
                         ids=lambda p: p.name)
def test_a_changefeed_read_in_parts_lands_the_mod_types_of_one_piece(tmp_path, path):
    whole = list(formats.read_file("cockroachdb", str(path)))
    parts, count = _in_parts(cockroachdb, str(path), 64)
    assert _landed(tmp_path, "parts", parts) == _landed(tmp_path, "whole", whole)


def test_a_key_seen_in_an_earlier_part_is_an_update(tmp_path):
    path = tmp_path / "feed.ndjson"
    path.write_text("".join(
        json.dumps({"after": {"id": i % 3, "v": i}, "key": [i % 3],
                    "updated": f"{1701102296662969433 + i}.0000000000"}) + "\n"
        for i in range(9)))
    parts, count = _in_parts(cockroachdb, str(path), 100)
    assert count >= 3
    assert sum(r["mod_type"] == "INSERT" for r in parts) > 3  # each part guessed alone
    landed = _landed(tmp_path, "p", parts)
    assert sorted(m for _, m, _ in landed) == ["INSERT"] * 3 + ["UPDATE"] * 6


def _avro_events(path: Path, copies: int, block_records: int = 5) -> int:
    """The Oracle sample's events ``copies`` times (uuids made unique), in blocks of
    ``block_records`` records, deflated: (records written)."""
    import fastavro

    with open(SAMPLES / "datastream" / "oracle_events.avro", "rb") as f:
        reader = fastavro.reader(f)
        schema, events = reader.writer_schema, list(reader)
    out = [{**e, "uuid": f"{e['uuid']}-{n}"} for n in range(copies) for e in events]
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), out, codec="deflate",
                        sync_interval=1)  # a block per record unless block_records groups
    return len(out)


def test_an_avro_container_is_cut_between_blocks_and_read_in_parts(tmp_path):
    path = tmp_path / "events.avro"
    count = _avro_events(path, 40)
    whole = list(formats.read_file("datastream", str(path)))
    assert sum(r["kind"] == "data_change" for r in whole) == count
    parts, n = _in_parts(formats.get("datastream"), str(path), 2048)
    assert n > 3 and parts == whole


def test_a_corrupt_avro_block_is_told_by_the_part_that_reaches_it(tmp_path):
    path = tmp_path / "events.avro"
    _avro_events(path, 40)
    data = bytearray(path.read_bytes())
    middle = len(data) * 3 // 4
    data[middle:middle + 40] = bytes(40)  # a block's bytes (and perhaps its sync) broken
    path.write_bytes(bytes(data))
    whole = list(formats.read_file("datastream", str(path)))
    parts, n = _in_parts(formats.get("datastream"), str(path), 2048)
    assert n > 2
    good = [r for r in whole if r["kind"] != "bad"]
    assert [r for r in parts if r["kind"] != "bad"][:len(good)] == good
    assert any(r["kind"] == "bad" and "corrupt" in r["extra"] for r in parts)


def test_a_later_version_of_a_key_whose_first_landed_with_an_earlier_import_is_an_update(
        tmp_path):
    """A file that grew since it was imported: its first lines are duplicates of the earlier
    import; a key's later versions in parts that never saw its first are still UPDATE."""
    path = tmp_path / "feed.ndjson"
    messages = [json.dumps({"after": {"id": i % 3, "v": i}, "key": [i % 3],
                            "updated": f"{1701102296662969433 + i}.0000000000"}) + "\n"
                for i in range(12)]
    path.write_text("".join(messages[:3]))
    with Cache(tmp_path / "grown.duckdb") as cache:
        cache.ensure_stream("c", system="cockroachdb", source="cockroachdb")
        for text in (messages[:3], messages):
            path.write_text("".join(text))
            parts, count = _in_parts(cockroachdb, str(path), 100)
            pull = cache.begin_pull("c", "import:cockroachdb", None, None, None)
            ingest_stream(cache, "c", pull, (to_arrow_batch(b) for b in batched(parts, 7)),
                          extra_sql=lambda p=pull: cockroachdb.import_sql("c", p),
                          count_existing_as_duplicates=True,
                          sort_by=[("origin", "ascending"), ("line", "ascending")])
        assert count >= 4
        landed = cache.con.execute(
            "SELECT CAST(extra->>'line' AS INT), mod_type FROM data_change_records "
            "ORDER BY 1").fetchall()
    assert landed == [(line, "INSERT" if line <= 3 else "UPDATE") for line in range(1, 13)]
