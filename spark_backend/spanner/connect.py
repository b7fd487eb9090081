"""The one way to reach Spanner: a ``SpannerTarget`` names the database; ``make_client`` and
``open_database`` build the client's own ``Client(...).instance(...).database(...)``.

A local Spanner-protocol endpoint (the emulator, the demo server) is reached the client's
documented way: anonymous credentials and ``client_options.api_endpoint`` (the client then
uses a plain-text channel), never by setting its private attributes. The reads and the
questions a pull asks (the dialect) go to a local endpoint through the public GAPIC clients
(``SpannerClient``, ``DatabaseAdminClient``) on a plain-text channel of this module's, so they
reach the endpoint named even where ``$SPANNER_EMULATOR_HOST`` names another one (which the
``Client`` itself prefers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_backend.model import config
from spark_backend.model.enums import Dialect, values
from spark_backend.model.errors import BadInput, SourceError

_ID = re.compile(r"^[a-z][a-z0-9\-_.:]{0,127}$", re.IGNORECASE)
DIALECTS = values(Dialect)


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


_env_lock = threading.Lock()


def make_client(project: str, host: str | None = None) -> Any:
    """A ``spanner.Client``: plain text to ``host`` (or ``$SPANNER_EMULATOR_HOST``) when given,
    else Cloud Spanner with Application Default Credentials."""
    from google.cloud import spanner

    USAGE["clients"] += 1
    host = host or os.environ.get(config.EMULATOR_HOST_ENVVAR) or None
    if not host:
        try:
            return spanner.Client(project=project)
        except Exception as e:  # google.auth.exceptions.DefaultCredentialsError and friends
            raise SourceError(credentials_problem(e)) from e
    config.quiet_local_client_env()
    from google.auth.credentials import AnonymousCredentials

    # The client prefers $SPANNER_EMULATOR_HOST over api_endpoint for what it does itself (an
    # emulator's provisioning): where it names another endpoint, point it at ours for the
    # moment the client is built.
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


CREDENTIALS_ENVVAR = "GOOGLE_APPLICATION_CREDENTIALS"
_KEY_TYPES = ("service_account", "authorized_user", "external_account",
              "external_account_authorized_user", "impersonated_service_account")


def credentials_problem(e: BaseException) -> str:
    """One sentence for credentials the client could not use: the key file named by
    ``GOOGLE_APPLICATION_CREDENTIALS`` and what is wrong with it, or how to get credentials."""
    path = os.environ.get(CREDENTIALS_ENVVAR)
    if not path:
        return ("No Google Cloud credentials were found; run `gcloud auth application-default "
                f"login` or set {CREDENTIALS_ENVVAR} to a service account key file.")
    return (f"{CREDENTIALS_ENVVAR} names {path}, which {_key_file_fault(path, e)}; point it at "
            "a service account key file (JSON), or unset it to use `gcloud auth "
            "application-default login`.")


def _key_file_fault(path: str, e: BaseException | None) -> str:
    key = Path(path)
    if not key.exists():
        return "does not exist"
    if key.is_dir():
        return "is a folder, not a key file"
    try:
        data = json.loads(key.read_text(encoding="utf-8"))
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    except ValueError:
        return "is not JSON (a key file is the JSON downloaded for a service account)"
    if not isinstance(data, dict):
        return "is not a JSON object"
    if data.get("type") not in _KEY_TYPES:
        return (f"has type {data.get('type')!r}; a key file's type is service_account or "
                "authorized_user")
    if e is None:
        return ""
    cause = next((a for a in reversed(getattr(e, "args", ())) if isinstance(a, Exception)), e)
    detail = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return f"is not a usable {data['type']} key ({detail})"


def check_key_file() -> None:
    """Before anything starts: the key file ``GOOGLE_APPLICATION_CREDENTIALS`` names, if any,
    exists and is a key file (BadInput naming it otherwise)."""
    path = os.environ.get(CREDENTIALS_ENVVAR)
    if path:
        fault = _key_file_fault(path, None)
        if fault:
            raise BadInput(f"{CREDENTIALS_ENVVAR} names {path}, which {fault}; point it at a "
                           "service account key file (JSON), or unset it to use `gcloud auth "
                           "application-default login`.", field="project")


def database_dialect_enum(dialect: str | None) -> Any:
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect

    if dialect is None:
        return DatabaseDialect.DATABASE_DIALECT_UNSPECIFIED
    return (DatabaseDialect.POSTGRESQL if validate_dialect(dialect) == Dialect.POSTGRESQL
            else DatabaseDialect.GOOGLE_STANDARD_SQL)


def open_database(target: SpannerTarget) -> Any:
    """The google-cloud-spanner ``Database`` for the target, one per target for the process.

    A live stream's refresh opens the same target tick after tick (the driver, and every Spark
    task in a reused Python worker): it gets the same ``Database`` on the same ``Client`` (one
    channel, credentials refreshed by the client itself) instead of a new client each time.
    Keyed by the target and the endpoint it resolves to now (``host``, else
    ``$SPANNER_EMULATOR_HOST``, else Cloud Spanner); :func:`forget` drops an endpoint's.
    """
    endpoint = target.host or os.environ.get(config.EMULATOR_HOST_ENVVAR) or None
    key = (target, endpoint)
    with _open_lock:
        USAGE["open_database"] += 1
        database = _DATABASES.get(key)
        if database is None:
            client = _CLIENTS.get((target.project, endpoint))
            if client is None:
                client = make_client(target.project, endpoint)
                _CLIENTS[(target.project, endpoint)] = client
            instance = client.instance(target.instance)
            database = instance.database(target.database,
                                         database_dialect=database_dialect_enum(target.dialect))
            _DATABASES[key] = database
            _ENDPOINT_OF[id(database)] = endpoint
            _CLIENT_OF[id(database)] = client
    _ENDPOINTS[target.path] = endpoint or CLOUD_ENDPOINT
    return database


# gRPC's options for the channel that partition reads use on a local endpoint. By default gRPC
# probes the connection's bandwidth-delay product and widens every stream's flow-control window
# from it; when the reads fall behind what the server sends (the process's CPU is the limit, as
# in the first minute of a large pull), each open stream then holds what arrived ahead of its
# reader, up to that window, in the process's native memory. Without the probe each stream
# keeps gRPC's 64 KB window: the server waits for the reader instead, at the same read rate
# (``benchmarks/read_window.py``; figures in benchmarks/RESULTS.md).
READ_CHANNEL_OPTIONS = (("grpc.http2.bdp_probe", 0),
                        ("grpc.max_send_message_length", -1),
                        ("grpc.max_receive_message_length", -1))


def _local_channel(endpoint: str) -> Any:
    import grpc

    return grpc.insecure_channel(endpoint, options=READ_CHANNEL_OPTIONS)


def admin_api(database: Any) -> Any | None:
    """The ``DatabaseAdminClient`` for ``database``: on a local endpoint one per endpoint for
    the process, on a plain-text channel; on Cloud Spanner its ``Client``'s
    (``Client.database_admin_api``); None for a ``Database`` not opened by
    :func:`open_database` (its client is not known here)."""
    endpoint = _ENDPOINT_OF.get(id(database))
    if endpoint is None:
        client = _CLIENT_OF.get(id(database))
        return None if client is None else client.database_admin_api
    with _open_lock:
        api = _ADMIN_APIS.get(endpoint)
        if api is None:
            from google.cloud.spanner_admin_database_v1 import DatabaseAdminClient
            from google.cloud.spanner_admin_database_v1.services.database_admin.transports import (
                DatabaseAdminGrpcTransport,
            )

            api = DatabaseAdminClient(
                transport=DatabaseAdminGrpcTransport(channel=_local_channel(endpoint)))
            _ADMIN_APIS[endpoint] = api
    return api


def read_api(database: Any) -> Any:
    """The Spanner API client (``SpannerClient``) for the partition reads of ``database``.

    On a local endpoint (the emulator, the demo server, ``$SPANNER_EMULATOR_HOST``) one per
    endpoint for the process, on a plain-text channel with ``READ_CHANNEL_OPTIONS``; on Cloud
    Spanner, and for a ``Database`` not opened by :func:`open_database`, the database's own
    (``Database.spanner_api``: the client library's channel, credentials and headers)."""
    endpoint = _ENDPOINT_OF.get(id(database))
    if endpoint is None:
        return database.spanner_api
    with _open_lock:
        api = _READ_APIS.get(endpoint)
        if api is None:
            from google.cloud.spanner_v1.services.spanner import SpannerClient
            from google.cloud.spanner_v1.services.spanner.transports import SpannerGrpcTransport

            api = SpannerClient(transport=SpannerGrpcTransport(channel=_local_channel(endpoint)))
            _READ_APIS[endpoint] = api
    return api


# What this process opened, for as long as it runs: (target, endpoint) -> Database and
# (project, endpoint) -> Client. USAGE counts calls and clients made (the tests read it).
_DATABASES: dict[tuple[SpannerTarget, str | None], Any] = {}
_CLIENTS: dict[tuple[str, str | None], Any] = {}
# id(Database) -> its local endpoint (only those open_database keeps), and the reads' API
# client of each local endpoint (read_api).
_ENDPOINT_OF: dict[int, str] = {}
_CLIENT_OF: dict[int, Any] = {}   # id(Database) -> the Client it was opened on
_READ_APIS: dict[str, Any] = {}
_ADMIN_APIS: dict[str, Any] = {}
_open_lock = threading.Lock()
USAGE = {"open_database": 0, "clients": 0}


def forget(endpoint: str) -> None:
    """Drop the clients and databases opened on a local ``endpoint`` (host:port) that stopped:
    a later server on the same port is another database."""
    with _open_lock:
        for key in [k for k in _DATABASES if k[1] == endpoint]:
            gone = id(_DATABASES.pop(key))
            _ENDPOINT_OF.pop(gone, None)
            _CLIENT_OF.pop(gone, None)
        # Not closed: a read still holding a session of it finishes on it (as on the
        # Database's own channel); the channel goes with the last of them.
        _READ_APIS.pop(endpoint, None)
        _ADMIN_APIS.pop(endpoint, None)
        for key in [k for k in _CLIENTS if k[1] == endpoint]:
            del _CLIENTS[key]


CLOUD_ENDPOINT = "spanner.googleapis.com"
_ENDPOINTS: dict[str, str] = {}  # database path -> the endpoint it was opened on
_NO_ANSWER = ("RetryError", "DeadlineExceeded", "ServiceUnavailable")


def describe_unreachable(exc: BaseException, database: Any = None) -> str | None:
    """One sentence when Spanner did not answer in time (what timed out, where, after how
    long, the last error); None for other errors."""
    if type(exc).__name__ not in _NO_ANSWER:
        return None
    path = getattr(database, "name", None)
    endpoint = _ENDPOINTS.get(path or "") or os.environ.get(config.EMULATOR_HOST_ENVVAR) \
        or CLOUD_ENDPOINT
    text = getattr(exc, "message", None) or str(exc)
    waited = re.search(r"Timeout of ([\d.]+)s", text)
    after = f" within {float(waited.group(1)):g} s" if waited else ""
    last = getattr(exc, "cause", None) or exc
    detail = getattr(last, "message", None) or str(last)
    detail = (detail.strip().splitlines() or [type(last).__name__])[0]
    return (f"Spanner at {endpoint} did not answer the change stream query for "
            f"{path or 'the database'}{after} (last error: {type(last).__name__}: {detail}); "
            "check the network, the endpoint and that the instance and database exist.")


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

    api = admin_api(database)
    if api is None:
        return None
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

    api = read_api(database)
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
