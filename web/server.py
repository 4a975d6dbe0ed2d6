"""HTTP endpoint: `/metrics` serves the last snapshot's bytes, `/health` says if they can be
trusted, `/metrics/self` serves the daemon's own series alone.

A scrape only reads an immutable snapshot; the daemon publishes a new one when what it serves
changes (its topology, a step of the simulated values, an NVML collection), never per scrape.
Many nodes' pages are written from the snapshot's values when asked (`Page`).

`/metrics/nodes/<node>` and `/health/nodes/<node>` do the same for one node of a snapshot that
has per-node pages (the many-nodes exporter); a client asking for gzip gets bodies compressed
once per change (`Gzipped`). The server answers those paths to GET and HEAD and nothing else, in
origin-form (`GET /metrics`) or absolute-form (`GET http://host:9400/metrics`), and bounds what
a client can make it hold: connections at once, the size of a request's head and the time to
send it, the time a whole response may take, and the memory that responses still sending old
snapshots keep alive.
Bodies are never read. With a web config (web/config.py) it speaks TLS, checks client
certificates or basic auth, and adds the configured headers.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cached_property, partial
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import unquote

from common.text import one_line, printable
from web.config import BasicAuth, WebConfig, server_context

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

log = logging.getLogger("exporter.http")
_T = TypeVar("_T")

# Bounds on what one client can make the server hold. Its clients are Prometheus and people with
# curl: a request worth answering is a few hundred bytes that arrive at once.
MAX_CONNECTIONS = 64  # served at once, a thread each; more are closed as they arrive
MAX_HEAD_BYTES = 8192  # request line, headers and the empty line that ends them, each with its
# CRLF (or LF): a head of exactly this many bytes is served, one more is 431. What follows the
# head in the same read (a body) does not count. (http.server alone takes 100 header lines of
# 64 KiB each.)
HEAD_TIMEOUT_S = 10.0  # TLS handshake, request line and headers in all: a client that sends a
# byte a second (slowloris) is dropped, its slot free again, after this long
SEND_TIMEOUT_S = 30.0  # a response stalls this long on a client that stopped reading: dropped
# A whole response, from its first byte to its last, however steadily the client reads: past this
# it is dropped. SEND_TIMEOUT_S restarts on every bit of progress: alone, it let a client reading
# just fast enough keep a slot and its snapshot for hours (a 100 MiB --all-nodes body). Prometheus
# gives up on a scrape at its scrape_timeout (10 s by default, never above the scrape interval,
# rarely set past 60 s), so after twice the longest timeout in practice no scraper is waiting for
# the rest. 100 MiB in 120 s needs 7 Mbit/s: a LAN, or a person's curl over a VPN, finishes.
RESPONSE_DEADLINE_S = 120.0
# Snapshots replaced while responses still send them stay in memory until those end. What they
# hold beyond the current snapshot (the parts it no longer shares) may reach the larger of these
# two; past it, the responses on the oldest snapshot are cut until it holds again. Two bodies are
# room for the scrapes that span a publish or two (an HA pair of Prometheus, someone's curl);
# the floor means a single node's body of KiBs never meets the bound. Without it 64 trickling
# clients could keep 64 different 100 MiB snapshots alive.
PINNED_BODIES = 2
PINNED_BYTES = 64 << 20
LINGER_S = 1.0  # after a refusal, unread request bytes are drained this long, so closing does not
# reset the connection under the refusal before the client reads it
TLS_CHUNK_BYTES = 256 << 10  # TLS cannot hand the kernel many buffers at once: parts are joined
# into records of about this size

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16  # buffers per sendmsg


class Page(Protocol):
    """One node's page (`/metrics/nodes/<node>`), written when asked: many nodes' text is far
    larger than what it is written from. The same object while the node's series are."""

    def page(self) -> tuple[bytes, ...]: ...


