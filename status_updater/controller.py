"""`python -m status_updater run`: keeps the topology ConfigMaps true as the cluster changes.

Informer threads slim each Node and Pod to what reconcile reads and queue it; one writer thread
owns the `ClusterState`, settles what a coalescing window touched and hands the changed nodes to
the layout's writer (`pernode.PerNodeWriter` or `single.SingleWriter`). Nothing is written before
Nodes, Pods and the mig-parted ConfigMap are listed (an empty pod cache would release every
allocation; the ConfigMap is given up on after a 403 or three failed tries, for the built-in
layouts), nor while an informer is failing, and only the Lease holder writes; a standby keeps
its state current so that a takeover is quick.
"""

from __future__ import annotations

import functools
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

import kubernetes
from kubernetes.client.exceptions import ApiException

from mig_exporter.common.podlabels import Allowlist
from mig_exporter.common.selfmetrics import InvalidObjects, kind_of
from mig_exporter.kube.api import PASS_S, REQUEST_TIMEOUT, Backoff, Obj, Said, describe, list_watch
from status_updater import faults, kainodes
from status_updater.claims import read_claim
from status_updater.dra import DraOptions, node_slimmer
from status_updater.objects import node_labels, node_name, pod_key, pod_slimmer
from status_updater.state import ClusterState
from topology import kai, migparted
from topology.errors import TopologyError
from topology.model import NodeTopology, time_text

log = logging.getLogger(__name__)
COALESCE_S = 0.2  # a storm of events within this window gives one write per changed node
RESYNC_S = 30.0  # how often a quiet leader compares what is written with what should be
LAYOUTS_ATTEMPTS = 3  # failed reads of the mig-parted ConfigMap before writing without it
# What is listed before anything is written (the fault policies: so that a restart does not
# write every node without its policies' faults first).
SOURCES = frozenset({"nodes", "pods", "layouts", "policies"})
DRA_SOURCES = SOURCES | {"claims"}  # and with DRA on, the ResourceClaims
# Why the ResourceClaims cannot be read before they were ever listed, by HTTP status: there are
# none to wait for, the ConfigMaps are written without claims.
UNSERVED = {
    403: "may not be read by the updater (RBAC)",
    404: "are not served by this API server (resource.k8s.io/v1: Kubernetes 1.34+)",
}


class Statused:
    """A list call that keeps the HTTP status of its last failure (None: it answered, or failed
    without one). `mig_exporter.kube.api.list_watch` hands its `on_error` a message only; what an informer does
    about a failure is chosen by this status, never by the message's text. The informer's own
    thread calls it and then its `on_error`: nothing else reads or writes it."""

    def __init__(self, call: Callable[..., Any]) -> None:
        functools.update_wrapper(self, call)  # the watch reads the call's docstring
        self.call = call
        self.status: int | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.status = None
        try:
            return self.call(*args, **kwargs)
        except ApiException as e:
            self.status = e.status
            raise


class Writer(Protocol):
    """Puts the state's node results into ConfigMaps."""

    what: str

    def informers(self, stop: threading.Event, wake: Callable[[], None]) -> list[threading.Thread]:
        """Watches the writer needs (its own ConfigMaps), if any."""

    def ready(self) -> bool:
        """Whether the writer knows enough of the cluster to write."""

    def has_work(self) -> bool:
        """Whether the writer saw something of its own to repair (its ConfigMaps changed)."""

    def sync(self, state: ClusterState, changed: set[str], full: bool) -> None:
        """Write what `changed` nodes need; `full`: compare everything and repair what differs."""

    def leading(self, leading: bool) -> None:
        """Leadership changed: forget what was assumed to be written."""

    def remembered(self) -> Mapping[str, NodeTopology]:
        """The node entries the ConfigMaps hold now: the assignments the pods keep."""


