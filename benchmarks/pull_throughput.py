"""Pull throughput: the project's Spark pull against the sequential client and the critical-path
bound, on worlds of the demo simulator served with a simulated latency per response.

Each world (``--records`` rows: data change + heartbeats + child partitions) is served by its own
process (the Spanner-protocol demo server): before the clock starts it builds the world and
encodes ahead every response the project's queries will ask for, and it reports its CPU use, so
the server is measured, not assumed, not to be the bottleneck. In the same run:

- baseline: google-cloud-spanner as its docs show it, one partition at a time (the query
  workflow, merges read once after their parents), full decode; it reads for at most
  ``--baseline-seconds`` and reports its rate;
- project: ``run_pull`` (Spark, results streamed back through Spark into a fresh DuckDB cache),
  ``--repeat`` times with Spark warm, on ``local[*]`` and, with ``--cluster``, on a standalone
  master with two workers started from the installed pyspark;
- bound: from the world's ground truth, the longest chain of responses that must be read one
  after another (the initial query, then each partition after all of its parents) times the
  latency. No reader of this server can be faster.

The server also traces every query and when gRPC took each response (``ReadTrace``), and the
median pull's real critical path is printed against that bound: the reads along it, what they
take at the pace, their sends' waits for the reader, and the waits between a parent's end and
its child's query (``critical_path``).

Peak memory is sampled every 0.2 s over the pulling process and all its children (the JVM and
Spark's Python workers), as the sum of their resident sets (pages shared by forked workers counted
in each) and as their proportional set size (PSS: shared pages divided among their sharers, the
memory the tree really takes). ``--last-minutes M ...`` also pulls only each world's last M
minutes from the same server (the same stream at the same density, fewer records): how the
peak grows with the records of one stream. ``--demo`` also times the embedded demo world
(28k rows, its own in-process server, no latency) with Spark warm.

    python benchmarks/pull_throughput.py --records 100000 1000000 --latency-ms 20 2 --cluster
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RECORDS_PER_SCALE = 28_000  # rows (data change + heartbeats + child partitions) at scale 1.0
WORLD_MINUTES = 60  # every world spans an hour (``spark_backend.demo.world.WORLD_DURATION``)
HEARTBEAT_MS = 10_000


def _proc_table() -> tuple[dict[int, list[int]], dict[int, tuple[int, float, float]]]:
    """Every process's children, and its (RSS kB, own CPU seconds, CPU seconds of the
    children it reaped), from /proc."""
    children: dict[int, list[int]] = {}
    info: dict[int, tuple[int, float, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            rss = 0
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                        break
            children.setdefault(int(fields[1]), []).append(int(entry))
            info[int(entry)] = (rss, (int(fields[11]) + int(fields[12])) / tick,
                                (int(fields[13]) + int(fields[14])) / tick)
        except (OSError, IndexError, ValueError):
            continue
    return children, info


def tree_usage(pid: int, table=None) -> tuple[int, float]:
    """(RSS in kB, CPU seconds) of a process and all its descendants, from /proc (or from
    ``table``, a ``_proc_table()`` already read)."""
    children, info = table or _proc_table()
    rss = cpu = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        r, c, _ = info.get(p, (0, 0.0, 0.0))
        rss, cpu = rss + r, cpu + c
        todo.extend(children.get(p, []))
    return rss, cpu


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _tree_kinds(pid: int, children: dict[int, list[int]]) -> Iterator[tuple[int, str]]:
    """Each process of the tree under ``pid`` with its kind: the pulling process (driver), the
    JVM, Spark's Python daemons and the Python workers they fork, or other."""
    todo = [(pid, None)]
    while todo:
        p, parent_kind = todo.pop()
        if p == pid:
            kind = "driver"
        elif parent_kind in ("daemon", "python worker"):
            kind = "python worker"
        else:
            cmd = _cmdline(p)
            kind = ("JVM" if "java" in cmd.split(" ", 1)[0] else
                    "daemon" if "pyspark.daemon" in cmd else "other")
        yield p, kind
        todo.extend((c, kind) for c in children.get(p, []))


def tree_pss_by_kind(pid: int, table=None) -> dict[str, int]:
    """Proportional set size (kB) of a process and its descendants (shared pages of forked
    Python workers and libraries counted once in all, unlike a sum of RSS), by kind
    (``_tree_kinds``); ``table`` as for ``tree_usage``."""
    children, _ = table or _proc_table()
    kinds: dict[str, int] = {}
    for p, kind in _tree_kinds(pid, children):
        kinds[kind] = kinds.get(kind, 0) + _pss_kb(p)
    return kinds


def tree_cpu_by_kind(pid: int) -> dict[str, float]:
    """CPU seconds so far of a process and its descendants, by kind (``_tree_kinds``); the
    Python workers that Spark's daemon forked and reaped count as workers (their CPU is the
    daemon's children's). Two samples around a pull give its CPU."""
    children, info = _proc_table()
    kinds: dict[str, float] = {}
    for p, kind in _tree_kinds(pid, children):
        _, own, reaped = info.get(p, (0, 0.0, 0.0))
        kinds[kind] = kinds.get(kind, 0.0) + own
        if kind == "daemon":
            kinds["python worker"] = kinds.get("python worker", 0.0) + reaped
    return kinds


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far, all its CPUs (/proc/stat: idle
    and iowait are idle, steal is neither)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]
    busy = sum(ticks[:3]) + sum(ticks[5:7])
    return busy / tick, idle / tick


