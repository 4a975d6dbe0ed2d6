"""The HTTP server's edges (issue #21): request targets in absolute-form, a deadline on each whole
response and a bound on the replaced snapshots slow responses keep alive, and the request head's
size limit at its exact byte. Real servers on port 0, real sockets; the head's reader also through
a fake socket whose reads end where the test says, as TCP segments may."""

from __future__ import annotations

import itertools
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_exporter.web.config import WebConfig, load
from mig_exporter.web.server import (
    CONTENT_TYPE,
    MAX_HEAD_BYTES,
    HeadTooLarge,
    Limits,
    MetricsServer,
    Published,
    Snapshot,
    read_head,
)
from tests.support.base import examples
from tests.support.kubeapi import eventually
from tests.support.tls import serving_tls

SNAPSHOT = Snapshot((b"metric_a 1\n", b"metric_b 2\n"), True, "ok", b"own_total 3\n")
BODY = b"metric_a 1\nmetric_b 2\nown_total 3\n"
TEXT = "text/plain; charset=utf-8"


@contextmanager
def serving(
    limits: Limits | None = None, snapshot: Snapshot = SNAPSHOT, web: WebConfig | None = None
) -> Iterator[tuple[MetricsServer, Published]]:
    published = Published()
    published.publish(snapshot)
    server = MetricsServer(published, "127.0.0.1", 0, web, limits)
    server.start()
    try:
        yield server, published
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[WebConfig, ssl.SSLContext]:
    """A web config that turns TLS on, and a client context that trusts its certificate."""
    config, context = serving_tls(tmp_path_factory.mktemp("tls"))
    return load(config), context


def connect(
    port: int, context: ssl.SSLContext | None = None, rcvbuf: int | None = None
) -> socket.socket:
    sock = socket.socket()
    if rcvbuf is not None:  # before connecting: the window the server sees is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    if context is not None:
        return context.wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


def exchange(port: int, pieces: list[bytes], context: ssl.SSLContext | None = None) -> bytes:
    """Send `pieces` one send (over TLS, one record) each, and read the whole answer."""
    with connect(port, context) as sock:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.02)  # shapes the sends into separate segments; asserts nothing
            sock.sendall(piece)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def split(response: bytes) -> tuple[bytes, list[bytes], bytes]:
    """Status line, header lines but Date (two answers a second apart differ there), body."""
    head, _, body = response.partition(b"\r\n\r\n")
    status, *headers = head.split(b"\r\n")
    return status, [h for h in headers if not h.lower().startswith(b"date:")], body


def header(response: bytes, name: bytes) -> bytes | None:
    for line in split(response)[1]:
        key, _, value = line.partition(b":")
        if key.lower() == name.lower():
            return value.strip()
    return None


# Request form: absolute-form is served as the origin-form it stands for (RFC 9112 §3.2.2)


