"""Importing files (recordings and other systems' change events) through Spark, and exporting
a cached Spanner stream as a recording."""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import duckdb

from spark_backend import formats
from spark_backend.cache.store import Cache
from spark_backend.formats import recording
from spark_backend.jobs.import_plan import (
    RANGE_BYTES,
    Part,
    PlannedFile,
    check_unchanged,
    plan_file,
    plan_gzip,
    tasks_of,
)
from spark_backend.model.errors import BadInput, InspectorError

# Input bytes of one Spark job at most (see _next_window); its results stay below the session's
# spark.driver.maxResultSize (spark.session).
JOB_BYTES = 256 * 1024 * 1024
# What Spark's error says when a job's results are more than its driver takes back, or more
# than a task can pack in a local session's heap (the executor shares the driver's JVM).
_RESULT_LIMIT = "spark.driver.maxResultSize"
_HEAP = "java.lang.OutOfMemoryError"


@dataclass
class ImportResult:
    stream: str
    files: int
    skipped_files: int
    records: int
    bad: int
    duplicates: int
    bad_examples: list[str]
    notes: list[str] = field(default_factory=list)  # files that gave nothing, and why


def scan_paths(paths: Iterable[str]) -> tuple[list[Path], list[tuple[str, str]]]:
    """(regular files given or under folders given, sorted, hidden ones left out; the other
    entries with why they are not read). A path that does not exist is BadInput."""
    files: list[Path] = []
    other: list[tuple[str, str]] = []
    for raw in paths:
        path = Path(raw)
        if not os.path.lexists(path):
            raise BadInput(f"{raw} does not exist; give files or folders to import.",
                           field="paths")
        if path.is_dir():
            try:
                entries = sorted(p for p in path.rglob("*") if not p.name.startswith("."))
            except OSError as e:
                other.append((str(path), f"cannot list the folder ({e.strerror or e})"))
                continue
            for entry in entries:
                if entry.is_file():
                    files.append(entry)
                elif not entry.is_dir():
                    other.append((str(entry), _not_regular(entry)))
        elif path.is_file():
            files.append(path)
        else:
            other.append((str(path), _not_regular(path)))
    return files, other


def _not_regular(path: Path) -> str:
    if path.is_symlink() and not path.exists():
        try:
            os.stat(path)
        except OSError as e:
            if e.errno == errno.ELOOP:
                return "a symbolic link in a loop (it leads back to itself); give a file"
        return "a broken symbolic link"
    return "not a regular file (a device, pipe or socket); only files are imported"


def expand_paths(paths: Iterable[str]) -> list[Path]:
    """The regular files to import; BadInput when there are none."""
    paths = list(paths)
    files, other = scan_paths(paths)
    if not files:
        if other:
            where, why = other[0]
            raise BadInput(f"Nothing to import: {where} is {why}.", field="paths")
        raise BadInput("No files to import in " + ", ".join(map(str, paths)) + ".",
                       field="paths")
    return files


@dataclass
class _Plan:
    files: list[PlannedFile] = field(default_factory=list)  # for Spark, resolved, in order
    hashes: dict[str, str] = field(default_factory=dict)     # resolved path: sha256
    skipped: int = 0                                         # content imported before
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason): quarantined
    notes: list[str] = field(default_factory=list)


def _plan(files: list[Path], other: list[tuple[str, str]], known: set[str],
          module: ModuleType, range_bytes: int, staging: Callable[[], str]) -> _Plan:
    """The files hashed and cut into parts; a ``.gz`` file of a format read in pieces is
    decompressed into the folder ``staging()`` gives (``import_plan.plan_gzip``)."""
    plan = _Plan(failed=list(other))
    for path in files:
        resolved = str(path.resolve())
        try:
            planned = None
            if _gzip_head(resolved):
                planned = plan_gzip(resolved, module, staging(), range_bytes)
            planned = planned or plan_file(resolved, module, range_bytes)
        except OSError as e:
            plan.failed.append((str(path), f"cannot read the file ({e.strerror or e})"))
            continue
        if planned.parts[-1].end == 0:
            plan.notes.append(f"{path} is empty; nothing to import from it.")
            continue
        if planned.sha256 in known or planned.sha256 in plan.hashes.values():
            plan.skipped += 1
            if planned.origin:
                os.remove(planned.path)
            continue
        plan.hashes[planned.path] = planned.sha256
        plan.files.append(planned)
    plan.notes.extend(f"{where}: {why}; kept in quarantine." for where, why in plan.failed)
    return plan


