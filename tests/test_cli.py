"""The command line: every command on the demo, bad input answered in one line, nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from spark_backend import cli
from spark_backend.analysis import figures, stalls
from spark_backend.analysis.display import short
from spark_backend.cache.store import Cache
from spark_backend.cli import main
from tests.support.demo_cache import DEMO_SEED

ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.2"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def demo_cache(tmp_path_factory, landed_caches):
    """The demo world landed without Spark: the commands that read a cache need no JVM (the
    real demo pull is tested in tests/test_pull_demo.py and by the slow tests here)."""
    path = tmp_path_factory.mktemp("cli") / "demo.duckdb"
    landed_caches.copy(path, DEMO_SEED, float(SCALE))
    return path


def test_report_text_and_json(capsys, demo_cache):
    code, out, _ = run(capsys, "report", "--cache", demo_cache)
    assert code == 0
    assert "stream DemoStream (spanner)" in out and "held back by partition" in out
    code, out, _ = run(capsys, "report", "--cache", demo_cache, "--json")
    report = json.loads(out)
    assert report["records"]["data_change"] > 1000
    assert report["holding_back"] and report["low_watermark"].endswith("Z")


def test_fail_on_stall_exit_code(capsys, demo_cache):
    # Every open partition is at most a heartbeat behind the end: not stalled at 60 s...
    code, _, _ = run(capsys, "report", "--cache", demo_cache, "--fail-on-stall")
    assert code == 0
    # ...but with a threshold below that, the lagging ones are.
    code, out, _ = run(capsys, "report", "--cache", demo_cache, "--stall-after", "0.001",
                       "--fail-on-stall")
    assert code == 3 and "STALLED: partition" in out


def test_history_of_one_key_in_commit_order(capsys, demo_cache):
    code, out, _ = run(capsys, "history", "--cache", demo_cache, "--table", "Accounts", "--json")
    changes = json.loads(out)
    assert code == 0 and changes
    key = changes[0]["keys"]
    code, out, _ = run(capsys, "history", "--cache", demo_cache, "--table", "Accounts",
                       "--key", json.dumps(key), "--json")
    one = json.loads(out)
    assert one and all(c["keys"] == key for c in one)
    stamps = [c["commit_timestamp"] for c in one]
    assert stamps == sorted(stamps)
    assert set(one[0]) >= {"commit_timestamp", "mod_type", "keys", "old_values", "new_values",
                           "transaction_id", "partition"}
    assert {c["mod_type"] for c in changes} <= {"INSERT", "UPDATE", "DELETE"}


@pytest.mark.slow
def test_export_then_import_gives_the_same_stream(capsys, demo_cache, tmp_path):
    out_file = tmp_path / "demo.jsonl"
    code, _, _ = run(capsys, "export", "--cache", demo_cache, "--out", out_file)
    assert code == 0
    first = json.loads(out_file.read_text().splitlines()[0])
    assert first["partition_token"] is None and "child_partitions_record" in first
    other = tmp_path / "replay.duckdb"
    code, out, _ = run(capsys, "import", "--cache", other, "--format", "recording",
                       "--stream", "Replay", out_file)
    assert code == 0 and "imported" in out
    _, a, _ = run(capsys, "report", "--cache", demo_cache, "--json")
    _, b, _ = run(capsys, "report", "--cache", other, "--json")
    a, b = json.loads(a), json.loads(b)
    assert b["records"] == a["records"]
    assert b["edges"] == a["edges"]
    assert b["transactions"] == a["transactions"]
    assert [p["token"] for p in b["partitions"]] == [p["token"] for p in a["partitions"]]
    assert b["holding_back"] == a["holding_back"] and b["duplicates"] == 0
    # Importing the same file again adds nothing.
    code, out, _ = run(capsys, "import", "--cache", other, "--format", "recording",
                       "--stream", "Replay", out_file)
    assert code == 0 and "1 already imported" in out
    _, c, _ = run(capsys, "report", "--cache", other, "--json")
    assert json.loads(c)["records"] == a["records"]


@pytest.mark.slow
def test_malformed_recording_lines_are_counted_and_kept(capsys, tmp_path):
    good = {"partition_token": "t1", "heartbeat_record": {"timestamp": "2022-09-27T12:35:00Z"}}
    lines = [json.dumps(good), '{"partition_token": "t1", "heartbeat_record": {"timest',
             json.dumps({"partition_token": "t1", "heartbeat_record": {
                 "timestamp": "2022-09-27T12:36:00Z"}}), '{"nope": 1}']
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(lines) + "\n")
    cache = tmp_path / "q.duckdb"
    code, out, err = run(capsys, "import", "--cache", cache, "--format", "recording",
                         "--stream", "R", path)
    assert code == 0
    assert "imported 2 records" in out and "2 bad record(s) kept in quarantine" in out
    # stderr holds errors only: the bad lines are part of the summary
    assert "rec.jsonl line 2: not JSON" in out and "rec.jsonl line 4" in out and err == ""
    import duckdb

    with duckdb.connect(str(cache), read_only=True) as con:
        rows = con.execute("SELECT line, raw FROM quarantine ORDER BY line").fetchall()
    assert [r[0] for r in rows] == [2, 4] and rows[1][1] == '{"nope": 1}'


@pytest.mark.parametrize("argv,message", [
    (["pull", "--source", "demo", "--stream", "x; DROP TABLE t"],
     "is not a valid change stream name"),
    (["pull", "--source", "demo", "--start", "2026-01-05T10:00:00Z",
      "--end", "2026-01-05T09:00:00Z"], "is after --end"),
    (["pull", "--source", "demo", "--heartbeat-ms", "500"], "Spanner accepts 1,000 to 300,000"),
    (["pull", "--source", "spanner", "--project", "p", "--instance", "i", "--database", "d",
      "--stream", "S", "--start", "2999-01-01T00:00:00Z", "--end", "2999-01-02T00:00:00Z"],
     "is in the future"),
    (["pull", "--source", "spanner", "--stream", "S"], "needs --project, --instance, --database"),
    (["pull", "--source", "demo", "--start", "yesterday"], "is not a timestamp"),
    (["import", "--format", "parquet", "--stream", "S", "x.jsonl"], "accepted formats are"),
    (["import", "--format", "recording", "--stream", "S", "/no/such/file.jsonl"],
     "does not exist"),
    (["history", "--table", "Accounts", "--key", "[1,2]"], "is a JSON object"),
    (["report", "--stream", "NoSuch"], "No stream 'NoSuch'"),
])
def test_bad_input_is_one_line(capsys, demo_cache, tmp_path, argv, message):
    cache = demo_cache if argv[0] in ("history", "report") else tmp_path / "bad.duckdb"
    before = cache.stat().st_size if cache.exists() else None
    code, out, err = run(capsys, *argv, "--cache", cache)
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if before is not None:
        assert cache.stat().st_size >= before


@pytest.mark.slow
def test_unknown_stream_at_the_source_fails_in_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "pull", "--source", "demo", "--stream", "NoSuchStream",
                       "--cache", tmp_path / "c.duckdb")
    assert code == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "NoSuchStream" in errors[0] and "Traceback" not in err


@pytest.mark.slow
def test_several_streams_need_a_name(capsys, demo_cache, tmp_path):
    import shutil

    copy = tmp_path / "two.duckdb"
    shutil.copy(demo_cache, copy)
    rec = tmp_path / "r.jsonl"
    rec.write_text(json.dumps({"partition_token": "t", "heartbeat_record": {
        "timestamp": "2022-09-27T12:35:00Z"}}) + "\n")
    assert run(capsys, "import", "--cache", copy, "--format", "recording", "--stream", "Other",
               rec)[0] == 0
    code, _, err = run(capsys, "report", "--cache", copy)
    assert code == 2 and "several streams (DemoStream, Other)" in err


def test_the_module_runs_as_a_command(demo_cache):
    env = {**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
    out = subprocess.run([sys.executable, "-m", "spark_backend", "report", "--cache",
                          str(demo_cache), "--json"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stream"] == "DemoStream"


def _command(*argv: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}
    return subprocess.run([sys.executable, "-m", "spark_backend", *argv], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300, check=False, **kw)


def _readers(cache: Path, out_dir: Path) -> dict[str, subprocess.CompletedProcess]:
    return {
        "report": _command("report", "--cache", str(cache)),
        "export": _command("export", "--cache", str(cache), "--out",
                           str(out_dir / "exported.jsonl")),
        "history": _command("history", "--cache", str(cache), "--table", "Accounts", "--json"),
    }


def test_report_export_and_history_read_beside_another_reader(demo_cache, tmp_path):
    """They open the cache read-only: a report beside another that holds the file (a script
    that reads it, a second terminal) works; before, it said 'another process holds it'."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\nfrom spark_backend.cache.store import Cache\n"
         f"c = Cache({str(demo_cache)!r}, read_only=True)\nprint('holding', flush=True)\n"
         "sys.stdin.read()\n"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        done = _readers(demo_cache, tmp_path)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    for name, out in done.items():
        assert out.returncode == 0, (name, out.stderr)
    assert "stream DemoStream (spanner)" in done["report"].stdout
    assert done["export"].stdout.startswith("DemoStream: wrote ")
    assert json.loads(done["history"].stdout)


