"""Which part of a topology an exporter serves, checked against the MIG catalog."""

from __future__ import annotations

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