@dataclass(frozen=True)
class Snapshot:
    """What `/metrics` serves: the body as the parts it was joined from, never copied whole.

    A change publishes a new tuple of references, and a scrape hands the parts to the kernel as
    they are. Many nodes' body (`whole`) runs to hundreds of MiB: it is joined when `/metrics` is
    first asked for in this snapshot, then kept with it; where each node is its own target, never.
    """

    parts: tuple[bytes, ...] = ()
    healthy: bool = False
    reason: str = "no topology yet"
    own: bytes = b""  # the daemon's own metrics, served after the DCGM series
    # False only before the first topology: /metrics answers 503 then, so a scrape right after a
    # (re)start fails (Prometheus: up == 0) instead of reading an empty exporter as real.
    ready: bool = True
    # `/metrics/nodes/<node>`: each node's own page. Empty: no per-node pages.
    pages: Mapping[str, Page] = field(default_factory=dict)
    whole: Callable[[], tuple[bytes, ...]] | None = None  # the body, instead of `parts`
    # False while the first list of the nodes is read: a node not in `pages` may still come
    # (503), rather than not be served here (404).
    complete: bool = True

    @cached_property
    def body_parts(self) -> tuple[bytes, ...]:
        return self.parts if self.whole is None else self.whole()

    @property
    def joined(self) -> bool:
        """Whether the body's parts are there: a `whole` is joined when first asked for."""
        return self.whole is None or "body_parts" in self.__dict__

    def held(self) -> tuple[bytes, ...]:
        """The parts of the body this snapshot holds now (none of a `whole` not asked for)."""
        return self.body_parts if self.joined else self.parts

    @property
    def size(self) -> int:
        return sum(map(len, self.held())) + len(self.own)

    @cached_property
    def body(self) -> bytes:
        return b"".join(self.body_parts)


class Published:
    """The one snapshot scrapes see; replaced whole, so readers never see half an update.

    Servers watch it to bound what the snapshots it replaced still hold (see `_InFlight`).
    """

    def __init__(self) -> None:
        self.snapshot = Snapshot(ready=False)
        self._watchers: list[Callable[[], None]] = []

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        for watcher in tuple(self._watchers):
            watcher()

    def watch(self, watcher: Callable[[], None]) -> None:
        """Call `watcher` after each publish, in the publisher's thread."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[], None]) -> None:
        with suppress(ValueError):  # a server stopped twice, or never started
            self._watchers.remove(watcher)


@dataclass(frozen=True)
class Limits:
    """The bounds above, as parameters so tests can make them small."""

    max_connections: int = MAX_CONNECTIONS
    max_head_bytes: int = MAX_HEAD_BYTES
    head_timeout_s: float = HEAD_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S
    response_deadline_s: float = RESPONSE_DEADLINE_S
    pinned_bodies: float = PINNED_BODIES
    pinned_bytes: int = PINNED_BYTES


class HeadTooLarge(Exception):
    pass


# The head ends at its first empty line; http.server accepts lines ended by LF alone too.
_END_OF_HEAD = re.compile(rb"\n\r?\n")


def read_head(sock: socket.socket, limit: int, deadline: float) -> bytes:
    """The request line and headers, up to and with the empty line that ends them; b"" when the
    client closes first. TimeoutError past `deadline` (time.monotonic()) in all, not per read:
    a byte every few seconds does not keep a connection. Nothing after the head is read."""
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            # The words of a recv that timed out: one debug line whichever way the deadline is met.
            raise TimeoutError("timed out")
        sock.settimeout(remaining)
        chunk = sock.recv(limit + 1 - len(buf))
        if not chunk:
            return b""
        start = max(0, len(buf) - 2)  # the end may straddle two reads
        buf += chunk
        end = _END_OF_HEAD.search(buf, start)
        if end is not None and end.end() <= limit:
            return bytes(buf[: end.end()])
        if len(buf) > limit or end is not None:
            raise HeadTooLarge()


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


class Dropped(Exception):
    """A response given up part way: the connection is reset, and the reason logged at debug."""


class _Budget:
    """What one response may take: each send waits at most `stall_s` for the client to read, all
    of them end by the deadline, and another thread may cut it (`cut`, then a shutdown of the
    socket, which wakes a send blocked on it)."""

    def __init__(self, stall_s: float, total_s: float) -> None:
        self.stall_s = stall_s
        self.total_s = total_s
        self.deadline = time.monotonic() + total_s
        self.cut: str | None = None

    def send(self, sock: socket.socket, call: Callable[[], _T]) -> _T:
        """`call()`, a send on `sock`, within what is left of the budget."""
        if self.cut is not None:
            raise Dropped(self.cut)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise Dropped(f"response not sent within {self.total_s:g} s")
        sock.settimeout(min(self.stall_s, remaining))
        try:
            return call()
        except OSError as e:
            if self.cut is not None:
                raise Dropped(self.cut) from None
            if not isinstance(e, TimeoutError):
                raise  # the client went away: handle_error's debug line
            if time.monotonic() >= self.deadline:
                raise Dropped(f"response not sent within {self.total_s:g} s") from None
            # Not a bare TimeoutError: http.server would swallow it without a word.
            raise Dropped(f"client read nothing for {self.stall_s:g} s") from None


class _SocketWriter(io.BufferedIOBase):
    """`wfile`: every write sent whole, on a plain or a TLS socket, within the response's
    budget once it has one."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.budget: _Budget | None = None

    def writable(self) -> bool:
        return True

    def write(self, b: ReadableBuffer, /) -> int:
        send_all(self._sock, (bytes(b),), self.budget)  # bytes(), as http.server writes: no copy
        return memoryview(b).nbytes


