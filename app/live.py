"""Live streams: a live source pulled on a timer, and what the pages say.

A :class:`LiveRunner` (one per live stream, for the whole server process) keeps ONE source
across ticks: the live demo world's server, or a local Cloud Spanner emulator with its workload
running (``demo.emulator.LiveEmulator``), stays up, and every tick pulls from the stream's
start to now through it into the cache, which reads only the new span (open partitions continue
where they were read to). Ticks run on a background thread, so pages only re-read the cache
(``st.fragment(run_every=...)``); one pull at a time per cache file (``resources.pull_lock``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_backend.model.timestamps import format_ns

from . import pulling

LIVE_PREFIX = "LiveDemo_"
LIVE_EMULATOR_PREFIX = "LiveEmulator_"
DEFAULT_EVERY_S = 5.0
_FINISHED = {
    "demo": "The live demo world has played its hour; start a new one to watch again.",
    "emulator": "The live emulator is gone (stopped or exited); start a new one to watch again.",
}


@dataclass
class LiveRunner:
    """A live stream being pulled on a timer into one cache file."""

    path: str
    stream: str
    world: Any                   # demo.live.LiveWorld, or demo.emulator.LiveEmulator
    server: Any                  # what serves it and stops: DemoServer, or the LiveEmulator
    pull: Callable[[pulling.PullForm, Callable[[Any], None]], pulling.Outcome]
    source: str = "demo"         # the pull's source: demo | emulator
    heartbeat_ms: int = 2000
    every_s: float = DEFAULT_EVERY_S
    history_s: float = 90.0      # the first pull reads this much of the past (then only news)
    ticks: int = 0
    last: str = "starting…"
    last_ok: bool = True
    last_at: float = 0.0
    stopped: bool = False
    # Work a page wants done after each refresh, off its own run (key -> function); its last
    # result stays in ``prepared`` (see :meth:`follow`).
    followers: dict[Any, Callable[[], Any]] = field(default_factory=dict, repr=False)
    prepared: dict[Any, Any] = field(default_factory=dict, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.first_ns = max(self.world.start, self.world.now - int(self.history_s * 1e9))
        self.first_ns -= self.first_ns % 1000

    def form(self) -> pulling.PullForm:
        return pulling.PullForm(source=self.source, stream=self.stream,
                                start=format_ns(self.first_ns),
                                end=format_ns(self.world.end), heartbeat_ms=self.heartbeat_ms)

    def tick(self) -> pulling.Outcome:
        """One refresh: pull what happened since the last one."""
        early = (self.first_ns - self.world.end) / 1e9  # a live emulator reads up to 1 s ago
        if early > 0:
            self._stop.wait(early + 0.01)
        outcome = self.pull(self.form(), lambda p: None)
        self.ticks += 1
        self.last, self.last_ok, self.last_at = outcome.message, outcome.ok, time.time()
        return outcome

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"live-{self.stream}",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.tick()
            except Exception as e:  # keep the loop alive; the page shows the sentence
                self.last, self.last_ok = f"The refresh failed: {str(e).splitlines()[0]}", False
            self._prepare()
            if self.world.finished:
                self.last = _FINISHED.get(self.source, "The live source has finished.")
                break
            self._stop.wait(max(0.5, self.every_s - (time.monotonic() - began)))

    def follow(self, key: Any, prepare: Callable[[], Any]) -> None:
        """Run ``prepare`` after every refresh from now on (``key`` replaces an earlier one):
        a page's slow reads and figures are ready before its next run asks for them."""
        self.followers[key] = prepare
        while len(self.followers) > 8:  # sessions with other thresholds or ranges
            oldest = next(iter(self.followers))
            self.followers.pop(oldest)
            self.prepared.pop(oldest, None)

    def _prepare(self) -> None:
        for key, prepare in list(self.followers.items()):
            try:
                self.prepared[key] = prepare()
            except Exception:  # the page's own run computes it again and shows the error
                self.prepared.pop(key, None)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        self.server.stop()
        self.stopped = True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def status(self) -> str:
        """One plain sentence: running or not, ticks, the last refresh's outcome."""
        state = "live" if self.running else "stopped"
        ago = "" if not self.last_at else f" ({time.time() - self.last_at:.0f}s ago)"
        refreshes = "refresh" if self.ticks == 1 else "refreshes"
        return (f"{self.stream} is {state}: {self.ticks} {refreshes} every {self.every_s:g}s; "
                f"last{ago}: {self.last}")


# The name a start asked for, per prefix, until the runner it starts takes it: the pages name
# the stream from the click on, while the world, its server and its first pull start.
_reserved: dict[str, str] = {}
_reserved_lock = threading.Lock()


