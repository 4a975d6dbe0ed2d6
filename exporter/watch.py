"""Live source: the topology ConfigMap, watched on the API server.

Event-driven: a change reaches `/metrics` as soon as the watch delivers it. A missing or invalid
ConfigMap, or an unreachable API, keeps the last good topology and turns `/health` to 503.
"""

from __future__ import annotations

import threading

import kubernetes

from exporter.service import Exporter
from exporter.source import configmap_topology
from status_updater.configmap import configmap_name, configmap_namespace
from status_updater.kube import Obj, list_watch
from topology.errors import TopologyError


def watch_configmap(
    exporter: Exporter, stop: threading.Event, client: kubernetes.client.ApiClient
) -> None:
    name, namespace = configmap_name(), configmap_namespace()
    obj = f"ConfigMap {namespace}/{name}"
    core = kubernetes.client.CoreV1Api(client)

    def apply(cm: Obj | None) -> None:
        if cm is None:
            exporter.problem(f"{obj}: not found; serving the last good topology")
            return
        try:
            exporter.update(configmap_topology(cm, obj), obj)
        except TopologyError as e:
            exporter.problem(f"{e}; serving the last good topology")

    def mine(cm: Obj) -> bool:
        # The field selector narrows the watch on a real API server; emulators may ignore it.
        return (cm.get("metadata") or {}).get("name") == name

    def on_reset(items: list[Obj]) -> None:
        apply(next((cm for cm in items if mine(cm)), None))

    def on_event(kind: str, cm: Obj) -> None:
        if mine(cm):
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
