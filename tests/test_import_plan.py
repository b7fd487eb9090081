"""Cutting files into parts of whole lines, reading the parts, and telling a changed file
(``jobs.import_plan``, ``formats.lines``), without Spark."""

from __future__ import annotations

import hashlib
import os
import random

import pytest

from spark_backend import formats
from spark_backend.formats import cockroachdb, recording
from spark_backend.jobs.import_plan import check_unchanged, plan_file, tasks_of
from spark_backend.model.errors import BadInput
from tests.support.import_inputs import write_recording


@pytest.mark.parametrize("seed", range(40))
def test_parts_are_whole_lines_that_cover_the_file(tmp_path, seed):
    rnd = random.Random(seed)
    data = b"\n".join(b"x" * rnd.randint(0, 60) for _ in range(rnd.randint(1, 80)))
    data += b"\n" if rnd.random() < 0.5 else b""
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    range_bytes = rnd.randint(1, 200)
    planned = plan_file(str(path), recording, range_bytes)
    assert planned.sha256 == hashlib.sha256(data).hexdigest()
    assert [p.start for p in planned.parts][0] == 0 and planned.parts[-1].end == len(data)
    for before, after in zip(planned.parts, planned.parts[1:], strict=False):
        assert before.end == after.start and data[after.start - 1:after.start] == b"\n"
    for part in planned.parts:
        assert part.sha256 == hashlib.sha256(data[part.start:part.end]).hexdigest()
        assert part.first_line == data[:part.start].count(b"\n") + 1
        assert part is planned.parts[-1] or part.end - part.start < range_bytes + 61


def test_avro_containers_and_gz_are_one_part_and_in_order_formats_chain(tmp_path):
    from spark_backend.formats import bigtable, datastream

    avro = tmp_path / "e.avro"
    avro.write_bytes(b"Obj\x01" + b"\n" * 1000)
    assert len(plan_file(str(avro), datastream, 100).parts) == 1
    path = tmp_path / "c.ndjson"
    path.write_bytes(b'{"after": {"id": 1}, "key": [1], "updated": "1.0"}\n' * 1000)
    parts = plan_file(str(path), cockroachdb, 100).parts
    assert len(parts) > 100 and not any(p.follows or not p.last for p in parts)
    parts = plan_file(str(path), bigtable, 100).parts
    assert len(parts) > 100
    assert [(p.follows, p.last) for p in parts] == (
        [(False, False)] + [(True, False)] * (len(parts) - 2) + [(True, True)])
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b" + os.urandom(5000))
    assert len(plan_file(str(gz), recording, 100).parts) == 1


def test_reading_by_parts_gives_the_rows_of_the_whole_file(tmp_path):
    path = tmp_path / "r.jsonl"
    lines, bad = write_recording(path, 400_000, bad=3)
    whole = list(formats.read_file("recording", str(path)))
    planned = plan_file(str(path), recording, 50_000)
    assert len(planned.parts) > 5
    rows, read = [], {}
    for part in planned.parts:
        seen: dict = {}
        rows += formats.read_part("recording", str(path), {}, part.start, part.end,
                                  part.first_line, seen=seen)
        read[(part.path, part.start)] = (seen["bytes"], seen["sha256"])
    assert [(r["kind"], r["line"], r.get("record_id"), r.get("raw")) for r in rows] == [
        (r["kind"], r["line"], r.get("record_id"), r.get("raw")) for r in whole]
    assert len(rows) == lines and sum(r["kind"] == "bad" for r in rows) == bad
    check_unchanged([planned], read)  # what was read is what was planned: no error


def test_a_changed_file_is_told_apart(tmp_path):
    path = tmp_path / "r.jsonl"
    write_recording(path, 200_000, bad=0)
    planned = plan_file(str(path), recording, 30_000)
    read = {(p.path, p.start): (p.end - p.start, p.sha256) for p in planned.parts}
    first = planned.parts[0]
    changed = dict(read)
    changed[(first.path, first.start)] = (first.end - first.start, "0" * 64)
    with pytest.raises(BadInput, match=r"changed while it was imported .*other content"):
        check_unchanged([planned], changed)
    data = path.read_bytes()
    path.write_bytes(data[:1000])
    with pytest.raises(BadInput, match=f"was {len(data):,} bytes and is 1,000 now"):
        check_unchanged([planned], read)
    path.write_bytes(data)
    os.utime(path, ns=(planned.mtime_ns + 10**9, planned.mtime_ns + 10**9))
    with pytest.raises(BadInput, match="written to since the import began"):
        check_unchanged([planned], read)


def test_tasks_group_small_files_and_keep_large_parts_alone(tmp_path):
    paths = []
    for i in range(25):
        p = tmp_path / f"f{i}.jsonl"
        p.write_bytes(b"{}\n" * (1 + i))
        paths.append(plan_file(str(p), recording, 1 << 20).parts[0])
    paths.append(plan_file(str(_big(tmp_path)), recording, 1 << 20).parts[0])
    tasks = tasks_of(paths, task_bytes=100, task_files=5)
    size = [sum(p.end - p.start for p in t) for t in tasks]
    assert [len(t) for t in tasks] == [5, 4, 3, 2, 2] + [1] * 10  # at most 5, 100 bytes
    assert size[:5] == [45, 90, 99, 81, 93] and size[-1] == 1000  # a larger part alone
    assert [p for t in tasks for p in t] == paths


def _big(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * 999 + b"\n")
    return path
