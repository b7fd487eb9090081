"""Issue 68, files a format cannot read in pieces: a ``.gz`` recording is decompressed beside
the cache and read in parts, landing exactly what the plain file lands under the ``.gz`` file's
name and hash; a file whose rows are more than Spark's driver takes back ends the import with
one sentence instead of a hang. Real CLI, real Spark (local[*]), real DuckDB files."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from spark_backend.formats import recording
from spark_backend.jobs.import_plan import plan_gzip
from tests.support.import_inputs import write_bigtable_feed, write_recording
from tests.support.imports import cache_contents

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _import(cache: Path, fmt: str, path: Path, cwd: Path,
            **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_backend.cli", "import", "--cache",
                           str(cache), "--format", fmt, "--stream", "s", str(path)],
                          cwd=cwd, env=_env(**env), capture_output=True, text=True)


def _rename(contents: dict[str, list[tuple]], old: str, new: str) -> dict[str, list[tuple]]:
    """The contents with every value ``old`` (a file's path) read as ``new``."""
    return {t: sorted((tuple(new if v == old else v for v in row) for row in rows),
                      key=repr) for t, rows in contents.items()}


def test_plan_gzip_cuts_the_content_and_keeps_the_gz_identity(tmp_path):
    plain = tmp_path / "r.jsonl"
    write_recording(plain, 300_000)
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    staging = tmp_path / "staging"
    staging.mkdir()
    planned = plan_gzip(str(gz), recording, str(staging), 50_000)
    assert planned is not None
    assert len(planned.parts) > 3
    assert planned.sha256 == hashlib.sha256(gz.read_bytes()).hexdigest()
    assert (planned.named, planned.named_size) == (str(gz), gz.stat().st_size)
    assert Path(planned.path).read_bytes() == plain.read_bytes()
    lines = plain.read_bytes().splitlines(keepends=True)
    for part in planned.parts:  # each part starts at the line its number says
        assert part.named == str(gz)
        assert sum(map(len, lines[:part.first_line - 1])) == part.start


def test_plan_gzip_leaves_damaged_and_unsplittable_files_whole(tmp_path):
    staging = tmp_path / "staging"
    staging.mkdir()
    plain = tmp_path / "r.jsonl"
    write_recording(plain, 100_000)
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress(plain.read_bytes())[:-1000])
    assert plan_gzip(str(cut), recording, str(staging), 10_000) is None
    assert [p.name for p in staging.iterdir()] == []  # no half copy left
    from spark_backend.formats import datastream
    avro = tmp_path / "events.avro.gz"  # an Avro container is not read in pieces
    avro.write_bytes(gzip.compress(b"Obj\x01" + bytes(100)))
    assert plan_gzip(str(avro), datastream, str(staging), 10) is None


# One import in a process of its own, as the CLI's: parts of ``range_bytes``, so that a file
# of a few MB is read in several parts as one of a few hundred MB is with the default.
_IMPORT = r"""
import sys
from spark_backend.cache.store import Cache
from spark_backend.jobs.files import import_files
with Cache(sys.argv[1]) as cache:
    res = import_files(cache, "s", sys.argv[2], [sys.argv[3]], range_bytes=int(sys.argv[4]))
print(res.records, res.bad)
"""


