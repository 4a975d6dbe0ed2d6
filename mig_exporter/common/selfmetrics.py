"""The daemons' own metrics: how many objects each had to skip (or use in part) for bad input.

Every problem is logged once, when first seen, and counted then, by the kind of object it is
about (`node`, `pod`, `configmap`, `file`): a rate above zero means someone's objects are being
ignored. Rendered in the Prometheus text format after the daemon's other series.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest


def gauge(name: str, documentation: str, value: float) -> Metric:
    """One of a daemon's own gauges, without labels."""
    return GaugeMetricFamily(name, documentation, value=value)


def counter(name: str, documentation: str, value: float) -> Metric:
    """One of a daemon's own counters, without labels (`name` ends in `_total`)."""
    return CounterMetricFamily(name, documentation, value=value)


class _Families:
    """What prometheus_client's writer reads: a registry's `collect`."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def exposition(*families: Metric) -> bytes:
    """A daemon's own series in the text format, written by prometheus_client (HELP, TYPE and
    escaping as every client library writes them): built from the daemon's state when it
    publishes, never kept in global gauges."""
    return generate_latest(_Families(families))


KINDS = ("node", "pod", "configmap", "file")  # always present, so a rate() has a series to read


def kind_of(obj: str) -> str:
    """The kind of the object a TopologyError names (`node n1`, `pod ns/p`, `ConfigMap ns/n`)."""
    word = obj.split(" ", 1)[0].lower()
    return word if word in KINDS else "file" if word == "topology" else "configmap"


class InvalidObjects:
    def __init__(self, metric: str) -> None:
        self.metric = metric
        self._counts: Counter[str] = Counter({kind: 0 for kind in KINDS})
        self._lock = threading.Lock()  # counted by the writer, read by scrapes

    def count(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] += 1

    def value(self, kind: str) -> int:
        with self._lock:
            return self._counts[kind]

    def family(self) -> Metric:
        with self._lock:
            counts = sorted(self._counts.items())
        family = CounterMetricFamily(
            self.metric,
            "Objects skipped or used in part because of bad input, counted once per problem "
            "when it is first seen.",
            labels=["kind"],
        )
        for kind, n in counts:
            family.add_metric([kind], n)
        return family

    def exposition(self) -> bytes:
        return exposition(self.family())
