"""The Sources page's logic: validating the pull form, running a pull or an import with
progress, and placing each error next to the field that caused it."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import duckdb

from spark_backend.cache.store import Cache, cache_failure, validate_cache_stream_name
from spark_backend.model import config
from spark_backend.model.errors import CacheError, InspectorError
from spark_backend.model.timestamps import TimestampError, now_ns, parse_ns

from . import import_roots

SOURCES = {"demo": "Demo world", "emulator": "Local Cloud Spanner emulator",
           "spanner": "Cloud Spanner", "files": "Recordings and other systems' files"}
FILE_FORMATS = ("recording", "datastream", "cockroachdb", "bigtable")
# "" = the database's own dialect, asked from the database; the others override it.
DIALECTS = ("", "googlesql", "postgresql")
DIALECT_LABELS = {"": "the database's own (asked)", "googlesql": "GoogleSQL (override)",
                  "postgresql": "PostgreSQL (override)"}
GENERAL = "general"

# ``BadInput.field`` (the backend's name for the input at fault) -> this form's field.
# The backend's "stream" is the change stream at the source (``--stream``); for an import it is
# the stream in the cache (see ``form_field``).
_BACKEND_FIELDS = {
    "start": "start", "end": "end", "heartbeat_ms": "heartbeat_ms", "project": "project",
    "instance": "instance", "database": "database", "dialect": "dialect", "source": "source",
    "stream": "source_stream", "as": "stream", "format": "file_format", "paths": "paths",
}

# The fallback when an error carries no field: which field a message is about, by the words it
# uses (first match wins).
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
    dialect: str = ""
    start: str = ""
    end: str = ""
    heartbeat_ms: int = config.DEFAULT_HEARTBEAT_MS
    file_format: str = "recording"
    paths: str = ""  # files or folders under the import folder, one per line (app/import_roots)
    uploads: list[Any] = field(default_factory=list)  # files uploaded through the page
    errors: dict[str, str] = field(default_factory=dict)


def shown_fields(form: PullForm) -> set[str]:
    """The fields the Sources page shows for this form's source (an error goes next to one)."""
    shown = {"source", "stream"}
    if form.source == "files":
        return shown | {"file_format", "paths"}
    shown |= {"dialect", "start", "end", "heartbeat_ms"}
    if form.source == "spanner":
        shown |= {"project", "instance", "database"}
    if form.source in ("spanner", "emulator"):
        shown.add("source_stream")
    return shown


def form_field(backend_field: str | None, form: PullForm) -> str | None:
    """``BadInput.field`` as this form's field; None when it names none the form shows."""
    if not backend_field:
        return None
    name = _BACKEND_FIELDS.get(backend_field, backend_field)
    if backend_field == "stream" and form.source not in ("spanner", "emulator"):
        name = "stream"  # an import's (or the demo's) stream is the name in the cache
    return name if name in shown_fields(form) else None


def error_field(error: BaseException, form: PullForm) -> str:
    """Where an error goes: its ``field`` attribute first, the words of its message second."""
    backend_field = getattr(error, "field", None)
    if backend_field:
        return form_field(backend_field, form) or GENERAL
    return field_for(str(error), form)


def field_for(message: str, form: PullForm) -> str:
    """The form field an error message is about, by its words (GENERAL when none fits).

    Only the fallback for errors without a ``field`` (and for a failed pull's text)."""
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
        if not form.paths.strip() and not form.uploads:
            errors["paths"] = f"Nothing to import: the page reads {import_roots.accepted()}."
    return errors


def request_for(form: PullForm) -> Any:
    """The pull the form asks for (a pull starts the source it names unless ``pull``'s
    ``prepare`` gives the host of the dashboard's own)."""
    from spark_backend.jobs.pull import PullRequest
    from spark_backend.jobs.pull_sources import source_named

    def given(text: str) -> str | None:
        return text.strip() or None

    source = source_named(form.source, project=given(form.project),
                          instance=given(form.instance), database=given(form.database),
                          stream=given(form.source_stream), dialect=form.dialect or None)
    return PullRequest(source=source, stream=given(form.stream), start=given(form.start),
                       end=given(form.end), heartbeat_ms=int(form.heartbeat_ms))


