"""What names a GPU's series: the one label builder of the simulated path and the NVML path.

A series subject is (kind, labels, reading): `dcgm.subject_fragments` writes one series per field
served for its kind (fields.py). The labels follow dcgm-exporter's order, as the real dumps in
samples/mig/metrics/ show:

    gpu, UUID, device, modelName, [GPU_I_PROFILE, GPU_I_ID,] Hostname, <label fields>,
    container, namespace, pod, [vgpu]

and from 4.8.3 (generations.py) `pci_bus_id` after `UUID`, `hostname` in lower case, and the
pod labels after the label fields in name order, as dcgm-exporter's attributes (dra.md's real
line); a device nobody holds then has no pod labels at all. `in_output_order` is the order of
its series from 4.8.3: by label signature.

A GPU with MIG off has its own series, once per pod label set (`holders`); a GPU with MIG on has
one series per instance, or with no instance its GPU-level series only, with empty pod labels.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from exporter.fields import EMPTY, GPU, MIG
from exporter.readings import Reading, pod_percent
from mig_exporter.common.podlabels import Allowlist, placed
from topology import dra
from topology.model import AllocatedBy, DeviceStatus, DraClaim

log = logging.getLogger(__name__)

Labels = tuple[tuple[str, str], ...]  # (name, value) in dcgm-exporter's order
Subject = tuple[str, Labels, Reading]  # (GPU, MIG or EMPTY, its labels, its values)


@dataclass(frozen=True, kw_only=True)
class GpuLabels:
    """What every series of one GPU is labelled with, whichever source read it."""

    index: int  # `gpu`: its place in the driver's list
    uuid: str
    minor: int  # `device` is nvidia<minor>
    model: str  # `modelName`, as NVML names it
    hostname: str
    fields: Labels  # the counters' label fields, after `Hostname`
    pci_bus_id: str | None = None  # `pci_bus_id` (NVML's form), from 4.x; None: none
    hostname_label: str = "Hostname"  # `hostname` from dcgm-exporter 4.8.3


@dataclass(frozen=True, kw_only=True)
class InstanceSeries:
    """One MIG instance of a GPU: its labels, the device whose pods name it, its values."""

    profile: str  # `GPU_I_PROFILE` as the generation names it, e.g. 1g.5gb
    gpu_instance_id: int  # `GPU_I_ID`
    status: DeviceStatus | None  # None where its pods are not named (dynamic MIG)
    reading: Reading
    uuid: str | None = None  # its `MIG-` id, where known: `dra_mig_device_uuid`
    nvml_profile: str | None = None  # NVML's name, `dra_mig_profile` (the driver's); None: profile


@dataclass(frozen=True, kw_only=True)
class Attribution:
    """How a device's series name the pods holding it (dcgm-exporter's Kubernetes options, and
    what its generation does with a free device)."""

    virtual_gpus: bool = False  # --kubernetes-virtual-gpus: one copy per replica held
    # With it, each holder's own FB_USED and GPU_UTIL (dcgm-exporter 4.5.3 and later, its #594):
    # a generation's `per_process`.
    per_process: bool = False
    dra: bool = False  # --kubernetes-enable-dra: one copy per pod container a claim gives it
    claim_status: bool = False  # DynamicMIG instances attributed through the claim's status
    free_pod_labels: bool = True  # a free device: container/namespace/pod="" (else none)
    dra_uuid_always: bool = True  # dra_mig_device_uuid="" where unknown (4.8.4: left out)
    pod_uid: bool = False  # --kubernetes-enable-pod-uid: pod_uid after pod
    dra_pod_uid: bool = False  # and on DRA copies (from 4.8.4)
    # --kubernetes-enable-pod-labels: the holding pod's labels its allowlist lets through
    pod_labels: Allowlist | None = None
    sorted_labels: bool = False  # the label fields (and pod labels) in name order (from 4.8.3)


# Names a pod label may not take on a series (dcgm-exporter's rendererReservedLabels).
RESERVED = frozenset({"gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE",
                      "GPU_I_ID", "hostname"})  # fmt: skip
Held = tuple[AllocatedBy | None, Labels]  # the pod container holding a copy, and its attributes


def in_output_order(subjects: Sequence[Subject]) -> list[int]:
    """The order dcgm-exporter (from 4.8.3) writes a family's series in: by label signature,
    the labels sorted by name, each written `<len>:<name>=<len>:<value>;` with byte lengths
    (its render_metrics.go labelSignature), compared as bytes."""

    def signature(k: int) -> bytes:
        return b"".join(
            b"%d:%s=%d:%s;" % (len(n), n, len(v), v)
            for n, v in sorted((n.encode(), v.encode()) for n, v in subjects[k][1])
        )

    return sorted(range(len(subjects)), key=signature)


def gpu_subjects(
    gpu: GpuLabels,
    reading: Reading,
    status: DeviceStatus | None,
    instances: Sequence[InstanceSeries] | None,
    attribution: Attribution,
    views: list[View | None] | None = None,
) -> list[Subject]:
    """The series subjects of one GPU: its own with MIG off (`instances` None, `status` naming
    its pods), else one per instance, or its GPU-level one when it has no instance. With `dra`
    (dcgm-exporter's --kubernetes-enable-dra), a device DRA claims hold has one copy per pod
    container holding it, with the claim's labels."""
    bus = () if gpu.pci_bus_id is None else (("pci_bus_id", gpu.pci_bus_id),)
    base = (("gpu", str(gpu.index)), ("UUID", gpu.uuid), *bus, ("device", f"nvidia{gpu.minor}"),
            ("modelName", gpu.model))  # fmt: skip
    a = attribution
    views = [] if views is None else views
    if instances is None:
        return _copies(GPU, base, gpu, reading, status, None, a, views)
    free = (None, holder(None, a))
    out: list[Subject] = [] if instances else [(EMPTY, _labels(base, gpu, free, a), reading)]
    views += [None] * len(out)
    for inst in instances:
        mig = (("GPU_I_PROFILE", inst.profile), ("GPU_I_ID", str(inst.gpu_instance_id)))
        named = (inst.uuid or "", inst.nvml_profile or inst.profile)
        out += _copies(MIG, base + mig, gpu, inst.reading, inst.status, named, a, views)
    return out


def _copies(
    kind: str,
    head: Labels,
    gpu: GpuLabels,
    reading: Reading,
    status: DeviceStatus | None,
    mig: tuple[str, str] | None,
    a: Attribution,
    views: list[View | None],
) -> list[Subject]:
    """One device's series: one per holder (DRA's, or the device plugin's), and where holders
    have their own values, their per-process copies (`View`)."""
    pods = dra_holders(status, mig, a) if a.dra else []
    if pods or not (a.per_process and a.virtual_gpus and status is not None
                    and (status.allocated_by is not None or status.replicas)):  # fmt: skip
        pods = pods or holders(status, a)
        views += [None] * len(pods)
        return [(kind, _labels(head, gpu, held, a), reading) for held in pods]
    assert status is not None
    pods = holders(status, a)
    copies = [(held, _OTHERS) for held in pods] + process_copies(status, pods, a)
    views += [v for _, v in copies]
    return [(kind, _labels(head, gpu, held, a), reading) for held, _ in copies]


def _labels(head: Labels, gpu: GpuLabels, held: Held, a: Attribution) -> Labels:
    """A series' labels: the device's, the hostname, the label fields (with the holding pod's
    labels, where asked: dcgm-exporter keeps both in one map, in name order), then the
    attributes (container, dra_*, namespace, pod, pod_uid, vgpu)."""
    who, attributes = held
    fields = gpu.fields
    if a.pod_labels is not None and who is not None and who.labels:
        in_use = RESERVED | {n for n, _ in (*head, *fields, *attributes)} | {gpu.hostname_label}
        fields = (*fields, *placed(a.pod_labels.keep(dict(who.labels)).items(), in_use))
    if a.sorted_labels:
        fields = tuple(sorted(fields))
    return (*head, (gpu.hostname_label, gpu.hostname), *fields, *attributes)


_UNATTRIBUTED: set[tuple[str, str, str, str]] = set()  # (pool, namespace, claim, device) said
_MAX_SAID = 100_000


def _unattributed(c: DraClaim) -> None:
    """Said once per claim and device: a DynamicMIG instance's series name no pod."""
    key = (c.pool, c.claim_namespace, c.claim, c.device)
    if key in _UNATTRIBUTED:
        return
    if len(_UNATTRIBUTED) >= _MAX_SAID:
        _UNATTRIBUTED.clear()
    _UNATTRIBUTED.add(key)
    log.info("DRA claim %s/%s: %s on node %s is a DynamicMIG instance: served without pod or "
             "dra_* labels, as dcgm-exporter 4.8 serves it (it cannot attribute one: its #714)",
             c.claim_namespace, c.claim, c.device, c.pool)  # fmt: skip


def dra_holders(
    status: DeviceStatus | None, mig: tuple[str, str] | None, attribution: Attribution
) -> list[Held]:
    """One label set per pod container a DRA claim gives the device, in dcgm-exporter's order
    (its attributes sorted by name); `mig` is a MIG device's (uuid, profile). A holder a
    document lists twice is one series, never two samples that would fail the scrape. An
    instance made for a claim (DynamicMIG) has none: its slice device names no uuid, so
    dcgm-exporter (up to 4.8.4) cannot map it to the claim; with `claim_status` the claim's
    status names it (the driver's #1456), and it has them."""
    out: list[Held] = []
    for c in status.dra_claims if status else ():
        if c.made and not attribution.claim_status:
            _unattributed(c)
            continue
        a = c.holder
        labels = [("container", a.container), ("dra_claim_name", c.claim),
                  ("dra_claim_namespace", c.claim_namespace), ("dra_device_name", c.device),
                  ("dra_driver_name", dra.DRIVER)]  # fmt: skip
        if mig is not None:
            if mig[0] or attribution.dra_uuid_always:
                labels.append(("dra_mig_device_uuid", mig[0]))
            labels.append(("dra_mig_profile", mig[1]))
        labels += [("dra_pool_name", c.pool), ("namespace", a.namespace), ("pod", a.pod)]
        if attribution.dra_pod_uid:
            labels.append(("pod_uid", a.uid))
        out.append((a, tuple(labels)))
    return list(dict.fromkeys(out))


def holder(status: DeviceStatus | None, attribution: Attribution = Attribution()) -> Labels:
    """container, namespace, pod (and pod_uid) of the pod holding a device; a free device's
    are empty, or left out where the generation leaves them out."""
    a = status.allocated_by if status else None
    if a is None and not attribution.free_pod_labels:
        return ()
    return _pod_labels(a, attribution.pod_uid)


def _pod_labels(a: AllocatedBy | None, uid: bool = False) -> Labels:
    labels = (("container", a.container), ("namespace", a.namespace), ("pod", a.pod)) if a else (
        ("container", ""), ("namespace", ""), ("pod", ""))  # fmt: skip
    return (*labels, ("pod_uid", a.uid)) if uid and a is not None else labels


def holders(status: DeviceStatus | None, attribution: Attribution) -> list[Held]:
    """The holders of a device's series and their pod labels: one (the pod holding it, or one
    of the pods sharing it), or in virtual-GPU mode one per replica held, each with its `vgpu`
    after the pod labels, where dcgm-exporter's sorted attributes put it; and one per KAI
    fraction pod sharing it, after its reservation pod's (these dcgm-exporter cannot name: the
    kubelet gives the GPU to the reservation pod only)."""
    if attribution.virtual_gpus and status is not None and status.replicas:
        return [(who, (*_pod_labels(who, attribution.pod_uid), ("vgpu", str(r.index))))
                for r in status.replicas for who in (replace(r.holder, uid=r.pod_uid),)]  # fmt: skip
    out: list[Held] = [(status.allocated_by if status else None, holder(status, attribution))]
    if attribution.virtual_gpus and status is not None:
        out += [(f.holder, _pod_labels(f.holder, attribution.pod_uid)) for f in status.fractions]
    return out


# --- per-process values (dcgm-exporter's #594) ---------------------------------------------------

PROCESS_FIELDS = ("fb_used", "gpu_util")  # the Reading values a pod has its own of
_FB, _UTIL = (Reading._fields.index(name) for name in PROCESS_FIELDS)
_WIDTH = len(Reading._fields)
_new = tuple.__new__
Pods = tuple[tuple[str, int, int, int], ...]  # a device's pods: (uid, lowest %, highest %, MiB)


class Shares:
    """A device's pods' own values in a step, worked out once for all their copies (a copy
    each would make a device's work grow with the square of its pods)."""

    __slots__ = ("_key", "_values", "pods")

    def __init__(self, pods: Pods) -> None:
        self.pods = pods
        self._key: tuple[int, int | None, int | None] | None = None
        self._values: tuple[list[int], list[int] | None] = ([], None)

    def at(
        self, step: int, used: int | None, util: int | None
    ) -> tuple[list[int], list[int] | None]:
        """Each pod's (MiB, %) in `step`, their sums within the device's `used` and `util`: a
        share each, as NVML's per-process figures, which never add up to more than the device."""
        key = (step, used, util)
        if key != self._key:
            utils = None
            if util is not None:
                drawn = [pod_percent(uid, lo, hi, step) for uid, lo, hi, _ in self.pods]
                utils = apportion(drawn, min(util, 100))
            self._key = key
            self._values = (apportion([p[3] for p in self.pods], used or 0), utils)
        return self._values


def _only(fb: int | None, util: int | None) -> Reading:
    """A Reading of FB_USED and GPU_UTIL alone: every other field's series left out."""
    values: list[object] = [None] * _WIDTH
    values[_FB], values[_UTIL] = fb, util
    return _new(Reading, values)


@dataclass(frozen=True, slots=True)
class View:
    """Which of a device's values one copy of its series carries, where holders have their own
    (`Attribution.per_process`): dcgm-exporter 4.5.3 and later, with --kubernetes-virtual-gpus,
    serves FB_USED and GPU_UTIL once for the device (no pod labels) and once per holder with
    that pod's own (its processes'), and every other field once per holder with the device's.

    `shares`: None for a copy of the other fields (without FB_USED and GPU_UTIL); else the
    device's pods' values, and `k` the index of the copy's pod among them, -1 for the device's
    own, or past them for a holder with no usage (no process of its own: 0)."""

    shares: Shares | None = None
    k: int = -1

    def of(self, r: Reading, step: int) -> Reading:
        if self.shares is None:
            values = list(r)
            values[_FB] = values[_UTIL] = None
            return _new(Reading, values)
        if self.k < 0:
            return _only(r.fb_used, r.gpu_util)
        if self.k >= len(self.shares.pods):
            return _only(0, None if r.gpu_util is None else 0)
        used, utils = self.shares.at(step, r.fb_used, r.gpu_util)
        return _only(used[self.k], None if utils is None else utils[self.k])


def apportion(values: Sequence[int], most: int) -> list[int]:
    """`values` as they are where they add up to at most `most`; else `most` shared in their
    proportions, whole numbers adding up to it (the largest remainders round up)."""
    total = sum(values)
    if total <= most:
        return list(values)
    exact = [v * most / total for v in values]
    out = [int(x) for x in exact]
    for i in sorted(range(len(values)), key=lambda i: out[i] - exact[i])[: most - sum(out)]:
        out[i] += 1
    return out


_OTHERS = View()  # a holder's copy of every field but its own


def process_copies(
    status: DeviceStatus, held: list[Held], a: Attribution
) -> list[tuple[Held, View]]:
    """The per-process copies of a held device: its own (no pod labels), then each holder's
    with `pod_uid` (dcgm-exporter always writes it on these) and `vgpu` where it has one."""
    pods = tuple((uid, u.utilization.min, u.utilization.max, u.fb_used)
                 for uid, u in sorted(status.pod_gpu_usage_status.items()))  # fmt: skip
    index = {p[0]: k for k, p in enumerate(pods)}
    shares = Shares(pods)
    # The device's own: no pod labels at all (not even empty ones), whatever the generation.
    out: list[tuple[Held, View]] = [((None, ()), View(shares, -1))]
    for who, labels in held:
        if who is None:
            continue
        vgpu = [(n, v) for n, v in labels if n == "vgpu"]
        own = (*_pod_labels(who, uid=True), *vgpu)
        # A pod's usage is under its uid, or where a file gave it none, its namespace/name.
        k = index.get(who.uid or f"{who.namespace}/{who.pod}", len(pods))
        out.append(((who, own), View(shares, k)))
    return out
