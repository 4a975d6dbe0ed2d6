"""Where the server listens: any address form the platform takes, and how to write it in a URL.

- every address (`EVERY_ADDRESS`, "", None, `::` or `[::]`): IPv6 and IPv4 on one socket
  (IPV6_V6ONLY off) where the host has IPv6, else IPv4's 0.0.0.0;
- an IPv6 address, with or without brackets (`::1`, `[::1]`, `fe80::1%eth0`): that address only;
- an IPv4 address (`127.0.0.1`; `0.0.0.0` is every IPv4 address, and IPv4 only);
- a name (`localhost`): one of its addresses, IPv4 first where it has one, as Go's net.Listen
  (the exporters this one stands beside) does.

An address that cannot be used raises OSError with its strerror, as a bind does.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Any

EVERY_ADDRESS = ""  # the daemons' default: every address, dual-stack where the host can
# A listen that fails for these on the dual-stack socket means the host has no IPv6 after all
# (a kernel without it, IPv6 turned off): IPv4's every address is tried instead.
NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL})


@dataclass(frozen=True)
class Bind:
    """One way to listen: a socket family, the address to bind it to, and whether the IPv6
    socket takes IPv4 too."""

    family: socket.AddressFamily
    address: tuple[Any, ...]  # as the family's bind takes it
    dual_stack: bool = False


def binds(address: str | None, port: int, ipv6: bool | None = None) -> list[Bind]:
    """The ways to listen on `address` and `port`, in the order to try them: the next only when
    the one before fails for a reason in NO_IPV6. `ipv6`: whether the host has it (by default,
    whether Python was built with it)."""
    host = address or ""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host in ("", "::"):
        every = Bind(socket.AF_INET, ("0.0.0.0", port))
        has_ipv6 = socket.has_ipv6 if ipv6 is None else ipv6
        if has_ipv6 and hasattr(socket, "IPV6_V6ONLY"):
            return [Bind(socket.AF_INET6, ("::", port, 0, 0), dual_stack=True), every]
        return [every]
    infos = socket.getaddrinfo(
        host, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )
    family, _, _, _, sockaddr = next((i for i in infos if i[0] == socket.AF_INET), infos[0])
    return [Bind(family, sockaddr)]


def host_port(host: str | None, port: int) -> str:
    """`host:port` as a URL writes it: an IPv6 address in brackets, every address as `[::]`."""
    host = host or "::"
    if ":" in host and not host.startswith("["):
        host = f"[{host.replace('%', '%25')}]"  # a zone id's % escaped (RFC 6874)
    return f"{host}:{port}"


def url(scheme: str, host: str | None, port: int, path: str = "") -> str:
    """`scheme://host:port/path`, for a log line: `http://[::]:9400/metrics`."""
    return f"{scheme}://{host_port(host, port)}{path}"
