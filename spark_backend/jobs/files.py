"""Importing files (recordings and other systems' change events) through Spark, and exporting
a cached Spanner stream as a recording."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_backend import formats
from spark_backend.cache.store import Cache
from spark_backend.formats import recording
from spark_backend.model.errors import BadInput


@dataclass
class ImportResult:
    stream: str
    files: int
    skipped_files: int
    records: int
    bad: int
    duplicates: int
    bad_examples: list[str]


def expand_paths(paths: Iterable[str]) -> list[Path]:
    """Files given, and every file under folders given (sorted), hidden files left out."""
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*")
                              if p.is_file() and not p.name.startswith(".")))
        elif path.is_file():
            out.append(path)
        else:
            raise BadInput(f"{raw} does not exist; give files or folders to import.")
    if not out:
        raise BadInput("No files to import in " + ", ".join(map(str, paths)) + ".")
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def import_files(
    cache: Cache,
    stream: str,
    fmt: str,
    paths: Iterable[str],
    options: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    spark_master: str | None = None,
) -> ImportResult:
    """Read files of ``fmt`` with Spark (one task per file) into ``stream`` in one transaction.

    A file whose content was imported into the stream before is skipped. Bad lines land in the
    quarantine table and are counted; the valid records still land.
    """
    module = formats.get(fmt)
    files = expand_paths(paths)
    cache.ensure_stream(stream, system=module.SYSTEM, source=fmt)
    known = {r[0] for r in cache.con.execute(
        "SELECT sha256 FROM imports WHERE stream = ?", [stream]).fetchall()}
    todo, hashes, skipped = [], {}, 0
    for path in files:
        digest = _sha256(path)
        if digest in known or digest in hashes.values():
            skipped += 1
            continue
        hashes[str(path.resolve())] = digest
        todo.append(str(path.resolve()))
    if not todo:
        return ImportResult(stream, len(files), skipped, 0, 0, 0, [])
    if progress:
        progress(f"reading {len(todo)} file(s) with Spark")
    from spark_backend.spark.session import is_remote, spark_session

    spark = spark_session(spark_master)
    df = (spark.read.format("change_files")
          .options(format=fmt, paths=json.dumps(todo), **(options or {})).load())
    staging = Path(tempfile.mkdtemp(prefix="csi-import-", dir=cache.path.parent))
    try:
        if is_remote(spark):
            batch: Any = df.toArrow()
        else:
            df.write.mode("overwrite").option("maxRecordsPerFile", 100_000).parquet(
                str(staging / "rows"))
            batch = str(staging / "rows" / "*.parquet")
        pull_id = cache.begin_pull(stream, f"import:{fmt}", None, None, None)
        per_file = _per_file_counts(cache, batch)
        extra = [(
            "INSERT INTO imports (stream, path, sha256, format, records, bad, pull_id) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            [stream, p, hashes[p], fmt, per_file.get(p, (0, 0))[0], per_file.get(p, (0, 0))[1],
             pull_id],
        ) for p in todo]
        stats = cache.ingest(stream, pull_id, batch, count_existing_as_duplicates=True,
                             extra_sql=extra)
        examples = _bad_examples(cache, batch)
        cache.finish_pull(pull_id, "complete")
        _widen_range(cache, stream)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ImportResult(stream, len(files), skipped, stats.data_change + stats.heartbeats
                        + stats.child_partitions, stats.bad, stats.duplicates, examples)


def _per_file_counts(cache: Cache, batch: Any) -> dict[str, tuple[int, int]]:
    rows = cache.scan(batch, "SELECT origin, count(*) FILTER (WHERE kind <> 'bad'), "
                               "count(*) FILTER (WHERE kind = 'bad') FROM b GROUP BY origin")
    return {r[0]: (int(r[1]), int(r[2])) for r in rows if r[0] is not None}


def _bad_examples(cache: Cache, batch: Any, limit: int = 5) -> list[str]:
    rows = cache.scan(batch, "SELECT origin, line, extra ->> 'reason' FROM b WHERE kind = 'bad'"
                               f" ORDER BY origin, line LIMIT {int(limit)}")
    return [f"{os.path.basename(o or '?')} line {line}: {reason}" if line is not None
            else f"{os.path.basename(o or '?')}: {reason}" for o, line, reason in rows]


def _widen_range(cache: Cache, stream: str) -> None:
    """An import's range is what its records span."""
    cache.con.execute(
        """UPDATE streams SET range_start = r.lo, range_end = r.hi
           FROM (SELECT min(ts) AS lo, max(ts) AS hi FROM progress_marks WHERE stream = $s) r
           WHERE streams.stream = $s""",
        {"s": stream},
    )


