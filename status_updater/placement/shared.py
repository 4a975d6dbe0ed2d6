"""Policy: replicas of shared devices (time-slicing, MPS), as the device plugin's `distributed`
policy hands them out, container by container: one at a time, on the device with the fewest
replicas taken (the pod's earlier containers' included), preferring devices not yet picked for
this container, then the lowest GPU index and GI id; there, the lowest free replica. A pod keeps
the replicas it held. A pod that does not fit gets nothing."""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import replace

from status_updater.objects import Ask, Obj, mig_profile, pod_ref, pod_uid, requests
from status_updater.objects import holder as objects_holder
from status_updater.placement.board import Board, Device, Policy
from status_updater.placement.kubelet import NOT_KEPT, Rank, allocate
from status_updater.usage import pod_usage
from topology.errors import TopologyError
from topology.model import DeviceStatus, PodUsage, Replica
from topology.sharing import base_resource

Pick = tuple[int, int | None, int]  # (GPU, MIG device or None, replica)


def applies(board: Board, pod: Obj) -> bool:
    return board.node.sharing is not None


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj, uid = pod_ref(pod), pod_uid(pod)
    kept = {(g, d, r): c for g, d, r, c in board.kept_replicas.get(uid, ())}

    def take(ask: Ask, count: int, have: Collection[Pick], rank: Rank[Pick]) -> list[Pick]:
        return _container_picks(board, obj, uid, ask, count, set(have), rank)

    usages: dict[Device, PodUsage] = {}
    for (g, d, r), ask in allocate(requests(pod), kept, take).items():
        holder = objects_holder(pod, ask.container)
        # The replica's pod_uid says whose it is; its holder names the container only.
        board.replicas.setdefault((g, d), {})[r] = Replica(r, replace(holder, uid=""), uid)
        if (g, d) not in usages:
            most, share = _replica_memory(board, g, d)
            usages[g, d] = pod_usage(pod, obj, most, warnings, share)
    for g, d in usages:
        _set_shared_status(board, g, d, uid, usages[g, d])


def _container_picks(
    board: Board,
    obj: str,
    uid: str,
    ask: Ask,
    count: int,
    taken: set[Pick],
    rank: Rank[Pick],
) -> list[Pick]:
    """`count` new replicas for one container's ask: those its pod kept that it should have
    (`rank`), then the policy's picks; `taken`: the pod's already (its earlier containers')."""
    assert board.node.sharing is not None
    per_device = board.node.sharing.replicas

    def free(g: int, d: int | None, r: int) -> bool:
        return (
            r not in board.replicas.get((g, d), {})
            and (g, d, r) not in taken
            and board.reserved_replicas.get((g, d, r), uid) == uid
        )

    resource = base_resource(ask.resource)
    profile = mig_profile(resource)
    offered = _shared_devices(board, profile)
    devices = [dev for dev in offered if board.claim_on(*dev) is None]  # a DRA claim's: not shared
    known = set(devices)
    mine = sorted((p for g, d, r, _ in board.kept_replicas.get(uid, ())
                   if rank(p := (g, d, r)) < NOT_KEPT and (g, d) in known and free(g, d, r)),
                  key=rank)  # fmt: skip
    chosen: list[Pick] = mine[:count]
    held = set(chosen)
    # Per device, the replicas still free for this container, lowest first: built once and
    # taken from the front, as each pick takes a device's lowest. (Looking for it again on
    # every device at every pick made a large request cubic in the replicas.)
    open_replicas = {
        (g, d): deque(r for r in range(per_device) if free(g, d, r) and (g, d, r) not in held)
        for g, d in devices
    }
    # This container's replicas per device; with those taken before (by other pods and this
    # pod's earlier containers: the kubelet allocates containers in turn), the load.
    picked = Counter((g, d) for g, d, _ in chosen)
    before = Counter((g, d) for g, d, _ in taken)
    load = {dev: len(board.replicas.get(dev, {})) + before[dev] for dev in devices}
    # The devices by what the next pick prefers; only the picked one's place changes.
    ranked = [(load[v] + picked[v], picked[v], _order(board, v), v)
              for v in devices if open_replicas[v]]  # fmt: skip
    heapq.heapify(ranked)
    for _ in range(count - len(chosen)):
        if not ranked:
            free_count = sum(1 for dev in devices for r in range(per_device) if free(*dev, r))
            field = f"{ask.field}.resources.limits[{resource}]"
            what = f"{count} {profile or 'GPU'} replicas"
            raise TopologyError(
                obj,
                field,
                f"asks for {what}, node {board.name} has {free_count} free"
                + board.claimed(offered),
            )
        *_, dev = heapq.heappop(ranked)
        chosen.append((*dev, open_replicas[dev].popleft()))
        picked[dev] += 1
        if open_replicas[dev]:
            heapq.heappush(ranked, (load[dev] + picked[dev], picked[dev], _order(board, dev), dev))
    return chosen


def _shared_devices(board: Board, profile: str | None) -> list[Device]:
    """The devices a shared resource's replicas come from: whole GPUs for `nvidia.com/gpu`
    (the MIG instances under GFD's single strategy), or the MIG instances of `profile`."""
    if profile is None and not board.single:
        return [(g, None) for g in range(len(board.gpus)) if board.migs[g] is None]
    return [(g, d) for g, devices in enumerate(board.migs) for d, dev in enumerate(devices or ())
            if profile is None or dev.name == profile]  # fmt: skip


def _order(board: Board, dev: Device) -> tuple[int, int]:
    g, d = dev
    devices = board.migs[g]
    return (g, -1 if d is None or devices is None else devices[d].gpu_instance_id)


def _replica_memory(board: Board, g: int, d: int | None) -> tuple[int, int]:
    """(the most one pod may use, its fair share) of the device in MiB: all of it under
    time-slicing (memory is not isolated), total / replicas under MPS (the control daemon's
    pinned memory limit); the share is total / replicas either way."""
    sharing = board.node.sharing
    assert sharing is not None
    total = board.fb_total(g, d)
    share = total // sharing.replicas
    return (share if sharing.strategy == "mps" else total), share


def _set_shared_status(board: Board, g: int, d: int | None, uid: str, usage: PodUsage) -> None:
    """The device's status from its replicas: every holder's usage, and as `allocated-by`
    (the pod dcgm-exporter's default mode names) the pod it named before, while that pod
    holds a replica there; else the pod placed on it first: pods that held replicas place
    first, oldest first, so it is the pod that has shared it longest. (Not simply the first
    placed: a pod that kept its replica and an older newcomer place in the other order on
    the next pass, and the name would move.)"""
    replicas = tuple(sorted(board.replicas[g, d].values(), key=lambda r: r.index))
    old = board.status(g, d)
    usages = {**(old.pod_gpu_usage_status if old else {}), uid: usage}
    named = board.named.get((g, d))
    if named is None or all(r.holder != named for r in replicas):
        first = old.allocated_by if old is not None else None
        named = first or next(r.holder for r in replicas if r.pod_uid == uid)
    status = (
        DeviceStatus(allocated_by=named, pod_gpu_usage_status=usages, replicas=replicas)
        if old is None
        else replace(old, allocated_by=named, pod_gpu_usage_status=usages, replicas=replicas)
    )
    board.set_status(g, d, status)


POLICY = Policy("shared replicas", applies, place)
