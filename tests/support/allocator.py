"""A small stand-in for the kube-scheduler's DRA allocator, for the slices the updater publishes.

It allocates one device at a time: the first device (slices by name, then devices in order) of
the requested class (`type` gpu or mig) and profile that is not allocated yet and whose counter
consumption fits what is left of its counter sets (KEP-4815: a device is allocatable when, for
every counter it consumes, the sum consumed by allocated devices plus its own is at most the
counter set's value), and that carries no taint the request does not tolerate with effect
NoSchedule or NoExecute (KEP-5055: a `None` taint is only told).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def value(quantity: str) -> int:
    for suffix, unit in _UNITS.items():
        if quantity.endswith(suffix):
            return int(quantity.removesuffix(suffix)) * unit
    return int(quantity)


class Allocator:
    def __init__(self, slices: Iterable[dict[str, Any]]) -> None:
        ordered = sorted(slices, key=lambda s: str(s["metadata"]["name"]))
        self.counters = {
            c["name"]: {k: value(v["value"]) for k, v in c["counters"].items()}
            for s in ordered
            for c in s["spec"].get("sharedCounters", [])
        }
        self.devices = [d for s in ordered for d in s["spec"].get("devices", [])]
        self.allocated: list[dict[str, Any]] = []
        self.used: dict[str, dict[str, int]] = {name: {} for name in self.counters}

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

    def allocate(
        self, kind: str, profile: str | None = None, tolerated: frozenset[str] = frozenset()
    ) -> dict[str, Any] | None:
        """The device allocated for a request of `kind` (`gpu` or `mig`) and `profile`, or None
        when none fits; `tolerated`: the taint keys the request tolerates (operator Exists)."""
        for device in self.devices:
            attributes = device["attributes"]
            if attributes["type"]["string"] != kind or device in self.allocated:
                continue
            if profile is not None and attributes.get("profile", {}).get("string") != profile:
                continue
            if not self._fits(device) or self._keeps_off(device, tolerated):
                continue
            for consumed in device.get("consumesCounters", []):
                used = self.used[consumed["counterSet"]]
                for name, v in consumed["counters"].items():
                    used[name] = used.get(name, 0) + value(v["value"])
            self.allocated.append(device)
            return device
        return None
