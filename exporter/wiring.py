"""How the exporter runs once its settings are known (`Settings`, built by cli.py): each mode's
wiring (`MODES`: what renders and what it serves as), what feeds it its topology (`_sources`:
the file or the cluster's watches), `serve` and `--once`."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

from exporter import dcgm, nvml
from exporter.collector import NvmlExporter
from exporter.many import NodesExporter
from exporter.node import missing_node, node_of
from exporter.runtime import Runtime
from exporter.service import Exporter
from exporter.shards import Shard
from exporter.sources import (
    file_obj,
    file_source,
    node_watches,
    nodes_watches,
    read_topology_file,
    watch_own_statefulset,
)
from mig_exporter.web.config import load
from mig_exporter.web.listen import host_port
from mig_exporter.web.server import MetricsServer, Published
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
log = logging.getLogger("exporter")


@dataclass(frozen=True)
class Autoshard:
    """Sharding by the pod's StatefulSet (kube-state-metrics' autosharding): asked for with
    `--pod`, or found, when the platform's downward API names the pod (POD_NAME, POD_NAMESPACE),
    by looking the pod's owner up. `required`: asked for, so a pod no StatefulSet owns serves no
    node; found: it serves every node, said once."""

    pod: str
    namespace: str
    required: bool


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the exporter runs by, built once from its flags and environment (`settings`),
    after RULES and FEATURES have held."""

    mode: Literal["node", "all-nodes", "nvml"]
    options: dcgm.Options
    node_name: str  # "": none (--all-nodes; --source nvml without a topology)
    topology_file: Path | None
    watch_topology: bool  # nvml: the node's topology from the cluster
    once: bool
    kubeconfig: str | None
    layout: str
    node_selector: str | None
    shard: Shard | None
    autoshard: Autoshard | None
    address: str | None
    port: int
    web_config_file: Path | None
    collect_interval_s: float
    runtime: Runtime | None  # --enable-exporter-metrics


def _once(settings: Settings) -> int:
    """--once: the topology file's series on stdout."""
    if settings.mode == "nvml":
        return _nvml_once(settings)
    path, options, shard = settings.topology_file, settings.options, settings.shard
    assert path is not None  # a RULE: --once needs --topology-file
    obj = file_obj(path)
    # A shard leaves other nodes' ConfigMaps unread, as it does serving.
    topology = read_topology_file(path, shard.owns if shard is not None else None)
    if settings.mode == "all-nodes":
        # As `render` does: a bad node is one warning, and every other node is printed.
        good = {}
        for name in sorted(topology.nodes.keys() | topology.invalid.keys()):
            try:
                good[name] = _node_in(topology, name, obj)
            except TopologyError as e:
                print(f"warning: {e}", file=sys.stderr)
        many = NodesExporter(options, Published(), shard=shard)
        many.update(Topology(topology.mig_strategy, good), obj)
        sys.stdout.buffer.write(many.snapshot().body)
        return EXIT_OK
    node = _node_in(topology, settings.node_name, obj)
    sys.stdout.buffer.write(dcgm.render(node, options, time.time()))
    return EXIT_OK


def _node_in(topology: Topology, node_name: str, obj: str) -> NodeTopology:
    """The node's checked entry; TopologyError when it is bad or not there."""
    node = node_of(topology, node_name, obj)
    if node is None:
        raise missing_node(topology, node_name, obj)
    return node


def _attribution(settings: Settings) -> NodeTopology | None:
    """--source nvml --once: the node whose pods name the GPUs, from --topology-file if given."""
    if settings.topology_file is None:
        return None
    obj = file_obj(settings.topology_file)
    return _node_in(read_topology_file(settings.topology_file), settings.node_name, obj)


def _nvml_once(settings: Settings) -> int:
    node = _attribution(settings)
    nv = nvml.open_nvml()
    try:
        sample = nvml.collect(nv)
    except nvml.CollectionFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        _shutdown(nv)
    sys.stdout.buffer.write(nvml.render(sample, settings.options, node))
    return EXIT_OK


def _shutdown(nv: ModuleType) -> None:
    try:
        nv.nvmlShutdown()
    except nv.NVMLError as e:  # nothing left to do about it
        log.debug("nvmlShutdown: %s", e)