class Controller:
    def __init__(
        self,
        core: kubernetes.client.CoreV1Api,
        writer: Writer,
        is_leader: Callable[[], bool] = lambda: True,
        resync_s: float = RESYNC_S,
        mig_parted_config: str = migparted.DEFAULT_CONFIGMAP,
        dra: DraOptions | None = None,
        pod_labels: Allowlist | None = None,
        namespace: str = "gpu-operator",
        node_labels: bool = False,
        kai_selector: str | None = None,
    ) -> None:
        self.core, self.writer, self.is_leader, self.resync_s = core, writer, is_leader, resync_s
        self.turned = time.monotonic()  # when the writer's loop last began a turn
        self.sources = SOURCES if dra is None else DRA_SOURCES
        # What each informer keeps of its objects, as it lists and watches them.
        self._slims: dict[str, Callable[[Obj], Any]] = {
            "nodes": kainodes.slimmer(node_slimmer(dra), kai_selector),
            "pods": pod_slimmer(pod_labels),
            "claims": read_claim}  # fmt: skip
        self._ever_listed: set[str] = set()  # informers that listed once (informer threads)
        # The claims' informer: its list call, and what it last said of a 403 or 404 (whether
        # the claims were listed before, and the status; None: not failing so now); its thread
        # alone reads and writes them.
        self._claims_call: Statused | None = None
        self._claims_said: tuple[bool, int] | None = None
        self.layouts_ref = mig_parted_config  # namespace/name of the GPU operator's ConfigMap
        self._layouts_seen: str | None = None  # what was last said about it
        self.state = ClusterState()
        self.events: queue.SimpleQueue[tuple[str, str, Any]] = queue.SimpleQueue()
        self.dirty = threading.Event()
        self.synced: set[str] = set()  # which of SOURCES have been listed
        self.failing: set[str] = set()  # informers that failed since their last list
        self._pending: set[str] = set()  # nodes changed since the last successful write
        self._full = True  # compare everything at the next write
        self._warned: dict[str, set[str]] = {}
        self._listed = False  # a full list was applied since the last settle
        self._remembered = False  # the written assignments were read into the state
        self.invalid = InvalidObjects("mig_status_updater_invalid_objects_total")
        self.namespace = namespace
        # --fault-node-labels: the number of unhealthy GPUs in a label of each GPU node.
        self.node_labels = node_labels
        self._label_said: str | None = None  # the last failure to label a Node, said once
        self._policy_said: dict[str, str] = {}  # each bad policy's problem, said once
        self._status_due: set[str] = set()  # policies whose status annotation is to be written
        # --kai-node-selector: what KAI's node-side parts would write, on simulated nodes.
        self.kai = kai_selector is not None
        # Its writes take at most this long a pass (a node's at least), as the other writers'
        # passes: a first pass over thousands of nodes never holds the ConfigMaps back.
        self.kai_pass_s = PASS_S
        self._kai_said: str | None = None  # the last failure to write it, said once

    # --- informer callbacks (informer threads) ------------------------------------------------

    def _reset(self, what: str, items: list[Obj]) -> None:
        self._ever_listed.add(what)
        if what == "claims":
            self._claims_said = None
        self.events.put((what, "RESET", items))  # slimmed page by page as they were listed
        self.dirty.set()

    def _informer_error(self, what: str, message: str) -> None:
        self.events.put((what, "ERROR", message))
        self.dirty.set()

    def following(self) -> bool:
        """Every informer has listed, and none has failed since: what the state holds is the
        cluster. A leader that took over while its pod watch was failing would otherwise
        write a cache missing the pods created meanwhile, and take their devices away."""
        return self.synced == self.sources and not self.failing

    def _event(self, what: str, kind: str, obj: Obj) -> None:
        self.events.put((what, kind, self._slims[what](obj)))
        self.dirty.set()

    def _claims_error(self, message: str, status: int | None = None) -> None:
        """The ResourceClaims' informer failed. Until they are first listed, an API that does not
        serve them (404: a cluster before DRA) or lets the updater not read them (403) has none
        to wait for: the ConfigMaps are written without claims. Once listed, a failing watch
        pauses the writes as the pods' does (a cache missing claims would take their devices
        away). Either, for a 403 or 404, is said once for as long as it lasts: again when the
        answer changes, or comes back after a list or another failure. `status`: the failure's
        HTTP status, else the one the claims' list call kept (`Statused`)."""
        if status is None and self._claims_call is not None:
            status = self._claims_call.status
        listed = "claims" in self._ever_listed
        if listed or status not in UNSERVED:
            self._informer_error("claims", message)
        said = self._claims_said
        self._claims_said = None if status is None or status not in UNSERVED else (listed, status)
        if self._claims_said is None or self._claims_said == said:
            return
        why = UNSERVED[self._claims_said[1]]
        if listed:
            log.warning("%s: ResourceClaims %s: the writes wait until they are listed again",
                        message, why)  # fmt: skip
            return
        log.warning("%s: ResourceClaims %s: no DRA claims are followed until they can be read",
                    message, why)  # fmt: skip
        self.events.put(("claims", "RESET", []))  # none to wait for (after a failure, again)
        self.dirty.set()

    def _layouts_informer(self, stop: threading.Event) -> threading.Thread:
        """Watches the one mig-parted ConfigMap: its `config.yaml`, or None while it is absent."""
        namespace, name = self.layouts_ref.split("/", 1)
        failures = 0  # in a row, since the last good list
        list_call = Statused(partial(self.core.list_namespaced_config_map, namespace))

        def ours(cm: Obj) -> bool:  # an API that ignores the field selector lists them all
            return (cm.get("metadata") or {}).get("name") == name

        def on_reset(items: list[Obj]) -> None:
            nonlocal failures
            failures = 0
            self.events.put(("layouts", "RESET", next((c for c in items if ours(c)), None)))
            self.dirty.set()

        def on_event(kind: str, cm: Obj) -> None:
            if ours(cm):
                self.events.put(("layouts", kind, None if kind == "DELETED" else cm))
                self.dirty.set()

        def on_error(message: str) -> None:
            # Unreadable for good (no RBAC for it, an API failing again and again): the writes
            # must not wait on it. A passing error is retried first: writing static nodes with
            # the wrong layouts, then the right ones, would churn every one of them.
            nonlocal failures
            failures += 1
            if list_call.status == 403 or failures >= LAYOUTS_ATTEMPTS:
                self.events.put(("layouts", "ERROR", message))
                self.dirty.set()

        return threading.Thread(
            target=list_watch,
            name="mig-parted-config",
            daemon=True,
            args=(f"configmap {self.layouts_ref}", list_call, on_reset, on_event, stop),
            kwargs={"field_selector": f"metadata.name={name}", "on_error": on_error},
        )

    def _policies_informer(self, stop: threading.Event) -> threading.Thread:
        """Watches the fault policies: ConfigMaps labelled `mig-exporter/fault-policy` in the
        updater's namespace. Unreadable for good (a 403, or three failures in a row): the
        writes go on without them, as without the mig-parted ConfigMap."""
        failures = 0
        list_call = Statused(partial(self.core.list_namespaced_config_map, self.namespace))

        def on_reset(items: list[Obj]) -> None:
            nonlocal failures
            failures = 0
            self.events.put(("policies", "RESET", items))
            self.dirty.set()

        def on_event(kind: str, cm: Obj) -> None:
            self.events.put(("policies", kind, cm))
            self.dirty.set()

        def on_error(message: str) -> None:
            nonlocal failures
            failures += 1
            if list_call.status == 403 or failures >= LAYOUTS_ATTEMPTS:
                self.events.put(("policies", "ERROR", message))
                self.dirty.set()

        return threading.Thread(
            target=list_watch,
            name="fault-policies",
            daemon=True,
            args=(f"fault policies in {self.namespace}", list_call, on_reset, on_event, stop),
            kwargs={"label_selector": faults.POLICY_LABEL, "on_error": on_error},
        )

    def informers(self, stop: threading.Event) -> list[threading.Thread]:
        sources: list[tuple[str, Callable[..., Any], Callable[[str], None]]] = [
            ("nodes", self.core.list_node, partial(self._informer_error, "nodes")),
            ("pods", self.core.list_pod_for_all_namespaces, partial(self._informer_error, "pods")),
        ]
        if "claims" in self.sources:  # every namespace's ResourceClaims
            api = kubernetes.client.ResourceV1Api(self.core.api_client)
            self._claims_call = Statused(api.list_resource_claim_for_all_namespaces)
            sources.append(("claims", self._claims_call, self._claims_error))
        threads = [
            threading.Thread(
                target=list_watch,
                name=what,
                daemon=True,
                args=(
                    what,
                    list_call,
                    partial(self._reset, what),
                    partial(self._event, what),
                    stop,
                ),
                kwargs={"transform": self._slims[what], "on_error": on_error},
            )
            for what, list_call, on_error in sources
        ]
        threads.append(self._layouts_informer(stop))
        threads.append(self._policies_informer(stop))
        return threads + self.writer.informers(stop, self.dirty.set)

    # --- the writer thread ----------------------------------------------------------------------

    def _apply(self, what: str, kind: str, payload: Any) -> None:
        state = self.state
        if what == "layouts":
            if kind != "ERROR":
                self._set_layouts(payload)
            elif what not in self.synced:
                log.warning("%s: NVIDIA's built-in MIG layouts until it can be read", payload)
            self.synced.add(what)
        elif what == "policies":
            self._set_policies(kind, payload)
        elif kind == "ERROR":
            self.failing.add(what)  # until its next list
        elif kind == "RESET":
            # The informer slimmed each page as it arrived.
            if what == "nodes":
                state.reset_nodes(payload)
            elif what == "pods":
                state.reset_pods(payload)
            else:
                state.reset_claims(payload)
            self.synced.add(what)
            self.failing.discard(what)
            self._listed = True
        elif what == "nodes":
            if kind == "DELETED":
                state.delete_node(node_name(payload))
            else:
                state.set_node(payload)
        elif what == "claims":
            if kind == "DELETED":
                state.delete_claim(payload.key)
            else:
                state.set_claim(payload)
        elif kind == "DELETED":
            state.delete_pod(pod_key(payload))
        else:
            state.set_pod(payload)

    def _set_layouts(self, cm: Obj | None) -> None:
        """The GPU operator's layouts, NVIDIA's built-in ones while its ConfigMap is absent; a
        ConfigMap that cannot be read keeps the layouts in use (said once per content)."""
        if cm is None:
            layouts: migparted.Layouts = migparted.builtin()
            said = f"configmap {self.layouts_ref} not found: NVIDIA's built-in MIG layouts"
        else:
            data = cm.get("data") or {}
            text = data.get(migparted.DATA_KEY) if isinstance(data, dict) else None
            try:
                if not isinstance(text, str):
                    raise TopologyError(
                        f"configmap {self.layouts_ref}",
                        f"data[{migparted.DATA_KEY}]",
                        "is required",
                    )
                layouts = migparted.parse(
                    text, f"configmap {self.layouts_ref}", f"data[{migparted.DATA_KEY}]"
                )
                said = f"configmap {self.layouts_ref}: {len(layouts)} MIG layouts"
            except TopologyError as e:
                if str(e) != self._layouts_seen:
                    log.warning("%s; keeping the layouts in use", e)
                    self.invalid.count("configmap")
                    self._layouts_seen = str(e)
                return
        if said != self._layouts_seen:
            log.info("%s", said)
            self._layouts_seen = said
        self.state.set_layouts(layouts)

    def _set_policies(self, kind: str, payload: Any) -> None:
        """A fault policy came, changed or went. A bad one is said once and its last good
        version kept; the others are never held up by it."""
        if kind == "ERROR":
            if "policies" not in self.synced:
                log.warning("%s: no fault policies until they can be read", payload)
            self.synced.add("policies")
            return
        items = payload if kind == "RESET" else [payload]
        if kind == "RESET":
            self.synced.add("policies")
            names = {str((c.get("metadata") or {}).get("name")) for c in items}
            for gone in set(self.state.policies) - names:
                self.state.delete_policy(gone)
        for cm in items:
            name = str((cm.get("metadata") or {}).get("name"))
            if kind == "DELETED":
                self.state.delete_policy(name)
                self._policy_said.pop(name, None)
                continue
            try:
                policy = faults.read_policy(cm, time.time())
            except TopologyError as e:
                if self._policy_said.get(name) != str(e):
                    log.warning("%s; its last good version is kept", e)
                    self.invalid.count("configmap")
                    self._policy_said[name] = str(e)
                continue
            if self._policy_said.pop(name, None) is not None:
                log.info("fault policy %s: read", name)
            self.state.set_policy(policy)

    def _write_status(self) -> None:
        """Each policy whose hits changed: what it hit, in its `mig-exporter/fault-status`
        annotation (a merge patch of that one annotation: kubectl apply keeps it)."""
        self._status_due |= self.state.hits_changed
        self.state.hits_changed.clear()
        for name in sorted(self._status_due):
            policy = self.state.policies.get(name)
            if policy is None:
                self._status_due.discard(name)
                continue
            text = faults.status(policy, self.state.hits.get(name, {}))
            body = {"metadata": {"annotations": {faults.STATUS_ANNOTATION: text}}}
            try:
                self.core.patch_namespaced_config_map(
                    name, self.namespace, body, _request_timeout=REQUEST_TIMEOUT
                )
            except ApiException as e:
                if e.status != 404:  # gone since: nothing to say
                    log.warning("fault policy %s: its status cannot be written: %s", name,
                                describe(e))  # fmt: skip
                    return  # again at the next turn
            except Exception as e:
                log.warning("fault policy %s: its status cannot be written: %s", name, describe(e))
                return
            self._status_due.discard(name)

    def _label_nodes(self, names: set[str]) -> None:
        """`mig-exporter/unhealthy-gpus`: how many of a node's GPUs a device plugin would have
        marked unhealthy now (absent: none), where it is not what the Node says already. A Node
        that cannot be patched is said and tried again at the next resync."""
        for name in sorted(names):
            node = self.state.nodes.get(name)
            if node is None:
                continue
            count = self.state.unhealthy(name)
            want = str(count) if count else None
            if node_labels(node).get(faults.UNHEALTHY_LABEL) == want:
                continue
            body = {"metadata": {"labels": {faults.UNHEALTHY_LABEL: want}}}
            try:
                self.core.patch_node(name, body, _request_timeout=REQUEST_TIMEOUT)
            except Exception as e:
                # The rest at the next resync: a refusal (no RBAC for it) or a slow API must not
                # hold the writer node after node. Said once per kind of failure.
                why = describe(e)
                if why != self._label_said:
                    log.warning("node %s: label %s cannot be written: %s", name,
                                faults.UNHEALTHY_LABEL, why)  # fmt: skip
                    self._label_said = why
                return
            self._label_said = None

    def _write_kai(self, names: set[str]) -> None:
        """On the simulated nodes `--kai-node-selector` picks: KAI's node conditions, and each
        reservation pod's GPU uuid (kainodes.py). What fails is said once, and tried again at
        the next resync; so is what a pass had no time left for."""
        now = time_text(int(time.time()))
        deadline = time.monotonic() + self.kai_pass_s
        for name in sorted(names):
            node = self.state.nodes.get(name)
            if node is None:
                continue
            calls: list[tuple[str, Callable[[], object]]] = []
            if kainodes.needs_condition(node):
                body = kainodes.condition_patch(now)
                # Strategic: merged by condition type, the node's other conditions kept.
                calls.append((f"node {name}: KAI's conditions", partial(
                    self.core.patch_node_status, name, body, _request_timeout=REQUEST_TIMEOUT,
                    _content_type="application/strategic-merge-patch+json")))  # fmt: skip
            placed = self.state.results.get(name)
            pods = self.state.pods.get(name, {}).values()
            for ns, pod, uuid in kainodes.reservations_to_mark(
                node, pods, placed if isinstance(placed, NodeTopology) else None
            ):
                body = {"metadata": {"annotations": {kai.GPU_INDEX: uuid}}}
                calls.append((f"pod {ns}/{pod}: {kai.GPU_INDEX}", partial(
                    self.core.patch_namespaced_pod, pod, ns, body,
                    _request_timeout=REQUEST_TIMEOUT)))  # fmt: skip
            for what, call in calls:
                try:
                    call()
                except ApiException as e:
                    if e.status == 404:  # gone since: nothing to say
                        continue
                    self._kai_failed(what, describe(e))
                    return
                except Exception as e:
                    self._kai_failed(what, describe(e))
                    return
                self._kai_said = None
            if calls and time.monotonic() > deadline:
                return

    def _kai_failed(self, what: str, why: str) -> None:
        if why != self._kai_said:
            log.warning("%s cannot be written: %s", what, why)
            self._kai_said = why

    def drain(self) -> None:
        """Apply every queued event to the state."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._apply(*event)

    def settle(self) -> set[str]:
        changed = self.state.settle()
        for name in self.state.reconsidered:  # changed or not: warnings may be new either way
            warnings = {str(w): w for w in self.state.node_warnings(name)}
            messages = set(warnings)
            for m in sorted(messages - self._warned.get(name, set())):
                log.warning("%s", m)  # once per problem: a node that stays bad is not news
                self.invalid.count(kind_of(warnings[m].obj))
            if messages:
                self._warned[name] = messages
            else:
                self._warned.pop(name, None)
        return changed

    def became_leader(self, leading: bool) -> None:
        self.writer.leading(leading)
        self._remembered = not leading  # a new leader takes over what the old one assigned
        self._full = True  # the old leader may have written since: compare everything
        self.dirty.set()

    def run_writer(self, stop: threading.Event) -> None:
        backoff = Backoff()
        said = Said(log)  # the writer's failures, each said once
        last_full = time.monotonic()
        more = False  # the last pass ran out of time: the next starts at once
        while not stop.is_set():
            self.turned = time.monotonic()  # alive and turning (daemon._stuck)
            if more:  # a moment for the informers, never a spin should the work not shrink
                more = False
                if self.dirty.wait(0.02):
                    self.dirty.clear()
            elif self.dirty.wait(1.0):
                stop.wait(COALESCE_S)  # let a burst of events pile up: one write per node
                self.dirty.clear()
            if stop.is_set():
                return
            self.drain()
            if not self.following():
                continue
            if not self._remembered:
                # Before the first placement (and on taking over): what the ConfigMaps hold is
                # what pods were given, and they keep it across restarts and leaders.
                if not self.writer.ready():
                    continue
                try:
                    self.state.remember(self.writer.remembered())
                except Exception as e:
                    said.failed(f"{self.writer.what}: {describe(e)}", e)
                    self.dirty.set()
                    backoff.wait(stop)
                    continue
                self._remembered = True
            # Faults that began or ended since: their nodes' taints change.
            self._pending |= self.state.due(time.time())
            self._pending |= self.settle()
            if self._listed:
                # Hundreds of thousands of long-lived objects: leave them out of the cyclic
                # collector's full passes, which otherwise stall an event for up to a second
                # (BENCHMARKS.md). Reference counting still frees them when they go.
                gc.freeze()
                self._listed = False
            if not self.is_leader():
                self._pending.clear()  # a takeover compares everything anyway
                continue
            if time.monotonic() - last_full > self.resync_s:
                self._full = True  # someone else may have written (a re-applied seed): check
            if not self.writer.ready():
                continue
            if not (self._pending or self._full or self.writer.has_work()):
                continue
            try:
                self.writer.sync(self.state, self._pending, self._full)
            except Exception as e:  # API trouble, or anything else: the writer must outlive it
                said.failed(f"{self.writer.what}: {describe(e)}", e)
                self._full = True
                self.dirty.set()
                backoff.wait(stop)
                continue
            self._write_status()
            if self.node_labels:
                self._label_nodes(set(self.state.nodes) if self._full else self._pending)
            if self.kai:
                self._write_kai(set(self.state.nodes) if self._full else self._pending)
            if said.ok():
                log.info("%s: written again", self.writer.what)
            if self._full:
                last_full = time.monotonic()
            self._pending.clear()
            self._full = False
            backoff.reset()
            more = self.writer.has_work()
