"""Which pod containers hold which DRA devices: ResourceClaims joined to the pods using them.

A claim allocated by the scheduler names its devices in `status.allocation.devices.results`
(`driver`, `pool`, `device`, and the `request` each answers) and the pods it is reserved for in
`status.reservedFor`. A pod names its claims in `spec.resourceClaims`, and a container uses one
through `resources.claims` (`objects.claim_refs`): an app container, a sidecar or an init
container. Only devices of the NVIDIA driver
(`gpu.nvidia.com`) count. On a device several claims share (the driver's ConsumableShares), each
allocation also carries its `shareID` and `consumedCapacity`.

Claims and pods arrive apart (two watches, or two sets of files): each is read on its own, and
the state joins them when it places a node's pods (`holds`), one entry per (container, device),
which the `dra` placement policy puts on the node's devices. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mig_exporter.common.quantity import mib, parse
from status_updater.objects import DRA_REFS, Obj, metadata, names, pod_uid, strings
from topology import dra


@dataclass(frozen=True)
class Allocation:
    """One device a claim was allocated: the request it answers, its pool and device name; on a
    device several claims may share (the driver's ConsumableShares), this allocation's
    `shareID` and what it consumed of the device's `memory` (MiB, rounded down) and `shares`."""

    request: str
    pool: str
    device: str
    share_id: str = ""
    consumed_memory: int | None = None
    consumed_shares: int | None = None
    problem: str = ""  # what could not be read of it (a bad quantity): the claim's, said once


def _consumed(result: Mapping[str, Any], index: int) -> dict[str, Any]:
    """`shareID` and `consumedCapacity`'s memory and shares of allocation result `index`, as
    Allocation's keywords; a value that is no quantity is the allocation's `problem`."""
    found: dict[str, Any] = {}
    if isinstance(share := result.get("shareID"), str) and share:
        found["share_id"] = share
    consumed = result.get("consumedCapacity")
    if not isinstance(consumed, Mapping):
        return found
    for name, key in (("memory", "consumed_memory"), ("shares", "consumed_shares")):
        if name not in consumed:
            continue
        try:
            found[key] = mib(consumed[name]) if name == "memory" else _count(consumed[name])
        except ValueError as e:
            at = f"status.allocation.devices.results[{index}].consumedCapacity.{name}"
            found["problem"] = f"{at}: {e}"
            return found
    return found


def _count(text: object) -> int:
    """A count of shares: a whole quantity of at least 0."""
    value = parse(text)
    if value < 0 or value != int(value):
        raise ValueError(f"expected a whole number of shares of at least 0, got {text!r}")
    return int(value)


ClaimKey = tuple[str, str]  # (namespace, name)
# A device a claim's `status.devices` names: (pool, device, uuid, shareID or "").
DeviceSaid = tuple[str, str, str, str]


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    allocations: tuple[Allocation, ...]  # none: not allocated, or no device of the driver
    reserved_for: frozenset[str]  # pod uids, and `name:<pod>` where a reference has no uid
    # What its `status.devices` says of the driver's devices (what `--dra-claim-status` wrote):
    # not what placement reads, so not compared.
    devices_status: frozenset[DeviceSaid] = field(default=frozenset(), compare=False)

    @property
    def key(self) -> ClaimKey:
        return self.namespace, self.name


def _list(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def read_claim(obj: Obj) -> Claim:
    """What placement needs of a claim: its devices of the NVIDIA driver (what a watch keeps)."""
    meta = metadata(obj)
    status = strings(obj.get("status"))
    allocation = strings(status.get("allocation"))
    results = _list(strings(allocation.get("devices")).get("results"))
    found = tuple(
        Allocation(
            str(r.get("request", "")),
            str(r.get("pool", "")),
            str(r.get("device", "")),
            **_consumed(r, i),
        )
        for i, r in enumerate(results)
        if r.get("driver") == dra.DRIVER and r.get("pool") and r.get("device")
    )
    reserved = set()
    for ref in _list(status.get("reservedFor")) if found else ():
        if ref.get("resource", "pods") == "pods":
            reserved.add(str(ref["uid"]) if ref.get("uid") else f"name:{ref.get('name')}")
    written = frozenset(
        (str(d.get("pool", "")), str(d.get("device", "")), str(strings(d.get("data")).get("uuid")),
         str(d.get("shareID") or ""))
        for d in _list(status.get("devices"))
        if d.get("driver") == dra.DRIVER
    )  # fmt: skip
    return Claim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), found,
                 frozenset(reserved), written)  # fmt: skip


def used(pod: Obj) -> set[ClaimKey]:
    """The claims a slim pod's containers use."""
    namespace = names(pod)[0]
    return {(namespace, ref["claim"]) for ref in pod.get(DRA_REFS) or ()}


# A pod's DRA devices (`holds`): one entry a container and device, with its claim, pool, device,
# and on a shared device its `share-id`, `consumed-memory` and `consumed-shares`.
Holds = list[dict[str, str]]
# Each pod's, by uid: what the state joins from the claims before placement (`reconcile_node`).
PodHolds = Mapping[str, Holds]


def holds(pod: Obj, claims: Mapping[ClaimKey, Claim]) -> Holds:
    """A slim pod's DRA devices of the NVIDIA driver: one entry per container and device, for the
    claims reserved for the pod (a claim not reserved for it is not the pod's yet)."""
    namespace, pod_name = names(pod)
    uid = pod_uid(pod)
    # One entry per container, claim and device: a container naming a claim twice (by its entry
    # and as its extended resources'), or a claim listing a device twice, holds it once.
    out: dict[tuple[str, ...], dict[str, str]] = {}
    ended: set[tuple[str, ...]] = set()  # entries of regular init containers
    for ref in pod.get(DRA_REFS) or ():
        claim = claims.get((namespace, ref["claim"]))
        if claim is None or not (uid in claim.reserved_for or f"name:{pod_name}" in
                                 claim.reserved_for):  # fmt: skip
            continue
        request = ref["request"]
        for a in claim.allocations:
            # A request's subrequests answer as `<request>/<subrequest>`.
            if request and a.request != request and not a.request.startswith(f"{request}/"):
                continue
            entry = {"container": ref["container"], "claim": claim.name,
                     "claim-namespace": claim.namespace, "device": a.device, "pool": a.pool}  # fmt: skip
            entry.update(_shared(a))
            out[tuple(entry.values())] = entry
            if ref.get("init"):
                ended.add(tuple(entry.values()))
    # A regular init container has ended while the others run: a device another container uses
    # is theirs; one only init containers used is still the pod's (its claim is), theirs.
    running = {_held(e) for k, e in out.items() if k not in ended}
    return [e for k, e in out.items() if k not in ended or _held(e) not in running]


def _held(entry: Mapping[str, str]) -> tuple[str, ...]:
    """What an entry holds, whichever container: its claim's allocation of a device."""
    return (entry["claim-namespace"], entry["claim"], entry["device"], entry["pool"],
            entry.get("share-id", ""))  # fmt: skip


def _shared(a: Allocation) -> dict[str, str]:
    """An entry's keys for a shared allocation (none for a device the claim holds alone):
    `share-id`, `consumed-memory` (MiB) and `consumed-shares`, and a `problem` to say."""
    found = {"share-id": a.share_id} if a.share_id else {}
    if a.consumed_memory is not None:
        found["consumed-memory"] = str(a.consumed_memory)
    if a.consumed_shares is not None:
        found["consumed-shares"] = str(a.consumed_shares)
    if a.problem:
        found["problem"] = a.problem
    return found
