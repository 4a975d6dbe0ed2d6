"""Which pod containers hold which DRA devices: ResourceClaims joined to the pods using them.

A claim allocated by the scheduler names its devices in `status.allocation.devices.results`
(`driver`, `pool`, `device`, and the `request` each answers) and the pods it is reserved for in
`status.reservedFor`. A pod names its claims in `spec.resourceClaims`, and a container uses one
through `resources.claims` (`objects.claim_refs`): an app container, a sidecar or an init
container. Only devices of the NVIDIA driver
(`gpu.nvidia.com`) count.

Claims and pods arrive apart (two watches, or two sets of files): each is read on its own, and
the state joins them when it places a node's pods (`holds`), one entry per (container, device),
which the `dra` placement policy puts on the node's devices. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from status_updater.objects import DRA_REFS, Obj, metadata, names, pod_uid, strings
from topology import dra


@dataclass(frozen=True)
class Allocation:
    """One device a claim was allocated: the request it answers, its pool and device name."""

    request: str
    pool: str
    device: str


ClaimKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    allocations: tuple[Allocation, ...]  # none: not allocated, or no device of the driver
    reserved_for: frozenset[str]  # pod uids, and `name:<pod>` where a reference has no uid
    # What its `status.devices` says of the driver's devices, (pool, device, uuid) each (what
    # `--dra-claim-status` wrote): not what placement reads, so not compared.
    devices_status: frozenset[tuple[str, str, str]] = field(default=frozenset(), compare=False)

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
        Allocation(str(r.get("request", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in results
        if r.get("driver") == dra.DRIVER and r.get("pool") and r.get("device")
    )
    reserved = set()
    for ref in _list(status.get("reservedFor")) if found else ():
        if ref.get("resource", "pods") == "pods":
            reserved.add(str(ref["uid"]) if ref.get("uid") else f"name:{ref.get('name')}")
    written = frozenset(
        (str(d.get("pool", "")), str(d.get("device", "")), str(strings(d.get("data")).get("uuid")))
        for d in _list(status.get("devices"))
        if d.get("driver") == dra.DRIVER
    )
    return Claim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), found,
                 frozenset(reserved), written)  # fmt: skip


def used(pod: Obj) -> set[ClaimKey]:
    """The claims a slim pod's containers use."""
    namespace = names(pod)[0]
    return {(namespace, ref["claim"]) for ref in pod.get(DRA_REFS) or ()}


# A pod's DRA devices (`holds`): one entry a container and device, with its claim, pool, device.
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
            out[tuple(entry.values())] = entry
            if ref.get("init"):
                ended.add(tuple(entry.values()))
    # A regular init container has ended while the others run: a device another container uses
    # is theirs; one only init containers used is still the pod's (its claim is), theirs.
    running = {(e["claim-namespace"], e["claim"], e["device"], e["pool"])
               for k, e in out.items() if k not in ended}  # fmt: skip
    return [
        e for k, e in out.items()
        if k not in ended or (e["claim-namespace"], e["claim"], e["device"], e["pool"]) not in running
    ]  # fmt: skip
