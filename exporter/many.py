"""The nodes an exporter serves, and `--all-nodes`: many nodes' series from one process (KWOK).

`ServedNodes` is what the node's own exporter (service.py) and `--all-nodes` share: each node's
series (`dcgm.NodeSeries`: their label text and values) are made on their own, so a change to one
node makes only that node's again. Nodes whose values move in time (power, energy, activity: any
GPU) are read again on each collection step, their label text kept; the others only when their
topology changes. The text is written when a scrape asks: a node's page each time, `/metrics`
once per snapshot (dcgm.join_parts). Only the selected nodes are served.

`NodesExporter` is `--all-nodes`, with `Hostname` = the node name. Sources are named (a per-node
ConfigMap, or the one document of a file or of the single layout); each holds the nodes it lists.
A source that turns invalid keeps its nodes' last good series, and a node whose entry is invalid
keeps its own; `/health` then says why, in one line.

With `--node-selector`, only the nodes its Node list selected are served: none before the Nodes
are first listed (every node would export real nodes twice, as their own exporters do too), and
the last selection while listing them fails. Each watch reports its problems under its own key,
so one that is good again never hides the other's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial
from itertools import islice

from exporter import dcgm
from exporter.health import Health
from exporter.loop import RenderLoop
from exporter.node import node_of
from exporter.shards import Shard
from mig_exporter.web.server import Published, Snapshot
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology

log = logging.getLogger("exporter")
_START = "start"
# Problem keys: what reports a problem, and clears it when it is good again.
CONFIGMAPS, NODES, SOURCES, SHARDS = "configmaps", "nodes", "sources", "shards"
READING = "reading"  # the first list of the sources is being read: how many so far
SLICE = 250  # nodes rendered in one go: about 60 ms of a step's work at 8 busy GPUs each
SLICE_PAUSE_S = 0.02  # then the render loop waits this long, and the scrapes run
SHARDS_WATCH = "statefulset"  # reading the shard count failed (its last count is kept)


class ServedNodes(RenderLoop):
    """Nodes in (under `_lock`, from the sources' threads), snapshots out (the render loop)."""

    def __init__(
        self,
        options: dcgm.Options,
        published: Published,
        health: Health,
        clock: Callable[[], float] | None,
        selected: set[str] | None,
        shard: Shard | None = None,
        *,
        forgets_gone_gpus: bool = True,
        own_hostname: bool = False,
        stopped_key: str = SOURCES,
    ) -> None:
        """`selected`: the nodes to serve; None: every node. `shard`: of those, only its own.
        `forgets_gone_gpus`: whether the energy meter forgets a GPU no longer served (many nodes
        come and go, KWOK: the meter must not keep them all). `own_hostname`: the series'
        `Hostname` is the options' (the exporter's own), not each node's name."""
        super().__init__(published, health, clock, stopped_key)
        self.forgets_gone_gpus = forgets_gone_gpus
        self.own_hostname = own_hostname
        self.options = options
        self.shard = shard
        self._sharding: str | None = None  # why no node is served yet (autosharding), if so
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeTopology] = {}  # last good entry of every node seen
        self._selected = selected
        self._dirty: set[str] = set()  # nodes to render again
        # node -> its series as served (the entry they were made from, their label text, their
        # values of the last step): a step of the same entry reads the GPUs again, no more.
        self._series: dict[str, dcgm.NodeSeries] = {}
        self._moving: set[str] = set()  # nodes whose values move in time
        self._gpus: dict[str, set[str]] = {}  # node -> its GPU ids, whose energy is counted
        self._step: int | None = None

    def _put(self, name: str, node: NodeTopology) -> None:
        """A node's good entry (under `_lock`): rendered again only if it changed."""
        if self._nodes.get(name) != node:
            self._nodes[name] = node
            self._dirty.add(name)

    def _options_for(self, name: str) -> dcgm.Options:
        """The options a node's series are rendered with: its name is their `Hostname`, unless
        the exporter's own is."""
        return self.options if self.own_hostname else replace(self.options, hostname=name)

    def _ready(self) -> bool:
        """Whether the body is true yet (under `_lock`): before, `/metrics` answers 503."""
        raise NotImplementedError

    def _complete(self) -> bool:
        """Whether every node there is to serve is known (under `_lock`): while the first list
        is read, a node not served yet may be on its way."""
        return True

    def snapshot(self) -> Snapshot:
        """Render what changed (and what moves in time on a new step), join, and say if healthy."""
        now = self.clock()
        step = int(now // dcgm.UTILIZATION_STEP_S)
        with self._lock:
            if step != self._step:
                self._dirty |= self._moving
                self._step = step
            # Nodes served already are made again a slice at a time: between slices the loop
            # publishes and sleeps a moment, and the scrapes waiting for the interpreter get it
            # (a whole step of 5,000 nodes held it for a second, and a scrape waited that long).
            # A node not served yet is made at once: until then it would answer 404.
            again = self._dirty & self._series.keys()
            dirty = (self._dirty - again) | set(islice(again, SLICE))
            self._dirty -= dirty
            todo = {name: self._nodes.get(name) if self._serves(name) else None for name in dirty}
            healthy, reason = self.health.state()
            ready = self._ready()
            complete = self._complete()
        for name, node in todo.items():
            self._render(name, node, now)
        own = self.invalid.exposition() + (self.shard.exposition() if self.shard else b"")
        # A copy, not sorted: a step publishes 20 times at 5,000 nodes, and only the whole body
        # (rarely asked for at that size) needs the names in order.
        pages = dict(self._series)
        whole = partial(_whole, pages, self.options)
        return Snapshot((), healthy, reason, own, ready, pages, whole, complete)

    def due_in(self) -> float:
        """At once (after a pause for the scrapes) while nodes wait for their slice."""
        with self._lock:
            waiting = bool(self._dirty)
        return SLICE_PAUSE_S if waiting else super().due_in()

    def _serves(self, name: str) -> bool:
        """Whether the node is served here (under `_lock`): selected, and of this shard."""
        if self._sharding is not None:
            return False  # the shard count is not known yet (or this replica is going away)
        selected = self._selected is None or name in self._selected
        return selected and (self.shard is None or self.shard.owns(name))

    def _render(self, name: str, node: NodeTopology | None, now: float) -> None:
        """A node's fragments again, or none for a node no longer served (None)."""
        last = self._series.get(name)
        if last is not None and last.node is node:  # a step: the GPUs read again, no more
            self._series[name] = last.at(now)
            return
        options = self._options_for(name)
        gone = self._gpus.pop(name, set())
        if node is None:
            self._series.pop(name, None)
            self._moving.discard(name)
            self._forget_gpus(options.hostname, gone)
            return
        self._gpus[name] = {gpu.id for gpu in node.gpus}
        self._forget_gpus(options.hostname, gone - self._gpus[name])
        self._series[name] = dcgm.NodeSeries(node, options, now)
        moving = dcgm.moves_in_time(node, self.options.counters)
        (self._moving.add if moving else self._moving.discard)(name)

    def _forget_gpus(self, hostname: str, gpu_ids: Iterable[str]) -> None:
        if self.forgets_gone_gpus:
            self.options.energy.drop(hostname, gpu_ids)


def _whole(pages: dict[str, dcgm.NodeSeries], options: dcgm.Options) -> tuple[bytes, ...]:
    """`/metrics`: every node's families, family by family, nodes in name order."""
    return dcgm.join_parts((pages[name].parts() for name in sorted(pages)), options)


def _progress(done: int, total: int) -> str:
    return f"read {done} of {total} topology ConfigMaps; serving the nodes read so far"


class NodesExporter(ServedNodes):
    def __init__(
        self,
        options: dcgm.Options,
        published: Published,
        clock: Callable[[], float] | None = None,
        node_selector: str | None = None,
        shard: Shard | None = None,
        autoshard: str | None = None,
    ) -> None:
        """`node_selector`: only the nodes `select` names are served, once it has named them;
        `shard`: of those, the ones whose name hashes to it; `autoshard`: what will say the
        shard count (`reshard`), nothing served until it has."""
        first = {_START: "no topology yet"}
        if node_selector:
            first[NODES] = f"Nodes -l {node_selector}: not listed yet"
        # --node-selector's nodes (the last good list's); None: every node. Nothing selected until
        # the Nodes are listed, so a real node is never served while they cannot be.
        selected: set[str] | None = set() if node_selector else None
        if autoshard is not None:
            first[SHARDS] = f"{autoshard}: the shard count is not read yet"
        super().__init__(options, published, Health(first), clock, selected, shard)
        self._sharding = first.get(SHARDS)  # none served until the shard count is read
        self._listed = node_selector is None  # whether `_selected` came from a Node list
        self._sources: dict[str, set[str]] = {}  # source -> the nodes it holds
        # While the first list of the sources is read: (sources listed, read so far, since).
        self._reading: tuple[int, int, float] | None = None
        self._read_once = False  # a list was read whole: later ones are news to nobody
        # Sources whose one node another shard serves: left unread, with how to read them should
        # a new shard count make the node this one's (source -> (node, read)).
        self._unread: dict[str, tuple[str, Callable[[int], None]]] = {}
        # source -> the last event it had: a read of an older one that comes late is dropped.
        self._events: dict[str, int] = {}

    # --- sources in (watch threads) --------------------------------------------------------------

    @property
    def sink(self) -> NodesExporter:
        """What its sources feed: the exporter itself (a one-node exporter's is its `OneNode`)."""
        return self

    def update(self, topology: Topology, obj: str) -> None:
        """A whole document (a file, or the single layout's ConfigMap): every node in it."""
        self.update_source(obj, topology, obj)
        self.problem(None)

    def reading(self, total: int) -> None:
        """The first list of the sources is about to be read, `total` of them. Each is served as
        soon as it is read, and `/health` says how many are (503) until `problem(None)` says the
        list is read. A later list (a watch's relist) serves what it served and says nothing."""
        with self._lock:
            if self._read_once:
                return
            self._reading = (total, 0, time.monotonic())
            self.health.set(READING, _progress(0, total), quiet=True)
        log.info("reading %d topology ConfigMaps", total)

    def _read_one(self) -> None:
        """A source of the first list was read (under `_lock`)."""
        if self._reading is not None:
            total, done, since = self._reading
            self._reading = (total, done + 1, since)
            self.health.set(READING, _progress(done + 1, total), quiet=True)

    def owns(self, node: str) -> bool:
        """Whether `node` is this shard's, as far as is known: while the shard count is not
        read, every node may be."""
        with self._lock:
            return self._owns(node)

    def _owns(self, node: str) -> bool:
        return self._sharding is not None or self.shard is None or self.shard.owns(node)

    def unread(self, source: str, node: str, read: Callable[[int], None]) -> None:
        """A source whose one node another shard serves: neither read nor kept as read (a
        quarter of the memory for a quarter of the nodes); `read(event)` reads it should a new
        shard count make the node this one's."""
        with self._lock:
            self._read_one()
            self._event(source)
            for name in self._sources.pop(source, set()):
                self._forget(name)
            self.health.clear(source)
            self._unread[source] = (node, read)
        self.wake.set()

    def _event(self, source: str) -> None:
        self._events[source] = self._events.get(source, 0) + 1

    def _arrived(self, source: str, after: int | None) -> bool:
        """A source was read (under `_lock`): False if this is a late read (of the source as it
        was at event `after`) that a newer event overtook, to be dropped."""
        if after is not None and self._events.get(source) != after:
            return False
        self._event(source)
        self._unread.pop(source, None)
        self._read_one()
        return True

    def update_source(
        self, source: str, topology: Topology, obj: str, after: int | None = None
    ) -> None:
        """`after`: this is a late read of the source as it was at that event (see `unread`)."""
        with self._lock:
            if not self._arrived(source, after):
                return
            before = self._sources.get(source, set())
            # A node whose entry is bad stays (with its last good series): it is not gone.
            named = set(topology.nodes) | set(topology.invalid)
            self._sources[source] = named
            self.health.clear(source)
            self.health.uncount(source)  # good again: its next problem is news
            self.health.clear(_START)
            for name in before - named:
                self._forget(name)
            for name in sorted(named):
                try:
                    node = node_of(topology, name, obj)
                except TopologyError as e:
                    reason = f"{e}; serving its last good series"
                    # Said when the entry's problem is news, not each time its source is resent.
                    if self.health.count(name, TopologyError(f"node {name}", e.field, e.message)):
                        log.warning("%s", reason)
                    self.health.set(source, reason, quiet=True)
                    continue
                self.health.uncount(name)
                if node is not None:
                    self._put(name, node)
        self.wake.set()

    def source_problem(
        self, source: str, reason: str, invalid: TopologyError | None = None,
        after: int | None = None,
    ) -> None:  # fmt: skip
        with self._lock:
            if not self._arrived(source, after):
                return
            self.health.set(source, reason)
            if invalid is not None:
                self.health.count(source, invalid)
        self.wake.set()

    def rejected(self, source: str, e: TopologyError) -> None:
        """The one document (a file, the single layout's ConfigMap) is invalid."""
        self.source_problem(source, f"{e}; serving the last good series", e)

    def remove_source(self, source: str) -> None:
        with self._lock:
            self._events.pop(source, None)
            self._unread.pop(source, None)
            for name in self._sources.pop(source, set()):
                self._forget(name)
            self.health.clear(source)
        self.wake.set()

    def keep_sources(self, sources: set[str]) -> None:
        """After a fresh list: sources that are not in it are gone."""
        with self._lock:
            known = set(self._sources) | set(self._unread)
        for source in known - sources:
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
            listed = f"the Nodes are listed: serving the {len(names or ())} selected"
            self.health.clear(NODES, listed)
        self.wake.set()

    def reshard(
        self, shard: Shard | None, reason: str | None = None, unsharded: str | None = None
    ) -> None:
        """The shard count was read (its StatefulSet's replicas): serve `shard`'s nodes; None
        with the `reason` none is served (an ordinal past the replicas: a pod going away), None
        without one every node is (`unsharded` says why, once)."""
        with self._lock:
            if shard == self.shard and reason == self._sharding:
                return
            self.shard, self._sharding = shard, reason
            self._dirty |= set(self._nodes) | set(self._series)
            if reason is None:
                self.health.clear(SHARDS)
                if shard is not None:
                    log.info("serving shard %d of %d", shard.ordinal, shard.total)
                elif unsharded is not None:
                    log.info("%s", unsharded)
            else:
                self.health.set(SHARDS, reason)
            # Nodes this shard now serves that it left unread: read now, unless overtaken.
            mine = [(read, self._events.get(source, 0))
                    for source, (node, read) in self._unread.items() if self._owns(node)]  # fmt: skip
        self.wake.set()
        for read, event in mine:
            read(event)

    def shard_count_unread(self, reason: str | None) -> None:
        """Reading the shard count failed (None: it reads again): the last count is kept."""
        with self._lock:
            if reason is None:
                self.health.clear(SHARDS_WATCH)
            else:
                self.health.set(SHARDS_WATCH, f"{reason}; keeping the shard count")
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
                self.health.clear(key)
                self.health.clear(_START)  # listed: an empty namespace is a good state
                if key == CONFIGMAPS:
                    self._list_read()
            else:
                self.health.set(key, reason)
        self.wake.set()

    def _list_read(self) -> None:
        """The sources' list is read whole (under `_lock`)."""
        self._read_once = True
        if self._reading is not None:
            total, _, since = self._reading
            self._reading = None
            took = time.monotonic() - since
            self.health.clear(READING, f"read {total} topology ConfigMaps in {took:.1f} s")

    def _forget(self, name: str) -> None:
        # Still listed by another source (a node moved between documents): keep it.
        if not any(name in nodes for nodes in self._sources.values()):
            self._nodes.pop(name, None)
            self._dirty.add(name)

    def _ready(self) -> bool:
        # A source was read: its nodes (maybe none) are true; with a node selector, the Nodes
        # were listed too: before, nothing is selected, and an empty body would be a lie.
        return not self.health.has(_START) and self._listed and self._sharding is None

    def _complete(self) -> bool:
        return self._reading is None
