"""The render loop every exporter runs: publish a snapshot on each change and each due time.

Sources (a file, watches) only change state and set `wake`; the loop reads the values in one
thread and publishes an immutable snapshot that scrapes read, so nothing on the scrape path reads
YAML, computes a value or calls NVML: at most it writes the text of values already read (many
nodes' text is too large to keep). Between changes it sleeps until the next collection step
(simulated values move in time) or the next NVML collection, and looks every second at its
source threads.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from exporter import dcgm
from exporter.health import Health
from mig_exporter.web.server import Published, Snapshot

WATCHDOG_S = 1.0  # how often a sleeping render loop checks that its sources still run
SETTLE_S = 60.0  # the collector runs again after this long, even with nothing ready to serve
# How long past its next due time a loop may take to publish before `/health` calls it stuck:
# far beyond any busy step (a slice of nodes, an NVML collection of many GPUs), so that a busy
# loop is never called stuck, and a hung one is within a minute.
STUCK_S = 60.0


class RenderLoop:
    """State and loop shared by the exporters; a subclass says how a snapshot is made."""

    def __init__(
        self, published: Published, health: Health, clock: Callable[[], float] | None,
        stopped_key: str = "sources",
    ) -> None:  # fmt: skip
        """`stopped_key`: the problem key a source thread that ended is reported under."""
        self.stopped_key = stopped_key
        self.published = published
        self.health = health
        self.invalid = health.invalid
        # Looked up on each call, so a patched time.time (freezegun) is the one used.
        self.clock = clock or (lambda: time.time())
        self.wake = threading.Event()
        self.stuck_s = STUCK_S

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def tick(self) -> None:
        """Work that falls due before each snapshot (NVML collects here); none by default."""

    def due_in(self) -> float:
        """Seconds until a snapshot is due without a change: the next collection step."""
        return dcgm.until_next_step(self.clock())

    def run(self, stop: threading.Event, sources: Sequence[threading.Thread] = ()) -> None:
        settled, started = False, time.monotonic()
        while not stop.is_set():
            self.wake.clear()
            self.tick()
            snapshot = self.snapshot()
            due = self.due_in()
            # Due again in `due` (or sooner, woken): stuck if nothing comes long after that.
            stale_after = time.monotonic() + max(0.0, due) + self.stuck_s
            self.published.publish(replace(snapshot, stale_after=stale_after))
            if not settled and (snapshot.ready or time.monotonic() - started > SETTLE_S):
                settle()
                settled = True
            gone = wait_for_work(self.wake, due, sources, stop)
            if gone:
                self.health.set(self.stopped_key, gone)


def settle() -> None:
    """After the first read: what it built (each node's entry, labels and plans) lives until its
    node changes, so the cyclic garbage collector is told to stop walking it (`gc.freeze`, after
    a last collection), and runs again if the start paused it (cli). Walking it was a second
    every few collection steps at 5,000 nodes; as nodes change, their old objects are still
    freed, by their reference counts. Then the C heap hands back the pages the read freed."""
    gc.collect()
    gc.freeze()
    gc.enable()
    trim_heap()


def trim_heap() -> None:
    """Give the free pages of the C heap back to the system (glibc's `malloc_trim`). The first
    read frees most of what it allocated (each document's text and parse), but glibc keeps the
    pages between live objects: a shard that parsed a quarter of 5,000 nodes held 204 MiB
    instead of 142. Nothing is done where the C library has no such call (musl, macOS)."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)


def wait_for_work(
    wake: threading.Event,
    seconds: float,
    sources: Sequence[threading.Thread],
    stop: threading.Event,
) -> str | None:
    """Sleep until woken (a change) or for `seconds` (the next step), looking every second at the
    source threads: one that ended (a bug) would never update the series again, so `/health` must
    say so rather than answer 200 on a frozen topology. Returns that reason, or None."""
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        left = deadline - time.monotonic()
        if left <= 0 or wake.wait(min(left, WATCHDOG_S)):
            return None
        dead = [t.name for t in sources if not t.is_alive()]
        if dead and not stop.is_set():  # (a second at least between two reports: no spinning)
            return f"the topology source {', '.join(dead)} stopped; serving the last good topology"
    return None
