"""The bounds on what one client can make the server hold: connections at once, the size of a
request's head and the time to send it, the time a whole response may take, and the memory that
responses still sending replaced snapshots keep alive (`InFlight`)."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TypeVar

from mig_exporter.web.snapshot import Published, Snapshot

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


class Dropped(Exception):
    """A response given up part way: the connection is reset, and the reason logged at debug."""


class Budget:
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


class InFlight:
    """The `/metrics` responses being sent, each with the snapshot it holds, so that what the
    replaced snapshots keep alive stays bounded (PINNED_BYTES, PINNED_BODIES)."""

    def __init__(self, published: Published, limits: Limits) -> None:
        self.published = published
        self.limits = limits
        self._lock = threading.Lock()
        # In the order they began, so their snapshots are in the order they were published.
        self._sending: list[tuple[Snapshot, socket.socket, Budget]] = []

    @contextmanager
    def sending(self, sock: socket.socket, budget: Budget) -> Iterator[Snapshot]:
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
                held_bytes := held(current, [s for s, _, b in self._sending if b.cut is None])
            ) > limit:
                oldest = next(s for s, _, b in self._sending if b.cut is None and s is not current)
                reason = (
                    f"cut off: responses held {held_bytes} bytes of replaced snapshots, over the "
                    f"bound of {limit:.0f}, and this one's was the oldest"
                )
                for snapshot, sock, budget in self._sending:
                    if snapshot is oldest:
                        budget.cut = reason
                        # The fd's shutdown, not TLS's: it wakes the send blocked on it, in its
                        # own thread. An error: the client has gone already.
                        with suppress(OSError):
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def held(current: Snapshot, snapshots: Sequence[Snapshot]) -> int:
    """The bytes `snapshots` keep alive that `current` does not: parts they share are one part."""
    if all(s is current for s in snapshots):
        return 0
    seen = {id(p) for p in (*current.held(), current.own)}
    total = 0
    for snapshot in snapshots:
        for part in (*snapshot.held(), snapshot.own):
            if id(part) not in seen:
                seen.add(id(part))
                total += len(part)
    return total


def linger(sock: socket.socket) -> None:
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
