"""``spark.readStream.format("spanner_change_stream")`` into a Parquet sink with a checkpoint:
a job killed with SIGKILL between its micro-batches and started again lands every record of the
range once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from spark_backend.demo.server import DemoServer
from spark_backend.demo.world import build_world
from spark_backend.model.timestamps import format_ns
from spark_backend.spark.datasource import SpannerChangeStreamStreamReader
from tests.support.waiting import wait_until
from tests.test_crash import _descendants, _env
from tests.test_pull_demo import truth_records

ROOT = Path(__file__).resolve().parent.parent
# What a record is, whichever batch read it (heartbeats depend on where each batch's query
# starts, so they are left out).
KINDS = ("data_change", "child_partitions")


@pytest.fixture(scope="module")
def served():
    world = build_world(7, 0.1)
    with DemoServer(world) as server:
        yield world, server.start()


def job(world, host: str, out: Path, checkpoint: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.stream_job", host, world.stream,
         format_ns(world.start), format_ns(world.end), str(out), str(checkpoint)],
        cwd=str(ROOT), env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def landed(out: Path) -> list[tuple]:
    table = ds.dataset(str(out), format="parquet").to_table()
    rows = zip(*(table[c].to_pylist() for c in (
        "partition_token", "kind", "ts_ns", "server_transaction_id", "record_sequence")),
        strict=True)
    return [r for r in rows if r[0] is not None and r[1] in KINDS]


def commits(checkpoint: Path) -> int:
    folder = checkpoint / "commits"
    return len([p for p in folder.iterdir() if p.name.isdigit()]) if folder.is_dir() else 0


def truth(world) -> set[tuple]:
    return {r for r in truth_records(world) if r[1] in KINDS}


@pytest.mark.slow
def test_a_streaming_query_killed_between_batches_resumes_exactly(served, tmp_path):
    world, host = served
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    first = job(world, host, out, checkpoint)
    wait_until(lambda: commits(checkpoint) >= 2 or first.poll() is not None,
               "two micro-batches committed")
    assert first.poll() is None, first.stderr.read()[-2000:]
    pids = _descendants(first.pid)
    os.killpg(first.pid, signal.SIGKILL)
    for pid in pids:  # the JVM and Python workers, as a machine that lost power
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    first.wait()
    killed_at = commits(checkpoint)
    assert 2 <= killed_at < 7
    again = job(world, host, out, checkpoint)
    _, err = again.communicate()
    assert again.returncode == 0, err[-2000:]
    got = landed(out)
    assert len(got) == len(set(got)), "no record twice after the kill"
    assert set(got) == truth(world)
    assert commits(checkpoint) == 7


def test_offsets_are_times_and_a_batch_never_passes_the_end_or_the_clock():
    reader = SpannerChangeStreamStreamReader({
        "project": "p", "instance": "i", "database": "d", "stream": "S",
        "start": "2026-01-05T09:00:00Z", "end": "2026-01-05T10:00:00Z",
        "max_batch_seconds": "600", "lag_ms": "0"})
    first = reader.initialOffset()
    assert first == {"read_to_ns": reader.reader.start_ns - 1}
    offsets = [first]
    while True:
        nxt = reader.latestOffset(offsets[-1], None)
        if nxt == offsets[-1]:
            break
        offsets.append(nxt)
    spans = [b["read_to_ns"] - a["read_to_ns"] for a, b in zip(offsets, offsets[1:])]
    assert len(spans) == 7 and max(spans) <= 600 * 10**9
    assert offsets[-1]["read_to_ns"] == reader.reader.end_ns
    assert reader.partitions(offsets[-1], offsets[-1]) == []
    live = SpannerChangeStreamStreamReader({
        "project": "p", "instance": "i", "database": "d", "stream": "S",
        "start": "2026-01-05T09:00:00Z", "lag_ms": "5000"})
    before = time.time_ns()
    upto = live.latestOffset(live.initialOffset(), None)["read_to_ns"]
    assert upto <= time.time_ns() - 5 * 10**9 and upto >= before - 5 * 10**9 - 10**9