class _InFlight:
    """The `/metrics` responses being sent, each with the snapshot it holds, so that what the
    replaced snapshots keep alive stays bounded (PINNED_BYTES, PINNED_BODIES)."""

    def __init__(self, published: Published, limits: Limits) -> None:
        self.published = published
        self.limits = limits
        self._lock = threading.Lock()
        # In the order they began, so their snapshots are in the order they were published.
        self._sending: list[tuple[Snapshot, socket.socket, _Budget]] = []

    @contextmanager
    def sending(self, sock: socket.socket, budget: _Budget) -> Iterator[Snapshot]:
        """The snapshot to send, held on the list until the response ends."""
        with self._lock:  # read and listed at once: a publish in between would not see it
            entry = (self.published.snapshot, sock, budget)
            self._sending.append(entry)
        try:
            yield entry[0]
        finally:
            with self._lock:  # before the socket is closed: `bound` never shuts another's down
                self._sending.remove(entry)

    def bound(self) -> None:
        """After a publish: cut the responses on the oldest snapshots until what the replaced
        ones hold is within the bound."""
        with self._lock:
            current = self.published.snapshot
            # A body not joined yet (many nodes': only when asked) is about the size of the one
            # it replaced, which a scrape may be sending.
            size = (
                current.size
                if current.joined
                else max((s.size for s, _, _ in self._sending), default=0)
            )
            limit = max(self.limits.pinned_bytes, self.limits.pinned_bodies * size)
            while (
                held := _held(current, [s for s, _, b in self._sending if b.cut is None])
            ) > limit:
                oldest = next(s for s, _, b in self._sending if b.cut is None and s is not current)
                reason = (
                    f"cut off: responses held {held} bytes of replaced snapshots, over the "
                    f"bound of {limit:.0f}, and this one's was the oldest"
                )
                for snapshot, sock, budget in self._sending:
                    if snapshot is oldest:
                        budget.cut = reason
                        # The fd's shutdown, not TLS's: it wakes the send blocked on it, in its
                        # own thread. An error: the client has gone already.
                        with suppress(OSError):
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)


PAGES = "/metrics/nodes/"  # `/metrics/nodes/<node>`: one node's page (KWOK's layout)
# The exporter's own series alone: what a replica serving thousands of nodes' pages is scraped
# for (its shard, its problems), and a readiness probe that does not join the whole body.
SELF = "/metrics/self"
HEALTH_PAGES = "/health/nodes/"
GZIP_LEVEL = 1  # metrics text compresses about 10:1 even so, at a fraction of level 9's CPU


