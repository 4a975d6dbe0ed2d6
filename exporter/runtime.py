"""dcgm-exporter's `--enable-exporter-metrics` (from 4.8.4): the exporter process's own series on
`/metrics`, after everything else, written per scrape.

dcgm-exporter registers client_golang's Go and process collectors and wraps its handler in
promhttp's instrumentation (its server/exporter_metrics.go), so a dashboard of exporter health
reads `go_*`, `process_*` and `promhttp_metric_handler_*`. Here: `process_*` are this process's
own, read by prometheus_client's process collector (the same names, types and help as
client_golang's); `promhttp_metric_handler_requests_in_flight` and `_total{code}` count this
exporter's scrapes as promhttp does (the scrape being served is in flight, and counted once it is
done); of the Go runtime, `go_info` names the Go release the generation was built with and
`go_goroutines` and `go_threads` count this process's threads. The Go memory and garbage
collector series are left out: a Python process has none to report, and made-up values would
read as a real one (docs/upgrade.md).
"""

from __future__ import annotations

import threading

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector

from mig_exporter.common import selfmetrics

CODES = ("200", "500", "503")  # what promhttp's InstrumentMetricHandler pre-initialises


def _os_threads() -> int:
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return threading.active_count()


class Runtime:
    """Renders the runtime series; each call is one scrape of `/metrics`."""

    def __init__(self, go_version: str) -> None:
        self.go_version = go_version
        self._process = ProcessCollector(registry=None)
        self._lock = threading.Lock()
        self._serving = 0
        self._served = 0

    def __call__(self) -> bytes:
        with self._lock:
            self._serving += 1
            serving, served = self._serving, self._served
        try:
            return selfmetrics.exposition(*self._families(serving, served))
        finally:
            with self._lock:
                self._serving -= 1
                self._served += 1

    def _families(self, serving: int, served: int) -> list[Metric]:
        info = GaugeMetricFamily("go_info", "Information about the Go environment.",
                                 labels=["version"])  # fmt: skip
        info.add_metric([self.go_version], 1)
        requests = CounterMetricFamily(
            "promhttp_metric_handler_requests", "Total number of scrapes by HTTP status code.",
            labels=["code"],
        )  # fmt: skip
        for code in CODES:
            requests.add_metric([code], served if code == "200" else 0)
        return [
            selfmetrics.gauge("go_goroutines", "Number of goroutines that currently exist.",
                              threading.active_count()),
            info,
            selfmetrics.gauge("go_threads", "Number of OS threads created.", _os_threads()),
            *sorted(self._process.collect(), key=lambda m: m.name),
            selfmetrics.gauge("promhttp_metric_handler_requests_in_flight",
                              "Current number of scrapes being served.", serving),
            requests,
        ]  # fmt: skip
