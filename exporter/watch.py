"""Live source: topology ConfigMaps, watched on the API server.

Event-driven: a change reaches `/metrics` as soon as the watch delivers it. A missing or invalid
ConfigMap, or an unreachable API, keeps the last good topology and turns `/health` to 503.
"""

from __future__ import annotations

import threading

import kubernetes

from exporter.many import NodesExporter
from exporter.service import Sink
from kube.api import Obj, list_watch
from topology import configmap as contract
from topology.errors import TopologyError


def _name(cm: Obj) -> str:
    return str((cm.get("metadata") or {}).get("name"))


def watch_configmap(
    exporter: Sink, stop: threading.Event, client: kubernetes.client.ApiClient, name: str,
    namespace: str,
) -> None:  # fmt: skip
    """One ConfigMap, by name: the node's own `topology-<node>`, or the single `topology`."""
    obj = f"ConfigMap {namespace}/{name}"
    core = kubernetes.client.CoreV1Api(client)

    def apply(cm: Obj | None) -> None:
        if cm is None:
            exporter.problem(f"{obj}: not found; serving the last good topology")
            return
        try:
            exporter.update(contract.configmap_topology(cm, obj), obj)
        except TopologyError as e:
            exporter.rejected(e)

    # The field selector narrows the watch on a real API server; emulators may ignore it.
    def on_reset(items: list[Obj]) -> None:
        apply(next((cm for cm in items if _name(cm) == name), None))

    def on_event(kind: str, cm: Obj) -> None:
        if _name(cm) == name:
            apply(None if kind == "DELETED" else cm)

    list_watch(
        obj,
        lambda **kw: core.list_namespaced_config_map(namespace, **kw),
        on_reset,
        on_event,
        stop,
        on_error=exporter.problem,
        field_selector=f"metadata.name={name}",
    )


def watch_node_configmaps(
    exporter: NodesExporter, stop: threading.Event, client: kubernetes.client.ApiClient,
    namespace: str,
) -> None:  # fmt: skip
    """Every per-node topology ConfigMap (label `node-topology: "true"`) in the namespace."""
    core = kubernetes.client.CoreV1Api(client)

    def ours(cm: Obj) -> bool:  # emulators may ignore the label selector
        labels = (cm.get("metadata") or {}).get("labels") or {}
        return bool(labels.get(contract.LABEL_NODE_TOPOLOGY) == "true")

    def apply(cm: Obj) -> None:
        name = _name(cm)
        obj = f"ConfigMap {namespace}/{name}"
        try:
            exporter.update_source(name, contract.configmap_topology(cm, obj), obj)
        except TopologyError as e:
            exporter.source_problem(name, f"{e}; serving its last good topology", e)

    def on_reset(items: list[Obj]) -> None:
        mine = [cm for cm in items if ours(cm)]
        exporter.keep_sources({_name(cm) for cm in mine})
        for cm in mine:
            apply(cm)
        exporter.problem(None)

    def on_event(kind: str, cm: Obj) -> None:
        if kind == "DELETED":
            exporter.remove_source(_name(cm))
        elif ours(cm):
            apply(cm)
        else:
            exporter.remove_source(_name(cm))  # its label was taken off

    list_watch(
        f"ConfigMaps {namespace} -l {contract.PER_NODE_SELECTOR}",
        lambda **kw: core.list_namespaced_config_map(namespace, **kw),
        on_reset,
        on_event,
        stop,
        on_error=exporter.problem,
        label_selector=contract.PER_NODE_SELECTOR,
    )


def watch_selected_nodes(
    exporter: NodesExporter, stop: threading.Event, client: kubernetes.client.ApiClient,
    selector: str,
) -> None:  # fmt: skip
    """The names of the Nodes matching `--node-selector`: only their series are served."""
    core = kubernetes.client.CoreV1Api(client)
    names: set[str] = set()

    def on_reset(items: list[Obj]) -> None:
        names.clear()
        names.update(_name(n) for n in items)
        exporter.select(set(names))

    def on_event(kind: str, node: Obj) -> None:
        (names.discard if kind == "DELETED" else names.add)(_name(node))
        exporter.select(set(names))

    list_watch(
        f"Nodes -l {selector}",
        core.list_node,
        on_reset,
        on_event,
        stop,
        # Its own problem key: the ConfigMaps listing again must not clear it (nor it theirs).
        on_error=exporter.selection_failed,
        label_selector=selector,
    )
