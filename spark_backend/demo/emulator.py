"""The ``emulator`` source: a local Cloud Spanner emulator with a bank-transfer workload.

Lets a user watch real change stream partitions split and merge with no Cloud account:

    with start_emulator_world(dialect="googlesql", churn_seconds=2) as world:
        with Workload(world.host, world.project, world.instance, world.database,
                      world.dialect, seed=7) as workload:
            ...  # pull READ_BankStream from world.host

Pieces:

- :class:`EmulatorProcess` starts ``emulator_main`` on a free loopback port and stops it (and its
  process group) reliably, also on exceptions, ``KeyboardInterrupt``, interpreter exit and (when
  started from the main thread, on Linux) a hard kill of the parent.
- :func:`provision` creates instance, database (GoogleSQL or PostgreSQL), the ``Accounts`` and
  ``Transfers`` tables and ``CREATE CHANGE STREAM <stream> FOR ALL``. Idempotent: calling it again
  with the same arguments is a no-op; an existing database of the other dialect or without the
  stream raises :class:`EmulatorProvisionError`.
- :class:`Workload` runs read-write bank transactions (tagged ``app=bank,action=...``) in a
  background thread or synchronously (:meth:`Workload.run_n`) and records every committed
  transaction with its commit timestamp and the rows it wrote.

PostgreSQL databases use quoted identifiers (``"Accounts"``, ``"AccountId"``, ``"BankStream"``) so
table, column and read function names are the same in both dialects:
``READ_BankStream`` / ``"spanner"."read_json_BankStream"``.

Emulator facts (google-cloud-cli-spanner-emulator 528.0.0; tests/test_emulator_source.py):

- Its gRPC server binds with SO_REUSEPORT: two emulators can silently share one port and split
  the connections between them. :class:`EmulatorProcess` checks it is the only listener.
- GetDatabase does not report ``database_dialect``: open PostgreSQL databases with the dialect
  given explicitly (:func:`open_database`); :func:`database_dialect_of` asks with SQL.
- Change stream records carry ``transaction_tag = ''`` (tags are not recorded) and show the
  commit-timestamp sentinel as ``9999-12-31T23:59:59Z`` in ``new_values``; the workload therefore
  writes client-clock timestamps. Match committed transactions to records by commit timestamp
  (unique per transaction here) and keys, not by tag.
- The earliest valid ``start_timestamp`` is the change stream's DDL commit timestamp;
  :attr:`EmulatorWorld.created_at` (client clock after provisioning) is always valid.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spark_backend.model import config
from spark_backend.spanner import connect
from spark_backend.spanner.connect import SpannerTarget

Dialect = Literal["googlesql", "postgresql"]

DEFAULT_PROJECT = "emulator-project"
DEFAULT_INSTANCE = "emulator-instance"
DEFAULT_DATABASE = "bank"
DEFAULT_STREAM = "BankStream"
EMULATOR_INSTANCE_CONFIG = "emulator-config"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
APP_TAG = "app=bank"

INSTALL_HINT = (
    "Install the Cloud Spanner emulator with `gcloud components install cloud-spanner-emulator` "
    "(or the Debian/Ubuntu package `google-cloud-cli-spanner-emulator`), or set "
    f"{config.EMULATOR_BINARY_ENVVAR}=/path/to/emulator_main."
)


class EmulatorNotInstalled(RuntimeError):
    """The Cloud Spanner emulator binary cannot be found."""


class EmulatorStartError(RuntimeError):
    """The emulator process exited or did not answer in time."""


class EmulatorProvisionError(RuntimeError):
    """The emulator already holds a conflicting database."""


# --------------------------------------------------------------------------------------------
# the binary and the process


def find_emulator_binary(binary: str | os.PathLike[str] | None = None) -> str:
    """Path of ``emulator_main``; raise :class:`EmulatorNotInstalled` with the install hint.

    An explicit ``binary`` or a set ``SPANNER_EMULATOR_BINARY`` must point to an executable file
    (no silent fallback to another emulator on PATH).
    """
    explicit = os.fspath(binary) if binary is not None else None
    source = "binary argument"
    if explicit is None and os.environ.get(config.EMULATOR_BINARY_ENVVAR):
        explicit = os.environ[config.EMULATOR_BINARY_ENVVAR]
        source = config.EMULATOR_BINARY_ENVVAR
    if explicit is not None:
        if Path(explicit).is_file() and os.access(explicit, os.X_OK):
            return explicit
        raise EmulatorNotInstalled(
            f"Cloud Spanner emulator not found at {explicit} (from {source}). {INSTALL_HINT}"
        )
    found = config.emulator_binary()
    if found is None:
        raise EmulatorNotInstalled(f"Cloud Spanner emulator not found. {INSTALL_HINT}")
    return found


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _host_port(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _pick_port(address: str = "127.0.0.1") -> int:
    # A socket without SO_REUSEPORT conflicts with every bound socket, so the kernel hands out a
    # port nobody uses right now. The emulator binds it a moment later (small race, checked after).
    try:
        with socket.socket(_family(address), socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            return s.getsockname()[1]
    except OSError as e:  # not an address of this machine, or a name that does not resolve
        raise EmulatorStartError(f"the emulator cannot listen on {address} "
                                 f"({e.strerror or e}); set SPARK_LOCAL_IP to an address of "
                                 "this machine that Spark's executors reach") from e


def _listening_sockets(port: int) -> int | None:
    """Number of TCP sockets listening on ``port`` (Linux /proc), None when unknown."""
    total = 0
    seen = False
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        seen = True
        for line in lines:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                total += 1
    return total if seen else None


def port_is_free(port: int) -> bool:
    """True when nothing is bound to 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_LIVE: weakref.WeakSet[EmulatorProcess] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for proc in list(_LIVE):
        with contextlib.suppress(Exception):
            proc.stop()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class EmulatorProcess:
    """A Cloud Spanner emulator on a free port of 127.0.0.1 (or of ``listen``: the address a
    Spark cluster's executors reach this machine at); a context manager.

    ``churn_seconds`` sets ``--override_change_stream_partition_token_alive_seconds``: each
    change stream partition then lives N..2N seconds before it splits or merges (default 20..40).
    ``extra_args`` are passed through (``emulator_main --helpfull`` lists them).
    """

    def __init__(
        self,
        binary: str | os.PathLike[str] | None = None,
        churn_seconds: int | None = None,
        *,
        extra_args: Sequence[str] = (),
        start_timeout_s: float = START_TIMEOUT_S,
        listen: str = "127.0.0.1",
    ) -> None:
        self.binary = find_emulator_binary(binary)
        self.listen = listen.strip("[]")
        self.churn_seconds = churn_seconds
        self.extra_args = tuple(extra_args)
        self.start_timeout_s = start_timeout_s
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._lock = threading.Lock()

    # -- public ------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """``ADDRESS:PORT`` (``127.0.0.1:PORT`` by default), the value for
        SPANNER_EMULATOR_HOST / api_endpoint."""
        if self.port is None:
            raise RuntimeError("emulator not started")
        return _host_port(self.listen, self.port)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self, port: int) -> list[str]:
        cmd = [self.binary, "--host_port", _host_port(self.listen, port)]
        if self.churn_seconds is not None:
            cmd += [
                "--override_change_stream_partition_token_alive_seconds",
                str(self.churn_seconds),
            ]
        return cmd + list(self.extra_args)

    def start(self) -> EmulatorProcess:
        if self.running:
            return self
        last_error: Exception | None = None
        for _ in range(5):
            try:
                self._start_once(_pick_port(self.listen))
                return self
            except _PortShared as exc:
                last_error = exc
                self.stop()
        raise EmulatorStartError(f"could not get a port of our own on {self.listen}: "
                                 f"{last_error}")

    def stop(self) -> None:
        """Terminate the emulator's process group; SIGKILL after a few seconds. Idempotent."""
        with self._lock:
            proc, self._proc = self._proc, None
            log, self._log = self._log, None
        _LIVE.discard(self)
        if proc is not None:
            _terminate_group(proc)
            if self.port is not None:
                connect.forget(self.host)
        if log is not None:
            with contextlib.suppress(Exception):
                log.close()

    def stderr_tail(self, n_bytes: int = 4000) -> str:
        if self._log is None:
            return ""
        try:
            self._log.flush()
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - n_bytes))
            return self._log.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def __enter__(self) -> EmulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __del__(self) -> None:  # last resort; the context manager / atexit are the real path
        with contextlib.suppress(Exception):
            if self._proc is not None:
                self.stop()

    # -- internals ---------------------------------------------------------------------------

    def _start_once(self, port: int) -> None:
        self._log = tempfile.TemporaryFile(prefix="spanner-emulator-")
        in_main = threading.current_thread() is threading.main_thread()
        # PDEATHSIG fires when the *thread* that forked exits, so only use it from the main
        # thread (Streamlit runs scripts in short-lived threads).
        preexec = _die_with_parent if (in_main and sys.platform.startswith("linux")) else None
        self.port = port
        try:
            self._proc = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except OSError as exc:
            raise EmulatorNotInstalled(f"cannot run {self.binary}: {exc}. {INSTALL_HINT}") from exc
        _LIVE.add(self)
        try:
            self._wait_ready(port)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, port: int) -> None:
        import grpc

        where = _host_port(self.listen, port)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert self._proc is not None
            code = self._proc.poll()
            if code is not None:
                raise EmulatorStartError(
                    f"emulator exited with code {code} while starting on {where}; "
                    f"its output ends with:\n{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                tail = self.stderr_tail()
                raise EmulatorStartError(
                    f"emulator did not answer on {where} within "
                    f"{self.start_timeout_s:.0f} s; its output ends with:\n{tail}"
                )
            try:
                with socket.create_connection((self.listen, port), timeout=0.2):
                    pass
            except OSError:
                time.sleep(0.05)
                continue
            channel = grpc.insecure_channel(where)
            try:
                remaining = max(0.1, deadline - time.monotonic())
                grpc.channel_ready_future(channel).result(timeout=remaining)
            except grpc.FutureTimeoutError:
                continue
            finally:
                channel.close()
            break
        listeners = _listening_sockets(port)
        if listeners is not None and listeners > 1:
            raise _PortShared(f"{listeners} processes listen on port {port}")


class _PortShared(EmulatorStartError):
    pass


def _terminate_group(proc: subprocess.Popen[bytes]) -> None:
    def signal_group(sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # start_new_session: pgid == pid
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    if proc.poll() is None:
        signal_group(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            signal_group(signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)
    # children that outlived the leader
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# clients and provisioning


def schema_ddl(dialect: Dialect, stream: str = DEFAULT_STREAM) -> list[str]:
    """DDL of the bank schema and its change stream in ``dialect``."""
    if dialect == "googlesql":
        return [
            "CREATE TABLE Accounts (AccountId STRING(64) NOT NULL, Balance INT64 NOT NULL, "
            "LastUpdate TIMESTAMP OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (AccountId)",
            "CREATE TABLE Transfers (TransferId STRING(64) NOT NULL, FromAccount STRING(64), "
            "ToAccount STRING(64), Amount INT64, "
            "CreatedAt TIMESTAMP OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (TransferId)",
            f"CREATE CHANGE STREAM {stream} FOR ALL",
        ]
    if dialect == "postgresql":
        return [
            'CREATE TABLE "Accounts" ("AccountId" varchar(64) NOT NULL, "Balance" bigint NOT NULL, '
            '"LastUpdate" spanner.commit_timestamp, PRIMARY KEY ("AccountId"))',
            'CREATE TABLE "Transfers" ("TransferId" varchar(64) NOT NULL, '
            '"FromAccount" varchar(64), "ToAccount" varchar(64), "Amount" bigint, '
            '"CreatedAt" spanner.commit_timestamp, PRIMARY KEY ("TransferId"))',
            f'CREATE CHANGE STREAM "{stream}" FOR ALL',
        ]
    connect.database_dialect_enum(dialect)
    raise AssertionError


def provision(
    host: str,
    project: str,
    instance: str,
    database: str,
    dialect: Dialect = "googlesql",
    stream: str = DEFAULT_STREAM,
) -> None:
    """Create instance, database, bank tables and ``CREATE CHANGE STREAM <stream> FOR ALL``.

    Idempotent: an existing instance is reused; an existing database with the same dialect and
    stream is left alone (no-op). An existing database of the other dialect or without the stream
    raises :class:`EmulatorProvisionError`. PostgreSQL DDL is sent with ``update_ddl`` after the
    database is created (as Cloud Spanner requires; the emulator would accept it either way).
    """
    from google.api_core.exceptions import AlreadyExists

    dialect_enum = connect.database_dialect_enum(dialect)
    client = connect.make_client(project, host)
    inst = client.instance(
        instance,
        configuration_name=f"projects/{project}/instanceConfigs/{EMULATOR_INSTANCE_CONFIG}",
        display_name=instance,
        node_count=1,
    )
    with contextlib.suppress(AlreadyExists):
        inst.create().result(timeout=60)
    ddl = schema_ddl(dialect, stream)
    if dialect == "googlesql":
        db = inst.database(database, ddl_statements=ddl, database_dialect=dialect_enum)
    else:
        db = inst.database(database, database_dialect=dialect_enum)
    try:
        db.create().result(timeout=60)
    except AlreadyExists:
        _check_existing(inst, project, database, dialect, stream)
        return
    if dialect == "postgresql":
        db.update_ddl(ddl).result(timeout=60)


def database_dialect_of(database: Any) -> Dialect:
    """Dialect of an existing database, asked with SQL.

    The emulator's GetDatabase leaves ``database_dialect`` unset, so ``Database.reload()`` cannot
    tell; ``information_schema.database_options`` answers in both dialects.
    """
    sql = (
        "SELECT option_value FROM information_schema.database_options "
        "WHERE option_name = 'database_dialect'"
    )
    with database.snapshot() as snap:
        rows = list(snap.execute_sql(sql))
    return "postgresql" if rows and rows[0][0] == "POSTGRESQL" else "googlesql"


def open_database(host: str, project: str, instance: str, database: str, dialect: Dialect) -> Any:
    """A ``Database`` handle on the emulator, dialect set (the emulator does not report it)."""
    return connect.open_database(SpannerTarget(project, instance, database, dialect, host))


def _check_existing(inst: Any, project: str, database: str, dialect: Dialect,
                    stream: str) -> None:
    db = inst.database(database)
    found = database_dialect_of(db)
    name = f"projects/{project}/instances/{inst.instance_id}/databases/{database}"
    if found != dialect:
        raise EmulatorProvisionError(f"{name} already exists with dialect {found}, not {dialect}")
    db.reload()
    wanted = {f"CREATE CHANGE STREAM {stream}", f'CREATE CHANGE STREAM "{stream}"'}
    if not any(s.split("\n")[0].split(" FOR ")[0].strip() in wanted for s in db.ddl_statements):
        raise EmulatorProvisionError(f"{name} already exists without change stream {stream}")


# --------------------------------------------------------------------------------------------
# the workload


@dataclass(frozen=True)
class Write:
    """One row a transaction wrote: what its data change record's mod will show."""

    table: str
    key: str
    mod_type: Literal["INSERT", "UPDATE", "DELETE"]


@dataclass(frozen=True)
class CommittedTxn:
    seq: int  # 0-based order in which this Workload committed
    action: str  # seed | transfer | open_account | close_account
    transaction_tag: str  # e.g. "app=bank,action=transfer"
    commit_timestamp: dt.datetime  # tz-aware UTC (DatetimeWithNanoseconds)
    writes: tuple[Write, ...]

    @property
    def tables(self) -> frozenset[str]:
        return frozenset(w.table for w in self.writes)


def _now() -> dt.datetime:
    # Client clock, not the commit-timestamp sentinel: the emulator (1.5.x) puts the sentinel's
    # placeholder 9999-12-31T23:59:59Z into change stream new_values instead of the commit time.
    return dt.datetime.now(dt.UTC)


ACCOUNT_COLS = ["AccountId", "Balance", "LastUpdate"]
TRANSFER_COLS = ["TransferId", "FromAccount", "ToAccount", "Amount", "CreatedAt"]
INITIAL_BALANCE = 1_000


@dataclass
class _Plan:
    action: str
    args: dict[str, Any] = field(default_factory=dict)


class Workload:
    """Bank-transfer read-write transactions against one emulator database.

    The content is deterministic for a given ``seed`` on a fresh database (run sequentially by
    :meth:`run_n` or by the background thread from :meth:`start`; both share one lock). The first
    transaction seeds ``accounts`` accounts when the table is empty. Two workloads with the same
    seed on one database would collide on transfer ids: give each its own seed, and run them one
    after the other (each keeps its own model of which accounts exist).
    """

    def __init__(
        self,
        host: str,
        project: str,
        instance: str,
        database: str,
        dialect: Dialect = "googlesql",
        *,
        seed: int = 0,
        accounts: int = 20,
        rate_per_s: float = 20.0,
    ) -> None:
        if accounts < 2:
            raise ValueError("accounts must be >= 2")
        self.host, self.project, self.instance, self.database = host, project, instance, database
        self.dialect = dialect
        self.seed = seed
        self.accounts = accounts
        self.rate_per_s = rate_per_s
        self._db = open_database(host, project, instance, database, dialect)
        self._rng = random.Random(seed)
        self._ids: list[str] | None = None
        self._n_transfers = 0
        self._n_opened = 0
        self._committed: list[CommittedTxn] = []
        self._step_lock = threading.Lock()
        self._list_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[BaseException] = []

    # -- public ------------------------------------------------------------------------------

    @property
    def committed(self) -> list[CommittedTxn]:
        """Committed transactions so far, in commit order (a copy)."""
        with self._list_lock:
            return list(self._committed)

    def run_n(self, n: int) -> list[CommittedTxn]:
        """Run exactly ``n`` transactions now and return them.

        On an empty database a seeding transaction (``action="seed"``) runs first; it is in
        :attr:`committed` but not in the returned list.
        """
        out = []
        for _ in range(n):
            out.append(self.step())
        return out

    def step(self) -> CommittedTxn:
        with self._step_lock:
            self._ensure_seeded()
            return self._run(self._plan())

    def start(self) -> Workload:
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="emulator-workload", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def close(self) -> None:
        # Not Database.close(): in google-cloud-spanner 3.71 it joins the multiplexed-session
        # maintenance thread, which sleeps in 10-minute steps. That thread is a daemon.
        self.stop()

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _loop(self) -> None:
        interval = 1.0 / self.rate_per_s if self.rate_per_s > 0 else 0.0
        next_at = time.monotonic()
        consecutive = 0
        while not self._stop.is_set():
            try:
                self.step()
                consecutive = 0
            except Exception as exc:  # keep going on transient errors, give up on a dead world
                self.errors.append(exc)
                consecutive += 1
                if consecutive >= 5:
                    return
            next_at += interval
            delay = next_at - time.monotonic()
            if delay < -1.0:
                next_at = time.monotonic()
            elif delay > 0:
                self._stop.wait(delay)

    def _ensure_seeded(self) -> None:
        if self._ids is not None:
            return
        from google.cloud.spanner_v1.keyset import KeySet

        with self._db.snapshot() as snap:
            ids = sorted(r[0] for r in snap.read("Accounts", ["AccountId"], KeySet(all_=True)))
        if not ids:
            ids = [f"acct-{self.seed}-{i:04d}" for i in range(self.accounts)]
            writes = tuple(Write("Accounts", a, "INSERT") for a in ids)

            def seed_txn(txn: Any) -> None:
                now = _now()
                txn.insert("Accounts", ACCOUNT_COLS, [[a, INITIAL_BALANCE, now] for a in ids])

            self._commit("seed", seed_txn, writes)
        self._ids = ids

    def _plan(self) -> _Plan:
        assert self._ids is not None
        r = self._rng.random()
        if r < 0.08:
            self._n_opened += 1
            new_id = f"acct-{self.seed}-new-{self._n_opened:06d}"
            return _Plan("open_account", {"id": new_id, "balance": self._rng.randint(10, 500)})
        if r < 0.14 and len(self._ids) > 2:
            victim, heir = self._rng.sample(self._ids, 2)
            return _Plan("close_account", {"id": victim, "heir": heir})
        src, dst = self._rng.sample(self._ids, 2)
        self._n_transfers += 1
        return _Plan(
            "transfer",
            {
                "from": src,
                "to": dst,
                "amount": self._rng.randint(1, 100),
                "id": f"tr-{self.seed}-{self._n_transfers:08d}",
            },
        )

    def _run(self, plan: _Plan) -> CommittedTxn:
        from google.cloud.spanner_v1.keyset import KeySet

        a = plan.args

        def balances(txn: Any, ids: list[str]) -> dict[str, int]:
            rows = txn.read("Accounts", ["AccountId", "Balance"], KeySet(keys=[[i] for i in ids]))
            return {r[0]: r[1] for r in rows}

        if plan.action == "transfer":
            writes = (
                Write("Accounts", a["from"], "UPDATE"),
                Write("Accounts", a["to"], "UPDATE"),
                Write("Transfers", a["id"], "INSERT"),
            )

            def fn(txn: Any) -> None:
                ts = _now()
                bal = balances(txn, [a["from"], a["to"]])
                txn.update(
                    "Accounts",
                    ACCOUNT_COLS,
                    [
                        [a["from"], bal[a["from"]] - a["amount"], ts],
                        [a["to"], bal[a["to"]] + a["amount"], ts],
                    ],
                )
                row = [a["id"], a["from"], a["to"], a["amount"], ts]
                txn.insert("Transfers", TRANSFER_COLS, [row])

        elif plan.action == "open_account":
            writes = (Write("Accounts", a["id"], "INSERT"),)

            def fn(txn: Any) -> None:
                txn.insert("Accounts", ACCOUNT_COLS, [[a["id"], a["balance"], _now()]])

        elif plan.action == "close_account":
            writes = (Write("Accounts", a["heir"], "UPDATE"), Write("Accounts", a["id"], "DELETE"))

            def fn(txn: Any) -> None:
                bal = balances(txn, [a["id"], a["heir"]])
                heir_balance = bal[a["heir"]] + bal[a["id"]]
                txn.update("Accounts", ACCOUNT_COLS, [[a["heir"], heir_balance, _now()]])
                txn.delete("Accounts", KeySet(keys=[[a["id"]]]))

        else:  # pragma: no cover
            raise AssertionError(plan.action)
        txn = self._commit(plan.action, fn, writes)
        assert self._ids is not None
        if plan.action == "open_account":
            self._ids.append(a["id"])
        elif plan.action == "close_account":
            self._ids.remove(a["id"])
        return txn

    def _commit(self, action: str, fn: Any, writes: tuple[Write, ...]) -> CommittedTxn:
        tag = f"{APP_TAG},action={action}"
        last: list[Any] = []

        def body(txn: Any) -> None:
            last.append(txn)  # run_in_transaction retries with a fresh txn; the last one commits
            fn(txn)

        self._db.run_in_transaction(body, transaction_tag=tag)
        with self._list_lock:
            rec = CommittedTxn(len(self._committed), action, tag, last[-1].committed, writes)
            self._committed.append(rec)
        return rec


# --------------------------------------------------------------------------------------------
# one call for the CLI and the dashboard


@dataclass
class EmulatorWorld:
    """A running emulator with a provisioned bank database; stop() ends the emulator."""

    process: EmulatorProcess
    project: str
    instance: str
    database: str
    dialect: Dialect
    stream: str
    created_at: dt.datetime  # client clock right after the change stream DDL finished

    @property
    def host(self) -> str:
        return self.process.host

    def workload(self, **kw: Any) -> Workload:
        return Workload(self.host, self.project, self.instance, self.database, self.dialect, **kw)

    def stop(self) -> None:
        self.process.stop()

    def __enter__(self) -> EmulatorWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_emulator_world(
    *,
    project: str = DEFAULT_PROJECT,
    instance: str = DEFAULT_INSTANCE,
    database: str = DEFAULT_DATABASE,
    dialect: Dialect = "googlesql",
    stream: str = DEFAULT_STREAM,
    churn_seconds: int | None = 2,
    binary: str | os.PathLike[str] | None = None,
    extra_args: Sequence[str] = (),
    listen: str = "127.0.0.1",
) -> EmulatorWorld:
    """Start an emulator (listening on ``listen``) and provision the bank database; the
    emulator is stopped on failure."""
    proc = EmulatorProcess(binary, churn_seconds, extra_args=extra_args, listen=listen).start()
    try:
        provision(proc.host, project, instance, database, dialect, stream)
        created = dt.datetime.now(dt.UTC)
    except BaseException:
        proc.stop()
        raise
    return EmulatorWorld(proc, project, instance, database, dialect, stream, created)


# --------------------------------------------------------------------------------------------
# raw change stream query (diagnostics and tests; the pull path lives elsewhere)


# --------------------------------------------------------------------------------------------
# a live stream: one emulator and its workload kept running while the dashboard refreshes


LIVE_LAG_S = 1.0  # a refresh reads up to a second ago: every commit before it is visible


class LiveEmulator:
    """An emulator world with its workload running until :meth:`stop`, for a live stream.

    What ``app.live.LiveRunner`` uses of a live source: ``host``, ``start`` (the earliest
    readable time, UTC ns), ``now``, ``end`` (what a refresh may read up to: now less
    :data:`LIVE_LAG_S`, whole microseconds), ``finished`` and ``stop()`` (the workload, then the
    emulator and its process group).
    """

    def __init__(self, world: EmulatorWorld, workload: Workload) -> None:
        self.world, self.workload = world, workload
        self.stream = world.stream
        self.start = int(world.created_at.timestamp() * 1e6) * 1000

    @property
    def host(self) -> str:
        return self.world.host

    @property
    def address(self) -> str:
        return self.world.host

    @property
    def now(self) -> int:
        return time.time_ns()

    @property
    def end(self) -> int:
        return (self.now - int(LIVE_LAG_S * 1e9)) // 1000 * 1000

    @property
    def finished(self) -> bool:
        """The emulator is gone (stopped, or it died)."""
        return not self.world.process.running

    @property
    def pid(self) -> int | None:
        return self.world.process.pid

    def stop(self) -> None:
        try:
            self.workload.stop()
        finally:
            self.world.stop()


def start_live_emulator(
    *,
    dialect: Dialect = "googlesql",
    churn_seconds: int = 5,
    rate_per_s: float = 5.0,
    seed: int = 7,
    listen: str = "127.0.0.1",
) -> LiveEmulator:
    """Start an emulator (partitions split and merge every ``churn_seconds`` to twice that;
    listening on ``listen``), the bank database and its workload; everything is stopped again
    when a step fails."""
    world = start_emulator_world(dialect=dialect, churn_seconds=churn_seconds, listen=listen)
    try:
        workload = world.workload(seed=seed, rate_per_s=rate_per_s).start()
    except BaseException:
        world.stop()
        raise
    return LiveEmulator(world, workload)