# --- export ----------------------------------------------------------------------------------


def export_recording(cache: Cache, stream: str, out: str | Path) -> int:
    """Write the stream as a recording (JSON Lines, DESIGN.md); returns the lines written.

    Order: the initial query's rows first, then per partition in the order it returned them.
    Streams through the cache in chunks; a duplicate delivered N times is written N times.
    """
    info = cache.stream_info(stream)
    if info is None or info["system"] != "spanner":
        raise BadInput(f"Only Spanner streams export as recordings; {stream!r} is "
                       f"{info['system'] if info else 'not in the cache'}.")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    con = cache.cursor()
    written = 0
    tmp = out.with_suffix(out.suffix + ".part")
    # MUTABLE_KEY_RANGE streams export their ChangeStreamRecords (recording.py).
    (mutable,) = con.execute("SELECT count(*) > 0 FROM partition_records WHERE stream = ?",
                             [stream]).fetchone()
    with open(tmp, "w", encoding="utf-8") as f:
        cur = con.execute(
            """
            SELECT partition_token, epoch_ns(start_timestamp) AS ts, 2 AS k, record_sequence,
                   NULL AS record_key, child_partitions, copies
              FROM child_partitions_records WHERE stream = $s
            UNION ALL
            SELECT partition_token, epoch_ns(timestamp),
                   CASE kind WHEN 'partition_start' THEN 3 WHEN 'partition_event' THEN 4
                             ELSE 5 END,
                   record_sequence, NULL,
                   to_json([partition_tokens, move_in, move_out])::VARCHAR, copies
              FROM partition_records WHERE stream = $s
            UNION ALL
            SELECT partition_token, epoch_ns(timestamp), 1, NULL, NULL, NULL, copies
              FROM heartbeats WHERE stream = $s
            UNION ALL
            SELECT partition_token, epoch_ns(commit_timestamp), 0, record_sequence, record_key,
                   NULL, copies
              FROM data_change_records WHERE stream = $s
            ORDER BY partition_token NULLS FIRST, ts, k, record_sequence""",
            {"s": stream},
        )
        while chunk := cur.fetchmany(5000):
            keys = [r[4] for r in chunk if r[2] == 0]
            details = _data_change_details(cache, stream, keys)
            for token, ts, kind, seq, key, children, copies in chunk:
                if kind == 2:
                    line = recording.child_partitions_line(token, ts, seq, children)
                elif kind == 1:
                    line = recording.heartbeat_line(token, ts)
                elif kind >= 3:
                    line = _partition_record_line(token, ts, kind, seq, children)
                else:
                    row, mods = details[key]
                    line = (recording.stream_data_change_line(row, mods) if mutable
                            else recording.data_change_line(row, mods))
                text = json.dumps(line, ensure_ascii=False, separators=(",", ":"))
                for _ in range(copies or 1):
                    f.write(text + "\n")
                    written += 1
    con.close()
    os.replace(tmp, out)
    return written


def _partition_record_line(token, ts, kind, seq, payload) -> dict[str, Any]:
    tokens, move_in, move_out = (None if v is None else json.dumps(v)
                                 for v in json.loads(payload))
    if kind == 3:
        return recording.partition_start_line(token, ts, seq, tokens)
    if kind == 4:
        return recording.partition_event_line(token, ts, seq, move_in, move_out)
    return recording.partition_end_line(token, ts, seq)


def _data_change_details(cache: Cache, stream: str, keys: list[str]) -> dict[str, Any]:
    if not keys:
        return {}
    con = cache.cursor()
    try:
        cur = con.execute(
            """SELECT d.*, epoch_ns(d.commit_timestamp) AS commit_ns FROM data_change_records d
               WHERE d.stream = ? AND d.record_key IN (SELECT unnest(?::VARCHAR[]))""",
            [stream, keys],
        )
        names = [c[0] for c in cur.description]
        rows = {r[names.index("record_key")]: dict(zip(names, r, strict=True))
                for r in cur.fetchall()}
        mods: dict[str, list] = {k: [] for k in rows}
        for key, keys_json, new, old in con.execute(
            """SELECT record_key, keys, new_values, old_values FROM mods
               WHERE stream = ? AND record_key IN (SELECT unnest(?::VARCHAR[]))
               ORDER BY record_key, mod_index""",
            [stream, keys],
        ).fetchall():
            mods[key].append({"keys": json.loads(keys_json), "new_values": json.loads(new),
                              "old_values": json.loads(old)})
        return {k: (rows[k], mods[k]) for k in rows}
    finally:
        con.close()