def _gzip_head(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def import_files(
    cache: Cache,
    stream: str,
    fmt: str,
    paths: Iterable[str],
    options: dict[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    spark_master: str | None = None,
    spark_remote: str | None = None,
    range_bytes: int = RANGE_BYTES,
) -> ImportResult:
    """Read files of ``fmt`` with Spark into ``stream`` in one transaction, in bounded memory.

    The files are on this machine. Each is hashed and cut into parts of about
    ``range_bytes`` of whole lines where its format allows (``jobs.import_plan``); Spark
    tasks read a part each, or several small files; jobs of a few tasks at a time
    (``_Reading``) send the rows back packed (``spark.file_parts``), and they land chunk by
    chunk, each copied into DuckDB (``ingest_stream``'s ``copy``): neither Spark's driver nor
    this process ever holds a whole file's rows (what the transaction keeps until its commit
    goes to DuckDB's temporary folder beside the cache, about the files' size). Only this
    process touches the cache. On a cluster or Spark Connect the files travel to the
    executors through Spark (``spark.local_files``). ``progress`` hears a line per part read.

    A file whose content was imported into the stream before is skipped. Bad lines land in the
    quarantine table as previews (``formats.lines``) and are counted; the valid records still
    land. A file none of whose lines is of ``fmt`` is one quarantine entry ("not <fmt>"). A file
    that cannot be read at all (unreadable, not a regular file, failing in any way while read)
    is one quarantined entry with its reason, and every other file lands. Empty files are
    reported in ``notes``. A file that changes while it is read fails the import (BadInput,
    ``import_plan.check_unchanged``). An import that fails keeps nothing and leaves no stream
    behind that it created.
    """
    module = formats.get(fmt)
    paths = list(paths)
    files, other = scan_paths(paths)
    if not files:
        expand_paths(paths)  # raises: nothing to import, and why
    created = cache.stream_info(stream) is None
    cache.ensure_stream(stream, system=module.SYSTEM, source=fmt)
    try:
        result = _import(cache, stream, fmt, module, files, other, options,
                         progress or (lambda _line: None), (spark_master, spark_remote),
                         range_bytes)
    except BaseException:
        if created:
            _drop_stream(cache, stream)
        raise
    if created and result.records == 0:  # a new stream with nothing in it is not kept
        _drop_stream(cache, stream)
        why = (result.bad_examples or result.notes or ["no record in the file(s)"])[0]
        raise BadInput(f"Nothing imported into {stream}: no valid record ({why}).",
                       field="paths")
    return result


def _import(cache, stream, fmt, module, files, other, options, say, spark_at,
            range_bytes) -> ImportResult:
    known = {r[0] for r in cache.con.execute(
        "SELECT sha256 FROM imports WHERE stream = ?", [stream]).fetchall()}
    staged: list[Path] = []

    def staging() -> str:
        if not staged:
            staged.append(cache.staging_dir("import"))
        return str(staged[0])

    try:
        return _import_planned(cache, stream, fmt, module, options, say, spark_at,
                               range_bytes, len(files) + len(other),
                               _plan(files, other, known, module, range_bytes, staging))
    finally:
        for folder in staged:
            cache.release_staging(folder)


def _import_planned(cache, stream, fmt, module, options, say, spark_at, range_bytes, total,
                    plan: _Plan) -> ImportResult:
    if not plan.files:
        if plan.failed:
            pull_id = cache.begin_pull(stream, f"import:{fmt}", None, None, None)
            with cache.transaction():
                for sql, params in _quarantine_sql(stream, plan.failed, pull_id):
                    cache.con.execute(sql, params)
            cache.finish_pull(pull_id, "complete")
        return ImportResult(stream, total, plan.skipped, 0, len(plan.failed), 0,
                            _failed_examples(plan.failed), plan.notes)
    from spark_backend.cache.ingest import ingest_stream
    from spark_backend.spark.local_files import ship
    from spark_backend.spark.session import spark_session

    reading = _Reading(plan, tasks_of([p for f in plan.files for p in f.parts], range_bytes),
                       say)
    say(reading.started())
    spark = spark_session(*spark_at)
    shipped = _spark_step(lambda: ship(spark, plan.hashes), "could not send the files to "
                          "the executors")
    tally = _Tally()
    pull_id = cache.begin_pull(stream, f"import:{fmt}", None, None, None)
    try:
        stats = _spark_step(lambda: ingest_stream(
            cache, stream, pull_id, reading.batches(spark, fmt, dict(options or {}), shipped),
            on_chunk=tally.count,
            extra_sql=lambda: _bookkeeping(stream, fmt, pull_id, plan, tally),
            count_existing_as_duplicates=True,
            sort_by=[("origin", "ascending"), ("line", "ascending")], copy=True),
            "failed; nothing of it was kept")
    except BaseException as e:
        cache.finish_pull(pull_id, "failed", error=(str(e).splitlines() or [""])[0])
        raise
    cache.finish_pull(pull_id, "complete")
    _widen_range(cache, stream)
    collapsed = tally.not_format(fmt)
    named = [f"{os.path.basename(origin)}: {why}" for origin, why in collapsed]
    examples = (_failed_examples(plan.failed) + named
                + tally.examples(exclude={origin for origin, _ in collapsed}))
    bad = (stats.bad - sum(tally.per_file[o][1] for o, _ in collapsed) + len(collapsed)
           + len(plan.failed))
    notes = plan.notes + [f"{why}; kept as one quarantine entry (the file's size and SHA-256, "
                          "no content)." for why in named]
    return ImportResult(stream, total, plan.skipped, stats.data_change + stats.heartbeats
                        + stats.child_partitions, bad, stats.duplicates, examples[:5], notes)


class _Reading:
    """The Spark jobs of an import: ``window`` tasks per job, so that Spark's driver holds at
    most that many tasks' results; a part that ``follows`` another waits for a later job
    than that part's, and receives the parser it left; a progress line per part read; at the
    end, the check that every file is what was planned (``import_plan.check_unchanged``)."""

    def __init__(self, plan: _Plan, tasks: list[list[Part]], say: Callable[[str], None]):
        self.plan = plan
        self.tasks = tasks
        self.say = say
        self.parts = sum(len(t) for t in tasks)
        self.size = sum(f.size for f in plan.files)
        self.read: dict[tuple[str, int], tuple[int, str]] = {}
        self.states: dict[tuple[str, int], bytes] = {}  # (path, end) -> the parser it left
        self.ends = {(p.path, p.start): p.end for task in tasks for p in task}
        self.ended: set[tuple[str, int]] = set()  # (path, end) of the parts read
        self.done_bytes = self.rows = self.bad = 0

    def started(self) -> str:
        return (f"reading {len(self.plan.files):,} file(s), {_mb(self.size)}, with Spark in "
                f"{self.parts:,} part(s)")

    def batches(self, spark, fmt: str, options: dict[str, str],
                shipped: dict[str, str]) -> Iterator[Any]:
        import pyarrow.compute as pc

        from spark_backend.spark.file_parts import parts_frame, unpacked
        from spark_backend.spark.session import arrow_batches, task_slots

        waiting = list(self.tasks)
        while waiting:
            window, waiting = _next_window(waiting, max(2, 2 * task_slots(spark)), self.ended)
            specs = [[(p.path, p.start, p.end, p.first_line, shipped.get(p.path), p.named,
                       self.states.pop((p.path, p.start), None) if p.follows else None,
                       p.last) for p in task] for task in window]
            try:
                for item in unpacked(arrow_batches(spark, parts_frame(spark, fmt, specs,
                                                                      options))):
                    if isinstance(item, dict):
                        self._part_read(item)
                        continue
                    self.rows += pc.sum(_is_record(item)).as_py() or 0
                    self.bad += pc.sum(pc.equal(item.column("kind"), "bad")).as_py() or 0
                    yield item
            except Exception as e:
                if not (_RESULT_LIMIT in str(e) or _HEAP in str(e) or _one_big_piece(window)):
                    raise
                raise _too_big(window, self.plan, fmt, e) from e
        check_unchanged(self.plan.files, self.read)

    def _part_read(self, marker: dict[str, Any]) -> None:
        """Count a part read and keep the parser it hands on; tell it when it is the first,
        the last or one more percent of the parts (a folder of 10,000 files is 100 lines,
        not 10,000)."""
        key = (marker["path"], marker["start"])
        self.read[key] = (marker["bytes"], marker["sha256"])
        self.ended.add((key[0], self.ends[key]))
        if marker.get("state") is not None:
            self.states[(key[0], self.ends[key])] = marker["state"]
        self.done_bytes += marker["bytes"] or 0
        done = len(self.read)
        if 1 < done < self.parts and done * 100 // self.parts == (done - 1) * 100 // self.parts:
            return
        self.say(f"read {len(self.read):,} of {self.parts:,} part(s), "
                 f"{_mb(self.done_bytes)} of {_mb(self.size)}: {self.rows:,} "
                 f"record(s), {self.bad:,} bad line(s)")


def _next_window(waiting: list[list[Part]], most: int, ended: set[tuple[str, int]]
                 ) -> tuple[list[list[Part]], list[list[Part]]]:
    """(the next job's tasks, the tasks left): in order, at most ``most`` tasks and
    ``JOB_BYTES`` of input (a larger task alone), leaving for a later job every task whose
    first part ``follows`` a part not read yet (``ended``: (path, end) of the parts read),
    and the tasks of that file after it. Never empty while tasks wait."""
    window: list[list[Part]] = []
    later: list[list[Part]] = []
    blocked: set[str] = set()
    size = 0
    for i, task in enumerate(waiting):
        first = task[0]
        if (first.follows and (first.path, first.start) not in ended) or first.path in blocked:
            later.append(task)
            blocked.add(first.path)
            continue
        length = sum(p.end - p.start for p in task)
        if window and (len(window) >= most or size + length > JOB_BYTES):
            later.extend(waiting[i:])
            break
        window.append(task)
        blocked.update(p.path for p in task if not p.last)
        size += length
    if not window:  # only when a part before was not told as read: its job failed
        window, later = later[:1], later[1:]
    return window, later


def _one_big_piece(window: list[list[Part]]) -> bool:
    """Whether the job read a piece larger than half a job's input: a file read whole. A task
    of such a file in a local session can exhaust the JVM's heap it shares with the driver,
    and the JVM then exits, so Spark's error may only say that it is gone."""
    return any(p.end - p.start > JOB_BYTES // 2 for task in window for p in task)


def _too_big(window: list[list[Part]], plan: _Plan, fmt: str,
             e: Exception) -> InspectorError:
    """Spark aborted a job whose results were more than its driver takes (or a task ran out of
    its Java heap): one sentence naming the largest piece of that job, its file and what to
    do."""
    from spark_backend.spark.session import one_line

    part = max((p for task in window for p in task), key=lambda p: p.end - p.start)
    planned = next(f for f in plan.files if f.path == part.path)
    error = str(e)
    limit = re.search(r"spark\.driver\.maxResultSize \(([^)]*)\)", error)
    if len(planned.parts) > 1:
        whole = f"read in parts of up to {_mb(part.end - part.start)}"
    elif planned.named.endswith(".gz") and not planned.origin:
        whole = f"read in one piece (a compressed {fmt} file is not read in parts)"
    else:
        whole = f"read in one piece ({fmt} files of this kind are not read in parts)"
    held = (f"spark.driver.maxResultSize, {limit[1]}" if limit
            else "Spark's Java heap ran out" if _HEAP in error
            else f"Spark failed while taking them: {one_line(e)}")
    return InspectorError(
        f"{planned.named} ({_mb(planned.named_size)}) gives more rows at once than Spark's "
        f"driver takes back ({held}): "
        f"it is {whole}; nothing of this import was kept. Split the file into smaller files "
        "(e.g. `split -l 1000000`), or give Spark's driver more memory and a larger "
        "spark.driver.maxResultSize ($CSI_SPARK_DRIVER_MEMORY, $CSI_SPARK_CONF).")


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _bookkeeping(stream: str, fmt: str, pull_id: int, plan: _Plan,
                 tally: _Tally) -> list[tuple[str, list[Any]]]:
    """The import's last statements: the format's own (``import_sql``), a row per file read
    in ``imports``, the files none of whose lines is of ``fmt`` folded into one quarantine
    entry each, the unread files."""
    own = getattr(formats.get(fmt), "import_sql", None)
    counts = [tally.per_file.get(f.named, (0, 0)) for f in plan.files]
    sql = [("INSERT INTO imports (stream, path, sha256, format, records, bad, pull_id) "
            "SELECT ?, unnest(?::VARCHAR[]), unnest(?::VARCHAR[]), ?, unnest(?::BIGINT[]), "
            "unnest(?::BIGINT[]), ?",  # one statement for any number of files
            [stream, [f.named for f in plan.files], [f.sha256 for f in plan.files], fmt,
             [good for good, _ in counts], [bad for _, bad in counts], pull_id])]
    sizes = {f.named: (f.named_size, f.sha256) for f in plan.files}
    for origin, why in tally.not_format(fmt):
        sql += _not_format_sql(stream, pull_id, origin, why, *sizes[origin])
    return (own(stream, pull_id) if own else []) + sql + _quarantine_sql(stream, plan.failed,
                                                                         pull_id)


def _not_format_sql(stream: str, pull_id: int, origin: str, why: str, size: int,
                    sha256: str) -> list[tuple[str, list[Any]]]:
    """One quarantine entry for a file of bad lines only: why and the first bad line's
    number and reason, the file's size and SHA-256; nothing of its content (it may be any
    file of the machine)."""
    return [
        ("INSERT INTO quarantine (stream, origin, line, reason, raw, pull_id, raw_bytes, "
         "raw_sha256) SELECT ?, ?, NULL, ? || ' (first, line ' || arg_min(line, line) || ': ' "
         "|| arg_min(reason, line) || ')', '', ?, ?, ? FROM quarantine "
         "WHERE pull_id = ? AND origin = ? AND line IS NOT NULL",
         [stream, origin, why, pull_id, size, sha256, pull_id, origin]),
        ("DELETE FROM quarantine WHERE pull_id = ? AND origin = ? AND line IS NOT NULL",
         [pull_id, origin]),
    ]


def _spark_step(step: Callable[[], Any], what: str) -> Any:
    """Run ``step``; a failure of Spark's own (not ours) is one sentence naming its log. The
    cache's (DuckDB's: its memory limit, a full disk) stay theirs: ``cache_failure`` names
    them."""
    from spark_backend.spark.session import SparkUnavailable, one_line, spark_log_path

    try:
        return step()
    except (InspectorError, duckdb.Error, KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        raise SparkUnavailable(f"The import's Spark job {what} ({one_line(e)}); Spark's log "
                               f"is {spark_log_path()}.") from e


def _is_record(table: Any) -> Any:
    """Which rows of ``table`` are records of the stream: neither a bad line nor the row a
    reader writes where it stops reading a partition (``records.partition_end``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    not_records = pa.array(["bad", "partition_end"])
    return pc.invert(pc.is_in(table.column("kind"), value_set=not_records))


class _Tally:
    """What an import's results say per file, counted chunk by chunk as they land."""

    def __init__(self, keep: int = 5):
        self.per_file: dict[str, tuple[int, int]] = {}   # path: (records, bad lines)
        self.keep = keep
        self.bad: list[tuple[str, int | None, str]] = []  # the first bad lines seen

    def count(self, table: Any) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        bad = pc.equal(table.column("kind"), "bad")
        counts = pa.table({"origin": table.column("origin"),
                           "good": pc.cast(_is_record(table), pa.int64()),
                           "bad": pc.cast(bad, pa.int64())}).group_by("origin").aggregate(
            [("good", "sum"), ("bad", "sum")])
        for origin, good, nbad in zip(*(counts.column(c).to_pylist() for c in
                                        ("origin", "good_sum", "bad_sum")), strict=True):
            if origin is not None:
                was = self.per_file.get(origin, (0, 0))
                self.per_file[origin] = (was[0] + good, was[1] + nbad)
        first = (table.filter(bad).select(["origin", "line", "extra"])
                 .sort_by([("origin", "ascending"), ("line", "ascending")])
                 .slice(0, self.keep).to_pylist())
        seen = self.bad + [(r["origin"] or "?", r["line"],
                            json.loads(r["extra"] or "{}").get("reason")) for r in first]
        self.bad = sorted(seen, key=lambda b: (b[0], b[1] is None, b[1] or 0))[: self.keep]

    def examples(self, exclude: set[str] | None = None) -> list[str]:
        return [f"{os.path.basename(o)} line {line}: {reason}" if line is not None
                else f"{os.path.basename(o)}: {reason}" for o, line, reason in self.bad
                if o not in (exclude or set())]

    def not_format(self, fmt: str) -> list[tuple[str, str]]:
        """(path, why) of the files that gave bad lines only, more than one: files that are
        not of ``fmt`` at all."""
        return [(origin, f"not {fmt}: none of its {bad:,} lines is a {fmt} record")
                for origin, (good, bad) in sorted(self.per_file.items())
                if good == 0 and bad > 1]


def _quarantine_sql(stream: str, failed: list[tuple[str, str]],
                    pull_id: int) -> list[tuple[str, list[Any]]]:
    return [("INSERT INTO quarantine (stream, origin, line, reason, raw, pull_id) "
             "VALUES (?, ?, NULL, ?, '', ?)", [stream, where, why, pull_id])
            for where, why in failed]


def _failed_examples(failed: list[tuple[str, str]]) -> list[str]:
    return [f"{os.path.basename(where)}: {why}" for where, why in failed]


def _drop_stream(cache: Cache, stream: str) -> None:
    """Undo a stream an import created and could not fill (nothing of it is kept)."""
    with cache.transaction():
        for table in ("quarantine", "imports", "pulls", "data_change_records", "mods",
                      "transactions", "heartbeats", "child_partitions_records", "edges",
                      "partitions", "streams"):
            cache.con.execute(f"DELETE FROM {table} WHERE stream = ?", [stream])


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
    _check_out(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    except OSError as e:  # the place given cannot hold a file: bad input
        raise BadInput(f"Cannot write the recording to {out}: {e.strerror or e}; choose a "
                       "writable place.", field="out") from e
    tmp = Path(tmp_name)
    con = cache.cursor()
    written = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            written = _write_recording(cache, con, stream, f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except OSError as e:
        raise _write_error(out, e) from e
    finally:
        con.close()
        tmp.unlink(missing_ok=True)  # a failed or interrupted export leaves nothing behind
    return written


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise BadInput(f"{out} is a folder; give a file path for the recording, e.g. "
                       f"{out / 'recording.jsonl'}.", field="out")
    if out.exists() and not out.is_file():
        raise BadInput(f"{out} is not a regular file; give a file path for the recording.",
                       field="out")


def _write_error(out: Path, e: OSError) -> InspectorError:
    why = e.strerror or str(e)
    if isinstance(e, PermissionError) or e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return BadInput(f"Cannot write the recording to {out}: {why}; choose a writable "
                        "place.", field="out")
    return InspectorError(f"Cannot write the recording to {out}: {why}; nothing was written.")


def _write_recording(cache: Cache, con: Any, stream: str, f: Any) -> int:
    written = 0
    # MUTABLE_KEY_RANGE streams export their ChangeStreamRecords (recording.py).
    (mutable,) = con.execute("SELECT count(*) > 0 FROM partition_records WHERE stream = ?",
                             [stream]).fetchone()
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
