"""gzip for the clients that ask for it (Prometheus always does): bodies compressed once per
change, never per scrape, and each answer one gzip stream that any client reads whole.

A body is kept as parts (a node's family, a family's header), and so is its compression: each part
is deflated once, alone, by a compressor that then makes a full flush (Z_FULL_FLUSH). What it
wrote ends on a byte boundary, refers to nothing before it and leaves the stream open, so the
parts' blocks are a valid deflate stream in any order and any company. An answer is a gzip header,
the parts' blocks, an empty last block, and a trailer with the CRC-32 and length of the whole
body (RFC 1951, RFC 1952), put together once per body and kept for the next scrapes.

Several gzip members, one per part (what this was until issue #33), are valid gzip too, but curl,
urllib3 and zlib's own `wbits=31` read only the first member and stop or fail.

The trailer's CRC-32 is zlib.crc32 run over the parts' text in order: zlib's crc32_combine, which
would join the parts' own CRCs from their lengths alone, is not exposed by Python's zlib, and one
written in Python costs about 20 µs a part (polynomial products modulo the CRC's, bit by bit),
3 s for 150,000 parts, where zlib.crc32 runs over their 80 MiB in 40 ms (measured
here, on one core).
"""

from __future__ import annotations

import gzip
import re
import struct
import threading
import zlib
from collections.abc import Iterable, Sequence

from mig_exporter.web.snapshot import Page, Snapshot

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


# RFC 1952: ID1 ID2, CM deflate, no flags, no MTIME, XFL 4 (the fastest compression) or 2 (the
# best) or 0, OS unknown.
_XFL = {1: 4, 9: 2}.get(GZIP_LEVEL, 0)
HEADER = bytes((0x1F, 0x8B, 8, 0, 0, 0, 0, 0, _XFL, 255))
_LAST = b"\x03\x00"  # an empty block of fixed codes with BFINAL set: the deflate stream ends
STREAMS = 8  # bodies whose stream is kept: `/metrics` and `/metrics/self` of a snapshot or two
IDLE_COMPRESSORS = 4  # compressors kept between scrapes (each holds about 260 KiB)


def trailer(parts: Sequence[bytes]) -> bytes:
    """The last block and the gzip trailer of `parts` joined: CRC-32 and length modulo 2**32."""
    crc = 0
    for part in parts:
        crc = zlib.crc32(part, crc)
    return _LAST + struct.pack("<II", crc, sum(map(len, parts)) & 0xFFFFFFFF)


class Gzipped:
    """Bodies compressed once per change, never per scrape.

    A node's page is one gzip member made once per page (the same object while its node is
    unchanged). `/metrics` is its parts' blocks, each made once per part (a part a snapshot
    shares with the last one is not compressed again), framed once per body as one stream: by the
    first scrape after a publish, as many nodes' body is joined only when asked. A publish
    forgets what the new snapshot no longer has (`keep`).

    HTTP threads add entries while the publisher's thread drops stale ones: the tables change
    under a lock, compressing happens outside it, each thread with a compressor of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # id(part) -> (part, its blocks), id(page) -> (page, its member): each held, so its id
        # is not reused while listed.
        self._blocks: dict[int, tuple[bytes, bytes]] = {}
        self._members: dict[int, tuple[Page, bytes]] = {}
        # the parts' ids -> (the parts, their stream): the last STREAMS bodies, oldest first.
        self._streams: dict[tuple[int, ...], tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}
        self._idle: list[zlib._Compress] = []

    def of(self, parts: Iterable[bytes]) -> tuple[bytes, ...]:
        """`/metrics`: the parts as one gzip stream. Element i holds part i's blocks (the first
        with the header before them), the last element the trailer; empty parts are left out."""
        parts = tuple(p for p in parts if p)
        key = tuple(map(id, parts))
        hit = self._streams.get(key)
        if hit is not None:
            return hit[1]
        blocks = self._deflated(parts)
        end = trailer(parts)
        stream = (HEADER + blocks[0], *blocks[1:], end) if blocks else (HEADER + end,)
        with self._lock:
            self._streams[key] = (parts, stream)
            while len(self._streams) > STREAMS:
                del self._streams[next(iter(self._streams))]
        return stream

    def _deflated(self, parts: Sequence[bytes]) -> list[bytes]:
        """Each part's blocks: kept ones as they are, the others made now."""
        out = []
        compressor = None
        for part in parts:
            hit = self._blocks.get(id(part))
            if hit is None or hit[0] is not part:
                if compressor is None:
                    compressor = self._compressor()
                # Full flush: byte-aligned, and what follows refers to nothing before it.
                hit = (part, compressor.compress(part) + compressor.flush(zlib.Z_FULL_FLUSH))
                with self._lock:
                    self._blocks[id(part)] = hit
            out.append(hit[1])
        if compressor is not None:
            with self._lock:
                if len(self._idle) < IDLE_COMPRESSORS:
                    self._idle.append(compressor)
        return out

    def _compressor(self) -> zlib._Compress:
        """An idle compressor, or a new one: raw deflate, never finished. Made anew, one costs
        about as much as compressing a small part; reused, a part costs a few µs."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)

    def page(self, page: Page) -> tuple[bytes, ...]:
        """A node's page: one member for all of it (it compresses several times better)."""
        hit = self._members.get(id(page))
        if hit is None or hit[0] is not page:
            hit = (page, gzip.compress(b"".join(page.page()), GZIP_LEVEL, mtime=0))
            with self._lock:
                self._members[id(page)] = hit
        return (hit[1],)

    def keep(self, snapshot: Snapshot) -> None:
        """After a publish: forget the parts and pages the new snapshot no longer has, and every
        stream (each ends with the daemon's own series, new at each publish)."""
        live = {id(p) for p in snapshot.held()}
        pages = set(map(id, snapshot.pages.values()))
        with self._lock:
            self._blocks = {k: v for k, v in self._blocks.items() if k in live}
            self._members = {k: v for k, v in self._members.items() if k in pages}
            self._streams = {}
