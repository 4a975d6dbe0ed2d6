"""The board placement plays on: a node's devices, who holds each, and what is reserved.

Pods that held devices in the node's last result keep them (`kept.py`): while placement runs,
each such device is reserved for its pod, so an older pod that lost some of its devices (a
re-partition) never takes a younger pod's. A pod that cannot be placed releases what it
reserved. A model object is copied with changes only by dataclasses.replace, never rebuilt from
its fields: a field added to the model later is carried through (tests/status_updater/
test_copies.py). A GPU that needs no change is taken as it is (replace costs about 1 us a call).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from status_updater.claims import PodHolds
from status_updater.objects import Obj
from status_updater.placement.kept import Kept, KeptReplicas
from status_updater.usage import pod_usage
from topology.catalog import model_for_product
from topology.errors import TopologyError
from topology.model import (
    AllocatedBy,
    DeviceStatus,
    DraClaim,
    NodeTopology,
    Replica,
)

Device = tuple[int, int | None]  # (GPU index, MIG device index on it, or None: the whole GPU)


class Board:
    """A node's devices while pods are placed on them."""

    def __init__(
        self,
        name: str,
        node: NodeTopology,
        single: bool = False,
        kept: Kept | None = None,
        kept_replicas: KeptReplicas | None = None,
        named: Mapping[Device, AllocatedBy] | None = None,
        dynamic: bool = False,
        holds: PodHolds | None = None,
        shares: int | None = None,
    ) -> None:
        self.name = name
        self.holds: PodHolds = holds or {}  # the pods' DRA devices, by pod uid (placement/dra)
        self.shares = shares  # N of the DRA driver's --consumable-shares N; None: another mode
        self.dynamic = dynamic  # DRA's DynamicMIG: a claim's partition makes its instance
        self.node = node
        # The single strategy's `nvidia.com/gpu` is a MIG instance where the GPUs have them.
        self.single = single and any(g.mig_devices for g in node.gpus)
        self.model = model_for_product(node.gpu_product)
        self.gpus = [g if g.status is None else replace(g, status=None) for g in node.gpus]
        self.migs = [list(g.mig_devices) if g.mig_devices is not None else None for g in node.gpus]
        self.holders: dict[tuple[int, int], str] = {}  # run:ai's (GPU, position) -> pod
        self.kept: Kept = kept or {}
        self.reserved = {(g, d): uid for uid, held in self.kept.items() for g, d, _ in held}
        # Shared devices: (GPU, MIG device or None) -> replica index -> (pod uid, replica).
        self.replicas: dict[Device, dict[int, Replica]] = {}
        self.kept_replicas: KeptReplicas = kept_replicas or {}
        self.named = named or {}  # shared devices -> the pod they named before
        # KAI's GPU groups (placement/kai.py): the device each group's reservation pod holds,
        # and the compute mode it says its group shares it in.
        self.groups: dict[str, Device] = {}
        self.group_modes: dict[str, str] = {}
        self.reserved_replicas = {
            (g, d, r): uid for uid, held in self.kept_replicas.items() for g, d, r, _ in held
        }

    def release(self, uid: str) -> None:
        """The pod's reservations end: it was not placed."""
        self.reserved = {k: v for k, v in self.reserved.items() if v != uid}
        self.reserved_replicas = {k: v for k, v in self.reserved_replicas.items() if v != uid}

    def result(self) -> NodeTopology:
        n = self.node
        gpus = tuple(
            g if m is None and g.mig_devices is None
            else replace(g, mig_devices=None if m is None else tuple(m))
            for g, m in zip(self.gpus, self.migs, strict=True)
        )  # fmt: skip
        return replace(n, gpus=gpus)

    def free_gpus(self, uid: str) -> list[int]:
        """The free whole GPUs, those the pod held before first."""
        free = [i for i, g in enumerate(self.gpus) if g.status is None and self.migs[i] is None
                and self.reserved.get((i, None), uid) == uid]  # fmt: skip
        mine = {g for g, d, _ in self.kept.get(uid, ()) if d is None}
        return sorted(free, key=lambda i: (i not in mine, i))

    def hold(
        self,
        pod: Obj,
        obj: str,
        allocated_by: AllocatedBy,
        uid: str,
        warnings: list[TopologyError],
        indices: list[int],
    ) -> None:
        """Whole GPUs `indices` held by the pod's `allocated_by` container."""
        if not indices:
            return
        usage = pod_usage(pod, obj, self.fb_total(indices[0], None), warnings)
        for i in indices:
            status = DeviceStatus(allocated_by=allocated_by, pod_gpu_usage_status={uid: usage})
            self.gpus[i] = replace(self.gpus[i], status=status)

    def set_status(self, g: int, d: int | None, status: DeviceStatus) -> None:
        """Device (g, d)'s status (d None: the whole GPU)."""
        if d is None:
            self.gpus[g] = replace(self.gpus[g], status=status)
        else:
            devices = self.migs[g]
            assert devices is not None
            devices[d] = replace(devices[d], status=status)

    def status(self, g: int, d: int | None) -> DeviceStatus | None:
        return self.gpus[g].status if d is None else (self.migs[g] or [])[d].status

    def claim_on(self, g: int, d: int | None) -> DraClaim | None:
        """The DRA claim that holds device (g, d), if one does (None too for a device the node
        no longer has: a kept index past a GPU's instances)."""
        devices = self.migs[g] if g < len(self.migs) else None
        if d is not None and (devices is None or d >= len(devices)):
            return None
        status = self.status(g, d) if g < len(self.gpus) else None
        return status.dra_claims[0] if status is not None and status.dra_claims else None

    def devices_of(self, uid: str) -> list[Device]:
        """The devices the pod holds now (a scan of the node: for a message, not a pass)."""
        found: list[Device] = []
        for g, gpu in enumerate(self.gpus):
            if gpu.status is not None and uid in gpu.status.pod_gpu_usage_status:
                found.append((g, None))
            for d, dev in enumerate(self.migs[g] or ()):
                if dev.status is not None and uid in dev.status.pod_gpu_usage_status:
                    found.append((g, d))
        return found

    def where(self, g: int, d: int | None) -> str:
        """`GPU 0`, or a MIG device's `GPU 0 GI 9`, for a message."""
        devices = self.migs[g]
        return (
            f"GPU {g}"
            if d is None or devices is None
            else f"GPU {g} GI {devices[d].gpu_instance_id}"
        )

    def claimed(self, devices: list[Device]) -> str:
        """What DRA claims hold of `devices`, for a pod's message that it does not fit:
        ` (GPU 0: DRA claim ns/c)`, or nothing."""
        found = [f"{self.where(g, d)}: DRA claim {c.claim_namespace}/{c.claim}"
                 for g, d in devices if (c := self.claim_on(g, d)) is not None]  # fmt: skip
        return f" ({'; '.join(found)})" if found else ""

    def fb_total(self, g: int, d: int | None) -> int:
        """Device (g, d)'s memory in MiB as DCGM totals it (d None: the whole GPU; a GPU the
        catalog does not know: the node's memory label)."""
        if d is None:
            return self.model.fb_total_mib if self.model else self.node.gpu_memory
        devices = self.migs[g]
        assert devices is not None
        return self.mig_fb_total(devices[d].name)

    def mig_fb_total(self, profile_name: str) -> int:
        """A MIG instance's memory in MiB (0 for a profile the catalog does not know)."""
        profile = self.model.profile(profile_name) if self.model else None
        return profile.fb_total_mib if profile else 0


@dataclass(frozen=True)
class Policy:
    """One way pods get devices. The first policy whose `applies` is true of a pod on a node
    places it there (`placement.POLICIES`); a pod that does not fit raises TopologyError."""

    name: str
    applies: Callable[[Board, Obj], bool]
    place: Callable[[Board, Obj, list[TopologyError]], None]