# How long a thread may hold the interpreter while another waits for it. A scrape's thread waits
# at each system call while the render loop computes a step: at Python's 5 ms, pages of 5,000
# nodes scraped 133 times a second took 145 ms at p99; at 0.5 ms, 20 ms (bench/many.py).
SWITCH_INTERVAL_S = 0.0005


@dataclass
class Wired:
    """What one mode of the exporter is made of: what renders, what it serves as, and (the
    many-nodes one) what the cluster's watches feed; NVML's handle, to close at the end."""

    exporter: Exporter | NodesExporter | NvmlExporter
    what: str  # for the log: what is served
    many: NodesExporter | None = None
    nv: ModuleType | None = None


def _nvml(settings: Settings, published: Published) -> Wired:
    nv = nvml.open_nvml()  # no NVML, no GPU: said before anything listens
    exporter = NvmlExporter(nv, settings.options, published, settings.collect_interval_s,
                            settings.node_name or None)  # fmt: skip
    return Wired(exporter, "this machine's GPUs through NVML", nv=nv)


def _all_nodes(settings: Settings, published: Published) -> Wired:
    found = settings.autoshard
    many = NodesExporter(
        settings.options, published, node_selector=settings.node_selector, shard=settings.shard,
        autoshard=f"StatefulSet of pod {found.namespace}/{found.pod}" if found else None,
    )  # fmt: skip
    return Wired(many, "every node", many=many)


def _one_node(settings: Settings, published: Published) -> Wired:
    node = settings.node_name
    return Wired(Exporter(node, settings.options, published), f"node {node}")


# Each mode's wiring: what `serve` builds for it.
MODES: dict[str, Callable[[Settings, Published], Wired]] = {
    "nvml": _nvml, "all-nodes": _all_nodes, "node": _one_node,
}  # fmt: skip


def _sources(
    settings: Settings, wired: Wired, stop: threading.Event
) -> list[threading.Thread] | str:
    """What feeds the exporter its topology: the file, or the cluster's watches (none for NVML
    without --watch-topology); or why the cluster cannot be reached, in one line. The client
    (and the kubernetes package) is loaded only for the cluster."""
    sink = wired.exporter.sink
    if settings.topology_file is not None:
        return [file_source(settings.topology_file, sink, stop)]
    if settings.mode == "nvml" and not settings.watch_topology:
        return []
    from mig_exporter.kube.api import ConfigError, api_client

    try:
        client = api_client(settings.kubeconfig)
    except ConfigError as e:
        return str(e)
    if wired.many is None:
        return node_watches(sink, stop, client, settings.layout, settings.node_name)
    sources = nodes_watches(wired.many, stop, client, settings.layout, settings.node_selector)
    if (found := settings.autoshard) is not None:
        sources.append(threading.Thread(
            target=watch_own_statefulset,
            args=(wired.many, stop, client, found.pod, found.namespace, found.required),
            daemon=True,
        ))  # fmt: skip
    return sources


def serve(settings: Settings) -> int:
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # First: a web config that cannot be used must stop the exporter before it serves anything,
    # not leave it serving in the clear.
    web = load(settings.web_config_file) if settings.web_config_file is not None else None
    stop = threading.Event()
    published = Published()
    wired = MODES[settings.mode](settings, published)

    def shutdown(*_: object) -> None:
        stop.set()
        wired.exporter.wake.set()  # the render loop sleeps on it between utilization steps

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, shutdown)
    sources = _sources(settings, wired, stop)
    if isinstance(sources, str):
        print(f"error: {sources}", file=sys.stderr)
        return EXIT_USAGE
    try:
        server = MetricsServer(published, settings.address, settings.port, web,
                               runtime=settings.runtime)  # fmt: skip
    except OSError as e:
        where = host_port(settings.address, settings.port)
        print(f"error: cannot listen on {where}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    server.start()
    for source in sources:
        source.start()
    log.info("serving %s on %s", wired.what, server.url("/metrics"))
    wired.exporter.run(stop, sources)
    server.stop()
    if wired.nv is not None:
        _shutdown(wired.nv)
    return EXIT_OK
