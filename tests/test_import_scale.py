"""File imports at scale, with real Spark (local[*]) and real DuckDB files: a ~1 GB recording in
bounded memory, a folder of 10,000 small files, a file that changes while it is imported, and
a file that is not of the chosen format (issue 68).

The size of the large recording is ``$CSI_IMPORT_TEST_BYTES`` (default 1 GB)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from spark_backend.cache.store import Cache
from spark_backend.jobs.files import import_files
from spark_backend.model.errors import BadInput
from tests.support.import_inputs import write_recording, write_small_files

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BIG_BYTES = int(os.environ.get("CSI_IMPORT_TEST_BYTES", str(10**9)))

# Runs one import in a process of its own and prints, as JSON, the result and the peak
# resident memory (VmHWM) of that process and of every process under it (Spark's JVM, its
# Python workers), read while they are still alive.
_MEASURED_IMPORT = r"""
import json, os, sys, time
from spark_backend.cache.store import Cache
from spark_backend.jobs.files import import_files
from spark_backend.model import config

def peak(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0

def tree(pid):
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = open(f"/proc/{pid}/task/{task}/children").read().split()
        except OSError:
            continue
        for kid in kids:
            out.append(int(kid))
            out.extend(tree(int(kid)))
    return out

cache_path, path = sys.argv[1], sys.argv[2]
began = time.perf_counter()
with Cache(cache_path, memory_limit=config.IMPORT_MEMORY_LIMIT, threads=config.PULL_THREADS,
           allocator=config.PULL_ALLOCATOR) as cache:  # as the CLI's import opens it
    res = import_files(cache, "big", "recording", [path],
                       progress=lambda line: print(line, file=sys.stderr, flush=True))
took = time.perf_counter() - began
kids = {pid: open(f"/proc/{pid}/cmdline").read().split("\0")[0] for pid in tree(os.getpid())}
print(json.dumps({"records": res.records, "bad": res.bad, "duplicates": res.duplicates,
                  "seconds": took, "driver_peak": peak(os.getpid()),
                  "children": [[cmd, peak(pid)] for pid, cmd in kids.items()]}))
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


@pytest.fixture(scope="module")
def big_import(tmp_path_factory) -> dict:
    """One import of a generated ~1 GB recording, measured in a process of its own."""
    tmp = tmp_path_factory.mktemp("big")
    rec = tmp / "big.jsonl"
    lines, bad = write_recording(rec, BIG_BYTES, bad=6)
    size = rec.stat().st_size
    done = subprocess.run([sys.executable, "-c", _MEASURED_IMPORT, str(tmp / "c.duckdb"),
                           str(rec)], cwd=tmp, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rec.unlink()  # 1 GB less on the disk for the rest of the suite
    got = json.loads(done.stdout.splitlines()[-1])
    progress = [x for x in done.stderr.splitlines() if x.startswith("read ")]
    print(f"{size:,} bytes, {lines:,} lines, {bad} bad: {got}; {len(progress)} progress lines")
    return {"got": got, "progress": progress, "lines": lines, "bad": bad, "size": size,
            "cache": tmp / "c.duckdb"}


def test_a_1gb_recording_lands_whole_with_spark_s_jvm_bounded(big_import):
    got, progress, lines, bad = (big_import[k] for k in ("got", "progress", "lines", "bad"))
    assert got["records"] == lines - bad and got["bad"] == bad and got["duplicates"] == 0
    parts = int(progress[-1].split(" of ")[1].split()[0].replace(",", ""))
    assert parts >= big_import["size"] // (40 * 1024 * 1024)
    assert progress[-1].startswith(f"read {parts:,} of {parts:,} part(s)")
    with duckdb.connect(str(big_import["cache"]), read_only=True) as con:
        landed = con.execute("SELECT (SELECT count(*) FROM data_change_records) + "
                             "(SELECT count(*) FROM heartbeats) + "
                             "(SELECT count(*) FROM child_partitions_records)").fetchone()[0]
        q = con.execute("SELECT count(*), max(length(raw)) FROM quarantine").fetchone()
    assert landed == lines - bad and q == (bad, q[1]) and q[1] <= 200
    # Spark's JVM never holds the file's rows (1 GB of lines are several GB as values): its
    # parts come back a few tasks at a time, whatever the file's size.
    jvm = max(p for cmd, p in got["children"] if cmd.endswith("java"))
    assert jvm < 900_000_000, got  # its heap is 512 MB (spark.driver.memory)


def test_a_1gb_recording_keeps_the_driver_under_600_mb(big_import):
    # The import's one transaction keeps each chunk until its commit: as DuckDB data, which
    # goes to its temporary folder beyond the import's memory limit, not as Arrow in this
    # process (``ingest_stream``'s ``copy``).
    got = big_import["got"]
    assert got["driver_peak"] < 600_000_000, got


def test_a_folder_of_10000_small_files(tmp_path):
    n = write_small_files(tmp_path / "many", 10_000)
    cache = tmp_path / "many.duckdb"
    done = subprocess.run([sys.executable, "-m", "spark_backend.cli", "import", "--cache",
                           str(cache), "--format", "recording", "--stream", "M",
                           str(tmp_path / "many")], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"M: imported {n:,} records from {n} file(s)" in done.stdout, done.stdout
    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.execute("SELECT count(*), count(DISTINCT path), sum(records) FROM imports"
                           ).fetchone() == (n, n, n)
        assert con.execute("SELECT count(*) FROM heartbeats").fetchone()[0] == n


def test_a_file_changed_while_imported_is_refused_and_imports_whole_later(tmp_path):
    rec = tmp_path / "moving.jsonl"
    lines, bad = write_recording(rec, 28_000 * 760, bad=0)
    original = rec.read_bytes()
    shrunk = b"".join(original.splitlines(keepends=True)[:1000])
    cache = Cache(tmp_path / "m.duckdb")
    heard: list[str] = []

    def shrink_after_the_first_part(line: str) -> None:
        heard.append(line)
        if line.startswith("read 1 of"):
            rec.write_bytes(shrunk)  # the file shrinks while its other parts wait to be read

    with pytest.raises(BadInput) as refused:
        import_files(cache, "moving", "recording", [str(rec)],
                     progress=shrink_after_the_first_part, range_bytes=1 << 20)
    message = str(refused.value)
    assert message.startswith(f"{rec} changed while it was imported") and "\n" not in message
    assert "nothing of this import was kept" in message
    assert cache.streams() == [] and cache.con.execute(
        "SELECT count(*) FROM imports").fetchone()[0] == 0
    assert any(line.startswith("read 1 of") for line in heard)

    rec.write_bytes(original)
    res = import_files(cache, "moving", "recording", [str(rec)], range_bytes=1 << 20)
    assert (res.records, res.skipped_files) == (lines, 0)
    (sha,) = cache.con.execute("SELECT sha256 FROM imports").fetchone()
    assert sha == hashlib.sha256(original).hexdigest()
    again = import_files(cache, "moving", "recording", [str(rec)], range_bytes=1 << 20)
    assert (again.records, again.skipped_files) == (0, 1)
    cache.close()


def _passwd_like(path: Path, n: int = 40) -> bytes:
    data = "".join(f"user{i}:x:{1000 + i}:{1000 + i}:User {i}:/home/user{i}:/bin/bash\n"
                   for i in range(n)).encode()
    path.write_bytes(data)
    return data


def test_a_file_not_of_the_format_keeps_only_its_size_and_hash(tmp_path):
    good = ROOT / "fixtures" / "samples" / "cockroachdb" / "wrapped_diff.ndjson"
    passwd = tmp_path / "passwd"
    data = _passwd_like(passwd)
    cache = Cache(tmp_path / "p.duckdb")

    with pytest.raises(BadInput) as refused:  # alone: nothing to import, and why
        import_files(cache, "crdb", "cockroachdb", [str(passwd)])
    assert "Nothing imported into crdb" in str(refused.value)
    assert "passwd: not cockroachdb: none of its 40 lines" in str(refused.value)
    assert cache.streams() == []

    long_bad = tmp_path / "mixed.ndjson"  # good messages, and one bad line of 10,000 bytes
    long_bad.write_bytes(good.read_bytes() + b"user:" + b"x" * 9_995 + b"\n")
    res = import_files(cache, "crdb", "cockroachdb", [str(good), str(passwd), str(long_bad)])
    assert res.records > 0 and res.bad == 2
    assert any("passwd: not cockroachdb" in e for e in res.bad_examples)
    rows = cache.con.execute("SELECT origin, line, reason, raw, raw_bytes, raw_sha256 "
                             "FROM quarantine ORDER BY origin").fetchall()
    by_file = {os.path.basename(r[0]): r for r in rows}
    assert sorted(by_file) == ["mixed.ndjson", "passwd"] and len(rows) == 2
    _, line, reason, raw, size, sha = by_file["passwd"]
    assert line is None and raw == "" and reason.startswith("not cockroachdb: none of its 40")
    assert (size, sha) == (len(data), hashlib.sha256(data).hexdigest())
    _, line, reason, raw, size, sha = by_file["mixed.ndjson"]
    assert raw == "user:" + "x" * 194 + "…" and size == 10_000
    assert sha == hashlib.sha256(b"user:" + b"x" * 9_995).hexdigest()
    everything = " ".join(str(r) for r in cache.con.execute("SELECT * FROM quarantine"
                                                            ).fetchall())
    assert "/home/user" not in everything and "x" * 200 not in everything
    cache.close()
