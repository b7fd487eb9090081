"""The command line on a changefeed that carries no commit times (CockroachDB without
``updated``): ``history`` and ``report`` answer with the records, never "unexpected TypeError"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from app import samples
from spark_backend.cache.store import Cache
from spark_backend.formats import cockroachdb
from spark_backend.model import records

ROOT = Path(__file__).resolve().parent.parent
STREAM = "Untimed"


def _land_untimed(path: Path) -> int:
    sample = samples.by_key("sample_cockroachdb_diff")
    rows = list(cockroachdb.parse_file(str(sample.file), dict(sample.options)))
    with Cache(str(path)) as cache:
        cache.ensure_stream(STREAM, system="cockroachdb", source="cockroachdb")
        pull_id = cache.begin_pull(STREAM, "cockroachdb", None, None, None)
        cache.ingest(STREAM, pull_id, pa.Table.from_batches([records.to_arrow_batch(rows)]))
        cache.finish_pull(pull_id, "complete", waves=1)
        timed = cache.con.execute(
            "SELECT count(commit_timestamp) FROM data_change_records").fetchone()[0]
    assert timed == 0  # the sample really carries no time
    return sum(1 for r in rows if r.get("kind") == "data_change")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "spark_backend", *argv], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_history_and_report_of_an_untimed_changefeed(tmp_path):
    cache = tmp_path / "untimed.duckdb"
    changes = _land_untimed(cache)
    out = _cli("history", "--cache", str(cache), "--table", "rides", "--json")
    assert out.returncode == 0, out.stderr
    items = json.loads(out.stdout)
    assert len(items) == changes >= 1
    assert all(it["commit_timestamp"] is None for it in items)
    text = _cli("history", "--cache", str(cache), "--table", "rides")
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("(no time) ")
    report = _cli("report", "--cache", str(cache), "--json")
    assert report.returncode == 0, report.stderr
    assert "unexpected" not in report.stderr
