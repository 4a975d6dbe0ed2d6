"""Policy: device-plugin requests (static MIG, whole GPUs). Each container gets the devices its
resources ask for, the lowest GPU index and GI id first, as the device plugin hands them out. A
pod that does not fit gets nothing, as the kubelet admits a pod whole or not at all."""

from __future__ import annotations

from status_updater.objects import Obj, mig_profile, names, pod_ref, pod_uid, requests
from status_updater.placement.board import Board, Policy
from status_updater.usage import pod_usage
from topology.errors import TopologyError
from topology.model import AllocatedBy, DeviceStatus, PodUsage
from topology.sharing import GPU_RESOURCE


def applies(board: Board, pod: Obj) -> bool:
    return not board.node.is_dynamic_mig_enabled


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj, uid = pod_ref(pod), pod_uid(pod)
    namespace, pod_name = names(pod)
    taken: list[tuple[int, int, str]] = []  # (gpu index, device index, container)
    whole: list[tuple[int, str, int]] = []  # (container index, container, count)
    for ci, container, resource, count in requests(pod):
        if resource == GPU_RESOURCE and not board.single:
            whole.append((ci, container, count))
        else:
            taken += _mig_picks(board, obj, uid, ci, container, resource, count, taken)
    wanted = sum(n for _, _, n in whole)
    free_gpus = board.free_gpus(uid)
    if wanted > len(free_gpus):
        raise TopologyError(
            obj,
            f"spec.containers[{whole[0][0]}].resources.limits[{GPU_RESOURCE}]",
            f"asks for {wanted} GPUs, node {board.name} has {len(free_gpus)} free",
        )
    usages: dict[str, PodUsage] = {}
    for g, d, container in taken:
        devices = board.migs[g]
        assert devices is not None  # chosen from them
        name = devices[d].name
        if name not in usages:
            usages[name] = pod_usage(pod, obj, board.mig_fb_total(name), warnings)
        holder = AllocatedBy(namespace, pod_name, container)
        board.set_status(g, d, DeviceStatus(holder, {uid: usages[name]}))
    at = 0
    for _, container, count in whole:
        board.hold(pod, obj, AllocatedBy(namespace, pod_name, container), uid, warnings,
                   free_gpus[at : at + count])  # fmt: skip
        at += count


def _mig_picks(
    board: Board,
    obj: str,
    uid: str,
    ci: int,
    container: str,
    resource: str,
    count: int,
    taken: list[tuple[int, int, str]],
) -> list[tuple[int, int, str]]:
    """The MIG devices (GPU, device) one container gets for one resource: of its profile (any,
    for the single strategy's `nvidia.com/gpu`), free, not taken by the pod's other containers."""
    profile = mig_profile(resource)
    held = {(g, d) for g, d, _ in taken}
    mine = {(g, d) for g, d, c in board.kept.get(uid, ()) if c == container}
    free = [
        (dev.gpu_instance_id, g, d)
        for g, devices in enumerate(board.migs)
        for d, dev in enumerate(devices or ())
        if dev.status is None
        and (profile is None or dev.name == profile)
        and (g, d) not in held
        and board.reserved.get((g, d), uid) == uid
    ]
    if len(free) < count:
        raise TopologyError(
            obj,
            f"spec.containers[{ci}].resources.limits[{resource}]",
            f"asks for {count} {profile or 'MIG device'}, node {board.name} has {len(free)} free",
        )
    # What the container held before first, so nothing moves while it lives.
    chosen = sorted(free, key=lambda f: ((f[1], f[2]) not in mine, f[1], f[0]))[:count]
    return [(g, d, container) for _, g, d in chosen]


POLICY = Policy("device-plugin requests", applies, place)
