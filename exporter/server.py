"""HTTP endpoint: `/metrics` serves the last rendered bytes, `/health` says if they can be trusted.

A scrape only reads an immutable snapshot; rendering happens when the topology changes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Snapshot:
    body: bytes = b""
    healthy: bool = False
    reason: str = "no topology yet"


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
                self._send(200, snap.body, CONTENT_TYPE)
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

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds is not news

    return Handler


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
