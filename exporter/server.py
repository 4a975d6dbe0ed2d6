"""HTTP endpoint: `/metrics` serves the last rendered bytes, `/health` says if they can be trusted.

A scrape only reads an immutable snapshot; rendering happens when the topology changes.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16  # buffers per sendmsg


@dataclass(frozen=True)
class Snapshot:
    """What `/metrics` serves: the body as the parts it was joined from, never copied whole.

    Many nodes' body runs to a hundred MiB; a change to one node swaps its fragments and
    publishes a new tuple of references, and a scrape hands the parts to the kernel as they are.
    """

    parts: tuple[bytes, ...] = ()
    healthy: bool = False
    reason: str = "no topology yet"
    own: bytes = b""  # the daemon's own metrics, served after the DCGM series
    size: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", sum(map(len, self.parts)) + len(self.own))

    @cached_property
    def body(self) -> bytes:
        return b"".join(self.parts)


class Published:
    """The one snapshot scrapes see; replaced whole, so readers never see half an update."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot


def _handler(published: Published) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "mig-exporter"

        def do_GET(self) -> None:
            snap = published.snapshot
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send_parts((*snap.parts, snap.own), snap.size)
            elif path == "/health":
                status = 200 if snap.healthy else 503
                text = "ok" if snap.healthy else snap.reason
                self._send(status, f"{text}\n".encode(), "text/plain; charset=utf-8")
            else:
                self._send(
                    404, b"not found: try /metrics or /health\n", "text/plain; charset=utf-8"
                )

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send_parts(self, parts: tuple[bytes, ...], size: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            send_all(self.connection, parts)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    return Handler


def send_all(sock: socket.socket, parts: Sequence[bytes]) -> None:
    """Send every part in order with as few system calls as the kernel allows, copying none."""
    views = [memoryview(p) for p in parts if p]
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i : i + IOV_MAX])
        while sent:  # a partial send: skip what went, resume inside the part it stopped in
            if sent >= len(views[i]):
                sent -= len(views[i])
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0


class MetricsServer:
    def __init__(self, published: Published, address: str, port: int) -> None:
        ThreadingHTTPServer.daemon_threads = True
        self.httpd = ThreadingHTTPServer((address, port), _handler(published))
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
