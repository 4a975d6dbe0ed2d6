"""A Kubernetes API endpoint that takes every write at once, for benchmarking the updater itself.

    .venv/bin/python -m bench.fakeapi [--port 0] [--delay-ms N] [--load FILE ...]

The emulator the tests use (tests/support/kubeapi.py, kmock) spends more CPU and memory per
object than the updater does: at 45,000 ResourceSlices of ~26 KB each, what a benchmark of the
updater measured would be the emulator's queueing. This server does the least a real API server
does for the calls the official `kubernetes` client makes from the updater, in its own process
(stdlib only), so that the updater's CPU and memory are what is measured:

- core `/api/v1/...` and group `/apis/<group>/<version>/...` paths, namespaced and cluster-scoped,
  with the `/status` subresource; a resource it has never seen lists empty, so nothing waits;
- GET list in pages (`limit`, `continue`), `labelSelector` (`k=v`, `k!=v`, `k`, `!k`,
  `k in (..)`, `k notin (..)`) and `fieldSelector` (`metadata.name`, `metadata.namespace`, and
  any other dotted field, read from the object); the List carries the store's resourceVersion;
- `?watch=true` from a `resourceVersion`: every later change that matches, one chunk per event,
  until `timeoutSeconds`; a resourceVersion older than the kept event log gets the 410 ERROR
  event a real API sends;
- POST (409 AlreadyExists, `generateName`), PUT (409 Conflict on a stale resourceVersion), PATCH
  (merge and strategic-merge patches both as RFC 7386 merge patches, a stale
  `metadata.resourceVersion` in them 409; JSON patch add/replace/remove/test) and DELETE (404,
  `preconditions` 409). Each write bumps one global resourceVersion.

Objects are kept as their JSON bytes plus the few fields selectors read (name, namespace, labels,
resourceVersion): a parsed dict per object would be several times the bytes. Lists and watch
events send the stored bytes as they are.

For the benchmark itself (never asked by the updater), under `/_bench/`:

- `stats`: objects per resource, writes per `METHOD resource`, the resourceVersion;
- `wait?resource=R&namespace=N&name=X&contains=S&timeout=T`: blocks until that object's stored
  JSON contains S and answers `{"at": <time.monotonic() of that write>, "rv": ...}` (408 after T
  seconds). Every write's answer also carries that time in `X-Bench-At`: the monotonic clock is
  the machine's, so the benchmark can time from its own writes to the updater's.

It prints its port on stdout, then nothing else there.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import copy
import datetime as dt
import json
import random
import select
import socket
import string
import sys
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
# plural -> (group, version, kind, namespaced): what lists and loaded files need to name. A
# resource not here is still served, by its path alone.
KINDS: dict[str, tuple[str, str, str, bool]] = {
    "nodes": ("", "v1", "Node", False),
    "namespaces": ("", "v1", "Namespace", False),
    "pods": ("", "v1", "Pod", True),
    "configmaps": ("", "v1", "ConfigMap", True),
    "secrets": ("", "v1", "Secret", True),
    "services": ("", "v1", "Service", True),
    "events": ("", "v1", "Event", True),
    "leases": ("coordination.k8s.io", "v1", "Lease", True),
    "resourceslices": ("resource.k8s.io", "v1", "ResourceSlice", False),
    "resourceclaims": ("resource.k8s.io", "v1", "ResourceClaim", True),
    "resourceclaimtemplates": ("resource.k8s.io", "v1", "ResourceClaimTemplate", True),
    "deviceclasses": ("resource.k8s.io", "v1", "DeviceClass", False),
    "statefulsets": ("apps", "v1", "StatefulSet", True),
    "deployments": ("apps", "v1", "Deployment", True),
    "daemonsets": ("apps", "v1", "DaemonSet", True),
}
PLURAL_OF_KIND = {kind: plural for plural, (_, _, kind, _) in KINDS.items()}
# A real API answers a DELETE of these with a Status, of the rest with the object deleted: what
# the client's generated methods expect to read back.
STATUS_ON_DELETE_GROUP = ""
OBJECT_ON_DELETE = frozenset({"pods"})
WATCH_DEFAULT_S = 1800  # a watch without timeoutSeconds: the real API picks 30 to 60 minutes
IDLE_CHECK_S = 1.0  # how often an idle watch looks whether its client went away
SEND_BATCH = 1 << 20  # bytes per socket write when a list is sent


def compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str) -> bytes:
    """A Status as the real API answers an error with."""
    return compact({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": message, "reason": reason, "code": code})  # fmt: skip


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# --- selectors -------------------------------------------------------------------------------


Matcher = Callable[["Entry"], bool]


def _split_top(text: str) -> list[str]:
    """Comma-separated terms, commas inside `in (a,b)` kept."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t.strip() for t in terms if t.strip()]


