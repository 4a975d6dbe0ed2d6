"""The per-node layout: one `topology-<node>` ConfigMap per GPU node (topology/configmap.py).

The writer watches the ConfigMaps it manages (label selector) and keeps, per ConfigMap, only its
resourceVersion, a digest of its document, its owner's uid and its node label. Comparing what
should be written with what is written then needs no API call, so a changed node costs one write,
an unchanged node none, and a resync (or another writer's edit, seen by the watch) repairs only
what differs. Node gone or no GPU node any more: its ConfigMap is deleted; the ownerReference to
the Node lets the garbage collector do the same while the updater is down. ConfigMaps without the
updater's labels are never updated or deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from mig_exporter.common.text import some_of
from mig_exporter.kube.api import (
    PASS_S,
    REQUEST_TIMEOUT,
    Obj,
    Queued,
    list_all,
    queued_watch,
    usable_version,
)
from mig_exporter.kube.configmaps import Seen, create_or_patch
from status_updater.reconcile import document
from status_updater.state import ClusterState, Unreadable
from topology import configmap as contract
from topology.errors import TopologyError
from topology.model import NodeTopology, dump_yaml

log = logging.getLogger(__name__)
CONFIGMAP_LIMIT = 1024 * 1024  # bytes of data a ConfigMap may hold
ATTEMPTS = 5


def digest(text: object) -> str:
    return hashlib.sha256(str(text).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Observed:
    """What one managed ConfigMap holds, as the watch (or the answer to our write) showed it."""

    version: str | None
    digest: str
    owner: str | None  # uid of the Node in its ownerReferences
    node_label: str | None


def observe(cm: Mapping[str, Any]) -> tuple[str, Observed | None]:
    """(name, what it holds); None when the ConfigMap is not one the updater manages."""
    meta = cm.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = str(meta.get("name"))
    if not contract.is_managed(labels):
        return name, None
    owners = [
        o.get("uid")
        for o in meta.get("ownerReferences") or []
        if isinstance(o, Mapping) and o.get("kind") == "Node"
    ]
    data = cm.get("data") or {}
    return name, Observed(
        version=usable_version(meta.get("resourceVersion")),
        digest=digest(data.get(contract.DATA_KEY)),
        owner=owners[0] if owners else None,
        node_label=labels.get(contract.LABEL_NODE_NAME),
    )


@dataclass(frozen=True)
class _Desired:
    result: NodeTopology
    strategy: str | None
    text: str
    digest: str


class PerNodeWriter:
    def __init__(self, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.what = f"topology ConfigMaps in {namespace}"
        self.actual: dict[str, Observed] = {}  # ConfigMap name -> what it holds
        self._events: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        self._listed = False
        self._desired: dict[str, _Desired] = {}  # node -> its document, kept while unchanged
        self._nodes: dict[str, str] = {}  # ConfigMap name -> node, for nodes with a result
        self._check: set[str] = set()  # ConfigMaps whose content changed under us
        self._relisted = False
        self._wrote: list[str] = []
        self._deleted: list[str] = []
        # A pass writes for at most `pass_s` (at least one node), then lets the controller look
        # at the Lease again: a leader busy with thousands of writes (at the API's pace, minutes)
        # never writes on after it stopped leading. What it had no time for waits here.
        self.pass_s = PASS_S
        self._todo: set[str] = set()  # nodes a pass had no time left for
        self._orphans: set[str] = set()  # ConfigMaps of no node, to delete

    # --- what is written, from the watch ------------------------------------------------------

    def informers(self, stop: threading.Event, wake: Callable[[], None]) -> list[threading.Thread]:
        return [
            queued_watch(
                "configmaps",
                self._list,
                self._events,
                wake,
                stop,
                label_selector=contract.MANAGED_SELECTOR,
            )
        ]

    def _list(self, **kw: Any) -> Any:
        return self.core.list_namespaced_config_map(self.namespace, **kw)

    def _drain(self) -> None:
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                return
            if kind == "RESET":
                # An API that ignores the label selector lists every ConfigMap: keep ours.
                seen = (observe(cm) for cm in cast(list[Obj], payload))
                self.actual = {name: o for name, o in seen if o is not None}
                self._listed = self._relisted = True
                continue
            name, observed = observe(cast(Obj, payload))
            if kind == "DELETED" or observed is None:
                self.actual.pop(name, None)
            elif self.actual.get(name) != observed:
                self.actual[name] = observed
            else:
                continue
            self._check.add(name)

    def ready(self) -> bool:
        self._drain()
        return self._listed

    def has_work(self) -> bool:
        return bool(self._check or self._relisted or self._todo or self._orphans)

    def leading(self, leading: bool) -> None:
        pass  # the watch keeps `actual` true whoever writes

    def remembered(self) -> Mapping[str, NodeTopology]:
        """Every managed ConfigMap's node entry, listed page by page (the watch keeps digests
        only: the texts are needed once, at start and on taking over)."""

        def entries(cm: Obj) -> Mapping[str, NodeTopology]:
            if not contract.is_managed((cm.get("metadata") or {}).get("labels")):
                return {}
            try:
                return contract.configmap_topology(cm, "ConfigMap").nodes
            except TopologyError:
                return {}  # it is rewritten from the cluster; nothing of it to keep

        pages, _ = list_all(self._list, {"label_selector": contract.MANAGED_SELECTOR}, entries)
        return {name: node for found in pages for name, node in found.items()}

    # --- writing ---------------------------------------------------------------------------------

    def sync(self, state: ClusterState, changed: set[str], full: bool) -> None:
        self._drain()
        full = full or self._relisted
        self._relisted = False
        if full:
            nodes = set(state.results) | set(self._desired)
            self._nodes = {contract.node_configmap_name(n): n for n in state.results}
        else:
            nodes = set(changed) | {self._nodes[c] for c in self._check if c in self._nodes}
        self._orphans |= (set(self.actual) if full else self._check) - set(self._nodes)
        self._check = set()
        self._todo |= nodes
        deadline = time.monotonic() + self.pass_s
        try:
            for node in sorted(self._todo):
                self._todo.discard(node)
                self._sync_node(state, node)
                if time.monotonic() > deadline:
                    return  # the rest at the next pass, after the Lease is looked at
            for name in sorted(self._orphans):
                self._orphans.discard(name)
                if name not in self._nodes and name in self.actual:
                    self._delete(name)
                if time.monotonic() > deadline:
                    return
        finally:
            self._report()

    def _sync_node(self, state: ClusterState, node: str) -> None:
        name = contract.node_configmap_name(node)
        result = state.results.get(node)
        if result is None:  # the node is gone, or no GPU node any more
            self._desired.pop(node, None)
            self._nodes.pop(name, None)
            if name in self.actual:
                self._delete(name)
            return
        self._nodes[name] = node
        if isinstance(result, Unreadable):
            return  # its ConfigMap keeps the last good document
        desired = self._document(state, node, result)
        uid = state.node_uid(node)
        current = self.actual.get(name)
        if self._holds(current, node, desired, uid):
            return
        if len(desired.text.encode()) > CONFIGMAP_LIMIT:
            log.error(
                "ConfigMap %s/%s: topology.yml of node %s is over the 1 MiB a ConfigMap holds; "
                "not written",
                self.namespace,
                name,
                node,
            )
            return
        self._write(node, name, desired, uid, current)

    def _document(self, state: ClusterState, node: str, result: NodeTopology) -> _Desired:
        strategy = state.node_strategy(node)
        cached = self._desired.get(node)
        if cached is not None and cached.result is result and cached.strategy == strategy:
            return cached
        text = dump_yaml(document(node, result, strategy))
        desired = _Desired(result, strategy, text, digest(text))
        self._desired[node] = desired
        return desired

    @staticmethod
    def _holds(current: Observed | None, node: str, desired: _Desired, uid: str | None) -> bool:
        return (
            current is not None
            and current.digest == desired.digest
            and current.node_label == contract.node_label_value(node)
            and (uid is None or current.owner == uid)
        )

    def _write(
        self, node: str, name: str, desired: _Desired, uid: str | None, current: Observed | None
    ) -> None:
        """Create, or merge-patch at the version seen (mig_exporter.kube.configmaps). A 409 or 404 reads it
        again: done if it holds what is wanted, never touched if it is not the updater's."""
        body = contract.node_configmap(node, desired.text, self.namespace, uid)
        meta = {k: v for k, v in body["metadata"].items() if k not in ("name", "namespace")}

        def reread() -> Seen:
            known, current = self._read(name)
            if known and current is None:
                log.error(
                    "ConfigMap %s/%s exists and was not created by the updater: not touched",
                    self.namespace,
                    name,
                )
                return Seen(True, None, done=True)
            return Seen(known, current.version if current else None,
                        done=self._holds(current, node, desired, uid))  # fmt: skip

        seen = Seen(current is not None, current.version if current else None)
        patch = {"metadata": meta, "data": body["data"]}
        response = create_or_patch(
            self.core, self.namespace, name, body, patch, seen, reread, ATTEMPTS
        )
        if response is not None:
            self._seen(json.loads(response.data))
            self._wrote.append(name)

    def _read(self, name: str) -> tuple[bool, Observed | None]:
        """Whether it exists, and what it holds (None also when it is not ours)."""
        try:
            response = self.core.read_namespaced_config_map(
                name, self.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status == 404:
                self.actual.pop(name, None)
                return False, None
            raise
        return True, self._seen(json.loads(cast(Any, response).data))

    def _seen(self, cm: Obj) -> Observed | None:
        name, observed = observe(cm)
        if observed is None:
            self.actual.pop(name, None)
        else:
            self.actual[name] = observed
        return observed

    def _delete(self, name: str) -> None:
        current = self.actual.get(name)
        options: dict[str, Any] = {}
        if current is not None and current.version:
            options["preconditions"] = {"resourceVersion": current.version}
        try:
            self.core.delete_namespaced_config_map(
                name, self.namespace, body=cast(Any, options), _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status == 409:
                self._check.add(name)  # it changed since it was seen: judge it again
                return
            if e.status != 404:
                raise
        self.actual.pop(name, None)
        self._deleted.append(name)

    def _report(self) -> None:
        for verb, names in (("wrote", self._wrote), ("deleted", self._deleted)):
            if names:
                plural = "s" if len(names) > 1 else ""
                log.info("%s ConfigMap%s %s in %s", verb, plural, some_of(names), self.namespace)
                names.clear()
