"""The cluster-wide id rule's pieces: a GPU or MIG id belongs to one node (`state.ClusterState`
keeps the index of who claims which id; these read and mend one node's result)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from topology import runai
from topology.errors import TopologyError
from topology.model import NodeTopology


def device_ids(node: NodeTopology) -> Iterator[tuple[str, str]]:
    """(field, id) of every GPU and named MIG device of a node."""
    for gi, gpu in enumerate(node.gpus):
        yield f"gpus[{gi}].id", gpu.id
        for di, dev in enumerate(gpu.mig_devices or ()):
            if dev.id is not None:
                yield f"gpus[{gi}].mig-devices[{di}].id", dev.id


def without_id(node: NodeTopology, uid: str) -> NodeTopology:
    """The node with MIG id `uid` taken off the device that claims it (everything else kept)."""
    gpus = tuple(
        g
        if not any(d.id == uid for d in g.mig_devices or ())
        else replace(
            g,
            mig_devices=tuple(
                replace(d, id=None) if d.id == uid else d for d in g.mig_devices or ()
            ),
        )
        for g in node.gpus
    )
    return replace(node, gpus=gpus)


def claim_ignored(node: NodeTopology, uid: str, owner: str) -> TopologyError:
    """The warning for a pod whose annotation named another node's device id."""
    holder = next(
        (d.status.allocated_by for g in node.gpus for d in g.mig_devices or ()
         if d.id == uid and d.status is not None and d.status.allocated_by is not None),
        None,
    )  # fmt: skip
    obj = f"pod {holder.namespace}/{holder.pod}" if holder else "pod ?"
    return TopologyError(
        obj,
        f"metadata.annotations[{runai.ANNOTATION_POD_MIG_DEVICE}].deviceUUID",
        f"{uid} is a device of node {owner}: the claim is ignored",
    )


def id_set(node: NodeTopology) -> frozenset[str]:
    ids = {gpu.id for gpu in node.gpus}
    ids.update(d.id for gpu in node.gpus for d in gpu.mig_devices or () if d.id is not None)
    return frozenset(ids)
