"""Policy: DRA. A pod's devices are those its claims were allocated (the scheduler chose them
against the node's ResourceSlices); each container using a claim is one `dra-claims` entry on
the device it names, as dcgm-exporter's DRA mode labels it.

`gpu-<minor>` is the whole GPU; on a GPU whose MIG mode toggles without a reset (Hopper and
newer), with MIG on and no instance, the driver turns MIG off to hand it out whole. A static MIG
device is the instance at its placement. Under DynamicMIG the device is a partition: the driver
creates its instance when the claim is prepared (turning MIG on where it toggles), so it is
added here, with the GI id the catalog's rule gives that placement and a `MIG-` id stable for
node, GPU and GI (and it goes with the claim). A device that is not on the node, a partition
where the driver has no DynamicMIG (it publishes none), a partition over an instance that
exists, or a device another claim holds (the scheduler gives a device to one claim: the pod
placed first keeps it), is the pod's error: it holds nothing.

DRA pods place before every other pod (`place_pods`): what the scheduler allocated is the
device's holder, and the device plugin's and run:ai's pods take what is left.
"""

from __future__ import annotations

from dataclasses import replace

from status_updater.devices import mig_uuid
from status_updater.objects import DRA_REFS, Obj, pod_ref, pod_uid
from status_updater.objects import holder as objects_holder
from status_updater.placement.board import Board, Policy
from status_updater.usage import pod_usage
from topology import dra
from topology.errors import TopologyError
from topology.model import DeviceStatus, DraClaim, MigDevice


def _holds(board: Board, pod: Obj) -> list[dict[str, str]]:
    """What the pod's claims hold on this node's pool."""
    return [h for h in board.holds.get(pod_uid(pod), ()) if h.get("pool") == board.name]


def applies(board: Board, pod: Obj) -> bool:
    """The pod's claims hold devices here, or its `nvidia.com/gpu` is served through DRA (its
    extended-resource claim): then it holds what that claim holds, never by its limits."""
    refs = pod.get(DRA_REFS)
    extended = isinstance(refs, list) and any(r.get("extended") for r in refs)
    return extended or bool(_holds(board, pod))


# A GPU, and its MIG device: None (the whole GPU), an index, or one to make.
Target = tuple[int, int | MigDevice | None]


def _target(
    board: Board,
    name: str,
    made: list[tuple[int, MigDevice]],
    whole: set[int],
    obj: str,
    field: str,
) -> Target:
    """The board's device the driver's name stands for: (GPU, None) for the whole GPU, (GPU,
    index) for an instance, (GPU, MigDevice) for a partition whose instance is to be made
    (`made`: those made for the pod so far; `whole`: the GPUs it was given whole so far)."""
    parsed = dra.parse_device(name, board.model)
    if parsed is None or parsed.minor >= len(board.gpus):
        raise TopologyError(obj, field, f"device {name} is not on node {board.name}: not placed")
    g = parsed.minor
    devices = board.migs[g]
    toggles = board.model is not None and board.model.mig_toggles_without_reset
    if parsed.profile is None:
        if devices is not None and (devices or not toggles or any(mg == g for mg, _ in made)):
            raise TopologyError(obj, field, f"device {name}: GPU {g} has MIG on: not placed")
        whole.add(g)
        return g, None
    if devices is None and board.dynamic and toggles and g not in whole:
        devices = []  # the driver turns MIG on to make the instance
    if devices is None or g in whole:
        why = "is handed out whole" if g in whole else "has MIG off"
        raise TopologyError(obj, field, f"device {name}: GPU {g} {why}: not placed")
    profile, start = parsed.profile, parsed.start
    assert start is not None and board.model is not None  # parse_device found both
    for d, dev in enumerate(devices):
        if dev.position == start and dev.name == profile.name:
            return g, d
    for mg, dev in made:
        if mg == g and dev.position == start and dev.name == profile.name:
            return g, dev
    if not board.dynamic:
        raise TopologyError(
            obj, field, f"device {name} is no MIG device of GPU {g}, and partitions are made "
            "only under the DRA driver's DynamicMIG (--dra-dynamic-mig): not placed",
        )  # fmt: skip
    taken = set(range(start, start + profile.memory_slices))
    for dev in [*devices, *(m for mg, m in made if mg == g)]:
        held = board.model.profile(dev.name)
        size = held.memory_slices if held else 1
        if taken & set(range(dev.position, dev.position + size)):
            raise TopologyError(
                obj, field, f"device {name} overlaps instance {dev.name}@{dev.position}: not placed"
            )
    gi = board.model.gpu_instance_id(profile, start)
    new = MigDevice(
        name=profile.name, position=start, gpu_instance_id=gi, id=mig_uuid(board.name, g, gi)
    )
    made.append((g, new))
    return g, new


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj, uid = pod_ref(pod), pod_uid(pod)
    made: list[tuple[int, MigDevice]] = []
    whole: set[int] = set()
    found: list[tuple[Target, DraClaim]] = []
    for h in _holds(board, pod):  # every device first: a pod that does not fit holds nothing
        field = f"claims[{h['claim-namespace']}/{h['claim']}]"
        holder = objects_holder(pod, h["container"])
        target = _target(board, h["device"], made, whole, obj, field)
        g, d = target
        other = None if isinstance(d, MigDevice) else board.claim_on(g, d)
        if other is not None and (other.claim_namespace, other.claim) != (
            h["claim-namespace"],
            h["claim"],
        ):  # one device, one claim: the first placed (it held it before, or is older) keeps it
            raise TopologyError(obj, field, f"device {h['device']} is held by DRA claim "
                                f"{other.claim_namespace}/{other.claim} (pod "
                                f"{other.holder.namespace}/{other.holder.pod}): not placed")  # fmt: skip
        claim = DraClaim(holder, h["claim"], h["claim-namespace"], h["device"], h["pool"],
                         isinstance(target[1], MigDevice))  # fmt: skip
        found.append((target, claim))
    for g in whole:
        board.migs[g] = None  # handed out whole: MIG off, if it was on without instances
    made_at: dict[tuple[int, int], int] = {}  # (GPU, start) of a made instance -> its index
    for g, dev in made:
        devices = board.migs[g]
        if devices is None:  # MIG turned on for it
            devices = board.migs[g] = []
        devices.append(dev)
        made_at[g, dev.position] = len(devices) - 1
    claims: dict[tuple[int, int | None], list[DraClaim]] = {}
    for (g, d), claim in found:
        key = (g, made_at[g, d.position] if isinstance(d, MigDevice) else d)
        claims.setdefault(key, []).append(claim)
    for (g, d), held in claims.items():
        status = board.status(g, d)
        usage = dict(status.pod_gpu_usage_status) if status else {}
        usage[uid] = pod_usage(pod, obj, board.fb_total(g, d), warnings)
        before = status.dra_claims if status else ()
        claims_now = (*before, *held)
        board.set_status(
            g, d,
            DeviceStatus(pod_gpu_usage_status=usage, dra_claims=claims_now) if status is None
            else replace(status, pod_gpu_usage_status=usage, dra_claims=claims_now),
        )  # fmt: skip


POLICY = Policy("DRA claims", applies, place)
