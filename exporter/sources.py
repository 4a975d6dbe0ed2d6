"""Every way a topology reaches an exporter: a file followed on disk, one ConfigMap watched (the
node's own `topology-<node>`, or the single `topology`), the per-node ConfigMaps watched (and the
Nodes `--node-selector` names), for `--all-nodes`.

Each feeds a sink: whole documents to a `Sink` (every exporter), per-node ConfigMaps and the
selection to a `NodesExporter` (`--all-nodes`). Event-driven: a change reaches `/metrics` as soon as
the file's change is seen or the watch delivers it. A missing or invalid document, or an
unreachable API, keeps the last good topology and turns `/health` to 503.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import kubernetes

from exporter.many import NodesExporter
from exporter.shards import Shard, ordinal
from mig_exporter.common.files import UnreadableFile, read_text
from mig_exporter.kube.api import (
    REQUEST_TIMEOUT,
    Backoff,
    Obj,
    describe,
    failure_kind,
    list_watch,
    watch_named,
)
from topology import configmap as contract
from topology.configmap import node_configmap_name, parse_document
from topology.errors import TopologyError
from topology.model import Topology
from topology.settings import topology_name, topology_namespace

# `render --layout per-node` for 5,000 busy 8-GPU nodes is about 70 MiB: room for that, and a
# bound on what a wrong path (a log, a device) can make the exporter hold.
MAX_TOPOLOGY_FILE_BYTES = 256 << 20


class Sink(Protocol):
    """What every exporter takes: whole documents, and why there is none. A source names itself
    (`source`: a file's or a ConfigMap's description) in each call, so that what it reports is
    filed under its own key, never under one taken from an error's text: its next good document
    clears it."""

    def update(self, topology: Topology, source: str) -> None: ...

    def problem(self, reason: str) -> None: ...

    def rejected(self, source: str, e: TopologyError) -> None: ...

    def owns(self, node: str) -> bool:
        """Whether the node is this exporter's to read: a shard's ConfigMaps of other nodes in a
        List are left unread."""
        ...


# --- a file --------------------------------------------------------------------------------------


def file_obj(path: Path) -> str:
    """How a topology file is named in errors, and the source it is to a sink."""
    return f"topology file {path}"


def read_topology_file(path: Path, wanted: Callable[[str], bool] | None = None) -> Topology:
    """`wanted`: a shard's; the ConfigMaps of other nodes in a List are left unread."""
    obj = file_obj(path)
    try:
        text = read_text(path, MAX_TOPOLOGY_FILE_BYTES)
    except UnreadableFile as e:
        raise TopologyError(obj, "topology", str(e)) from None
    return parse_document(text, obj, wanted)


Stamp = tuple[int, ...]


