"""Checks of a job's inputs that need the rooms below (Spanner IDs, key files, formats, paths),
for the command line to run before anything starts (Spark, servers, emulators, the cache)."""

from __future__ import annotations

import os
from typing import Any

from spark_backend import formats
from spark_backend.model import checks, config
from spark_backend.spanner.connect import SpannerTarget, check_key_file
from spark_backend.spanner.reader import validate_heartbeat, validate_stream_name


def check_pull(request: Any, beam_table: str | None = None) -> None:
    """A pull request (``jobs.pull.PullRequest``), every value; BadInput names the first wrong
    one. ``source='beam-metadata'`` pulls check ``beam_table`` instead of the stream."""
    if request.stream is not None:
        checks.cache_stream_name(request.stream)
    if request.source_stream is not None and request.source != "beam-metadata":
        validate_stream_name(request.source_stream)
    validate_heartbeat(request.heartbeat_ms)
    checks.pull_values(request)
    _spanner_ids(request.project, request.instance, request.database)
    if request.source == "beam-metadata":
        from spark_backend.jobs.beam_metadata import validate_table_name

        if beam_table:
            validate_table_name(beam_table)
    if request.source in ("spanner", "beam-metadata") and not os.environ.get(
            config.EMULATOR_HOST_ENVVAR):
        check_key_file()
    if request.source != "beam-metadata":
        from dataclasses import replace

        from spark_backend.jobs.pull import _validated

        _validated(replace(request))  # the pull's own checks (times, source, what it needs)


def _spanner_ids(project: str | None, instance: str | None, database: str | None) -> None:
    given = {"project": project, "instance": instance, "database": database}
    for label, value in given.items():
        if value is not None:  # each ID on its own, so the message names the wrong one
            SpannerTarget(**{**dict.fromkeys(given, "x"), label: value})


def check_import(stream: str, fmt: str, paths: list[str], spark_master: str | None,
                 spark_remote: str | None = None) -> None:
    checks.cache_stream_name(stream, "--stream")
    formats.get(fmt)
    checks.spark_choice(spark_master, spark_remote)
    from spark_backend.jobs.files import expand_paths

    expand_paths(paths)


