"""Cached resources (the cache connection, the pull lock) and cached query results.

Every cached query takes ``(path, version, stream, ...)``: ``version`` is the cache's own
counter, bumped by every ingest and pull, so a pull invalidates what the pages show.
Each query runs on its own cursor: Streamlit runs sessions in threads and a DuckDB connection
must not be shared across threads.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import pandas as pd
import streamlit as st

from spark_backend import analysis
from spark_backend.analysis import dag_layout
from spark_backend.analysis import stalls as stalls_mod
from spark_backend.cache.store import Cache
from spark_backend.model.config import CACHE_ENVVAR, DEFAULT_CACHE

from . import queries

QUERY_CACHE_ENTRIES = 256


def default_cache_path() -> str:
    return os.environ.get(CACHE_ENVVAR) or str(DEFAULT_CACHE)


@st.cache_resource(show_spinner=False)
def open_cache(path: str) -> Cache:
    """The read-write cache for the whole server process (created when missing)."""
    return Cache(path)


@st.cache_resource(show_spinner=False)
def pull_lock(path: str) -> threading.Lock:
    """One pull at a time per cache file, whichever session asks."""
    return threading.Lock()


@contextmanager
def cursor(path: str) -> Iterator[duckdb.DuckDBPyConnection]:
    con = open_cache(path).cursor()
    try:
        yield con
    finally:
        con.close()


def version(path: str) -> int:
    with cursor(path) as con:
        row = con.execute("SELECT value FROM meta WHERE key = 'version'").fetchone()
    return int(row[0]) if row else 0


def streams(path: str) -> list[str]:
    with cursor(path) as con:
        return [r[0] for r in con.execute("SELECT stream FROM streams ORDER BY stream").fetchall()]


def _run(path: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    with cursor(path) as con:
        return fn(con, *args, **kwargs)


# --- analysis, cached by cache version -------------------------------------------------------

_cached = st.cache_data(show_spinner=False, max_entries=QUERY_CACHE_ENTRIES)


@_cached
def summary(path: str, ver: int, stream: str) -> dict:
    return _run(path, analysis.summary, stream)


@_cached
def partitions(path: str, ver: int, stream: str, stall_after_s: float) -> pd.DataFrame:
    return _run(path, analysis.partitions, stream, stall_after_s)


@_cached
def edges(path: str, ver: int, stream: str) -> pd.DataFrame:
    return _run(path, analysis.edges, stream)


@_cached
def dag(path: str, ver: int, stream: str, stall_s: float) -> dict[str, Any]:
    """The DAG page's drawing inputs, laid out once per cache version: ``nodes``
    (``dag_layout.layout`` of the partitions), ``edges``, ``segments``
    (``dag_layout.edge_segments``) and the ``dot`` and ``svg`` exports."""
    nodes = dag_layout.layout(partitions(path, ver, stream, stall_s))
    found = edges(path, ver, stream)
    segments = dag_layout.edge_segments(nodes, found)
    return {"nodes": nodes, "edges": found, "segments": segments,
            "dot": dag_layout.to_dot(nodes, found, stream),
            "svg": dag_layout.to_svg(nodes, segments)}


@_cached
def partition_detail(path: str, ver: int, stream: str, token: str) -> dict:
    return _run(path, analysis.partition_detail, stream, token)


@_cached
def holding_back(path: str, ver: int, stream: str) -> dict | None:
    return _run(path, analysis.holding_back, stream)


@_cached
def low_watermark(path: str, ver: int, stream: str) -> tuple[int | None, str | None]:
    return _run(path, analysis.low_watermark, stream)


@_cached
def heartbeat_gaps(path: str, ver: int, stream: str, k: float) -> pd.DataFrame:
    return _run(path, analysis.heartbeat_gaps, stream, k)


@_cached
def anomalies(path: str, ver: int, stream: str, stall_after_s: float) -> list[dict]:
    return _run(path, analysis.anomalies, stream, stall_after_s)


@_cached
def transactions(path: str, ver: int, stream: str, filters: queries.TxnFilter,
                 limit: int) -> pd.DataFrame:
    return _run(path, analysis.transactions, stream, table=filters.table, tag=filters.tag,
                mod_type=filters.mod_type, start_ns=filters.start_ns, end_ns=filters.end_ns,
                limit=limit)


@_cached
def transaction_records(path: str, ver: int, stream: str, txid: str) -> pd.DataFrame:
    return _run(path, analysis.transaction_records, stream, txid)


@_cached
def history(path: str, ver: int, stream: str, table: str, key: str | None,
            limit: int) -> pd.DataFrame:
    return _run(path, analysis.history, stream, table, key, limit)


# --- the dashboard's own drill-downs ---------------------------------------------------------


@_cached
def choices(path: str, ver: int, stream: str) -> dict[str, list[str]]:
    return _run(path, queries.choices, stream)


@_cached
def cached_streams(path: str, ver: int) -> pd.DataFrame:
    return _run(path, queries.cached_streams)


@_cached
def pulls(path: str, ver: int, stream: str | None) -> pd.DataFrame:
    return _run(path, queries.pulls, stream)


@_cached
def watermark_replay(path: str, ver: int, stream: str, points: int,
                     start_ns: int | None = None, end_ns: int | None = None) -> pd.DataFrame:
    return _run(path, stalls_mod.watermark_replay, stream, points, start_ns, end_ns)


@_cached
def stalls(path: str, ver: int, stream: str, threshold_s: float, start_ns: int | None = None,
           end_ns: int | None = None) -> list[dict]:
    """The stalls of the range, costliest first (see ``analysis.stalls``)."""
    replay = watermark_replay(path, ver, stream, stalls_mod.DEFAULT_POINTS, start_ns, end_ns)
    return _run(path, stalls_mod.stalls, stream, threshold_s, replay)


@_cached
def current_state(path: str, ver: int, stream: str, start_ns: int | None = None,
                  end_ns: int | None = None) -> dict | None:
    replay = watermark_replay(path, ver, stream, stalls_mod.DEFAULT_POINTS, start_ns, end_ns)
    return _run(path, stalls_mod.current_state, stream, replay)


@_cached
def txn_buckets(path: str, ver: int, stream: str, filters: queries.TxnFilter,
                buckets: int) -> pd.DataFrame:
    return _run(path, queries.txn_buckets, stream, filters, buckets)


@_cached
def txn_density(path: str, ver: int, stream: str, filters: queries.TxnFilter,
                buckets: int) -> pd.DataFrame:
    return _run(path, queries.txn_density, stream, filters, buckets)


@_cached
def record_detail(path: str, ver: int, stream: str, record_key: str) -> pd.DataFrame:
    return _run(path, queries.record_detail, stream, record_key)


@_cached
def key_columns(path: str, ver: int, stream: str) -> dict[str, list[str]]:
    return _run(path, queries.key_columns, stream)


@_cached
def txn_points(path: str, ver: int, stream: str, filters: queries.TxnFilter,
               limit: int) -> pd.DataFrame:
    return _run(path, queries.txn_points, stream, filters, limit)


@_cached
def completeness(path: str, ver: int, stream: str, filters: queries.TxnFilter) -> dict:
    return _run(path, queries.completeness, stream, filters)


@_cached
def records_page(path: str, ver: int, stream: str, filters: queries.RecordFilter,
                 after: tuple | None, size: int) -> pd.DataFrame:
    return _run(path, queries.records_page, stream, filters, after, size)


@_cached
def records_count(path: str, ver: int, stream: str, filters: queries.RecordFilter) -> int:
    return _run(path, queries.records_count, stream, filters)


@_cached
def sample_keys(path: str, ver: int, stream: str, table: str) -> list[str]:
    return _run(path, queries.sample_keys, stream, table)


@_cached
def schema(path: str, ver: int) -> pd.DataFrame:
    return _run(path, queries.schema)


def html_report(path: str, stream: str, stall_s: float, start_ns: int | None,
                end_ns: int | None) -> bytes:
    """The self-contained HTML report (``analysis.html_report``), made when asked for."""
    from spark_backend.analysis.html_report import build_html

    return _run(path, build_html, stream, stall_s, start_ns, end_ns).encode()


def export(path: str, stream: str, filters: queries.RecordFilter, fmt: str) -> bytes:
    """Not cached: big, and generated only when the user asks for the file."""
    return _run(path, queries.export_records, stream, filters, fmt)


# --- what a pull needs, started once per server process and only when a pull runs ------------


@st.cache_resource(show_spinner=False)
def warm_spark() -> bool:
    """Start Spark and its Python workers once (the first pull then skips seconds of start-up).

    Called lazily, right before a pull (and by the empty cache's bootstrap), never on a render.
    """
    from spark_backend.jobs.pull import start_spark

    start_spark()
    return True


def _stop_server(server: Any) -> None:
    server.stop()


@st.cache_resource(show_spinner=False, on_release=_stop_server)
def demo_server(seed: int, scale: float, dialect: str, host: str) -> Any:
    """One running demo server per (seed, scale, dialect, address) for the whole server
    process; ``host``: the address Spark's executors reach this machine at
    (``jobs.pull.serving_address``)."""
    from spark_backend.demo.server import DemoServer
    from spark_backend.jobs.pull import demo_world

    server = DemoServer(demo_world(seed, scale), dialect, host=host)
    server.start()
    return server


def prepare_pull(form: Any) -> str | None:
    """Ready a pull (``pulling.pull``'s ``prepare``): Spark first (forking next to gRPC
    threads is fragile), then for source demo the shared demo server; returns its host."""
    from spark_backend.jobs.pull import serving_address
    from spark_backend.jobs.pull_sources import DemoSource

    warm_spark()
    if form.source != "demo":
        return None
    defaults = DemoSource()
    return demo_server(defaults.seed, defaults.scale,
                       form.dialect or "googlesql", serving_address()).address


# --- live streams ------------------------------------------------------------------------------


@st.cache_resource(show_spinner=False)
def live_runners() -> dict[str, Any]:
    """The live streams of this server process: stream name -> ``live.LiveRunner``."""
    return {}


def start_live_demo(path: str) -> Any:
    """Start a live demo world (its own server, Spark warmed first) pulled into ``path`` on a
    timer; returns its runner."""
    from spark_backend.demo.live import build_live_world
    from spark_backend.demo.server import DemoServer
    from spark_backend.jobs.pull import serving_address

    from . import live, pulling

    warm_spark()  # before any gRPC thread exists: forking next to them is fragile
    world = build_live_world()
    server = DemoServer(world, "googlesql", host=serving_address())
    server.start()
    cache, lock = open_cache(path), pull_lock(path)

    def pull(form: Any, progress: Any) -> Any:
        with lock:
            return pulling.pull(cache, form, progress, prepare=lambda f: server.address)

    runner = live.LiveRunner(path, live.new_stream_name(world.now), world, server, pull)
    live_runners()[runner.stream] = runner
    runner.start()
    return runner


def start_live_emulator(path: str, churn_seconds: int = 5) -> Any:
    """Start a local Cloud Spanner emulator (partitions split and merge every
    ``churn_seconds`` to twice that) with its bank workload, pulled into ``path`` on a timer through
    that same emulator; returns its runner. Errors come back as one sentence
    (``InspectorError``)."""
    from spark_backend.demo import emulator
    from spark_backend.jobs.pull import serving_address
    from spark_backend.model.errors import SourceError

    from . import live, pulling

    warm_spark()  # before any gRPC thread exists: forking next to them is fragile
    try:
        source = emulator.start_live_emulator(churn_seconds=churn_seconds,
                                              listen=serving_address())
    except emulator.EmulatorNotInstalled as e:
        raise SourceError(str(e)) from e
    except Exception as e:  # the emulator did not start, or provisioning failed
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise SourceError(f"The Cloud Spanner emulator did not start: {first}") from e
    cache, lock = open_cache(path), pull_lock(path)

    def pull(form: Any, progress: Any) -> Any:
        with lock:
            return pulling.pull(cache, form, progress, prepare=lambda f: source.host)

    runner = live.LiveRunner(path, live.new_stream_name(source.now, live.LIVE_EMULATOR_PREFIX),
                             source, source, pull, source="emulator", heartbeat_ms=1000)
    live_runners()[runner.stream] = runner
    runner.start()
    return runner


def live_runner(stream: str | None) -> Any:
    return live_runners().get(stream) if stream else None


# --- the first minute: the demo world into an empty cache, slice by slice -----------------------


@st.cache_resource(show_spinner=False)
def _bootstraps() -> dict[str, Any]:
    return {}


def bootstrap_of(path: str) -> Any:
    """The bootstrap of this cache file in this server process (``app.bootstrap``), if any."""
    return _bootstraps().get(path)


def start_bootstrap(path: str) -> Any:
    """Start (once per cache file) pulling the demo world into it slice by slice. Returns at
    once: Spark and the demo server start on the bootstrap's own thread."""
    from spark_backend.demo.world import WORLD_DURATION, WORLD_START

    from . import bootstrap

    boots = _bootstraps()
    if path not in boots:
        servers: list[Any] = []

        def prepare() -> str:
            """The demo server's host, as soon as it can start: Spark starts on its own thread
            while the world (pure Python) is built; the server's gRPC threads start once the
            JVM is launched (forking next to them is fragile). The first slice is read in this
            process while Spark finishes starting; later slices wait for Spark."""

            from spark_backend.demo.server import DemoServer
            from spark_backend.jobs.pull import (
                demo_world,
                planned_serving_address,
                serving_address,
                start_spark_early,
            )
            from spark_backend.jobs.pull_sources import DemoSource

            defaults = DemoSource()
            # where the executors reach this machine (a cluster's are on other machines),
            # known before Spark has started (YARN: Spark's choice, known once it has)
            bind = planned_serving_address()
            spark, jvm_launched = start_spark_early()
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bootstrap")
            # the world the slices' pulls use too (built once per process)
            world = pool.submit(demo_world, defaults.seed, defaults.scale)
            pool.shutdown(wait=False)
            while not jvm_launched.wait(0.2):
                if spark.done():
                    spark.result()  # Spark failed to start: say so on the page
                    break
            server = DemoServer(world.result(), "googlesql",
                                host=bind or serving_address(spark.result()))
            servers.append(server)
            return server.start()

        boots[path] = bootstrap.make(path, open_cache(path), pull_lock(path), prepare,
                                     (WORLD_START, WORLD_START + WORLD_DURATION))
        boots[path].servers = servers
        boots[path].start()
    return boots[path]
