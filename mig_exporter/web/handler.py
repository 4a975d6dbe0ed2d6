"""The request handler: one class at module level that reads what it needs from its server (the
`Site`), and a route table of path patterns to the functions that answer them.

GET and HEAD of the routed paths, in origin-form (`GET /metrics`) or absolute-form
(`GET http://host:9400/metrics`); every other method is 405 or 501. The head is read within the
bounds (bounds.py) before http.server parses it; bodies are never read.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import ssl
import struct
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Protocol, cast
from urllib.parse import unquote

from mig_exporter.common.text import one_line, printable
from mig_exporter.web.bounds import (
    Budget,
    Dropped,
    HeadTooLarge,
    InFlight,
    Limits,
    linger,
    read_head,
)
from mig_exporter.web.config import BasicAuth
from mig_exporter.web.gzipped import Gzipped, accepts_gzip
from mig_exporter.web.sending import SocketWriter, send_all
from mig_exporter.web.snapshot import Page, Published, Snapshot

log = logging.getLogger("exporter.http")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
PAGES = "/metrics/nodes/"  # `/metrics/nodes/<node>`: one node's page (KWOK's layout)
# The exporter's own series alone: what a replica serving thousands of nodes' pages is scraped
# for (its shard, its problems), and a readiness probe that does not join the whole body.
SELF = "/metrics/self"
HEALTH_PAGES = "/health/nodes/"


@dataclass(frozen=True)
class Site:
    """What the handler reads from its server: the snapshots, the bounds, the web config's
    headers and users, and the gzip cache."""

    published: Published
    inflight: InFlight
    limits: Limits
    headers: Sequence[tuple[str, str]]
    auth: BasicAuth | None
    gzipped: Gzipped
    # The process's own runtime series, written per scrape after the daemon's own (the
    # exporter's --enable-exporter-metrics); None: none.
    runtime: Callable[[], bytes] | None = None


class _Serving(Protocol):
    site: Site


# absolute-form (RFC 9112 §3.2.2): what clients send to a proxy, and what a server MUST accept.
# The host is not checked, only that there is one (RFC 9110 §4.2.1) and no userinfo (§4.2.4):
# behind a Service, a port-forward or a proxy this server does not know the names it is reached
# by, and neither exporter-toolkit nor Prometheus' own server checks them.
_ABSOLUTE_FORM = re.compile(r"(?i:https?)://(?P<authority>[^/?#]*)(?P<rest>[/?#].*)?", re.DOTALL)
_AUTHORITY = re.compile(r"(\[[^\[\]/?#@]+\]|[-A-Za-z0-9._~%!$&'()*+,;=]+)(:[0-9]*)?")


def target_path(target: str) -> str | None:
    """The path a GET or HEAD request target names, without its query: origin-form as it is,
    absolute-form reduced to the origin-form it stands for. None for any other form (asterisk-form
    `*`, authority-form `host:port`, a bare word, another scheme): no resource of ours."""
    if not target.startswith("/"):
        m = _ABSOLUTE_FORM.fullmatch(target)
        if m is None or _AUTHORITY.fullmatch(m["authority"]) is None:
            return None
        target = m["rest"] or "/"
        if not target.startswith("/"):  # `http://host?x`: the path is empty, which means /
            target = "/" + target
        if target.startswith("//"):  # as http.server does to origin-form (gh-87389)
            target = "/" + target.lstrip("/")
    return target.split("?", 1)[0]


class Handler(BaseHTTPRequestHandler):
    """One connection: its head read within the bounds, then one request answered by its route."""

    server_version = "mig-exporter"

    @property
    def site(self) -> Site:
        return cast(_Serving, self.server).site

    def version_string(self) -> str:
        return self.server_version  # not the Python version

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO()
        self.writer = self.wfile = SocketWriter(self.connection)

    def handle(self) -> None:
        try:
            self._handle()
        except Dropped as e:
            log.debug("connection from %s dropped: %s", self.client_address[0], e)
            # Reset when closed: the kernel drops what it still holds for this client (MiBs of
            # a body) instead of trickling it out, and the client sees an error, not a clean end.
            with suppress(OSError):
                zero = struct.pack("ii", 1, 0)
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, zero)

    def _handle(self) -> None:
        conn, limits = self.connection, self.site.limits
        deadline = time.monotonic() + limits.head_timeout_s
        try:
            if isinstance(conn, ssl.SSLSocket):
                # Here, in the connection's thread, not in accept: a client that stalls its
                # handshake holds only its own slot, and within the same deadline.
                conn.settimeout(limits.head_timeout_s)
                conn.do_handshake()
            head = read_head(conn, limits.max_head_bytes, deadline)
        except HeadTooLarge:
            self._refuse_head()
            return
        except OSError as e:  # timed out, reset, TLS refused: nothing to answer
            log.debug("connection from %s dropped: %s", self.client_address[0], one_line(e))
            return
        # The response's time starts now, whatever the head took.
        self.writer.budget = Budget(limits.send_timeout_s, limits.response_deadline_s)
        self.rfile = io.BytesIO(head)
        super().handle()

    def _refuse_head(self) -> None:
        limits = self.site.limits
        self.command, self.requestline, self.request_version = "", "", "HTTP/1.0"
        self.writer.budget = Budget(limits.send_timeout_s, limits.response_deadline_s)
        self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
        linger(self.connection)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        auth = self.site.auth
        if auth is None or auth.allows(self.headers.get("Authorization")):
            return True
        # As exporter-toolkit: every path, /health too, and whatever the method.
        self.send_response(HTTPStatus.UNAUTHORIZED)
        self.send_header("WWW-Authenticate", "Basic")
        body = b"Unauthorized\n"
        self.send_header("Content-Type", TEXT)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return False

    def end_headers(self) -> None:
        for name, value in self.site.headers:  # the web config's, on every response, errors too
            self.send_header(name, value)
        super().end_headers()

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _method_not_allowed(self) -> None:
        self.send_response(HTTPStatus.METHOD_NOT_ALLOWED)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Connection", "close")
        self.send_header("Content-Length", "0")
        self.end_headers()

    # Methods HTTP defines get 405 naming the two served; any other word, http.server's 501.
    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = (
        _method_not_allowed
    )

    def _serve(self, body: bool) -> None:
        path = target_path(self.path)
        if path is None:  # RFC 9112 §3: an invalid request-line is answered 400
            self.send_text(400, "bad request target: try /metrics or /health", body)
            return
        found = route(path)
        if found is None:
            self.send_text(404, "not found: try /metrics or /health", body)
            return
        rule, match = found
        if not rule.holds:
            rule.answer(self, self.site.published.snapshot, match, body)
            return
        assert self.writer.budget is not None  # set before any request is parsed
        with self.site.inflight.sending(self.connection, self.writer.budget) as snap:
            rule.answer(self, snap, match, body)

    # What the routes answer with

    def send_text(self, status: int, text: str, body: bool) -> None:
        """A short plain-text answer: `text` and a newline."""
        content = f"{text}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", TEXT)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        if body:
            self.wfile.write(content)

    def unready(self, snap: Snapshot, body: bool) -> bool:
        """Answers 503 (and says so) before the first topology: no series to trust yet."""
        if not snap.ready:
            self.send_text(503, snap.reason, body)
        return not snap.ready

    def not_served(self, snap: Snapshot, node: str, body: bool) -> None:
        if not snap.complete:  # it may be among the nodes still being read
            self.send_text(503, snap.reason, body)
        else:
            self.send_text(404, f"node {printable(node, 253)} is not served here", body)

    def _gzip(self) -> bool:
        # Several header lines are one comma-separated list (RFC 9110 §5.3).
        return accepts_gzip(",".join(self.headers.get_all("Accept-Encoding", [])))

    def send_metrics(self, parts: tuple[bytes, ...], body: bool) -> None:
        """Series as the parts they are kept in, gzipped once per change if asked."""
        gz = self._gzip()
        self._send_parts(self.site.gzipped.of(parts) if gz else parts, body, gz)

    def send_page(self, page: Page, body: bool) -> None:
        """A node's page, written when asked, gzipped once per change if asked."""
        gz = self._gzip()
        self._send_parts(self.site.gzipped.page(page) if gz else page.page(), body, gz)

    def _send_parts(self, parts: tuple[bytes, ...], body: bool, gz: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        if gz:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Vary", "Accept-Encoding")
        self.send_header("Content-Length", str(sum(map(len, parts))))
        self.end_headers()
        send_all(self.connection, parts if body else (), self.writer.budget)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a scrape every few seconds is not news


# The routes: each path (matched whole) and the function that answers it.


def _metrics(h: Handler, snap: Snapshot, _: re.Match[str], body: bool) -> None:
    """Every series: the body's parts, then the daemon's own (and its runtime's)."""
    if not h.unready(snap, body):
        runtime = (h.site.runtime(),) if h.site.runtime is not None else ()
        h.send_metrics((*snap.body_parts, snap.own, *runtime), body)


def _own(h: Handler, snap: Snapshot, _: re.Match[str], body: bool) -> None:
    if not h.unready(snap, body):
        h.send_metrics((snap.own,), body)


def _node_metrics(h: Handler, snap: Snapshot, match: re.Match[str], body: bool) -> None:
    if h.unready(snap, body):
        return
    node = unquote(match["node"])
    page = snap.pages.get(node)
    if page is None:
        h.not_served(snap, node, body)
    else:
        h.send_page(page, body)


def _health(h: Handler, snap: Snapshot, _: re.Match[str], body: bool) -> None:
    healthy, reason = snap.health()
    h.send_text(200 if healthy else 503, "ok" if healthy else reason, body)


def _node_health(h: Handler, snap: Snapshot, match: re.Match[str], body: bool) -> None:
    node = unquote(match["node"])
    if snap.ready and node not in snap.pages:
        h.not_served(snap, node, body)
    else:  # a node's series are as good as the whole's: stale when it is
        healthy, reason = snap.health()
        ok = healthy and snap.ready
        h.send_text(200 if ok else 503, "ok" if ok else reason, body)


@dataclass(frozen=True)
class Rule:
    """A path and its answer. `<node>` in the path stands for the rest of it (any characters,
    still %-encoded), the answer's `match["node"]`. `holds`: the answer sends a body of the
    snapshot, held in flight (bounds.py) until sent; the others read the published
    snapshot as it is."""

    path: str
    answer: Callable[[Handler, Snapshot, re.Match[str], bool], None]
    holds: bool
    pattern: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        node = re.escape(self.path).replace(re.escape("<node>"), "(?P<node>.*)")
        object.__setattr__(self, "pattern", re.compile(node, re.DOTALL))


ROUTES: tuple[Rule, ...] = (
    Rule("/metrics", _metrics, holds=True),
    Rule(SELF, _own, holds=True),
    Rule(PAGES + "<node>", _node_metrics, holds=True),
    Rule("/health", _health, holds=False),
    Rule(HEALTH_PAGES + "<node>", _node_health, holds=False),
)


def route(path: str) -> tuple[Rule, re.Match[str]] | None:
    """The rule that answers `path` (without its query), and its match; None: 404."""
    for rule in ROUTES:
        if (match := rule.pattern.fullmatch(path)) is not None:
            return rule, match
    return None
