"""`--source nvml`: collect from NVML on an interval, publish the rendering, say when it is stale.

Collections run in the exporter's own loop, never in a scrape: `/metrics` serves the last one.
A collection that fails keeps the last good one served, counts the failure, and turns `/health`
to 503 with NVML's reason until a collection succeeds again. A topology (file or ConfigMap), when
given, only names the pods holding the GPUs; its problems are reported the same way.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType

from common.selfmetrics import InvalidObjects, kind_of
from exporter import dcgm, nvml
from exporter.service import wait_for_work
from exporter.source import missing_node, node_of
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology
from web.server import Published, Snapshot

log = logging.getLogger("exporter")
DEFAULT_INTERVAL_MS = 30_000  # dcgm-exporter's default collect interval


def _rfc3339(at: float) -> str:
    return (
        dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


class NvmlExporter:
    """Collects every `interval_s` seconds and serves the last good collection."""

    def __init__(
        self,
        nv: ModuleType,
        options: dcgm.Options,
        published: Published,
        interval_s: float = DEFAULT_INTERVAL_MS / 1000,
        node_name: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.nv = nv
        self.options = options
        self.published = published
        self.interval_s = interval_s
        self.node_name = node_name
        self.clock = clock or (lambda: time.time())
        self.wake = threading.Event()
        self._lock = threading.Lock()  # the counts below are read by scrapes' snapshots
        self._sample: nvml.NodeSample | None = None
        self._collected_at: float | None = None
        self._failures = 0
        self._lost: tuple[str, ...] = ()
        self._node: NodeTopology | None = None  # the pods holding this node's GPUs, if given
        self._problems: dict[str, str] = {}  # "nvml" / "topology" -> why /health is 503
        self._counted: TopologyError | None = None
        self.invalid = InvalidObjects("mig_exporter_invalid_objects_total")

    # --- NVML ------------------------------------------------------------------------------------

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
            self._set_problem("nvml", f"stale: {e}; {when}")
            return
        if sample.lost != self._lost:
            for gpu in sample.lost:
                if gpu not in self._lost:
                    log.warning("NVML reports %s lost: its series are gone", gpu)
            self._lost = sample.lost
        with self._lock:
            self._sample, self._collected_at = sample, self.clock()
        self._set_problem("nvml", None)

    # --- the topology that names pods (a Sink for follow_file and the watches) -------------------

    def update(self, topology: Topology, obj: str) -> None:
        name = self.node_name or ""
        try:
            node = node_of(topology, name, obj)
        except TopologyError as e:
            self._count(TopologyError(f"node {name}", e.field, e.message))
            self._set_problem("topology", f"{e}; pod labels from the last good topology")
        else:
            if node is None:
                reason = missing_node(topology, name, obj)
                self._set_problem("topology", f"{reason}; pod labels from the last good topology")
            else:
                self._node, self._counted = node, None
                self._set_problem("topology", None)
        self.wake.set()

    def rejected(self, e: TopologyError) -> None:
        self._count(e)
        self.problem(f"{e}; pod labels from the last good topology")

    def problem(self, reason: str) -> None:
        self._set_problem("topology", reason)
        self.wake.set()

    def _count(self, e: TopologyError) -> None:
        if e != self._counted:
            self._counted = e
            self.invalid.count(kind_of(e.obj))

    def _set_problem(self, source: str, reason: str | None) -> None:
        before = self._problems.get(source)
        if reason == before:
            return
        if reason:
            log.warning("%s", reason)
            self._problems[source] = reason
        else:
            log.info("%s is good again", "NVML" if source == "nvml" else "the topology")
            del self._problems[source]

    # --- out -------------------------------------------------------------------------------------

    def own_metrics(self) -> bytes:
        with self._lock:
            failures, at = self._failures, self._collected_at
        lines = [
            "# HELP mig_exporter_nvml_failed_collections_total NVML collections that failed; "
            "the last good one stays served.",
            "# TYPE mig_exporter_nvml_failed_collections_total counter",
            f"mig_exporter_nvml_failed_collections_total {failures}",
            "# HELP mig_exporter_nvml_last_collection_timestamp_seconds When the served values "
            "were collected.",
            "# TYPE mig_exporter_nvml_last_collection_timestamp_seconds gauge",
            f"mig_exporter_nvml_last_collection_timestamp_seconds {at or 0:.3f}",
        ]
        return ("\n".join(lines) + "\n").encode() + self.invalid.exposition()

    def snapshot(self) -> Snapshot:
        with self._lock:
            sample = self._sample
        body = b"" if sample is None else nvml.render(sample, self.options, self._node)
        reason = "; ".join(self._problems[k] for k in sorted(self._problems))
        return Snapshot((body,), not reason, reason or "ok", self.own_metrics(), sample is not None)

    def run(self, stop: threading.Event, sources: Sequence[threading.Thread] = ()) -> None:
        """Collect on the interval; publish after each collection and each topology change."""
        due = time.monotonic()
        while not stop.is_set():
            if time.monotonic() >= due:
                self.collect()
                due = time.monotonic() + self.interval_s
            self.wake.clear()
            self.published.publish(self.snapshot())
            gone = wait_for_work(self.wake, due - time.monotonic(), sources, stop)
            if gone:
                self._set_problem("topology", gone)
