"""KAI-Scheduler's GPU fractions, as its pods carry them (read from KAI's code: its
`pkg/common/constants`, the binder's `resourcereservation` and `gpusharing`, the `api` repo's
NvFractions keys; facts and sources in docs/sharing.md).

A fractional pod asks for no `nvidia.com/gpu`. KAI's binder gives it a GPU group (a uuid): the
label `runai-gpu-group: <group>`, or for a pod of several GPUs one label `runai-gpu-group/<group>`
per GPU. For each group it runs a **reservation pod** in `kai-resource-reservation` (run:ai:
`runai-reservation`), labelled `app: kai-resource-reservation` and `runai-gpu-group: <group>`,
which asks the device plugin for one whole `nvidia.com/gpu`: the GPU the group shares.

What a fraction pod asks for, by KAI's precedence: NvFractions' per-container
`nvidia.com/container.<c>.gpu-memory.request` / `.limit` (quantities), then `gpu-fraction` (a
portion of the GPU), then `gpu-memory` (MiB); `gpu-fraction-num-devices` GPUs of it;
`gpu-fraction-container-name` is the container using it (else the first). A limit
(`.gpu-memory.limit`, `kai.scheduler/container.<c>.gpu-memory.portion.limit`, `gpu-memory.limit`,
`gpu-fraction.limit`) caps what the pod may use. `nvidia.com/container.<c>.gpu-compute.mode` is
`time-slicing` (the default) or `sm-sharing`: pods of different modes never share a GPU.

Pure, and of no pod object: it reads a pod's labels and annotations as mappings (the updater's
slim pods keep these keys: `kept_labels`, `kept_annotations`), as `runai.py` reads run:ai's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from mig_exporter.common import quantity
from topology.errors import TopologyError

GROUP = "runai-gpu-group"
GROUP_PREFIX = GROUP + "/"  # a pod of several GPUs: one label per GPU's group
APP = "app"
RESERVATION_APPS = ("kai-resource-reservation", "runai-reservation")
RESERVATION_NAMESPACES = RESERVATION_APPS  # KAI's default, and run:ai's
# What KAI's reservation pod writes once it runs (its NVML's GPU: the uuid, despite the name).
GPU_INDEX = "run.ai/reserve_for_gpu_index"
RESERVATION_CONTAINER = "resource-reservation"

FRACTION = "gpu-fraction"
MEMORY = "gpu-memory"
DEVICES = "gpu-fraction-num-devices"
CONTAINER = "gpu-fraction-container-name"
FRACTION_LIMIT = "gpu-fraction.limit"
MEMORY_LIMIT = "gpu-memory.limit"
NV_PREFIX = "nvidia.com/container."
NV_REQUEST = ".gpu-memory.request"
NV_LIMIT = ".gpu-memory.limit"
NV_MODE = ".gpu-compute.mode"
KAI_PREFIX = "kai.scheduler/container."
PORTION_LIMIT = ".gpu-memory.portion.limit"
MODES = ("time-slicing", "sm-sharing")
DEFAULT_MODE = "time-slicing"
# KAI's node condition for NvFractions: its scheduler places a fractional pod only on a node
# that reports it True (gpusharingnodevalidation); the first cut named it gpu-sharing.nvidia.com.
READY_CONDITION = "gpu-fractioning.nvidia.com/Ready"

ANNOTATIONS = (FRACTION, MEMORY, DEVICES, CONTAINER, FRACTION_LIMIT, MEMORY_LIMIT, GPU_INDEX)
_SUFFIXES = (NV_REQUEST, NV_LIMIT, NV_MODE)


def kept_labels(labels: Mapping[str, object]) -> dict[str, object]:
    """The labels KAI's sharing reads: the group labels, and `app` (a reservation pod's)."""
    return {k: v for k, v in labels.items() if k in (GROUP, APP) or k.startswith(GROUP_PREFIX)}


def kept_annotations(annotations: Mapping[str, object]) -> dict[str, object]:
    """The annotations KAI's sharing reads."""
    return {
        k: v
        for k, v in annotations.items()
        if k in ANNOTATIONS
        or (k.startswith(NV_PREFIX) and k.endswith(_SUFFIXES))
        or (k.startswith(KAI_PREFIX) and k.endswith(PORTION_LIMIT))
    }


