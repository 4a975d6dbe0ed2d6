"""The daemons' own metrics: how many objects each had to skip (or use in part) for bad input.

Every problem is logged once, when first seen, and counted then, by the kind of object it is
about (`node`, `pod`, `configmap`, `file`): a rate above zero means someone's objects are being
ignored. Rendered in the Prometheus text format after the daemon's other series.
"""

from __future__ import annotations

import threading
from collections import Counter

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

    def exposition(self) -> bytes:
        with self._lock:
            counts = sorted(self._counts.items())
        lines = [
            f"# HELP {self.metric} Objects skipped or used in part because of bad input, "
            "counted once per problem when it is first seen.",
            f"# TYPE {self.metric} counter",
            *(f'{self.metric}{{kind="{kind}"}} {n}' for kind, n in counts),
        ]
        return ("\n".join(lines) + "\n").encode()
