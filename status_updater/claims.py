"""Which pod containers hold which DRA devices: ResourceClaims joined to the pods using them.

A claim allocated by the scheduler names its devices in `status.allocation.devices.results`
(`driver`, `pool`, `device`, and the `request` each answers) and the pods it is reserved for in
`status.reservedFor`. A pod names its claims in `spec.resourceClaims` (`resourceClaimName`, or a
template, whose claim's name the pod's `status.resourceClaimStatuses` gives), and a container
uses one through `resources.claims` (`name`, and optionally one `request` of it). Only devices of
the NVIDIA driver (`gpu.nvidia.com`) count.

The join is made at the edge, where pods and claims are read: a pod's holds go into its slim
form under `dra` (objects.DRA_KEY), one entry per (container, device), and the `dra` placement
policy puts them on the node's devices. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from status_updater.objects import Obj, metadata, names, pod_uid
from topology import dra


@dataclass(frozen=True)
class Allocation:
    """One device a claim was allocated: the request it answers, its pool and device name."""

    request: str
    pool: str
    device: str


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    allocations: tuple[Allocation, ...]
    reserved_for: frozenset[str]  # pod uids, and `name:<pod>` where a reference has no uid


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_claim(obj: Obj) -> Claim | None:
    """An allocated claim's devices of the NVIDIA driver; None for one not allocated."""
    meta = metadata(obj)
    status = _map(obj.get("status"))
    allocation = _map(status.get("allocation"))
    if not allocation:
        return None
    results = _list(_map(allocation.get("devices")).get("results"))
    found = tuple(
        Allocation(str(r.get("request", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in map(_map, results)
        if r.get("driver") == dra.DRIVER and r.get("pool") and r.get("device")
    )
    reserved = set()
    for ref in map(_map, _list(status.get("reservedFor"))):
        if ref.get("resource", "pods") == "pods":
            reserved.add(str(ref["uid"]) if ref.get("uid") else f"name:{ref.get('name')}")
    return Claim(str(meta.get("namespace", "")), str(meta.get("name", "")), found,
                 frozenset(reserved))  # fmt: skip


Claims = Mapping[tuple[str, str], Claim]  # (namespace, name) -> the claim


def index(claims: Iterable[Obj]) -> dict[tuple[str, str], Claim]:
    return {(c.namespace, c.name): c for obj in claims if (c := read_claim(obj)) is not None}


def _claim_names(pod: Obj) -> dict[str, str]:
    """The pod's claim entries by name -> the ResourceClaim each is (a template's, once made)."""
    spec = _map(pod.get("spec"))
    made = {
        str(s.get("name")): str(s.get("resourceClaimName"))
        for s in map(_map, _list(_map(pod.get("status")).get("resourceClaimStatuses")))
        if s.get("resourceClaimName")
    }
    out: dict[str, str] = {}
    for entry in map(_map, _list(spec.get("resourceClaims"))):
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            out[name] = str(entry["resourceClaimName"])
        elif name in made:
            out[name] = made[name]
    return out


def holds(pod: Obj, claims: Claims) -> list[dict[str, str]]:
    """The pod's DRA devices of the NVIDIA driver: one entry per container and device, for the
    claims reserved for the pod (a claim not reserved for it is not the pod's yet)."""
    namespace, pod_name = names(pod)
    uid = pod_uid(pod)
    by_entry = _claim_names(pod)
    out: list[dict[str, str]] = []
    for c in map(_map, _list(_map(pod.get("spec")).get("containers"))):
        for used in map(_map, _list(_map(c.get("resources")).get("claims"))):
            claim_name = by_entry.get(str(used.get("name", "")))
            claim = claims.get((namespace, claim_name)) if claim_name else None
            if claim is None or not (uid in claim.reserved_for or f"name:{pod_name}" in
                                     claim.reserved_for):  # fmt: skip
                continue
            request = used.get("request")
            for a in claim.allocations:
                # A request's subrequests answer as `<request>/<subrequest>`.
                if request and a.request != request and not a.request.startswith(f"{request}/"):
                    continue
                out.append({"container": str(c.get("name", "")), "claim": claim.name,
                            "claim-namespace": claim.namespace, "device": a.device,
                            "pool": a.pool})  # fmt: skip
    return out
