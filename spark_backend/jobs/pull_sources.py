"""Where a pull reads from: one small interface, :class:`PullSource`, whose ``check()`` refuses
bad values before anything starts and whose ``open(bind)`` starts what the source needs, gives
the target to read (:class:`OpenSource`) and stops what it started afterwards. Three sources:
the demo world (:class:`DemoSource`), a local Cloud Spanner emulator (:class:`EmulatorSource`)
and a Spanner database, Cloud Spanner or any endpoint on ``$SPANNER_EMULATOR_HOST``
(:class:`SpannerSource`). The pull itself only reads the target; ``source_named`` makes a
source from the command line's or the dashboard form's values.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from spark_backend.model import checks, config
from spark_backend.model.enums import Source, values
from spark_backend.model.errors import BadInput, SourceError
from spark_backend.spanner.connect import SpannerTarget


@dataclass
class OpenSource:
    """A source opened for a pull: the database to read, the change stream's name there, the
    range it holds when it knows one (UTC ns), and how the cache names where it came from."""

    target: SpannerTarget
    source_stream: str
    default_start_ns: int | None
    default_end_ns: int | None
    location: str


class PullSource(Protocol):
    kind: ClassVar[str]    # a ``model.enums.Source``: what the cache records as the origin
    dialect: str | None    # None: the database's own (asked); given: overrides
    stream: str | None     # the change stream's name at the source (None: the source's own)

    def check(self) -> None:
        """Raise ``BadInput`` naming the first value that is not accepted."""
        ...

    def open(self, bind: str) -> AbstractContextManager[OpenSource]:
        """Start what the source needs (a server, an emulator), listening on ``bind`` (the
        address of this machine the executors reach), and stop it when the context ends."""
        ...


@dataclass(frozen=True)
class DemoSource:
    """The simulated world, served by a Spanner-protocol server of this process (or by the
    dashboard's, at ``host``)."""

    kind: ClassVar[str] = Source.DEMO
    seed: int = 7
    scale: float = 1.0
    dialect: str | None = None
    stream: str | None = None
    faults: dict[str, Any] = field(default_factory=dict, hash=False)
    host: str | None = None  # an already running demo server (the dashboard's)

    def check(self) -> None:
        checks.number(self.scale, "--demo-scale", *checks.DEMO_SCALE, field="demo_scale")
        checks.integer(self.seed, "--demo-seed", *checks.DEMO_SEED, field="demo_seed")

    @contextlib.contextmanager
    def open(self, bind: str) -> Iterator[OpenSource]:
        from spark_backend.demo.server import DemoServer
        from spark_backend.demo.world import DEMO_STREAM, build_world

        dialect = self.dialect or "googlesql"
        server = None
        if self.host:  # the dashboard's server: only the world's bounds are needed
            world, host = demo_world(self.seed, self.scale), self.host
        elif not self.faults and self.scale <= 1.0:
            # Kept for the process: the next pull of the same world skips building and
            # encoding it again (the dashboard pulls again and again).
            world, host = _warm_demo(self.seed, self.scale, dialect, bind)
        else:
            world = build_world(seed=self.seed, scale=self.scale)
            server = DemoServer(world, dialect=dialect, host=bind, **self.faults)
            host = server.start()
        try:
            target = SpannerTarget("demo-project", "demo-instance", "demo-db", self.dialect, host)
            yield OpenSource(target, self.stream or DEMO_STREAM, world.start, world.end,
                             f"demo world seed={self.seed} scale={self.scale}")
        finally:
            if server is not None:
                server.stop()


@dataclass(frozen=True)
class EmulatorSource:
    """A local Cloud Spanner emulator: the dashboard's, running at ``host`` (read, left
    running), or one started for the pull with a workload (``seed``) for ``seconds``."""

    kind: ClassVar[str] = Source.EMULATOR
    project: str | None = None
    instance: str | None = None
    database: str | None = None
    dialect: str | None = None
    stream: str | None = None
    host: str | None = None
    seconds: float = 20.0
    seed: int = 7

    def check(self) -> None:
        checks.number(self.seconds, "--emulator-seconds", *checks.EMULATOR_SECONDS, "seconds",
                      field="emulator_seconds")
        checks.integer(self.seed, "--demo-seed", *checks.DEMO_SEED, field="demo_seed")

    @contextlib.contextmanager
    def open(self, bind: str) -> Iterator[OpenSource]:
        from spark_backend.demo import emulator

        if self.host:
            target = SpannerTarget(self.project or emulator.DEFAULT_PROJECT,
                                   self.instance or emulator.DEFAULT_INSTANCE,
                                   self.database or emulator.DEFAULT_DATABASE,
                                   self.dialect, self.host)
            yield OpenSource(target, self.stream or emulator.DEFAULT_STREAM, None, None,
                             f"local emulator at {self.host}: {target.path}")
            return
        try:
            world = emulator.start_emulator_world(dialect=self.dialect or "googlesql",
                                                  churn_seconds=2, listen=bind)
        except emulator.EmulatorNotInstalled as e:
            raise SourceError(str(e)) from e
        except (emulator.EmulatorStartError, emulator.EmulatorProvisionError) as e:
            raise SourceError(f"The Cloud Spanner emulator did not start: {e}") from e
        try:
            with world.workload(seed=self.seed):
                target = SpannerTarget(world.project, world.instance, world.database,
                                       self.dialect, world.host)
                start = int(world.created_at.timestamp() * 1e9)
                end = start + int(self.seconds * 1e9)
                yield OpenSource(target, world.stream, start, end,
                                 f"local emulator {world.project}/{world.instance}/"
                                 f"{world.database}")
        finally:
            world.stop()


@dataclass(frozen=True)
class SpannerSource:
    """A Spanner database: Cloud Spanner (Application Default Credentials), or the endpoint
    ``$SPANNER_EMULATOR_HOST`` names, resolved when it opens (Spark's workers do not see
    environment changes made after they started)."""

    kind: ClassVar[str] = Source.SPANNER
    project: str | None = None
    instance: str | None = None
    database: str | None = None
    stream: str | None = None
    dialect: str | None = None

    def check(self) -> None:
        missing = [n for n in ("project", "instance", "database", "stream")
                   if not getattr(self, n)]
        if missing:
            flags = ", ".join(f"--{m}" for m in missing)
            raise BadInput(f"The spanner source needs {flags}.", field=missing[0])

    @contextlib.contextmanager
    def open(self, bind: str) -> Iterator[OpenSource]:
        endpoint = os.environ.get(config.EMULATOR_HOST_ENVVAR) or None
        if endpoint and bind != "127.0.0.1":
            from spark_backend.spark.session import names_loopback

            if names_loopback(endpoint):  # the executors would dial their own loopback
                raise BadInput(
                    f"{config.EMULATOR_HOST_ENVVAR}={endpoint} names this machine's loopback, "
                    "which Spark's executors on other machines cannot reach; give an address "
                    f"of this machine that they reach (e.g. {bind}:PORT, with the emulator "
                    "listening there) or use local Spark.")
        target = SpannerTarget(self.project, self.instance, self.database, self.dialect,
                               endpoint)
        yield OpenSource(target, self.stream, None, None, target.path)


def source_named(kind: str, *, project: str | None = None, instance: str | None = None,
                 database: str | None = None, stream: str | None = None,
                 dialect: str | None = None, seed: int | None = None,
                 scale: float | None = None, seconds: float | None = None,
                 host: str | None = None) -> PullSource:
    """The source of kind ``kind`` (a ``model.enums.Source``) with the values a user gave (the
    command line's flags, the dashboard's form); each kind takes the values it uses, and a
    value not given (None) is the source's default."""
    kinds = {Source.DEMO: DemoSource, Source.EMULATOR: EmulatorSource,
             Source.SPANNER: SpannerSource}
    if kind not in kinds:
        raise BadInput(f"Unknown source {kind!r}; accepted sources are "
                       f"{', '.join(values(Source))}.", field="source")
    given = dict(project=project, instance=instance, database=database, stream=stream,
                 dialect=dialect, seed=seed, scale=scale, seconds=seconds, host=host)
    cls = kinds[kind]
    return cls(**{f.name: given[f.name] for f in dataclasses.fields(cls)
                  if given.get(f.name) is not None})


_demo_servers: dict[tuple, tuple[Any, Any]] = {}


@functools.lru_cache(maxsize=2)
def demo_world(seed: int, scale: float) -> Any:
    """The demo world, built once per process (a second each time otherwise: the dashboard's
    first minute pulls it slice by slice); the dashboard's demo servers serve this one."""
    from spark_backend.demo.world import build_world

    return build_world(seed=seed, scale=scale)


def _warm_demo(seed: int, scale: float, dialect: str, bind: str) -> tuple[Any, str]:
    """A demo server for this process, one per (seed, scale, dialect, address), remembering
    every encoded query; its threads stop when the process exits."""

    from spark_backend.demo.server import DemoServer

    key = (seed, scale, dialect, bind)
    if key not in _demo_servers:
        world = demo_world(seed, scale)
        server = DemoServer(world, dialect=dialect, host=bind,
                            remembered_queries=2 * len(world.partitions) + 8)
        server.start()
        atexit.register(server.stop)
        _demo_servers[key] = (world, server)
    world, server = _demo_servers[key]
    return world, server.address