Term = tuple[str, str, frozenset[str]]  # (key, op, values): op one of = != in notin exists !


def parse_terms(text: str, set_based: bool) -> list[Term]:
    """A selector's terms: `k=v` (or `==`), `k!=v`, and for labels `k in (..)`, `k notin (..)`,
    `k`, `!k`."""
    terms: list[Term] = []
    for term in _split_top(text):
        words = term.split()
        if set_based and len(words) >= 2 and words[1] in ("in", "notin"):
            inner = term.split("(", 1)[1].rsplit(")", 1)[0]
            terms.append((words[0], words[1], frozenset(v.strip() for v in inner.split(","))))
        elif "!=" in term:
            key, value = term.split("!=", 1)
            terms.append((key.strip(), "!=", frozenset({value.strip()})))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append((key.strip(), "=", frozenset({value.strip()})))
        elif set_based and term.startswith("!"):
            terms.append((term[1:].strip(), "!", frozenset()))
        elif set_based:
            terms.append((term, "exists", frozenset()))
        else:
            raise ApiError(400, "BadRequest", f"field selector term {term!r} is not k=v or k!=v")
    return terms


def holds(value: str | None, op: str, values: frozenset[str]) -> bool:
    if op in ("=", "in"):
        return value in values
    if op in ("!=", "notin"):
        return value not in values
    return (value is not None) == (op == "exists")


def _field(entry: Entry, path: str) -> str:
    if path == "metadata.name":
        return entry.name
    if path == "metadata.namespace":
        return entry.namespace
    value: Any = json.loads(entry.data)  # any other field: read from the object (rare)
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def matcher(namespace: str | None, labels: str | None, fields: str | None) -> Matcher:
    by_labels = parse_terms(labels, set_based=True) if labels else []
    by_fields = parse_terms(fields, set_based=False) if fields else []

    def match(entry: Entry) -> bool:
        return (
            (namespace is None or entry.namespace == namespace)
            and all(holds(entry.labels.get(k), op, vs) for k, op, vs in by_labels)
            and all(holds(_field(entry, k), op, vs) for k, op, vs in by_fields)
        )

    return match


# --- patches -----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"JSON pointer {path!r} must start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902's add, replace, remove and test (what the clients send in practice)."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "a JSON patch is a list of operations")
    for op in ops:
        if not isinstance(op, dict):
            raise ApiError(400, "BadRequest", "a JSON patch operation is an object")
        parts = _pointer(str(op.get("path", "")))
        kind = op.get("op")
        if not parts:
            if kind in ("add", "replace"):
                doc = copy.deepcopy(op.get("value"))
                continue
            raise ApiError(422, "Invalid", f"op {kind} on the whole document")
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent.get(part)
            if parent is None:
                raise ApiError(422, "Invalid", f"path {op.get('path')} does not exist")
        last = parts[-1]
        try:
            if kind == "test":
                found = parent[int(last)] if isinstance(parent, list) else parent[last]
                if found != op.get("value"):
                    raise ApiError(422, "Invalid", f"test of {op.get('path')} failed")
            elif kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif kind in ("add", "replace"):
                value = copy.deepcopy(op.get("value"))
                if isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if kind == "add":
                        parent.insert(index, value)
                    else:
                        parent[index] = value
                else:
                    if kind == "replace" and last not in parent:
                        raise ApiError(422, "Invalid", f"path {op.get('path')} does not exist")
                    parent[last] = value
            else:
                raise ApiError(422, "Invalid", f"JSON patch op {kind!r} is not supported")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(422, "Invalid", f"path {op.get('path')} does not apply") from None
    return doc


# --- the store ---------------------------------------------------------------------------------


class Entry:
    """One object: its JSON bytes and what selectors read of it."""

    __slots__ = ("at", "data", "labels", "name", "namespace", "rv", "uid")

    def __init__(self, obj: Obj, data: bytes, at: float) -> None:
        meta = obj["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace") or ""
        labels = meta.get("labels")
        self.labels: dict[str, str] = labels if isinstance(labels, dict) else {}
        self.rv = int(meta["resourceVersion"])
        self.uid: str = meta.get("uid") or ""
        self.data, self.at = data, at