def test_output_piped_into_head_stops_quietly(demo_cache):
    """``history ... | head -1``: the reader leaves early; the command stops without a word
    (it said 'error: unexpected BrokenPipeError'), with the status of a writer whose reader
    left (141, as SIGPIPE gives)."""
    argv = f"history --cache {demo_cache} --table Accounts"
    whole = _command(*argv.split())
    assert whole.returncode == 0 and len(whole.stdout) > 1_000_000  # far more than a pipe holds
    piped = subprocess.run(
        f"{sys.executable} -m spark_backend {argv} | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True, capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}, executable="/bin/bash")
    assert piped.stdout == whole.stdout.splitlines(keepends=True)[0]
    assert piped.stderr == "" and piped.returncode == 141, (piped.returncode, piped.stderr)


@pytest.mark.slow
def test_a_pull_whose_output_is_closed_goes_on_to_its_end(tmp_path):
    """``pull ... | head -1``: the progress lines have nowhere to go after the first; the pull
    is not stopped by it (nor recorded as a Spark failure): it lands everything, exit 0."""
    from spark_backend.cache.store import Cache

    cache = tmp_path / "piped.duckdb"
    piped = subprocess.run(
        f"{sys.executable} -m spark_backend pull --source demo --demo-scale {SCALE} "
        f"--cache {cache} | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True, capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"}, executable="/bin/bash")
    assert piped.returncode == 0 and piped.stderr == "", (piped.returncode, piped.stderr)
    assert piped.stdout.startswith("wave 0: ")
    with Cache(cache, read_only=True) as c:
        assert c.con.execute("SELECT status, error FROM pulls").fetchall() == [("complete", None)]


