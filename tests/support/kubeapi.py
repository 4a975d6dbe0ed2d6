"""A Kubernetes API for integration tests: kmock's emulator served over real HTTP.

The daemons under test are separate processes that talk to the API with the
official ``kubernetes`` client and a kubeconfig, so the emulator has to listen
on a real TCP port. It runs in a background thread with its own event loop;
every method of :class:`KubeAPI` is safe to call from the test's thread.

Two emulators can be served:

* plain ``kmock.KubernetesEmulator`` (``strict=False``) -- to prove that the
  daemons cope with its gaps: no PUT, no resourceVersion, no 409 on stale
  writes, no selectors, endless watches that ignore ``timeoutSeconds``;
* :class:`StrictKubernetesEmulator` (the default) -- the same emulator extended
  with the API semantics that list+watch loops and leader election rely on,
  plus hooks to inject the failures a real cluster produces (410 Gone, cut
  watch streams, 5xx errors).

Usage::

    with KubeAPI.start() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        kube.create("nodes", {"metadata": {"name": "node-1"}})
        daemon = subprocess.Popen([...], env={..., "KUBECONFIG": str(kubeconfig)})
        cm = eventually(lambda: kube.find("configmaps", "status", namespace="ns"))
        kube.cut_watches()           # the daemon must re-watch
        kube.fail_next(3, action="list")   # ...and back off on 500s
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import dataclasses
import datetime
import http
import json
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp.test_utils
import aiohttp.web
import attrs
import kmock
import kubernetes.client
import urllib3
from kubernetes.client.exceptions import ApiException

T = TypeVar("T")
Obj = dict[str, Any]
# How kmock keys its objects: (resource, namespace or None, name).
ObjKey = tuple[kmock.resource, str | None, str]


@dataclasses.dataclass(frozen=True)
class Kind:
    """A resource the emulator serves, with what discovery and list kinds need."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> kmock.resource:
        return kmock.resource(self.group, self.version, self.plural)

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace is not None:
            base += f"/namespaces/{namespace}"
        return f"{base}/{self.plural}" + (f"/{name}" if name is not None else "")


# The resources our daemons use. Plain kmock answers 404 to listing a resource
# it has never seen an object of, so both emulators get them declared up front.
KINDS: dict[str, Kind] = {
    k.plural: k
    for k in (
        Kind("", "v1", "nodes", "Node", namespaced=False),
        Kind("", "v1", "namespaces", "Namespace", namespaced=False),
        Kind("", "v1", "pods", "Pod", namespaced=True),
        Kind("", "v1", "configmaps", "ConfigMap", namespaced=True),
        Kind("", "v1", "events", "Event", namespaced=True),
        Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
        Kind("apps", "v1", "statefulsets", "StatefulSet", namespaced=True),
        # DRA (resource.k8s.io/v1, GA since Kubernetes 1.34): what the DRA mode reads and writes.
        Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False),
        Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", namespaced=True),
        Kind(
            "resource.k8s.io",
            "v1",
            "resourceclaimtemplates",
            "ResourceClaimTemplate",
            namespaced=True,
        ),
        Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", namespaced=False),
    )
}


def declare_kinds(emulator: kmock.KubernetesEmulator, kinds: Mapping[str, Kind] = KINDS) -> None:
    """Make the emulator list (and discover) these resources even when empty."""
    for k in kinds.values():
        emulator.resources[k.resource] = kmock.ResourceInfo(
            kind=k.kind,
            namespaced=k.namespaced,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
        )


def _kind_of(resource: kmock.resource) -> Kind:
    for k in KINDS.values():
        if k.resource == resource:
            return k
    plural = resource.plural or ""  # an undeclared resource: guess like kmock does
    kind = plural[:-1].capitalize() if plural.endswith("s") else plural.capitalize()
    return Kind(resource.group or "", resource.version or "v1", plural, kind, namespaced=True)


# --------------------------------------------------------------------------------------------
# Selectors: kmock ignores them, the strict emulator implements the common subset.
# --------------------------------------------------------------------------------------------

_SET_TERM = re.compile(r"\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*")
_EQ_TERM = re.compile(r"\s*([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)\s*")
_EXISTS_TERM = re.compile(r"\s*(!?)([\w./-]+)\s*")


