"""Sending a response's bytes: every part handed to the kernel as it is (sendmsg, no copies), or
over TLS in records; each send within what is left of the response's `Budget`."""

from __future__ import annotations

import io
import os
import socket
import ssl
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

from mig_exporter.web.bounds import Budget

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16  # buffers per sendmsg
TLS_CHUNK_BYTES = 256 << 10  # TLS cannot hand the kernel many buffers at once: parts are joined
# into records of about this size


class SocketWriter(io.BufferedIOBase):
    """`wfile`: every write sent whole, on a plain or a TLS socket, within the response's
    budget once it has one."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.budget: Budget | None = None

    def writable(self) -> bool:
        return True

    def write(self, b: ReadableBuffer, /) -> int:
        send_all(self._sock, (bytes(b),), self.budget)  # bytes(), as http.server writes: no copy
        return memoryview(b).nbytes


def send_all(sock: socket.socket, parts: Sequence[bytes], budget: Budget | None = None) -> None:
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


def _send_tls(sock: ssl.SSLSocket, parts: Sequence[bytes], budget: Budget | None) -> None:
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
