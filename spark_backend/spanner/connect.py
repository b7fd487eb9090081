"""The one way to reach Spanner: a ``SpannerTarget`` names the database; ``make_client`` and
``open_database`` build the client's own ``Client(...).instance(...).database(...)``.

A local Spanner-protocol endpoint (the emulator, the demo server) is reached the client's
documented way: anonymous credentials and ``client_options.api_endpoint`` (the client then
uses a plain-text channel), never by setting its private attributes.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import weakref
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
    dialect: str | None = None  # None: the database's own (asked); given: an override
    host: str | None = None

    def __post_init__(self) -> None:
        for label, value in (("project", self.project), ("instance", self.instance),
                             ("database", self.database)):
            if not value or not _ID.match(value):
                raise BadInput(
                    f"{label} {value!r} is not a valid Spanner {label} ID; use letters, digits, "
                    "'-' and '_' (starting with a letter).", field=label,
                )
        if self.dialect is not None:
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


def database_dialect_enum(dialect: str | None) -> Any:
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect

    if dialect is None:
        return DatabaseDialect.DATABASE_DIALECT_UNSPECIFIED
    return (DatabaseDialect.POSTGRESQL if validate_dialect(dialect) == Dialect.POSTGRESQL
            else DatabaseDialect.GOOGLE_STANDARD_SQL)


def open_database(target: SpannerTarget) -> Any:
    """A google-cloud-spanner ``Database`` for the target."""
    client = make_client(target.project, target.host)
    instance = client.instance(target.instance)
    return instance.database(target.database,
                             database_dialect=database_dialect_enum(target.dialect))

# --- retries and the database's own dialect ---------------------------------------------------

TRANSIENT_ERRORS = (
    "ServiceUnavailable", "Aborted", "DeadlineExceeded", "InternalServerError", "Cancelled",
    "ResourceExhausted",
)


def is_transient(exc: BaseException) -> bool:
    """An error worth retrying (the source was briefly unavailable, busy or cut the stream)."""
    return type(exc).__name__ in TRANSIENT_ERRORS


def _retry() -> Any:
    from google.api_core.retry import Retry

    return Retry(predicate=is_transient, initial=0.2, maximum=5.0, multiplier=2.0, timeout=60.0)


class _LazyRetry:
    """``google.api_core.retry.Retry`` built on first use (keeps this module light to import)."""

    _built: Any = None

    def __call__(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        if _LazyRetry._built is None:
            _LazyRetry._built = _retry()
        return _LazyRetry._built(func, *args, **kwargs)


RETRY = _LazyRetry()
_DIALECT_NAMES = {Dialect.GOOGLESQL.value: "GoogleSQL", Dialect.POSTGRESQL.value: "PostgreSQL"}
_DIALECTS_ASKED: dict[int, str] = {}  # id(Database) -> its dialect, while it lives
DIALECT_SQL = ("SELECT option_value FROM information_schema.database_options "
               "WHERE option_name = 'database_dialect'")


def dialect_name(dialect: str) -> str:
    """'postgresql' -> 'PostgreSQL' (for sentences)."""
    return _DIALECT_NAMES.get(dialect, dialect)


def _from_admin(database: Any) -> str | None:
    """The admin API's ``Database.database_dialect`` (None when it does not say: the
    emulator leaves it unspecified). Asked directly: ``Database.reload()`` would keep the
    dialect the object was opened with when the answer is unspecified."""
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect

    api = database._instance._client.database_admin_api
    answer = api.get_database(name=database.name, retry=RETRY).database_dialect
    if answer == DatabaseDialect.POSTGRESQL:
        return Dialect.POSTGRESQL.value
    if answer == DatabaseDialect.GOOGLE_STANDARD_SQL:
        return Dialect.GOOGLESQL.value
    return None


def _from_information_schema(database: Any) -> str | None:
    """``information_schema.database_options`` (the same query in both dialects)."""
    from google.cloud.spanner_v1 import (
        CreateSessionRequest,
        ExecuteSqlRequest,
        TransactionOptions,
        TransactionSelector,
    )

    api = database.spanner_api
    metadata = [("google-cloud-resource-prefix", database.name)]
    session = api.create_session(request=CreateSessionRequest(database=database.name),
                                 metadata=metadata, retry=RETRY).name
    try:
        strong = TransactionOptions(read_only=TransactionOptions.ReadOnly(strong=True))
        result = api.execute_sql(
            request=ExecuteSqlRequest(session=session, sql=DIALECT_SQL,
                                      transaction=TransactionSelector(single_use=strong)),
            metadata=metadata, retry=RETRY)
    finally:
        try:
            api.delete_session(name=session, metadata=metadata)
        except Exception:  # the session expires on its own
            pass
    for row in type(result).pb(result).rows:  # the raw protobuf rows
        value = (row.values[0].string_value or "").upper()
        if value == "POSTGRESQL":
            return Dialect.POSTGRESQL.value
        if value in ("GOOGLE_STANDARD_SQL", ""):
            return Dialect.GOOGLESQL.value
    return None


def remember_for(obj: Any, memo: dict[int, Any], value: Any) -> None:
    """``memo[id(obj)] = value`` until ``obj`` is collected (client objects are unhashable)."""
    key = id(obj)
    if key not in memo:
        weakref.finalize(obj, memo.pop, key, None)
    memo[key] = value


def ask_dialect(database: Any) -> str:
    """The database's own dialect: the admin API's ``database_dialect``, else (a reader may
    lack the admin permission) the information schema. Asked once per ``Database`` object."""
    known = _DIALECTS_ASKED.get(id(database))
    if known:
        return known
    try:
        dialect = _from_admin(database)
    except Exception as e:
        if is_transient(e):
            raise
        dialect = None
    if dialect is None:
        dialect = _from_information_schema(database) or Dialect.GOOGLESQL.value
    remember_for(database, _DIALECTS_ASKED, dialect)
    return dialect


def with_database_dialect(target: SpannerTarget, database: Any | None = None) -> SpannerTarget:
    """``target`` with its dialect settled: a given one stays (an override), else the
    database's own."""
    if target.dialect is not None:
        return target
    database = database if database is not None else open_database(target)
    try:
        dialect = ask_dialect(database)
    except Exception as e:
        from google.api_core.exceptions import GoogleAPIError

        if not isinstance(e, GoogleAPIError):
            raise
        first = (getattr(e, "message", None) or str(e) or type(e).__name__).splitlines()[0]
        raise SourceError(f"Spanner did not say the dialect of {target.path}: {first}") from e
    return dataclasses.replace(target, dialect=dialect)
