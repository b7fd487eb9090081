"""The one way to reach Spanner: a ``SpannerTarget`` names the database; ``make_client`` and
``open_database`` build the client's own ``Client(...).instance(...).database(...)``.

A local Spanner-protocol endpoint (the emulator, the demo server) is reached the client's
documented way: anonymous credentials and ``client_options.api_endpoint`` (the client then
uses a plain-text channel), never by setting its private attributes.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from typing import Any

from spark_backend.model import config
from spark_backend.model.enums import Dialect, values
from spark_backend.model.errors import BadInput, SourceError

_ID = re.compile(r"^[a-z][a-z0-9\-_.:]{0,127}$", re.IGNORECASE)
DIALECTS = values(Dialect)
_env_lock = threading.Lock()


def validate_dialect(dialect: str) -> str:
    if dialect not in DIALECTS:
        raise BadInput(f"Unknown dialect {dialect!r}; accepted dialects are googlesql, postgresql.",
                       field="dialect")
    return str(Dialect(dialect).value)


@dataclass(frozen=True)
class SpannerTarget:
    """Where a database is. ``host`` set: a local Spanner-protocol endpoint (no credentials)."""

    project: str
    instance: str
    database: str
    dialect: str = Dialect.GOOGLESQL.value
    host: str | None = None

    def __post_init__(self) -> None:
        for label, value in (("project", self.project), ("instance", self.instance),
                             ("database", self.database)):
            if not value or not _ID.match(value):
                raise BadInput(
                    f"{label} {value!r} is not a valid Spanner {label} ID; use letters, digits, "
                    "'-' and '_' (starting with a letter).", field=label,
                )
        validate_dialect(self.dialect)

    @property
    def path(self) -> str:
        return f"projects/{self.project}/instances/{self.instance}/databases/{self.database}"


def make_client(project: str, host: str | None = None) -> Any:
    """A ``spanner.Client``: plain text to ``host`` (or ``$SPANNER_EMULATOR_HOST``) when given,
    else Cloud Spanner with Application Default Credentials."""
    from google.cloud import spanner

    host = host or os.environ.get(config.EMULATOR_HOST_ENVVAR) or None
    if not host:
        try:
            return spanner.Client(project=project)
        except Exception as e:  # google.auth.exceptions.DefaultCredentialsError and friends
            raise SourceError(
                "No Google Cloud credentials were found; run `gcloud auth application-default "
                "login` or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file."
            ) from e
    config.quiet_local_client_env()
    from google.auth.credentials import AnonymousCredentials

    # The client prefers $SPANNER_EMULATOR_HOST over api_endpoint; when it names another host,
    # point it at ours for the moment the client is built.
    with _env_lock:
        saved = os.environ.get(config.EMULATOR_HOST_ENVVAR)
        os.environ[config.EMULATOR_HOST_ENVVAR] = host
        try:
            return spanner.Client(
                project=project,
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": host},
                disable_builtin_metrics=True,
            )
        finally:
            if saved is None:
                os.environ.pop(config.EMULATOR_HOST_ENVVAR, None)
            else:
                os.environ[config.EMULATOR_HOST_ENVVAR] = saved


def database_dialect_enum(dialect: str) -> Any:
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect

    return (DatabaseDialect.POSTGRESQL if validate_dialect(dialect) == Dialect.POSTGRESQL
            else DatabaseDialect.GOOGLE_STANDARD_SQL)


def open_database(target: SpannerTarget) -> Any:
    """A google-cloud-spanner ``Database`` for the target."""
    client = make_client(target.project, target.host)
    instance = client.instance(target.instance)
    return instance.database(target.database,
                             database_dialect=database_dialect_enum(target.dialect))