def is_reservation(namespace: str, labels: Mapping[str, object]) -> bool:
    """A reservation pod: KAI's scheduler knows one by its `app` label; run:ai's and older
    writers' by their namespace."""
    return (
        labels.get(APP) in RESERVATION_APPS or namespace in RESERVATION_NAMESPACES
    ) and GROUP in labels


def groups(labels: Mapping[str, object]) -> tuple[str, ...]:
    """The GPU groups a pod is in: its `runai-gpu-group`, then one per
    `runai-gpu-group/<group>` label (a pod of several GPUs), by name."""
    found = [str(labels[GROUP])] if isinstance(labels.get(GROUP), str) and labels[GROUP] else []
    found += sorted(k[len(GROUP_PREFIX) :] for k in labels if k.startswith(GROUP_PREFIX))
    return tuple(dict.fromkeys(g for g in found if g))


def is_fraction(
    namespace: str, labels: Mapping[str, object], annotations: Mapping[str, object]
) -> bool:
    """A pod sharing a GPU by KAI's fractions: a group, or a fraction asked (not a reservation
    pod: it holds its GPU whole)."""
    if is_reservation(namespace, labels):
        return False
    return (
        bool(groups(labels))
        or FRACTION in annotations
        or MEMORY in annotations
        or any(k.startswith(NV_PREFIX) and k.endswith(NV_REQUEST) for k in annotations)
    )


@dataclass(frozen=True)
class Ask:
    """What one fraction pod asks of each GPU it shares."""

    container: str
    portion: Decimal | None  # of the GPU's memory (gpu-fraction)
    memory: int | None  # MiB (gpu-memory, NvFractions' request)
    limit_portion: Decimal | None  # the most it may use, a portion of the GPU's memory
    limit: int | None  # the most it may use, MiB
    devices: int  # gpu-fraction-num-devices
    mode: str  # NvFractions' compute mode; "" where none is asked

    def mib(self, gpu_mib: int) -> int:
        """What it asks of a GPU of `gpu_mib` MiB (KAI's node memory): a portion truncated to
        MiB, as KAI's scheduler counts it."""
        if self.memory is not None:
            return self.memory
        return int((self.portion or 0) * gpu_mib)

    def most(self, gpu_mib: int) -> int | None:
        """The most it may use of such a GPU, where a limit says; None: no limit."""
        limits = [self.limit] if self.limit is not None else []
        if self.limit_portion is not None:
            limits.append(int(self.limit_portion * gpu_mib))
        return min(limits) if limits else None


def _field(key: str) -> str:
    return f"metadata.annotations[{key}]"


def _text(annotations: Mapping[str, object], key: str, obj: str) -> str | None:
    value = annotations.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TopologyError(obj, _field(key), f"expected a string, got {value!r}")
    return value.strip()


def _portion(annotations: Mapping[str, object], key: str, obj: str) -> Decimal | None:
    text = _text(annotations, key, obj)
    if text is None:
        return None
    try:
        value = quantity.parse(text)
    except ValueError:
        value = Decimal(-1)
    if not 0 < value <= 1:
        raise TopologyError(
            obj, _field(key), f"expected a portion of a GPU, 0 < x <= 1, got {text!r}"
        )
    return value


def _whole(annotations: Mapping[str, object], key: str, obj: str, unit: str) -> int | None:
    text = _text(annotations, key, obj)
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) < 2**31:
        raise TopologyError(
            obj, _field(key), f"expected a whole number of {unit} above 0, got {text!r}"
        )
    return int(text)


def _memory(annotations: Mapping[str, object], key: str, obj: str) -> int | None:
    text = _text(annotations, key, obj)
    if text is None:
        return None
    try:
        mib = quantity.mib(text)
    except ValueError as e:
        raise TopologyError(obj, _field(key), str(e)) from None
    if not 0 < mib < 2**31:
        raise TopologyError(
            obj, _field(key), f"expected at least 1Mi and less than 2Pi, got {text!r}"
        )
    return mib


