"""The edge to the Kubernetes API: client config, backoff, and a kopf-style list-then-watch loop.

Both daemons use this module and nothing of each other.

Objects travel as plain JSON dicts (what `kubectl get -o json` shows, or the part of it a
`transform` keeps): no model objects are built.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kubernetes
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from mig_exporter.common.text import one_line

log = logging.getLogger(__name__)
Obj = dict[str, Any]
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read: every call has one
WATCH_TIMEOUT_S = 240  # the server ends the stream; a silent one is cut a little after
LIST_PAGE = (
    500  # objects per list page, as client-go's pager: a big list never sits whole in memory
)
TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError)


def port(text: str) -> int:
    """An argparse type: a TCP port (0: let the system choose, or none where a flag says so)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 5) or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return int(text)


class ConfigError(Exception):
    """No usable cluster configuration."""


def api_client(kubeconfig: str | None) -> kubernetes.client.ApiClient:
    """In-cluster service account, else the kubeconfig (flag, KUBECONFIG, ~/.kube/config)."""
    config = kubernetes.client.Configuration()
    try:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=config)
        else:
            kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=config)
    except (kubernetes.config.ConfigException, OSError, TypeError, ValueError, yaml.YAMLError) as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise ConfigError(f"kubeconfig {where}: {one_line(e)}") from None
    config.retries = 0  # the loops here retry with backoff; urllib3's own retries only add delay
    return kubernetes.client.ApiClient(config)


