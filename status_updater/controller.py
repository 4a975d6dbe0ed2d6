"""`python -m status_updater run`: keeps the topology ConfigMap true as the cluster changes.

Informers feed Node and Pod events into caches; a writer thread runs the same pure `reconcile`
that `render` runs, and writes the ConfigMap only when the result changed, coalescing bursts.
Nothing is written before both caches are listed (an empty pod cache would release every
allocation), and only the Lease holder writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from status_updater.configmap import DATA_KEY, topology_configmap
from status_updater.kube import REQUEST_TIMEOUT, Backoff, Obj, describe, list_watch
from status_updater.reconcile import reconcile
from topology.errors import TopologyError
from topology.model import Topology, dump_yaml, load_yaml

log = logging.getLogger(__name__)
COALESCE_S = 0.2  # a storm of pod events within this window gives one write
RESYNC_S = 30.0  # how often a quiet leader re-reads the ConfigMap it owns
CONFIGMAP_LIMIT = 1024 * 1024  # bytes of data a ConfigMap may hold


class TooLarge(Exception):
    """The topology does not fit one ConfigMap."""


def slim_node(node: Obj) -> Obj:
    """What reconcile reads of a Node; the rest (images, conditions) is not kept in memory."""
    meta = node.get("metadata") or {}
    return {"kind": "Node", "metadata": {k: meta.get(k) for k in ("name", "labels", "annotations")}}


def slim_pod(pod: Obj) -> Obj:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    containers = [
        {"name": c.get("name"), "resources": c.get("resources") or {}}
        for c in spec.get("containers") or []
        if isinstance(c, dict)
    ]
    keep = ("name", "namespace", "uid", "labels", "annotations", "creationTimestamp")
    return {
        "kind": "Pod",
        "metadata": {k: meta.get(k) for k in keep},
        "spec": {"nodeName": spec.get("nodeName"), "containers": containers},
        "status": {"phase": (pod.get("status") or {}).get("phase")},
    }


def _pod_key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def _node_key(node: Obj) -> str:
    return str((node.get("metadata") or {}).get("name"))


@dataclass
class _Cache:
    """One informer's objects, slimmed, by key; `synced` once the first list has arrived."""

    slim: Callable[[Obj], Obj]
    key: Callable[[Obj], str]
    items: dict[str, Obj] = field(default_factory=dict)
    synced: bool = False