def _nv_container(annotations: Mapping[str, object], obj: str) -> str | None:
    """The container NvFractions' annotations name (KAI allows one)."""
    named = {
        k[len(NV_PREFIX) : -len(suffix)]
        for k in annotations
        if k.startswith(NV_PREFIX)
        for suffix in _SUFFIXES
        if k.endswith(suffix)
    } | {k[len(KAI_PREFIX) : -len(PORTION_LIMIT)] for k in annotations
         if k.startswith(KAI_PREFIX) and k.endswith(PORTION_LIMIT)}  # fmt: skip
    if len(named) > 1:
        raise TopologyError(
            obj, "metadata.annotations", f"NvFractions annotations name {len(named)} containers "
            f"({', '.join(sorted(named))}): KAI allows one",
        )  # fmt: skip
    return next(iter(named), None)


def ask(annotations: Mapping[str, object], containers: list[str], obj: str) -> Ask:
    """What a fraction pod asks (`containers`: its containers' names, the first app container
    first); TopologyError naming the annotation where one cannot be read (the pod holds nothing,
    as KAI's admission would have refused it)."""
    a = annotations
    nv = _nv_container(a, obj)
    named = _text(a, CONTAINER, obj)
    container = nv or named or (containers[0] if containers else "")
    if nv is not None and named and named != nv:
        raise TopologyError(obj, _field(CONTAINER), f"names container {named!r}, the NvFractions "
                            f"annotations {nv!r}")  # fmt: skip
    if container not in containers:
        raise TopologyError(obj, _field(CONTAINER), f"container {container!r} is not in the pod")
    nv_request = _memory(a, f"{NV_PREFIX}{container}{NV_REQUEST}", obj) if nv else None
    nv_limit = _memory(a, f"{NV_PREFIX}{container}{NV_LIMIT}", obj) if nv else None
    portion = _portion(a, FRACTION, obj)
    memory = _whole(a, MEMORY, obj, "MiB")
    if nv_request is None and nv_limit is not None:
        nv_request = nv_limit  # KAI: a limit alone is the request too
    if nv_request is not None:
        portion, memory = None, nv_request
    elif portion is not None:
        memory = None
    elif memory is None:
        raise TopologyError(obj, "metadata.annotations", f"is in a GPU group but asks for no "
                            f"{FRACTION}, {MEMORY} or NvFractions memory: holds nothing")  # fmt: skip
    limit = nv_limit if nv_limit is not None else _whole(a, MEMORY_LIMIT, obj, "MiB")
    limit_portion = _portion(a, f"{KAI_PREFIX}{container}{PORTION_LIMIT}", obj) if nv else None
    limit_portion = limit_portion or _portion(a, FRACTION_LIMIT, obj)
    mode = _text(a, f"{NV_PREFIX}{container}{NV_MODE}", obj) if nv else None
    if mode is not None and mode not in MODES:
        raise TopologyError(obj, _field(f"{NV_PREFIX}{container}{NV_MODE}"),
                            f"expected {' or '.join(MODES)}, got {mode!r}")  # fmt: skip
    devices = _whole(a, DEVICES, obj, "GPUs") or 1
    return Ask(container, portion, memory, limit_portion, limit, devices, mode or "")


def reservation_mode(annotations: Mapping[str, object]) -> str:
    """The compute mode a reservation pod's group shares its GPU in (NvFractions writes it on
    the reservation pod); "" where it says none."""
    value = annotations.get(f"{NV_PREFIX}{RESERVATION_CONTAINER}{NV_MODE}")
    return value.strip() if isinstance(value, str) else ""


def node_memory(label_mib: int) -> int:
    """A GPU's memory as KAI's scheduler counts it: the node's `nvidia.com/gpu.memory` label in
    MiB, floored to a multiple of 100 (its node_info.go)."""
    return max(label_mib // 100 * 100, 0)
