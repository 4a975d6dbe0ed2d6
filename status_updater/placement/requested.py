"""Policy: device-plugin requests (static MIG, whole GPUs). Each container gets the devices its
resources ask for, in the kubelet's order and with its reuse of the regular init containers'
devices (`kubelet.allocate`), the lowest GPU index and GI id first, as the device plugin hands
them out, of those free (a device a DRA claim holds is not: DRA pods place first). A pod that does
not fit gets nothing, as the kubelet admits a pod whole or not at all, and its warning names the
claims holding what it could have had."""

from __future__ import annotations

from collections.abc import Collection

from status_updater.objects import Ask, Obj, mig_profile, pod_ref, pod_uid, requests
from status_updater.objects import holder as objects_holder
from status_updater.placement.board import Board, Device, Policy
from status_updater.placement.kubelet import Rank, allocate, demand
from status_updater.usage import pod_usage
from topology.errors import TopologyError
from topology.model import DeviceStatus, PodUsage
from topology.sharing import GPU_RESOURCE


def applies(board: Board, pod: Obj) -> bool:
    return not board.node.is_dynamic_mig_enabled


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj, uid = pod_ref(pod), pod_uid(pod)
    asks = requests(pod)
    whole = [a for a in asks if a.resource == GPU_RESOURCE and not board.single]
    free_gpus = board.free_gpus(uid)
    wanted = demand(whole)
    if wanted > len(free_gpus):
        raise TopologyError(
            obj,
            f"{whole[0].field}.resources.limits[{GPU_RESOURCE}]",
            f"asks for {wanted} GPUs, node {board.name} has {len(free_gpus)} free"
            + board.claimed([(g, None) for g, m in enumerate(board.migs) if m is None]),
        )

    def take(ask: Ask, count: int, have: Collection[Device], rank: Rank[Device]) -> list[Device]:
        if ask.resource == GPU_RESOURCE and not board.single:
            free: list[Device] = [(i, None) for i in free_gpus if (i, None) not in have]
            return sorted(free, key=lambda dev: (rank(dev), dev[0]))[:count]
        return _mig_picks(board, obj, uid, ask, count, have, rank)

    kept = {(g, d): c for g, d, c in board.kept.get(uid, ())}
    usages: dict[str, PodUsage] = {}
    gpus: dict[str, list[int]] = {}  # container -> the whole GPUs it holds
    for (g, d), ask in allocate(asks, kept, take).items():
        holder = objects_holder(pod, ask.container)
        if d is None:
            gpus.setdefault(ask.container, []).append(g)
            continue
        devices = board.migs[g]
        assert devices is not None  # chosen from them
        name = devices[d].name
        if name not in usages:
            usages[name] = pod_usage(pod, obj, board.mig_fb_total(name), warnings)
        status = DeviceStatus(allocated_by=holder, pod_gpu_usage_status={uid: usages[name]})
        board.set_status(g, d, status)
    for container, held in gpus.items():
        board.hold(pod, obj, objects_holder(pod, container), uid, warnings, held)


def _mig_picks(
    board: Board,
    obj: str,
    uid: str,
    ask: Ask,
    count: int,
    have: Collection[Device],
    rank: Rank[Device],
) -> list[Device]:
    """`count` new MIG devices (GPU, device) for one container's ask: of its profile (any, for
    the single strategy's `nvidia.com/gpu`), free, not the pod's already."""
    profile = mig_profile(ask.resource)
    free = [
        (dev.gpu_instance_id, g, d)
        for g, devices in enumerate(board.migs)
        for d, dev in enumerate(devices or ())
        if dev.status is None
        and (profile is None or dev.name == profile)
        and (g, d) not in have
        and board.reserved.get((g, d), uid) == uid
    ]
    if len(free) < count:
        raise TopologyError(
            obj,
            f"{ask.field}.resources.limits[{ask.resource}]",
            f"asks for {count} {profile or 'MIG device'}, node {board.name} has {len(free)} free"
            + board.claimed([(g, d) for g, devices in enumerate(board.migs)
                             for d, dev in enumerate(devices or ())
                             if profile is None or dev.name == profile]),
        )  # fmt: skip
    # What the container held before first, so nothing moves while it lives.
    chosen = sorted(free, key=lambda f: (rank((f[1], f[2])), f[1], f[0]))[:count]
    return [(g, d) for _, g, d in chosen]


POLICY = Policy("device-plugin requests", applies, place)