@dataclass(frozen=True)
class Event:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED
    entry: Entry  # the object as it was after the change (before it, for DELETED)


Key = tuple[str, str]  # (namespace, name); "" for cluster-scoped objects


class Store:
    """Every object by resource, and a bounded log of changes for watches, under one lock."""

    def __init__(self, max_events: int, max_event_bytes: int) -> None:
        self.changed = threading.Condition()
        self.rv = 1
        self.objects: dict[str, dict[Key, Entry]] = {}
        self._sorted: dict[str, list[Key]] = {}  # keys in list order, dropped on create/delete
        self.events: list[Event] = []
        self.dropped = 0  # events trimmed from the log's front
        self._event_bytes = 0
        self.max_events, self.max_event_bytes = max_events, max_event_bytes
        self.writes: Counter[str] = Counter()

    # --- under the lock ---

    def _keys(self, resource: str) -> list[Key]:
        keys = self._sorted.get(resource)
        if keys is None:
            keys = self._sorted[resource] = sorted(self.objects.get(resource, {}))
        return keys

    def _commit(self, resource: str, kind: str, obj: Obj, meta: Obj, method: str) -> Entry:
        """Store `obj` at the next resourceVersion and log the change."""
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        data = compact(obj)
        entry = Entry(obj, data, time.monotonic())
        table = self.objects.setdefault(resource, {})
        key = (entry.namespace, entry.name)
        if key not in table:
            self._sorted.pop(resource, None)
        table[key] = entry
        self._log(Event(self.rv, resource, kind, entry))
        self.writes[f"{method} {resource}"] += 1
        return entry

    def _log(self, event: Event) -> None:
        self.events.append(event)
        self._event_bytes += len(event.entry.data)
        if len(self.events) > self.max_events or self._event_bytes > self.max_event_bytes:
            # Trim a quarter at once: deleting a list's front is linear, so not every event.
            cut = max(1, len(self.events) // 4)
            self._event_bytes -= sum(len(e.entry.data) for e in self.events[:cut])
            del self.events[:cut]
            self.dropped += cut
        self.changed.notify_all()

    # --- operations ---

    def create(self, resource: str, namespace: str, obj: Obj) -> Entry:
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError(400, "BadRequest", "metadata must be an object")
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            meta["name"] = prefix + "".join(random.choices(string.ascii_lowercase + "0123456789",
                                                           k=5))  # fmt: skip
        if namespace:
            meta["namespace"] = namespace
        _fill_type(resource, obj)
        with self.changed:
            if (namespace, meta["name"]) in self.objects.get(resource, {}):
                raise ApiError(409, "AlreadyExists",
                               f'{resource} "{meta["name"]}" already exists')  # fmt: skip
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_rfc3339()
            meta.setdefault("generation", 1)
            return self._commit(resource, "ADDED", obj, meta, "POST")

    def get(self, resource: str, namespace: str, name: str) -> Entry:
        with self.changed:
            entry = self.objects.get(resource, {}).get((namespace, name))
        if entry is None:
            raise ApiError(404, "NotFound", f'{resource} "{name}" not found')
        return entry

    def replace(self, resource: str, namespace: str, name: str, obj: Obj, sub: str | None) -> Entry:
        with self.changed:
            old = self.get(resource, namespace, name)
            meta = obj.get("metadata")
            if not isinstance(meta, dict):
                meta = obj["metadata"] = {}
            wanted = meta.get("resourceVersion")
            if wanted and str(wanted) != str(old.rv):
                raise ApiError(409, "Conflict", _conflict(resource, name))
            stored = json.loads(old.data)
            if sub is not None:  # a subresource replaces only itself
                stored[sub] = obj.get(sub)
                obj, meta = stored, stored["metadata"]
            else:
                for kept in ("uid", "creationTimestamp", "generation"):
                    if kept in stored["metadata"]:
                        meta[kept] = stored["metadata"][kept]
                meta["name"] = name
                if namespace:
                    meta["namespace"] = namespace
                _fill_type(resource, obj)
            return self._commit(resource, "MODIFIED", obj, meta, "PUT")

    def patch(self, resource: str, namespace: str, name: str, kind: str, patch: Any) -> Entry:
        with self.changed:
            old = self.get(resource, namespace, name)
            stored = json.loads(old.data)
            if "json-patch" in kind:
                obj = json_patch(stored, patch)
            else:  # merge-patch, and strategic merge taken as one
                wanted = ((patch or {}).get("metadata") or {}).get("resourceVersion")
                if wanted and str(wanted) != str(old.rv):
                    raise ApiError(409, "Conflict", _conflict(resource, name))
                obj = merge_patch(stored, patch)
            if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
                raise ApiError(422, "Invalid", "the patch left no metadata")
            meta = obj["metadata"]
            meta.update(name=name, uid=old.uid)
            if namespace:
                meta["namespace"] = namespace
            return self._commit(resource, "MODIFIED", obj, meta, "PATCH")

    def delete(self, resource: str, namespace: str, name: str, options: Obj) -> Entry:
        preconditions = options.get("preconditions") or {}
        with self.changed:
            old = self.get(resource, namespace, name)
            wanted_rv, wanted_uid = preconditions.get("resourceVersion"), preconditions.get("uid")
            if (wanted_rv and str(wanted_rv) != str(old.rv)) or (
                wanted_uid and wanted_uid != old.uid
            ):
                raise ApiError(409, "Conflict", _conflict(resource, name))  # fmt: skip
            del self.objects[resource][(namespace, name)]
            self._sorted.pop(resource, None)
            self.rv += 1
            # The object as deleted carries the deletion's resourceVersion, as a real API's does.
            obj = json.loads(old.data)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            gone = Entry(obj, compact(obj), time.monotonic())
            self._log(Event(self.rv, resource, "DELETED", gone))
            self.writes[f"DELETE {resource}"] += 1
            return gone

    def page(
        self, resource: str, match: Matcher, limit: int, token: str | None
    ) -> tuple[list[bytes], int, str | None]:
        """One page of a list: the items' bytes, the list's resourceVersion, the next token."""
        version, after = self.rv, None
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token))
                version, after = int(decoded["rv"]), tuple(decoded["after"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(400, "BadRequest", "invalid continue token") from None
        items: list[bytes] = []
        with self.changed:
            table = self.objects.get(resource, {})
            keys = self._keys(resource)
            start = bisect.bisect_right(keys, after) if after is not None else 0
            last: Key | None = None
            for i in range(start, len(keys)):
                if limit and len(items) >= limit:
                    last = keys[i - 1]  # more follow: the next page starts after this one
                    break
                entry = table[keys[i]]
                if match(entry):
                    items.append(entry.data)
        next_token = None
        if last is not None:
            next_token = base64.urlsafe_b64encode(
                compact({"rv": version, "after": list(last)})
            ).decode()
        return items, version, next_token

    def stats(self) -> Obj:
        with self.changed:
            return {"rv": self.rv, "events": len(self.events), "dropped": self.dropped,
                    "objects": {r: len(t) for r, t in sorted(self.objects.items())},
                    "writes": dict(sorted(self.writes.items()))}  # fmt: skip

    def wait_for(
        self, resource: str, namespace: str, name: str, needle: bytes, timeout: float
    ) -> Entry | None:
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                entry = self.objects.get(resource, {}).get((namespace, name))
                if entry is not None and needle in entry.data:
                    return entry
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def load(self, items: Iterable[Obj]) -> int:
        count = 0
        for obj in items:
            plural = PLURAL_OF_KIND.get(str(obj.get("kind")))
            if plural is None:
                raise SystemExit(f"--load: kind {obj.get('kind')!r} is not one this server knows")
            namespaced = KINDS[plural][3]
            namespace = str((obj.get("metadata") or {}).get("namespace") or "default")
            self.create(plural, namespace if namespaced else "", obj)
            count += 1
        return count


def _conflict(resource: str, name: str) -> str:
    return (f'Operation cannot be fulfilled on {resource} "{name}": the object has been '
            "modified; please apply your changes to the latest version and try again")  # fmt: skip


def _fill_type(resource: str, obj: Obj) -> None:
    known = KINDS.get(resource)
    if known is not None:
        group, version, kind, _ = known
        obj.setdefault("apiVersion", f"{group}/{version}" if group else version)
        obj.setdefault("kind", kind)


# --- HTTP --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    group: str
    version: str
    resource: str
    namespace: str | None  # None: the cluster-scoped path (all namespaces, for a list)
    name: str | None
    sub: str | None


def route(path: str) -> Route | None:
    parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[0] == "apis" and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    return Route(group, version, rest[0], namespace, rest[1] if len(rest) > 1 else None,
                 rest[2] if len(rest) > 2 else None)  # fmt: skip


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], store: Store, delay_s: float) -> None:
        super().__init__(address, Handler)
        self.store, self.delay_s = store, delay_s


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server: Server

    def setup(self) -> None:
        super().setup()
        # Headers and body, and each watch event, are separate small writes: with Nagle's
        # algorithm each would wait for the client's delayed ACK (40 ms a request on Linux).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per request would cost more than the request

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # --- answers ---

    def _send(self, code: int, body: bytes, at: float | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if at is not None:
            self.send_header("X-Bench-At", repr(at))
        self.end_headers()
        self.wfile.write(body)

    def _send_parts(self, head: bytes, items: list[bytes], tail: bytes) -> None:
        """A List whose items are stored bytes, sent without joining them into one copy."""
        length = len(head) + sum(map(len, items)) + max(len(items) - 1, 0) + len(tail)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(length))
        self.end_headers()
        buffer = [head]
        size = len(head)
        for i, item in enumerate(items):
            if i:
                buffer.append(b",")
            buffer.append(item)
            size += len(item) + 1
            if size >= SEND_BATCH:
                self.wfile.write(b"".join(buffer))
                buffer, size = [], 0
        buffer.append(tail)
        self.wfile.write(b"".join(buffer))

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "the body is not JSON") from None

    # --- dispatch ---

    def _handle(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        try:
            if url.path.startswith("/_bench/"):
                self._bench(url.path, query)
                return
            if self.server.delay_s:
                time.sleep(self.server.delay_s)
            body = self._body() if method != "GET" else None
            if method == "GET" and self._meta(url.path):
                return
            r = route(url.path)
            if r is None:
                raise ApiError(404, "NotFound", f"the server could not find {url.path}")
            self._resource(method, r, query, body)
        except ApiError as e:
            self._send(e.code, status_body(e.code, e.reason, e.message))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _meta(self, path: str) -> bool:
        """/version and discovery, minimally: what a client may ask before anything else."""
        answers: dict[str, Obj] = {
            "/version": {"major": "1", "minor": "34", "gitVersion": "v1.34.0-bench-fakeapi"},
            "/api": {"kind": "APIVersions", "versions": ["v1"]},
            "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                 "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}}
                for g, v in sorted({(g, v) for g, v, _, _ in KINDS.values() if g})]},
        }  # fmt: skip
        key = path.rstrip("/") or "/"
        if key in ("/healthz", "/readyz", "/livez"):
            self._send(200, b"ok")
            return True
        if key not in answers:
            return False
        self._send(200, compact(answers[key]))
        return True

    def _resource(self, method: str, r: Route, query: dict[str, str], body: Any) -> None:
        store = self.server.store
        namespace = r.namespace or ""
        if method == "GET" and r.name is None:
            match = matcher(r.namespace, query.get("labelSelector"), query.get("fieldSelector"))
            if query.get("watch") in ("true", "1", "True"):
                self._watch(r, match, query)
            else:
                self._list(r, match, query)
            return
        if r.name is None and method != "POST":
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection is not served")
        if method == "GET":
            assert r.name is not None
            self._send(200, store.get(r.resource, namespace, r.name).data)
            return
        if method == "DELETE":
            assert r.name is not None
            gone = store.delete(
                r.resource, namespace, r.name, body if isinstance(body, dict) else {}
            )
            if r.group == STATUS_ON_DELETE_GROUP and r.resource not in OBJECT_ON_DELETE:
                details = {"name": r.name, "kind": r.resource, "uid": gone.uid}
                answer = compact({"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Success", "details": details})  # fmt: skip
                self._send(200, answer, gone.at)
            else:
                self._send(200, gone.data, gone.at)
            return
        if method == "PATCH":
            assert r.name is not None
            kind = self.headers.get("Content-Type") or "application/merge-patch+json"
            entry = store.patch(r.resource, namespace, r.name, kind, body)
            self._send(200, entry.data, entry.at)
            return
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be a JSON object")
        if method == "POST":
            entry = store.create(r.resource, namespace, body)
            self._send(201, entry.data, entry.at)
        elif method == "PUT":
            assert r.name is not None
            entry = store.replace(r.resource, namespace, r.name, body, r.sub)
            self._send(200, entry.data, entry.at)
        else:
            raise ApiError(405, "MethodNotAllowed", f"{method} is not served")

    def _list(self, r: Route, match: Matcher, query: dict[str, str]) -> None:
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise ApiError(400, "BadRequest", "limit must be a number") from None
        items, version, token = self.server.store.page(
            r.resource, match, limit, query.get("continue")
        )
        kind = KINDS.get(r.resource, ("", "", r.resource.capitalize(), False))[2]
        meta: Obj = {"resourceVersion": str(version)}
        if token:
            meta["continue"] = token
        api_version = f"{r.group}/{r.version}" if r.group else r.version
        head = compact({"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta})
        self._send_parts(head[:-1] + b',"items":[', items, b"]}")

    def _watch(self, r: Route, match: Matcher, query: dict[str, str]) -> None:
        store = self.server.store
        try:
            timeout = float(query.get("timeoutSeconds") or WATCH_DEFAULT_S)
        except ValueError:
            raise ApiError(400, "BadRequest", "timeoutSeconds must be a number") from None
        deadline = time.monotonic() + timeout
        since = query.get("resourceVersion") or "0"
        initial: list[bytes] = []
        with store.changed:
            if since == "0":  # no version: the current objects first, as ADDED
                initial = [e.data for e in store.objects.get(r.resource, {}).values() if match(e)]
                position = store.dropped + len(store.events)
                expired = False
            else:
                try:
                    version = int(since)
                except ValueError:
                    raise ApiError(400, "BadRequest", "resourceVersion must be a number") from None
                first = store.events[0].rv if store.events else store.rv + 1
                expired = store.dropped > 0 and version + 1 < first
                position = store.dropped + bisect.bisect_right(store.events, version,
                                                               key=lambda e: e.rv)  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if expired:
            self._expired(since)
            return
        for data in initial:
            self._chunk(b'{"type":"ADDED","object":' + data + b"}\n")
        for event in self._events(r.resource, position, deadline):
            if event is None:
                self._expired(since)
                return
            if match(event.entry):
                self._chunk(b'{"type":"' + event.type.encode() + b'","object":' +
                            event.entry.data + b"}\n")  # fmt: skip
        self._chunk(b"")

    def _events(self, resource: str, position: int, deadline: float) -> Iterator[Event | None]:
        """The resource's events from `position` in the log until `deadline`; None once the
        log no longer holds `position` (the watcher fell behind: 410)."""
        store = self.server.store
        while True:
            with store.changed:
                if position < store.dropped:
                    yield None
                    return
                batch = store.events[position - store.dropped :]
                position += len(batch)
                if not batch:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    store.changed.wait(min(left, IDLE_CHECK_S))
            if not batch and self._client_gone():
                return
            for event in batch:
                if event.resource == resource:
                    yield event
            if time.monotonic() >= deadline:
                return

    def _client_gone(self) -> bool:
        """Whether the client closed its end: a watch it left would otherwise be served until
        its timeout (minutes) for nobody."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _expired(self, since: str) -> None:
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": f"too old resource version: {since}", "reason": "Expired",
                  "code": 410}  # fmt: skip
        self._chunk(compact({"type": "ERROR", "object": status}) + b"\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    # --- the benchmark's own ---

    def _bench(self, path: str, query: dict[str, str]) -> None:
        store = self.server.store
        if path == "/_bench/stats":
            self._send(200, compact(store.stats()))
            return
        if path == "/_bench/wait":
            try:
                resource, name = query["resource"], query["name"]
                timeout = float(query.get("timeout") or 30)
            except (KeyError, ValueError):
                raise ApiError(400, "BadRequest", "resource, name and a timeout") from None
            entry = store.wait_for(resource, query.get("namespace", ""), name,
                                   query.get("contains", "").encode(), timeout)  # fmt: skip
            if entry is None:
                raise ApiError(408, "Timeout", f"{resource} {name} did not show it in time")
            self._send(200, compact({"at": entry.at, "rv": entry.rv}))
            return
        raise ApiError(404, "NotFound", path)


def read_list(path: Path) -> list[Obj]:
    doc = json.loads(path.read_text())
    return list(doc.get("items", [])) if doc.get("kind", "").endswith("List") else [doc]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fakeapi", description=__doc__.split("\n")[0])
    p.add_argument("--address", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free one (printed)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="answer every request this late")
    p.add_argument("--load", type=Path, nargs="*", default=[],
                   help="JSON files (an object or a List) created before serving")  # fmt: skip
    p.add_argument("--max-events", type=int, default=500_000, help="events kept for watches")
    p.add_argument("--max-event-mib", type=int, default=4096,
                   help="bytes of events kept for watches (objects still stored are shared)")  # fmt: skip
    args = p.parse_args()
    store = Store(args.max_events, args.max_event_mib * 2**20)
    for path in args.load:
        count = store.load(read_list(path))
        print(f"loaded {count} objects from {path}", file=sys.stderr)
    server = Server((args.address, args.port), store, args.delay_ms / 1000)
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
