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

Under the driver's ConsumableShares the scheduler allocates one device to several claims, each
allocation with a share id and the memory it consumed: every holder is on the device, and uses
90 % of what it consumed by default (of its shares' part of the device, or of the device over the
allocations sharing it, where it consumed none: the driver isolates no memory). A share that
would take the shares' memory past what the device published, or a share of a device a claim
holds alone (or the reverse), is the pod's error too.

DRA pods place before every other pod (`place_pods`): what the scheduler allocated is the
device's holder, and the device plugin's and run:ai's pods take what is left.
"""

from __future__ import annotations

from dataclasses import replace

from status_updater.devices import mig_uuid
from status_updater.objects import DRA_REFS, Obj, pod_ref, pod_uid
from status_updater.objects import holder as objects_holder
from status_updater.placement.board import Board, Policy
from status_updater.resourceslices import device_memory
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


def _same(a: Target, b: Target) -> bool:
    """Whether two targets are one device (an instance to make is the same object)."""
    if isinstance(a[1], MigDevice) or isinstance(b[1], MigDevice):
        return a[1] is b[1]
    return a == b


def _claim(h: dict[str, str], pod: Obj, made: bool) -> DraClaim:
    """The entry's claim on its device; what it consumed only where it is a share (an allocation
    without a share id holds the device alone, whatever it says it consumed)."""
    consumed = h.get("consumed-memory") if h.get("share-id") else None
    return DraClaim(
        objects_holder(pod, h["container"]), h["claim"], h["claim-namespace"], h["device"],
        h["pool"], made, share_id=h.get("share-id", ""),
        consumed_memory=None if consumed is None else int(consumed),
    )  # fmt: skip


def _share(c: DraClaim) -> tuple[str, str, str]:
    """One allocation, whichever of its pod's containers uses it."""
    return c.claim_namespace, c.claim, c.share_id


def _joins(
    board: Board, target: Target, claim: DraClaim, held: list[DraClaim], obj: str, field: str
) -> None:
    """Whether `claim` may hold the device beside the claims that hold it (`held`): one claim
    alone, or allocations with a share id each (ConsumableShares) whose consumed memory
    together does not pass what the device published. TopologyError where not."""
    key = (claim.claim_namespace, claim.claim)
    # Other allocations: another claim's, or another share of this claim's (a claim's two
    # requests may each be given a share of one device). The same claim seen again (another
    # pod it is reserved for, another container) is its own.
    others = [c for c in held if (c.claim_namespace, c.claim) != key
              or (c.share_id and claim.share_id and c.share_id != claim.share_id)]  # fmt: skip
    if not claim.share_id:
        other = next(iter(others), None)
        if other is not None:  # one device, one claim: the first placed (it held it, or is older)
            how = " (a share of it: ConsumableShares), and this allocation has no shareID" if (
                other.share_id) else ""  # fmt: skip
            raise TopologyError(obj, field, f"device {claim.device} is held by DRA claim "
                                f"{other.claim_namespace}/{other.claim} (pod "
                                f"{other.holder.namespace}/{other.holder.pod}){how}: not placed")  # fmt: skip
        return
    alone = next((c for c in others if not c.share_id), None)
    if alone is not None:
        raise TopologyError(obj, field, f"device {claim.device} is held by DRA claim "
                            f"{alone.claim_namespace}/{alone.claim} (pod {alone.holder.namespace}/"
                            f"{alone.holder.pod}) alone, without a shareID: a share of it is "
                            "not placed")  # fmt: skip
    g, d = target
    profile = d.name if isinstance(d, MigDevice) else None
    if d is not None and not isinstance(d, MigDevice):
        devices = board.migs[g]
        assert devices is not None  # _target found the instance
        profile = devices[d].name
    most = device_memory(board.node, g, profile, board.dynamic)
    used = sum({_share(c): c.consumed_memory or 0 for c in others}.values())
    mine = claim.consumed_memory or 0
    if used + mine > most:
        raise TopologyError(obj, field, f"device {claim.device}: its share consumes {mine} MiB "
                            f"of memory, and the claims sharing it {used} MiB of its {most}: "
                            "not placed")  # fmt: skip


