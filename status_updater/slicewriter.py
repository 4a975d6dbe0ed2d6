"""Publishing the DRA driver's ResourceSlices (`resourceslices.py`) for the nodes DRA selects.

One pool per node, named after it. The writer watches the slices it manages (label selector)
and keeps, per slice, its resourceVersion, pool, generation and a digest of what it says, so
that a node whose devices did not change costs no call, and a resync (or another writer's edit,
seen by the watch) repairs only the pools that differ. A pool that changes is written whole
under the next generation, as the driver does: the scheduler uses a pool only when all its
slices carry its newest generation. Node gone, no GPU node or not selected any more: its slices
are deleted (their ownerReference to the Node lets the garbage collector do the same while the
updater is down). A node whose devices cannot be read keeps what it published. Slices without
the updater's label (the real driver's) are never touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from mig_exporter.common.text import some_of
from mig_exporter.kube.api import (
    PASS_S,
    REQUEST_TIMEOUT,
    Obj,
    Queued,
    Said,
    describe,
    queued_watch,
    send_json,
    usable_version,
)
from status_updater.claimstatus import ClaimStatusWriter
from status_updater.controller import Writer
from status_updater.dra import SELECTED, DraOptions
from status_updater.objects import metadata, node_name, strings
from status_updater.resourceslices import (
    API_VERSION,
    SELECTOR,
    is_ours,
    node_slices,
    slice_metadata,
)
from status_updater.state import ClusterState
from topology import dra
from topology.errors import TopologyError
from topology.faults import Taint
from topology.model import NodeTopology

log = logging.getLogger(__name__)
RETRY_S = (1.0, 60.0)  # a pool the API refuses, or a failed pass: again after 1 s, up to 60 s


def _later(failures: int) -> float:
    """When to try again after `failures` in a row: doubling, with jitter."""
    delay = min(RETRY_S[1], RETRY_S[0] * 2.0 ** (failures - 1))
    return time.monotonic() + delay * random.uniform(0.5, 1.0)


def _refused(e: Exception) -> bool:
    """The API refused this pool (invalid, forbidden, too large): the node's problem, not the
    API's. Anything else (unreachable, 5xx, 429) fails the whole pass."""
    status = e.status if isinstance(e, ApiException) else None
    return status is not None and 400 <= status < 500 and status != 429


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _said(labels: object, owners: object, spec_text: str) -> str:
    """The digest of what a slice says, from its spec's JSON (`_json`, its pool's generation 0):
    the same devices under a newer generation are the same slice."""
    said = f'{{"labels":{_json(labels)},"owners":{_json(owners)},"spec":{spec_text}}}'
    return hashlib.sha256(said.encode()).hexdigest()


def _digest(obj: Mapping[str, Any]) -> str:
    """What a slice (as the API shows it) says: `_said`."""
    meta = _map(obj.get("metadata"))
    spec = dict(_map(obj.get("spec")))
    spec["pool"] = {**_map(spec.get("pool")), "generation": 0}
    return _said(meta.get("labels"), meta.get("ownerReferences"), _json(spec))


_GENERATION_0 = '"pool":{"generation":0,'
_RESOURCE_VERSION = re.compile(rb'"resourceVersion"\s*:\s*"([^"\\]*)"')  # any JSON spacing


def _version_of(answer: bytes) -> str | None:
    """The resourceVersion of an object the API answered with: the first one in it is its
    metadata's (`metadata` comes before `spec`, and nothing else in a slice has one)."""
    found = _RESOURCE_VERSION.search(answer)
    return usable_version(found[1].decode()) if found else None


