"""HTTP endpoint: `/metrics` serves the last snapshot's bytes, `/health` says if they can be
trusted, `/metrics/self` serves the daemon's own series alone.

`/metrics/nodes/<node>` and `/health/nodes/<node>` do the same for one node of a snapshot that
has per-node pages (the many-nodes exporter); a client asking for gzip gets bodies compressed
once per change. With a web config (config.py) it speaks TLS, checks client certificates or
basic auth, and adds the configured headers.

The pieces, each in its module: the snapshots (snapshot.py), gzip (gzipped.py), the
bounds on what a client can make the server hold (bounds.py), sending (sending.py), the
handler and its routes (handler.py), the address forms and URLs (listen.py). This module
listens, starts and stops the server, and is where the daemons and tests import all of it from.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable
from http.server import ThreadingHTTPServer
from typing import Any

from mig_exporter.common.text import one_line
from mig_exporter.web.bounds import (
    HEAD_TIMEOUT_S,
    MAX_CONNECTIONS,
    MAX_HEAD_BYTES,
    PINNED_BODIES,
    PINNED_BYTES,
    RESPONSE_DEADLINE_S,
    SEND_TIMEOUT_S,
    Dropped,
    HeadTooLarge,
    InFlight,
    Limits,
    read_head,
)
from mig_exporter.web.config import BasicAuth, WebConfig, server_context
from mig_exporter.web.gzipped import GZIP_LEVEL, Gzipped, accepts_gzip
from mig_exporter.web.handler import (
    CONTENT_TYPE,
    HEALTH_PAGES,
    PAGES,
    SELF,
    Handler,
    Site,
    target_path,
)
from mig_exporter.web.listen import EVERY_ADDRESS, NO_IPV6, Bind, binds, url
from mig_exporter.web.sending import IOV_MAX, TLS_CHUNK_BYTES, send_all
from mig_exporter.web.snapshot import Page, Published, Snapshot

__all__ = [
    "CONTENT_TYPE",
    "EVERY_ADDRESS",
    "GZIP_LEVEL",
    "HEAD_TIMEOUT_S",
    "HEALTH_PAGES",
    "IOV_MAX",
    "MAX_CONNECTIONS",
    "MAX_HEAD_BYTES",
    "PAGES",
    "PINNED_BODIES",
    "PINNED_BYTES",
    "RESPONSE_DEADLINE_S",
    "SELF",
    "SEND_TIMEOUT_S",
    "TLS_CHUNK_BYTES",
    "Dropped",
    "Gzipped",
    "HeadTooLarge",
    "Limits",
    "MetricsServer",
    "Page",
    "Published",
    "Snapshot",
    "accepts_gzip",
    "read_head",
    "send_all",
    "target_path",
    "url",
]

log = logging.getLogger("exporter.http")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # a burst of connections waits in the kernel, not refused there

    def __init__(self, bind: Bind, site: Site, context: ssl.SSLContext | None) -> None:
        self.address_family = bind.family  # what TCPServer makes its socket of
        self.dual_stack = bind.dual_stack
        self.site = site
        self.context = context
        self.slots = threading.BoundedSemaphore(site.limits.max_connections)
        super().__init__(bind.address, Handler)

    def server_bind(self) -> None:
        if self.dual_stack:
            try:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError as e:  # IPv6 without IPv4 on the same socket (OpenBSD): IPv4 then
                raise OSError(errno.EAFNOSUPPORT, f"no dual-stack IPv6: {e.strerror}") from e
        super().server_bind()

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
            self.site.limits.max_connections,
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

    `address` in any form listen.py takes; None or EVERY_ADDRESS: every address, IPv6 and
    IPv4 where the host has IPv6. One that cannot be listened on raises OSError; a `web` whose
    certificates cannot be loaded raises WebConfigError, both before anything listens.
    """

    def __init__(
        self,
        published: Published,
        address: str | None,
        port: int,
        web: WebConfig | None = None,
        limits: Limits | None = None,
        runtime: Callable[[], bytes] | None = None,
    ) -> None:
        limits = limits or Limits()
        context = server_context(web) if web is not None else None
        self.tls = context is not None
        self.published = published
        self.inflight = InFlight(published, limits)
        self.gzipped = Gzipped()
        site = Site(
            published=published,
            inflight=self.inflight,
            limits=limits,
            headers=web.headers if web is not None else (),
            auth=BasicAuth(web.users) if web is not None and web.users else None,
            gzipped=self.gzipped,
            runtime=runtime,
        )
        self.httpd = _listen(binds(address, port), site, context)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)

    @property
    def host(self) -> str:
        """The address listened on: `::` when it is every address, IPv6 and IPv4."""
        return str(self.httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, path: str = "/metrics") -> str:
        """Where it listens, for the log line: `http://[::]:9400/metrics`."""
        return url("https" if self.tls else "http", self.host, self.port, path)

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


def _listen(ways: list[Bind], site: Site, context: ssl.SSLContext | None) -> _Server:
    """A server listening the first of `ways` that the host can: the next is tried only when
    one fails for want of IPv6 (NO_IPV6), and the last one's error is raised."""
    *before, last = ways
    for bind in before:
        try:
            return _Server(bind, site, context)
        except OSError as e:
            if e.errno not in NO_IPV6:
                raise
    return _Server(last, site, context)
