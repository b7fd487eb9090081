"""Inputs for import tests and benchmarks: a recording of any size whose every line is a
distinct record (the demo world's recording lines, copied with their partitions renamed per
copy), a few bad lines spread through it, folders of many small files, a Bigtable change
stream feed and a CockroachDB changefeed of any size."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

_MARK = "@@copy@@"
# Bad lines put into a generated recording: a truncated line, a line of another format, bytes.
BAD_LINES = (b'{"partition_token": "t", "heartbeat_record": {"timest',
             b"root:x:0:0:root:/root:/bin/bash",
             b'{"after": {"id": 1}, "key": [1], "updated": "1.0"}',
             b"\x00\x01\x02 not text \xff\xfe",
             b'{"partition_token": 5, "heartbeat_record": {}}',
             b"{oops")


def _templates(seed: int, scale: float) -> tuple[list[str], list[str]]:
    """(the world's lines of the initial query, every other line with its partition tokens
    marked for renaming)."""
    from spark_backend.demo.world import build_world

    initial, rest = [], []
    for obj in build_world(seed, scale).iter_recording(10_000):
        if obj.get("partition_token") is None:
            initial.append(json.dumps(obj))
            continue
        obj["partition_token"] += _MARK
        children = (obj.get("child_partitions_record") or {}).get("child_partitions") or []
        for child in children:
            child["token"] += _MARK
            child["parent_partition_tokens"] = [p + _MARK for p in
                                                child["parent_partition_tokens"]]
        rest.append(json.dumps(obj))
    return initial, rest


def write_recording(path: Path, size: int, bad: int = 6, seed: int = 7,
                    scale: float = 0.05) -> tuple[int, int]:
    """A recording of about ``size`` bytes (at least one copy of the world) with ``bad`` bad
    lines spread through it; returns (lines written, bad lines among them). Copy k > 0 renames
    every partition ``tok`` to ``tok~k`` and leaves the initial query's rows out, so that no
    two lines are one record."""
    initial, rest = _templates(seed, scale)
    per_copy = sum(len(line) + 1 for line in rest)
    copies = max(1, round((size - sum(len(x) + 1 for x in initial)) / per_copy))
    every = max(1, copies // max(bad, 1))
    lines = written_bad = 0
    with open(path, "wb", buffering=1 << 20) as f:
        for line in initial:
            f.write(line.encode() + b"\n")
            lines += 1
        for k in range(copies):
            suffix = "" if k == 0 else f"~{k}"
            f.write("\n".join(line.replace(_MARK, suffix) for line in rest).encode() + b"\n")
            lines += len(rest)
            if written_bad < bad and k % every == every // 2:
                f.write(BAD_LINES[written_bad % len(BAD_LINES)] + b"\n")
                lines += 1
                written_bad += 1
    return lines, written_bad


def write_small_files(folder: Path, count: int) -> int:
    """``count`` one-line recordings in ``folder`` (a heartbeat each, all distinct)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        line = {"partition_token": f"p{i % 97}", "heartbeat_record": {
            "timestamp": f"2026-01-05T09:{i // 6000 % 60:02d}:{i // 100 % 60:02d}."
                         f"{i:06d}Z"}}
        (folder / f"f{i:05d}.jsonl").write_text(json.dumps(line) + "\n")
    return count


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def write_bigtable_feed(path: Path, changes: int) -> int:
    """One partition's responses: data changes whose value comes in two chunks on two lines
    (a CONTINUATION), a heartbeat every 50 changes, then a split into two partitions; returns
    the lines written."""
    whole = {"rowRange": {}}
    lines = 0
    with open(path, "w", buffering=1 << 20) as f:
        f.write(json.dumps({"partition": whole, "timestamp": "2024-05-01T10:00:00Z"}) + "\n")
        for i in range(changes):
            ts = f"2024-05-01T10:{i // 60000 % 60:02d}:{i // 1000 % 60:02d}.{i % 1000:03d}Z"
            value = os.urandom(24).hex()
            head = {"type": "USER", "sourceClusterId": "c1", "rowKey": _b64(f"row{i % 500}"),
                    "commitTimestamp": ts, "tiebreaker": i % 7, "chunks": [
                        {"chunkInfo": {"chunkedValueSize": 48, "chunkedValueOffset": 0},
                         "mutation": {"setCell": {"familyName": "cf",
                                                  "columnQualifier": _b64("v"),
                                                  "value": _b64(value[:24])}}}]}
            tail = {"type": "CONTINUATION", "chunks": [
                {"chunkInfo": {"chunkedValueSize": 48, "chunkedValueOffset": 24,
                               "lastChunk": True},
                 "mutation": {"setCell": {"familyName": "cf", "columnQualifier": _b64("v"),
                                          "value": _b64(value[24:])}}}],
                    "done": True, "token": f"t{i}", "estimatedLowWatermark": ts}
            f.write(json.dumps({"partition": whole, "response": {"dataChange": head},
                                "table": "t"}) + "\n")
            f.write(json.dumps({"dataChange": tail}) + "\n")  # bare: the partition above
            lines += 2
            if i % 50 == 49:
                f.write(json.dumps({"heartbeat": {"estimatedLowWatermark": ts}}) + "\n")
                lines += 1
        halves = [{"rowRange": {"endKeyOpen": _b64("m")}},
                  {"rowRange": {"startKeyClosed": _b64("m")}}]
        f.write(json.dumps({"partition": whole, "response": {"closeStream": {
            "status": {"code": 11}, "newPartitions": halves}}, "table": "t"}) + "\n")
    return lines + 2


def write_changefeed(path: Path, messages: int, keys: int = 100_000) -> int:
    """``messages`` changefeed messages (no ``diff``: their mod type is inferred) over ``keys``
    keys in turn, so that every key has many versions across the file; returns
    ``messages``."""
    pad = "x" * 120
    with open(path, "w", buffering=1 << 20) as f:
        for i in range(messages):
            f.write(f'{{"after": {{"id": {i % keys}, "v": {i}, "pad": "{pad}"}}, '
                    f'"key": [{i % keys}], "updated": "{1701102296662969433 + i}.0000000000"}}\n')
    return messages