@dataclass(frozen=True)
class _Text:
    """One slice to write, as JSON made once: its digest, and its body under any generation."""

    name: str
    node: str
    meta: str
    spec: str  # generation 0
    digest: str

    @classmethod
    def of(cls, body: Mapping[str, Any], spec_text: str | None = None) -> _Text:
        meta, spec = body["metadata"], body["spec"]
        if spec_text is None:
            spec_text = _json({**spec, "pool": {**spec["pool"], "generation": 0}})
        digest = _said(meta.get("labels"), meta.get("ownerReferences"), spec_text)
        return cls(meta["name"], spec["nodeName"], _json(meta), spec_text, digest)

    def text(self, generation: int, version: str | None) -> bytes:
        # The spec's keys are sorted: `pool` is the first key named so, after `devices`,
        # `driver` and `nodeName` (their strings' quotes are escaped).
        spec = self.spec.replace(_GENERATION_0, f'"pool":{{"generation":{generation},', 1)
        meta = self.meta
        if version is not None:
            meta = f'{meta[:-1]},"resourceVersion":{json.dumps(version)}}}'
        return (
            f'{{"apiVersion":"{API_VERSION}","kind":"ResourceSlice",'
            f'"metadata":{meta},"spec":{spec}}}'
        ).encode()


# --- templates -----------------------------------------------------------------------------------
# A dynamic-MIG node's slices hold 26 devices a GPU, and every node of a shape (model, MIG states,
# driver labels, options) says the same but for its name and its GPUs' uuids: their JSON is made
# once a shape, with stand-ins replaced per node. Building and encoding them per node was 9 of a
# node's 19 ms (BENCHMARKS.md). A stand-in holds a control character, which no real name has.

_NODE = "\x01node\x01"
_MAX_SHAPES = 64


def _stand_in(i: int) -> str:
    return f"\x01gpu{i}\x01"


def _encoded(text: str) -> str:
    """`text` as it is written inside a JSON string."""
    return json.dumps(text)[1:-1]


