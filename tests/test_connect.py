"""The pull through Spark Connect: a Connect server started from the installed pyspark (the
spark-connect jar that ships in its jars), the CLI with ``--spark-remote`` and SPARK_REMOTE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_backend.cache.store import Cache
from spark_backend.demo.world import build_world
from tests.support.cluster import connect_server, free_port
from tests.test_cluster import assert_no_spark_output, cli
from tests.test_pull_demo import assert_equals_world

pytestmark = pytest.mark.slow  # Spark in this process, or in the processes it starts

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One Spark Connect server for the module (its sc:// URL)."""
    with connect_server(tmp_path_factory.mktemp("connect") / "logs", master="local[2]",
                        project_root=ROOT) as url:
        yield url


def test_pull_through_spark_connect_equals_the_ground_truth(server, tmp_path):
    url = server
    out = cli("pull", "--source", "demo", "--spark-remote", url,
              "--cache", str(tmp_path / "flag.duckdb"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pulled 28,000 records from 41 partitions" in out.stdout
    assert_no_spark_output(out)
    with Cache(tmp_path / "flag.duckdb") as cache:
        assert_equals_world(cache, "DemoStream", build_world())
    # SPARK_REMOTE alone selects the same server; a one-line script gets a session.
    script = ("from spark_backend.spark.session import spark_session, is_remote\n"
              "s = spark_session()\n"
              "print(is_remote(s), s.range(5).count())\n")
    env = dict(os.environ, SPARK_REMOTE=url)
    probe = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["True", "5"], probe.stderr[-2000:]
    assert_no_spark_output(probe)


def test_import_through_spark_connect_equals_a_local_import(server, spark, tmp_path):
    """The files are uploaded to the server (addArtifacts) and read by its executors from
    there; the CLI prints and the cache holds exactly what a local import of the same files
    (in this process, on the suite's local session) prints and holds."""
    from tests.support.imports import IMPORTS, cache_contents, copy_samples, local_import

    samples = copy_samples(tmp_path / "samples")
    local = local_import(samples, tmp_path / "local.duckdb")
    for fmt, folder in IMPORTS:
        out = cli("import", "--cache", str(tmp_path / "connect.duckdb"), "--format", fmt,
                  "--stream", fmt, str(samples / folder), "--spark-remote", server)
        assert out.returncode == 0, (fmt, out.stderr[-3000:])
        assert_no_spark_output(out)
        # its progress lines, then what it imported: as the local import says it
        assert out.stdout[out.stdout.index(f"{fmt}: imported"):] == local[fmt]
    remote = cache_contents(tmp_path / "connect.duckdb")
    assert remote == cache_contents(tmp_path / "local.duckdb")
    assert sum(len(rows) for rows in remote.values()) > 100


def test_no_connect_server_is_one_sentence(tmp_path):
    url = f"sc://127.0.0.1:{free_port()}"
    out = cli("pull", "--source", "demo", "--spark-remote", url,
              "--cache", str(tmp_path / "c.duckdb"), timeout=120)
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and url in lines[0], lines
    out = cli("pull", "--source", "demo", "--spark-remote", "http://nope",
              "--cache", str(tmp_path / "c.duckdb"), timeout=120)
    assert out.returncode == 2 and "sc://HOST[:PORT]" in out.stderr, out.stderr


def test_a_connect_url_that_leads_to_no_connect_server_is_one_sentence(server, tmp_path):
    """A web server's port, and the real server asked through TLS (``;token=`` makes the
    Connect client use TLS to any host but localhost): the client retried for minutes without
    a word (gRPC's handshake errors on the terminal); now one sentence each, before a session."""
    import http.server
    import threading

    web = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = f"sc://127.0.0.1:{web.server_address[1]}"
        out = cli("pull", "--source", "demo", "--spark-remote", url,
                  "--cache", str(tmp_path / "c.duckdb"), timeout=120)
    finally:
        web.shutdown()
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        f"error: Spark Connect at {url} cannot be used: a web server answers at "
        f"127.0.0.1:{web.server_address[1]}, not a Spark Connect (gRPC) server."], out.stderr
    secret = "s3cret-token"
    out = cli("pull", "--source", "demo", "--spark-remote", f"{server}/;token={secret}",
              "--cache", str(tmp_path / "c.duckdb"), timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
    assert "does not speak TLS" in lines[0] and ";token= to any host but localhost" in lines[0]
    assert secret not in out.stderr + out.stdout and ";token=(hidden)" in lines[0], lines
    assert_no_spark_output(out)


def test_an_explicit_master_wins_over_an_exported_spark_remote(tmp_path):
    """SPARK_REMOTE names a Connect server nobody runs: a pull given --spark-master uses that
    master (it would fail at once if it went to the server)."""
    url = f"sc://127.0.0.1:{free_port()}"
    out = cli("pull", "--source", "demo", "--demo-scale", "0.05", "--spark-master", "local[1]",
              "--cache", str(tmp_path / "c.duckdb"), env={"SPARK_REMOTE": url}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pulled" in out.stdout and url not in out.stdout + out.stderr
    assert_no_spark_output(out)



def test_a_users_own_connect_session_reads_the_stream_with_read_format(server, tmp_path):
    """A data engineer's job, as the README shows it, in a Spark Connect session of its own:
    the rows it gets are every record of the range once."""
    from spark_backend.demo.server import DemoServer
    from tests.support import batch_job
    from tests.test_datasource_range import options

    world = build_world(7, 0.1)
    out = tmp_path / "records.parquet"
    with DemoServer(world) as demo:
        job = subprocess.run(
            [sys.executable, "-m", "tests.support.batch_job", server,
             json.dumps(options(world, demo.start())), str(out)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    batch_job.check(out, world)