@pytest.mark.parametrize(
    ("line", "status", "body"),
    [
        (b"GET http://h:9400/metrics HTTP/1.1", 200, BODY),
        (b"GET HTTPS://Prometheus.Example.ORG/metrics?x=1&y HTTP/1.1", 200, BODY),
        (b"GET http://10.0.0.7:9400/health HTTP/1.1", 200, b"ok\n"),
        (b"GET http://[fd00::7]:9400//metrics HTTP/1.1", 200, BODY),
        (b"GET http://h:/metrics? HTTP/1.0", 200, BODY),
        (b"HEAD http://h/metrics HTTP/1.1", 200, b""),
        (b"GET http://h HTTP/1.1", 404, b"not found: try /metrics or /health\n"),
        (b"GET http://h/Metrics HTTP/1.1", 404, b"not found: try /metrics or /health\n"),
    ],
)
def test_absolute_form_is_served_by_its_path(line: bytes, status: int, body: bytes) -> None:
    with serving() as (server, _):
        answer = exchange(server.port, [line + b"\r\nHost: elsewhere\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.0 %d " % status)
    assert split(answer)[2] == body
    expected_type = CONTENT_TYPE if status == 200 and b"/metrics" in line else TEXT
    assert header(answer, b"Content-Type") == expected_type.encode()


@pytest.mark.parametrize(
    ("line", "status"),
    [
        (b"GET * HTTP/1.1", 400),  # asterisk-form is for OPTIONS only
        (b"HEAD * HTTP/1.1", 400),
        (b"GET h:9400 HTTP/1.1", 400),  # authority-form is for CONNECT only
        (b"GET metrics HTTP/1.1", 400),  # no form at all
        (b"GET ftp://h/metrics HTTP/1.1", 400),  # not a resource of an HTTP server
        (b"GET http://user:pw@h/metrics HTTP/1.1", 400),  # userinfo: RFC 9110 §4.2.4
        (b"GET http:///metrics HTTP/1.1", 400),  # no host: RFC 9110 §4.2.1
        (b"GET http:/metrics HTTP/1.1", 400),
        (b"OPTIONS * HTTP/1.1", 405),  # a method not served, whatever the form
        (b"CONNECT h:9400 HTTP/1.1", 405),
        (b"POST http://h/metrics HTTP/1.1", 405),
    ],
)
def test_other_request_forms_are_refused(line: bytes, status: int) -> None:
    with serving() as (server, _):
        answer = exchange(server.port, [line + b"\r\n\r\n"])
    assert answer.startswith(b"HTTP/1.0 %d " % status), answer
    if status == 400:
        assert header(answer, b"Content-Type") == TEXT.encode()
        body = b"" if line.startswith(b"HEAD") else b"bad request target: try /metrics or /health\n"
        assert split(answer)[2] == body
    else:
        assert header(answer, b"Allow") == b"GET, HEAD"


@pytest.fixture(scope="module")
def plain_server() -> Iterator[MetricsServer]:
    with serving() as (server, _):
        yield server


def any_case(word: str) -> st.SearchStrategy[str]:
    return st.tuples(*(st.sampled_from([c.lower(), c.upper()]) for c in word)).map("".join)


_PCHARS = "A-Za-z0-9._~!$&'()*+,;=:@%-"
hosts = st.one_of(
    st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9.]{0,20}[A-Za-z0-9])?", fullmatch=True),
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda a: f"[{a}]"),
    st.just("localhost"),
)
_NAMED = ["", "/", "/metrics", "/health", "/metrics/", "//metrics", "///health", "/METRICS", "/x",
          "/metrics/../health", "/health%2F"]  # fmt: skip
paths = st.sampled_from(_NAMED) | st.from_regex(rf"(/[{_PCHARS}]{{0,8}}){{1,3}}", fullmatch=True)
queries = st.none() | st.from_regex(rf"[{_PCHARS}/?]{{0,12}}", fullmatch=True)


@settings(max_examples=examples(150), deadline=None, derandomize=True)
@given(
    st.sampled_from(["GET", "HEAD"]),
    st.sampled_from(["http", "https"]).flatmap(any_case),
    hosts,
    st.none() | st.just("") | st.integers(0, 65535).map(str),
    paths,
    queries,
)
def test_absolute_form_answers_as_its_origin_form(
    plain_server: MetricsServer,
    method: str,
    scheme: str,
    host: str,
    port: str | None,
    path: str,
    query: str | None,
) -> None:
    authority = host if port is None else f"{host}:{port}"
    suffix = path + ("" if query is None else f"?{query}")
    absolute = f"{scheme}://{authority}{suffix}"
    # RFC 9112 §3.2.1: an empty path is sent as "/" in origin-form.
    origin = suffix if path else f"/{suffix}"

    def answer(target: str) -> tuple[bytes, list[bytes], bytes]:
        line = f"{method} {target} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode()
        return split(exchange(plain_server.port, [line]))

    by_origin = answer(origin)
    assert by_origin[0].split(b" ")[1] in (b"200", b"404")
    assert answer(absolute) == by_origin


# Slow clients: a deadline on each whole response, a bound on the old snapshots they hold


def trickle(
    port: int, context: ssl.SSLContext | None = None, give_up: float = 20.0
) -> tuple[int, float, bool]:
    """GET /metrics and read it 1 KiB every 10 ms, steadily (a stall timeout never fires), until
    the server ends the connection or `give_up` seconds pass. Returns the bytes read, the seconds
    since the request was sent, and whether the server ended it."""
    with connect(port, context, rcvbuf=16384) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        got = 0
        while time.monotonic() - start < give_up:
            try:
                chunk = sock.recv(1024)
            except (ConnectionResetError, ssl.SSLError):
                chunk = b""
            if not chunk:
                return got, time.monotonic() - start, True
            got += len(chunk)
            time.sleep(0.01)  # the pace of the trickle, not a wait for something
        return got, time.monotonic() - start, False


