"""gzip for the clients that ask for it (Prometheus always does): bodies compressed once per
publish, never per scrape."""

from __future__ import annotations

import gzip
import re
import threading
from collections.abc import Iterable

from web.snapshot import Page, Snapshot

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
