"""The command line: ``python -m spark_backend pull|import|export|report|history``.

Every failure is one line on stderr and a non-zero exit (2: bad input, 1: the source or the
pull failed, 3: `report --fail-on-stall` found a stalled partition); never a traceback. Every
value is checked before anything starts (Spark, servers, emulators, the cache file).
SIGINT and SIGTERM, at any moment, end the command within seconds with one sentence on stderr
and exit 128 + the signal (130, 143): a pull is recorded as interrupted (the next one resumes
it) and every process the command started (Spark's JVM and Python workers, an emulator) ends
before it does; a second signal stops it at once.
Progress is one updating line on a terminal's stderr, plain lines on stdout otherwise, so that
stderr holds errors only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spark_backend.model import checks, config, interrupts
from spark_backend.model.errors import BadInput, CacheError, InspectorError

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_STALLED = 1, 2, 3
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left
EXIT_SIGNALLED = 128  # + the signal's number, as a shell reports a command a signal ended
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long the processes this command started get to end after SIGTERM (Spark's JVM stops its
# context and its Python workers), and then after SIGKILL.
CHILD_GRACE_S = 5.0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line instead of usage + message
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see `{self.prog} --help`)\n")


def _default_cache() -> str:
    return os.environ.get(config.CACHE_ENVVAR) or str(config.DEFAULT_CACHE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m spark_backend",
                     description="Pull, import and inspect change streams in a DuckDB cache.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def cache_arg(p):
        p.add_argument("--cache", default=_default_cache(),
                       help=f"DuckDB cache file (default: ${config.CACHE_ENVVAR} or "
                            f"{config.DEFAULT_CACHE})")

    p = sub.add_parser("pull", help="read a time range of a change stream into the cache")
    cache_arg(p)
    p.add_argument("--source", choices=["spanner", "emulator", "demo", "beam-metadata"],
                   default="spanner")
    p.add_argument("--project")
    p.add_argument("--instance")
    p.add_argument("--database")
    p.add_argument("--stream", help="the change stream's name at the source")
    p.add_argument("--as", dest="cache_stream", help="name in the cache (default: --stream)")
    p.add_argument("--table", help="beam-metadata: the connector's partition metadata table")
    p.add_argument("--start", help="RFC 3339 start (default: the source's beginning)")
    p.add_argument("--end", help="RFC 3339 end (default: now, or the demo world's end)")
    p.add_argument("--heartbeat-ms", type=int, default=config.DEFAULT_HEARTBEAT_MS)
    p.add_argument("--dialect", choices=["googlesql", "postgresql"], default=None,
                   help="override the database's own dialect (asked from the database)")
    p.add_argument("--spark-master", help=f"Spark master (default: ${config.SPARK_MASTER_ENVVAR}"
                                          " or local[*])")
    p.add_argument("--spark-remote", help="Spark Connect endpoint, e.g. sc://host:15002 "
                                          f"(default: ${config.SPARK_REMOTE_ENVVAR})")
    p.add_argument("--demo-seed", type=int, default=7)
    p.add_argument("--demo-scale", type=float, default=1.0)
    p.add_argument("--emulator-seconds", type=float, default=20.0,
                   help="emulator: how many seconds of live workload to pull")

    p = sub.add_parser("import", help="import recordings or other systems' change files")
    cache_arg(p)
    p.add_argument("--format", required=True)
    p.add_argument("--stream", required=True, help="name of the stream in the cache")
    p.add_argument("--table", help="table name when the messages do not carry it")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a format option, e.g. primary_key=id (cockroachdb), keys=ID "
                        "(datastream), partition=... (bigtable); repeatable")
    p.add_argument("--spark-master", help=f"Spark master (default: ${config.SPARK_MASTER_ENVVAR}"
                                          " or local[*])")
    p.add_argument("--spark-remote", help="Spark Connect endpoint, e.g. sc://host:15002 "
                                          f"(default: ${config.SPARK_REMOTE_ENVVAR})")
    p.add_argument("paths", nargs="+")

    p = sub.add_parser("export", help="write a cached Spanner stream as a recording")
    cache_arg(p)
    p.add_argument("--stream")
    p.add_argument("--out", required=True)

    p = sub.add_parser("report", help="what the cache knows about a stream")
    cache_arg(p)
    p.add_argument("--stream")
    p.add_argument("--stall-after", type=float, default=60.0, metavar="SECONDS")
    p.add_argument("--json", action="store_true")
    p.add_argument("--fail-on-stall", action="store_true",
                   help="exit 3 when a partition is stalled (for scripts and monitoring)")
    p.add_argument("--html", metavar="FILE",
                   help="also write a self-contained HTML report (opens offline)")

    p = sub.add_parser("history", help="every change of a table or key in commit order")
    cache_arg(p)
    p.add_argument("--stream")
    p.add_argument("--table", required=True)
    p.add_argument("--key", help='JSON object of key columns, e.g. \'{"AccountId": "Id1"}\'')
    p.add_argument("--json", action="store_true")
    return parser


def _stdout_gone() -> None:
    """What reads stdout closed it: what is printed from now on goes nowhere (and the exit's
    own flush does not fail again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class _Progress:
    """One updating line on a terminal; a line per step otherwise (a pull or import whose
    reader of stdout leaves goes on to its end without them)."""

    drawn = False  # a progress line is on the terminal (cleared before an error's line)

    def __init__(self):
        self.tty = sys.stderr.isatty()

    def __call__(self, p: Any) -> None:
        _keep_signal_handlers()
        if hasattr(p, "wave"):
            text = (f"wave {p.wave}: {p.partitions_done}/{p.partitions_total} partitions, "
                    f"{p.counted()} - {p.message}")
        else:
            text = str(p)
        if self.tty:
            err = _Said.stream or sys.stderr
            err.write("\r\033[K" + text)
            err.flush()
            _Progress.drawn = True
        else:
            try:
                print(text, flush=True)
            except BrokenPipeError:  # what read the progress left (``pull | head``): go on
                _stdout_gone()

    @staticmethod
    def done() -> None:
        if _Progress.drawn:
            err = _Said.stream or sys.stderr
            err.write("\r\033[K")
            err.flush()
            _Progress.drawn = False


def _check_cache_path(path: str, must_exist: bool = False) -> None:
    if not path.strip():
        raise BadInput("--cache is empty; give a DuckDB file path.", field="cache")
    if os.path.isdir(path):
        raise BadInput(f"--cache {path} is a folder; give a file path, e.g. "
                       f"{os.path.join(path, 'cache.duckdb')}.", field="cache")
    if os.path.exists(path) and not os.path.isfile(path):
        raise BadInput(f"--cache {path} is not a regular file; give a DuckDB file path.",
                       field="cache")
    if must_exist and not os.path.exists(path):
        raise BadInput(f"No cache file at {path}; pull or import a stream first.", field="cache")


def _open_cache(path: str, *, landing: str | None = None):
    """The cache, read-write (created when missing); ``landing``: this process pulls
    (``"pull"``) or imports (``"import"``) into the cache and queries little."""
    from spark_backend.cache.store import Cache

    _check_cache_path(path)
    if landing:
        limit = config.PULL_MEMORY_LIMIT if landing == "pull" else config.IMPORT_MEMORY_LIMIT
        return Cache(path, memory_limit=limit, threads=config.PULL_THREADS,
                     allocator=config.PULL_ALLOCATOR)
    return Cache(path, memory_limit=config.DEFAULT_MEMORY_LIMIT)


@contextlib.contextmanager
def _landing_cache(path: str, landing: str) -> Iterator[Any]:
    """``_open_cache(path, landing=...)``; a file it created is removed again at the end when
    nothing landed in it (Spark or the source failed at once, or a signal came first): it
    would only say "holds no stream yet". Asked on the open connection before it closes: a
    second open of the file in this process, after an interrupted query, is never needed."""
    creates = not os.path.lexists(path)
    cache = _open_cache(path, landing=landing)
    empty = False
    try:
        yield cache
    finally:
        if creates:
            empty = _holds_nothing(cache)
        cache.close()
        if empty:
            for leftover in (path, f"{path}.wal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)


def _holds_nothing(cache: Any) -> bool:
    import duckdb

    try:
        (n,) = cache.con.execute("SELECT (SELECT count(*) FROM streams) + "
                                 "(SELECT count(*) FROM quarantine)").fetchone()
    except (duckdb.Error, RuntimeError):  # a connection an interrupt left unusable: kept
        return False
    return n == 0


def _open_for_reading(path: str):
    """The cache of ``report``, ``export`` and ``history``, read-only: several of them can read
    at once, beside another reader that holds the file, and from a read-only place. When a run
    that died left work for a read-write open (``Cache.needs_recovery``), that open comes first,
    as for any other command."""
    from spark_backend.cache.store import Cache, CacheLocked

    _check_cache_path(path, must_exist=True)
    cache = Cache(path, read_only=True, memory_limit=config.DEFAULT_MEMORY_LIMIT)
    if not cache.needs_recovery():
        return cache
    cache.close()
    try:
        return Cache(path, memory_limit=config.DEFAULT_MEMORY_LIMIT)
    except CacheLocked:
        raise  # another process holds it (it may be recovering it): its own sentence
    except CacheError as e:
        raise CacheError(
            f"{path} was left by a pull or import that stopped midway; one read-write open "
            f"closes that run and finishes its summaries before the cache is read, and it "
            f"failed ({e}). Make the file writable, or run that pull or import again."
        ) from e


# Options each format reads (``--table`` is accepted by every format).
FORMAT_OPTIONS = {
    "recording": {"table"},
    "datastream": {"keys", "table"},
    "cockroachdb": {"partition", "primary_key", "keys", "envelope", "table"},
    "bigtable": {"partition", "table"},
}


def _check_stream_arg(value: str | None, label: str) -> None:
    if value is not None:
        checks.cache_stream_name(value, label)


def check_args(args) -> None:
    """Every value of the command, before anything starts; BadInput names the first wrong one."""
    if args.command == "pull":
        _check_pull(args)
    elif args.command == "import":
        _check_import(args)
    elif args.command == "export":
        _check_stream_arg(args.stream, "--stream")
        _check_out(args.out)
    elif args.command == "report":
        _check_stream_arg(args.stream, "--stream")
        checks.number(args.stall_after, "--stall-after", *checks.STALL_AFTER_S, "seconds")
    elif args.command == "history":
        _check_stream_arg(args.stream, "--stream")
        if not args.table.strip():
            raise BadInput("--table is empty; give a table name of the stream.", field="table")
        if args.key is not None:
            _check_key(args.key)
    _check_cache_path(args.cache, must_exist=args.command in ("export", "report", "history"))


def _check_pull(args) -> None:
    from spark_backend.jobs.checks import check_beam_pull, check_pull

    if args.source == "beam-metadata" and (args.spark_master or args.spark_remote):
        flag = "--spark-master" if args.spark_master else "--spark-remote"
        raise BadInput(f"--source beam-metadata reads the connector's metadata table from this "
                       f"machine, without Spark; leave out {flag}.", field="spark_master")
    if args.source == "beam-metadata":
        check_beam_pull(args.cache_stream, args.project, args.instance, args.database,
                        args.table, args.heartbeat_ms)
    else:
        check_pull(_request(args))


def _check_import(args) -> None:
    from spark_backend.jobs.checks import check_import

    _options(args)
    check_import(args.stream, args.format, args.paths, args.spark_master, args.spark_remote)


def _options(args) -> dict[str, str]:
    options = {"table": args.table} if args.table else {}
    accepted = FORMAT_OPTIONS.get(args.format, {"table"})
    for item in args.option:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadInput(f"--option {item!r} is not KEY=VALUE, e.g. --option primary_key=id.",
                           field="option")
        if key not in accepted:
            raise BadInput(f"--option {key!r} is not an option of the {args.format} format; "
                           f"accepted: {', '.join(sorted(accepted))}.", field="option")
        options[key] = value
    return options


def _check_out(out: str) -> None:
    if not out.strip():
        raise BadInput("--out is empty; give a file path for the recording.", field="out")
    if os.path.isdir(out):
        raise BadInput(f"--out {out} is a folder; give a file path, e.g. "
                       f"{os.path.join(out, 'recording.jsonl')}.", field="out")
    if os.path.exists(out) and not os.path.isfile(out):
        raise BadInput(f"--out {out} is not a regular file; give a file path.", field="out")
    parent = os.path.dirname(os.path.abspath(out))
    existing = parent
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise BadInput(f"--out {out}: {existing} is not a folder.", field="out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise BadInput(f"--out {out}: the folder {existing} is not writable.", field="out")
    if os.path.exists(out) and not os.access(out, os.W_OK):
        raise BadInput(f"--out {out} exists and is not writable.", field="out")


def _check_key(text: str) -> None:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise BadInput(f"--key {text!r} is not JSON; a key is a JSON object of the key "
                       'columns, e.g. \'{"AccountId": "Id1"}\'.', field="key") from e
    if not isinstance(value, dict) or not value:
        raise BadInput(f"--key {text!r}: a key is a JSON object of the key columns, e.g. "
                       '\'{"AccountId": "Id1"}\'.', field="key")


def _request(args):
    from spark_backend.jobs.pull import PullRequest
    from spark_backend.jobs.pull_sources import source_named

    source = source_named(args.source, project=args.project, instance=args.instance,
                          database=args.database, stream=args.stream, dialect=args.dialect,
                          seed=args.demo_seed, scale=args.demo_scale,
                          seconds=args.emulator_seconds)
    return PullRequest(
        source=source, stream=args.cache_stream, start=args.start, end=args.end,
        heartbeat_ms=args.heartbeat_ms, spark_master=args.spark_master,
        spark_remote=args.spark_remote,
    )


def cmd_pull(args) -> int:
    if args.source == "beam-metadata":
        return _pull_beam(args)
    from spark_backend.jobs.pull import run_pull
    from spark_backend.jobs.spark_start import start_spark_aside

    request = _request(args)
    progress = _Progress()
    with _landing_cache(args.cache, "pull") as cache:
        if not (args.spark_remote or (not args.spark_master
                                      and os.environ.get(config.SPARK_REMOTE_ENVVAR))):
            start_spark_aside(args.spark_master)  # a classic session (Connect's is a client)
        result = run_pull(cache, request, progress)
    progress.done()
    if result.status == "failed" and interrupts.requested() is not None:
        raise KeyboardInterrupt  # the signal surfaced as the pull's failure: it is recorded
        # as interrupted (``Cache.finish_pull``) and said as such
    if result.status == "failed":
        print(f"error: {result.error}", file=sys.stderr)
        return EXIT_FAILED
    if result.status == "nothing-to-do":
        print(f"{result.stream}: the range is already cached; nothing to read.")
        return 0
    print(f"{result.stream}: pulled {result.records:,} records from {result.partitions_read} "
          f"partitions in {result.waves} waves ({result.seconds:.1f}s) into {args.cache}")
    return 0


def _pull_beam(args) -> int:
    from spark_backend.jobs import beam_metadata

    missing = [f"--{n}" for n in ("project", "instance", "database", "table")
               if not getattr(args, n)]
    if missing:
        raise BadInput(f"--source beam-metadata needs {', '.join(missing)}.")
    stream = args.cache_stream or args.stream or args.table
    with _open_cache(args.cache) as cache:
        summary = beam_metadata.pull_beam_metadata(
            cache, stream, project=args.project, instance=args.instance,
            database=args.database, table=args.table,
            emulator_host=os.environ.get(config.EMULATOR_HOST_ENVVAR),
        )
    print(f"{stream}: {json.dumps(summary, default=str)}")
    return 0


def import_summary(result: Any) -> str:
    """What ``import`` prints of an ``ImportResult``: a line, then its notes and bad examples."""
    lines = [f"{result.stream}: imported {result.records:,} records from "
             f"{result.files - result.skipped_files} file(s)"
             + (f", {result.skipped_files} already imported" if result.skipped_files else "")
             + (f", {result.duplicates} duplicate(s)" if result.duplicates else "")
             + (f"; {result.bad} bad record(s) kept in quarantine" if result.bad else "")]
    lines += [f"  note: {note}" for note in result.notes]
    lines += [f"  bad: {example}" for example in result.bad_examples]
    return "\n".join(lines)


def cmd_import(args) -> int:
    from spark_backend.jobs.files import import_files

    options = _options(args)
    progress = _Progress()
    with _landing_cache(args.cache, "import") as cache:
        result = import_files(cache, args.stream, args.format, args.paths, options, progress,
                              spark_master=args.spark_master,
                              spark_remote=args.spark_remote)
    progress.done()
    print(import_summary(result))
    if result.records == 0 and result.bad:
        first = result.bad_examples[0] if result.bad_examples else "see the quarantine table"
        raise BadInput(f"No valid record in the file(s); {result.bad} bad record(s) kept in "
                       f"quarantine (first: {first}).", field="paths")
    return 0


def cmd_export(args) -> int:
    from spark_backend.jobs.files import export_recording

    with _open_for_reading(args.cache) as cache:
        stream = cache.resolve_stream(args.stream)
        lines = export_recording(cache, stream, args.out)
    print(f"{stream}: wrote {lines:,} lines to {args.out}")
    return 0


def _write_html(cache, stream: str, args) -> None:
    from spark_backend.analysis.html_report import build_html

    try:
        Path(args.html).write_text(build_html(cache.con, stream, args.stall_after),
                                   encoding="utf-8")
    except OSError as e:
        raise BadInput(f"--html: cannot write {args.html} ({e.strerror}); give a writable "
                       "file path.") from e
    print(f"wrote {args.html}", file=sys.stderr)


def cmd_report(args) -> int:
    from spark_backend.analysis.report import build_report, to_json

    with _open_for_reading(args.cache) as cache:
        stream = cache.resolve_stream(args.stream)
        tables = cache.read_every_block()  # a damaged block fails the report, wherever it is
        report = build_report(cache.con, stream, args.stall_after)
        if args.html:
            _write_html(cache, stream, args)
    if args.json:
        print(to_json(report))
    else:
        parts = report["partitions"]
        span = report["range"]
        print(f"stream {stream} ({report['system']}) "
              + (f"{span['start']} .. {span['end']}" if span["start"] or span["end"]
                 else "(no time read yet)"))
        print(f"partitions: {len(parts)} ({sum(p['finished'] for p in parts)} finished, "
              f"{sum(not p['finished'] for p in parts)} not finished); edges: "
              + ", ".join(f"{k} {sum(e['kind'] == k for e in report['edges'])}"
                          for k in ("root", "split", "merge", "move")))
        r = report["records"]
        print(f"records: {r['data_change']:,} data change, {r['heartbeat']:,} heartbeat, "
              f"{r['child_partitions']:,} child partitions; duplicates: {report['duplicates']}")
        t = report["transactions"]
        print(f"transactions: {t['total']:,} ({t['complete']:,} complete, "
              f"{len(t['incomplete']):,} incomplete)")
        print(f"low watermark: {report['low_watermark']}"
              + (f", held back by partition {report['holding_back']}"
                 if report["holding_back"] else ""))
        stalled = [p for p in parts if p["stalled"]]
        for p in stalled:
            print(f"STALLED: partition {p['token']} at {p['watermark']}")
        for a in report["anomalies"][:50]:
            print(f"anomaly {a['kind']}: partition {a['partition']} at {a['at']}: {a['detail']}")
        if len(report["anomalies"]) > 50:
            print(f"... and {len(report['anomalies']) - 50} more anomalies (use --json)")
        print(f"cache file: all {tables} tables read back whole, no damaged block")
    if args.fail_on_stall and any(p["stalled"] for p in report["partitions"]):
        return EXIT_STALLED
    return 0


def cmd_history(args) -> int:
    import pandas as pd  # heavy: only the commands that read frames need it

    from spark_backend.analysis.transactions import history
    from spark_backend.model.timestamps import format_ns

    with _open_for_reading(args.cache) as cache:
        stream = cache.resolve_stream(args.stream)
        try:
            df = history(cache.con, stream, args.table, args.key)
        except ValueError as e:
            raise BadInput(f"--key: {e}") from e
        known = [r[0] for r in cache.con.execute(
            "SELECT DISTINCT table_name FROM data_change_records WHERE stream = ? ORDER BY 1",
            [stream]).fetchall()]
    if df.empty and args.table not in known:
        raise BadInput(f"No table {args.table!r} in stream {stream!r}; tables: "
                       f"{', '.join(known) or 'none'}.")
    items = [
        {
            # A changefeed without `updated` carries no commit time: null, never a made-up one.
            "commit_timestamp": None if pd.isna(r.commit_ns) else format_ns(int(r.commit_ns)),
            "mod_type": r.mod_type,
            "keys": json.loads(r.keys),
            "old_values": json.loads(r.old_values) if r.old_values else {},
            "new_values": json.loads(r.new_values) if r.new_values else {},
            "transaction_id": r.transaction_id,
            "partition": r.partition,
            "record_sequence": r.record_sequence,
        }
        for r in df.itertuples()
    ]
    if args.json:
        print(json.dumps(items, indent=2, ensure_ascii=False))
    else:
        for it in items:
            when = it["commit_timestamp"] or "(no time)"
            print(f"{when} {it['mod_type']:<6} {json.dumps(it['keys'])} "
                  f"old={json.dumps(it['old_values'])} new={json.dumps(it['new_values'])} "
                  f"txn={it['transaction_id']} partition={it['partition']}")
        print(f"{len(items)} change(s)", file=sys.stderr)
    return 0


COMMANDS = {"pull": cmd_pull, "import": cmd_import, "export": cmd_export, "report": cmd_report,
            "history": cmd_history}


def _on_signal(signum: int, frame: Any) -> None:
    """The first SIGINT/SIGTERM: recorded, then raised as ``KeyboardInterrupt`` where the main
    thread is, so that the command unwinds (a pull records itself interrupted, the cache
    closes). A second one stops the process at once: what is committed in the cache is as
    safe as after a kill, and the next read-write open recovers the rest."""
    if interrupts.requested() is None:
        interrupts.request(signum)
        _quiet_libraries()
        if interrupts.hold():
            return  # raised when the step that must not be cut in two ends
        raise KeyboardInterrupt
    _Progress.done()
    if not _Said.interrupted:  # one sentence: the first signal's may be out already
        os.write(_Said.stderr or 2, f"stopped at once by a second {interrupts.name(signum)}: "
                                    "the cache is recovered by the next pull or import.\n"
                                    .encode())
    _stop_descendants(grace_s=0.0)
    os._exit(EXIT_SIGNALLED + interrupts.requested())


def _quiet_libraries() -> None:
    """From the stop on, what libraries write to ``sys.stderr`` goes nowhere: the processes
    the signal also ended drop their connections, and library threads report that (PySpark's
    accumulator server prints "Exception occurred during processing of request..."), but the
    user asked for the stop and reads its one sentence (``_say`` writes to the stream the
    command started with)."""
    if _Said.stream is not None and sys.stderr is _Said.stream:
        sys.stderr = open(os.devnull, "w")  # the process ends with it open
        # py4j logs the dropped gateway through logging, whose handler kept the old stream
        logging.disable(logging.CRITICAL)


def _descendants(pid: int) -> list[int]:
    """Every living process below ``pid`` (the children of all its threads, theirs...)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in out:
                    out.append(child)
                    todo.append(child)
    return [p for p in out if _running(p)]


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")  # not a zombie or dead


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _stop_descendants(grace_s: float = CHILD_GRACE_S) -> None:
    """End every process this one started, and theirs: SIGTERM (Spark's JVM then stops its
    Python workers itself), then SIGKILL to what is left after ``grace_s``. The tree is read
    again on each round, so that a worker whose JVM ended first (it is then the init's child)
    is not lost."""
    known: set[int] = set()
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, CHILD_GRACE_S)):
        known = {p for p in known | set(_descendants(os.getpid())) if _running(p)}
        for pid in known:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        until = time.monotonic() + grace
        while True:
            _reap_children()
            known = {p for p in known | set(_descendants(os.getpid())) if _running(p)}
            if not known:
                return
            if time.monotonic() >= until:
                break
            time.sleep(0.05)


def _keep_signal_handlers() -> None:
    """``_on_signal`` again where a library replaced it while the command runs (pyspark
    installs a SIGINT handler of its own when a Spark context starts on the main thread, as
    an import's does)."""
    if (_Said.handling and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is not _on_signal):
        signal.signal(signal.SIGINT, _on_signal)


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """SIGINT and SIGTERM handled by ``_on_signal`` while a command runs (main thread only;
    the handlers before are restored after). A signal also quiets ``sys.stderr`` for the rest
    of the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupts.clear()
    _Said.interrupted = False
    before = {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS}
    _Said.handling = True
    _Said.stderr = os.dup(2)
    _Said.stream = sys.stderr
    try:
        yield
    finally:
        # ``sys.stderr`` stays quiet after a stop (``_quiet_libraries``): the process ends,
        # and library threads may still report what the stop cut off until it does
        _Said.stream = None
        os.close(_Said.stderr)
        _Said.stderr = None
        _Said.handling = False
        for sig, handler in before.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    config.quiet_local_client_env()
    args = build_parser().parse_args(argv)
    with _stop_signals():
        try:
            code = _run(args)
        except KeyboardInterrupt:  # the signal came after the command's own handling
            code = _interrupted(args)
        if interrupts.requested() is not None:
            if not _Said.interrupted:
                code = _interrupted(args)
            _stop_descendants()
    return code


class _Said:
    interrupted = False  # the sentence of a signal is on stderr (said once)
    handling = False  # ``_stop_signals`` installed ``_on_signal`` for this command
    stderr: int | None = None  # a copy of descriptor 2 as the command found it
    stream: Any = None  # ``sys.stderr`` as the command found it


def _interrupted(args) -> int:
    """The one sentence and the exit code of a command a signal (or Ctrl-C) ended."""
    _Progress.done()
    _Said.interrupted = True
    signum = interrupts.requested()
    how = ("interrupted" if signum in (None, signal.SIGINT)
           else f"stopped by {interrupts.name(signum)}")
    again = {"pull": "; run the same pull again to resume",
             "import": "; run the same import again to finish it"}.get(args.command, "")
    _say(f"{how}: the cache is consistent{again}.")
    return EXIT_SIGNALLED + (signum or signal.SIGINT)


def _say(line: str) -> None:
    """``line`` on the command's standard error as it found it: a library may point
    descriptor 2 elsewhere for a while (Spark's start sends it to Spark's log), and a signal
    can end the command in that while."""
    err = _Said.stream or sys.stderr
    err.flush()
    try:
        to_fd2 = err.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a test's capture
        to_fd2 = False
    if to_fd2 and _Said.stderr is not None:
        os.write(_Said.stderr, f"{line}\n".encode())
    else:
        print(line, file=err, flush=True)


def _run(args) -> int:
    try:
        check_args(args)
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then caught below
        return code if interrupts.requested() is None else _interrupted(args)
    except BrokenPipeError:  # what reads stdout closed it (``report | head``): stop quietly
        _stdout_gone()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        if (interrupts.requested() is None and _Said.handling
                and signal.getsignal(signal.SIGINT) is not _on_signal):
            interrupts.request(signal.SIGINT)  # Ctrl-C, through the handler pyspark installed
        return _interrupted(args)
    except Exception as e:
        if interrupts.requested() is not None:  # the signal, surfaced as another error
            return _interrupted(args)
        _Progress.done()  # the error on a line of its own, not after a progress line
        _say(f"error: {_sentence(e, args)}")
        return EXIT_BAD_INPUT if isinstance(e, BadInput) else EXIT_FAILED


def _sentence(error: Exception, args) -> str:
    """What the user reads of ``error``: the project's errors as they are, DuckDB's about the
    cache file as a sentence naming it, anything else still on one line."""
    import duckdb

    if isinstance(error, InspectorError):
        return str(error)
    if isinstance(error, duckdb.Error):
        from spark_backend.cache.store import cache_failure

        return cache_failure(args.cache, error)
    if isinstance(error, OSError) and error.strerror:
        where = f" {error.filename}" if error.filename else ""
        return (f"the {args.command} could not use{where}: {error.strerror}; check that the "
                "path exists and that this user may read (or write) it")
    if isinstance(error, MemoryError):
        return (f"the {args.command} ran out of memory; narrow it (--start/--end, --stream) or "
                "run it where more memory is free")
    first = (str(error).splitlines() or [""])[0]
    return (f"the {args.command} stopped on an error this tool has no sentence for "
            f"({type(error).__name__}: {first}); please report it with the command line")


if __name__ == "__main__":
    sys.exit(main())
