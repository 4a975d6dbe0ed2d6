"""Pure reconcile: one node's Node and Pods -> that node's topology.

`reconcile_node` is the whole of it: the node's devices from its labels and annotations
(`devices.build_node`), then its pods placed on them by the placement policies
(`placement.place_pods`). `render`, the live controller (through `state.ClusterState`, which
keeps it incremental) and the tests run exactly this code. Nothing here does I/O; every problem
in one object is returned as a TopologyError naming it, and the other objects are still placed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from status_updater.claims import PodHolds
from status_updater.devices import build_node
from status_updater.dra import DYNAMIC, SHARES, shares_count
from status_updater.objects import Obj, is_single_strategy, node_name
from status_updater.placement import place_pods
from topology import migparted
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology

Built = tuple[NodeTopology, Sequence[TopologyError]]  # a node's devices, and what was said


def reconcile_node(
    node: Obj,
    pods: Iterable[Obj],
    layouts: migparted.Layouts | None = None,
    previous: NodeTopology | None = None,
    *,
    built: Built | None = None,
    holds: PodHolds | None = None,
) -> tuple[NodeTopology, list[TopologyError]]:
    """The node's topology with its pods placed, and the problems found on the way.

    Raises TopologyError if the node itself is unusable. `previous` is the node's last result:
    its pods keep what they held there. `built` is `build_node`'s answer for this Node, where
    the caller kept it (ClusterState builds a node again only when its Node changes). `holds`:
    the devices the pods' DRA claims hold, by pod uid, as the caller joined them from the claims.
    """
    warnings: list[TopologyError] = []
    if built is None:
        devices = build_node(node, layouts, warnings)
    else:
        devices, found = built
        warnings += found
    single = is_single_strategy(node)
    dynamic = bool(node.get(DYNAMIC))
    shares = shares_count(str(node.get(SHARES) or ""))
    result = place_pods(
        node_name(node), devices, pods, warnings, single, previous, dynamic, holds or {}, shares
    )
    return result, warnings


def document(name: str, node: NodeTopology, strategy: str | None) -> Topology:
    """The `topology.yml` of one node: the cluster schema with just this node under `nodes:`."""
    return Topology(mig_strategy=strategy or "none", nodes={name: node})