def _import_in_parts(cache: Path, fmt: str, path: Path, range_bytes: int) -> str:
    done = subprocess.run([sys.executable, "-c", _IMPORT, str(cache), fmt, str(path),
                           str(range_bytes)], cwd=cache.parent, env=_env(),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_gzipped_recording_lands_what_the_plain_one_lands(tmp_path):
    plain_dir, gz_dir = tmp_path / "plain", tmp_path / "gz"
    plain_dir.mkdir()
    gz_dir.mkdir()
    plain = plain_dir / "r.jsonl"
    write_recording(plain, 3_000_000)
    gz = gz_dir / "r.jsonl.gz"
    with open(plain, "rb") as src, gzip.open(gz, "wb") as out:
        shutil.copyfileobj(src, out)
    said_plain = _import_in_parts(tmp_path / "plain.duckdb", "recording", plain, 256 * 1024)
    said_gz = _import_in_parts(tmp_path / "gz.duckdb", "recording", gz, 256 * 1024)
    assert said_gz == said_plain and int(said_gz.split()[0]) > 1000
    con = duckdb.connect(str(tmp_path / "gz.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT path, sha256 FROM imports").fetchall() == [
            (str(gz), hashlib.sha256(gz.read_bytes()).hexdigest())]
        origins = {o for (o,) in con.execute("SELECT DISTINCT origin FROM quarantine").fetchall()}
        assert origins == {str(gz)}
    finally:
        con.close()
    sha_plain = hashlib.sha256(plain.read_bytes()).hexdigest()
    sha_gz = hashlib.sha256(gz.read_bytes()).hexdigest()
    landed_plain = _rename(_rename(cache_contents(tmp_path / "plain.duckdb"), str(plain),
                                   str(gz)), sha_plain, sha_gz)
    landed_gz = _rename(cache_contents(tmp_path / "gz.duckdb"), "", "")
    assert landed_plain == landed_gz
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("csi-import-")]


def test_the_cli_imports_a_gzipped_recording(tmp_path):
    plain = tmp_path / "r.jsonl"
    lines, bad = write_recording(plain, 500_000)
    gz = tmp_path / "r.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    done = _import(tmp_path / "c.duckdb", "recording", gz, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"imported {lines - bad:,} records" in done.stdout


def test_rows_more_than_the_driver_takes_end_in_one_sentence(tmp_path):
    """A file read in one piece whose rows exceed spark.driver.maxResultSize (1 MB here, as
    a multi-GB changefeed file would the default): the import ends with a sentence naming the
    file and what to do, keeps nothing, and leaves no stream."""
    big = tmp_path / "feed.ndjson"
    with open(big, "w") as f:
        for i in range(60_000):  # ~12 MB of distinct rows
            f.write(f'{{"after": {{"id": {i}, "name": "{os.urandom(40).hex()}", "office": '
                    f'"o{i % 97}"}}, "key": [{i}], "updated": "{1701102296662969433 + i}'
                    '.0000000000"}\n')
    done = _import(tmp_path / "c.duckdb", "cockroachdb", big, tmp_path,
                   CSI_SPARK_CONF="spark.driver.maxResultSize=1m")
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(said) == 1, done.stderr[-3000:]
    assert str(big) in said[0] and "spark.driver.maxResultSize" in said[0]
    assert "split" in said[0].lower() and "Traceback" not in done.stderr
    if (tmp_path / "c.duckdb").exists():  # a cache the failed import made may be removed
        con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
        try:
            assert con.execute("SELECT count(*) FROM streams").fetchone() == (0,)
        finally:
            con.close()
    print(said[0])


def test_jobs_hold_at_most_job_bytes_of_input_and_most_tasks():
    from spark_backend.jobs.files import JOB_BYTES, _next_window
    from spark_backend.jobs.import_plan import Part

    def task(size: int) -> list[Part]:
        return [Part("f", 0, size, 1, "")]

    def windows_of(tasks: list[list[Part]], most: int) -> list[list[list[Part]]]:
        out = []
        while tasks:
            window, tasks = _next_window(tasks, most, set())
            out.append(window)
        return out

    mb = 1024 * 1024
    tasks = [task(32 * mb) for _ in range(20)] + [task(400 * mb), task(mb)]
    windows = windows_of(tasks, 64)
    assert [len(w) for w in windows] == [8, 8, 4, 1, 1]
    assert all(sum(p.end - p.start for t in w for p in t) <= JOB_BYTES for w in windows[:3])
    assert [len(w) for w in windows_of([task(mb)] * 10, 4)] == [4, 4, 2]


_IMPORTS = r"""
import sys
from spark_backend.cache.store import Cache
from spark_backend.jobs.files import import_files
for cache_path, fmt, path, range_bytes in zip(*[iter(sys.argv[1:])] * 4):
    said = []
    with Cache(cache_path) as cache:
        res = import_files(cache, "s", fmt, [path], range_bytes=int(range_bytes),
                           progress=said.append)
    print(cache_path, res.records, res.bad, said[0])
"""


def test_formats_read_in_order_or_fixed_after_land_what_one_piece_lands(tmp_path):
    """A Bigtable file (read in parts one after another, each handed the parser the part
    before it left) and a changefeed without ``diff`` (parts read alone, mod types fixed
    once landed), each imported in parts of 64 KiB and in one piece, in one Spark session:
    the caches are equal."""
    bt = tmp_path / "bt.jsonl"
    write_bigtable_feed(bt, 6_000)
    feed = tmp_path / "feed.ndjson"
    with open(feed, "w") as f:
        for i in range(20_000):  # 400 keys, each first an INSERT then UPDATEs
            f.write(f'{{"after": {{"id": {i % 400}, "v": {i}}}, "key": [{i % 400}], '
                    f'"updated": "{1701102296662969433 + i}.0000000000"}}\n')
    runs = [(tmp_path / f"{name}-{size}.duckdb", fmt, path, size)
            for name, fmt, path in (("bt", "bigtable", bt), ("crdb", "cockroachdb", feed))
            for size in (64 * 1024, 1 << 30)]
    done = subprocess.run([sys.executable, "-c", _IMPORTS,
                           *[str(v) for run in runs for v in run]],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    said = {line.split()[0]: line.split(None, 3)[1:] for line in done.stdout.splitlines()}
    for cache, fmt, path, size in runs:
        parts = said[str(cache)][2]
        assert ("in 1 part(s)" in parts) == (size == 1 << 30), parts
    for name in ("bt", "crdb"):
        in_parts = cache_contents(tmp_path / f"{name}-{64 * 1024}.duckdb")
        assert in_parts == cache_contents(tmp_path / f"{name}-{1 << 30}.duckdb")
    con = duckdb.connect(str(tmp_path / f"crdb-{64 * 1024}.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT mod_type, count(*) FROM data_change_records GROUP BY 1 "
                           "ORDER BY 1").fetchall() == [("INSERT", 400), ("UPDATE", 19_600)]
        assert con.execute("SELECT count(*) FROM quarantine").fetchone() == (0,)
    finally:
        con.close()
    con = duckdb.connect(str(tmp_path / f"bt-{64 * 1024}.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM data_change_records").fetchone() == (6_000,)
        assert con.execute("SELECT count(*) FROM quarantine").fetchone() == (0,)
    finally:
        con.close()