def reserve_stream_name(now_ns: int, prefix: str = LIVE_PREFIX) -> str:
    """The name the next live stream of ``prefix`` will have (:func:`new_stream_name` returns
    it), fixed at the moment a start is asked for. A start already asked for keeps its name."""
    with _reserved_lock:
        return _reserved.setdefault(prefix, prefix + format_ns(now_ns)[11:19].replace(":", ""))


def cancel_reservation(name: str) -> bool:
    """Forget ``name`` if no runner took it (its start never began); True when it was
    pending."""
    with _reserved_lock:
        for prefix, reserved in list(_reserved.items()):
            if reserved == name:
                del _reserved[prefix]
                return True
    return False


def is_reserved(name: str) -> bool:
    """A start asked for ``name`` and no runner has taken it yet."""
    with _reserved_lock:
        return name in _reserved.values()


def is_starting(name: str, runner: LiveRunner | None) -> bool:
    """A live stream asked for whose first pull has not finished: its name is reserved, or its
    runner runs and has not refreshed once (the stream's row may exist, its data not yet)."""
    return is_reserved(name) or (runner is not None and runner.running and runner.ticks == 0)


def new_stream_name(now_ns: int, prefix: str = LIVE_PREFIX) -> str:
    """LiveDemo_HHMMSS (UTC): each live world is a stream of its own (its times differ); a live
    emulator's is LiveEmulator_HHMMSS. A name reserved for this prefix is taken (and freed)."""
    with _reserved_lock:
        reserved = _reserved.pop(prefix, None)
    return reserved or prefix + format_ns(now_ns)[11:19].replace(":", "")


def refusal(info: dict[str, Any]) -> str | None:
    """Why a cached stream cannot be refreshed here (one sentence), None when it can."""
    source = info.get("source")
    if source == "emulator" and str(info.get("stream", "")).startswith(LIVE_EMULATOR_PREFIX):
        return ("This live emulator stream is refreshed through its own emulator while it runs "
                "(see Live emulator above); once stopped it stays as recorded.")
    if source == "emulator":
        return ("This stream came from a local emulator that its pull started and stopped; "
                "nothing is left to refresh. Start the live emulator above to watch one live.")
    if source == "demo" and str(info.get("stream", "")).startswith(LIVE_PREFIX):
        return ("This live demo stream is refreshed by its own live world while it runs (see "
                "Live demo above); once stopped it stays as recorded.")
    if source == "demo":
        return ("The recorded demo world is a fixed hour: there is nothing new to read. Start "
                "the live demo instead.")
    if source not in ("spanner",):
        return ("Only streams pulled from Cloud Spanner (or the live demo and the live emulator) "
                "can be refreshed.")
    return None


def events(parts: Any, edges: Any, found: list[dict], since_ns: int) -> list[str]:
    """What happened since ``since_ns``, in words (markdown lines, values escaped): splits,
    merges, a partition going silent or speaking again."""
    from .formatting import clock, duration, short
    from .safe import md

    start = dict(zip(parts["token"], parts["start_ns"], strict=True))
    recent = edges[edges["child"].map(lambda t: (start.get(t) or 0) >= since_ns)]
    out: list[tuple[int, str]] = []
    for parent, group in recent[recent["kind"] == "split"].groupby("parent"):
        at = int(min(start[t] for t in group["child"]))
        kids = ", ".join(short(t, 8) for t in group["child"])
        out.append((at, f"{clock(at)} UTC · partition {md(short(parent, 8))} **split** into "
                        f"{len(group)} ({md(kids)})"))
    for child, group in recent[recent["kind"] == "merge"].groupby("child"):
        at = int(start[child])
        names = ", ".join(short(t, 8) for t in group["parent"])
        out.append((at, f"{clock(at)} UTC · partitions {md(names)} **merged** into "
                        f"{md(short(child, 8))}"))
    for s in found:
        if s["ongoing"]:
            out.append((s["since_ns"], f"{clock(s['since_ns'])} UTC · partition "
                        f"{md(short(s['partition'], 8))} **went silent**: it has held the low "
                        f"watermark back for {duration(s['max_lag_s'])} and **still does**"))
        elif s["until_ns"] is not None and s["until_ns"] >= since_ns:
            out.append((s["until_ns"], f"{clock(s['until_ns'])} UTC · partition "
                        f"{md(short(s['partition'], 8))} **recovered** after "
                        f"{duration(s['max_lag_s'])} of silence"))
    return [text for _, text in sorted(out, reverse=True)]
