"""What pods held in a node's last result, so that nothing a pod holds moves while it lives.

The last result is the node's previous placement, or after a restart what the updater wrote
before. A device is the same one if the node still has it: the same whole GPU, or a MIG device of
the same profile with the same GPU instance id.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from topology.model import AllocatedBy, DeviceStatus, NodeTopology

# pod uid -> (GPU index, MIG device index or None for the whole GPU, container) it held
Kept = Mapping[str, tuple[tuple[int, int | None, str], ...]]
# pod uid -> (GPU index, MIG device index or None, replica, container) it held on shared devices
KeptReplicas = Mapping[str, tuple[tuple[int, int | None, int, str], ...]]


def _kept_statuses(
    node: NodeTopology, previous: NodeTopology | None
) -> Iterator[tuple[int, int | None, DeviceStatus]]:
    """(GPU index, MIG device index in `node` or None, status in `previous`) of each device that
    had a status in `previous` and that `node` still has: the same whole GPU, or a MIG device of
    the same profile with the same GPU instance id."""
    if previous is None:
        return
    for g, (now, before) in enumerate(zip(node.gpus, previous.gpus, strict=False)):
        if now.mig_devices is None and before.mig_devices is None and before.status is not None:
            yield g, None, before.status
        index = {(d.gpu_instance_id, d.name): i for i, d in enumerate(now.mig_devices or ())}
        for dev in before.mig_devices or ():
            d = index.get((dev.gpu_instance_id, dev.name))
            if d is not None and dev.status is not None:
                yield g, d, dev.status


def held_devices(node: NodeTopology, previous: NodeTopology | None) -> Kept:
    """What each pod held in `previous` (the node's last result, or what the updater wrote
    before a restart) that `node`'s devices still have."""
    kept: dict[str, list[tuple[int, int | None, str]]] = {}
    for g, d, status in _kept_statuses(node, previous):
        holder = status.allocated_by
        # A KAI fraction pod holds no device of its own: it shares its reservation pod's.
        sharing = {f.holder.uid for f in status.fractions}
        for uid in status.pod_gpu_usage_status:
            if uid in sharing:
                continue
            kept.setdefault(uid, []).append((g, d, holder.container if holder else ""))
    return {uid: tuple(held) for uid, held in kept.items()}


def held_replicas(node: NodeTopology, previous: NodeTopology | None) -> KeptReplicas:
    """The replicas each pod held in `previous` on devices `node` still has (as held_devices)."""
    if previous is None or node.sharing is None or previous.sharing is None:
        return {}
    kept: dict[str, list[tuple[int, int | None, int, str]]] = {}
    for g, d, status in _kept_statuses(node, previous):
        for r in status.replicas:
            kept.setdefault(r.pod_uid, []).append((g, d, r.index, r.holder.container))
    limit = node.sharing.replicas  # fewer replicas now: those past the count are gone
    return {uid: tuple(h for h in held if h[2] < limit) for uid, held in kept.items()}


def named_holders(
    node: NodeTopology, previous: NodeTopology | None
) -> dict[tuple[int, int | None], AllocatedBy]:
    """The pod each shared device that `node` still has named in `previous`: it stays named for
    as long as it holds a replica there."""
    if previous is None or node.sharing is None or previous.sharing is None:
        return {}
    return {
        (g, d): status.allocated_by
        for g, d, status in _kept_statuses(node, previous)
        if status.replicas and status.allocated_by is not None
    }


def dra_holders(previous: NodeTopology | None) -> frozenset[str]:
    """The pods that held a device through DRA claims in `previous`. A partition's instance was
    made for its claim, so the node's devices (`held_devices`) never have it: these pods place
    first all the same, and a claim allocated later over the same memory never takes it."""
    if previous is None:
        return frozenset()
    statuses = [
        status
        for gpu in previous.gpus
        for status in (gpu.status, *(d.status for d in gpu.mig_devices or ()))
        if status is not None and status.dra_claims
    ]
    return frozenset(uid for status in statuses for uid in status.pod_gpu_usage_status)