class PeakMemory:
    """Peak RSS sum and peak PSS of a process tree, sampled every 0.2 s."""

    def __init__(self, pid: int | None = None, trace: str | None = None):
        self.pid = pid or os.getpid()
        self.trace = open(trace, "w") if trace else None  # closed in __exit__
        self.began = time.monotonic()
        self.peak_kb = 0
        self.peak_pss_kb = 0
        self.peak_kinds: dict[str, int] = {}
        self.own_cpu = 0.0  # CPU seconds of this sampler's thread (it runs in the driver)
        # seconds during which the machine's CPUs were saturated (idle under 5% of them)
        self.saturated_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def mark(self, progress) -> None:
        """A pull's progress message in the trace, to place the samples in its phases."""
        phase = "".join(c for c in progress.message if not c.isdigit())
        if self.trace and phase != getattr(self, "_last", None):
            self._last = phase
            self.trace.write(json.dumps({"s": round(time.monotonic() - self.began, 1),
                                         "phase": progress.message[:60]}) + "\n")

    def _run(self):
        cpus = os.cpu_count() or 1
        then, idle0 = time.monotonic(), machine_cpu()[1]
        while not self._stop.is_set():
            now, idle = time.monotonic(), machine_cpu()[1]
            if now > then and idle - idle0 < 0.05 * cpus * (now - then):
                self.saturated_s += now - then
            then, idle0 = now, idle
            table = _proc_table()  # one walk of /proc per sample serves both
            self.peak_kb = max(self.peak_kb, tree_usage(self.pid, table)[0])
            kinds = tree_pss_by_kind(self.pid, table)
            total = sum(kinds.values())
            if total > self.peak_pss_kb:
                self.peak_pss_kb, self.peak_kinds = total, kinds
            if self.trace:
                self.trace.write(json.dumps({"s": round(time.monotonic() - self.began, 1),
                                             **{k: v // 1024 for k, v in kinds.items()}}) + "\n")
            self.own_cpu = time.thread_time()
            self._stop.wait(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, tree_usage(self.pid)[0])
        if self.trace:
            self.trace.close()


# --- the server process -------------------------------------------------------------------------


def _query_key(sql: str, params: dict) -> bytes:
    """The key the demo server files a query's responses under (its own hashing)."""
    import hashlib

    from spark_backend.spanner.reader import params_struct

    h = hashlib.blake2b(digest_size=8)
    h.update(sql.encode())
    h.update(params_struct(params).SerializeToString(deterministic=True))
    return h.digest()


class ReadTrace:
    """What the server saw of each pull, to tell its real critical path against the bound.

    A pull begins with its initial query (token None, not a retry). For each query the trace
    keeps ``[token, queried, last response taken, responses, seconds waiting on the send]``:
    a response is *taken* when gRPC asks the handler for the next one, i.e. once its send
    completed, and the send waits while the stream's flow-control window is full, that is
    while the reader has fallen behind. Handler threads only append and update their own
    query's list; ``take`` hands the pulls over and starts afresh."""

    def __init__(self, parents: dict[str, tuple[str, ...]], latency_s: float,
                 clock=time.monotonic):
        self.parents, self.latency_s, self.clock = parents, latency_s, clock
        self.pulls: list[list[list]] = []

    def traced(self, token: str | None, retry: bool, responses: Iterator) -> Iterator:
        query = [token, self.clock(), None, 0, 0.0]
        if (token is None and not retry) or not self.pulls:
            self.pulls.append([])
        self.pulls[-1].append(query)
        for response in responses:
            handed = self.clock()
            yield response
            taken = self.clock()
            query[2], query[3], query[4] = taken, query[3] + 1, query[4] + taken - handed

    def take(self) -> list[dict]:
        pulls, self.pulls = self.pulls, []
        return [critical_path(queries, self.parents, self.latency_s) for queries in pulls]


def critical_path(queries: list[list], parents: dict[str, tuple[str, ...]],
                  latency_s: float) -> dict:
    """A pull's real critical path from its queries (``ReadTrace``): from the partition whose
    last response went out last, back through the parent (of those the pull read) whose last
    response went out last, to the initial query. Each step: its wait (the parent's last
    response -> the partition's first query), its read (first query -> last response), its
    responses and their time at the pace, and its sends' waits. The initial query's read plus
    every step's wait and read is the path's span: the initial query -> the last response."""
    first: dict[str | None, float] = {}
    done: dict[str | None, float] = {}
    stats: dict[str | None, list] = {}  # responses, queries, send s
    for token, queried, taken, responses, send_s in queries:
        first[token] = min(first.get(token, queried), queried)
        done[token] = max(done.get(token, queried), taken if taken is not None else queried)
        s = stats.setdefault(token, [0, 0, 0.0])
        s[0], s[1], s[2] = s[0] + responses, s[1] + 1, s[2] + send_s
    if None not in first:
        return {"steps": [], "span_s": 0.0}
    def read_parents(token: str) -> list[str]:
        return [p for p in parents.get(token, ()) if p in first]

    read = [t for t in first if t is not None]
    path: list[str] = []
    token = max(read, key=done.__getitem__) if read else None
    while token is not None:
        path.append(token)
        token = max(read_parents(token), key=done.__getitem__, default=None)
    path.reverse()
    steps = []
    for token in path:
        ready = max((done[p] for p in read_parents(token)), default=done[None])
        responses, nqueries, send_s = stats[token]
        steps.append({"token": token, "wait_s": first[token] - ready,
                      "read_s": done[token] - first[token], "responses": responses,
                      "pace_s": responses * latency_s, "queries": nqueries, "send_s": send_s})
    end = path[-1] if path else None
    return {"steps": steps, "span_s": done[end] - first[None],
            "initial_s": done[None] - first[None]}


def path_line(path: dict, latency_ms: float) -> str:
    """One pull's ``critical_path`` in words: where its time went against the bound's pace."""
    steps = path.get("steps") or []
    if not steps:
        return "the server saw no partition read"
    reads = sum(s["read_s"] for s in steps)
    pace = sum(s["pace_s"] for s in steps)
    waits = sum(s["wait_s"] for s in steps)
    send = sum(s["send_s"] for s in steps)
    behind = sorted(steps, key=lambda s: s["pace_s"] - s["read_s"])[:3]
    worst = ", ".join(f"{s['token'][:8]} {s['read_s']:.1f}s for {s['pace_s']:.1f}"
                      for s in behind if s["read_s"] > s["pace_s"] + 0.1)  # 100 ms: at pace
    return (f"its critical path at the server: {path['span_s']:.1f}s from the initial query "
            f"to the last response = initial query {path['initial_s']:.1f}s + {len(steps)} "
            f"partitions read in {reads:.1f}s ({sum(s['responses'] for s in steps):,} "
            f"responses, {pace:.1f}s at {latency_ms:g} ms; {send:.1f}s of sends waiting for "
            f"the reader) + waits before their queries {waits:.1f}s"
            + (f"; furthest behind the pace: {worst}" if worst else ""))


def _bench_server(world, dialect: str, latency_ms: float):
    """The demo server, answering a query that continues a partition (a later start, as a
    pull's task continues a partition the previous task stopped) from the responses encoded
    ahead for the partition's whole read: the first response is the rest of the one in which
    the first row at or after the new start begins, from that row on; the responses after it
    follow as encoded. So, as from Spanner, a query sends nothing before its start; only the
    first response differs from the responses encoded ahead. (A fresh encoding from the new
    start would group the rows into responses differently.) Encoding them again would cost
    the server more CPU than the pull it measures. Until stop 41 a continuation began at the
    last response that *starts* with a row: after a run of records chunked over many
    responses, up to 50 responses before the new start (the scale-1 world). In server traces of
    a 1M pull that was ~2 s of responses over its longest chain, dropped by the reader."""
    import bisect
    from array import array

    from spark_backend.demo.server import PRS, DemoServer, _Pace

    class BenchServer(DemoServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            # token -> (each row's time, the response each row begins in, its first value's
            # index there, the responses)
            self.ahead: dict[str, tuple[list[int], array, array, list]] = {}
            self.trace = ReadTrace({p.token: p.parents for p in world.partitions},
                                   latency_ms / 1000)

        def encode_ahead(self, token: str, start: int, rows: list[dict], qkey: bytes) -> int:
            from spark_backend.demo.server import _LazySeq

            seq = _LazySeq(self._responses(iter(rows), qkey))
            n = 0
            while seq.get(n) is not None:
                n += 1
            self._seq_cache[qkey] = seq
            if token is not None:
                responses = [seq.get(i) for i in range(n)]
                begins_in, begins_at, chunked = array("i"), array("i"), False
                for i, (prs, _) in enumerate(responses):
                    # one value per row (one column); after a chunked response the first
                    # value ends the row the one before began
                    for v in range(1 if chunked else 0, len(prs.values)):
                        begins_in.append(i)
                        begins_at.append(v)
                    chunked = prs.chunked_value
                if len(begins_in) != len(rows):
                    raise RuntimeError(f"{len(begins_in)} rows begin in the responses of "
                                       f"{token}, {len(rows)} expected")
                self.ahead[token] = ([_row_ts(r) for r in rows], begins_in, begins_at,
                                     responses)
            return n

        def ExecuteStreamingSql(self, request, context):
            try:
                q = self._parse(request)
            except Exception:
                q = None
            answer = None
            if (not request.resume_token and q is not None and q.token in self.ahead
                    and q.end == world.end and q.heartbeat_ms == HEARTBEAT_MS):
                times, begins_in, begins_at, responses = self.ahead[q.token]
                row = bisect.bisect_left(times, q.start)
                if 0 < row < len(times):
                    self._check_session(request.session, context)
                    answer = self._continued(responses, begins_in[row], begins_at[row],
                                             context)
            if answer is None:
                answer = super().ExecuteStreamingSql(request, context)
            if q is None:  # the dialect's query, a ping, a query it refuses
                return answer
            return self.trace.traced(q.token, bool(request.resume_token), answer)

        def _continued(self, responses, first: int, value: int, context):
            pace = _Pace(self.latency_ms / 1000.0)
            self._count("queries")
            for i in range(first, len(responses)):
                prs, n_rows = responses[i]
                if i == first:  # from the row at ``value`` on, with the result's row type
                    head = PRS()
                    head.CopyFrom(prs)
                    del head.values[:value]
                    head.metadata.row_type.CopyFrom(self._row_type)
                    prs, n_rows = head, n_rows - value  # each value cut ended a row
                if not self._paced(pace, n_rows, context):
                    return
                yield prs

    return BenchServer(world, dialect=dialect, latency_ms=latency_ms,
                       remembered_queries=2 * len(world.partitions) + 64, max_workers=256)


def _row_ts(record: dict) -> int:
    from spark_backend.model.timestamps import parse_ns

    body = next(iter(record.values()))
    return parse_ns(body.get("commit_timestamp") or body.get("timestamp")
                    or body.get("start_timestamp"))


def encode_partitions(server, world, dialect: str) -> dict[str | None, int]:
    """Encode ahead the responses of the initial query (token None) and of each partition's
    query from its start, as the project's pull asks them; the number of responses of each."""
    from spark_backend.spanner.reader import _params, query_text

    sql = query_text(dialect, world.stream)
    queries = [(None, world.start), *((p.token, p.start) for p in world.partitions)]
    responses: dict[str | None, int] = {}
    for token, start in queries:
        params, _ = _params(dialect, token, start, world.end, HEARTBEAT_MS)
        rows = list(world.query(token, start, world.end, HEARTBEAT_MS))
        responses[token] = server.encode_ahead(token, start, rows, _query_key(sql, params))
    return responses


def serve(scale: float, dialect: str, latency_ms: float) -> None:
    """Build the world, encode ahead the responses of every query of the project's pull,
    compute the critical-path bound, print one JSON line, serve until stdin closes; a line
    ``paths`` on stdin answers one JSON line: the critical path of each pull since the last
    ask (``ReadTrace``)."""
    import gc

    from spark_backend.demo.world import build_world

    # The world and the responses encoded ahead live as long as the server: Python's cyclic
    # collector only walks them again and again while they are built (a 1M-record world:
    # 61 full collections, up to 3.0 s each, 74 s in all), so it waits until they are built and then
    # leaves them out of its walks (``gc.freeze``).
    gc.disable()
    world = build_world(seed=7, scale=scale)
    server = _bench_server(world, dialect, latency_ms)
    responses = encode_partitions(server, world, dialect)
    # Longest chain: a partition starts once the initial query and all its parents are done.
    done: dict[str, int] = {}
    by_token = {p.token: p for p in world.partitions}

    def finish(token: str) -> int:
        if token not in done:
            parents = [t for t in by_token[token].parents if t]
            done[token] = (max((finish(t) for t in parents), default=responses[None])
                           + responses[token])
        return done[token]

    chain = max(finish(p.token) for p in world.partitions)
    gc.freeze()
    gc.enable()
    address = server.start()
    print(json.dumps({"address": address, "partitions": len(world.partitions),
                      "responses": sum(responses.values()), "chain_responses": chain,
                      "start": world.start, "end": world.end, "stream": world.stream}),
          flush=True)
    for line in sys.stdin:  # "paths": each pull's critical path since the last ask, one line
        if line.strip() == "paths":
            print(json.dumps(server.trace.take()), flush=True)
    server.stop()


# --- the two sides (each runs in its own process) ---------------------------------------------


def run_baseline(host: str, dialect: str, stream: str, start: int, end: int,
                 budget_s: float) -> dict:
    """Sequential, default decode: the plain client as its docs show it. Stops after
    ``budget_s`` seconds (its rate is steady)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect
    from google.cloud.spanner_v1 import param_types

    from spark_backend.model.timestamps import parse_ns, to_datetime

    client = spanner.Client(project="p", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": host})
    client._emulator_host = host
    db = client.instance("i").database("d", database_dialect=(
        DatabaseDialect.POSTGRESQL if dialect == "postgresql"
        else DatabaseDialect.GOOGLE_STANDARD_SQL))
    if dialect == "googlesql":
        sql = (f"SELECT ChangeRecord FROM READ_{stream}(start_timestamp => @s, end_timestamp => "
               "@e, partition_token => @t, heartbeat_milliseconds => @h)")
        types = {"s": param_types.TIMESTAMP, "e": param_types.TIMESTAMP,
                 "t": param_types.STRING, "h": param_types.INT64}
        names = ("s", "e", "t", "h")
    else:
        sql = f'SELECT * FROM "spanner"."read_json_{stream}"($1, $2, $3, $4, null)'
        types = {"p1": param_types.TIMESTAMP, "p2": param_types.TIMESTAMP,
                 "p3": param_types.STRING, "p4": param_types.INT64}
        names = ("p1", "p2", "p3", "p4")
    end_dt = to_datetime(end)

    def children_of(row):
        if dialect == "googlesql":
            record = row[0][0]
            out = []
            for cp in record[2] or []:
                for child in cp[2]:
                    out.append((child[0], list(child[1]), cp[0]))
            return out
        doc = row[0] if isinstance(row[0], dict) else json.loads(row[0])
        cp = doc.get("child_partitions_record")
        if not cp:
            return []
        return [(c["token"], c["parent_partition_tokens"], cp["start_timestamp"])
                for c in cp["child_partitions"]]

    rows = 0
    queue = [(None, to_datetime(start))]
    parents_done: dict[str, set] = {}
    scheduled: set = set()
    began = time.monotonic()
    while queue and time.monotonic() - began < budget_s:
        token, start_dt = queue.pop(0)
        params = dict(zip(names, (start_dt, end_dt, token, HEARTBEAT_MS), strict=True))
        with db.snapshot() as snap:
            for row in snap.execute_sql(sql, params=params, param_types=types):
                rows += 1
                if rows % 200 == 0 and time.monotonic() - began >= budget_s:
                    break
                for child, parents, child_start in children_of(row):
                    if child in scheduled:
                        continue
                    done = parents_done.setdefault(child, set())
                    if token is not None:
                        done.add(token)
                    if token is None or done >= set(p for p in parents if p):
                        scheduled.add(child)
                        cs = child_start if not isinstance(child_start, str) else to_datetime(
                            parse_ns(child_start))
                        queue.append((child, cs))
    return {"rows": rows, "seconds": time.monotonic() - began}


def run_project(host: str | None, dialect: str, stream: str, start: int, end: int,
                master: str | None, repeat: int, mem: PeakMemory | None = None) -> dict:
    """``repeat`` pulls with Spark warm; host None: the embedded demo world instead."""
    if host:
        os.environ["SPANNER_EMULATOR_HOST"] = host
    from spark_backend.cache.store import Cache
    from spark_backend.jobs.pull import PullRequest, run_pull
    from spark_backend.jobs.pull_sources import DemoSource, SpannerSource
    from spark_backend.model.config import PULL_ALLOCATOR, PULL_MEMORY_LIMIT, PULL_THREADS
    from spark_backend.spark.session import spark_session, warm_up

    warm_up(spark_session(master))  # one-time JVM and worker start-up: not part of throughput
    runs = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp, \
                Cache(Path(tmp) / "bench.duckdb", memory_limit=PULL_MEMORY_LIMIT,
                      threads=PULL_THREADS, allocator=PULL_ALLOCATOR) as cache:
            if host:
                request = PullRequest(SpannerSource("p", "i", "d", stream, dialect), start=start,
                                      end=end, spark_master=master, heartbeat_ms=HEARTBEAT_MS)
            else:
                request = PullRequest(DemoSource(dialect=dialect), spark_master=master)
            landing_memory = cache.memory_limit  # PULL_MEMORY_LIMIT or $CSI_DUCKDB_MEMORY
            cpu0, sampler0 = tree_cpu_by_kind(os.getpid()), mem.own_cpu if mem else 0.0
            machine0, saturated0 = machine_cpu()[0], mem.saturated_s if mem else 0.0
            began = time.monotonic()
            result = run_pull(cache, request, progress=mem and mem.mark)
            seconds = time.monotonic() - began
            cpu1, sampler1 = tree_cpu_by_kind(os.getpid()), mem.own_cpu if mem else 0.0
            machine1, saturated1 = machine_cpu()[0], mem.saturated_s if mem else 0.0
            if result.status != "complete":
                raise SystemExit(f"pull failed: {result.error}")
            runs.append({"rows": result.records, "seconds": seconds, "waves": result.waves,
                         "partitions": result.partitions_read,
                         "cpu_s": _cpu_spent(cpu0, cpu1, sampler1 - sampler0),
                         # the whole machine's (the server's and every thread's included)
                         "machine_busy_s": round(machine1 - machine0, 2),
                         "saturated_s": round(saturated1 - saturated0, 1),
                         # what the pull landed and its end summarized in: the end's more
                         # when DuckDB refused it the landings' (the cache opened again)
                         "landing_memory": landing_memory,
                         "summary_memory": cache.memory_limit})
    return {"runs": runs}


def _cpu_spent(before: dict[str, float], after: dict[str, float],
               sampler: float) -> dict[str, float]:
    """CPU seconds by kind between two ``tree_cpu_by_kind`` samples; the memory sampler's
    (``sampler``, spent in the driver's process) apart from the driver's."""
    spent = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in {*before, *after}}
    spent["driver"] = spent.get("driver", 0.0) - sampler
    spent["memory sampler"] = sampler
    return {k: round(v, 2) for k, v in spent.items() if abs(v) >= 0.005}


def _side(args) -> None:
    trace = args.memory_trace and f"{args.memory_trace}.{args.role}.jsonl"
    with PeakMemory(trace=trace) as mem:
        if args.role == "baseline":
            out = run_baseline(args.host, args.dialect, args.stream, args.start, args.end,
                               args.baseline_seconds)
        else:
            out = run_project(args.host, args.dialect, args.stream, args.start, args.end,
                              args.master, args.repeat, mem)
    out["peak_mb"] = mem.peak_kb / 1024
    out["peak_pss_mb"] = mem.peak_pss_kb / 1024
    out["peak_pss_kinds_mb"] = {k: round(v / 1024) for k, v in mem.peak_kinds.items()}
    print(json.dumps(out), flush=True)


# --- the driver ---------------------------------------------------------------------------------


def _start_server(scale: float, dialect: str, latency_ms: float) -> tuple[subprocess.Popen, dict]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", "server", "--scale", str(scale), "--dialect",
         dialect, "--latency-ms", str(latency_ms)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline().strip()
    if not line:
        raise SystemExit("the demo server did not start")
    return proc, json.loads(line)


def _run_side(role: str, world: dict | None, args, master: str | None,
              trace: str | None = None) -> dict:
    """One side in its own process; ``trace``: its memory trace's prefix instead of
    ``--memory-trace``'s."""
    cmd = [sys.executable, __file__, "--role", role, "--dialect", args.dialect,
           "--baseline-seconds", str(args.baseline_seconds), "--repeat", str(args.repeat)]
    if world:
        cmd += ["--host", world["address"], "--stream", world["stream"],
                "--start", str(world["start"]), "--end", str(world["end"])]
    if master:
        cmd += ["--master", master]
    if trace or args.memory_trace:
        cmd += ["--memory-trace", trace or args.memory_trace]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{role} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def _summary_note(runs: list[dict]) -> str:
    """"" when every pull's end summarized its transactions in the memory its landings had;
    else how many needed more (DuckDB refused them the landings' limit: the driver's peak then
    rises by what the larger limit lets DuckDB take)."""
    more = [r for r in runs if r.get("summary_memory") != r.get("landing_memory")]
    if not more:
        return ""
    return (f"; {len(more)} of {len(runs)} pulls summarized their transactions at "
            f"{more[0]['summary_memory']} (DuckDB refused {more[0]['landing_memory']})")


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _masters(args) -> list[tuple[str, str | None]]:
    return [("local[*]", None)] + ([("2-worker cluster", "cluster")] if args.cluster else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[20.0, 2.0],
                        help="simulated latency per server response")
    parser.add_argument("--dialect", default="googlesql")
    parser.add_argument("--repeat", type=int, default=3, help="project pulls per row (median)")
    parser.add_argument("--cluster", action="store_true",
                        help="also run on a standalone master with two workers")
    parser.add_argument("--demo", action="store_true",
                        help="also time the embedded demo world (28k rows) with Spark warm")
    parser.add_argument("--baseline-seconds", type=float, default=60.0,
                        help="the baseline reads this long at most (it reports a rate)")
    parser.add_argument("--last-minutes", type=float, nargs="+", default=[], metavar="M",
                        help="also pull only the last M minutes of each world (its stream at "
                             "the same density, fewer records) on local[*]: how a pull's peak "
                             "memory grows with its records at one rate")
    parser.add_argument("--memory-trace", metavar="PREFIX",
                        help="write every memory sample (seconds, PSS MB by kind) of each side "
                             "to PREFIX.<side>.jsonl (a --last-minutes pull's to "
                             "PREFIX.lastMmin.project.jsonl), to see when the peak happens")
    parser.add_argument("--role", choices=["baseline", "project", "server"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--scale", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--end", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    for minutes in args.last_minutes:
        if not 0 < minutes < WORLD_MINUTES:
            parser.error(f"--last-minutes takes minutes between 0 and {WORLD_MINUTES:g} (the "
                         f"benchmark's worlds span {WORLD_MINUTES:g} minutes), not {minutes:g}")
    os.environ.setdefault("SPANNER_DISABLE_BUILTIN_METRICS", "true")
    if args.role == "server":
        serve(args.scale, args.dialect, args.latency_ms[0])
        return
    if args.role:
        _side(args)
        return
    with _cluster_if(args) as cluster_url:
        demo: list[tuple[str, float]] = []
        if args.demo:
            for name, master in _masters(args):
                out = _run_side("project", None, args, cluster_url if master else None)
                runs = out["runs"]
                demo.append((name, _median(runs, "seconds")))
                print(f"demo world ({runs[0]['rows']:,} rows) on {name}, Spark warm: median "
                      f"{demo[-1][1]:.1f}s of {[round(r['seconds'], 1) for r in runs]}"
                      f", {runs[0]['waves']} waves, peak {out['peak_mb']:,.0f} MB (RSS sum), "
                      f"{out['peak_pss_mb']:,.0f} MB (PSS)", flush=True)
        print(f"{'records':>9} {'lat ms':>6} {'parts':>5} {'spark':>16} {'base rec/s':>10} "
              f"{'proj rec/s':>10} {'ratio':>6} {'proj s':>7} {'bound s':>7} {'of bound':>8} "
              f"{'waves':>5} {'server cpu':>10} {'base MB':>7} {'proj MB':>7} {'proj PSS':>8}",
              flush=True)
        rows: list[dict] = []
        for target in args.records:
            for latency in args.latency_ms:
                rows += _one_row(args, target, latency, cluster_url)
        _targets(rows, demo)


def _one_row(args, target: int, latency: float, cluster_url: str | None) -> list[dict]:
    scale = round(target / RECORDS_PER_SCALE, 3)
    proc, world = _start_server(scale, args.dialect, latency)
    rows = []
    try:
        bound = world["chain_responses"] * latency / 1000
        _, cpu0 = tree_usage(proc.pid)
        t0 = time.monotonic()
        base = _run_side("baseline", world, args, None)
        _paths(proc)  # the baseline's: not a pull's
        _, cpu1 = tree_usage(proc.pid)
        base_server = (cpu1 - cpu0) / max(time.monotonic() - t0, 1e-9)
        b_rate = base["rows"] / base["seconds"]
        for name, master in _masters(args):
            _, cpu0 = tree_usage(proc.pid)
            t0 = time.monotonic()
            mine = _run_side("project", world, args, cluster_url if master else None)
            _, cpu1 = tree_usage(proc.pid)
            busy = (cpu1 - cpu0) / max(time.monotonic() - t0, 1e-9)
            paths = _paths(proc)
            runs = mine["runs"]
            secs = _median(runs, "seconds")
            p_rate = runs[0]["rows"] / secs
            print(f"{runs[0]['rows']:>9,} {latency:>6g} {world['partitions']:>5} {name:>16} "
                  f"{b_rate:>10,.0f} {p_rate:>10,.0f} {p_rate / b_rate:>5.2f}x {secs:>7.1f} "
                  f"{bound:>7.1f} {bound / secs:>7.0%} {runs[0]['waves']:>5} "
                  f"{busy:>9.0%}c {base['peak_mb']:>7,.0f} {mine['peak_mb']:>7,.0f} "
                  f"{mine.get('peak_pss_mb', 0):>8,.0f}",
                  flush=True)
            kinds = ", ".join(f"{k} {v:,}" for k, v in
                              sorted(mine.get("peak_pss_kinds_mb", {}).items()))
            print(f"{'':>9}   runs {[round(r['seconds'], 1) for r in runs]} s; server busy "
                  f"{base_server:.0%} of a core under the baseline; PSS at the peak (MB): "
                  f"{kinds}{_summary_note(runs)}", flush=True)
            if not master:  # on the cluster the executors are outside the measured tree
                print(f"{'':>9}   {_cpu_line(runs)}", flush=True)
            print(f"{'':>9}   {_median_path_line(runs, paths, latency)}", flush=True)
            rows.append({"records": runs[0]["rows"], "latency": latency, "spark": name,
                         "ratio": p_rate / b_rate, "of_bound": bound / secs,
                         "pss_mb": mine.get("peak_pss_mb", 0), "cluster": bool(master)})
        whole = rows[0]["records"]
        for minutes in sorted(args.last_minutes):
            rows.append(_last_minutes(args, world, latency, minutes, whole))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return rows


def _paths(proc: subprocess.Popen) -> list[dict]:
    """The critical path of each pull the world's server saw since the last ask."""
    proc.stdin.write("paths\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def _median_path_line(runs: list[dict], paths: list[dict], latency_ms: float) -> str:
    """The median pull's critical path as its server saw it (``path_line``)."""
    if len(paths) != len(runs):
        return f"the server saw {len(paths)} pulls for {len(runs)}: no critical path told"
    i = sorted(range(len(runs)), key=lambda k: runs[k]["seconds"])[(len(runs) - 1) // 2]
    return f"median pull ({runs[i]['seconds']:.1f}s): {path_line(paths[i], latency_ms)}"


def _last_minutes(args, world: dict, latency: float, minutes: float, whole: int) -> dict:
    """The project's pulls of the world's last ``minutes`` only (the same server: the same
    stream, partitions and density, fewer records), on ``local[*]``."""
    start = world["end"] - round(minutes * 60 * 1e9)
    if not world["start"] < start < world["end"]:
        raise SystemExit(f"--last-minutes {minutes:g}: the world spans "
                         f"{(world['end'] - world['start']) / 60e9:g} minutes; give fewer.")
    trace = args.memory_trace and f"{args.memory_trace}.last{minutes:g}min"
    mine = _run_side("project", {**world, "start": start}, args, None, trace=trace)
    runs = mine["runs"]
    secs = _median(runs, "seconds")
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(mine.get("peak_pss_kinds_mb", {}).items()))
    print(f"{runs[0]['rows']:>9,} {latency:>6g} {'':>5} {f'last {minutes:g} min':>16} "
          f"{'':>10} {runs[0]['rows'] / secs:>10,.0f} {'':>6} {secs:>7.1f} {'':>7} {'':>8} "
          f"{runs[0]['waves']:>5} {'':>10} {'':>7} {mine['peak_mb']:>7,.0f} "
          f"{mine.get('peak_pss_mb', 0):>8,.0f}", flush=True)
    print(f"{'':>9}   runs {[round(r['seconds'], 1) for r in runs]} s; PSS at the peak (MB): "
          f"{kinds}{_summary_note(runs)}", flush=True)
    return {"records": runs[0]["rows"], "latency": latency, "spark": "local[*]",
            "pss_mb": mine.get("peak_pss_mb", 0), "cluster": False, "part_of": whole,
            "seconds": secs}


def _cpu_line(runs: list[dict]) -> str:
    """The median pull's CPU by process kind, in cores (CPU seconds over its seconds) and in
    microseconds per record: what the pull asks of the machine's cores."""
    run = sorted(runs, key=lambda r: r["seconds"])[(len(runs) - 1) // 2]  # median_low
    cpu = run.get("cpu_s", {})
    total = sum(cpu.values())
    parts = ", ".join(f"{k} {v / run['seconds']:.2f}" for k, v in sorted(cpu.items()))
    line = (f"CPU of the median pull: {total / run['seconds']:.2f} cores ({parts}) of "
            f"{os.cpu_count()}, {total / max(run['rows'], 1) * 1e6:.0f} us per record")
    if "machine_busy_s" in run:
        line += (f"; the machine's CPUs (the server and all else included) "
                 f"{run['machine_busy_s'] / run['seconds']:.2f} busy, saturated (under 5% "
                 f"idle) for {run['saturated_s']:.0f}s of the pull")
    return line


def _targets(rows: list[dict], demo: list[tuple[str, float]]) -> None:
    """Each figure against issue 8's target, in the same run: the demo world in <= 5 s with
    Spark warm; >= 8x the sequential client and >= 70% of the bound at 20 ms; peak PSS
    <= 1.5 GB, and how it grows from the fewest records to the most (flat is the target)."""
    print("targets (issue 8):", flush=True)
    for name, seconds in demo:
        print(f"  demo world on {name}: {seconds:.1f} s, target <= 5 s: "
              f"{'met' if seconds <= 5 else 'NOT met'}", flush=True)
    parts = [r for r in rows if r.get("part_of")]
    rows = [r for r in rows if not r.get("part_of")]
    for r in rows:
        if r["latency"] == 20:
            ok = r["ratio"] >= 8 and r["of_bound"] >= 0.7
            print(f"  {r['records']:,} records, 20 ms, {r['spark']}: {r['ratio']:.2f}x the "
                  f"sequential client (>= 8x), {r['of_bound']:.0%} of the bound (>= 70%): "
                  f"{'met' if ok else 'NOT met'}", flush=True)
    for r in rows:
        if not r["cluster"]:  # on the cluster the executors are outside the measured tree
            print(f"  {r['records']:,} records, {r['latency']:g} ms: peak PSS {r['pss_mb']:,.0f} "
                  f"MB, target <= 1,536 MB: {'met' if r['pss_mb'] <= 1536 else 'NOT met'}",
                  flush=True)
    for latency in sorted({r["latency"] for r in rows}):
        local = sorted((r["records"], r["pss_mb"]) for r in rows
                       if r["latency"] == latency and not r["cluster"])
        # Each step between sizes (how the growth slows), then the fewest to the most.
        pairs = list(zip(local, local[1:]))
        if len(local) > 2:
            pairs.append((local[0], local[-1]))
        for (n0, m0), (n1, m1) in pairs:
            print(f"  memory from {n0:,} to {n1:,} records at {latency:g} ms ({n1 / n0:.1f}x the "
                  f"records): {m0:,.0f} -> {m1:,.0f} MB peak PSS ({m1 - m0:+,.0f} MB, "
                  f"{m1 / m0 - 1:+.1%}); flat is the target", flush=True)
    for r in rows:  # the same stream's last minutes: its records at one rate
        own = sorted((p["records"], p["seconds"], p["pss_mb"]) for p in parts
                     if p["part_of"] == r["records"] and p["latency"] == r["latency"])
        if r["cluster"] or not own:
            continue
        steps = ", ".join(f"{n:,} records ({s:.0f} s) {m:,.0f} MB" for n, s, m in own)
        m0 = own[0][2] or 1  # a peak is never 0 MB unless /proc could not be read
        print(f"  memory within the {r['records']:,}-record world at {r['latency']:g} ms, its "
              f"last minutes: {steps}; all of it {r['pss_mb']:,.0f} MB ({r['pss_mb'] - m0:+,.0f} "
              f"MB, {r['pss_mb'] / m0 - 1:+.1%} from the fewest records)", flush=True)


class _cluster_if:
    """A standalone master + 2 workers (1 core, 1 GB each) for ``--cluster``."""

    def __init__(self, args):
        self.args = args
        self.ctx = None

    def __enter__(self) -> str | None:
        if not self.args.cluster:
            return None
        from tests.support.cluster import standalone_cluster, unshare_missing

        logs = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
        self.ctx = standalone_cluster(logs, workers=2, cores=1, project_root=ROOT,
                                      isolated=unshare_missing() is None)
        return self.ctx.__enter__().master_url

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


if __name__ == "__main__":
    main()
