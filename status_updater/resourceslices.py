"""The ResourceSlices the NVIDIA DRA driver's kubelet plugin would publish on a node.

For a node's GPUs as `devices.build_node` sees them (kubernetes-sigs/dra-driver-nvidia-gpu,
`cmd/gpu-kubelet-plugin`; the facts and their sources are in `shared/reference/dra.md`):

- a GPU with MIG off is `gpu-<minor>`, its capacity the memory;
- static MIG (the default): each MIG instance of the layout is a `mig` device with the parent's
  attributes, its `profile`, `uuid` and `parentUUID`, and its profile's capacities (memory,
  multiprocessors, engines, and `memorySlice<i>` for each memory slice it holds). One slice holds
  every device of the node.
- dynamic MIG (the driver's `DynamicMIG` gate): each MIG-enabled GPU offers every profile at every
  placement, without uuid, each consuming its capacities and memory slices from the GPU's
  counter set; a Hopper or newer GPU also offers itself whole, consuming everything (an A100 with
  MIG on does not). The counter sets sit in a slice of their own, then one slice per GPU, as the
  driver lays them out from Kubernetes 1.35.

Slices are named as the driver's `generateName` starts (`00000-gpu.nvidia.com-<node>-`), without
its random tail, so the updater finds its own, and labelled managed-by the updater: it never
touches a slice it did not write (the real driver's, on a node where it runs).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from status_updater.dra import COMBINED, DISABLED, MEMORY, SPLIT, shares_count
from status_updater.objects import Obj, metadata, node_name, node_uid, strings
from topology import dra
from topology.catalog import Engines, GpuModel, Profile, model_for_product, nvml_model_name
from topology.configmap import LABEL_MANAGED_BY, MANAGER, node_object_name
from topology.errors import TopologyError
from topology.faults import Taint
from topology.model import Gpu, NodeTopology

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 64  # per slice whose devices consume counters or carry taints
MAX_PLAIN_DEVICES = 128  # per slice otherwise
MAX_COUNTER_SETS = 8  # per slice
SELECTOR = f"{LABEL_MANAGED_BY}={MANAGER}"  # the slices the updater writes, and only those


def is_ours(labels: object) -> bool:
    """Whether a slice's labels mark it as one the updater wrote."""
    return isinstance(labels, Mapping) and labels.get(LABEL_MANAGED_BY) == MANAGER


_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
_MIB = 2**20


def quantity(value: int) -> str:
    """A count in Kubernetes' canonical binary-SI form, as the driver's `resource.NewQuantity(v,
    BinarySI)` prints: `14`, `4864Mi`, `40Gi`."""
    for suffix, unit in _UNITS:
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


_DECIMAL_UNITS = (("E", 10**18), ("P", 10**15), ("T", 10**12), ("G", 10**9), ("M", 10**6),
                  ("k", 10**3))  # fmt: skip


def decimal_quantity(value: int) -> str:
    """A count in Kubernetes' canonical decimal-SI form, as `resource.NewQuantity(v, DecimalSI)`
    prints: `4`, `1500`, `2k`."""
    for suffix, unit in _DECIMAL_UNITS:
        if value and value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def _shared(device: dict[str, Any], mode: str) -> dict[str, Any]:
    """The device as published under the driver's `--consumable-shares mode`."""
    return device if mode == DISABLED else _share(device, mode)


