"""Checks of a job's inputs that need the rooms below (Spanner IDs, key files, formats, paths),
for the command line to run before anything starts (Spark, servers, emulators, the cache)."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from spark_backend import formats
from spark_backend.model import checks, config
from spark_backend.model.enums import Source
from spark_backend.spanner.connect import SpannerTarget, check_key_file
from spark_backend.spanner.reader import validate_heartbeat


def check_pull(request: Any) -> None:
    """A pull request (``jobs.pull.PullRequest``), every value; BadInput names the first wrong
    one."""
    from spark_backend.jobs.pull import check_request

    source = request.source
    _spanner_ids(getattr(source, "project", None), getattr(source, "instance", None),
                 getattr(source, "database", None))
    check_request(replace(request))  # the pull's own checks (times, source, what it needs)
    if source.kind == Source.SPANNER and not os.environ.get(config.EMULATOR_HOST_ENVVAR):
        check_key_file()


def check_beam_pull(stream: str | None, project: str | None, instance: str | None,
                    database: str | None, table: str | None, heartbeat_ms: int) -> None:
    """A pull of the Beam connector's metadata table (``--source beam-metadata``)."""
    from spark_backend.jobs.beam_metadata import validate_table_name

    if stream is not None:
        checks.cache_stream_name(stream)
    validate_heartbeat(heartbeat_ms)
    _spanner_ids(project, instance, database)
    if table:
        validate_table_name(table)
    if not os.environ.get(config.EMULATOR_HOST_ENVVAR):
        check_key_file()


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


