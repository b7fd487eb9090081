"""Bad input at every entry point, table-driven: the command line, imported files, dashboard
forms and URL parameters, the SQL console. Each case checks the exit code (or that the page
did not crash), exactly one error sentence (one stderr line, or one error in place), that the
cache's row counts did not change, and, for files, that every valid record still landed."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.support.cli_here import cli_here
from tests.support.demo_cache import land_world

ROOT = Path(__file__).resolve().parent.parent
MAIN = str(ROOT / "app" / "main.py")
TABLES = ("streams", "pulls", "partitions", "edges", "data_change_records", "mods",
          "heartbeats", "child_partitions_records", "quarantine", "imports", "meta")


def counts(path: Path | str) -> dict[str, int]:
    with Cache(path, read_only=True) as c:
        return {t: c.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def digest(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cli(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CSI_CACHE", None)
    return subprocess.run([sys.executable, "-m", "spark_backend", *argv], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=600)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def place(tmp_path_factory) -> dict[str, Path]:
    """A cache holding a small demo world, and things that are not caches."""
    d = tmp_path_factory.mktemp("bad")
    cache = d / "cache.duckdb"
    with Cache(cache) as c:
        land_world(c, build_world(7, 0.1))
    other = d / "other.duckdb"
    with duckdb.connect(str(other)) as con:
        con.execute("CREATE TABLE people (id INT)")
        con.execute("INSERT INTO people VALUES (1)")
    (d / "text.duckdb").write_text("not a database")
    (d / "folder").mkdir()
    (d / "emptydir").mkdir()
    (d / "good.jsonl").write_text("")
    return {"dir": d, "cache": cache, "other": other, "text": d / "text.duckdb",
            "folder": d / "folder", "emptydir": d / "emptydir"}


# (argv template, exit code, words the one error line must hold)
CLI_CASES = [
    # pull: every value is checked before Spark, a server or an emulator starts
    ("pull --source demo --demo-scale nan --cache {cache}", 2, "--demo-scale"),
    ("pull --source demo --demo-scale -1 --cache {cache}", 2, "--demo-scale"),
    ("pull --source demo --demo-scale inf --cache {cache}", 2, "--demo-scale"),
    ("pull --source demo --demo-scale 1e9 --cache {cache}", 2, "--demo-scale"),
    ("pull --source demo --demo-scale lots --cache {cache}", 2, "--demo-scale"),
    ("pull --source demo --demo-seed -3 --cache {cache}", 2, "--demo-seed"),
    ("pull --source emulator --emulator-seconds -5 --cache {cache}", 2, "--emulator-seconds"),
    ("pull --source emulator --emulator-seconds nan --cache {cache}", 2, "--emulator-seconds"),
    ("pull --source demo --as \"x'; DROP TABLE pulls; --\" --cache {cache}", 2, "--as"),
    ("pull --source demo --as '' --cache {cache}", 2, "--as"),
    ("pull --source demo --stream bad-name! --cache {cache}", 2, "change stream name"),
    ("pull --source demo --heartbeat-ms 5 --cache {cache}", 2, "Heartbeat"),
    ("pull --source demo --heartbeat-ms abc --cache {cache}", 2, "--heartbeat-ms"),
    ("pull --source demo --start yesterday --cache {cache}", 2, "--start"),
    ("pull --source demo --start 2026-01-02T00:00:00Z --end 2026-01-01T00:00:00Z "
     "--cache {cache}", 2, "--start"),
    ("pull --source demo --start 9999-12-31T23:59:59-01:00 --cache {cache}", 2,
     "outside 0001-01-01T00:00:00Z to 9999-12-31"),
    ("pull --source demo --start 2026-01-05T09:00:00+99:99 --cache {cache}", 2,
     "an offset is -23:59 to +23:59"),
    ("pull --source demo --dialect mysql --cache {cache}", 2, "--dialect"),
    ("pull --source nowhere --cache {cache}", 2, "--source"),
    ("pull --source demo --spark-master foo://x --cache {cache}", 2, "--spark-master"),
    ("pull --source demo --spark-remote http://x --cache {cache}", 2, "--spark-remote"),
    ("pull --source demo --spark-master local[0] --cache {cache}", 2, "local[N] (N >= 1)"),
    ("pull --source spanner --cache {cache}", 2, "needs"),
    ("pull --source spanner --project bad/proj --instance i --database d --stream S "
     "--cache {cache}", 2, "project"),
    ("pull --source demo --cache {folder}", 2, "is a folder"),
    ("pull --source demo --demo-scale 0.1 --cache {other}", 1, "not a cache of this tool"),
    ("pull --source demo --demo-scale 0.1 --cache {text}", 1, "not a DuckDB cache file"),
    ("pull --source beam-metadata --cache {cache}", 2, "--table"),
    ("pull --source beam-metadata --project p --instance i --database d --table t "
     "--spark-master local[2] --cache {cache}", 2, "without Spark; leave out --spark-master"),
    ("pull --source beam-metadata --project p --instance i --database d --table x;y "
     "--cache {cache}", 2, "table name"),
    # report
    ("report --stall-after nan --cache {cache}", 2, "--stall-after"),
    ("report --stall-after -5 --cache {cache}", 2, "--stall-after"),
    ("report --stall-after 0 --cache {cache}", 2, "--stall-after"),
    ("report --stream NoSuch --cache {cache}", 2, "No stream 'NoSuch'"),
    ("report --stream 'bad name' --cache {cache}", 2, "--stream"),
    ("report --cache {dir}/missing.duckdb", 2, "No cache file"),
    ("report --cache {other}", 1, "not a cache of this tool"),
    # history
    ("history --table Accounts --key notjson --cache {cache}", 2, "--key"),
    ("history --table Accounts --key [1] --cache {cache}", 2, "--key"),
    ("history --table NoSuchTable --cache {cache}", 2, "No table 'NoSuchTable'"),
    ("history --table '' --cache {cache}", 2, "--table"),
    # export
    ("export --out {folder} --cache {cache}", 2, "is a folder"),
    ("export --out '' --cache {cache}", 2, "--out"),
    ("export --out /proc/version --cache {cache}", 2, "/proc/version"),
    ("export --out /proc/nosuchdir/x.jsonl --cache {cache}", 2, "/proc/nosuchdir"),
    ("export --stream NoSuch --out {dir}/x.jsonl --cache {cache}", 2, "No stream"),
    ("export --out {dir}/x.jsonl --cache {dir}/missing.duckdb", 2, "No cache file"),
    # import: checked before Spark starts
    ("import --format nope --stream S {dir}/good.jsonl --cache {cache}", 2, "Unknown format"),
    ("import --format recording --stream 'bad name' {dir}/good.jsonl --cache {cache}", 2,
     "--stream"),
    ("import --format recording --stream S {dir}/missing.jsonl --cache {cache}", 2,
     "does not exist"),
    ("import --format recording --stream S --option novalue {dir}/good.jsonl --cache {cache}",
     2, "KEY=VALUE"),
    ("import --format recording --stream S --option color=red {dir}/good.jsonl "
     "--cache {cache}", 2, "'color'"),
    ("import --format recording --stream S /dev/zero --cache {cache}", 2,
     "not a regular file"),
    ("import --format recording --stream S {emptydir} --cache {cache}", 2, "No files"),
    ("import --format recording --stream S --spark-master nope {dir}/good.jsonl "
     "--cache {cache}", 2, "--spark-master"),
    ("import --format recording --stream S {dir}/good.jsonl --cache {other}", 1,
     "not a cache of this tool"),
    # the parser itself
    ("frobnicate", 2, "invalid choice"),
    ("pull --no-such-flag 1", 2, "unrecognized arguments"),
]


@pytest.mark.parametrize(("variable", "value", "command"), [
    ("CSI_SPARK_MASTER", "bogus://x", "pull --source demo --cache {dir}/new-m.duckdb"),
    ("SPARK_REMOTE", "http://x", "pull --source demo --cache {dir}/new-r.duckdb"),
    ("CSI_SPARK_MASTER", "local[0]",
     "import --format recording --stream S {dir}/good.jsonl --cache {dir}/new-i.duckdb"),
    ("CSI_SPARK_CONF", "executor.memory=3g", "pull --source demo --cache {dir}/new-c.duckdb"),
    ("CSI_SPARK_CONF", "spark.executor.memory",
     "import --format recording --stream S {dir}/good.jsonl --cache {dir}/new-j.duckdb"),
])
def test_a_bad_spark_setting_in_the_environment_is_named(place, variable, value, command):
    """A Spark URL from the environment is checked before anything starts (no cache file is
    made) and the sentence names the variable, not a flag the user did not give."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), variable: value}
    env.pop("CSI_CACHE", None)
    if variable != "SPARK_REMOTE":
        env.pop("SPARK_REMOTE", None)
    argv = _argv(command, place)
    done = subprocess.run([sys.executable, "-m", "spark_backend", *argv], cwd=str(place["dir"]),
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert f"${variable} {value!r}" in line and "--spark" not in line, line
    assert not Path(argv[argv.index("--cache") + 1]).exists()


def test_spark_settings_beside_spark_connect_are_one_sentence(place):
    """$CSI_SPARK_CONF goes to a classic session; with Spark Connect it would be ignored, so it
    is refused before anything starts."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CSI_SPARK_CONF": "spark.executor.memory=2g",
           "SPARK_REMOTE": "sc://127.0.0.1:1"}
    env.pop("CSI_CACHE", None)
    cache = place["dir"] / "new-connect.duckdb"
    done = subprocess.run([sys.executable, "-m", "spark_backend", "pull", "--source", "demo",
                           "--cache", str(cache)], cwd=str(place["dir"]), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert line.startswith("error: $CSI_SPARK_CONF applies to a classic Spark session"), line
    assert not cache.exists()


def test_an_unwritable_spark_log_is_one_sentence_naming_its_variable(place, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CSI_SPARK_LOG": "/proc/nowhere/spark.log"}
    env.pop("CSI_CACHE", None)
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run([sys.executable, "-m", "spark_backend", "pull", "--source", "demo",
                           "--cache", str(tmp_path / "c.duckdb")], cwd=str(place["dir"]),
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert "/proc/nowhere/spark.log" in line and "$CSI_SPARK_LOG" in line, line


@pytest.mark.parametrize(("argv", "code", "words"), [
    (["--scale", "0"], 2, "--scale 0.0"),
    (["--scale", "nan"], 2, "--scale nan"),
    (["--port", "99999"], 2, "--port 99999"),
    (["--latency-ms", "-1"], 2, "--latency-ms"),
    (["--dialect", "mysql"], 2, "--dialect"),
    (["--port", "PORT_IN_USE"], 1, "give a free --port"),
])
def test_the_demo_servers_command_line_answers_in_one_sentence(argv, code, words):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [sys.executable, "-m", "spark_backend.demo.server",
             *[port if a == "PORT_IN_USE" else a for a in argv]],
            cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)}, input="",
            capture_output=True, text=True, timeout=120)
    assert done.returncode == code, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert words in line, line
    assert done.stdout == ""


def test_an_interrupt_after_a_progress_line_starts_a_line_of_its_own(monkeypatch, capsys):
    """On a terminal the progress is one line redrawn in place: Ctrl-C (or an error) clears it
    before its sentence instead of writing after it; only a pull is told to run again."""
    from spark_backend import cli

    class Terminal:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    def interrupted(args):
        cli._Progress()("wave 1: reading")
        raise KeyboardInterrupt

    for command, said in (("report", "interrupted: the cache is consistent.\n"),
                          ("pull", "interrupted: the cache is consistent; run the same pull "
                                   "again to resume.\n")):
        terminal = Terminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        monkeypatch.setattr(cli, "check_args", lambda args: None)
        monkeypatch.setitem(cli.COMMANDS, command, interrupted)
        assert cli.main([command, "--cache", "unused.duckdb"]) == 130
        assert terminal.text == "\r\033[Kwave 1: reading\r\033[K" + said, terminal.text


def _argv(template: str, place: dict[str, Path]) -> list[str]:
    import shlex

    return shlex.split(template.format(**{k: str(v) for k, v in place.items()}))


@pytest.mark.parametrize(("template", "code", "words"), CLI_CASES,
                         ids=[c[0][:60] for c in CLI_CASES])
def test_command_line(place, template, code, words):
    _refused(place, template, code, words, cli_here)


@pytest.mark.parametrize("template", [CLI_CASES[i][0] for i in (0, 25, 33, 55, 56)])
def test_command_line_in_a_process_of_its_own(place, template):
    """The process boundary: the exit code and the one line of a real ``python -m``."""
    _, code, words = next(case for case in CLI_CASES if case[0] == template)
    _refused(place, template, code, words, cli)


def _refused(place, template, code, words, run) -> None:
    before = counts(place["cache"])
    other_before = digest(place["other"])
    done = run(*_argv(template, place), cwd=place["dir"])
    assert done.returncode == code, (done.returncode, done.stderr)
    line = one_error_line(done.stderr)
    assert words in line, line
    assert counts(place["cache"]) == before
    assert digest(place["other"]) == other_before, "a file that is not our cache was changed"
    assert not list(place["dir"].glob("*.part")) and not list(place["dir"].glob(".*.part"))
    assert not (place["dir"] / "missing.duckdb").exists()


KEY_FILES = {
    "missing": (None, "does not exist"),
    "folder": ("DIR", "is a folder"),
    "notjson": ("not json", "is not JSON"),
    "badtype": ('{"type": "nonsense"}', "has type 'nonsense'"),
}


@pytest.mark.parametrize("kind", list(KEY_FILES))
def test_credential_file_is_named_with_what_is_wrong(place, tmp_path, kind):
    content, words = KEY_FILES[kind]
    key = tmp_path / "key.json"
    if content == "DIR":
        key.mkdir()
    elif content is not None:
        key.write_text(content)
    before = counts(place["cache"])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GOOGLE_APPLICATION_CREDENTIALS": str(key)}
    env.pop("SPANNER_EMULATOR_HOST", None)
    done = subprocess.run(
        [sys.executable, "-m", "spark_backend", "pull", "--source", "spanner", "--project", "p",
         "--instance", "i", "--database", "d", "--stream", "S", "--cache", str(place["cache"])],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert str(key) in line and words in line, line
    assert counts(place["cache"]) == before


def test_export_to_an_unwritable_place_leaves_nothing(place, tmp_path):
    locked = Path("/proc/sys/vm")  # not writable, even by root
    done = cli("export", "--out", str(locked / "x.jsonl"), "--cache", str(place["cache"]),
               cwd=tmp_path)
    assert done.returncode == 2
    assert "not writable" in one_error_line(done.stderr) or "Cannot write" in done.stderr


def test_export_is_atomic_and_complete(place, tmp_path):
    out = tmp_path / "rec.jsonl"
    out.write_text("old content\n")
    done = cli("export", "--out", str(out), "--cache", str(place["cache"]), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = out.read_text().splitlines()
    assert lines and lines[0] != "old content" and json.loads(lines[0])
    assert [p.name for p in tmp_path.iterdir()] == ["rec.jsonl"]


# --- files: one import of good and bad files together ----------------------------------------


def _recording_lines(n: int, skip: int = 0) -> list[str]:
    world = build_world(7, 0.05)
    lines = [json.dumps(line) for line in world.iter_recording(10_000)]
    return lines[skip:skip + n]


FILE_CASES = {
    # name: (content builder, expected valid records landed, words in its quarantine reason)
    "good.jsonl": (lambda: "\n".join(_recording_lines(40)) + "\n", 40, None),
    "bom.jsonl": (lambda: b"\xef\xbb\xbf" + "\n".join(_recording_lines(5, 40)).encode()
                  + b"\n", 5, None),
    "latin1.jsonl": (lambda: "\n".join(_recording_lines(2, 45)).encode() + b"\n"
                     + b'{"partition_token": "caf\xe9", "heartbeat_record": {}}\n', 2,
                     "not UTF-8"),
    "truncated.jsonl.gz": (lambda: gzip.compress(
        ("\n".join(_recording_lines(300, 50)) + "\n").encode())[:1500], None,
        "EOFError"),
    "deep.jsonl": (lambda: _recording_lines(1, 350)[0] + "\n" + "[" * 200_000 + "]" * 200_000
                   + "\n" + _recording_lines(1, 351)[0] + "\n", 2, "nested deeper"),
    "longline.jsonl": (lambda: _recording_lines(1, 352)[0] + "\n" + "x" * 300_000 + "\n", 1,
                       "not JSON"),
    "notjson.jsonl": (lambda: _recording_lines(1, 353)[0] + "\n{oops\n", 1, "not JSON"),
    "wrongshape.jsonl": (lambda: _recording_lines(1, 354)[0] + '\n{"a": 1}\n', 1,
                         "not a recording line"),
    # no line of it is a recording line: one entry saying so, with the file's size and hash
    "binary.jsonl": (lambda: bytes(range(256)) * 4, 0, "not recording: none of its 5 lines"),
    "empty.jsonl": (lambda: b"", 0, None),
    "unreadable.jsonl": (None, 0, "Permission denied"),
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    folder = d / "in"
    folder.mkdir()
    for name, (build, _, _) in FILE_CASES.items():
        if build is None:  # a file nobody may read, even root
            (folder / name).symlink_to("/proc/sys/vm/compact_memory")
            continue
        content = build()
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    cache = d / "files.duckdb"
    done = cli("import", "--format", "recording", "--stream", "F", str(folder), "/dev/zero",
               "--cache", str(cache), cwd=d)
    with Cache(cache, read_only=True) as c:
        quarantine = c.con.execute(
            "SELECT origin, line, reason, raw, raw_bytes FROM quarantine").fetchall()
        imports = {os.path.basename(p): n for p, n in c.con.execute(
            "SELECT path, records FROM imports").fetchall()}
        streams = c.streams()
    return {"done": done, "quarantine": quarantine, "imports": imports, "folder": folder,
            "streams": streams, "dir": d}


@pytest.mark.slow  # the import runs Spark
def test_import_of_good_and_bad_files_succeeds(imported):
    done = imported["done"]
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr


@pytest.mark.slow  # the import runs Spark
@pytest.mark.parametrize("name", list(FILE_CASES))
def test_each_file_lands_or_is_one_quarantined_entry(imported, name):
    _, landed, why = FILE_CASES[name]
    path = str(imported["folder"] / name)
    reasons = [r for r in imported["quarantine"] if r[0] in (path, os.path.realpath(path))]
    if why is None:
        assert reasons == []
    else:
        assert reasons and any(why in r[2] for r in reasons), reasons
        assert all(len(r[3]) <= 200 for r in reasons)  # a preview, never the whole line
    if name == "longline.jsonl":
        assert [r[4] for r in reasons] == [300_000]
    if landed is not None and landed > 0:
        assert imported["imports"].get(name) == landed
    if name == "truncated.jsonl.gz":  # what was readable before the cut landed
        assert imported["imports"].get(name, 0) > 0
    if name == "empty.jsonl":
        assert "empty" in imported["done"].stdout


@pytest.mark.slow  # the import runs Spark
def test_non_regular_file_is_reported(imported):
    assert any(r[0] == "/dev/zero" and "not a regular file" in r[2]
               for r in imported["quarantine"])


@pytest.mark.slow  # the import runs Spark
def test_non_utf8_line_is_kept_unaltered(imported):
    (raw,) = [r[3] for r in imported["quarantine"] if r[0].endswith("latin1.jsonl")]
    assert "\\xe9" in raw and "\ufffd" not in raw


@pytest.mark.slow  # the import runs Spark
def test_an_import_that_lands_nothing_leaves_no_stream(imported):
    d = imported["dir"]
    bad = d / "allbad"
    bad.mkdir()
    (bad / "a.jsonl").write_text("{oops\n")
    (bad / "b.jsonl.gz").write_bytes(gzip.compress(b"x" * 5000)[:40])
    cache = d / "allbad.duckdb"
    Cache(cache).close()
    before = counts(cache)
    done = cli("import", "--format", "recording", "--stream", "G", str(bad), "--cache",
               str(cache), cwd=d)
    assert done.returncode == 2
    assert "Nothing imported into G" in one_error_line(done.stderr)
    assert counts(cache) == before
    with Cache(cache, read_only=True) as c:
        assert c.streams() == []
        assert c.con.execute("SELECT count(*) FROM quarantine").fetchone()[0] == 0


SAMPLES = ROOT / "fixtures" / "samples"


def _sample_lines(rel: str) -> list[bytes]:
    return [line for line in (SAMPLES / rel).read_bytes().splitlines() if line.strip()]


# Every format that reads text, straight through ``formats.read_file`` (what the Spark reader
# runs per file): (format, file bytes, valid rows expected, words of the bad row or None)
FORMAT_CASES = {
    "datastream-bom": ("datastream", lambda: b"\xef\xbb\xbf" + b"\n".join(
        _sample_lines("datastream/mysql_events.jsonl")) + b"\n", 5, None),
    "datastream-latin1": ("datastream", lambda: _sample_lines(
        "datastream/mysql_events.jsonl")[0] + b'\n{"uuid": "caf\xe9"}\n', 1, "not UTF-8"),
    "datastream-deep": ("datastream", lambda: _sample_lines("datastream/mysql_events.jsonl")[0]
                        + b"\n" + b"[" * 100_000 + b"]" * 100_000 + b"\n"
                        + _sample_lines("datastream/mysql_events.jsonl")[1] + b"\n", 2,
                        "nested deeper"),
    "cockroachdb-bom": ("cockroachdb", lambda: b"\xef\xbb\xbf" + _sample_lines(
        "cockroachdb/row.ndjson")[0] + b"\n", 1, None),
    "cockroachdb-truncated-gz": ("cockroachdb", lambda: gzip.compress(b"\n".join(
        _sample_lines("cockroachdb/row.ndjson") * 400) + b"\n")[:600], None, "EOFError"),
    "recording-long-line": ("recording", lambda: b"x" * 100_000 + b"\n", 0, "not JSON"),
    "recording-directory-error": ("recording", None, 0, "IsADirectoryError"),
}


@pytest.mark.parametrize("case", list(FORMAT_CASES))
def test_format_reader_keeps_good_lines_and_quarantines_bad_ones(tmp_path, case):
    from spark_backend import formats

    fmt, build, valid, words = FORMAT_CASES[case]
    path = tmp_path / "f.jsonl"
    if build is None:
        path.mkdir()
    else:
        path.write_bytes(build())
    rows = list(formats.read_file(fmt, str(path), {"table": "t"}))
    bad = [r for r in rows if r["kind"] == "bad"]
    good = [r for r in rows if r["kind"] not in ("bad", "partition_end")]
    if valid is not None:
        assert len(good) >= valid if fmt == "datastream" else len(good) == valid, rows[:3]
    else:
        assert good, "the rows before the failure are kept"
    if words is None:
        assert bad == [], bad
    else:
        extra = json.loads(bad[0]["extra"])
        assert len(bad) == 1 and words in extra["reason"], bad
        assert len(bad[0]["raw"]) <= 200 and "\ufffd" not in bad[0]["raw"]
        if bad[0]["line"] is not None:  # a line's preview, its size and hash; never all of it
            assert extra["raw_bytes"] > 0 and len(extra["raw_sha256"]) == 64
        if case == "recording-long-line":
            assert bad[0]["raw"] == "x" * 199 + "…" and extra["raw_bytes"] == 100_000


# --- dashboard forms and URL parameters --------------------------------------------------------


@pytest.fixture(scope="module")
def dash(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("dash") / "dash.duckdb"
    with Cache(path) as c:
        land_world(c, build_world(7, 0.1))
    return str(path)


def app(cache: str, page: str | None = None, **params: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(MAIN, default_timeout=120)
    at.session_state["cache_path"] = cache
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    if page:
        at.switch_page(f"../pages/{page}.py").run()
    return at


def dash_counts(path: str) -> dict[str, int]:
    with Cache(path) as c:
        return {t: c.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


def _sources(at, **fields):
    for key, value in fields.items():
        widget = at.text_area(key=key) if key == "src_paths" else (
            at.number_input(key=key) if key == "src_heartbeat" else at.text_input(key=key))
        widget.set_value(value)
    at.run()
    at.button(key="src_go").click().run()
    return at


def _sql(at, sql: str):
    at.selectbox(key="sql_ex").set_value("(write your own)").run()
    text = [t for t in at.text_area if t.key.startswith("sql_text")][0]
    text.set_value(sql).run()
    at.button(key="sql_run").click().run()
    return at


DASH_CASES = [
    # (page, URL parameters, action, words in the one error)
    (None, {"stream": "NoSuch"}, None, "No stream 'NoSuch'"),
    (None, {"start": "garbage"}, None, "Range start"),
    (None, {"end": "2026-13-45T00:00:00Z"}, None, "Range end"),
    (None, {"start": "2030-01-01T00:00:00Z", "end": "2020-01-01T00:00:00Z"}, None,
     "before the range start"),
    ("dag", {"partition": "no-such-token"}, None, "No partition 'no-such-token'"),
    ("records", {}, lambda at: at.text_input(key="rec_key").set_value("[1, 2]").run(),
     "A key is a JSON object"),
    ("records", {}, lambda at: at.text_input(key="rec_key").set_value("{not json").run(),
     "JSON"),
    ("transactions", {}, lambda at: at.text_input(key="hist_key_input").set_value(
        "{not json").run(), "The key is not JSON"),
    ("sources", {}, lambda at: _sources(at, src_start="yesterday"), "'yesterday'"),
    ("sources", {}, lambda at: _sources(at, src_heartbeat=0), "heartbeat"),
    ("sql", {}, lambda at: _sql(at, "SELECT * FROM read_csv('/etc/passwd')"), "read_csv()"),
    ("sql", {}, lambda at: _sql(at, "SELECT * FROM '/etc/passwd'"), "cache's own tables"),
    ("sql", {}, lambda at: _sql(at, "DROP TABLE partitions"), "read-only"),
    ("sql", {}, lambda at: _sql(at, "SELECT '127.0.0.1'::INET"), "extension 'inet'"),
    ("sql", {}, lambda at: _sql(at, "ATTACH '/tmp/x.duckdb' AS x"), "read-only"),
    ("sql", {}, lambda at: _sql(at, "SELECT 1; SELECT 2"), "one statement"),
    ("sql", {}, lambda at: _sql(at, "SELEC 1"), "does not parse"),
]


def shown(markdown: str) -> str:
    """What a person reads of an error box's markdown: the pages escape every value's
    punctuation (``app/safe.py``), which renders as the character itself."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown).replace("\u200b", "")


@pytest.mark.parametrize(("page", "params", "action", "words"), DASH_CASES,
                         ids=[f"{c[0]}-{c[3][:30]}" for c in DASH_CASES])
def test_dashboard(dash, page, params, action, words):
    before = dash_counts(dash)
    at = app(dash, page, **params)
    if action is not None:
        action(at)
    assert not at.exception, [e.value for e in at.exception]
    errors = [shown(e.value) for e in at.error]
    assert len(errors) == 1 and words in errors[0], errors
    assert dash_counts(dash) == before


@pytest.mark.parametrize("kind", ["folder", "other", "text"])
def test_dashboard_cache_path_that_is_not_a_cache(place, tmp_path, kind):
    target = place[kind]
    before = digest(target) if target.is_file() else None
    at = app(str(target))
    assert not at.exception, [e.value for e in at.exception]
    # One sentence (the sidebar and the page in its place both show it).
    errors = sorted({shown(e.value) for e in at.error})
    assert len(errors) == 1, errors
    assert {"folder": "is a folder", "other": "not a cache of this tool",
            "text": "not a DuckDB cache file"}[kind] in errors[0]
    if before is not None:
        assert digest(target) == before


def test_dashboard_import_of_a_missing_path_is_one_error(dash, tmp_path, monkeypatch):
    monkeypatch.setenv("CSI_IMPORT_ROOT", str(tmp_path))  # the page reads only under it
    before = dash_counts(dash)
    at = app(dash, "sources")
    at.radio(key="src_source").set_value("files").run()
    _sources(at, src_stream="NewOne", src_paths=str(tmp_path / "missing.jsonl"))
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "does not exist" in errors[0], errors
    assert dash_counts(dash) == before


# --- serving ------------------------------------------------------------------------------------


def _listening(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_dashboard_listens_on_loopback_wherever_started(tmp_path):
    """Started from another folder, with a fresh HOME: loopback only, no usage statistics."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT),
           "CSI_CACHE": str(tmp_path / "c.duckdb")}
    for name in list(env):
        if name.startswith("STREAMLIT_"):
            env.pop(name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", MAIN, "--server.port", str(port),
         "--server.headless", "true"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not _listening(port) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        addresses = _listening(port)
        assert addresses, "the dashboard did not start"
        loopback = {"0100007F", "00000000000000000000000001000000",
                    "0000000000000000FFFF00000100007F"}
        assert addresses <= loopback, addresses
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert "Collecting usage statistics" not in out
    assert not (home / ".streamlit").exists() or not any((home / ".streamlit").iterdir())
