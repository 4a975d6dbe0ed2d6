"""What the server serves: an immutable snapshot of the body and health, and the one slot
(`Published`) a daemon replaces it in.

A scrape only reads a snapshot; the daemon publishes a new one when what it serves changes (its
topology, a step of the simulated values, an NVML collection), never per scrape. Many nodes'
pages are written from the snapshot's values when asked (`Page`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol


class Page(Protocol):
    """One node's page (`/metrics/nodes/<node>`), written when asked: many nodes' text is far
    larger than what it is written from. The same object while the node's series are."""

    def page(self) -> tuple[bytes, ...]: ...


@dataclass(frozen=True)
class Snapshot:
    """What `/metrics` serves: the body as the parts it was joined from, never copied whole.

    A change publishes a new tuple of references, and a scrape hands the parts to the kernel as
    they are. Many nodes' body (`whole`) runs to hundreds of MiB: it is joined when `/metrics` is
    first asked for in this snapshot, then kept with it; where each node is its own target, never.
    """

    parts: tuple[bytes, ...] = ()
    healthy: bool = False
    reason: str = "no topology yet"
    own: bytes = b""  # the daemon's own metrics, served after the DCGM series
    # False only before the first topology: /metrics answers 503 then, so a scrape right after a
    # (re)start fails (Prometheus: up == 0) instead of reading an empty exporter as real.
    ready: bool = True
    # `/metrics/nodes/<node>`: each node's own page. Empty: no per-node pages.
    pages: Mapping[str, Page] = field(default_factory=dict)
    whole: Callable[[], tuple[bytes, ...]] | None = None  # the body, instead of `parts`
    # False while the first list of the nodes is read: a node not in `pages` may still come
    # (503), rather than not be served here (404).
    complete: bool = True
    # When (time.monotonic) the daemon should have published again at the latest: past it, the
    # loop that publishes is stuck (an NVML call that never returns, a bug), and `/health`
    # says so rather than answer for the old state. Never, by default.
    stale_after: float = math.inf

    def health(self) -> tuple[bool, str]:
        """(healthy, the reason `/health` gives), stuck or not."""
        late = time.monotonic() - self.stale_after
        if late > 0:
            return False, (
                f"nothing published for {late:.0f} s past its time: the loop that publishes is "
                f"stuck; serving what it last published ({self.reason})"
            )
        return self.healthy, self.reason

    @cached_property
    def body_parts(self) -> tuple[bytes, ...]:
        return self.parts if self.whole is None else self.whole()

    @property
    def joined(self) -> bool:
        """Whether the body's parts are there: a `whole` is joined when first asked for."""
        return self.whole is None or "body_parts" in self.__dict__

    def held(self) -> tuple[bytes, ...]:
        """The parts of the body this snapshot holds now (none of a `whole` not asked for)."""
        return self.body_parts if self.joined else self.parts

    @property
    def size(self) -> int:
        return sum(map(len, self.held())) + len(self.own)

    @cached_property
    def body(self) -> bytes:
        return b"".join(self.body_parts)


class Published:
    """The one snapshot scrapes see; replaced whole, so readers never see half an update.

    Servers watch it to bound what the snapshots it replaced still hold (`mig_exporter.web.bounds.InFlight`).
    """

    def __init__(self) -> None:
        self.snapshot = Snapshot(ready=False)
        self._watchers: list[Callable[[], None]] = []

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        for watcher in tuple(self._watchers):
            watcher()

    def watch(self, watcher: Callable[[], None]) -> None:
        """Call `watcher` after each publish, in the publisher's thread."""
        self._watchers.append(watcher)

    def unwatch(self, watcher: Callable[[], None]) -> None:
        with suppress(ValueError):  # a server stopped twice, or never started
            self._watchers.remove(watcher)