def _bad_request(message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=400, reason="BadRequest", message=message, details={})


# (key or dotted field path, operator, values): "in"/"notin" a set of values, or "exists"/"!exists".
Requirement = tuple[str, str, frozenset[str]]


def parse_label_selector(selector: str) -> list[Requirement]:
    """Equality-, set- and existence-based label selectors, as ``kubectl -l`` takes them."""
    requirements: list[Requirement] = []
    for term in re.split(r",(?![^(]*\))", selector):  # commas outside of "in (a,b)"
        if not term.strip():
            continue
        if m := _SET_TERM.fullmatch(term):
            values = frozenset(v.strip() for v in m[3].split(","))
            requirements.append((m[1], m[2], values))
        elif m := _EQ_TERM.fullmatch(term):  # k=v is "k in (v)", k!=v is "k notin (v)"
            requirements.append((m[1], "notin" if m[2] == "!=" else "in", frozenset([m[3]])))
        elif m := _EXISTS_TERM.fullmatch(term):
            requirements.append((m[2], f"{m[1]}exists", frozenset()))
        else:
            raise _bad_request(f"unable to parse requirement: {term!r}")
    return requirements


def parse_field_selector(selector: str) -> list[Requirement]:
    """``path=value`` / ``path!=value`` over any dotted field (the apiserver allows fewer)."""
    requirements: list[Requirement] = []
    for term in selector.split(","):
        if not term.strip():
            continue
        if (m := _EQ_TERM.fullmatch(term)) is None:
            raise _bad_request(f"invalid field selector: {term!r}")
        requirements.append((m[1], "notin" if m[2] == "!=" else "in", frozenset([m[3]])))
    return requirements


def satisfies(values: Callable[[str], str | None], requirements: list[Requirement]) -> bool:
    """Whether the values (a label, or a field by its path) meet all the requirements."""
    for key, op, allowed in requirements:
        value = values(key)
        ok = {
            "in": value in allowed,
            "notin": value not in allowed,  # an absent label matches "!=", as in Kubernetes
            "exists": value is not None,
            "!exists": value is None,
        }[op]
        if not ok:
            return False
    return True


def _field(obj: Obj, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)  # an absent field compares as ""


# --------------------------------------------------------------------------------------------
# The strict emulator.
# --------------------------------------------------------------------------------------------


RECENT_REQUESTS = 8
# Sent by KubeAPI's own requests (the test's): the `unreachable` and `slow` windows spare them, so
# a test can change the cluster while the daemons cannot reach the API.
HARNESS_HEADER = "X-Kubeapi-Harness"


@dataclasses.dataclass
class Fault:
    """Fail the next ``remaining`` requests that match, with ``status``."""

    remaining: int
    status: int
    method: str | None = None  # GET, POST, PATCH, PUT, DELETE
    action: str | None = None  # kmock's actions: list, watch, fetch, create, update, delete
    plural: str | None = None  # e.g. "configmaps"
    about: str | None = None  # only requests naming this in their path or body (a node's name)

    def matches(self, request: kmock.Request) -> bool:
        action = request.action.value.lower() if request.action else None
        plural = request.resource.plural if request.resource else None
        return (
            (self.method is None or self.method.upper() == request.method.value.upper())
            and (self.action is None or self.action.lower() == action)
            and (self.plural is None or self.plural == plural)
            and (self.about is None or self.about in f"{request.url.path} {request.data!r}")
        )


@dataclasses.dataclass(frozen=True)
class JournalEntry:
    """One request as the emulator saw it; ``at`` is ``time.monotonic()`` (for backoff tests)."""

    at: float
    method: str
    path: str
    params: Mapping[str, str]
    fault: int | None  # the injected status, if this request was failed on purpose (0: dropped)
    harness: bool = False  # sent by the test (KubeAPI), not by a daemon


@dataclasses.dataclass(frozen=True)
class _Event:
    rv: int
    key: ObjKey
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj
    old: Obj | None  # the previous state, so selector watches can see objects leave/enter


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