def _share(device: dict[str, Any], mode: str) -> dict[str, Any]:
    """The device as the driver's `applyConsumableShares` leaves it under `--consumable-shares
    mode` (not `disabled`): allocatable to several claims; its memory (rounded down to 1Mi) a
    consumable capacity with a request policy, a claim without a request taking all of it
    (`memory`) or none (`unlimited`, N); with N, a capacity `shares` of N, one by default. Its
    other capacities keep no policy: a claim takes all of each (docs/dra.md)."""
    capacity = dict(device["capacity"])
    memory = capacity.get("memory")
    if memory is not None:
        most = quantity(_value_of(memory["value"]) // _MIB * _MIB)
        low, default = ("1Mi", most) if mode == MEMORY else ("0", "0")
        capacity["memory"] = {
            "value": most,
            "requestPolicy": {"default": default,
                              "validRange": {"min": low, "max": most, "step": "1Mi"}},
        }  # fmt: skip
        if (n := shares_count(mode)) is not None:
            shares = decimal_quantity(n)
            capacity["shares"] = {
                "value": shares,
                "requestPolicy": {"default": "1",
                                  "validRange": {"min": "1", "max": shares, "step": "1"}},
            }  # fmt: skip
    return {**device, "capacity": capacity, "allowMultipleAllocations": True}


def _value_of(text: str) -> int:
    """The number a quantity this module printed stands for (`40Gi`, `14`, `2k`)."""
    for suffix, unit in (*_UNITS, *_DECIMAL_UNITS):
        if text.endswith(suffix):
            return int(text.removesuffix(suffix)) * unit
    return int(text)


@dataclass(frozen=True)
class _Parent:
    """What a GPU's devices share: the attributes every one of them carries."""

    index: int
    uuid: str
    attributes: dict[str, dict[str, Any]]


def _label_version(
    labels: Mapping[str, str], keys: tuple[str, ...], default: str, obj: str
) -> str | None:
    """A version attribute as GFD's labels `keys` spell it, else `default`; None where neither
    gives one."""
    text = dra.labelled(labels, keys, default)
    try:
        return dra.version(text) if text else None
    except ValueError as e:
        raise TopologyError(obj, f"metadata.labels[{keys[0]}]", str(e)) from None


def _common(node: Obj, topology: NodeTopology, model: GpuModel | None) -> dict[str, Any]:
    """The attributes every device of the node carries. `architecture` and
    `cudaComputeCapability` are what NVML says of the GPU: GFD's labels where the node has them
    (`nvidia.com/gpu.family`, `nvidia.com/gpu.compute.*`), else the catalog's; a GPU neither
    names (a T4 without those labels) has neither attribute, never a guess."""
    obj = f"node {node_name(node)}"
    labels = strings(metadata(node).get("labels"))
    found: dict[str, Any] = {
        "brand": {"string": "Nvidia"},
        "cudaDriverVersion": {"version": _label_version(labels, dra.LABEL_CUDA, dra.DRA_CUDA, obj)},
        "driverVersion": {"version": _label_version(labels, dra.LABEL_DRIVER, dra.DRA_DRIVER, obj)},
        "productName": {"string": nvml_model_name(topology.gpu_product)},
        # What NVML says of a x86 host's kernel with HMM, as the driver's docs show it.
        "addressingMode": {"string": "HMM"},
    }
    family = dra.ARCHITECTURES.get(str(labels.get(dra.LABEL_FAMILY)))
    if architecture := family or (model.architecture if model else ""):
        found["architecture"] = {"string": architecture}
    catalog = model.compute_capability if model else ""
    if compute := _label_version(labels, dra.LABEL_COMPUTE, catalog, obj):
        found["cudaComputeCapability"] = {"version": compute}
    return found


def _parent(index: int, gpu: Gpu, common: dict[str, Any], list_attributes: bool) -> _Parent:
    """The GPU's attributes, its place on the simulated host's PCIe tree among them (a MIG
    device carries its parent's): `pciBusID`, its root complex `pcieRoot` and `numaNode`, a
    one-element list under the driver's `DRAListTypeAttributes` gate."""
    numa = dra.numa_node(index)
    host = {
        "resource.kubernetes.io/numaNode": {"ints": [numa]} if list_attributes else {"int": numa},
        "resource.kubernetes.io/pciBusID": {"string": dra.resource_pci_bus_id(index)},
        "resource.kubernetes.io/pcieRoot": {"string": dra.pcie_root(index)},
    }
    return _Parent(index, gpu.id, {**common, **host})


def _capacities(profile: Profile) -> dict[str, int]:
    e: Engines = profile.engines
    return {
        "copyEngines": e.copy_engines,
        "decoders": e.decoders,
        "encoders": e.encoders,
        "jpegEngines": e.jpeg_engines,
        "memory": profile.memory_mib * _MIB,
        "multiprocessors": e.multiprocessors,
        "ofaEngines": e.ofa_engines,
    }


def _sorted(attributes: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Copies: one attribute object shared by many devices would be a YAML alias in print."""
    return {k: dict(v) for k, v in sorted(attributes.items())}


def _values(counts: Mapping[str, int]) -> dict[str, dict[str, str]]:
    return {name: {"value": quantity(n)} for name, n in sorted(counts.items())}


def _dns(name: str) -> str:
    """`copyEngines` -> `copy-engines`: a capacity's name as a counter's."""
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in name)


def _counters(capacities: Mapping[str, int], start: int, size: int) -> dict[str, int]:
    found = {_dns(k): v for k, v in capacities.items()}
    found.update({f"memory-slice-{i}": 1 for i in range(start, start + size)})
    return found


def _whole(parent: _Parent, memory_mib: int) -> dict[str, Any]:
    attributes = {**parent.attributes, "type": {"string": "gpu"}, "uuid": {"string": parent.uuid}}
    return {
        "name": dra.gpu_device(parent.index),
        "attributes": _sorted(attributes),
        "capacity": _values({"memory": memory_mib * _MIB}),
    }


def _mig(parent: _Parent, profile: Profile, start: int, uuid: str | None) -> dict[str, Any]:
    attributes = {
        **parent.attributes,
        "parentUUID": {"string": parent.uuid},
        "profile": {"string": profile.name},
        "type": {"string": "mig"},
    }
    device: dict[str, Any] = {"name": dra.mig_device(parent.index, profile, start)}
    capacities = _capacities(profile)
    if uuid is not None:  # static MIG: the instance exists, and says which memory slices it has
        attributes["uuid"] = {"string": uuid}
        slices = {f"memorySlice{i}": 1 for i in range(start, start + profile.memory_slices)}
        device["capacity"] = _values(capacities | slices)
    else:  # dynamic MIG: the instance is made when a claim is prepared
        device["capacity"] = _values(capacities)
        device["consumesCounters"] = [
            {
                "counterSet": dra.counter_set(parent.index),
                "counters": _values(_counters(capacities, start, profile.memory_slices)),
            }
        ]
    device["attributes"] = _sorted(attributes)
    return device


def _maxima(model: GpuModel) -> dict[str, int]:
    """The driver's counter set and dynamic whole-GPU capacity: each capacity's largest value over
    the profiles (memory: the largest profile's, not the GPU's total)."""
    found: dict[str, int] = {}
    for profile in model.profiles:
        for name, value in _capacities(profile).items():
            found[name] = max(found.get(name, 0), value)
    return found


def _static_devices(
    parent: _Parent, gpu: Gpu, model: GpuModel | None, memory_mib: int, obj: str
) -> Iterator[dict[str, Any]]:
    if gpu.mig_devices is None:
        yield _whole(parent, memory_mib)
        return
    for m in gpu.mig_devices:
        profile = model.profile(m.name) if model else None
        if profile is None or m.id is None:
            raise TopologyError(
                obj, f"gpus[{parent.index}]", f"MIG device {m.name} has no DRA capacities"
            )
        yield _mig(parent, profile, m.position, m.id)


def _dynamic_devices(
    parent: _Parent, model: GpuModel, maxima: Mapping[str, int], everything: Mapping[str, int]
) -> Iterator[dict[str, Any]]:
    """Every partition of the GPU; `maxima` and `everything`, its whole's capacity and counters."""
    if model.mig_toggles_without_reset:  # handed out whole too, MIG on or off
        whole = _whole(parent, 0)
        whole["capacity"] = _values(maxima)
        whole["consumesCounters"] = [
            {"counterSet": dra.counter_set(parent.index), "counters": _values(everything)}
        ]
        yield whole
    for profile in model.profiles:
        for start in profile.placements:
            yield _mig(parent, profile, start, None)


def device_memory(topology: NodeTopology, gpu: int, profile: str | None, dynamic: bool) -> int:
    """The MiB of `memory` capacity the slices publish for GPU `gpu` whole (`profile` None) or a
    MIG device of `profile` on it (0 for a profile the catalog does not know): what claims
    sharing the device consume of (the driver's `MemorySizeMB`, on the node's driver)."""
    model = model_for_product(topology.gpu_product)
    if model is None:
        return topology.gpu_memory if profile is None else 0
    model = model.for_driver(topology.driver_version or dra.DRA_DRIVER)
    if profile is not None:
        found = model.profile(profile)
        return found.memory_mib if found else 0
    whole = topology.gpus[gpu].mig_devices is None and not model.mig_toggles_without_reset
    if not dynamic or whole:
        return topology.gpu_memory
    return _maxima(model)["memory"] // _MIB  # DynamicMIG's whole GPU: its largest profile's


def slice_name(node: str, index: int) -> str:
    """`00000-gpu.nvidia.com-<node>`, or with as much of the node as fits and a hash, as a
    node's ConfigMap is named."""
    return node_object_name(f"{index:05x}-{dra.DRIVER}-", node)


def _counter_set(parent: _Parent, everything: Mapping[str, int]) -> dict[str, Any]:
    return {"name": dra.counter_set(parent.index), "counters": _values(everything)}


def _dynamic_specs(
    parents: list[_Parent], topology: NodeTopology, model: GpuModel, layout: str, shares: str
) -> list[dict[str, Any]]:
    """The driver's DynamicMIG slices of a node with a MIG-capable GPU: per GPU, its devices and
    counter set where it is dynamic-MIG capable (MIG toggles without a reset, or MIG is on),
    else the whole GPU; split (every counter set first, in slices of at most 8, one even when
    empty, then a slice per GPU) or combined (a slice per GPU with its own counter set).

    Under `--consumable-shares N` the counter set of a GPU offered whole also counts `shares`:
    the driver's whole GPU and its counter set are made from one capacity map, which its
    `applyConsumableShares` adds `shares` to before the counter set is made (partitions.go)."""
    maxima = _maxima(model)
    everything = _counters(maxima, 0, model.memory_slots)  # a GPU's counter set
    n = shares_count(shares)
    per_gpu: list[tuple[list[dict[str, Any]], dict[str, Any] | None]] = []
    for parent, gpu in zip(parents, topology.gpus, strict=True):
        if gpu.mig_devices is None and not model.mig_toggles_without_reset:
            per_gpu.append(([_shared(_whole(parent, topology.gpu_memory), shares)], None))
            continue
        partitions = _dynamic_devices(parent, model, maxima, everything)
        devices = sorted((_shared(d, shares) for d in partitions), key=lambda d: str(d["name"]))
        counters = _counter_set(parent, everything)
        if n is not None and model.mig_toggles_without_reset:
            counters["counters"] = {
                **counters["counters"],
                "shares": {"value": decimal_quantity(n)},
            }
        per_gpu.append((devices, counters))
    if layout == COMBINED:
        return [
            {"devices": devices, **({"sharedCounters": [counters]} if counters else {})}
            for devices, counters in per_gpu
        ]
    sets = [counters for _, counters in per_gpu if counters is not None]
    specs: list[dict[str, Any]] = [
        {"sharedCounters": sets[i : i + MAX_COUNTER_SETS]}
        for i in range(0, len(sets), MAX_COUNTER_SETS)
    ] or [{}]
    return specs + [{"devices": devices} for devices, _ in per_gpu]


def slice_metadata(node: Obj, index: int) -> dict[str, Any]:
    """The metadata of the node's slice `index`: its name, the updater's label, and the Node as
    its owner, so that it is deleted with its node (a node read from a file without its uid gets
    no owner)."""
    name = node_name(node)
    meta: dict[str, Any] = {"name": slice_name(name, index), "labels": {LABEL_MANAGED_BY: MANAGER}}
    if uid := node_uid(node):
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid, "controller": True}
        ]
    return meta


