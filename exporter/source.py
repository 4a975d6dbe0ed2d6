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

    Raises TopologyError when the node's entry is not something a real GPU could be.
    """
    found = topology.nodes.get(node)
    if found is None:
        return None
    errors = node_errors(node, found)
    errors += [e for e in duplicate_id_errors(topology) if e.obj == f"node {node}"]
    if errors:
        raise TopologyError(obj, errors[0].field, f"{errors[0].obj}: {errors[0].message}")
    return found