def _shape(slim: Obj, devices: NodeTopology, options: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What a node's dynamic-MIG slices are made of besides its name and GPU uuids; None where
    they hold more (a static instance's own uuid)."""
    if not options.get("dynamic") or any(g.mig_devices for g in devices.gpus):
        return None
    labels = strings(metadata(slim).get("labels"))
    return (
        devices.gpu_product,
        devices.gpu_memory,
        tuple(g.mig_devices is None for g in devices.gpus),
        tuple((k, labels[k]) for k in dra.NODE_LABELS if k in labels),
        tuple(sorted(options.items())),
    )


class _Templates:
    """The JSON of each shape's slices, made once (at most `_MAX_SHAPES` kept)."""

    def __init__(self) -> None:
        self._specs: dict[tuple[Any, ...], tuple[str, ...]] = {}

    def texts(
        self,
        slim: Obj,
        devices: NodeTopology,
        options: Mapping[str, Any],
        taints: tuple[tuple[Taint, ...], ...] = (),
    ) -> tuple[_Text, ...]:
        """The node's slices, as `node_slices` makes them (TopologyError as it raises)."""
        shape = _shape(slim, devices, options)
        if shape is None or taints:
            made = node_slices(slim, devices, **options, taints=taints)
            return tuple(map(_Text.of, made))
        specs = self._specs.get(shape)
        if specs is None:
            stand_in = {"kind": "Node", "metadata": {**metadata(slim), "name": _NODE, "uid": None}}
            gpus = tuple(replace(g, id=_stand_in(i)) for i, g in enumerate(devices.gpus))
            try:
                made = node_slices(stand_in, replace(devices, gpus=gpus), **options)
            except TopologyError:
                node_slices(slim, devices, **options)  # the same error, naming the node
                raise
            specs = tuple(_Text.of(s).spec for s in made)
            if len(self._specs) >= _MAX_SHAPES:
                self._specs.clear()
            self._specs[shape] = specs
        name = node_name(slim)
        swaps = [(_encoded(_NODE), _encoded(name))]
        swaps += [(_encoded(_stand_in(i)), _encoded(g.id)) for i, g in enumerate(devices.gpus)]
        found = []
        for i, spec in enumerate(specs):
            for stand, real in swaps:
                spec = spec.replace(stand, real)
            body = {"metadata": slice_metadata(slim, i), "spec": {"nodeName": name}}
            found.append(_Text.of(body, spec))
        return tuple(found)


@dataclass(frozen=True)
class Observed:
    """One managed slice as the watch (or the answer to our write) showed it."""

    version: str | None
    pool: str
    generation: int
    digest: str


def observe(obj: Mapping[str, Any]) -> tuple[str, Observed | None]:
    """(name, what it holds); None when the slice is not one the updater manages."""
    meta = _map(obj.get("metadata"))
    name = str(meta.get("name"))
    if not is_ours(meta.get("labels")):
        return name, None
    pool = _map(_map(obj.get("spec")).get("pool"))
    generation = pool.get("generation")
    return name, Observed(
        version=usable_version(meta.get("resourceVersion")),
        pool=str(pool.get("name", "")),
        generation=generation if type(generation) is int else 0,
        digest=_digest(obj),
    )


@dataclass(frozen=True)
class _Desired:
    """What a node's pool should say: its slices' names and digests, never the slices (a H100
    node's dynamic-MIG slices are 1.6 MB in memory, 8 GB at 5,000 nodes). Kept while the slim
    Node and the devices it was computed from are the same objects; `texts` only while they are
    being written."""

    node: Mapping[str, Any]
    devices: object
    names: tuple[str, ...]
    digests: tuple[str, ...]
    texts: tuple[_Text, ...] = ()
    taints: tuple[tuple[Taint, ...], ...] = ()  # each GPU's, when they were computed


class SliceWriter:
    def __init__(
        self, api: kubernetes.client.ResourceV1Api, options: DraOptions, pass_s: float | None = None
    ) -> None:
        self.api, self.options = api, options.slices()
        self.pass_s = PASS_S if pass_s is None else pass_s  # at least one node a pass
        self._todo: set[str] = set()  # nodes a pass had no time left for
        self._writing: _Text | None = None  # the slice whose write is under way
        self._templates = _Templates()
        self.what = "ResourceSlices"
        self.actual: dict[str, Observed] = {}  # slice name -> what it holds
        self._pools: dict[str, set[str]] = {}  # pool (node) -> its managed slices' names
        self._events: queue.SimpleQueue[Queued] = queue.SimpleQueue()
        self._listed = self._relisted = False
        self._check: set[str] = set()  # pools whose slices changed under us
        self._desired: dict[str, _Desired] = {}  # node -> its slices, kept while unchanged
        # Pool -> the newest generation written or seen: a pool written again is newer than any
        # slice of it that was seen, also one deleted since.
        self._generations: dict[str, int] = {}
        self._said: dict[str, str] = {}  # node -> the problem last said about it
        self._foreign: set[str] = set()  # slice names someone else's objects hold
        self._failed: dict[str, tuple[float, int, str]] = {}  # node -> (retry at, failures, why)
        self._refusals: dict[str, list[str]] = {}  # this pass's news: reason -> nodes refused
        self._pass_failed: tuple[float, int] = (0.0, 0)  # a whole pass: (retry at, failures)
        self._wrote: list[str] = []
        self._deleted: list[str] = []

    # --- what is written, from the watch ------------------------------------------------------

    def informers(self, stop: threading.Event, wake: Callable[[], None]) -> list[threading.Thread]:
        return [
            queued_watch(
                "resourceslices",
                self.api.list_resource_slice,
                self._events,
                wake,
                stop,
                transform=self._observe,
                label_selector=SELECTOR,
            )
        ]

    def _observe(self, obj: Obj) -> tuple[str, Observed | Obj | None]:
        """`observe`, in the watch's thread: only what is kept waits in the queue. The echo of
        the updater's own write (the version its answer had) is not digested again; one of the
        slice being written may come before its answer, and waits whole (one at a time) to be
        judged by its version when drained."""
        meta = _map(obj.get("metadata"))
        name = str(meta.get("name"))
        known = self.actual.get(name)
        version = usable_version(meta.get("resourceVersion"))
        if known is not None and version is not None and known.version == version:
            return name, known
        writing = self._writing
        if writing is not None and writing.name == name:
            return name, obj
        return observe(obj)

    def _see(self, name: str, observed: Observed | None) -> None:
        old = self.actual.pop(name, None)
        if old is not None:
            names = self._pools[old.pool]
            names.discard(name)
            if not names:
                del self._pools[old.pool]
        if observed is not None:
            self.actual[name] = observed
            self._pools.setdefault(observed.pool, set()).add(name)

    def _drain(self) -> None:
        while True:
            try:
                kind, payload = self._events.get_nowait()
            except queue.Empty:
                return
            if kind == "RESET":
                self.actual, self._pools = {}, {}
                for listed, seen in cast(list[tuple[str, Observed | Obj | None]], payload):
                    # An API ignoring the selector lists all: None for the others'.
                    self._see(listed, self._judged(listed, seen))
                self._listed = self._relisted = True
                continue
            name, seen = cast(tuple[str, Observed | Obj | None], payload)
            observed = self._judged(name, seen)
            old = self.actual.get(name)
            if kind == "DELETED":
                observed = None
            if old == observed:
                continue
            self._see(name, observed)
            self._check.update(o.pool for o in (old, observed) if o is not None)

    def _judged(self, name: str, seen: Observed | Obj | None) -> Observed | None:
        """What `_observe` left to judge here: the echo of a write that came before its answer
        is what the answer said where it has the answer's version."""
        if not isinstance(seen, dict):
            return seen
        known = self.actual.get(name)
        version = usable_version(_map(seen.get("metadata")).get("resourceVersion"))
        return known if known is not None and known.version == version else observe(seen)[1]

    def ready(self) -> bool:
        self._drain()
        return self._listed

    def has_work(self) -> bool:
        due = self._pass_failed[1] and self._pass_failed[0] <= time.monotonic()
        return bool(self._check or self._todo or self._relisted or due or self._due())

    def _due(self) -> set[str]:
        now = time.monotonic()
        return {node for node, (at, _, _) in self._failed.items() if at <= now}

    def pass_failed(self, e: Exception) -> None:
        """The last pass failed as a whole (`WithSlices`): the next one, after a backoff,
        compares everything."""
        failures = self._pass_failed[1] + 1
        if failures == 1:
            log.warning("ResourceSlices: %s; retrying", describe(e))
        self._pass_failed = (_later(failures), failures)

    def leading(self, leading: bool) -> None:
        pass  # the watch keeps `actual` true whoever writes

    # --- writing ---------------------------------------------------------------------------------

    def sync(self, state: ClusterState, changed: Iterable[str], full: bool) -> None:
        self._drain()
        full = full or self._relisted or bool(self._pass_failed[1])
        self._relisted = False
        if full:
            nodes = {n for n, node in state.nodes.items() if node.get(SELECTED)} | set(self._pools)
            self._judge_foreign()
        else:
            nodes = set(changed) | self._check | self._due()
        self._check = set()
        self._todo |= nodes
        now = time.monotonic()
        deadline = now + self.pass_s
        try:
            for node in sorted(self._todo):
                self._todo.discard(node)
                if node in self._failed and self._failed[node][0] > now:
                    continue  # refused a moment ago: its turn comes
                try:
                    self._sync_node(state, node)
                except Exception as e:
                    if not _refused(e):
                        raise
                    self._refuse(node, e)  # one node the API refuses never stops the others
                else:
                    self._failed.pop(node, None)
                if time.monotonic() > deadline:
                    break  # the rest at the next pass, once the ConfigMaps had their turn
        finally:
            self._report()
        self._pass_failed = (0.0, 0)

    def _refuse(self, node: str, e: Exception) -> None:
        why = describe(e)
        _, failures, said = self._failed.get(node, (0.0, 0, ""))
        if why != said:  # once per problem: a node that stays refused is no news
            self._refusals.setdefault(why, []).append(node)  # said at the pass's end
        self._failed[node] = (_later(failures + 1), failures + 1, why)

    def _judge_foreign(self) -> None:
        """Names someone else's slices held: free again once they are gone."""
        for name in sorted(self._foreign):
            try:
                self.api.read_resource_slice(
                    name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
                )
            except ApiException as e:
                if e.status != 404:
                    raise
                self._foreign.discard(name)

    def _wanted(self, state: ClusterState, node: str) -> _Desired | None:
        """The node's slices (none: not a node DRA selects); None where its devices cannot be
        read, and what it published stays."""
        slim = state.nodes.get(node)
        devices = state.devices(node) if slim is not None and slim.get(SELECTED) else None
        if slim is None or devices is None:
            return _Desired({}, None, (), ())
        # The driver's health check cannot run with DynamicMIG: dynamic slices carry no taints.
        taints = () if self.options.get("dynamic") else state.taints(node)
        cached = self._desired.get(node)
        if (
            cached is not None
            and cached.node is slim
            and cached.devices is devices
            and cached.taints == taints
        ):
            return cached
        try:
            if isinstance(devices, TopologyError):
                raise devices
            texts = self._templates.texts(cast(Obj, slim), devices, self.options, taints)
        except TopologyError as e:
            if self._said.get(node) != str(e):  # once per problem: a node that stays bad is no news
                log.warning("%s; its ResourceSlices stay as they are", e)
                self._said[node] = str(e)
            return None
        self._said.pop(node, None)
        names, digests = tuple(t.name for t in texts), tuple(t.digest for t in texts)
        self._desired[node] = _Desired(slim, devices, names, digests, (), taints)
        return _Desired(slim, devices, names, digests, texts, taints)

    def _texts(self, desired: _Desired) -> tuple[_Text, ...]:
        """The slices of `desired`, made again where only their digests were kept."""
        if desired.texts or not desired.names:
            return desired.texts
        slim, devices = cast(Obj, desired.node), cast(NodeTopology, desired.devices)
        return self._templates.texts(slim, devices, self.options, desired.taints)

    def _holds(self, name: str, digest: str, generation: int) -> bool:
        current = self.actual.get(name)
        return current is not None and current.generation == generation and current.digest == digest

    def _sync_node(self, state: ClusterState, node: str) -> None:
        desired = self._wanted(state, node)
        if desired is None:
            return
        if not desired.names:
            self._desired.pop(node, None)
            self._said.pop(node, None)
        names = list(desired.names)
        if any(n in self._foreign for n in names):
            return
        have = self._pools.get(node, set())
        generation = max((self.actual[n].generation for n in have), default=0)
        newest = max(generation, self._generations.get(node, 0))
        unchanged = have == set(names) and all(
            self._holds(n, d, generation) for n, d in zip(names, desired.digests, strict=True)
        )
        if not unchanged and names:
            for text in self._texts(desired):
                if not self._write(text, newest + 1):
                    return  # judged again at the next pass
                self._generations[node] = newest + 1
        for name in sorted(have - set(names)):
            self._delete(name, node)
        if not names and not self._pools.get(node):
            self._generations.pop(node, None)

    def _write(self, text: _Text, generation: int) -> bool:
        """Create the slice, or replace it at the version seen. False where it moved since
        (409), went (404) or is someone else's: read again, and judged at the next pass."""
        name = text.name
        current = self.actual.get(name)
        client = self.api.api_client
        path = "/apis/resource.k8s.io/v1/resourceslices"
        self._writing = text  # its echo waits to be judged until its answer is recorded
        try:
            try:
                if current is None:
                    answer = send_json(client, "POST", path, text.text(generation, None))
                else:
                    body = text.text(generation, current.version)
                    answer = send_json(client, "PUT", f"{path}/{name}", body)
            except ApiException as e:
                if e.status not in (404, 409):
                    raise
                self._reread(name, text.node)
                return False
            # The slice is what was written, at the answer's version, whatever the API filled in
            # or dropped (a default, counters it does not know): its watch echo and any later
            # list at that version are taken as that (`_observe`), so a slice the API changed is
            # not written again and again. Only a new version (an edit) is digested as it is.
            self._see(name, Observed(_version_of(answer), text.node, generation, text.digest))
        finally:
            self._writing = None
        self._wrote.append(name)
        return True

    def _reread(self, name: str, node: str) -> None:
        self._check.add(node)
        try:
            response = self.api.read_resource_slice(
                name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status != 404:
                raise
            self._see(name, None)
            return
        name, observed = observe(json.loads(cast(Any, response).data))
        self._see(name, observed)
        if observed is None and name not in self._foreign:
            self._foreign.add(name)
            log.error("ResourceSlice %s exists and was not created by the updater: not touched",
                      name)  # fmt: skip

    def _delete(self, name: str, node: str) -> None:
        current = self.actual.get(name)
        options: dict[str, Any] = {}
        if current is not None and current.version:
            options["preconditions"] = {"resourceVersion": current.version}
        try:
            self.api.delete_resource_slice(
                name, body=cast(Any, options), _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status == 409:
                self._check.add(node)  # it changed since it was seen: judge it again
                return
            if e.status != 404:
                raise
        self._see(name, None)
        self._deleted.append(name)

    def _report(self) -> None:
        # One line for every node refused for the same reason in a pass: a permission every
        # node lacks (RBAC, a policy) is one line, not one per node of thousands.
        for why, nodes in sorted(self._refusals.items()):
            plural = "s" if len(nodes) > 1 else ""
            log.warning("ResourceSlices of node%s %s: %s; retrying", plural, some_of(nodes), why)
        self._refusals.clear()
        for verb, names in (("wrote", self._wrote), ("deleted", self._deleted)):
            if names:
                log.info(
                    "%s ResourceSlice%s %s", verb, "s" if len(names) > 1 else "", some_of(names)
                )
                names.clear()


class WithSlices:
    """A topology writer (`controller.Writer`) that also publishes the ResourceSlices. The
    ConfigMaps never wait on the slices: an API without `resource.k8s.io/v1` stops only them."""

    def __init__(
        self, writer: Writer, slices: SliceWriter, claims: ClaimStatusWriter | None = None
    ) -> None:
        self.writer, self.slices, self.claims = writer, slices, claims
        self._claims_said = Said(log)  # the claims' status writer's failures, each said once
        self.what = f"{writer.what} and {slices.what}"

    def informers(self, stop: threading.Event, wake: Callable[[], None]) -> list[threading.Thread]:
        return self.writer.informers(stop, wake) + self.slices.informers(stop, wake)

    def ready(self) -> bool:
        self.slices.ready()  # drained either way
        return self.writer.ready()

    def has_work(self) -> bool:
        claims_left = self.claims is not None and self.claims.left
        return self.writer.has_work() or self.slices.has_work() or claims_left

    def sync(self, state: ClusterState, changed: set[str], full: bool) -> None:
        self.writer.sync(state, changed, full)
        if not self.slices.ready():  # once listed, its first pass compares everything
            return
        try:
            self.slices.sync(state, changed, full)
        except Exception as e:  # the ConfigMaps are written: only the slices wait and retry
            self.slices.pass_failed(e)
        if self.claims is not None:  # after the placement it says, as the driver after prepare
            try:
                self.claims.sync(state, changed, full)
            except Exception as e:  # API trouble: again at the next pass
                self._claims_said.failed(f"{self.claims.what}: {describe(e)}", e)
            else:
                self._claims_said.ok()

    def leading(self, leading: bool) -> None:
        self.writer.leading(leading)
        self.slices.leading(leading)

    def remembered(self) -> Mapping[str, NodeTopology]:
        return self.writer.remembered()
