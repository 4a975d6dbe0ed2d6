"""One node's entry in a topology document: found, checked against the MIG catalog, followed.

`node_of` is how every exporter reads a node out of a document; `OneNode` is how the two that
serve one node (the node's own exporter, and `--source nvml` naming pods) take documents in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from exporter.health import Health
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology
from topology.validate import duplicate_id_errors, node_errors


def missing_node(topology: Topology, node: str, obj: str) -> TopologyError:
    known = ", ".join(sorted(topology.nodes)[:10]) or "none"
    more = f" and {len(topology.nodes) - 10} more" if len(topology.nodes) > 10 else ""
    return TopologyError(obj, f"nodes.{node}", f"is not in the topology (nodes: {known}{more})")


def node_of(topology: Topology, node: str, obj: str) -> NodeTopology | None:
    """This exporter's node (None if absent), checked against the MIG catalog.

    Raises TopologyError when the node's entry is not something a real GPU could be. Only this
    node is judged: another node's bad entry in the same document is that node's problem.
    """
    bad = topology.invalid.get(node)
    if bad is not None:
        raise TopologyError(obj, bad.field, bad.message)
    found = topology.nodes.get(node)
    if found is None:
        return None
    errors = node_errors(node, found)
    errors += duplicate_id_errors(Topology(nodes={node: found}))
    if errors:
        raise TopologyError(obj, f"nodes.{node}.{errors[0].field}", errors[0].message)
    return found


KEY = "topology"  # the one problem key of a one-node sink, whatever the problem


class OneNode:
    """The sink of an exporter that serves one node (the node's own exporter, and `--source nvml`
    naming pods): whole documents (a file, the single layout's ConfigMap, the node's own
    ConfigMap) and the problems of getting them, handed to `take` and to the exporter's health.

    A document that is invalid, or whose entry for the node is, or that lacks the node, never
    replaces the last good node: its problem is reported under one key (`KEY`), whatever it is,
    so the node's next good entry clears it. An invalid input is counted once until a good one.
    `keeps`: what is kept meanwhile, each problem's last words; `good_again`: what is logged when
    the node's entry is good after a problem.
    """

    def __init__(
        self, node_name: str, health: Health, wake: threading.Event,
        take: Callable[[NodeTopology], None], *, keeps: str, good_again: str,
    ) -> None:  # fmt: skip
        self.node_name, self.health, self.wake, self.take = node_name, health, wake, take
        self.keeps, self.good_again = keeps, good_again

    def update(self, topology: Topology, source: str) -> None:
        try:
            node = node_of(topology, self.node_name, source)
        except TopologyError as e:
            self.health.count(KEY, TopologyError(f"node {self.node_name}", e.field, e.message))
            self.health.set(KEY, f"{e}; {self.keeps}")
        else:
            if node is None:
                # Never a state a real node is in for long (a re-applied seed, a relabelled node):
                # keep what was served, and say why.
                reason = missing_node(topology, self.node_name, source)
                self.health.set(KEY, f"{reason}; {self.keeps}")
            else:
                self.take(node)
                self.health.uncount(KEY)  # good again: its next problem is news
                self.health.clear(KEY, self.good_again)
        self.wake.set()

    def owns(self, node: str) -> bool:
        """Every node of a document is read: when this one is missing, the others say which
        nodes are there."""
        return True

    def rejected(self, source: str, e: TopologyError) -> None:
        """The source's content is invalid: keep serving, report unhealthy, count it once."""
        self.health.count(KEY, e)
        self.problem(f"{e}; {self.keeps}")

    def problem(self, reason: str) -> None:
        """The source is unusable (missing, invalid, unreachable): keep serving, say why."""
        self.health.set(KEY, reason)
        self.wake.set()