@pytest.mark.slow
def test_a_cache_on_a_read_only_file_system(demo_cache, tmp_path):
    """A cache in a read-only place (a read-only mount, as a user gets a colleague's cache):
    report, export and history read it; pull says in one sentence that it needs a writable
    file; a cache left by a killed pull, which must be recovered by a read-write open first,
    says so. Needs root for the mount (``unshare -m``)."""
    import shutil
    import signal

    from tests.support.cluster import unshare_missing

    reason = unshare_missing()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"no read-only mount on CI: {reason}")
        pytest.skip(f"a read-only mount needs: {reason}")
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    shutil.copy(demo_cache, shelf / "demo.duckdb")
    script = (
        "import os, signal\n"
        "from spark_backend.cache.store import Cache\n"
        f"c = Cache({str(shelf / 'killed.duckdb')!r})\n"
        "c.ensure_stream('S', system='spanner')\n"
        "c.begin_pull('S', 'demo', None, None, None)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], cwd=ROOT)
    assert killed.returncode == -signal.SIGKILL
    before = {p.name: p.read_bytes() for p in shelf.iterdir()}
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    py = sys.executable
    cache = shelf / "demo.duckdb"
    steps = [
        f"{py} -m spark_backend report --cache {cache}",
        f"{py} -m spark_backend export --cache {cache} --out {out_dir / 'e.jsonl'}",
        f"{py} -m spark_backend history --cache {cache} --table Accounts --json",
        f"{py} -m spark_backend pull --source demo --demo-scale {SCALE} --cache {cache}",
        f"{py} -m spark_backend report --cache {shelf / 'killed.duckdb'}",
        # a query larger than DuckDB's memory spills: not beside the file, which fails here
        f"{py} -c \"import sys; from spark_backend.cache.store import Cache; "
        f"c = Cache(sys.argv[1], read_only=True, memory_limit='64MB', threads=1); "
        f"print(c.con.execute('SELECT count(*) FROM (SELECT md5(range::VARCHAR) AS h "
        f"FROM range(4000000) ORDER BY h)').fetchone()[0])\" {cache}",
    ]
    body = "; ".join(f"{s} > {out_dir}/{i}.out 2> {out_dir}/{i}.err; echo $? > {out_dir}/{i}.rc"
                     for i, s in enumerate(steps))
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount --bind {shelf} {shelf} && mount -o remount,ro,bind {shelf} && "
         f"! touch {shelf}/probe 2>/dev/null && {body}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "SPANNER_DISABLE_BUILTIN_METRICS": "true"})
    assert done.returncode == 0, done.stderr

    def result(i: int) -> tuple[int, str, str]:
        return (int((out_dir / f"{i}.rc").read_text()), (out_dir / f"{i}.out").read_text(),
                (out_dir / f"{i}.err").read_text())

    for i in range(3):
        code, out, err = result(i)
        assert code == 0 and err == "", (steps[i], err)
    assert "stream DemoStream (spanner)" in result(0)[1]
    assert (out_dir / "e.jsonl").stat().st_size > 0
    code, out, err = result(3)
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith(f"error: Cannot write the cache {cache} (Read-only file system); "), err
    assert "give one in a writable place" in err
    code, out, err = result(4)
    assert code == 1 and err.count("\n") == 1, err
    assert "was left by a pull or import that stopped midway" in err
    assert "Make the file writable, or run that pull or import again." in err
    code, out, err = result(5)
    assert (code, out.strip()) == (0, "4000000"), err[-1000:]
    # Nothing was written under the mount: the files are as they were.
    assert {p.name: p.read_bytes() for p in shelf.iterdir()} == before


def test_the_html_reports_dag_labels_the_worst_stall_as_the_dag_page_does(demo_cache, tmp_path):
    out = tmp_path / "r.html"
    code = main(["report", "--cache", str(demo_cache), "--html", str(out)])
    assert code == 0
    with Cache(demo_cache, read_only=True) as cache:
        found = stalls.stalls(cache.con, "DemoStream", 60.0,
                              stalls.watermark_replay(cache.con, "DemoStream",
                                                      stalls.DEFAULT_POINTS))
    assert found, "the demo world has a stall"
    notes, spans = figures.stall_marks(found)
    (token, note), = notes.items()
    assert note.startswith("silent ") and spans[0][0] == found[0]["partition"] == token
    page = out.read_text()
    assert f"{short(token, 10)} ({note})" in page


@pytest.mark.parametrize("error, said", [
    (PermissionError(13, "Permission denied", "/srv/x.duckdb"),
     "the report could not use /srv/x.duckdb: Permission denied"),
    (MemoryError(), "the report ran out of memory"),
    (RuntimeError("boom\nsecond line"), "no sentence for (RuntimeError: boom)"),
])
def test_an_error_without_its_own_sentence_is_still_one_plain_sentence(error, said):
    line = cli._sentence(error, Namespace(command="report", cache="c.duckdb"))
    assert said in line and "\n" not in line and "unexpected" not in line
