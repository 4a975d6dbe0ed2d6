"""A small stand-in for the kube-scheduler's DRA allocator, for the slices the updater publishes.

It allocates one device at a time: the first device (slices by name, then devices in order) of
the requested class (`type` gpu or mig) and profile that is not allocated yet and whose counter
consumption fits what is left of its counter sets (KEP-4815: a device is allocatable when, for
every counter it consumes, the sum consumed by allocated devices plus its own is at most the
counter set's value), and that carries no taint the request does not tolerate with effect
NoSchedule or NoExecute (KEP-5055: a `None` taint is only told).

A device with `allowMultipleAllocations` (KEP-5075, consumable capacity; the driver's
ConsumableShares) is never allocated alone: each allocation is a share of it, with a share id
of its own and what it consumes of every capacity of the device, as Kubernetes'
`consumable_capacity.go` works it out:

- a capacity the request does not name: the policy's `default`, else the whole `value`;
- a request and no policy: the request; a `validRange`: `min` where the request is below it, else
  `min` plus the request's distance from it rounded up to whole `step`s (`NewQuantity(v, the
  step's format)`); `validValues`: the first at least the request;
- the device is not eligible where a request names a capacity it has not, where what it
  consumes breaks the policy (past `max`, or off a step from `min`; the default is always
  allowed), or where the shares' sum of a capacity would pass its `value`.

A shared device consumes its counters once, at its first share (as the allocator counts a
device allocated, shared or not, since kubernetes#139040); a device with capacities without a
policy (a MIG device's multiprocessors) is taken whole by its first share, so no second fits.
Share ids are uuids drawn from a seeded generator: the same allocations, the same ids.
"""

from __future__ import annotations

import copy
import random
import re
import uuid
from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from mig_exporter.common.quantity import parse

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_BINARY = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_DECIMAL = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6), ("k", 10**3))
_PROFILE = re.compile(r"""\.profile\s*==\s*['"]([^'"]+)['"]""")
MIG_CLASS = "mig.nvidia.com"


def value(quantity: str) -> int:
    for suffix, unit in _UNITS.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * unit
    return int(quantity)


def printed(number: Decimal, binary: bool) -> str:
    """A whole quantity as `resource.NewQuantity(v, BinarySI or DecimalSI)` prints it."""
    n = int(number)
    for suffix, unit in _BINARY if binary else _DECIMAL:
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def _binary(text: str) -> bool:
    return text.strip().endswith("i")


