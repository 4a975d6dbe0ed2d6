"""Policy: whole GPUs on a run:ai dynamic-MIG node, for a pod without a MIG annotation: its
containers' `nvidia.com/gpu`, each container's held by it, in the kubelet's order and with its
reuse of the regular init containers' GPUs (`kubelet.allocate`)."""

from __future__ import annotations

from collections.abc import Collection

from status_updater.objects import Ask, Obj, pod_ref, pod_uid, requests
from status_updater.objects import holder as objects_holder
from status_updater.placement.board import Board, Device, Policy
from status_updater.placement.kubelet import Rank, allocate, demand
from topology.errors import TopologyError
from topology.sharing import GPU_RESOURCE, base_resource


def applies(board: Board, pod: Obj) -> bool:
    return board.node.is_dynamic_mig_enabled


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    asks = [a for a in requests(pod) if base_resource(a.resource) == GPU_RESOURCE]
    count = demand(asks)
    if count == 0:
        return
    obj, uid = pod_ref(pod), pod_uid(pod)
    free = board.free_gpus(uid)
    if len(free) < count:
        raise TopologyError(
            obj,
            "spec.containers[].resources.limits[nvidia.com/gpu]",
            f"asks for {count} GPUs, node {board.name} has {len(free)} free"
            + board.claimed([(g, None) for g, m in enumerate(board.migs) if m is None]),
        )

    def take(_ask: Ask, n: int, have: Collection[Device], rank: Rank[Device]) -> list[Device]:
        left: list[Device] = [(i, None) for i in free if (i, None) not in have]
        return sorted(left, key=lambda dev: (rank(dev), dev[0]))[:n]

    kept: dict[Device, str] = {(g, d): c for g, d, c in board.kept.get(uid, ()) if d is None}
    held: dict[str, list[int]] = {}
    for (g, _), ask in allocate(asks, kept, take).items():
        held.setdefault(ask.container, []).append(g)
    for container, gpus in held.items():
        board.hold(pod, obj, objects_holder(pod, container), uid, warnings, gpus)


POLICY = Policy("whole GPUs", applies, place)