def share_mib(
    fb_total: int, mine: list[dict[str, str]], sharing: int, shares: int | None
) -> int | None:
    """The MiB a pod's default use is 90 % of on a device it shares through its allocations
    `mine` (holds entries with a share id; `sharing`: how many allocations share the device, as
    the scheduler made them): what they consumed of the device's memory, else its `shares` of
    N (`shares`), else the device's memory over the allocations sharing it; at most `fb_total`.
    None: the device is not shared."""
    if not mine:
        return None
    memory = sum(int(h.get("consumed-memory") or 0) for h in mine)
    if memory > 0:
        return min(memory, fb_total)
    count = sum(int(h.get("consumed-shares") or 0) for h in mine)
    if shares is not None and count > 0:
        return min(fb_total * count // shares, fb_total)
    return fb_total * len(mine) // max(sharing, len(mine))


def _sharing(board: Board, device: str) -> int:
    """How many allocations share `device` of this node's pool, of every pod's claims: as the
    scheduler made them, whichever pods are placed."""
    return len({(h["claim-namespace"], h["claim"], h["share-id"])
                for held in board.holds.values() for h in held
                if h.get("share-id") and h.get("pool") == board.name and h["device"] == device})  # fmt: skip


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj, uid = pod_ref(pod), pod_uid(pod)
    made: list[tuple[int, MigDevice]] = []
    whole: set[int] = set()
    found: list[tuple[Target, DraClaim, dict[str, str]]] = []
    for h in _holds(board, pod):  # every device first: a pod that does not fit holds nothing
        field = f"claims[{h['claim-namespace']}/{h['claim']}]"
        if problem := h.get("problem"):
            raise TopologyError(obj, field, f"{problem}: not placed")
        target = _target(board, h["device"], made, whole, obj, field)
        g, d = target
        claim = _claim(h, pod, isinstance(d, MigDevice))
        held = [c for t, c, _ in found if _same(t, target)]  # this pod's, so far
        if not isinstance(d, MigDevice):
            status = board.status(g, d)
            held = [*(status.dra_claims if status else ()), *held]
        _joins(board, target, claim, held, obj, field)
        found.append((target, claim, h))
    for g in whole:
        board.migs[g] = None  # handed out whole: MIG off, if it was on without instances
    made_at: dict[tuple[int, int], int] = {}  # (GPU, start) of a made instance -> its index
    for g, dev in made:
        devices = board.migs[g]
        if devices is None:  # MIG turned on for it
            devices = board.migs[g] = []
        devices.append(dev)
        made_at[g, dev.position] = len(devices) - 1
    claims: dict[tuple[int, int | None], list[tuple[DraClaim, dict[str, str]]]] = {}
    for (g, d), claim, h in found:
        key = (g, made_at[g, d.position] if isinstance(d, MigDevice) else d)
        claims.setdefault(key, []).append((claim, h))
    for (g, d), entries in claims.items():
        status = board.status(g, d)
        usage = dict(status.pod_gpu_usage_status) if status else {}
        fb_total = board.fb_total(g, d)
        # Its allocations of the device, once each whichever containers use them.
        mine = list({_share(c): h for c, h in entries if c.share_id}.values())
        device = entries[0][0].device
        share = share_mib(fb_total, mine, _sharing(board, device), board.shares)
        usage[uid] = pod_usage(pod, obj, fb_total, warnings, share)
        before = status.dra_claims if status else ()
        claims_now = (*before, *(c for c, _ in entries))
        board.set_status(
            g, d,
            DeviceStatus(pod_gpu_usage_status=usage, dra_claims=claims_now) if status is None
            else replace(status, pod_gpu_usage_status=usage, dra_claims=claims_now),
        )  # fmt: skip


POLICY = Policy("DRA claims", applies, place)
