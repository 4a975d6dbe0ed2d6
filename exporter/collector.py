"""`--source nvml`: collect from NVML on an interval, publish the rendering, say when it is stale.

Collections run in the render loop (`tick`), never in a scrape: `/metrics` serves the last one.
A collection that fails keeps the last good one served, counts the failure, and turns `/health`
to 503 with NVML's reason until a collection succeeds again. A topology (file or ConfigMap), when
given, only names the pods holding the GPUs; its problems are reported the same way, and
`/health` names both sources' problems.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType

from exporter import dcgm, nvml
from exporter.health import Health
from exporter.loop import RenderLoop
from exporter.node import KEY, OneNode
from mig_exporter.common import selfmetrics
from mig_exporter.web.server import Published, Snapshot
from topology.model import NodeTopology

log = logging.getLogger("exporter")
DEFAULT_INTERVAL_MS = 30_000  # dcgm-exporter's default collect interval
NVML = "nvml"  # the problem key of collections; the topology's is node.KEY


def _rfc3339(at: float) -> str:
    return (
        dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


class NvmlExporter(RenderLoop):
    """Collects every `interval_s` seconds and serves the last good collection; a topology, when
    given, reaches it through its `sink`."""

    def __init__(
        self,
        nv: ModuleType,
        options: dcgm.Options,
        published: Published,
        interval_s: float = DEFAULT_INTERVAL_MS / 1000,
        node_name: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        # The only sources are the topology's: one that ended is the topology's problem.
        super().__init__(published, Health(every=True), clock, stopped_key=KEY)
        self.nv = nv
        self.options = options
        self.interval_s = interval_s
        self.node_name = node_name or ""
        self._lock = threading.Lock()  # the counts below are read by scrapes' snapshots
        self._sample: nvml.NodeSample | None = None
        self._collected_at: float | None = None
        self._failures = 0
        self._lost: tuple[str, ...] = ()
        self._node: NodeTopology | None = None  # the pods holding this node's GPUs, if given
        self._due = float("-inf")  # when the next collection is (time.monotonic)
        self.sink = OneNode(self.node_name, self.health, self.wake, self.take,
                            keeps="pod labels from the last good topology",
                            good_again="the topology is good again")  # fmt: skip

    # --- NVML ------------------------------------------------------------------------------------

    def tick(self) -> None:
        if time.monotonic() >= self._due:
            self.collect()
            self._due = time.monotonic() + self.interval_s

    def due_in(self) -> float:
        return self._due - time.monotonic()

    def collect(self) -> None:
        """One collection: the new sample served, or the last kept and the failure reported."""
        try:
            sample = nvml.collect(self.nv)
        except nvml.CollectionFailed as e:
            with self._lock:
                self._failures += 1
            when = (
                f"the last good one is from {_rfc3339(self._collected_at)}"
                if self._collected_at is not None
                else "nothing collected yet"
            )
            self.health.set(NVML, f"stale: {e}; {when}")
            return
        if sample.lost != self._lost:
            for gpu in sample.lost:
                if gpu not in self._lost:
                    log.warning("NVML reports %s lost: its series are gone", gpu)
            self._lost = sample.lost
        with self._lock:
            self._sample, self._collected_at = sample, self.clock()
        self.health.clear(NVML, "NVML is good again")

    # --- the topology that names pods (its sink, OneNode: fed by a file or a ConfigMap) ---------

    def take(self, node: NodeTopology) -> None:
        self._node = node

    # --- out -------------------------------------------------------------------------------------

    def own_metrics(self) -> bytes:
        with self._lock:
            failures, at = self._failures, self._collected_at
        return selfmetrics.exposition(
            selfmetrics.counter(
                "mig_exporter_nvml_failed_collections_total",
                "NVML collections that failed; the last good one stays served.",
                failures,
            ),
            selfmetrics.gauge(
                "mig_exporter_nvml_last_collection_timestamp_seconds",
                "When the served values were collected.",
                round(at or 0, 3),
            ),
            self.invalid.family(),
        )

    def snapshot(self) -> Snapshot:
        with self._lock:
            sample = self._sample
        body = b"" if sample is None else nvml.render(sample, self.options, self._node)
        healthy, reason = self.health.state()
        return Snapshot((body,), healthy, reason, self.own_metrics(), sample is not None)
