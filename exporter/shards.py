"""Shards: `--shard N --total-shards M` serves only the nodes whose name hashes to N.

The hash is Prometheus's `hashmod` relabel action (md5 of the value, its last 8 bytes as a
big-endian integer, modulo M), so that a scrape config can send each node's target to the shard
that serves it with relabelling alone, and every replica agrees without talking to the others.
A StatefulSet's pod knows its shard from its ordinal, the number its name ends with.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from mig_exporter.common import selfmetrics

_ORDINAL = re.compile(r"-([0-9]{1,6})$")


def shard_of(name: str, total: int) -> int:
    """The shard of `total` that serves node `name`: Prometheus's hashmod of the name."""
    digest = hashlib.md5(name.encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[8:], "big") % total


def ordinal(pod_name: str) -> int | None:
    """A StatefulSet pod's ordinal (`…-all-nodes-3` is 3); None for a name without one."""
    found = _ORDINAL.search(pod_name)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Shard:
    ordinal: int
    total: int

    def __post_init__(self) -> None:
        if not 0 <= self.ordinal < self.total:
            raise ValueError(
                f"shard {self.ordinal} is not one of {self.total} (0 to {self.total - 1})"
            )

    def owns(self, name: str) -> bool:
        return shard_of(name, self.total) == self.ordinal

    def exposition(self) -> bytes:
        """The self-metrics kube-state-metrics has for its shards, so an alert sees when the
        replicas disagree on the count or one is missing."""
        return selfmetrics.exposition(
            selfmetrics.gauge(
                "mig_exporter_shard_ordinal",
                "The shard this replica serves: the nodes whose name hashes to it.",
                self.ordinal,
            ),
            selfmetrics.gauge(
                "mig_exporter_total_shards", "How many shards the nodes are split into.", self.total
            ),
        )
