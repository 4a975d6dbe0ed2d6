"""Policy: whole GPUs on a run:ai dynamic-MIG node, for a pod without a MIG annotation: its
containers' `nvidia.com/gpu` together, the pod's first container named as the holder."""

from __future__ import annotations

from status_updater.objects import (
    Obj,
    first_container,
    names,
    pod_ref,
    pod_uid,
    whole_gpus_requested,
)
from status_updater.placement.board import Board, Policy
from topology.errors import TopologyError
from topology.model import AllocatedBy


def applies(board: Board, pod: Obj) -> bool:
    return board.node.is_dynamic_mig_enabled


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    count = whole_gpus_requested(pod)
    if count == 0:
        return
    obj, uid = pod_ref(pod), pod_uid(pod)
    free = board.free_gpus(uid)
    if len(free) < count:
        raise TopologyError(
            obj,
            "spec.containers[].resources.limits[nvidia.com/gpu]",
            f"asks for {count} GPUs, node {board.name} has {len(free)} free",
        )
    allocated_by = AllocatedBy(*names(pod), first_container(pod))
    board.hold(pod, obj, allocated_by, uid, warnings, free[:count])


POLICY = Policy("whole GPUs", applies, place)
