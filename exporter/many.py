"""`--all-nodes`: the series of many nodes from one process, for nodes without an exporter pod (KWOK).

Each node's series are rendered on their own, with `Hostname` = the node name, and kept as
per-family fragments; `/metrics` is their join (dcgm.join), so a change to one node re-renders
only that node and then joins bytes. Nodes whose values move in time (power, energy, activity: any GPU) are
re-rendered on each collection step; the others only when their topology changes.

Sources are named (a per-node ConfigMap, or the one document of a file or of the single layout);
each holds the nodes it lists. A source that turns invalid keeps its nodes' last good series, and
a node whose entry is invalid keeps its own; `/health` then says why, in one line.

With `--node-selector`, only the nodes its Node list selected are served: none before the Nodes
are first listed (every node would export real nodes twice, as their own exporters do too), and
the last selection while listing them fails. Each watch reports its problems under its own key,
so one that is good again never hides the other's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from common.selfmetrics import InvalidObjects, kind_of
from exporter import dcgm
from exporter.service import wait_for_work
from exporter.source import node_of
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology
from web.server import Published, Snapshot

log = logging.getLogger("exporter")
_START = "start"
# Problem keys: what reports a problem, and clears it when it is good again.
CONFIGMAPS, NODES, SOURCES = "configmaps", "nodes", "sources"


class NodesExporter:
    def __init__(
        self,
        options: dcgm.Options,
        published: Published,
        clock: Callable[[], float] | None = None,
        node_selector: str | None = None,
    ) -> None:
        """`node_selector`: only the nodes `select` names are served, once it has named them."""
        self.options = options
        self.published = published
        self.clock = clock or (lambda: time.time())  # looked up per call: freezegun's is used
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeTopology] = {}  # last good entry of every node seen
        self._sources: dict[str, set[str]] = {}  # source -> the nodes it holds
        # --node-selector's nodes (the last good list's); None: every node. Nothing selected until
        # the Nodes are listed, so a real node is never served while they cannot be.
        self._selected: set[str] | None = set() if node_selector else None
        self._listed = node_selector is None  # whether `_selected` came from a Node list
        self._dirty: set[str] = set()  # nodes to render again
        self._parts: dict[str, dict[str, bytes]] = {}  # node -> its fragments, as served
        self._moving: set[str] = set()  # nodes whose values move in time
        self._gpus: dict[str, set[str]] = {}  # node -> its GPU ids, whose energy is counted
        self._step: int | None = None
        self._problems: dict[str, str] = {_START: "no topology yet"}  # source -> reason
        if node_selector:
            self._problems[NODES] = f"Nodes -l {node_selector}: not listed yet"
        self.invalid = InvalidObjects("mig_exporter_invalid_objects_total")
        self._counted: dict[str, TopologyError] = {}  # source or node -> last problem counted

    # --- sources in (watch threads) --------------------------------------------------------------

    def update(self, topology: Topology, obj: str) -> None:
        """A whole document (a file, or the single layout's ConfigMap): every node in it."""
        self.update_source(obj, topology, obj)
        self.problem(None)

    def update_source(self, source: str, topology: Topology, obj: str) -> None:
        with self._lock:
            before = self._sources.get(source, set())
            # A node whose entry is bad stays (with its last good series): it is not gone.
            named = set(topology.nodes) | set(topology.invalid)
            self._sources[source] = named
            self._problems.pop(source, None)
            self._counted.pop(source, None)  # good again: its next problem is news
            self._problems.pop(_START, None)
            for name in before - named:
                self._forget(name)
            for name in sorted(named):
                try:
                    node = node_of(topology, name, obj)
                except TopologyError as e:
                    if self._count(name, TopologyError(f"node {name}", e.field, e.message)):
                        log.warning("%s; serving its last good series", e)
                    self._problems[source] = f"{e}; serving its last good series"
                    continue
                self._counted.pop(name, None)
                if node is not None and self._nodes.get(name) != node:
                    self._nodes[name] = node
                    self._dirty.add(name)
        self.wake.set()

    def source_problem(
        self, source: str, reason: str, invalid: TopologyError | None = None
    ) -> None:
        with self._lock:
            if self._problems.get(source) != reason:
                log.warning("%s", reason)
            self._problems[source] = reason
            if invalid is not None:
                self._count(source, invalid)
        self.wake.set()

    def rejected(self, e: TopologyError) -> None:
        """The one document (a file, the single layout's ConfigMap) is invalid."""
        self.source_problem(e.obj, f"{e}; serving the last good series", e)

    def _count(self, key: str, e: TopologyError) -> bool:
        """Count a problem once, when it is new for this source or node."""
        if self._counted.get(key) == e:
            return False
        self._counted[key] = e
        self.invalid.count(kind_of(e.obj))
        return True

    def remove_source(self, source: str) -> None:
        with self._lock:
            for name in self._sources.pop(source, set()):
                self._forget(name)
            self._problems.pop(source, None)
        self.wake.set()

    def keep_sources(self, sources: set[str]) -> None:
        """After a fresh list: sources that are not in it are gone."""
        for source in set(self._sources) - sources:
            self.remove_source(source)

    def select(self, names: set[str] | None) -> None:
        """The Nodes were listed (or watched): `names` are the nodes to serve."""
        with self._lock:
            before = self._selected
            self._selected, self._listed = names, True
            everyone = set(self._nodes)
            self._dirty |= (before if before is not None else everyone) ^ (
                names if names is not None else everyone
            )
            if self._problems.pop(NODES, None) is not None:
                log.info("the Nodes are listed: serving the %d selected", len(names or ()))
        self.wake.set()

    def selection_failed(self, reason: str) -> None:
        """The Nodes cannot be listed or watched: keep serving the last selection, and say so."""
        with self._lock:
            known = self._listed
        kept = (
            "serving the nodes last selected" if known else "serving no node until they are listed"
        )
        self.problem(f"{reason}; {kept}", key=NODES)

    def problem(self, reason: str | None, key: str = CONFIGMAPS) -> None:
        """The API is unreachable (or fine again, with None): keep serving, report unhealthy."""
        with self._lock:
            if reason is None:
                self._problems.pop(key, None)
                self._problems.pop(_START, None)  # listed: an empty namespace is a good state
            else:
                if self._problems.get(key) != reason:
                    log.warning("%s", reason)
                self._problems[key] = reason
        self.wake.set()

    def _forget(self, name: str) -> None:
        # Still listed by another source (a node moved between documents): keep it.
        if not any(name in nodes for nodes in self._sources.values()):
            self._nodes.pop(name, None)
            self._dirty.add(name)

    # --- rendering (one thread) ------------------------------------------------------------------

    def render(self) -> Snapshot:
        """Render what changed (and what moves in time on a new step), join, and say if healthy."""
        now = self.clock()
        step = int(now // dcgm.UTILIZATION_STEP_S)
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if step != self._step:
                dirty |= self._moving
                self._step = step
            todo = {
                name: self._nodes.get(name)
                if self._selected is None or name in self._selected
                else None
                for name in dirty
            }
            problems = sorted(self._problems.values())
            # A source was read: its nodes (maybe none) are true; with a node selector, the Nodes
            # were listed too: before, nothing is selected, and an empty body would be a lie.
            ready = _START not in self._problems and self._listed
        for name, node in todo.items():
            gone = self._gpus.pop(name, set())
            if node is None:
                self._parts.pop(name, None)
                self._moving.discard(name)
                self.options.energy.drop(name, gone)  # nodes come and go (KWOK): keep no counter
                continue
            self._gpus[name] = {gpu.id for gpu in node.gpus}
            self.options.energy.drop(name, gone - self._gpus[name])
            self._parts[name] = dcgm.fragments(node, replace(self.options, hostname=name), now)
            moving = dcgm.moves_in_time(node, self.options.counters)
            (self._moving.add if moving else self._moving.discard)(name)
        body = dcgm.join_parts(
            (self._parts[name] for name in sorted(self._parts)), self.options.counters
        )
        own = self.invalid.exposition()
        if not problems:
            return Snapshot(body, True, "ok", own, ready)
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        return Snapshot(body, False, problems[0] + more, own, ready)

    def run(self, stop: threading.Event, sources: Sequence[threading.Thread] = ()) -> None:
        while not stop.is_set():
            self.wake.clear()
            self.published.publish(self.render())
            gone = wait_for_work(self.wake, dcgm.until_next_step(self.clock()), sources, stop)
            if gone:
                self.problem(gone, key=SOURCES)