@dataclass
class Outcome:
    ok: bool
    message: str
    field: str = GENERAL
    stream: str | None = None  # the stream in the cache the pull or import landed in


def pull(cache: Cache, form: PullForm, on_progress: Callable[[Any], None],
         prepare: Callable[[PullForm], str | None] | None = None,
         reader: str = "spark") -> Outcome:
    """Run the pull (or import) the form describes; errors come back as sentences.

    ``prepare`` runs right before a pull (not an import): it readies what the pull needs (the
    dashboard warms Spark up and keeps a demo server running) and returns the demo server's
    host for source demo, or a running emulator's for source emulator (None: the pull starts
    its own). ``reader`` "here": read without Spark (``PullRequest.reader``).
    """
    try:
        if form.source == "files":
            return _import(cache, form, on_progress)
        from spark_backend.jobs import pull as backend

        request = dataclasses.replace(request_for(form), reader=reader)
        if prepare is not None:
            backend.check_request(dataclasses.replace(request))  # before Spark or a server
            on_progress("starting Spark and the source…")
            host = prepare(form)
            if host is not None and form.source in ("demo", "emulator"):
                request.source = dataclasses.replace(request.source, host=host)
        res = backend.run_pull(cache, request, on_progress)
    except (InspectorError, ValueError) as e:  # ValueError: a contract's own validation
        return Outcome(False, str(e), error_field(e, form))
    except duckdb.Error as e:  # the cache file, as the command line says it
        return Outcome(False, cache_failure(cache.path, e), GENERAL)
    except OSError as e:
        where = f" {e.filename}" if e.filename else ""
        return Outcome(False, f"Could not use{where}: {e.strerror or e}; check that the path "
                              "exists and that the dashboard's user may read it.", GENERAL)
    if res.status == "failed":
        return Outcome(False, res.error or "The pull failed.", field_for(res.error or "", form),
                       stream=res.stream)
    if res.status == "nothing-to-do":
        return Outcome(True, f"{res.stream} is already cached up to that end; nothing to read.",
                       stream=res.stream)
    return Outcome(True, f"Pulled {res.records:,} records of {res.stream} in {res.waves} "
                         f"wave(s) ({res.seconds:.1f}s).", stream=res.stream)


def _import(cache: Cache, form: PullForm, on_progress: Callable[[Any], None]) -> Outcome:
    """Import the form's uploads and its paths under the import folder, nothing else: a path
    elsewhere is refused (``import_roots``) before any file is read."""
    from spark_backend.jobs.files import import_files

    paths = import_roots.checked_paths(form.paths.splitlines())
    with import_roots.uploads_on_disk(form.uploads) as uploaded:
        res = import_files(cache, form.stream.strip(), form.file_format, paths + uploaded,
                           progress=on_progress)
    return Outcome(True, import_message(res), stream=res.stream)


def import_message(res: Any) -> str:
    """One sentence for an ``ImportResult``: records, files, duplicates, bad lines."""
    if res.files and res.skipped_files == res.files:
        return f"Nothing new: {_n(res.files, 'file')} already imported into {res.stream}."
    return (f"Imported {_n(res.records, 'record')} into {res.stream} from "
            f"{_n(res.files - res.skipped_files, 'file')} ({res.skipped_files} already "
            f"imported, {_n(res.duplicates, 'duplicate copy', 'duplicate copies')}, "
            f"{_n(res.bad, 'bad line')} quarantined).")


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


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
            f"{p.counted()} · {p.message}")


def progress_fraction(p: Any) -> float:
    if isinstance(p, str) or not p.partitions_total:
        return 0.0
    return min(1.0, p.partitions_done / p.partitions_total)


def now_text() -> str:
    from spark_backend.model.timestamps import format_ns

    return format_ns(now_ns())