@attrs.define(kw_only=True)
class StrictKubernetesEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersions, conflicts, PUT, real watches and failure hooks.

    What it adds over ``kmock.KubernetesEmulator``:

    * every write bumps a global counter and stamps it as ``metadata.resourceVersion``
      (creates also get ``uid``, ``creationTimestamp``, ``namespace``, ``kind``, ``apiVersion``);
    * lists carry ``kind: <Kind>List``, ``apiVersion`` and the current resourceVersion;
    * ``?watch=true&resourceVersion=N`` streams exactly the events after N; without N (or
      with "0") it starts with synthetic ADDED events, as the apiserver does;
    * watches honour ``timeoutSeconds``, ``labelSelector``, ``fieldSelector`` and
      ``allowWatchBookmarks`` (bookmarks are sent on :meth:`send_bookmarks`);
    * 409 Conflict on PATCH/PUT/DELETE whose ``resourceVersion`` (in the body's metadata or
      in DeleteOptions preconditions) is stale, and on POST of an existing name;
    * PUT (replace) of existing objects.

    Merge and strategic-merge patches are both applied as JSON merge patches (kmock's own
    merging): lists are replaced, ``$patch`` directives are not understood.

    The hook methods (:meth:`cut_watches`, :meth:`expire_watches`, :meth:`compact`,
    :meth:`fail_next`, :meth:`send_bookmarks`) must run on the emulator's event loop;
    :class:`KubeAPI` marshals them there for the test thread.
    """

    resource_version: int = attrs.field(default=0, init=False)
    journal: list[JournalEntry] = attrs.field(factory=list, init=False)
    faults: list[Fault] = attrs.field(factory=list, init=False)

    _log: list[_Event] = attrs.field(factory=list, init=False)
    _changed: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _expire_next: int = attrs.field(default=0, init=False)
    _cuts: int = attrs.field(default=0, init=False)  # bumped to end all open watches
    _abort_cut: bool = attrs.field(default=False, init=False)
    _bookmarks: int = attrs.field(default=0, init=False)  # bumped to send bookmarks
    _down_until: float = attrs.field(default=0.0, init=False)  # time.monotonic()
    _slow_until: float = attrs.field(default=0.0, init=False)
    _slow_delay: float = attrs.field(default=0.0, init=False)
    _slow_plural: str | None = attrs.field(default=None, init=False)
    # plural -> what the API changes in an object it stores (defaults, dropped fields)
    rewrites: dict[str, Callable[[Obj], None]] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        declare_kinds(self)
        # kmock classifies PUT as no action at all and answers 404; serve it as a replace.
        self.fallback[kmock.method.PUT] << self._serve_replace
        # The official client asks for "/version/" (trailing slash); kmock knows "/version".
        self.fallback["get /version/"] << self._serve_server_version

    # ---- test hooks (call on the emulator's loop) -------------------------------------------

    def cut_watches(self, *, abort: bool = False) -> None:
        """End every open watch stream: cleanly (EOF), or by dropping the TCP connection."""
        self._cuts += 1
        self._abort_cut = abort
        self._wake()

    def expire_watches(self, count: int = 1) -> None:
        """Answer the next ``count`` watch requests with an in-stream 410 Gone ERROR event."""
        self._expire_next += count

    def compact(self) -> None:
        """Forget history: watches from any resourceVersion older than now get 410 Gone."""
        self._compacted_rv = self.resource_version

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 500,
        method: str | None = None,
        action: str | None = None,
        plural: str | None = None,
        about: str | None = None,
    ) -> None:
        """Fail the next ``count`` matching requests with an HTTP error ``status``."""
        self.faults.append(Fault(count, status, method, action, plural, about))

    def send_bookmarks(self) -> None:
        """Send a BOOKMARK with the current resourceVersion to watches that allow them."""
        self._bookmarks += 1
        self._wake()

    def unreachable(self, seconds: float) -> None:
        """For `seconds`, drop the connection of every request (as a network partition or an
        apiserver restart does) and of every open watch. The harness's own requests still pass."""
        self._down_until = time.monotonic() + seconds
        self.cut_watches(abort=True)

    def slow(self, seconds: float, delay: float, plural: str | None = None) -> None:
        """For `seconds`, answer every request (of `plural` only, if given) `delay` seconds late
        (watches: their start). The harness's own requests are answered at once."""
        self._slow_until = time.monotonic() + seconds
        self._slow_delay = delay
        self._slow_plural = plural

    # ---- request handling -------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # kmock records every request and matches each new one against its reactions by scanning
        # that record (`request in payload._source`): O(requests so far) per request, 50-100 ms
        # each after a few hundred writes. Its record keeps the recent ones only; `journal` keeps
        # every request for the tests.
        if len(self._requests) > 2 * RECENT_REQUESTS:
            del self._requests[:-RECENT_REQUESTS]
        if (
            request.headers.get(HARNESS_HEADER) is None
            and time.monotonic() < self._slow_until
            and self._slow_plural in (None, request.resource and request.resource.plural)
        ):
            await asyncio.sleep(self._slow_delay)
            # Requests that came meanwhile may have trimmed it from kmock's record, which its
            # reactions are matched against: it would find none (a 500).
            if not any(r is request for r in self._requests[-RECENT_REQUESTS:]):
                self._requests.append(request)
        if request.headers.get(HARNESS_HEADER) is None and time.monotonic() < self._down_until:
            dropped = JournalEntry(
                time.monotonic(), request.method.value, request.url.path, dict(request.params), 0
            )
            self.journal.append(dropped)
            if request._raw_request is not None and request._raw_request.transport is not None:
                request._raw_request.transport.abort()  # the client sees the connection reset
            return aiohttp.web.Response(status=503)  # never sent
        fault = next((f for f in self.faults if f.remaining > 0 and f.matches(request)), None)
        self.journal.append(
            JournalEntry(
                at=time.monotonic(),
                method=request.method.value,
                path=request.url.path,
                params=dict(request.params),
                fault=fault.status if fault else None,
                harness=request.headers.get(HARNESS_HEADER) is not None,
            )
        )
        if fault is not None:
            fault.remaining -= 1
            phrase = http.HTTPStatus(fault.status).phrase
            raise kmock.KubernetesError(
                status=fault.status, reason=phrase.replace(" ", ""), message="injected by the test"
            )

        if request.resource is None:  # discovery, /version, etc.
            return await super()._handle(request)

        async with self._lock:
            if request.action == kmock.action.CREATE:
                self._create(request)
            elif request.action == kmock.action.UPDATE:
                self._patch(request)
            elif request.action == kmock.action.DELETE and request.name is not None:
                self._delete(request)
            elif request.method == kmock.method.PUT and request.name is not None:
                self._replace(request)

        # Skip KubernetesEmulator._handle: it would apply the write a second time, unversioned.
        # Its fallback reactions (_serve_fetch, _serve_create, ...) still render the responses,
        # and the tests' own reactions (kube.call(lambda emu: emu[...] << ...)) still win.
        return await super(kmock.KubernetesEmulator, self)._handle(request)

    def _create(self, request: kmock.Request) -> None:
        body = self._body(request)
        meta = body.setdefault("metadata", {})
        name = meta.get("name")
        if not name:
            raise kmock.KubernetesError(
                status=422, reason="Invalid", message="metadata.name: Required value", details={}
            )
        assert request.resource is not None
        key: ObjKey = (request.resource, request.namespace or meta.get("namespace"), str(name))
        current = self._current(key)
        if current is not None:
            raise kmock.KubernetesError(
                status=409,
                reason="AlreadyExists",
                message=f'{key[0].plural} "{name}" already exists',
                details={"name": name, "kind": key[0].plural},
            )
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
        if key[1] is not None:
            meta["namespace"] = key[1]
        self._commit(key, "ADDED", body, None)

    def _patch(self, request: kmock.Request) -> None:
        key = self._key(request)
        old = self._existing(key)
        body = request.data
        if isinstance(body, Mapping):  # JSON patches (lists) carry no resourceVersion to check
            self._check_rv(key, old, (body.get("metadata") or {}).get("resourceVersion"))
        obj = self.objects[key]
        try:
            obj.patch(body)  # kmock's merge (dicts; None deletes) or JSON patch (lists)
        except Exception as e:  # jsonpatch conflicts, dict-vs-scalar merges: client errors
            raise kmock.KubernetesError(status=422, reason="Invalid", message=repr(e)) from e
        new = copy.deepcopy(obj.raw)
        del obj.history[-1]  # _commit appends the stamped version instead
        self._commit(key, "MODIFIED", new, old)

    def _replace(self, request: kmock.Request) -> None:
        key = self._key(request)
        old = self._existing(key)
        body = self._body(request)
        meta = body.setdefault("metadata", {})
        self._check_rv(key, old, meta.get("resourceVersion"))
        for field in ("uid", "creationTimestamp", "namespace", "name"):  # server-owned
            if field in old["metadata"]:
                meta[field] = old["metadata"][field]
        self._commit(key, "MODIFIED", body, old)

    def _delete(self, request: kmock.Request) -> None:
        key = self._key(request)
        old = self._existing(key)
        options = request.data if isinstance(request.data, Mapping) else {}
        self._check_rv(key, old, (options.get("preconditions") or {}).get("resourceVersion"))
        if old["metadata"].get("deletionTimestamp"):
            return  # already being deleted, waiting for finalizers
        new = copy.deepcopy(old)
        if new["metadata"].get("finalizers"):
            new["metadata"]["deletionTimestamp"] = _now()
            self._commit(key, "MODIFIED", new, old)
        else:
            self._commit(key, "DELETED", new, old)

    def _commit(self, key: ObjKey, type_: str, new: Obj, old: Obj | None) -> None:
        """Stamp a new resourceVersion, store the version, and log it for the watchers."""
        if type_ != "DELETED" and (rewrite := self.rewrites.get(key[0].plural)) is not None:
            rewrite(new)
        self.resource_version += 1
        kind = _kind_of(key[0])  # the apiserver always fills these in, even if PUT/PATCH drop them
        new.update(kind=kind.kind, apiVersion=kind.api_version)
        new.setdefault("metadata", {})["resourceVersion"] = str(self.resource_version)
        if key not in self.objects:
            self.objects[key] = new
        else:
            self.objects[key].history.append(new)
        if type_ == "DELETED":
            self.objects[key].delete()  # kmock's soft-deletion keeps the history
        self._log.append(_Event(self.resource_version, key, type_, copy.deepcopy(new), old))
        self._wake()
        # An object marked for deletion goes away once its last finalizer is removed.
        meta = new["metadata"]
        if type_ == "MODIFIED" and meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._commit(key, "DELETED", copy.deepcopy(new), new)

    def _key(self, request: kmock.Request) -> ObjKey:
        assert request.resource is not None and request.name is not None
        return (request.resource, request.namespace, request.name)

    def _current(self, key: ObjKey) -> Obj | None:
        if key not in self.objects or self.objects[key].deleted:
            return None
        return copy.deepcopy(self.objects[key].raw)

    def _existing(self, key: ObjKey) -> Obj:
        current = self._current(key)
        if current is None:
            raise kmock.KubernetesError(
                status=404,
                reason="NotFound",
                message=f'{key[0].plural} "{key[2]}" not found',
                details={"name": key[2], "kind": key[0].plural},
            )
        current.setdefault("metadata", {})
        return current

    def _check_rv(self, key: ObjKey, current: Obj, wanted: Any) -> None:
        have = current.get("metadata", {}).get("resourceVersion")
        if wanted is not None and str(wanted) != have:
            raise kmock.KubernetesError(
                status=409,
                reason="Conflict",
                message=(
                    f'Operation cannot be fulfilled on {key[0].plural} "{key[2]}": the object '
                    "has been modified; please apply your changes to the latest version and try again"
                ),
                details={"name": key[2], "kind": key[0].plural},
            )

    @staticmethod
    def _body(request: kmock.Request) -> Obj:
        if not isinstance(request.data, Mapping):
            raise _bad_request("the request body must be a JSON object")
        return copy.deepcopy(dict(request.data))

    def _wake(self) -> None:
        # Swap-then-set: a watcher that grabbed the old event before scanning the log
        # is woken; one that grabs the new event afterwards sees the change in the log.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # ---- reading ----------------------------------------------------------------------------

    def _matcher(self, request: kmock.Request) -> Callable[[ObjKey, Obj | None], bool]:
        labels = parse_label_selector(request.params.get("labelSelector", ""))
        fields = parse_field_selector(request.params.get("fieldSelector", ""))

        def matches(key: ObjKey, obj: Obj | None) -> bool:
            return (
                obj is not None
                and key[0] == request.resource
                and (request.namespace is None or key[1] == request.namespace)
                and (request.name is None or key[2] == request.name)
                and satisfies((obj.get("metadata", {}).get("labels") or {}).get, labels)
                and satisfies(lambda path: _field(obj, path), fields)
            )

        return matches

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        assert request.resource is not None
        if request.resource not in self._get_resources():
            raise kmock.KubernetesResourceNotFoundError()
        matches = self._matcher(request)
        kind = _kind_of(request.resource)
        # Pages: `limit`, and an opaque `continue` token ("<resourceVersion>:<offset>"). Every page
        # says the first page's resourceVersion, so a watch from it replays what changed while
        # paging. A token from before a compaction has expired: 410, as on the apiserver.
        limit = int(request.params.get("limit") or 0)
        token = request.params.get("continue") or ""
        listed, _, offset = token.partition(":")
        async with self._lock:
            if token and (not listed.isdigit() or not offset.isdigit()):
                raise _bad_request(f"invalid continue token: {token!r}")
            if token and int(listed) < self._compacted_rv:
                raise kmock.KubernetesError(
                    status=410,
                    reason="Expired",
                    message="the provided continue parameter is too old",
                )
            items = [
                copy.deepcopy(obj.raw)
                for key, obj in sorted(self.objects.items(), key=lambda kv: str(kv[0]))
                if not obj.deleted and matches(key, obj.raw)
            ]
            rv = listed if token else str(self.resource_version)
        start = int(offset) if token else 0
        end = start + limit if limit > 0 else len(items)
        meta: Obj = {"resourceVersion": rv}
        if end < len(items):
            meta["continue"] = f"{rv}:{end}"
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": meta,
            "items": items[start:end],
        }

    async def _serve_replace(self, request: kmock.Request) -> kmock.Payload:
        # The write happened in _handle(); this only renders the stored state.
        async with self._lock:
            return self._existing(self._key(request))

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        # Validate before the first chunk: errors raised here become proper HTTP error responses.
        assert request.resource is not None
        matches = self._matcher(request)
        params = request.params
        since = params.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise _bad_request(f"invalid resourceVersion: {since!r}")
        timeout = float(params.get("timeoutSeconds", 0) or 0)  # 0: no server-side timeout
        deadline = asyncio.get_running_loop().time() + timeout if timeout > 0 else None
        bookmarks = params.get("allowWatchBookmarks") == "true"
        kind = _kind_of(request.resource)
        cuts, bookmarks_seen = self._cuts, self._bookmarks

        yield b""  # send the headers now, as the apiserver does, even if no events follow

        if self._expire_next > 0 or (since not in ("", "0") and int(since) < self._compacted_rv):
            self._expire_next = max(0, self._expire_next - 1)
            message = f"too old resource version: {since} ({self._compacted_rv})"
            yield {"type": "ERROR", "object": _status(410, "Expired", message)}
            return

        async with self._lock:
            if since in ("", "0"):  # "get state and start at most recent"
                cursor = self.resource_version
                initial = [
                    {"type": "ADDED", "object": copy.deepcopy(obj.raw)}
                    for key, obj in self.objects.items()
                    if not obj.deleted and matches(key, obj.raw)
                ]
            else:
                cursor, initial = int(since), []
        for event in initial:
            yield event

        position = bisect.bisect_right(self._log, cursor, key=lambda e: e.rv)
        while True:
            changed = self._changed  # grab before scanning, see _wake()
            while position < len(self._log):
                entry = self._log[position]
                position += 1
                if (filtered := self._filter(entry, matches)) is not None:
                    yield filtered
            if self._cuts != cuts:
                if self._abort_cut and request._raw_request is not None:
                    transport = request._raw_request.transport
                    if transport is not None:
                        transport.abort()  # the client sees a broken chunked stream
                return
            if self._bookmarks != bookmarks_seen:
                bookmarks_seen = self._bookmarks
                if bookmarks:  # only the resourceVersion matters in a bookmark
                    rv = {"resourceVersion": str(self.resource_version)}
                    mark = {"kind": kind.kind, "apiVersion": kind.api_version, "metadata": rv}
                    yield {"type": "BOOKMARK", "object": mark}
            remaining = None if deadline is None else deadline - asyncio.get_running_loop().time()
            if remaining is not None and remaining <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return  # timeoutSeconds elapsed: end the stream cleanly, as the apiserver does

    @staticmethod
    def _filter(entry: _Event, matches: Callable[[ObjKey, Obj | None], bool]) -> Obj | None:
        """Translate a logged event for a selector: objects can enter or leave its view."""
        now, before = matches(entry.key, entry.obj), matches(entry.key, entry.old)
        seen_as: str | None
        if entry.type == "MODIFIED" and now != before:
            seen_as = "ADDED" if now else "DELETED"
        elif entry.type == "DELETED":
            seen_as = "DELETED" if before or now else None
        else:
            seen_as = entry.type if now else None
        return None if seen_as is None else {"type": seen_as, "object": copy.deepcopy(entry.obj)}


