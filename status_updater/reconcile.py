"""Pure reconcile: observed Nodes and Pods (Kubernetes JSON) -> the desired topology.

`render` and the live controller run exactly this code. Nothing here does I/O; every problem in
one object is returned as a TopologyError naming it, and the other objects are still reconciled.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from status_updater.usage import pod_usage
from topology import runai
from topology.catalog import MIG_SUFFIX, GpuModel, model_for_product
from topology.errors import TopologyError
from topology.model import AllocatedBy, DeviceStatus, Gpu, MigDevice, NodeTopology, Topology
from topology.validate import node_errors

Obj = Mapping[str, Any]
# GPU ids are uuid5 of the node name and index: stable across runs, restarts and replicas.
_GPU_NAMESPACE = uuid.UUID("6f1c2a4e-3b7d-5e8f-9a0b-1c2d3e4f5a6b")
RELEASED_PHASES = ("Succeeded", "Failed")


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_GPU_NAMESPACE, f'{node_name}/{index}')}"


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _strings(value: object) -> Mapping[str, str]:
    return value if isinstance(value, Mapping) else {}


def node_name(node: Obj) -> str:
    return str(_meta(node).get("name") or "")


def pod_ref(pod: Obj) -> str:
    meta = _meta(pod)
    return f"pod {meta.get('namespace', 'default')}/{meta.get('name', '?')}"


def is_gpu_node(node: Obj) -> bool:
    return runai.is_gpu_node(_strings(_meta(node).get("labels")))


# --- nodes ---------------------------------------------------------------------------------------


def build_node(node: Obj) -> NodeTopology:
    """A node's GPUs and MIG devices, without allocations. Raises TopologyError if unusable."""
    name = node_name(node)
    obj = f"node {name}"
    meta = _meta(node)
    labels = runai.parse_node_labels(_strings(meta.get("labels")), obj)
    annotations = _strings(meta.get("annotations"))
    layout = None
    mapping: dict[tuple[int, int], runai.MappedDevice] = {}
    model = model_for_product(labels.gpu_product)
    if labels.is_dynamic_mig_enabled:
        if model is None:
            raise TopologyError(
                obj,
                f"metadata.labels[{runai.LABEL_PRODUCT}]",
                f"{labels.gpu_product!r} is not a MIG-capable GPU in the catalog",
            )
        config = annotations.get(runai.ANNOTATION_MIG_CONFIG)
        if config:
            layout = runai.parse_mig_config(config, obj, labels.gpu_count)
        encoded = annotations.get(runai.ANNOTATION_MIG_MAPPING)
        if encoded:
            mapping = runai.parse_mig_mapping(encoded, obj)
    gpus = []
    for index in range(labels.gpu_count):
        migs: tuple[MigDevice, ...] | None = None
        if labels.is_dynamic_mig_enabled and model is not None:
            enabled = layout.enabled.get(index, True) if layout else True
            wanted = layout.devices.get(index, ()) if layout else ()
            migs = _mig_devices(model, index, wanted, mapping) if enabled else None
        gpus.append(Gpu(id=gpu_uuid(name, index), mig_devices=migs))
    memory = labels.gpu_memory
    raw_product = _strings(meta.get("labels")).get(runai.LABEL_PRODUCT, "")
    if model is not None and (memory == 0 or MIG_SUFFIX in raw_product):
        memory = model.total_memory_mib  # single strategy labels carry the MIG device's memory
    topo = NodeTopology(
        gpu_count=labels.gpu_count,
        gpu_memory=memory,
        gpu_product=labels.gpu_product,
        is_dynamic_mig_enabled=labels.is_dynamic_mig_enabled,
        gpus=tuple(gpus),
    )
    errors = node_errors(name, topo)
    if errors:
        raise errors[0]
    return topo


def _mig_devices(
    model: GpuModel,
    gpu_index: int,
    wanted: Iterable[tuple[int, str]],
    mapping: Mapping[tuple[int, int], runai.MappedDevice],
) -> tuple[MigDevice, ...]:
    wanted = tuple(wanted)
    mapped_positions = {pos for (gpu, pos) in mapping if gpu == gpu_index}
    if mapped_positions != {pos for pos, _ in wanted}:
        # The mapping describes another layout: run:ai rewrites it after a mig.config change,
        # and until then the new devices have no id.
        mapping = {}
    devices = []
    for position, profile_name in wanted:
        mapped = mapping.get((gpu_index, position))
        profile = model.profile(profile_name)
        if mapped is not None and mapped.gpu_instance_id is not None:
            gi = mapped.gpu_instance_id
        elif profile is not None and position < model.memory_slots:
            gi = model.gpu_instance_id(profile, position)
        else:
            gi = 0  # validation rejects the device right after; the id is never shown
        devices.append(
            MigDevice(
                name=profile_name,
                position=position,
                gpu_instance_id=gi,
                id=mapped.uuid if mapped else None,
            )
        )
    return tuple(devices)


# --- pods ----------------------------------------------------------------------------------------


def pod_node(pod: Obj) -> str | None:
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return str(name) if name else None


def holds_gpu(pod: Obj) -> bool:
    """Running pods hold their device; Succeeded and Failed pods have released it."""
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase == "Running" and pod_node(pod) is not None


def _first_container(pod: Obj) -> str:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if isinstance(containers, list) and containers and isinstance(containers[0], Mapping):
        return str(containers[0].get("name", ""))
    return ""


