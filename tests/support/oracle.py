"""A second way to read the simulated series: families of (labels, value) samples, not text.

The product writes series lines straight from its subjects (`dcgm.subject_fragments`); tests and
the benchmark's prometheus_client collector (bench/scale.py) want the same series as values, to
compare without parsing text. Built from `dcgm.entities` and each field's declared reading, as the
product is, with the same rule for what is left out (a value the exposition cannot carry).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter import dcgm
from exporter.fields import Counter
from exporter.series import Labels
from topology.model import NodeTopology


@dataclass(frozen=True)
class Family:
    counter: Counter
    samples: list[tuple[Labels, int | float]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.counter.name

    @property
    def help(self) -> str:
        return self.counter.help


def families(node: NodeTopology, options: dcgm.Options, now: float) -> list[Family]:
    """DCGM series of one node's GPUs at time `now` (seconds since the epoch)."""
    subjects = dcgm.entities(node, options, now)
    out = []
    for counter in options.counters.metrics:
        f = counter.field
        fam = Family(counter)
        for kind, labels, reading in subjects:
            value = f.read(reading)
            if kind in f.where and value is not None and dcgm.writable(value):
                fam.samples.append((labels, value))
        if fam.samples:
            out.append(fam)
    return out