def consumed(requested: str | None, capacity: Mapping[str, Any]) -> str:
    """What one share consumes of a capacity (`{value, requestPolicy}`) for `requested`, printed
    as the allocator records it in `consumedCapacity` (calculateConsumedCapacity)."""
    policy = capacity.get("requestPolicy")
    if requested is None:
        return str(policy["default"]) if policy and "default" in policy else str(capacity["value"])
    if not policy:
        return requested
    if (valid := policy.get("validRange")) is not None and "min" in valid:
        low = parse(valid["min"])
        if parse(requested) < low:
            return str(valid["min"])
        if "step" not in valid:
            return requested
        step = parse(valid["step"])
        added = -(-parse(requested) // 1) - low  # Value(): a fraction of a unit rounds up
        steps = added // step + (1 if added % step else 0)
        return printed(low + steps * step, _binary(str(valid["step"])))
    for option in policy.get("validValues", ()):
        if parse(requested) <= parse(option):
            return str(option)
    return requested


def violates(amount: str, capacity: Mapping[str, Any]) -> bool:
    """Whether what a share consumes breaks the capacity's policy (violatesPolicy)."""
    policy = capacity.get("requestPolicy")
    if not policy or ("default" in policy and parse(amount) == parse(policy["default"])):
        return False
    if (valid := policy.get("validRange")) is not None:
        if "max" in valid and parse(amount) > parse(valid["max"]):
            return True
        low = parse(valid.get("min", "0"))
        return "step" in valid and (parse(amount) - low) % parse(valid["step"]) != 0
    options = policy.get("validValues")
    return bool(options) and all(parse(amount) != parse(o) for o in options)


class Allocator:
    def __init__(self, slices: Iterable[dict[str, Any]], seed: int = 0) -> None:
        ordered = sorted(slices, key=lambda s: str(s["metadata"]["name"]))
        self.counters = {
            c["name"]: {k: value(v["value"]) for k, v in c["counters"].items()}
            for s in ordered
            for c in s["spec"].get("sharedCounters", [])
        }
        self.devices = [d for s in ordered for d in s["spec"].get("devices", [])]
        self.pools = {id(d): str(s["spec"]["pool"]["name"])
                      for s in ordered for d in s["spec"].get("devices", [])}  # fmt: skip
        self.allocated: list[dict[str, Any]] = []
        self.used: dict[str, dict[str, int]] = {name: {} for name in self.counters}
        # A shared device's (pool, name) -> what its shares consumed so far, by capacity.
        self.shared: dict[tuple[str, str], dict[str, Decimal]] = {}
        self.ids = random.Random(seed)
        # The last allocation's result fields beyond its device: `shareID` and
        # `consumedCapacity` where the device was shared, else none.
        self.last: dict[str, Any] = {}

    def _fits(self, device: dict[str, Any]) -> bool:
        for consumed in device.get("consumesCounters", []):
            have, used = self.counters[consumed["counterSet"]], self.used[consumed["counterSet"]]
            for name, v in consumed["counters"].items():
                if used.get(name, 0) + value(v["value"]) > have[name]:
                    return False
        return True

    @staticmethod
    def _keeps_off(device: dict[str, Any], tolerated: frozenset[str]) -> bool:
        return any(
            t["effect"] in ("NoSchedule", "NoExecute") and t["key"] not in tolerated
            for t in device.get("taints", ())
        )

    def _key(self, device: dict[str, Any]) -> tuple[str, str]:
        return self.pools[id(device)], str(device["name"])

    def _share(self, device: dict[str, Any], requests: Mapping[str, str]) -> dict[str, str] | None:
        """What a share of the device consumes for `requests`, or None where it is not
        eligible (a capacity it has not, a policy broken, a capacity past its value)."""
        capacity = device.get("capacity", {})
        if any(name not in capacity for name in requests):
            return None
        taken = {name: consumed(requests.get(name), c) for name, c in capacity.items()}
        sums = self.shared.get(self._key(device), {})
        for name, amount in taken.items():
            if violates(amount, capacity[name]):
                return None
            if sums.get(name, Decimal(0)) + parse(amount) > parse(capacity[name]["value"]):
                return None
        return taken

    def allocate(
        self,
        kind: str,
        profile: str | None = None,
        tolerated: frozenset[str] = frozenset(),
        capacity: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | None:
        """The device allocated for a request of `kind` (`gpu` or `mig`) and `profile`, or None
        when none fits; `tolerated`: the taint keys the request tolerates (operator Exists);
        `capacity`: its capacity requests (`exactly.capacity.requests`), for shared devices.
        A shared device's share is in `last`."""
        self.last = {}
        for device in self.devices:
            attributes = device["attributes"]
            if attributes["type"]["string"] != kind or device in self.allocated:
                continue
            if profile is not None and attributes.get("profile", {}).get("string") != profile:
                continue
            shared = bool(device.get("allowMultipleAllocations"))
            first = self._key(device) not in self.shared
            if (first and not self._fits(device)) or self._keeps_off(device, tolerated):
                continue
            taken = self._share(device, capacity or {}) if shared else None
            if shared and taken is None:
                continue
            if first:
                for consumed in device.get("consumesCounters", []):
                    used = self.used[consumed["counterSet"]]
                    for name, v in consumed["counters"].items():
                        used[name] = used.get(name, 0) + value(v["value"])
            if taken is None:
                self.allocated.append(device)
                return device
            sums = self.shared.setdefault(self._key(device), {})
            for name, amount in taken.items():
                sums[name] = sums.get(name, Decimal(0)) + parse(amount)
            share = uuid.UUID(int=self.ids.getrandbits(128), version=4)
            self.last = {"shareID": str(share), "consumedCapacity": dict(sorted(taken.items()))}
            return device
        return None

    def allocate_claim(
        self, claim: dict[str, Any], tolerated: frozenset[str] = frozenset()
    ) -> bool:
        """Allocates each request of the claim (`spec.devices.requests[].exactly`: one device of
        its class, `mig.nvidia.com` a MIG device, else a GPU; the profile its selector names; its
        `capacity.requests`) and writes them to its `status.allocation` as the scheduler does,
        with `shareID` and `consumedCapacity` on a shared device. False, and nothing allocated
        or written, where one does not fit."""
        before = (list(self.allocated), copy.deepcopy(self.used), copy.deepcopy(self.shared),
                  self.ids.getstate())  # fmt: skip
        results = []
        for request in claim["spec"]["devices"]["requests"]:
            exactly = request["exactly"]
            kind = "mig" if exactly.get("deviceClassName") == MIG_CLASS else "gpu"
            named = [m[1] for s in exactly.get("selectors", ())
                     if (m := _PROFILE.search(s.get("cel", {}).get("expression", "")))]  # fmt: skip
            asks = exactly.get("capacity", {}).get("requests", {})
            device = self.allocate(kind, named[0] if named else None, tolerated, asks)
            if device is None:
                self.allocated, self.used, self.shared, state = before
                self.ids.setstate(state)
                return False
            results.append({"request": request["name"], "driver": "gpu.nvidia.com",
                            "pool": self._key(device)[0], "device": device["name"],
                            **self.last})  # fmt: skip
        claim.setdefault("status", {})["allocation"] = {"devices": {"results": results}}
        return True