def _whole_gpus_requested(pod: Obj) -> int:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    total = 0
    for c in containers if isinstance(containers, list) else []:
        resources = c.get("resources") if isinstance(c, Mapping) else None
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        value = limits.get("nvidia.com/gpu") if isinstance(limits, Mapping) else None
        if value is not None and str(value).isdigit():
            total += int(str(value))
    return total


def _pod_order(pod: Obj) -> tuple[str, str, str]:
    """Older pods first, so an allocation never moves to another GPU while its pod lives."""
    meta = _meta(pod)
    return (
        str(meta.get("creationTimestamp", "")),
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
    )


def allocate(
    name: str, node: NodeTopology, pods: Iterable[Obj], warnings: list[TopologyError]
) -> NodeTopology:
    """The node with the devices its running pods hold, and their simulated usage."""
    model = model_for_product(node.gpu_product)
    gpus = [replace(g, status=None) for g in node.gpus]
    migs = [list(g.mig_devices) if g.mig_devices is not None else None for g in node.gpus]
    holders: dict[tuple[int, int], str] = {}
    for pod in sorted((p for p in pods if holds_gpu(p)), key=_pod_order):
        meta = _meta(pod)
        obj = pod_ref(pod)
        allocated_by = AllocatedBy(
            str(meta.get("namespace", "default")), str(meta.get("name", "")), _first_container(pod)
        )
        uid = str(meta.get("uid") or f"{allocated_by.namespace}/{allocated_by.pod}")
        annotation = _strings(meta.get("annotations")).get(runai.ANNOTATION_POD_MIG_DEVICE)
        if annotation:
            try:
                want = runai.parse_pod_mig_device(annotation, obj)
            except TopologyError as e:
                warnings.append(e)
                continue
            field = f"metadata.annotations[{runai.ANNOTATION_POD_MIG_DEVICE}]"
            devices = migs[want.gpu_index] if want.gpu_index < len(migs) else None
            found = [i for i, d in enumerate(devices or []) if d.position == want.position]
            if devices is None or not found:
                warnings.append(
                    TopologyError(
                        obj,
                        field,
                        f"node {name} has no MIG device at GPU {want.gpu_index} "
                        f"position {want.position}",
                    )
                )
                continue
            key = (want.gpu_index, want.position)
            if key in holders:
                warnings.append(TopologyError(obj, field, f"device already held by {holders[key]}"))
                continue
            dev = devices[found[0]]
            if dev.name != want.profile:
                warnings.append(
                    TopologyError(
                        obj, f"{field}.name", f"asks for {want.profile}, device is {dev.name}"
                    )
                )
            profile = model.profile(dev.name) if model else None
            fb_total = profile.fb_total_mib if profile else 0
            usage = pod_usage(pod, obj, fb_total, warnings)
            holders[key] = obj
            devices[found[0]] = replace(
                dev,
                # The pod names the device and its GI when the mapping has not caught up yet.
                id=dev.id or want.device_uuid,
                status=DeviceStatus(allocated_by, {uid: usage}),
            )
            continue
        count = _whole_gpus_requested(pod)
        if count == 0:
            continue
        free = [i for i, g in enumerate(gpus) if g.status is None and migs[i] is None]
        if len(free) < count:
            warnings.append(
                TopologyError(
                    obj,
                    "spec.containers[].resources.limits[nvidia.com/gpu]",
                    f"asks for {count} GPUs, node {name} has {len(free)} free",
                )
            )
            continue
        fb_total = model.fb_total_mib if model else node.gpu_memory
        usage = pod_usage(pod, obj, fb_total, warnings)
        for i in free[:count]:
            gpus[i] = replace(gpus[i], status=DeviceStatus(allocated_by, {uid: usage}))
    return replace(
        node,
        gpus=tuple(
            replace(g, mig_devices=tuple(m) if m is not None else None)
            for g, m in zip(gpus, migs, strict=True)
        ),
    )


# --- the whole topology --------------------------------------------------------------------------


def cluster_strategy(nodes: Iterable[Obj]) -> str:
    """The MIG strategy the GPU nodes are labelled with (the most common; `none` when unlabelled)."""
    seen = Counter(
        _strings(_meta(n).get("labels")).get(runai.LABEL_STRATEGY) for n in nodes if is_gpu_node(n)
    )
    seen.pop(None, None)
    if not seen:
        return "none"
    return sorted(seen.items(), key=lambda kv: (-kv[1], str(kv[0])))[0][0] or "none"


def reconcile(
    nodes: Iterable[Obj], pods: Iterable[Obj], previous: Topology | None = None
) -> tuple[Topology, list[TopologyError]]:
    """Desired topology and the problems found on the way.

    A node that cannot be read keeps its entry from `previous` (the live controller passes the
    last written topology) or is left out (offline render), never taking other nodes with it.
    """
    warnings: list[TopologyError] = []
    gpu_nodes = sorted((n for n in nodes if is_gpu_node(n)), key=node_name)
    pods_by_node: dict[str, list[Obj]] = {}
    for pod in pods:
        target = pod_node(pod)
        if target is not None:
            pods_by_node.setdefault(target, []).append(pod)
    result: dict[str, NodeTopology] = {}
    for node in gpu_nodes:
        name = node_name(node)
        try:
            built = build_node(node)
        except TopologyError as e:
            warnings.append(e)
            if previous is not None and name in previous.nodes:
                result[name] = previous.nodes[name]
            continue
        result[name] = allocate(name, built, pods_by_node.get(name, ()), warnings)
    return Topology(mig_strategy=cluster_strategy(gpu_nodes), nodes=result), warnings
