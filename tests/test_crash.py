"""SIGKILL at any moment of a pull leaves a cache that the next pull completes exactly, first
try: during Spark's start, mid-wave, among the landings of the tasks' results, and while
extending a cached range. Each run is
the real command line (``python -m spark_backend pull --source demo``) on a small demo world,
checked against the world's ground truth."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.test_pull_demo import (
    assert_equals_world,
    cached_records,
    transaction_summaries,
    truth_records,
)

ROOT = Path(__file__).resolve().parent.parent
SCALE = "0.3"
STREAM = "DemoStream"


def _env(tmp: Path | None = None) -> dict[str, str]:
    """The commands' environment; ``tmp``: their temporary folder ($TMPDIR), made here."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    if tmp is not None:
        tmp.mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp)
    return env


def _pull(cache: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "spark_backend", "pull", "--source", "demo", "--demo-scale",
         SCALE, "--cache", str(cache), *extra],
        cwd=str(ROOT), env=_env(cache.parent / "tmp"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
        except OSError:
            continue
        out.extend(int(c) for c in children)
        todo.extend(int(c) for c in children)
    return out


def _has_jvm(pid: int) -> bool:
    for child in _descendants(pid):
        try:
            if b"java" in Path(f"/proc/{child}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


def _kill_when(proc: subprocess.Popen, cache: Path, moment: str) -> None:
    """Wait for the moment, then SIGKILL the pull and everything it started."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        seen = "".join(lines)
        if proc.poll() is not None:
            pytest.fail(f"the pull ended before the moment {moment!r}: {seen[-500:]} "
                        f"{proc.stderr.read()[-500:]}")
        # A landing's own progress line ends "- landed" (a line of reading may say how many
        # of the records read landed: "(N landed)").
        hit = {
            "spark-start": _has_jvm(proc.pid) and "wave" not in seen,
            "mid-wave": "reading" in seen and "- landed" not in seen,
            # The first task's results landed while the other tasks' results stream in and
            # land, each in its own transaction: the kill falls among the landings.
            "mid-ingest": "- landed" in seen,
        }[moment]
        if hit:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the moment {moment!r} never came")
    pids = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:  # children that left the process group (the JVM, Python workers)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def _complete(cache: Path, *extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spark_backend", "pull", "--source", "demo", "--demo-scale",
         SCALE, "--cache", str(cache), *extra],
        cwd=str(ROOT), env=_env(cache.parent / "tmp"), capture_output=True, text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "error" not in done.stderr.lower(), done.stderr


def _check_after(cache: Path, world, killed: int, heartbeats: bool) -> None:
    with Cache(cache) as c:
        assert_equals_world(c, STREAM, world, heartbeats=heartbeats)
        pulls = c.con.execute("SELECT pull_id, status FROM pulls ORDER BY pull_id").fetchall()
    statuses = [s for _, s in pulls]
    assert statuses.count("interrupted") == killed, pulls
    assert statuses[-1] == "complete" and "running" not in statuses, pulls
    assert [p for p, _ in pulls] == list(range(1, len(pulls) + 1))
    left = [p.name for p in cache.parent.iterdir() if p.name.startswith("csi-")]
    assert left == [], left


@pytest.fixture(scope="module")
def world():
    return build_world(scale=float(SCALE))


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["spark-start", "mid-wave", "mid-ingest"])
def test_sigkill_then_one_pull_completes_exactly(tmp_path, world, moment):
    cache = tmp_path / "c.duckdb"
    _kill_when(_pull(cache), cache, moment)
    # Spark's folders are in the killed command's scratch folder, which the next start removes
    (scratch,) = (tmp_path / "tmp").iterdir()
    assert scratch.name.startswith("csi-spark-"), scratch
    if moment != "spark-start":
        assert list(scratch.glob("blockmgr-*")), list(scratch.iterdir())
    if moment == "mid-ingest":
        # The killed pull's landings left the transaction summary to its end, which never
        # came: the next read-write open (e.g. the dashboard's) brings it up to date.
        with Cache(cache) as c:
            (records,) = c.con.execute("SELECT count(*) FROM data_change_records").fetchone()
            txns, wrong = transaction_summaries(c, STREAM)
        assert records > 0 and txns > 0 and wrong == 0
    _complete(cache)
    assert list((tmp_path / "tmp").iterdir()) == []
    # A pull killed before it landed anything leaves heartbeats as one pull reads them.
    _check_after(cache, world, killed=0 if moment == "spark-start" else 1,
                 heartbeats=moment == "spark-start")


@pytest.mark.slow
def test_sigkill_while_extending_a_range(tmp_path, world):
    cache = tmp_path / "c.duckdb"
    mid = world.start + (world.end - world.start) // 2
    from spark_backend.model.timestamps import format_ns

    _complete(cache, "--end", format_ns(mid))
    with Cache(cache) as c:
        first = cached_records(c, STREAM)
    assert first == truth_records(world, mid)
    _kill_when(_pull(cache), cache, "mid-wave")
    _complete(cache)
    _check_after(cache, world, killed=1, heartbeats=False)


@pytest.mark.slow
def test_a_cache_killed_before_anything_landed_is_read_by_report_and_every_page(tmp_path,
                                                                                 world):
    """Killed after the first query named the partitions, before anything else landed (no time
    read yet): the report (text and JSON), export and every dashboard page read it (the report
    failed with 'unexpected ValueError' and the Overview raised: no lag to measure); the next
    pull then completes it exactly."""
    import json
    import re

    cache = tmp_path / "c.duckdb"
    # The pull's own code, killed right after its first query landed: the moment, every time.
    script = (
        "import os, signal, sys\n"
        "from spark_backend.cache.store import Cache\n"
        "from spark_backend.jobs import pull\n"
        "from spark_backend.jobs.pull_sources import DemoSource\n"
        "first = pull._initial_query\n"
        "def then_die(*args, **kwargs):\n"
        "    first(*args, **kwargs)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "pull._initial_query = then_die\n"
        f"pull.run_pull(Cache(sys.argv[1]), pull.PullRequest(DemoSource(scale={SCALE}),"
        " reader='here'))\n"
    )
    killed = subprocess.run([sys.executable, "-c", script, str(cache)], cwd=str(ROOT),
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]

    def command(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", *argv], cwd=str(ROOT), env=_env(),
                              capture_output=True, text=True, timeout=300)

    text = command("spark_backend", "report", "--cache", str(cache))
    assert text.returncode == 0, text.stderr
    assert "stream DemoStream (spanner) (no time read yet)" in text.stdout
    counted = re.search(r"partitions: (\d+) \(0 finished, (\d+) not finished\)", text.stdout)
    assert counted and counted.group(1) == counted.group(2) and int(counted.group(1)) > 0, \
        text.stdout
    report = json.loads(command("spark_backend", "report", "--cache", str(cache),
                                "--json").stdout)
    assert report["partitions"] and not any(p["stalled"] for p in report["partitions"])
    exported = command("spark_backend", "export", "--cache", str(cache), "--out",
                       str(tmp_path / "e.jsonl"))
    assert exported.returncode == 0, exported.stderr
    shown = command("tests.support.dashboard_run", "pages", str(cache))
    assert shown.returncode == 0, shown.stderr[-2000:]
    pages = json.loads(shown.stdout.strip().splitlines()[-1])
    assert len(pages) == 7 and all(not p["exceptions"] and not p["errors"]
                                   for p in pages.values()), pages
    assert pages["dag"]["charts"] == 1  # the partitions the first query named, each at its
    # start, and why they have no length (the bars of no width drew nothing before stop 59)
    assert any(n.startswith("No time read yet: each partition is drawn at its start")
               for n in pages["dag"]["notes"]), pages["dag"]
    with Cache(cache) as c:
        assert c.con.execute("SELECT status FROM pulls").fetchall() == [("interrupted",)]
    _complete(cache)
    _check_after(cache, world, killed=1, heartbeats=False)


# --- the cache's own recovery, on a real process killed with SIGKILL ------------------------


def test_pull_ids_and_statuses_after_a_sigkill(tmp_path):
    cache = tmp_path / "c.duckdb"
    script = (
        "import os, signal\n"
        "from spark_backend.cache.store import Cache\n"
        f"c = Cache({str(cache)!r})\n"
        "c.ensure_stream('S', system='spanner')\n"
        "c.begin_pull('S', 'demo', None, None, None)\n"
        "c.begin_pull('S', 'demo', None, None, None)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=_env(), cwd=str(tmp_path))
    assert done.returncode == -signal.SIGKILL
    with Cache(cache) as c:
        rows = c.con.execute("SELECT pull_id, status, error FROM pulls ORDER BY 1").fetchall()
        assert [(r[0], r[1]) for r in rows] == [(1, "interrupted"), (2, "interrupted")]
        assert all("killed or crashed" in r[2] for r in rows)
        assert c.begin_pull("S", "demo", None, None, None) == 3
        # A pull running in this very process is not closed by another open of the cache.
        with Cache(cache) as again:
            assert again.con.execute(
                "SELECT status FROM pulls WHERE pull_id = 3").fetchone() == ("running",)
        c.finish_pull(3, "complete")


def _staging(parent: Path, name: str, owner: Path | None) -> Path:
    folder = parent / name
    (folder / "wave-1").mkdir(parents=True)
    (folder / "wave-1" / "part-0.parquet").write_bytes(b"x")
    if owner is not None:
        (folder / ".csi-owner.json").write_text(f'{{"cache": "{owner.resolve()}", "pid": 1}}')
    return folder


def test_staging_of_dead_runs_is_removed_and_nothing_else(tmp_path):
    mine, other = tmp_path / "mine.duckdb", tmp_path / "other.duckdb"
    Cache(other).close()
    ours = _staging(tmp_path, "csi-pull-ours", mine)
    theirs = _staging(tmp_path, "csi-pull-theirs", other)
    unmarked = _staging(tmp_path, "csi-import-unmarked", None)
    unrelated = _staging(tmp_path, "keep-me", None)
    with Cache(mine) as c:
        live = c.staging_dir("pull")
        assert not ours.exists()
        assert theirs.exists() and unmarked.exists() and unrelated.exists()
        with Cache(mine):  # another open in this process keeps the live folder
            assert live.exists()
        c.release_staging(live)
        assert not live.exists()
    other.unlink()
    Cache(mine).close()  # alone in the folder now: unmarked folders are this cache's
    assert not unmarked.exists() and theirs.exists() and unrelated.exists()


def test_a_duckdb_file_that_is_not_our_cache_is_refused_untouched(tmp_path):
    import duckdb

    from spark_backend.model.errors import CacheError

    path = tmp_path / "theirs.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE people AS SELECT 1 AS id")
    before = path.read_bytes()
    with pytest.raises(CacheError, match=r"not a cache of this tool .* left untouched"):
        Cache(path)
    with pytest.raises(CacheError, match="not a cache of this tool"):
        Cache(path, read_only=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.duckdb"]
