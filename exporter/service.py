"""The exporter's state: the last good node topology, rendered into a snapshot on every change."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from common.files import UnreadableFile, read_text
from common.selfmetrics import InvalidObjects, kind_of
from exporter import dcgm
from exporter.source import missing_node, node_of
from topology.configmap import parse_document
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology
from web.server import Published, Snapshot

log = logging.getLogger("exporter")


class Exporter:
    """Feeds topology updates in, publishes rendered `/metrics` bytes out.

    A bad update never replaces the last good node: it only turns `/health` to 503 with the reason.
    """

    def __init__(
        self,
        node_name: str,
        options: dcgm.Options,
        published: Published,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.node_name = node_name
        self.options = options
        self.published = published
        # Looked up on each call, so a patched time.time (freezegun) is the one used.
        self.clock = clock or (lambda: time.time())
        self.wake = threading.Event()
        self._node: NodeTopology | None = None
        self._problem: str | None = "no topology yet"
        self.invalid = InvalidObjects("mig_exporter_invalid_objects_total")
        self._counted: TopologyError | None = None  # the last invalid input counted

    def rejected(self, e: TopologyError) -> None:
        """The source's content is invalid: keep serving, report unhealthy, count it once."""
        self._count(e)
        self.problem(f"{e}; serving the last good topology")

    def _count(self, e: TopologyError) -> None:
        if e != self._counted:
            self._counted = e
            self.invalid.count(kind_of(e.obj))

    def update(self, topology: Topology, obj: str) -> None:
        try:
            node = node_of(topology, self.node_name, obj)
        except TopologyError as e:
            self._count(TopologyError(f"node {self.node_name}", e.field, e.message))
            self._set_problem(f"{e}; serving the last good topology")
        else:
            if node is None:
                # Never a state a real node is in for long (a re-applied seed, a relabelled node):
                # keep what was served, and say why.
                reason = missing_node(topology, self.node_name, obj)
                self._set_problem(f"{reason}; serving the last good topology")
            else:
                self._node = node
                self._counted = None  # good again: its next problem is news
                self._set_problem(None)
        self.wake.set()

    def problem(self, reason: str) -> None:
        """The source is unusable (missing, invalid, unreachable): keep serving, report unhealthy."""
        self._set_problem(reason)
        self.wake.set()

    def _set_problem(self, reason: str | None) -> None:
        if reason != self._problem:
            if reason:
                log.warning("%s", reason)
            elif self._problem:
                log.info("topology for node %s is good", self.node_name)
        self._problem = reason

    def snapshot(self) -> Snapshot:
        body = dcgm.render(self._node, self.options, self.clock())
        own = self.invalid.exposition()
        ready = self._node is not None  # never served a node: nothing true to say yet
        return Snapshot((body,), self._problem is None, self._problem or "ok", own, ready)

    def run(self, stop: threading.Event, sources: Sequence[threading.Thread] = ()) -> None:
        """Render on every change, and each utilization step since simulated values move in time."""
        while not stop.is_set():
            self.wake.clear()
            self.published.publish(self.snapshot())
            gone = wait_for_work(self.wake, dcgm.until_next_step(self.clock()), sources, stop)
            if gone:
                self._set_problem(gone)


WATCHDOG_S = 1.0  # how often a sleeping render loop checks that its sources still run


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


# `render --layout per-node` for 5,000 busy 8-GPU nodes is about 70 MiB: room for that, and a
# bound on what a wrong path (a log, a device) can make the exporter hold.
MAX_TOPOLOGY_FILE_BYTES = 256 << 20


def read_topology_file(path: Path) -> Topology:
    obj = f"topology file {path}"
    try:
        text = read_text(path, MAX_TOPOLOGY_FILE_BYTES)
    except UnreadableFile as e:
        raise TopologyError(obj, "topology", str(e)) from None
    return parse_document(text, obj)


class Sink(Protocol):
    """What a topology source feeds: the one-node `Exporter` or the many-nodes one."""

    def update(self, topology: Topology, obj: str) -> None: ...

    def problem(self, reason: str) -> None: ...

    def rejected(self, e: TopologyError) -> None: ...


def follow_file(path: Path, exporter: Sink, stop: threading.Event, interval: float = 1.0) -> None:
    """Reload when the file changes: a ConfigMap mounted as a volume is updated in place."""
    seen: tuple[float, int] | None = None
    while not stop.is_set():
        try:
            st = path.stat()
            current: tuple[float, int] | None = (st.st_mtime, st.st_size)
        except OSError:
            current = None
        if current != seen:
            seen = current
            try:
                exporter.update(read_topology_file(path), f"topology file {path}")
            except TopologyError as e:
                exporter.rejected(e)
        stop.wait(interval)