# --------------------------------------------------------------------------------------------
# The harness: serve an emulator on 127.0.0.1 from a background thread.
# --------------------------------------------------------------------------------------------


class _QuickShutdownServer(aiohttp.test_utils.RawTestServer):
    """aiohttp waits up to 60 s for open requests on shutdown; plain kmock's watches never end."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> aiohttp.web.ServerRunner:
        server = aiohttp.web.Server(self._handler, loop=self._loop, debug=debug, **kwargs)
        return aiohttp.web.ServerRunner(server, debug=debug, shutdown_timeout=0.2, **kwargs)


PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


class KubeAPI:
    """An emulated Kubernetes API on ``http://127.0.0.1:<free port>`` for one test."""

    def __init__(
        self,
        emulator: kmock.KubernetesEmulator,
        server: kmock.Server,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
    ) -> None:
        self.emulator = emulator  # touch it only via call(): it lives on the loop's thread
        self.url = str(server.url).rstrip("/")
        self._server = server
        self._loop = loop
        self._thread = thread
        self._http = urllib3.PoolManager(timeout=urllib3.Timeout(total=10))
        self._stopped = False

    @classmethod
    def start(cls, *, strict: bool = True) -> Self:
        """Serve a :class:`StrictKubernetesEmulator`, or plain kmock if ``strict=False``."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="kubeapi", daemon=True)
        thread.start()

        async def serve() -> tuple[kmock.KubernetesEmulator, kmock.Server]:
            # Built on the loop: kmock's asyncio primitives must belong to it.
            emulator = StrictKubernetesEmulator() if strict else kmock.KubernetesEmulator()
            declare_kinds(emulator)  # plain kmock 404s lists of resources it has not seen yet
            await emulator.__aenter__()
            server = kmock.Server(emulator, host="127.0.0.1", server_cls=_QuickShutdownServer)
            await server.__aenter__()
            return emulator, server

        try:
            emulator, server = asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
        except BaseException:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.close()
            raise
        return cls(emulator, server, loop, thread)

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True

        async def shutdown() -> None:
            if isinstance(self.emulator, StrictKubernetesEmulator):
                self.emulator.cut_watches()  # let the streams end before the server goes
            await self._server.__aexit__(None, None, None)
            await self.emulator.__aexit__(None, None, None)

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
            self._http.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- clients ----------------------------------------------------------------------------

    def write_kubeconfig(self, path: str | Path, *, namespace: str = "default") -> Path:
        """A kubeconfig for the daemons: plain http, no credentials."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "kmock", "user": {}}],
            "contexts": [
                {
                    "name": "kmock",
                    "context": {"cluster": "kmock", "user": "kmock", "namespace": namespace},
                }
            ],
            "current-context": "kmock",
        }
        path = Path(path)
        path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        return path

    def api_client(self) -> kubernetes.client.ApiClient:
        """An official client bound to this API (no global config). Close it after use."""
        return kubernetes.client.ApiClient(kubernetes.client.Configuration(host=self.url))

    def call(self, fn: Callable[[kmock.KubernetesEmulator], T], timeout: float = 10) -> T:
        """Run ``fn(emulator)`` on the emulator's loop (kmock's DSL, hooks) and return its result."""
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn(self.emulator))
            except BaseException as e:
                future.set_exception(e)

        self._loop.call_soon_threadsafe(run)
        return future.result(timeout)

    def requests(self) -> list[kmock.Request]:
        """Requests served so far (kmock's own record, the recent ones with the strict
        emulator: see ``journal`` for all), oldest first."""
        return self.call(list)

    # ---- objects over HTTP (so that the strict emulator versions them) -----------------------

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """One HTTP request; errors raise the client's ApiException subclasses (404, 409, ...)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, HARNESS_HEADER: "1"}
        response = self._http.request(method, self.url + path, body=data, headers=headers)
        text = response.data.decode()
        if response.status >= 400:
            raise ApiException.from_response(http_resp=response, body=text, data=None)
        return json.loads(text) if text else None

    def create(self, resource: str, body: Obj, namespace: str | None = None) -> Obj:
        namespace = namespace or body.get("metadata", {}).get("namespace")
        if namespace is not None:  # plain kmock stores only what it is sent: keep it realistic
            body = {**body, "metadata": {**body.get("metadata", {}), "namespace": namespace}}
        return self.request("POST", _kind(resource).path(namespace), body)  # type: ignore[no-any-return]

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        return self.request("GET", _kind(resource).path(namespace, name))  # type: ignore[no-any-return]

    def find(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """Like :meth:`get`, but None if it does not exist."""
        try:
            return self.get(resource, name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_objects(self, resource: str, namespace: str | None = None) -> list[Obj]:
        return self.request("GET", _kind(resource).path(namespace))["items"]  # type: ignore[no-any-return]

    def patch(
        self,
        resource: str,
        name: str,
        body: Obj | list[Obj],
        namespace: str | None = None,
        *,
        patch_type: str = "merge",
    ) -> Obj:
        path = _kind(resource).path(namespace, name)
        return self.request("PATCH", path, body, PATCH_TYPES[patch_type])  # type: ignore[no-any-return]

    def replace(self, resource: str, name: str, body: Obj, namespace: str | None = None) -> Obj:
        """PUT; the strict emulator only (plain kmock answers 404)."""
        return self.request("PUT", _kind(resource).path(namespace, name), body)  # type: ignore[no-any-return]

    def delete(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        return self.request("DELETE", _kind(resource).path(namespace, name))  # type: ignore[no-any-return]

    # ---- strict-only hooks, marshalled to the loop ----------------------------------------

    def _strict(self, fn: Callable[[StrictKubernetesEmulator], T]) -> T:
        def run(emulator: kmock.KubernetesEmulator) -> T:
            if not isinstance(emulator, StrictKubernetesEmulator):
                raise TypeError("this hook needs KubeAPI.start(strict=True)")
            return fn(emulator)

        return self.call(run)

    @property
    def resource_version(self) -> int:
        return self._strict(lambda e: e.resource_version)

    def cut_watches(self, *, abort: bool = False) -> None:
        self._strict(lambda e: e.cut_watches(abort=abort))

    def expire_watches(self, count: int = 1) -> None:
        self._strict(lambda e: e.expire_watches(count))

    def compact(self) -> None:
        self._strict(lambda e: e.compact())

    def fail_next(
        self,
        count: int = 1,
        *,
        status: int = 500,
        method: str | None = None,
        action: str | None = None,
        plural: str | None = None,
        about: str | None = None,
    ) -> None:
        self._strict(
            lambda e: e.fail_next(
                count, status=status, method=method, action=action, plural=plural, about=about
            )
        )

    def send_bookmarks(self) -> None:
        self._strict(lambda e: e.send_bookmarks())

    def unreachable(self, seconds: float) -> None:
        self._strict(lambda e: e.unreachable(seconds))

    def slow(self, seconds: float, delay: float) -> None:
        self._strict(lambda e: e.slow(seconds, delay))

    def journal(self) -> list[JournalEntry]:
        return self._strict(lambda e: list(e.journal))


def _kind(resource: str) -> Kind:
    """``"configmaps"`` or any kmock notation (``"example.com/v1/widgets"``) to a Kind."""
    return KINDS.get(resource) or _kind_of(kmock.resource(resource))


def eventually(check: Callable[[], T | None], timeout: float = 5.0, interval: float = 0.02) -> T:
    """Poll ``check`` until it returns a truthy value (returned) or the timeout passes.

    Exceptions count as "not yet" (e.g. a 404 before the daemon created its ConfigMap);
    the last one is chained to the AssertionError for debugging.
    """
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as e:
            last_error = e
        if time.monotonic() >= deadline:
            raise AssertionError(f"not true within {timeout}s") from last_error
        time.sleep(interval)