BIG = Snapshot((b"x" * (8 << 20),), True, "ok")  # far more than the socket buffers hold


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
def test_a_steady_trickle_is_cut_at_the_response_deadline(
    over_tls: bool, tls: tuple[WebConfig, ssl.SSLContext], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter")
    web, context = tls if over_tls else (None, None)
    # One slot, so the scrape after the cut shows it came back; stalls allowed far longer than
    # the deadline, so what cuts the trickle is the deadline.
    limits = Limits(max_connections=1, send_timeout_s=60, response_deadline_s=1.5)
    with serving(limits, BIG, web) as (server, _):
        got, seconds, ended = trickle(server.port, context)
        assert ended and got < BIG.size, (got, seconds)
        assert seconds >= 1.5, seconds  # not before its deadline
        said = eventually(lambda: [r for r in caplog.records if "dropped" in r.getMessage()])
        assert [(r.levelname, r.getMessage()) for r in said] == [
            ("DEBUG", "connection from 127.0.0.1 dropped: response not sent within 1.5 s")
        ]

        def scrape() -> bytes:
            return exchange(server.port, [b"GET /health HTTP/1.1\r\n\r\n"], context)

        # The only slot is free again (it frees just after the close the client saw).
        assert eventually(scrape).startswith(b"HTTP/1.0 200 ")


def test_a_client_that_reads_at_once_gets_the_whole_body_under_the_deadline() -> None:
    limits = Limits(send_timeout_s=60, response_deadline_s=1.5)
    with serving(limits, BIG) as (server, _):
        for _ in range(3):
            answer = exchange(server.port, [b"GET /metrics HTTP/1.1\r\n\r\n"])
            assert answer.startswith(b"HTTP/1.0 200 ")
            assert split(answer)[2] == BIG.parts[0]


def begin(port: int) -> tuple[socket.socket, bytes]:
    """A GET /metrics whose answer has begun (so the server holds its snapshot) and that then
    reads nothing until told."""
    sock = connect(port, rcvbuf=16384)
    sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
    return sock, sock.recv(1024)


def finish(sock: socket.socket, start: bytes) -> tuple[bytes, bool]:
    """Read the rest of the answer: the body, and whether it ended in a reset."""
    out = bytearray(start)
    reset = False
    with sock:
        while True:
            try:
                chunk = sock.recv(1 << 20)
            except ConnectionResetError:
                reset = True
                break
            if not chunk:
                break
            out += chunk
    return bytes(out).partition(b"\r\n\r\n")[2], reset


def test_the_replaced_snapshots_slow_responses_hold_are_bounded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter")
    sizes = [6 << 20, 6 << 20, 10 << 20, 10 << 20, 10 << 20]  # each more than the buffers hold
    snapshots = [Snapshot((b"abcde"[i : i + 1] * n,), True, "ok") for i, n in enumerate(sizes)]
    # The bound: max(24 MiB, 2 x the current 10 MiB) = 24 MiB of replaced snapshots.
    limits = Limits(send_timeout_s=60, pinned_bytes=24 << 20, pinned_bodies=2)
    with serving(limits, snapshots[0]) as (server, published):
        readers = []
        for i in range(4):  # a response that has begun, and stopped reading, on each of a-d
            if i:
                published.publish(snapshots[i])  # held: a 6, a+b 12, a+b+c 22 MiB: within
            readers.append(begin(server.port))
        # a, b, c and d held, 32 MiB: the oldest are cut, a (26 left) then b (20), until within.
        published.publish(snapshots[4])
        bodies = [finish(*reader) for reader in readers]
    for (body, _), snapshot in zip(bodies[:2], snapshots, strict=False):
        assert len(body) < snapshot.size and body == snapshot.parts[0][: len(body)]
    for (body, reset), snapshot in zip(bodies[2:], snapshots[2:4], strict=True):
        assert (body == snapshot.parts[0], reset) == (True, False)
    said = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert sorted(said) == [  # from each response's thread, in either order
        f"connection from 127.0.0.1 dropped: cut off: responses held {held} bytes of replaced "
        "snapshots, over the bound of 25165824, and this one's was the oldest"
        for held in (27262976, 33554432)
    ]


def test_parts_the_current_snapshot_shares_are_not_counted_as_held() -> None:
    """--all-nodes publishes a new tuple on each change, sharing every unchanged node's part:
    responses on those snapshots hold only the parts that changed."""
    shared = b"s" * (8 << 20)
    snapshots = [Snapshot((shared, b"node %d\n" % i), True, "ok") for i in range(4)]
    limits = Limits(send_timeout_s=60, pinned_bytes=1 << 20, pinned_bodies=0)
    with serving(limits, snapshots[0]) as (server, published):
        readers = []
        for snapshot in snapshots[1:]:
            readers.append(begin(server.port))
            published.publish(snapshot)
        bodies = [finish(*reader) for reader in readers]
    assert bodies == [(shared + b"node %d\n" % i, False) for i in range(3)]


def test_a_body_joined_when_asked_is_bounded_by_the_bodies_being_sent() -> None:
    """Many nodes' body is joined only when `/metrics` is asked for: a new snapshot's size is
    not known when it is published, and counting it as empty cut every whole scrape a step
    overtook. It counts as the largest body being sent, so a scrape spanning a publish or two
    ends whole, as it does with bodies joined at once."""
    bodies = [bytes([ord("a") + i]) * (6 << 20) for i in range(3)]
    snapshots = [Snapshot(healthy=True, reason="ok", whole=lambda b=b: (b,)) for b in bodies]
    limits = Limits(send_timeout_s=60, pinned_bytes=1 << 20, pinned_bodies=2)
    with serving(limits, snapshots[0]) as (server, published):
        reader = begin(server.port)
        for snapshot in snapshots[1:]:
            published.publish(snapshot)
        assert finish(*reader) == (bodies[0], False)
        assert snapshots[1].held() == ()  # never asked for: nothing joined


def test_a_watcher_is_told_of_each_publish_until_it_stops_watching() -> None:
    """How a server follows the snapshots it bounds; a stopped one is told no more."""
    published = Published()
    told: list[Snapshot] = []

    def watcher() -> None:
        told.append(published.snapshot)

    published.watch(watcher)
    published.publish(SNAPSHOT)
    published.unwatch(watcher)
    published.unwatch(watcher)  # a server stopped twice: nothing left to undo
    published.publish(BIG)
    assert told == [SNAPSHOT]


def test_a_dropped_response_is_reset_not_trickled_out(caplog: pytest.LogCaptureFixture) -> None:
    """Past the deadline, what the kernel still queues for that client is thrown away: the
    client's read fails instead of draining MiBs of a body it will never get whole."""
    caplog.set_level(logging.DEBUG, logger="exporter")
    limits = Limits(send_timeout_s=60, response_deadline_s=0.5)
    with serving(limits, BIG) as (server, _):
        sock, start = begin(server.port)  # and reads nothing until the server has given up
        eventually(lambda: [r for r in caplog.records if "dropped" in r.getMessage()])
        body, reset = finish(sock, start)
    assert reset and len(body) < BIG.size


def test_the_documented_bounds() -> None:
    limits = Limits()
    assert (limits.response_deadline_s, limits.pinned_bodies, limits.pinned_bytes) == (
        120.0, 2, 64 << 20)  # fmt: skip


# The head's limit, at its exact byte: request line, headers and the final empty line


def head_of(size: int, eol: bytes = b"\r\n", headers: int = 1) -> bytes:
    """A GET /metrics head of exactly `size` bytes, the last empty line included."""
    lines = [b"GET /metrics HTTP/1.1", *(b"X-%d: " % i for i in range(headers))]
    head = eol.join(lines) + eol + eol
    pad = b"a" * (size - len(head))
    if headers:
        lines[-1] += pad
    else:
        lines[0] = b"GET /metrics?" + pad[1:] + b" HTTP/1.1"  # the "?" is one of them
    head = eol.join(lines) + eol + eol
    assert len(head) == size
    return head


@pytest.mark.parametrize("over_tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize(
    "cuts",
    [(), (1,), (MAX_HEAD_BYTES // 2, MAX_HEAD_BYTES - 3, MAX_HEAD_BYTES - 1), (MAX_HEAD_BYTES,)],
    ids=["whole", "line", "end", "limit"],
)
def test_a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_431(
    cuts: tuple[int, ...], over_tls: bool, tls: tuple[WebConfig, ssl.SSLContext]
) -> None:
    assert MAX_HEAD_BYTES == 8192  # as docs/operations.md says
    web, context = tls if over_tls else (None, None)
    with serving(web=web) as (server, _):
        for size, status in ((MAX_HEAD_BYTES, 200), (MAX_HEAD_BYTES + 1, 431)):
            head = head_of(size)
            bounds = [0, *(c for c in cuts if c < size), size]
            pieces = [head[a:b] for a, b in itertools.pairwise(bounds)]
            answer = exchange(server.port, pieces, context)
            assert answer.startswith(b"HTTP/1.0 %d " % status), (size, answer[:40])
            if status == 200:
                assert split(answer)[2] == BODY


def test_what_follows_a_refused_head_is_drained_briefly_then_the_connection_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After a 431 the server reads and drops what the client still sends, for a moment and up to
    64 KiB, so that a client finishing its long request is not reset before it reads the refusal;
    a client that goes on sending is cut off. One slot: each scrape after shows it came back."""
    caplog.set_level(logging.DEBUG, logger="exporter")
    too_long = b"GET /metrics HTTP/1.1\r\nX-Fill: " + b"a" * (MAX_HEAD_BYTES + 100)

    def refused() -> tuple[socket.socket, bytes] | None:
        """A connection and what it was answered: None while the one slot is still held (the
        server closes the connection at once, answering nothing)."""
        sock = connect(server.port)
        answer = b""
        with suppress(OSError):
            sock.sendall(too_long)
            while chunk := sock.recv(65536):  # the refusal, then the server's end of sending
                answer += chunk
        if not answer:
            sock.close()
            return None
        return sock, answer

    def scrape() -> bytes:
        return exchange(server.port, [b"GET /health HTTP/1.1\r\n\r\n"])

    with serving(Limits(max_connections=1)) as (server, _):
        for _ in range(5):  # every time: a server that closed at once would reset most of them
            sock, answer = eventually(refused)
            with sock:
                assert answer.startswith(b"HTTP/1.0 431 ")
                sock.sendall(b"a" * 60_000)  # the rest of its head
                sock.shutdown(socket.SHUT_WR)
                assert sock.recv(1024) == b""
                assert eventually(scrape).startswith(b"HTTP/1.0 200 ")  # the server's end closed
                # ... and was not reset: what the client sent was taken.
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        sock, answer = eventually(refused)
        assert answer.startswith(b"HTTP/1.0 431 ")
        with sock, pytest.raises((ConnectionResetError, BrokenPipeError)):
            sock.sendall(b"a" * (32 << 20))  # far more than the drain and the buffers hold
        assert eventually(scrape).startswith(b"HTTP/1.0 200 ")  # so the refused ones have ended
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


class Segments:
    """A socket whose peer sent `data` in `pieces`: a read returns at most the rest of one piece,
    as a read of TCP may; then the peer closes."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = deque(p for p in pieces if p)

    def settimeout(self, value: float | None) -> None:
        pass

    def recv(self, size: int) -> bytes:
        if not self.pieces:
            return b""
        piece = self.pieces.popleft()
        if len(piece) > size:
            self.pieces.appendleft(piece[size:])
        return piece[:size]


@settings(max_examples=examples(300), deadline=None, derandomize=True)
@given(
    st.integers(-4, 4),
    st.sampled_from([b"\r\n", b"\n"]),
    st.integers(0, 30),
    st.binary(max_size=40),
    st.lists(st.integers(0, MAX_HEAD_BYTES + 50), max_size=8),
)
def test_the_head_limit_counts_every_byte_to_the_empty_line_however_it_arrives(
    delta: int, eol: bytes, headers: int, after: bytes, cuts: list[int]
) -> None:
    head = head_of(MAX_HEAD_BYTES + delta, eol, headers)
    data = head + after  # a body, or the next request: never counted
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    sock = cast(socket.socket, Segments(pieces))
    deadline = time.monotonic() + 60
    if len(head) <= MAX_HEAD_BYTES:
        assert read_head(sock, MAX_HEAD_BYTES, deadline) == head
    else:
        with pytest.raises(HeadTooLarge):
            read_head(sock, MAX_HEAD_BYTES, deadline)