class Backoff:
    """Exponential backoff with full jitter, so replicas do not retry in lockstep."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.attempt = base, cap, 0

    def reset(self) -> None:
        self.attempt = 0

    def wait(self, stop: threading.Event) -> None:
        delay = random.uniform(0, min(self.cap, self.base * 2**self.attempt))
        self.attempt += 1
        stop.wait(delay)


def describe(e: BaseException) -> str:
    if isinstance(e, ApiException):
        return f"HTTP {e.status} {e.reason}"
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def _identity(obj: Obj) -> Any:
    return obj


def list_all(
    list_call: Callable[..., Any],
    selectors: Mapping[str, str],
    transform: Callable[[Obj], Any] = _identity,
) -> tuple[list[Any], str | None]:
    """Every object, a page at a time, each passed through `transform` as its page arrives;
    and the resourceVersion of the list. An expired continue token raises 410 (list again)."""
    items: list[Any] = []
    token: str | None = None
    while True:
        extra: dict[str, Any] = {"_continue": token} if token else {}
        response = list_call(
            **selectors,
            **extra,
            limit=LIST_PAGE,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        # A page is tens of thousands of new containers at once, and what a big list keeps lives
        # long: the cyclic collector would run again and again over both (a 160,000-pod list
        # spent 64 of its 117 s collecting, BENCHMARKS.md). So it waits while a page is read,
        # and what is kept leaves its passes; reference counting still frees all of it.
        collecting = gc.isenabled()
        gc.disable()
        try:
            body = json.loads(response.data)
            items += [transform(i) for i in body.get("items") or [] if isinstance(i, dict)]
        finally:
            if collecting:
                gc.enable()
        token = (body.get("metadata") or {}).get("continue") or None
        version = _version(body)
        del body, response
        gc.freeze()
        if token is None:
            return items, version


def list_watch(
    what: str,
    list_call: Callable[..., Any],
    on_reset: Callable[[list[Any]], None],
    on_event: Callable[[str, Obj], None],
    stop: threading.Event,
    *,
    on_error: Callable[[str], None] | None = None,
    watch_timeout_s: int = WATCH_TIMEOUT_S,
    transform: Callable[[Obj], Any] = _identity,
    **selectors: str,
) -> None:
    """List (in pages, each object through `transform`), then watch from the list's
    resourceVersion, until `stop`.

    410 Gone lists again; errors back off with jitter; a stream silent for longer than the server
    was asked to keep it open is cut by the read timeout and started again. A failure is logged
    when it is news (a new one, or the first after a list), not at every retry; `on_error` hears
    every one.
    """
    backoff = Backoff()
    said = Said(log)
    while not stop.is_set():
        try:
            items, version = list_all(list_call, selectors, transform)
            if said.ok():
                log.info("%s: listed again", what)
            on_reset(items)
            backoff.reset()
            while not stop.is_set():
                version = _watch_once(
                    list_call, version, on_event, stop, watch_timeout_s, selectors
                )
                if version is None:
                    break  # nothing to resume from (an API without resourceVersions): list again
        except ApiException as e:
            if e.status == 410:
                log.info("%s: watch expired (410 Gone), listing again", what)
                continue
            _report(what, e, on_error, said)
            backoff.wait(stop)
        except Exception as e:  # a watch thread must outlive any one bad response
            _report(what, e, on_error, said)
            backoff.wait(stop)


def failure_kind(e: BaseException) -> object:
    """What a failure is, as data: the API's HTTP status, else the exception's type (a message
    may differ at every try: an address, a time)."""
    return e.status if isinstance(e, ApiException) else type(e)


_NONE = object()


class Said:
    """A retrying loop's failures, logged when they are news: a failure of another kind
    (`failure_kind`), or the first after a success; never again at every retry."""

    def __init__(self, logger: logging.Logger) -> None:
        self._log = logger
        self._kind: object = _NONE

    def failed(self, message: str, e: BaseException) -> None:
        kind = failure_kind(e)
        if kind != self._kind:
            self._log.warning("%s; retrying", message)
            self._kind = kind

    def ok(self) -> bool:
        """The loop succeeded: whether it had been failing."""
        failing, self._kind = self._kind is not _NONE, _NONE
        return failing


def _report(
    what: str, e: BaseException, on_error: Callable[[str], None] | None, said: Said
) -> None:
    message = f"{what}: {describe(e)}"
    said.failed(message, e)
    if on_error is not None:
        on_error(message)


def _watch_once(
    list_call: Callable[..., Any],
    version: str | None,
    on_event: Callable[[str, Obj], None],
    stop: threading.Event,
    timeout_s: int,
    selectors: Mapping[str, str],
) -> str | None:
    """One watch stream; returns the resourceVersion to resume from."""
    # return_type "object": events keep the plain JSON the list gives; no model objects built.
    w = kubernetes.watch.Watch(return_type="object")
    kwargs: dict[str, Any] = dict(selectors)
    if version:
        kwargs["resource_version"] = version
    kwargs["allow_watch_bookmarks"] = True
    # timeout_seconds also makes the client raise 410 instead of retrying it silently.
    stream = w.stream(
        list_call,
        timeout_seconds=timeout_s,
        _request_timeout=(REQUEST_TIMEOUT[0], timeout_s + 5),
        **kwargs,
    )
    try:
        for event in stream:
            if stop.is_set():
                w.stop()
                break
            raw = event.get("raw_object")
            if not isinstance(raw, dict):
                continue
            version = _version(raw) or version
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                on_event(event["type"], raw)
    except urllib3.exceptions.ReadTimeoutError:
        pass  # silent past the server's own timeout (or one that ignores it): just start again
    return version


def usable_version(version: object) -> str | None:
    """A resourceVersion worth sending back (to resume a watch, or as a write precondition).

    Plain kmock, which keeps no versions, answers every object with the placeholder "...": that
    is no version at all, and the only place that knows it is here.
    """
    return version if isinstance(version, str) and version not in ("", "...") else None


def _version(obj: Obj) -> str | None:
    return usable_version((obj.get("metadata") or {}).get("resourceVersion"))


Queued = tuple[str, Any]  # ("RESET", the list) or (event kind, the object), each transformed


def queued_watch(
    what: str,
    list_call: Callable[..., Any],
    events: queue.SimpleQueue[Queued],
    wake: Callable[[], None],
    stop: threading.Event,
    transform: Callable[[Obj], Any] = _identity,
    **selectors: str,
) -> threading.Thread:
    """A thread that lists then watches (`list_watch`) into `events` for one consumer, waking it
    after each: ("RESET", items) after each list, (kind, object) for each event. Each object is
    passed through `transform` in this thread: what waits in the queue is only what is kept."""

    def on_reset(items: list[Any]) -> None:
        events.put(("RESET", items))
        wake()

    def on_event(kind: str, obj: Obj) -> None:
        events.put((kind, transform(obj)))
        wake()

    return threading.Thread(
        target=list_watch,
        args=(what, list_call, on_reset, on_event, stop),
        kwargs={"transform": transform, **selectors},
        name=what,
        daemon=True,
    )


# --- pacing and raw JSON ------------------------------------------------------------------------

QPS, BURST = 100.0, 200  # the updater's defaults: 45,000 slices in about 7.5 minutes (docs/dra.md)
# A writer's pass (ConfigMaps, ResourceSlices, claims' status) writes for at most this long, at
# least one object, then its loop looks at the Lease again and the other writers get their turn:
# publishing a whole cluster at the API's pace takes minutes.
PASS_S = 0.5


class Pace:
    """client-go's token bucket (`flowcontrol.NewTokenBucketRateLimiter(qps, burst)`): a request
    waits for a token; tokens come at `qps` a second, at most `burst` saved up."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps, self.burst = qps, max(1, burst)
        self._tokens, self._at = float(self.burst), time.monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:  # requests are served in the order they ask
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            if self._tokens < 0:
                time.sleep(-self._tokens / self.qps)