def accepts_gzip(header: str | None) -> bool:
    """Whether an Accept-Encoding header takes gzip (Prometheus sends `gzip`), not at q=0."""
    for item in (header or "").split(","):
        coding, *params = (p.strip().lower() for p in item.split(";"))
        if coding in ("gzip", "x-gzip"):
            q = next((p.removeprefix("q=") for p in params if p.startswith("q=")), "1")
            return _QVALUE.fullmatch(q) is not None and float(q) > 0
    return False


# RFC 9110 §12.4.2: 0 to 1, three decimals at most; anything else (inf, 1e3, 2) takes nothing.
_QVALUE = re.compile(r"0(\.[0-9]{0,3})?|1(\.0{0,3})?")


class Gzipped:
    """Bodies compressed once per publish, never per scrape. A node's page is one gzip member,
    made once per page (the same object while its node is unchanged); `/metrics` is a member per
    part (a node's family, a family's header), made by the first scrape after a publish: a
    publish forgets them, as many nodes' body is joined only when asked, after the publish.
    Concatenated members are one valid gzip stream (RFC 1952; Go's reader, which Prometheus
    uses, reads them as one).

    HTTP threads add members while the publisher's thread drops stale ones (`keep`): the table
    changes under a lock, compressing happens outside it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(body) -> (body, member): the body is held, so its id is not reused while listed.
        self._members: dict[int, tuple[object, bytes]] = {}

    def _member(self, body: bytes | Page) -> bytes:
        hit = self._members.get(id(body))
        if hit is None or hit[0] is not body:
            data = body if isinstance(body, bytes) else b"".join(body.page())
            hit = (body, gzip.compress(data, GZIP_LEVEL, mtime=0))
            with self._lock:
                self._members[id(body)] = hit
        return hit[1]

    def of(self, parts: Iterable[bytes]) -> tuple[bytes, ...]:
        """`/metrics`: a member per part."""
        return tuple(self._member(p) for p in parts if p)

    def page(self, page: Page) -> tuple[bytes, ...]:
        """A node's page: one member for all of it (it compresses several times better)."""
        return (self._member(page),)

    def keep(self, snapshot: Snapshot) -> None:
        """After a publish: forget the members of bodies the new snapshot no longer has."""
        live = {id(p) for p in snapshot.held()}
        live.update(map(id, snapshot.pages.values()))
        with self._lock:
            self._members = {k: v for k, v in self._members.items() if k in live}


def _held(current: Snapshot, snapshots: Sequence[Snapshot]) -> int:
    """The bytes `snapshots` keep alive that `current` does not: parts they share are one part."""
    if all(s is current for s in snapshots):
        return 0
    seen = {id(p) for p in (*current.held(), current.own)}
    held = 0
    for snapshot in snapshots:
        for part in (*snapshot.held(), snapshot.own):
            if id(part) not in seen:
                seen.add(id(part))
                held += len(part)
    return held


