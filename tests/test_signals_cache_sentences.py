"""What the command line says of a cache or a machine in a bad state, each a sentence naming
what is wrong (none "unexpected ..."): a full disk, a damaged data block, a schema version
this tool never wrote, a table missing a column, DuckDB's spill folder left by a kill, a
symbolic link in a loop; and a SIGTERM of `report` on a real CLI process."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from spark_backend.cache.store import Cache, cache_failure
from spark_backend.jobs import pull_landing
from tests.support.cli_here import cli_here

ROOT = Path(__file__).resolve().parent.parent


def cli(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_backend.cli", *argv], cwd=str(ROOT),
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def landed(tmp_path_factory, landed_caches) -> Path:
    """A cache holding a small demo world, landed without Spark."""
    return Path(landed_caches.copy(tmp_path_factory.mktemp("landed") / "c.duckdb", 7, 0.2))


@pytest.fixture
def copy(landed, tmp_path) -> Path:
    path = tmp_path / "c.duckdb"
    shutil.copy(landed, path)
    return path


@pytest.mark.parametrize("version", ["-1", "abc", "2 ", "0", ""])
def test_a_schema_version_this_tool_never_wrote_is_not_called_newer(copy, version):
    with duckdb.connect(str(copy)) as con:
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [version])
    before = copy.read_bytes()
    done = cli_here("report", "--cache", str(copy))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"error: {copy} names its schema version {version!r}, which is not a version of this "
        "tool's caches (a whole number from 1 to 2): it is damaged or was changed outside this "
        "tool, and was left untouched: give a new file or a cache made by this tool.\n")
    assert copy.read_bytes() == before


def test_a_newer_schema_version_is_still_called_newer(copy):
    with duckdb.connect(str(copy)) as con:
        con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    done = cli_here("report", "--cache", str(copy))
    assert done.returncode == 1
    assert "is a cache of schema version 3, newer than this tool's (2)" in done.stderr


@pytest.mark.parametrize("argv", [("report",), ("history", "--table", "Accounts"),
                                  ("export", "--out", "{out}"), ("pull", "--source", "demo")])
def test_a_cache_missing_a_column_is_named_by_every_command(copy, tmp_path, argv):
    with duckdb.connect(str(copy)) as con:
        con.execute("ALTER TABLE data_change_records DROP COLUMN mod_type")
    before = copy.read_bytes()
    argv = [a.replace("{out}", str(tmp_path / "e.jsonl")) for a in argv]
    done = cli_here(*argv, "--cache", str(copy))
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"error: {copy} is a cache of schema version 2 whose tables lack a column of that "
        "schema (data_change_records.mod_type): it was changed outside this tool, and was left "
        "untouched: give a new file, or pull or import again into one.\n")
    assert copy.read_bytes() == before


def _damage(path: Path, table: str) -> int:
    """Bytes overwritten where ``table``'s first segment in each of its data blocks begins
    (DuckDB's file: 12 KiB of headers, then blocks of 256 KiB, each an 8-byte checksum of what
    the block holds, then its segments); how many blocks."""
    with duckdb.connect(str(path), read_only=True) as con:
        (size,) = con.execute("SELECT block_size FROM pragma_database_size()").fetchone()
        blocks = con.execute(
            f"SELECT block_id, min(block_offset) FROM pragma_storage_info('{table}') "
            "WHERE persistent AND block_id >= 0 GROUP BY block_id").fetchall()
    with open(path, "r+b") as f:
        for block, offset in blocks:
            f.seek(3 * 4096 + block * size + 8 + offset)
            f.write(b"\xff" * 64)
    return len(blocks)


@pytest.mark.parametrize("table", ["mods", "transactions"])
def test_a_damaged_data_block_is_named_by_report_export_and_history(copy, tmp_path, table):
    """``report`` reads every table back (``Cache.read_every_block``), so a damaged block is
    found wherever it is; ``export`` and ``history`` find those they read (``mods``)."""
    assert _damage(copy, table) > 0
    commands = [("report",)]
    if table == "mods":
        commands += [("export", "--out", str(tmp_path / "e.jsonl")),
                     ("history", "--table", "Accounts")]
    for argv in commands:
        done = cli(*argv, "--cache", str(copy))
        assert done.returncode == 1, done.stderr
        assert done.stderr.startswith(f"error: The cache {copy} is damaged: DuckDB cannot read "
                                      "part of it (IO Error: Corrupt database file"), done.stderr
        assert done.stderr.endswith("; pull or import the streams again into a new cache "
                                    "file, or restore a copy.\n")
        assert done.stderr.count("\n") == 1


def test_report_of_a_whole_cache_says_it_read_every_table(copy):
    done = cli_here("report", "--cache", str(copy))
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("cache file: all 13 tables read back whole, no damaged block\n")


def test_the_spill_folder_a_kill_left_is_removed_by_the_next_open(copy):
    spill = Path(f"{copy}.tmp")
    spill.mkdir()
    (spill / "duckdb_temp_storage_DEFAULT-0.tmp").write_bytes(b"\0" * 4096)
    Cache(copy).close()
    assert not spill.exists()
    spill.mkdir()  # a folder holding something else is not DuckDB's alone: kept
    (spill / "notes.txt").write_text("mine")
    Cache(copy).close()
    assert (spill / "notes.txt").read_text() == "mine"


def test_a_symbolic_link_loop_is_not_called_broken(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    done = cli_here("import", "--cache", str(tmp_path / "c.duckdb"), "--format", "recording",
               "--stream", "S", str(tmp_path / "a"))
    assert done.returncode == 2
    assert done.stderr == (f"error: Nothing to import: {tmp_path / 'a'} is a symbolic link in "
                           "a loop (it leads back to itself); give a file.\n")
    done = cli_here("import", "--cache", str(tmp_path / "c.duckdb"), "--format", "recording",
               "--stream", "S", str(tmp_path / "gone"))
    assert done.stderr == (f"error: Nothing to import: {tmp_path / 'gone'} is a broken "
                           "symbolic link.\n")
    assert not (tmp_path / "c.duckdb").exists()


@pytest.fixture
def full_disk(tmp_path):
    """A 3 MB tmpfs mounted for the test (root only: skipped where mounting is refused)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a small disk cannot be mounted here: {mounted.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def test_a_full_disk_is_named_as_such_not_as_memory(full_disk):
    cache = Cache(full_disk / "c.duckdb", memory_limit="16MB")
    free = os.statvfs(full_disk)
    (full_disk / "filler").write_bytes(b"x" * (free.f_bavail * free.f_frsize - 600_000))
    # A query larger than DuckDB's memory spills beside the cache, where the disk is full:
    # DuckDB raises an "Out of Memory" error whose cause is the disk.
    with pytest.raises(duckdb.OutOfMemoryException) as spilled:
        cache.con.execute("SELECT i, md5(i::TEXT) AS s FROM range(3000000) t(i) "
                          "ORDER BY s").fetchall()
    # A write: the WAL cannot grow.
    with pytest.raises(duckdb.Error) as written:
        cache.con.execute("INSERT INTO meta VALUES ('x', repeat('a', 4000000))")
    cache.close()
    for error in (spilled.value, written.value):
        said = pull_landing.cache_failed(cache, error, "landing a task's results")
        assert said.endswith(f"; free space on the disk of {cache.path} and pull again to "
                             "resume."), said
        assert "memory" not in said.split(")")[-1]
        said = cache_failure(cache.path, error)
        assert said.startswith(f"The disk of the cache {cache.path} is full ("), said
        assert said.endswith("free space there (or give a cache on another disk) and run "
                             "again: what was committed before is kept.")


@pytest.mark.parametrize("sig, said", [
    (signal.SIGTERM, "stopped by SIGTERM: the cache is consistent.\n"),
    (signal.SIGINT, "interrupted: the cache is consistent.\n"),
], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_a_report_is_one_sentence_and_its_exit_code(landed, tmp_path, sig, said):
    """SIGTERM (or Ctrl-C) while `report` writes its HTML (the moment: its process is past the
    imports and reading the cache; the line it prints when done is not there yet)."""
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import os, signal, sys\n"
         "from spark_backend import cli\n"
         "from spark_backend.analysis import html_report\n"
         "real = html_report.build_html\n"
         "def then_term(*a, **k):\n"
         f"    os.kill(os.getpid(), {int(sig)})\n"
         "    return real(*a, **k)\n"
         "html_report.build_html = then_term\n"
         "sys.exit(cli.main(sys.argv[1:]))\n",
         "report", "--cache", str(landed), "--html", str(tmp_path / "r.html")],
        cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + sig
    assert err == said
    assert out == ""


def test_an_imports_duckdb_failure_is_named_as_the_caches_not_sparks(tmp_path):
    """The import's landing runs inside its Spark step: DuckDB's own error (here its memory
    limit) must reach ``cache_failure``, which names the cache and $CSI_DUCKDB_MEMORY, not
    be told as a Spark job that failed."""
    from spark_backend.jobs.files import _spark_step

    def landing():
        raise duckdb.OutOfMemoryException("Out of Memory Error: failed to pin block of size "
                                          "256.0 KiB (121.9 MiB/122.0 MiB used)")

    with pytest.raises(duckdb.OutOfMemoryException) as raised:
        _spark_step(landing, "failed; nothing of it was kept")
    said = cache_failure(tmp_path / "c.duckdb", raised.value)
    assert said.startswith("DuckDB ran out of its memory limit on the cache ")
    assert "CSI_DUCKDB_MEMORY" in said and "Spark" not in said