class _Paced:
    """A client's request method that waits on a `Pace` first."""

    def __init__(self, request: Callable[..., Any], pace: Pace) -> None:
        self.request, self.pace = request, pace

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.pace.wait()
        return self.request(*args, **kwargs)


def paced(client: kubernetes.client.ApiClient, pace: Pace) -> kubernetes.client.ApiClient:
    """Every request of `client` waits its turn on `pace`, as a clientset's rate limiter makes
    it. The official client has no such hook, so its one request method is wrapped."""
    client.rest_client.request = _Paced(client.rest_client.request, pace)  # type: ignore[method-assign]
    return client


def send_json(
    client: kubernetes.client.ApiClient,
    method: str,
    path: str,
    body: bytes,
    timeout: tuple[float, float] = REQUEST_TIMEOUT,
) -> bytes:
    """`body`, already JSON, sent as the client would send it (its host, auth, TLS and
    connection pool): its answer, or ApiException as the client raises it.

    Why not the generated method: the client walks every object of the body to sanitize it and
    then serializes it again, 0.7 ms a ResourceSlice of a H100's partitions, a quarter of what
    publishing 45,000 of them costs (BENCHMARKS.md); a slice's JSON is made once here.
    """
    headers = {**client.default_headers, "Content-Type": "application/json",
               "Accept": "application/json"}  # fmt: skip
    client.update_params_for_auth(headers, [], ["BearerToken"], path, method, None)
    rest = client.rest_client
    if isinstance(rest.request, _Paced):  # paced as every request of the client is
        rest.request.pace.wait()
    response = rest.pool_manager.request(
        method,
        client.configuration.host + path,
        body=body,
        headers=headers,
        timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]),
        preload_content=True,
    )
    if not 200 <= response.status < 300:
        answer = kubernetes.client.rest.RESTResponse(response)
        answer.read()
        raise ApiException(http_resp=answer)
    return response.data


def watch_named(
    what: str,
    list_call: Callable[..., Any],
    name: str,
    apply: Callable[[Obj | None], None],
    stop: threading.Event,
    *,
    on_error: Callable[[str], None] | None = None,
    on_list: Callable[[], None] | None = None,
) -> None:
    """List then watch one object by name: `apply` gets it, or None while it does not exist;
    `on_list` runs after each good list. The field selector narrows it on a real API server, an
    emulator may ignore it: others are left out here."""

    def named(obj: Obj) -> bool:
        return str((obj.get("metadata") or {}).get("name")) == name

    def on_reset(items: list[Obj]) -> None:
        if on_list is not None:
            on_list()
        apply(next((obj for obj in items if named(obj)), None))

    def on_event(kind: str, obj: Obj) -> None:
        if named(obj):
            apply(None if kind == "DELETED" else obj)

    list_watch(what, list_call, on_reset, on_event, stop, on_error=on_error,
               field_selector=f"metadata.name={name}")  # fmt: skip
