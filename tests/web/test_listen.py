"""Where the server listens (issue #33): every address form the platform takes, the default on
IPv6 and IPv4 at once where the host has IPv6 (and on IPv4 where it has not), the URL the log line
shows, and OSError for an address that cannot be used (the daemons' one line, exit 2). Real
servers on port 0, real clients over both loopbacks."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import closing, contextmanager

import pytest

from mig_exporter.web.listen import EVERY_ADDRESS, Bind, binds, host_port, url
from mig_exporter.web.server import MetricsServer, Published, Snapshot

V4, V6 = "127.0.0.1", "::1"


def _has_ipv6_loopback() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind((V6, 0))
    except OSError:
        return False
    return True


HAS_IPV6 = _has_ipv6_loopback()
needs_ipv6 = pytest.mark.skipif(not HAS_IPV6, reason="this host has no IPv6 loopback")


@contextmanager
def serving(address: str | None) -> Iterator[MetricsServer]:
    published = Published()
    published.publish(Snapshot((b"metric_a 1\n",), True, "ok"))
    server = MetricsServer(published, address, 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def health(host: str, port: int) -> bytes:
    """`/health` asked over `host`: the answer's first line."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        out = b""
        while chunk := sock.recv(4096):
            out += chunk
    return out.split(b"\r\n", 1)[0]


def reaches(host: str, port: int) -> bool:
    try:
        return health(host, port) == b"HTTP/1.0 200 OK"
    except ConnectionRefusedError:
        return False


# address, whether a client reaches it over 127.0.0.1, over ::1 (None: not asserted), the host
# its URL names.
EVERY = "::" if HAS_IPV6 else "0.0.0.0"
FORMS = [
    (None, True, True, EVERY),
    (EVERY_ADDRESS, True, True, EVERY),
    ("::", True, True, EVERY),
    ("[::]", True, True, EVERY),
    ("::1", False, True, "::1"),
    ("[::1]", False, True, "::1"),
    ("0.0.0.0", True, False, "0.0.0.0"),
    ("127.0.0.1", True, False, "127.0.0.1"),
    ("localhost", True, None, "127.0.0.1"),  # a name: its IPv4 address first
]


@pytest.mark.parametrize(("address", "over_v4", "over_v6", "host"), FORMS)
def test_every_address_form_listens_where_it_says(
    address: str | None, over_v4: bool, over_v6: bool | None, host: str
) -> None:
    if not HAS_IPV6 and (over_v6 and not over_v4):
        pytest.skip("an IPv6-only address on a host without IPv6")
    with serving(address) as server:
        assert server.url("/metrics") == url("http", host, server.port, "/metrics")
        assert reaches(V4, server.port) is over_v4
        if HAS_IPV6 and over_v6 is not None:
            assert reaches(V6, server.port) is over_v6


@needs_ipv6
@pytest.mark.parametrize("default", [None, EVERY_ADDRESS])
def test_the_default_takes_ipv4_and_ipv6_clients(default: str | None) -> None:
    with serving(default) as server:
        assert server.url() == f"http://[::]:{server.port}/metrics"
        assert (health(V4, server.port), health(V6, server.port)) == (b"HTTP/1.0 200 OK",) * 2


@pytest.mark.parametrize("address", [None, EVERY_ADDRESS, "::", "[::]"])
def test_every_address_on_a_host_without_ipv6_is_ipv4_s(
    address: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "has_ipv6", False)
    with serving(address) as server:
        assert server.url() == f"http://0.0.0.0:{server.port}/metrics"
        assert reaches(V4, server.port)
        if HAS_IPV6:
            assert not reaches(V6, server.port)


def test_ipv6_the_host_cannot_listen_on_falls_to_ipv4(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel without IPv6 (or an address it lacks) answers the dual-stack socket with
    EAFNOSUPPORT or EADDRNOTAVAIL: the next way is taken, not an exit."""
    ways = [
        Bind(socket.AF_INET6, ("2001:db8::1", 0, 0, 0), dual_stack=True),  # documentation's
        Bind(socket.AF_INET, (V4, 0)),
    ]
    monkeypatch.setattr("mig_exporter.web.server.binds", lambda address, port: ways)
    with serving(None) as server:
        assert server.url() == f"http://127.0.0.1:{server.port}/metrics"
        assert reaches(V4, server.port)


@pytest.mark.parametrize(
    "address",
    [
        "192.0.2.1",  # an IPv4 address not on this host (TEST-NET-1)
        "2001:db8::1",  # an IPv6 one (documentation's)
        "[::1",  # half a bracket
        "256.0.0.1",  # not an address
        "::1]",
    ],
)
def test_an_address_that_cannot_be_used_is_an_oserror_with_its_reason(address: str) -> None:
    with pytest.raises(OSError) as e:
        MetricsServer(Published(), address, 0)
    assert isinstance(e.value.strerror, str) and e.value.strerror  # what the daemons print


@pytest.mark.parametrize("address", [None, "::", "0.0.0.0", "127.0.0.1"])
def test_a_port_in_use_is_an_oserror_even_where_ipv4_could_be_tried(address: str | None) -> None:
    """The default falls back to IPv4 only for a host without IPv6, never around a port some
    other socket holds."""
    with closing(socket.socket()) as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind((V4, 0))
        holder.listen()
        with pytest.raises(OSError) as e:
            MetricsServer(Published(), address, holder.getsockname()[1])
    assert e.value.errno == errno.EADDRINUSE and e.value.strerror


@pytest.mark.parametrize(
    ("host", "port", "written"),
    [
        (None, 9400, "[::]:9400"),
        ("", 9400, "[::]:9400"),
        ("::", 9400, "[::]:9400"),
        ("::1", 1, "[::1]:1"),
        ("fe80::1%eth0", 9400, "[fe80::1%25eth0]:9400"),
        ("[::1]", 9400, "[::1]:9400"),
        ("0.0.0.0", 9400, "0.0.0.0:9400"),
        ("localhost", 9401, "localhost:9401"),
    ],
)
def test_urls_write_ipv6_in_brackets(host: str | None, port: int, written: str) -> None:
    assert host_port(host, port) == written
    assert url("https", host, port, "/metrics") == f"https://{written}/metrics"


@pytest.mark.parametrize(
    ("address", "ipv6", "ways"),
    [
        (None, True, [(socket.AF_INET6, "::", True), (socket.AF_INET, "0.0.0.0", False)]),
        ("[::]", True, [(socket.AF_INET6, "::", True), (socket.AF_INET, "0.0.0.0", False)]),
        ("", False, [(socket.AF_INET, "0.0.0.0", False)]),
        ("::", False, [(socket.AF_INET, "0.0.0.0", False)]),
        ("0.0.0.0", True, [(socket.AF_INET, "0.0.0.0", False)]),
        ("[::1]", True, [(socket.AF_INET6, "::1", False)]),
    ],
)
def test_the_ways_to_listen_in_the_order_tried(
    address: str | None, ipv6: bool, ways: list[tuple[socket.AddressFamily, str, bool]]
) -> None:
    found = binds(address, 9400, ipv6=ipv6)
    assert [(b.family, b.address[0], b.dual_stack) for b in found] == ways
    assert all(b.address[1] == 9400 for b in found)
