"""The Sources page's logic: validating the pull form, running a pull or an import with
progress, and placing each error next to the field that caused it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_backend import config
from spark_backend.cache.store import Cache, validate_cache_stream_name
from spark_backend.errors import CacheError, InspectorError
from spark_backend.timestamps import TimestampError, now_ns, parse_ns

SOURCES = {"demo": "Demo world", "emulator": "Local Cloud Spanner emulator",
           "spanner": "Cloud Spanner", "files": "Recordings and other systems' files"}
FILE_FORMATS = ("recording", "datastream", "cockroachdb", "bigtable")
DIALECTS = ("googlesql", "postgresql")
GENERAL = "general"

# Which field an error message is about, by the words it uses (first match wins).
_FIELD_WORDS = [
    ("heartbeat_ms", r"heartbeat"),
    ("start", r"--start|start_timestamp|\bstart\b"),
    ("end", r"--end|end_timestamp|\bend\b"),
    ("project", r"--project|\bproject\b"),
    ("instance", r"--instance|\binstance\b"),
    ("database", r"--database|\bdatabase\b"),
    ("dialect", r"dialect"),
    ("paths", r"does not exist|no files|file"),
    ("source_stream", r"change stream|--stream"),
    ("stream", r"stream name|--as"),
]


@dataclass
class PullForm:
    source: str = "demo"
    stream: str = ""
    source_stream: str = ""
    project: str = ""
    instance: str = ""
    database: str = ""
    dialect: str = "googlesql"
    start: str = ""
    end: str = ""
    heartbeat_ms: int = config.DEFAULT_HEARTBEAT_MS
    file_format: str = "recording"
    paths: str = ""
    errors: dict[str, str] = field(default_factory=dict)


def field_for(message: str, form: PullForm) -> str:
    """The form field an error message is about (GENERAL when none fits)."""
    text = message.lower()
    for name, pattern in _FIELD_WORDS:
        if re.search(pattern, text):
            if name in ("project", "instance", "database") and form.source != "spanner":
                continue
            if name == "paths" and form.source != "files":
                continue
            return name
    return GENERAL


def validate(form: PullForm) -> dict[str, str]:
    """Field -> one sentence, for what can be checked before starting anything."""
    errors: dict[str, str] = {}
    if form.source not in SOURCES:
        errors["source"] = f"Choose a source: {', '.join(SOURCES)}."
    if form.stream:
        try:
            validate_cache_stream_name(form.stream)
        except CacheError as e:
            errors["stream"] = str(e)
    elif form.source in ("files", "spanner"):
        errors["stream"] = "Name the stream in the cache, e.g. orders_stream."
    parsed = {}
    for name in ("start", "end"):
        text = getattr(form, name).strip()
        if text:
            try:
                parsed[name] = parse_ns(text)
            except TimestampError as e:
                errors[name] = f"{e}."
    if "start" in parsed and "end" in parsed and parsed["start"] > parsed["end"]:
        errors["end"] = "The end is before the start; choose an end at or after the start."
    if not config.MIN_HEARTBEAT_MS <= int(form.heartbeat_ms) <= config.MAX_HEARTBEAT_MS:
        errors["heartbeat_ms"] = (f"The heartbeat must be between {config.MIN_HEARTBEAT_MS} and "
                                  f"{config.MAX_HEARTBEAT_MS} ms.")
    if form.source == "spanner":
        for name in ("project", "instance", "database", "source_stream"):
            if not getattr(form, name).strip():
                errors[name] = f"Cloud Spanner needs the {name.replace('_', ' ')}."
    if form.source == "files":
        if form.file_format not in FILE_FORMATS:
            errors["file_format"] = f"Choose a format: {', '.join(FILE_FORMATS)}."
        if not form.paths.strip():
            errors["paths"] = "Give at least one file or folder, one per line."
    return errors


def request_for(form: PullForm) -> Any:
    from spark_backend.pull import PullRequest

    return PullRequest(
        source=form.source, stream=form.stream.strip() or None,
        source_stream=form.source_stream.strip() or None,
        project=form.project.strip() or None, instance=form.instance.strip() or None,
        database=form.database.strip() or None, dialect=form.dialect,
        start=form.start.strip() or None, end=form.end.strip() or None,
        heartbeat_ms=int(form.heartbeat_ms),
    )


@dataclass
class Outcome:
    ok: bool
    message: str
    field: str = GENERAL


def pull(cache: Cache, form: PullForm, on_progress: Callable[[Any], None]) -> Outcome:
    """Run the pull (or import) the form describes; errors come back as sentences."""
    try:
        if form.source == "files":
            from spark_backend.sources.files import import_files

            paths = [p.strip() for p in form.paths.splitlines() if p.strip()]
            res = import_files(cache, form.stream.strip(), form.file_format, paths,
                               progress=lambda msg: on_progress(msg))
            return Outcome(True, f"Imported {res.records:,} records from {res.files} file(s) "
                                 f"({res.skipped_files} already imported, {res.bad} bad lines "
                                 "quarantined).")
        from spark_backend.pull import run_pull

        res = run_pull(cache, request_for(form), on_progress)
    except InspectorError as e:
        return Outcome(False, str(e), field_for(str(e), form))
    except ValueError as e:  # a contract's own validation (ValueError is BadInput's base)
        return Outcome(False, str(e), field_for(str(e), form))
    if res.status == "failed":
        return Outcome(False, res.error or "The pull failed.", field_for(res.error or "", form))
    if res.status == "nothing-to-do":
        return Outcome(True, f"{res.stream} is already cached up to that end; nothing to read.")
    return Outcome(True, f"Pulled {res.records:,} records of {res.stream} in {res.waves} "
                         f"wave(s) ({res.seconds:.1f}s).")


def refresh_form(info: dict[str, Any]) -> PullForm:
    """The pull that extends a cached live stream to now (reads only the new span)."""
    location = info.get("location") or ""
    parts = dict(re.findall(r"(projects|instances|databases)/([^/\s]+)", location))
    return PullForm(
        source=info.get("source") or "spanner", stream=info["stream"],
        source_stream=info.get("source_stream") or "", project=parts.get("projects", ""),
        instance=parts.get("instances", ""), database=parts.get("databases", ""),
        dialect=info.get("dialect") or "googlesql", start="", end="",
        heartbeat_ms=int(info.get("heartbeat_ms") or config.DEFAULT_HEARTBEAT_MS),
    )


def progress_text(p: Any) -> str:
    if isinstance(p, str):
        return p
    return (f"wave {p.wave} · {p.partitions_done}/{p.partitions_total} partitions · "
            f"{p.records:,} records · {p.message}")


def progress_fraction(p: Any) -> float:
    if isinstance(p, str) or not p.partitions_total:
        return 0.0
    return min(1.0, p.partitions_done / p.partitions_total)


def now_text() -> str:
    from spark_backend.timestamps import format_ns

    return format_ns(now_ns())