class Controller:
    def __init__(
        self,
        core: kubernetes.client.CoreV1Api,
        name: str,
        namespace: str,
        is_leader: Callable[[], bool] = lambda: True,
        resync_s: float = RESYNC_S,
    ) -> None:
        self.core, self.name, self.namespace, self.is_leader = core, name, namespace, is_leader
        self.resync_s = resync_s
        self.nodes = _Cache(slim_node, _node_key)
        self.pods = _Cache(slim_pod, _pod_key)
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.written: Topology | None = None  # what the ConfigMap holds, as far as we know
        self._warned: set[str] = set()

    # --- informer callbacks ---------------------------------------------------------------------

    def _reset(self, cache: _Cache, items: list[Obj]) -> None:
        with self.lock:
            cache.items = {cache.key(o): cache.slim(o) for o in items}
            cache.synced = True
        self.dirty.set()

    def _event(self, cache: _Cache, kind: str, obj: Obj) -> None:
        with self.lock:
            if kind == "DELETED":
                cache.items.pop(cache.key(obj), None)
            else:
                cache.items[cache.key(obj)] = cache.slim(obj)
        self.dirty.set()

    @property
    def synced(self) -> bool:
        return self.nodes.synced and self.pods.synced

    def informers(self, stop: threading.Event) -> list[threading.Thread]:
        sources = (
            ("nodes", self.core.list_node, self.nodes),
            ("pods", self.core.list_pod_for_all_namespaces, self.pods),
        )
        return [
            threading.Thread(
                target=list_watch,
                name=what,
                daemon=True,
                args=(
                    what,
                    list_call,
                    lambda items, c=cache: self._reset(c, items),
                    lambda kind, o, c=cache: self._event(c, kind, o),
                    stop,
                ),
            )
            for what, list_call, cache in sources
        ]

    # --- the writer -----------------------------------------------------------------------------

    def desired(self) -> Topology:
        with self.lock:
            nodes, pods = list(self.nodes.items.values()), list(self.pods.items.values())
        topology, warnings = reconcile(nodes, pods, previous=self.written)
        messages = {str(w) for w in warnings}
        for m in sorted(messages - self._warned):
            log.warning("%s", m)
        self._warned = messages
        return topology

    def read_current(self) -> tuple[bool, Topology | None, str | None]:
        """Whether the ConfigMap exists, its topology (None if invalid) and resourceVersion."""
        try:
            cm = self.core.read_namespaced_config_map(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status == 404:
                return False, None, None
            raise
        version = cm.metadata.resource_version if cm.metadata else None
        text = (cm.data or {}).get(DATA_KEY)
        try:
            return True, (load_yaml(text) if text else None), version
        except TopologyError as e:
            log.warning(
                "ConfigMap %s/%s holds an invalid topology, replacing it: %s",
                self.namespace,
                self.name,
                e,
            )
            return True, None, version

    def write(
        self, topology: Topology, read: tuple[bool, Topology | None, str | None] | None = None
    ) -> None:
        """Create or patch (never PUT) the ConfigMap; a 409 re-reads and applies again.

        `read` is a `read_current()` the caller has just made, used for the first attempt.
        """
        text = dump_yaml(topology)
        size = len(text.encode())
        if size > CONFIGMAP_LIMIT:
            # The API server would refuse it (and keep refusing): say why, keep the last write.
            raise TooLarge(
                f"ConfigMap {self.namespace}/{self.name}: topology.yml for {len(topology.nodes)} nodes is "
                f"{size / 2**20:.1f} MiB, over the 1 MiB a ConfigMap holds; not written"
            )
        for _ in range(5):
            exists, current, version = read or self.read_current()
            read = None
            if current == topology:
                self.written = topology
                return
            try:
                if not exists:
                    body = topology_configmap(text, self.name, self.namespace)
                    self.core.create_namespaced_config_map(
                        self.namespace, cast(Any, body), _request_timeout=REQUEST_TIMEOUT
                    )
                else:
                    patch: dict[str, Any] = {"data": {DATA_KEY: text}}
                    if version and version != "...":
                        # The API answers 409 if the ConfigMap moved since it was read.
                        patch["metadata"] = {"resourceVersion": version}
                    self.core.patch_namespaced_config_map(
                        self.name, self.namespace, patch, _request_timeout=REQUEST_TIMEOUT
                    )
            except ApiException as e:
                if e.status == 409:
                    continue  # someone wrote in between (or created it): read again, apply again
                raise
            self.written = topology
            log.info(
                "wrote ConfigMap %s/%s (%d nodes)", self.namespace, self.name, len(topology.nodes)
            )
            return
        raise ApiException(status=409, reason="conflict persisted after 5 attempts")

    def became_leader(self, leading: bool) -> None:
        if leading:
            self.written = None  # the old leader may have written since: re-read before trusting
            self.dirty.set()

    def run_writer(self, stop: threading.Event) -> None:
        backoff = Backoff()
        last_check = time.monotonic()
        verify = False
        while not stop.is_set():
            if not self.synced or not self.is_leader():
                stop.wait(0.2)  # changes wait (dirty stays set) until synced and leading
                continue
            if not self.dirty.wait(1.0):
                if time.monotonic() - last_check > self.resync_s:
                    # Someone else may have written the ConfigMap (a re-applied seed): check it.
                    verify = True
                    self.dirty.set()
                continue
            if stop.is_set():
                return
            last_check = time.monotonic()
            time.sleep(COALESCE_S)
            self.dirty.clear()
            try:
                read = None
                if self.written is None:
                    # What the ConfigMap holds: a node that cannot be read keeps its entry from it.
                    read = self.read_current()
                    self.written = read[1] or Topology()
                topology = self.desired()
                if stop.is_set() or not self.is_leader():
                    continue
                if topology != self.written or verify:
                    # Compares with the ConfigMap first (reusing that read), writes only if it differs.
                    self.write(topology, read)
                verify = False
                backoff.reset()
            except TooLarge as e:
                log.error("%s", e)  # retried when the next change comes, not in a loop
            except Exception as e:  # API trouble, or anything else: the writer must outlive it
                log.warning("ConfigMap %s/%s: %s; retrying", self.namespace, self.name, describe(e))
                self.written = None
                self.dirty.set()
                backoff.wait(stop)