def _stamp(path: Path) -> Stamp | None:
    """What says the file changed (None: it is not there): which file the path leads to (its
    device and inode: a file put in its place by a rename, a ConfigMap volume's new `..data`),
    its size and modification time, and its inode's change time, which no one can set back (a
    file rewritten in place, its modification time restored)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


_UNSEEN: Stamp = ()  # no file has this stamp: the first look reads it


def follow_file(
    path: Path, exporter: Sink, stop: threading.Event, interval: float = 1.0,
    seen: Stamp | None = _UNSEEN,
) -> None:  # fmt: skip
    """Reload when the file changes: a ConfigMap mounted as a volume is updated in place.
    `seen`: the stamp of the file as last read."""
    source = file_obj(path)
    while not stop.is_set():
        current = _stamp(path)
        if current != seen:
            seen = current
            try:
                exporter.update(read_topology_file(path, exporter.owns), source)
            except TopologyError as e:
                exporter.rejected(source, e)
        stop.wait(interval)


def file_source(path: Path, exporter: Sink, stop: threading.Event) -> threading.Thread:
    """The thread that follows `path`, after a first read: TopologyError if that fails, as the
    file is then unusable input; later failures keep the last good state. The thread starts
    from the stamp taken before that read: it reads the file again only if it changed since
    (5,000 nodes' file takes seconds to read)."""
    seen = _stamp(path)
    exporter.update(read_topology_file(path, exporter.owns), file_obj(path))
    return threading.Thread(target=follow_file, args=(path, exporter, stop, 1.0, seen),
                            daemon=True)  # fmt: skip


# --- the API server ------------------------------------------------------------------------------


def node_watches(
    exporter: Sink, stop: threading.Event, client: kubernetes.client.ApiClient, layout: str,
    node_name: str,
) -> list[threading.Thread]:  # fmt: skip
    """The watch that feeds one node's exporter: its own ConfigMap, or the single layout's."""
    name = topology_name() if layout == "single" else node_configmap_name(node_name)
    return [threading.Thread(target=watch_configmap,
                             args=(exporter, stop, client, name, topology_namespace()),
                             daemon=True)]  # fmt: skip


def nodes_watches(
    many: NodesExporter, stop: threading.Event, client: kubernetes.client.ApiClient, layout: str,
    node_selector: str | None,
) -> list[threading.Thread]:  # fmt: skip
    """The watches that feed `--all-nodes`: every per-node ConfigMap (or the single layout's
    ConfigMap, every node), and the Nodes `--node-selector` names."""
    namespace = topology_namespace()
    if layout == "per-node":
        target: Callable[..., None] = watch_node_configmaps
        args: tuple[Any, ...] = (many, stop, client, namespace)
    else:
        target, args = watch_configmap, (many, stop, client, topology_name(), namespace)
    threads = [threading.Thread(target=target, args=args, daemon=True)]
    if node_selector:
        threads.append(threading.Thread(
            target=watch_selected_nodes, args=(many, stop, client, node_selector), daemon=True,
        ))  # fmt: skip
    return threads


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
            exporter.rejected(obj, e)

    def list_call(**kw: Any) -> Any:
        return core.list_namespaced_config_map(namespace, **kw)

    watch_named(obj, list_call, name, apply, stop, on_error=exporter.problem)


def watch_node_configmaps(
    exporter: NodesExporter, stop: threading.Event, client: kubernetes.client.ApiClient,
    namespace: str,
) -> None:  # fmt: skip
    """Every per-node topology ConfigMap (label `node-topology: "true"`) in the namespace."""
    core = kubernetes.client.CoreV1Api(client)

    def ours(cm: Obj) -> bool:  # emulators may ignore the label selector
        labels = (cm.get("metadata") or {}).get("labels") or {}
        return bool(labels.get(contract.LABEL_NODE_TOPOLOGY) == "true")

    def apply(cm: Obj, after: int | None = None) -> None:
        name = _name(cm)
        obj = f"ConfigMap {namespace}/{name}"
        node = contract.configmap_node(cm)  # its first lines: not read if another shard's
        if node is not None and not exporter.owns(node):
            exporter.unread(name, node, lambda event: apply(cm, event))
            return
        try:
            exporter.update_source(name, contract.configmap_topology(cm, obj), obj, after)
        except TopologyError as e:
            exporter.source_problem(name, f"{e}; serving its last good topology", e, after)

    def on_reset(items: list[Obj]) -> None:
        mine = [cm for cm in items if ours(cm)]
        exporter.keep_sources({_name(cm) for cm in mine})
        exporter.reading(len(mine))
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


def watch_own_statefulset(
    exporter: NodesExporter, stop: threading.Event, client: kubernetes.client.ApiClient,
    pod: str, namespace: str, required: bool = True,
) -> None:  # fmt: skip
    """Autosharding, as kube-state-metrics': this pod's StatefulSet's replicas are the shard
    count, the ordinal its name ends with its shard, followed as the StatefulSet is scaled.
    `required`: asked for by flag; otherwise (the platform named the pod) a pod no StatefulSet
    owns, or one this exporter may not read, serves every node."""
    number = ordinal(pod)
    assert number is not None  # checked with the flags
    owner = _statefulset_of(exporter, stop, client, pod, namespace, required)
    if owner is None:
        return
    apps = kubernetes.client.AppsV1Api(client)
    what = f"StatefulSet {namespace}/{owner}"

    def apply(sts: Obj | None) -> None:
        if sts is None:
            exporter.reshard(None, f"{what}: not found; serving no node")
            return
        replicas = (sts.get("spec") or {}).get("replicas", 1)
        if type(replicas) is not int or not 0 < number + 1 <= replicas:
            reason = (
                f"{what} has {replicas} replicas, this pod is ordinal {number}: serving no node"
            )
            exporter.reshard(None, reason)
        else:
            exporter.reshard(Shard(number, replicas))

    def list_call(**kw: Any) -> Any:
        return apps.list_namespaced_stateful_set(namespace, **kw)

    watch_named(what, list_call, owner, apply, stop, on_error=exporter.shard_count_unread,
                on_list=lambda: exporter.shard_count_unread(None))  # fmt: skip


# Answers that say the pod cannot be read now or later, by status code: not there, or not ours.
_NOT_READABLE = (401, 403, 404)


def _statefulset_of(
    exporter: NodesExporter, stop: threading.Event, client: kubernetes.client.ApiClient,
    pod: str, namespace: str, required: bool,
) -> str | None:  # fmt: skip
    """The StatefulSet that owns the pod, read until the API answers; None when it has none."""
    core = kubernetes.client.CoreV1Api(client)
    backoff = Backoff()
    what = f"pod {namespace}/{pod}"
    while not stop.is_set():
        try:
            found = core.read_namespaced_pod(pod, namespace, _preload_content=False,
                                             _request_timeout=REQUEST_TIMEOUT)  # fmt: skip
            meta = json.loads(cast(Any, found).data).get("metadata") or {}
        except Exception as e:  # the API is not there yet: try again
            if not required and failure_kind(e) in _NOT_READABLE:
                exporter.shard_count_unread(None)
                exporter.reshard(
                    None, None, f"not sharding: {what}: {describe(e)}; serving every node"
                )
                return None
            exporter.shard_count_unread(f"{what}: {describe(e)}")
            backoff.wait(stop)
            continue
        exporter.shard_count_unread(None)
        for ref in meta.get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("kind") == "StatefulSet":
                return str(ref.get("name"))
        if required:
            exporter.reshard(None, f"{what} is no StatefulSet's: give --total-shards")
        else:
            exporter.reshard(
                None, None, f"not sharding: {what} is no StatefulSet's; serving every node"
            )
        return None
    return None