def _handler(
    published: Published,
    inflight: _InFlight,
    limits: Limits,
    headers: Sequence[tuple[str, str]],
    auth: BasicAuth | None,
    gzipped: Gzipped,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mig-exporter"

        def version_string(self) -> str:
            return self.server_version  # not the Python version

        def setup(self) -> None:
            self.connection = self.request
            self.rfile = io.BytesIO()
            self.writer = self.wfile = _SocketWriter(self.connection)

        def handle(self) -> None:
            try:
                self._handle()
            except Dropped as e:
                log.debug("connection from %s dropped: %s", self.client_address[0], e)
                # Reset when closed: the kernel drops what it still holds for this client (MiBs
                # of a body) instead of trickling it out, and the client sees an error, not a
                # clean end.
                with suppress(OSError):
                    linger = struct.pack("ii", 1, 0)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)

        def _handle(self) -> None:
            conn = self.connection
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
            self.writer.budget = _Budget(limits.send_timeout_s, limits.response_deadline_s)
            self.rfile = io.BytesIO(head)
            super().handle()

        def _refuse_head(self) -> None:
            self.command, self.requestline, self.request_version = "", "", "HTTP/1.0"
            self.writer.budget = _Budget(limits.send_timeout_s, limits.response_deadline_s)
            self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
            _linger(self.connection)

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            if auth is None or auth.allows(self.headers.get("Authorization")):
                return True
            # As exporter-toolkit: every path, /health too, and whatever the method.
            self.send_response(HTTPStatus.UNAUTHORIZED)
            self.send_header("WWW-Authenticate", "Basic")
            body = b"Unauthorized\n"
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            return False

        def end_headers(self) -> None:
            for name, value in headers:  # the web config's, on every response, errors too
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
            if path in ("/metrics", SELF) or (path is not None and path.startswith(PAGES)):
                assert self.writer.budget is not None  # set before any request is parsed
                with inflight.sending(self.connection, self.writer.budget) as snap:
                    self._metrics(snap, path, body)
                return
            snap = published.snapshot
            if path is None:  # RFC 9112 §3: an invalid request-line is answered 400
                bad = b"bad request target: try /metrics or /health\n"
                self._send(400, bad, "text/plain; charset=utf-8", body)
            elif path == "/health":
                status = 200 if snap.healthy else 503
                text = "ok" if snap.healthy else snap.reason
                self._send(status, f"{text}\n".encode(), "text/plain; charset=utf-8", body)
            elif path.startswith(HEALTH_PAGES):
                node = unquote(path.removeprefix(HEALTH_PAGES))
                if snap.ready and node not in snap.pages:
                    self._not_served(snap, node, body)
                else:  # a node's series are as good as the whole's: stale when it is
                    status = 200 if snap.healthy and snap.ready else 503
                    text = "ok" if status == 200 else snap.reason
                    self._send(status, f"{text}\n".encode(), "text/plain; charset=utf-8", body)
            else:
                self._send(
                    404, b"not found: try /metrics or /health\n", "text/plain; charset=utf-8", body
                )

        def _metrics(self, snap: Snapshot, path: str, body: bool) -> None:
            if not snap.ready:
                self._send(503, f"{snap.reason}\n".encode(), "text/plain; charset=utf-8", body)
                return
            # Several header lines are one comma-separated list (RFC 9110 §5.3).
            gz = accepts_gzip(",".join(self.headers.get_all("Accept-Encoding", [])))
            if path in ("/metrics", SELF):
                parts = (*snap.body_parts, snap.own) if path == "/metrics" else (snap.own,)
                parts = gzipped.of(parts) if gz else parts
            else:
                node = unquote(path.removeprefix(PAGES))
                page = snap.pages.get(node)
                if page is None:
                    self._not_served(snap, node, body)
                    return
                parts = gzipped.page(page) if gz else page.page()
            self._send_parts(parts if body else (), sum(map(len, parts)), "gzip" if gz else None)

        def _not_served(self, snap: Snapshot, node: str, body: bool) -> None:
            if not snap.complete:  # it may be among the nodes still being read
                self._send(503, f"{snap.reason}\n".encode(), "text/plain; charset=utf-8", body)
                return
            text = f"node {printable(node, 253)} is not served here\n".encode()
            self._send(404, text, "text/plain; charset=utf-8", body)

        def _send(self, status: int, content: bytes, content_type: str, body: bool) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            if body:
                self.wfile.write(content)

        def _send_parts(self, parts: tuple[bytes, ...], size: int, encoding: str | None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            if encoding is not None:
                self.send_header("Content-Encoding", encoding)
            self.send_header("Vary", "Accept-Encoding")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            send_all(self.connection, parts, self.writer.budget)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    return Handler


def _linger(sock: socket.socket) -> None:
    """Stop sending, then read and drop what the client still sends, briefly: closing with
    unread bytes would reset the connection and could discard the answer before it is read."""
    deadline = time.monotonic() + LINGER_S
    try:
        sock.shutdown(socket.SHUT_WR)
        drained = 0
        while drained < 1 << 16 and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            chunk = sock.recv(4096)
            if not chunk:
                break
            drained += len(chunk)
    except OSError:
        pass


def send_all(sock: socket.socket, parts: Sequence[bytes], budget: _Budget | None = None) -> None:
    """Send every part in order with as few system calls as the kernel allows, copying none;
    each call within `budget` if there is one (else as the socket's timeout says)."""
    if isinstance(sock, ssl.SSLSocket):
        _send_tls(sock, parts, budget)
        return
    views = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(views):
        send = partial(sock.sendmsg, views[i : i + IOV_MAX])
        sent = send() if budget is None else budget.send(sock, send)
        while sent:  # a partial send: skip what went, resume inside the part it stopped in
            if sent >= len(views[i]):
                sent -= len(views[i])
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0


def _send_tls(sock: ssl.SSLSocket, parts: Sequence[bytes], budget: _Budget | None) -> None:
    """No sendmsg over TLS: small parts (a node's fragments) joined into records, big ones sent
    from where they are, TLS_CHUNK_BYTES at a time. Python gives one TLS write one timeout for
    all of it, so a 100 MiB part sent whole had to go within SEND_TIMEOUT_S however steadily the
    client read, and could not be stopped at the response's deadline."""

    def send(data: bytes | memoryview) -> None:
        if budget is None:
            sock.sendall(data)
        else:
            budget.send(sock, lambda: sock.sendall(data))

    batch: list[bytes] = []
    size = 0
    for part in parts:
        if size + len(part) > TLS_CHUNK_BYTES and batch:
            send(b"".join(batch))
            batch, size = [], 0
        if len(part) >= TLS_CHUNK_BYTES:
            view = memoryview(part)
            for start in range(0, len(view), TLS_CHUNK_BYTES):
                send(view[start : start + TLS_CHUNK_BYTES])
        elif part:
            batch.append(part)
            size += len(part)
    if batch:
        send(b"".join(batch))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connections waits in the kernel, not refused there

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits,
        context: ssl.SSLContext | None,
    ) -> None:
        self.context = context
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_connections)
        super().__init__(address, handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        if self.context is not None:
            # The handshake waits for the connection's own thread (and its deadline).
            sock = self.context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        # Full: the new connection is closed at once. The slots free as soon as the connections
        # holding them answer or time out, so a crowd of slow clients delays scrapes by at most
        # HEAD_TIMEOUT_S instead of piling up threads.
        if self.slots.acquire(blocking=False):
            return True
        log.debug(
            "connection from %s refused: %d served already",
            client_address[0],
            self.limits.max_connections,
        )
        return False

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # no thread started to release it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Never a traceback on stderr. A client that goes away mid-answer is not news; anything
        # else is a bug, said in one line.
        e = sys.exc_info()[1]
        if isinstance(e, OSError):
            log.debug("connection from %s: %s", client_address[0], one_line(e))
        elif e is not None:
            log.error("answering %s: %s: %s", client_address[0], type(e).__name__, one_line(e))


class MetricsServer:
    """`/metrics` and `/health` on `address:port`, in a thread; TLS and auth as `web` says.

    A `web` whose certificates cannot be loaded raises WebConfigError before anything listens.
    """

    def __init__(
        self,
        published: Published,
        address: str,
        port: int,
        web: WebConfig | None = None,
        limits: Limits | None = None,
    ) -> None:
        limits = limits or Limits()
        context = server_context(web) if web is not None else None
        auth = BasicAuth(web.users) if web is not None and web.users else None
        headers = web.headers if web is not None else ()
        self.tls = context is not None
        self.published = published
        self.inflight = _InFlight(published, limits)
        self.gzipped = Gzipped()
        handler = _handler(published, self.inflight, limits, headers, auth, self.gzipped)
        self.httpd = _Server((address, port), handler, limits, context)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.published.watch(self.inflight.bound)
        self.published.watch(self._keep)
        self.thread.start()

    def _keep(self) -> None:
        self.gzipped.keep(self.published.snapshot)

    def stop(self) -> None:
        self.published.unwatch(self.inflight.bound)
        self.published.unwatch(self._keep)
        self.httpd.shutdown()
        self.httpd.server_close()