def node_slices(
    node: Obj,
    topology: NodeTopology,
    *,
    dynamic: bool = False,
    generation: int = 1,
    layout: str = SPLIT,
    list_attributes: bool = False,
    taints: Sequence[Sequence[Taint]] = (),
    shares: str = DISABLED,
) -> list[dict[str, Any]]:
    """The node's ResourceSlices. Raises TopologyError (naming the node) when a MIG device's
    profile has no capacities in the catalog.

    `taints`: each GPU's device taints (faults.node_taints), put on every device of that GPU
    the slices publish, as the driver's health check does (gate NVMLDeviceHealthCheck). That gate
    cannot be on with DynamicMIG, so dynamic slices carry none. A slice with a tainted device
    holds at most 64 devices, the API's limit then.

    `shares`: the driver's `--consumable-shares` (`disabled`, `memory`, `unlimited` or N): every
    device allocatable to several claims, its memory (and with N, its `shares`) consumable."""
    name = node_name(node)
    obj = f"node {name}"
    model = model_for_product(topology.gpu_product)
    common = _common(node, topology, model)
    if model is not None:  # the profiles' memory on the node's driver
        model = model.for_driver(common["driverVersion"]["version"])
    parents = [_parent(i, gpu, common, list_attributes) for i, gpu in enumerate(topology.gpus)]
    specs: list[dict[str, Any]]
    if dynamic and model is not None:
        specs = _dynamic_specs(parents, topology, model, layout, shares)
    elif dynamic:  # no MIG-capable GPU: the driver falls back to a slice per whole GPU
        specs = [{"devices": [_shared(_whole(p, topology.gpu_memory), shares)]} for p in parents]
    else:  # one slice, as the driver's; more only past the API's limit, where it would fail
        devices = []
        for parent, gpu in zip(parents, topology.gpus, strict=True):
            marks = [t.body() for t in taints[parent.index]] if taints else []
            for d in _static_devices(parent, gpu, model, topology.gpu_memory, obj):
                d = _shared(d, shares)
                devices.append({**d, "taints": marks} if marks else d)
        most = MAX_DEVICES if any(taints) else MAX_PLAIN_DEVICES
        specs = [{"devices": devices[i : i + most]} for i in range(0, len(devices), most)] or [
            {"devices": []}
        ]
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": slice_metadata(node, i),
            "spec": {
                "driver": dra.DRIVER,
                "nodeName": name,
                "pool": {"name": name, "generation": generation, "resourceSliceCount": len(specs)},
                **spec,
            },
        }
        for i, spec in enumerate(specs)
    ]
