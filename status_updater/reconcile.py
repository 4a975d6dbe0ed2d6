"""Pure reconcile: one node's Node and Pods (Kubernetes JSON) -> that node's topology.

`render`, the live controller and the tests run exactly this code, through
`status_updater.state.ClusterState`, which keeps it incremental. Nothing here does I/O; every
problem in one object is returned as a TopologyError naming it, and the other objects are still
reconciled.
"""

from __future__ import annotations

import heapq
import math
import re
import uuid
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kube.times import timestamp
from status_updater import usage
from status_updater.usage import pod_usage
from topology import migparted, runai
from topology.catalog import MIG_SUFFIX, GpuModel, model_for_product
from topology.errors import TopologyError
from topology.model import (
    MIG_STRATEGIES,
    AllocatedBy,
    DeviceStatus,
    Gpu,
    MigDevice,
    NodeTopology,
    PodUsage,
    Replica,
    Topology,
)
from topology.sharing import (
    GPU_RESOURCE,
    SHARED_GPU_RESOURCE,
    SHARED_SUFFIX,
    base_resource,
    parse_sharing,
    shared_by_allocatable,
)
from topology.validate import node_errors

Obj = Mapping[str, Any]
# GPU ids are uuid5 of the node name and index: stable across runs, restarts and replicas.
_GPU_NAMESPACE = uuid.UUID("6f1c2a4e-3b7d-5e8f-9a0b-1c2d3e4f5a6b")
RELEASED_PHASES = ("Succeeded", "Failed")


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_GPU_NAMESPACE, f'{node_name}/{index}')}"


def mig_uuid(node_name: str, index: int, gpu_instance_id: int) -> str:
    """A static-MIG instance's id: stable for its node, GPU and GI (mig-manager's are random)."""
    return f"MIG-{uuid.uuid5(_GPU_NAMESPACE, f'{node_name}/{index}/{gpu_instance_id}')}"


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _strings(value: object) -> Mapping[str, str]:
    return value if isinstance(value, Mapping) else {}


def node_name(node: Obj) -> str:
    return str(_meta(node).get("name") or "")


def node_created(node: Obj) -> float:
    """When the Node was created, in seconds (never read: infinitely late)."""
    created = timestamp(_meta(node).get("creationTimestamp"))
    return math.inf if created is None else created


def node_uid(node: Obj) -> str | None:
    uid = _meta(node).get("uid")
    return uid if isinstance(uid, str) and uid else None


def _names(pod: Obj) -> tuple[str, str]:
    """Namespace and name; a pod from a file may leave its namespace out: kubectl's default."""
    meta = _meta(pod)
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def pod_key(pod: Obj) -> str:
    return "/".join(_names(pod))


def pod_ref(pod: Obj) -> str:
    return f"pod {pod_key(pod)}"


def is_gpu_node(node: Obj) -> bool:
    return runai.is_gpu_node(_strings(_meta(node).get("labels")))


def node_strategy(node: Obj) -> str | None:
    """The node's `nvidia.com/mig.strategy` if it is one (a bad value is the node's own error,
    never what the cluster's topology says)."""
    value = _strings(_meta(node).get("labels")).get(runai.LABEL_STRATEGY)
    return value if value in MIG_STRATEGIES else None


def static_layout(node: Obj) -> str | None:
    """The mig-parted layout a static-MIG node is labelled with (None on run:ai dynamic MIG)."""
    labels = _strings(_meta(node).get("labels"))
    value = labels.get(migparted.LABEL_CONFIG)
    dynamic = (
        labels.get(runai.LABEL_DYNAMIC_MIG) == "true"
        and labels.get(runai.LABEL_MIG_ENABLED) == "true"
    )
    return value if isinstance(value, str) and value and not dynamic else None


def is_single_strategy(node: Obj) -> bool:
    """GFD's single strategy: `nvidia.com/gpu` counts MIG devices (the GPU operator's default
    strategy, so a product label naming a profile without a strategy label is single too)."""
    strategy = node_strategy(node)
    product = _strings(_meta(node).get("labels")).get(runai.LABEL_PRODUCT)
    return strategy == "single" or (strategy is None and MIG_SUFFIX in str(product))


# --- what is kept of each object -----------------------------------------------------------------
# A cluster holds many times more than reconcile reads (managedFields, status, other annotations):
# the caches keep only these, in the same JSON shape, so the code below reads either form.

NODE_LABELS = (runai.LABEL_PRODUCT, runai.LABEL_COUNT, runai.LABEL_MEMORY, runai.LABEL_STRATEGY,
               runai.LABEL_DYNAMIC_MIG, runai.LABEL_MIG_ENABLED, migparted.LABEL_CONFIG)  # fmt: skip
NODE_ANNOTATIONS = (runai.ANNOTATION_MIG_CONFIG, runai.ANNOTATION_MIG_MAPPING)
POD_ANNOTATIONS = (
    runai.ANNOTATION_POD_MIG_DEVICE,
    usage.ANNOTATION_UTILIZATION,
    usage.ANNOTATION_FB_USED,
)
POD_LABELS = (usage.LABEL_INFERENCE,)


def _kept(value: object, keys: Iterable[str]) -> dict[str, Any]:
    """These keys' values as they are: an annotation that is no string is its object's error."""
    found = _strings(value)
    return {k: found[k] for k in keys if k in found}


def _only(value: object, keys: Iterable[str]) -> dict[str, Any]:
    """These keys' values as label text (see _label_text)."""
    found = _strings(value)
    return {k: text for k in keys if k in found and (text := _label_text(found[k])) is not None}


def _label_text(value: object) -> str | None:
    """A label value as the API holds it, a string. A file may hold YAML's
    `true` or `8` unquoted (kubectl would refuse it): read as the text it stands for. Anything
    else (a list, null, a float) is no value: as if the key were not there."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) < 10**18:
        return str(value)
    return None


def slim_node(node: Obj) -> dict[str, Any]:
    meta = _meta(node)
    slim: dict[str, Any] = {
        "kind": "Node",
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            "labels": _only(meta.get("labels"), NODE_LABELS) | _sharing_labels(meta),
            "annotations": _kept(meta.get("annotations"), NODE_ANNOTATIONS),
        },
    }
    advertised = _advertised_migs(node)
    if advertised:
        slim["status"] = {"allocatable": advertised}
    return slim


def _sharing_labels(meta: Mapping[str, Any]) -> dict[str, str]:
    """GFD's sharing labels: `<resource>.replicas` and `.sharing-strategy` of each resource."""
    return {
        k: text
        for k, v in _strings(meta.get("labels")).items()
        if isinstance(k, str)
        and k.startswith("nvidia.com/")
        and k.endswith((".replicas", ".sharing-strategy"))
        and (text := _label_text(v)) is not None
    }


def _advertised_migs(node: Obj) -> dict[str, str]:
    """The `nvidia.com/mig-<profile>` resources the device plugin advertises (allocatable, or
    capacity where a simulated node sets only that), and the renamed shared `nvidia.com/gpu.shared`."""
    status = node.get("status")
    status = status if isinstance(status, Mapping) else {}
    for key in ("allocatable", "capacity"):
        found = {
            k: str(v)
            for k, v in _strings(status.get(key)).items()
            if isinstance(k, str)
            and (k.startswith(runai.MIG_RESOURCE_PREFIX) or k == SHARED_GPU_RESOURCE)
        }
        if found:
            return found
    return {}


def slim_pod(pod: Obj) -> dict[str, Any]:
    meta = _meta(pod)
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    status = pod.get("status")
    containers = spec.get("containers")
    kept = []
    for c in containers if isinstance(containers, list) else []:
        if not isinstance(c, Mapping):
            continue
        resources = c.get("resources")
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        gpu_limits = {k: v for k, v in _strings(limits).items() if _is_gpu_resource(k)}
        kept.append({"name": c.get("name"), "resources": {"limits": gpu_limits}})
    return {
        "kind": "Pod",
        "metadata": {
            **{k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp")},
            "labels": _only(meta.get("labels"), POD_LABELS),
            "annotations": _kept(meta.get("annotations"), POD_ANNOTATIONS),
        },
        "spec": {"nodeName": spec.get("nodeName"), "containers": kept},
        "status": {"phase": status.get("phase") if isinstance(status, Mapping) else None},
    }


def may_hold_gpu(pod: Obj) -> bool:
    """Whether the pod can hold a device now: placed, not finished, asking for a MIG device or GPUs.

    Only these are kept: on a real cluster most pods never touch a GPU.
    """
    annotations = _strings(_meta(pod).get("annotations"))
    # A request for no device (`0`) holds nothing; any other, odd ones included, is kept: an
    # odd one to be said.
    return holds_gpu(pod) and (
        runai.ANNOTATION_POD_MIG_DEVICE in annotations
        or any(_count(value) != 0 for *_, value in _gpu_limits(pod))
    )


# --- nodes ---------------------------------------------------------------------------------------


def build_node(
    node: Obj,
    layouts: migparted.Layouts | None = None,
    warnings: list[TopologyError] | None = None,
) -> NodeTopology:
    """A node's GPUs and MIG devices, without allocations. Raises TopologyError if unusable.

    A static-MIG node takes its layout from `layouts` (mig-parted's, default the built-in ones);
    a layout that cannot be applied is a warning, and leaves MIG on with no instance.
    """
    name = node_name(node)
    obj = f"node {name}"
    meta = _meta(node)
    labels = runai.parse_node_labels(_strings(meta.get("labels")), obj)
    annotations = _strings(meta.get("annotations"))
    raw_product = str(_strings(meta.get("labels")).get(runai.LABEL_PRODUCT, ""))
    single = MIG_SUFFIX in raw_product  # GFD's single strategy: gpu.count counts MIG devices
    gpu_count = labels.gpu_count
    layout = None
    mapping: dict[tuple[int, int], runai.MappedDevice] = {}
    model = model_for_product(labels.gpu_product)
    static = (
        None
        if labels.is_dynamic_mig_enabled
        else _static_layouts(node, model, raw_product, gpu_count, layouts, warnings)
    )
    sharing = None
    if not labels.is_dynamic_mig_enabled:  # run:ai's dynamic MIG shares by its own fractions
        sharing = parse_sharing(_strings(meta.get("labels")), obj) or shared_by_allocatable(
            _advertised_migs(node), gpu_count
        )
    if static is not None:
        gpus = _static_gpus(name, model, static)
        memory = labels.gpu_memory
        if model is not None and (memory == 0 or single):
            memory = model.total_memory_mib
        if sharing is not None and sharing.strategy == "mps" and any(g.mig_devices for g in gpus):
            if warnings is not None:
                warnings.append(TopologyError(
                    obj, "metadata.labels[nvidia.com/gpu.sharing-strategy]",
                    "MPS cannot share MIG devices (the device plugin refuses it): not shared",
                ))  # fmt: skip
            sharing = None
        return _checked(
            name,
            NodeTopology(len(gpus), memory, labels.gpu_product, False, tuple(gpus), sharing),
        )
    if labels.is_dynamic_mig_enabled:
        if model is None:
            raise TopologyError(
                obj,
                f"metadata.labels[{runai.LABEL_PRODUCT}]",
                f"{labels.gpu_product!r} is not a MIG-capable GPU in the catalog",
            )
        config = _annotation(annotations, runai.ANNOTATION_MIG_CONFIG, obj)
        if config:
            layout = runai.parse_mig_config(config, obj, gpu_count)
        encoded = _annotation(annotations, runai.ANNOTATION_MIG_MAPPING, obj)
        if encoded:
            mapping = runai.parse_mig_mapping(encoded, obj)
        if single and layout is not None and layout.devices:
            gpu_count = _physical_gpus(layout, gpu_count)
    gpus = []
    refused: dict[int, list[tuple[int, int]]] = {}
    for index in range(gpu_count):
        migs: tuple[MigDevice, ...] | None = None
        if labels.is_dynamic_mig_enabled and model is not None:
            enabled = layout.enabled.get(index, True) if layout else True
            wanted = layout.devices.get(index, ()) if layout else ()
            if enabled:
                migs, not_taken = _mig_devices(model, index, wanted, mapping)
                if not_taken:
                    refused[index] = not_taken
        gpus.append(Gpu(id=gpu_uuid(name, index), mig_devices=migs))
    if refused and warnings is not None:
        warnings.append(_refused_ids_warning(obj, refused))
    memory = labels.gpu_memory
    if model is not None and (memory == 0 or single):
        memory = model.total_memory_mib  # single strategy labels carry the MIG device's memory
    topo = NodeTopology(
        gpu_count=gpu_count,
        gpu_memory=memory,
        gpu_product=labels.gpu_product,
        is_dynamic_mig_enabled=labels.is_dynamic_mig_enabled,
        gpus=tuple(gpus),
        sharing=sharing,
    )
    return _checked(name, topo)


def _checked(name: str, topo: NodeTopology) -> NodeTopology:
    errors = node_errors(name, topo)
    if errors:
        raise errors[0]
    return topo


def _static_layouts(
    node: Obj,
    model: GpuModel | None,
    raw_product: str,
    labelled: int,
    layouts: migparted.Layouts | None,
    warnings: list[TopologyError] | None,
) -> list[migparted.GpuLayout] | None:
    """Per GPU, what mig-manager leaves of a static-MIG node: the layout its label names, or
    (no label) what it advertises; None for a node that is neither. A layout that cannot be
    applied is a warning, and leaves MIG on with no instance."""
    obj = f"node {node_name(node)}"
    config_name = static_layout(node)
    if config_name is not None:
        found = migparted.builtin() if layouts is None else layouts
        count = labelled
        if MIG_SUFFIX in raw_product and model is not None:
            count = _single_strategy_gpus(found, config_name, model, raw_product, labelled, obj)

        def apply() -> list[migparted.GpuLayout]:
            return migparted.node_layout(found, config_name, model, count, obj)

    else:
        advertised = _advertised(node, model, raw_product, labelled) if model else None
        if model is None or advertised is None:
            return None
        count = len(advertised)

        def apply() -> list[migparted.GpuLayout]:
            out = []
            for i, counts in enumerate(advertised):
                try:
                    out.append(migparted.GpuLayout(True, migparted.place(model, counts)))
                except migparted.Unplaceable as e:  # no label to blame: what the node advertises
                    raise TopologyError(
                        obj, "status.allocatable", f"on GPU {i}: {e} (no {migparted.LABEL_CONFIG})"
                    ) from None
            return out

    try:
        return apply()
    except TopologyError as e:
        if warnings is not None:
            warnings.append(e)
        return [migparted.GpuLayout(True, ())] * count


def _single_strategy_gpus(
    layouts: migparted.Layouts,
    config_name: str,
    model: GpuModel,
    raw_product: str,
    labelled: int,
    obj: str,
) -> int:
    """Single strategy: gpu.count counts MIG devices of the product's profile. Per GPU, the
    layout's number of them; if the layout changed since GFD wrote the labels (a relabel of a
    simulated node), as many as fit, as in the all-<profile> layouts."""
    profile = model.profile(raw_product.split(MIG_SUFFIX, 1)[1])
    per_gpu = profile.max_count if profile else 1
    try:
        (first, *_) = migparted.node_layout(layouts, config_name, model, 1, obj)
        if profile is not None and {p for _, p in first.devices} == {profile.name}:
            per_gpu = len(first.devices)
    except TopologyError:
        pass  # reported when the layout is applied, with the node's real GPU count
    return max(1, -(-labelled // per_gpu))


def _advertised(
    node: Obj, model: GpuModel, raw_product: str, labelled: int
) -> list[tuple[tuple[str, int], ...]] | None:
    """A MIG node without `nvidia.com/mig.config` (a simulator that only advertises the
    resources): per GPU, the (profile, count)s its advertised instances imply, spread evenly
    (single strategy: `nvidia.com/gpu.count` of the product's profile, as many per GPU as fit)."""
    if MIG_SUFFIX in raw_product:
        profile = model.profile(raw_product.split(MIG_SUFFIX, 1)[1])
        if profile is None:
            return None
        totals = {profile.name: labelled}
        gpus = max(1, -(-labelled // profile.max_count))
    else:
        totals = {}
        for resource, value in _advertised_migs(node).items():
            # A shared profile's count is its instances times their replicas: not a layout.
            if resource.endswith(SHARED_SUFFIX) or not resource.startswith(
                runai.MIG_RESOURCE_PREFIX
            ):
                continue
            if _QUANTITY.fullmatch(value) and int(value) > 0:
                totals[resource.removeprefix(runai.MIG_RESOURCE_PREFIX)] = int(value)
        gpus = labelled
    if not totals:
        return None
    per_gpu = []
    for i in range(gpus):  # GPU i's share: the lower GPUs take the remainder
        shares = {p: n // gpus + (i < n % gpus) for p, n in totals.items()}
        per_gpu.append(tuple(sorted((p, k) for p, k in shares.items() if k)))
    return per_gpu


def _static_gpus(
    name: str, model: GpuModel | None, per_gpu: list[migparted.GpuLayout]
) -> list[Gpu]:
    """The GPUs of a static-MIG node with these instances, ids from node, GPU and GI."""
    gpus = []
    for index, layout in enumerate(per_gpu):
        migs: tuple[MigDevice, ...] | None = None
        if layout.mig_enabled and model is not None:
            devices = []
            for position, profile_name in layout.devices:
                profile = model.profile(profile_name)
                if profile is None:
                    continue  # never: placed from the catalog's profiles
                gi = model.gpu_instance_id(profile, position)
                devices.append(MigDevice(profile_name, position, gi, mig_uuid(name, index, gi)))
            migs = tuple(devices)
        gpus.append(Gpu(id=gpu_uuid(name, index), mig_devices=migs))
    return gpus


def _annotation(annotations: Mapping[str, object], key: str, obj: str) -> str | None:
    value = annotations.get(key)
    if value is not None and not isinstance(value, str):
        raise TopologyError(
            obj, f"metadata.annotations[{key}]", f"expected a string, got {value!r}"
        )
    return value


def _physical_gpus(layout: runai.MigLayout, labelled: int) -> int:
    """Under the single strategy `nvidia.com/gpu.count` is the number of MIG devices, not GPUs:
    take the GPUs the mig.config names (with `devices: all`, MIG devices / devices per GPU)."""
    named = max(layout.devices) + 1
    if named < labelled:
        return named
    per_gpu = max(len(d) for d in layout.devices.values()) or 1
    return max(1, labelled // per_gpu)


def _mig_devices(
    model: GpuModel,
    gpu_index: int,
    wanted: Iterable[tuple[int, str]],
    mapping: Mapping[tuple[int, int], runai.MappedDevice],
) -> tuple[tuple[MigDevice, ...], list[tuple[int, int]]]:
    """One GPU's instances, and the (position, GI id) of each mapped GI id that was not taken.

    fake-gpu-operator's mig-faker writes the GI *profile* id (19 for every 1g.5gb) as
    `gpu_instance_id`. So a mapped id is taken only where the driver could give it to that
    profile at that placement, in either orientation; the others are derived from the placement
    in the orientation the taken ones show (the model's where they show none). A GPU has one
    orientation, so its ids are distinct; where the taken ones mix both and two instances would
    get one id, none is taken.
    """
    wanted = tuple(wanted)
    if {pos for (gpu, pos) in mapping if gpu == gpu_index} != {pos for pos, _ in wanted}:
        # The mapping describes another layout: run:ai rewrites it after a mig.config change,
        # and until then the new devices have no id.
        mapping = {}
    profiles = {
        pos: p
        for pos, name in wanted
        if (p := model.profile(name)) is not None and pos < model.memory_slots
    }

    def derived(position: int, swapped: bool) -> int:
        profile = profiles.get(position)
        # 0 where validation rejects the device right after: that id is never shown.
        return 0 if profile is None else model.gpu_instance_id(profile, position, swapped)

    mapped = {
        pos: m.gpu_instance_id
        for pos, _ in wanted
        if (m := mapping.get((gpu_index, pos))) is not None and m.gpu_instance_id is not None
    }
    usable = {
        pos: gi
        for pos, gi in mapped.items()
        if pos in profiles and gi in model.gpu_instance_ids(profiles[pos], pos)
    }
    orientations = (model.swapped_halves, not model.swapped_halves)
    swapped = next(
        (s for s in orientations if all(derived(p, s) == gi for p, gi in usable.items())),
        model.swapped_halves,
    )
    ids = {pos: usable.get(pos, derived(pos, swapped)) for pos, _ in wanted}
    if len(set(ids.values())) < len(ids):
        ids = {pos: derived(pos, swapped) for pos, _ in wanted}
    devices = tuple(
        MigDevice(
            name=name,
            position=position,
            gpu_instance_id=ids[position],
            id=m.uuid if (m := mapping.get((gpu_index, position))) else None,
        )
        for position, name in wanted
    )
    return devices, [(pos, gi) for pos, gi in mapped.items() if ids[pos] != gi]


def _refused_ids_warning(obj: str, refused: Mapping[int, list[tuple[int, int]]]) -> TopologyError:
    """One line for all of a node's mapped GI ids that were not taken."""
    count = sum(map(len, refused.values()))
    gpu, [(position, gi), *_] = next(iter(refused.items()))
    return TopologyError(
        obj,
        f"metadata.annotations[{runai.ANNOTATION_MIG_MAPPING}]",
        f"{count} gpu_instance_id value(s) are not the GI id the driver gives that profile at "
        f"that placement (GPU {gpu} position {position}: {gi}; fake-gpu-operator writes "
        "profile ids): ids derived from the placements, device uuids kept",
    )


# --- pods ----------------------------------------------------------------------------------------


def pod_node(pod: Obj) -> str | None:
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return str(name) if name else None


def holds_gpu(pod: Obj) -> bool:
    """A pod placed on a node holds its device until it has Succeeded or Failed (or is deleted).

    Pending (being started) and Unknown (kubelet unreachable) pods keep it: run:ai does too.
    """
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase not in RELEASED_PHASES and pod_node(pod) is not None


def _first_container(pod: Obj) -> str:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if isinstance(containers, list) and containers and isinstance(containers[0], Mapping):
        return str(containers[0].get("name", ""))
    return ""


def _is_gpu_resource(name: object) -> bool:
    """`nvidia.com/gpu`, `nvidia.com/mig-<profile>`, or either renamed for sharing (`.shared`)."""
    return isinstance(name, str) and (
        base_resource(name) == GPU_RESOURCE or name.startswith(runai.MIG_RESOURCE_PREFIX)
    )


_QUANTITY = re.compile(r"[0-9]{1,6}")  # a device count; more than a million is no real request


def _gpu_limits(pod: Obj) -> Iterator[tuple[int, str, str, object]]:
    """(container index, container name, resource, value) of each GPU or MIG resource limit."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for i, c in enumerate(containers if isinstance(containers, list) else []):
        resources = c.get("resources") if isinstance(c, Mapping) else None
        limits = resources.get("limits") if isinstance(resources, Mapping) else None
        for resource, value in sorted(_strings(limits).items()):
            if _is_gpu_resource(resource):
                yield i, str(c.get("name", "")), str(resource), value


def _count(value: object) -> int | None:
    """A device count as the API writes one (decimal digits), or None."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int) else ""
    return int(text) if _QUANTITY.fullmatch(text) and not isinstance(value, bool) else None


def requests(pod: Obj) -> list[tuple[int, str, str, int]]:
    """(container index, container name, resource, count) of each GPU or MIG resource the
    pod's containers ask for (extended resources are whole numbers, their limit the request)."""
    return [
        (i, name, resource, count)
        for i, name, resource, value in _gpu_limits(pod)
        if (count := _count(value))
    ]


def odd_requests(pod: Obj) -> list[tuple[int, str, object]]:
    """(container index, resource, value) of each GPU or MIG resource asked for in something
    other than a whole number of devices (`1.5`, `500m`, `-1`): the API refuses such a pod, so
    one comes only from a file or an emulator, and is said, never silently left out."""
    return [(i, r, v) for i, _, r, v in _gpu_limits(pod) if _count(v) is None]


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
    return text if len(text) <= 40 else f"{text[:37]}..."


def _whole_gpus_requested(pod: Obj) -> int:
    return sum(n for _, _, resource, n in requests(pod) if base_resource(resource) == GPU_RESOURCE)


def _pod_order(pod: Obj) -> tuple[float, str, str]:
    """Older pods first (by time, not by text: writers format timestamps differently); a pod
    without a readable timestamp after all others."""
    meta = _meta(pod)
    created = timestamp(meta.get("creationTimestamp"))
    return (
        math.inf if created is None else created,
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
    )


class _Node:
    """A node's devices while pods are placed on them.

    The frozen dataclasses are built directly, not with dataclasses.replace: that introspects the
    fields on every call, and was a fifth of a pod event's time.
    """

    def __init__(
        self,
        name: str,
        node: NodeTopology,
        single: bool = False,
        kept: Kept | None = None,
        kept_replicas: KeptReplicas | None = None,
        named: Mapping[tuple[int, int | None], AllocatedBy] | None = None,
    ) -> None:
        self.name = name
        self.node = node
        # The single strategy's `nvidia.com/gpu` is a MIG instance where the GPUs have them.
        self.single = single and any(g.mig_devices for g in node.gpus)
        self.model = model_for_product(node.gpu_product)
        self.gpus = [Gpu(g.id, None, g.mig_devices) for g in node.gpus]
        self.migs = [list(g.mig_devices) if g.mig_devices is not None else None for g in node.gpus]
        self.holders: dict[tuple[int, int], str] = {}
        self.kept: Kept = kept or {}
        # Every device a pod still holds is its own while placement runs: an older pod that
        # lost some of its devices (a re-partition) must not take a younger pod's.
        self.reserved = {(g, d): uid for uid, held in self.kept.items() for g, d, _ in held}
        # Shared devices: (GPU, MIG device or None) -> replica index -> (pod uid, replica).
        self.replicas: dict[tuple[int, int | None], dict[int, Replica]] = {}
        self.kept_replicas: KeptReplicas = kept_replicas or {}
        self.named = named or {}  # shared devices -> the pod they named before
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
            Gpu(g.id, g.status, tuple(m) if m is not None else None)
            for g, m in zip(self.gpus, self.migs, strict=True)
        )
        return NodeTopology(
            n.gpu_count, n.gpu_memory, n.gpu_product, n.is_dynamic_mig_enabled, gpus, n.sharing
        )

    def place(self, pod: Obj, warnings: list[TopologyError]) -> None:
        meta = _meta(pod)
        obj = pod_ref(pod)
        for ci, resource, value in odd_requests(pod):
            # The kubelet would never run it: the pod holds nothing, as one that does not fit.
            raise TopologyError(
                obj,
                f"spec.containers[{ci}].resources.limits[{resource}]",
                f"expected a whole number of devices, got {_shown(value)}: not placed",
            )
        allocated_by = AllocatedBy(*_names(pod), _first_container(pod))
        uid = _uid(pod)
        if self.node.sharing is not None:
            self._place_shared(pod, obj, uid, warnings)
            return
        if not self.node.is_dynamic_mig_enabled:
            self._place_requested(pod, obj, uid, warnings)
            return
        annotation = _annotation(
            _strings(meta.get("annotations")), runai.ANNOTATION_POD_MIG_DEVICE, obj
        )
        if annotation:
            self._place_mig(
                pod, obj, runai.parse_pod_mig_device(annotation, obj), allocated_by, uid, warnings
            )
        else:
            self._place_whole(pod, obj, allocated_by, uid, warnings, _whole_gpus_requested(pod))

    def _place_requested(self, pod: Obj, obj: str, uid: str, warnings: list[TopologyError]) -> None:
        """Static MIG and whole GPUs: each container gets the devices its resources ask for,
        the lowest GPU index and GI id first, as the device plugin hands them out. A pod that
        does not fit gets nothing, as the kubelet admits a pod whole or not at all."""
        namespace, pod_name = _names(pod)
        taken: list[tuple[int, int, str]] = []  # (gpu index, device index, container)
        whole: list[tuple[int, str, int]] = []  # (container index, container, count)
        for ci, container, resource, count in requests(pod):
            if resource == GPU_RESOURCE and not self.single:
                whole.append((ci, container, count))
                continue
            profile = (
                None
                if resource == GPU_RESOURCE
                else resource.removeprefix(runai.MIG_RESOURCE_PREFIX)
            )
            held = {(g, d) for g, d, _ in taken}
            mine = {(g, d) for g, d, c in self.kept.get(uid, ()) if c == container}
            free = [
                (dev.gpu_instance_id, g, d)
                for g, devices in enumerate(self.migs)
                for d, dev in enumerate(devices or ())
                if dev.status is None
                and (profile is None or dev.name == profile)
                and (g, d) not in held
                and self.reserved.get((g, d), uid) == uid
            ]
            if len(free) < count:
                raise TopologyError(
                    obj,
                    f"spec.containers[{ci}].resources.limits[{resource}]",
                    f"asks for {count} {profile or 'MIG device'}, node {self.name} has "
                    f"{len(free)} free",
                )
            # What the container held before first, so nothing moves while it lives.
            chosen = sorted(free, key=lambda f: ((f[1], f[2]) not in mine, f[1], f[0]))[:count]
            taken += [(g, d, container) for _, g, d in chosen]
        wanted = sum(n for _, _, n in whole)
        free_gpus = self._free_gpus(uid)
        if wanted > len(free_gpus):
            ci = whole[0][0]
            raise TopologyError(
                obj,
                f"spec.containers[{ci}].resources.limits[{GPU_RESOURCE}]",
                f"asks for {wanted} GPUs, node {self.name} has {len(free_gpus)} free",
            )
        usages: dict[str, PodUsage] = {}
        for g, d, container in taken:
            devices = self.migs[g]
            assert devices is not None  # chosen from them
            dev = devices[d]
            if dev.name not in usages:
                profile_of = self.model.profile(dev.name) if self.model else None
                fb_total = profile_of.fb_total_mib if profile_of else 0
                usages[dev.name] = pod_usage(pod, obj, fb_total, warnings)
            status = DeviceStatus(
                AllocatedBy(namespace, pod_name, container), {uid: usages[dev.name]}
            )
            devices[d] = MigDevice(dev.name, dev.position, dev.gpu_instance_id, dev.id, status)
        at = 0
        for _, container, count in whole:
            self._hold(pod, obj, AllocatedBy(namespace, pod_name, container), uid, warnings,
                       free_gpus[at : at + count])  # fmt: skip
            at += count

    def _place_shared(self, pod: Obj, obj: str, uid: str, warnings: list[TopologyError]) -> None:
        """Replicas of shared devices, as the device plugin's `distributed` policy hands them
        out, container by container: one at a time, on the device with the fewest replicas
        taken (the pod's earlier containers' included), preferring devices not yet picked for
        this container, then the lowest GPU index and GI id; there, the lowest free replica.
        A pod keeps the replicas it held. A pod that does not fit gets nothing."""
        assert self.node.sharing is not None
        count_per_device = self.node.sharing.replicas
        namespace, pod_name = _names(pod)
        picks: list[tuple[int, int | None, int, str]] = []  # (gpu, MIG device, replica, container)
        taken: set[tuple[int, int | None, int]] = set()  # by this pod's earlier containers

        def free(g: int, d: int | None, r: int) -> bool:
            return (
                r not in self.replicas.get((g, d), {})
                and (g, d, r) not in taken
                and self.reserved_replicas.get((g, d, r), uid) == uid
            )

        for ci, container, resource, count in requests(pod):
            resource = base_resource(resource)
            profile = None if resource == GPU_RESOURCE else resource.removeprefix(
                runai.MIG_RESOURCE_PREFIX)  # fmt: skip
            devices = self._shared_devices(profile)
            known = set(devices)
            mine = [(g, d, r) for g, d, r, c in self.kept_replicas.get(uid, ())
                    if c == container and (g, d) in known and free(g, d, r)]  # fmt: skip
            chosen: list[tuple[int, int | None, int]] = mine[:count]
            held = set(chosen)
            # Per device, the replicas still free for this container, lowest first: built once
            # and taken from the front, as each pick takes a device's lowest. (Looking for it
            # again on every device at every pick made a large request cubic in the replicas.)
            open_replicas = {
                (g, d): deque(r for r in range(count_per_device)
                              if free(g, d, r) and (g, d, r) not in held)
                for g, d in devices
            }  # fmt: skip
            # This container's replicas per device; with those taken before (by other pods and
            # this pod's earlier containers: the kubelet allocates containers in turn), the load.
            picked = Counter((g, d) for g, d, _ in chosen)
            before = Counter((g, d) for g, d, _ in taken)
            load = {dev: len(self.replicas.get(dev, {})) + before[dev] for dev in devices}
            # The devices by what the next pick prefers; only the picked one's place changes.
            ranked = [(load[v] + picked[v], picked[v], self._order(v), v)
                      for v in devices if open_replicas[v]]  # fmt: skip
            heapq.heapify(ranked)
            for _ in range(count - len(chosen)):
                if not ranked:
                    what = profile or "GPU"
                    free_count = sum(
                        1 for dev in devices for r in range(count_per_device) if free(*dev, r)
                    )
                    raise TopologyError(
                        obj,
                        f"spec.containers[{ci}].resources.limits[{resource}]",
                        f"asks for {count} {what} replicas, node {self.name} has {free_count} free",
                    )
                *_, dev = heapq.heappop(ranked)
                chosen.append((*dev, open_replicas[dev].popleft()))
                picked[dev] += 1
                if open_replicas[dev]:
                    heapq.heappush(
                        ranked, (load[dev] + picked[dev], picked[dev], self._order(dev), dev)
                    )
            picks += [(g, d, r, container) for g, d, r in chosen]
            taken.update(chosen)
        usages: dict[tuple[int, int | None], PodUsage] = {}
        for g, d, r, container in picks:
            holder = AllocatedBy(namespace, pod_name, container)
            self.replicas.setdefault((g, d), {})[r] = Replica(r, holder, uid)
            if (g, d) not in usages:
                most, share = self._replica_memory(g, d)
                usages[g, d] = pod_usage(pod, obj, most, warnings, share)
        for g, d in usages:
            self._set_shared_status(g, d, uid, usages[g, d])

    def _shared_devices(self, profile: str | None) -> list[tuple[int, int | None]]:
        """The devices a shared resource's replicas come from: whole GPUs for `nvidia.com/gpu`
        (the MIG instances under GFD's single strategy), or the MIG instances of `profile`."""
        if profile is None and not self.single:
            return [(g, None) for g in range(len(self.gpus)) if self.migs[g] is None]
        return [(g, d) for g, devices in enumerate(self.migs) for d, dev in enumerate(devices or ())
                if profile is None or dev.name == profile]  # fmt: skip

    def _order(self, dev: tuple[int, int | None]) -> tuple[int, int]:
        g, d = dev
        devices = self.migs[g]
        return (g, -1 if d is None or devices is None else devices[d].gpu_instance_id)

    def _replica_memory(self, g: int, d: int | None) -> tuple[int, int]:
        """(the most one pod may use, its fair share) of the device in MiB: all of it under
        time-slicing (memory is not isolated), total / replicas under MPS (the control daemon's
        pinned memory limit); the share is total / replicas either way."""
        assert self.node.sharing is not None
        if d is None:
            total = self.model.fb_total_mib if self.model else self.node.gpu_memory
        else:
            devices = self.migs[g]
            assert devices is not None
            profile = self.model.profile(devices[d].name) if self.model else None
            total = profile.fb_total_mib if profile else 0
        share = total // self.node.sharing.replicas
        return (share if self.node.sharing.strategy == "mps" else total), share

    def _set_shared_status(self, g: int, d: int | None, uid: str, usage: PodUsage) -> None:
        """The device's status from its replicas: every holder's usage, and as `allocated-by`
        (the pod dcgm-exporter's default mode names) the pod it named before, while that pod
        holds a replica there; else the pod placed on it first: pods that held replicas place
        first, oldest first, so it is the pod that has shared it longest. (Not simply the first
        placed: a pod that kept its replica and an older newcomer place in the other order on
        the next pass, and the name would move.)"""
        replicas = tuple(sorted(self.replicas[g, d].values(), key=lambda r: r.index))
        old = self.gpus[g].status if d is None else (self.migs[g] or [])[d].status
        usages = {**(old.pod_gpu_usage_status if old else {}), uid: usage}
        named = self.named.get((g, d))
        if named is None or all(r.holder != named for r in replicas):
            first = old.allocated_by if old is not None else None
            named = first or next(r.holder for r in replicas if r.pod_uid == uid)
        status = DeviceStatus(named, usages, replicas)
        if d is None:
            gpu = self.gpus[g]
            self.gpus[g] = Gpu(gpu.id, status, gpu.mig_devices)
        else:
            devices = self.migs[g]
            assert devices is not None
            dev = devices[d]
            devices[d] = MigDevice(dev.name, dev.position, dev.gpu_instance_id, dev.id, status)

    def _free_gpus(self, uid: str) -> list[int]:
        """The free whole GPUs, those the pod held before first."""
        free = [i for i, g in enumerate(self.gpus) if g.status is None and self.migs[i] is None
                and self.reserved.get((i, None), uid) == uid]  # fmt: skip
        mine = {g for g, d, _ in self.kept.get(uid, ()) if d is None}
        return sorted(free, key=lambda i: (i not in mine, i))

    def _place_mig(
        self,
        pod: Obj,
        obj: str,
        want: runai.PodMigDevice,
        allocated_by: AllocatedBy,
        uid: str,
        warnings: list[TopologyError],
    ) -> None:
        field = f"metadata.annotations[{runai.ANNOTATION_POD_MIG_DEVICE}]"
        devices = self.migs[want.gpu_index] if want.gpu_index < len(self.migs) else None
        found = [i for i, d in enumerate(devices or []) if d.position == want.position]
        if devices is None or not found:
            raise TopologyError(
                obj,
                field,
                f"node {self.name} has no MIG device at GPU {want.gpu_index} position {want.position}",
            )
        key = (want.gpu_index, want.position)
        if key in self.holders:
            raise TopologyError(obj, field, f"device already held by {self.holders[key]}")
        dev = devices[found[0]]
        if dev.name != want.profile:
            warnings.append(
                TopologyError(
                    obj, f"{field}.name", f"asks for {want.profile}, device is {dev.name}"
                )
            )
        profile = self.model.profile(dev.name) if self.model else None
        usage = pod_usage(pod, obj, profile.fb_total_mib if profile else 0, warnings)
        self.holders[key] = obj
        name, position, gi, device_id = dev.name, dev.position, dev.gpu_instance_id, dev.id
        if dev.id is None and want.device_uuid is not None:
            # The mapping has not named the device yet; the pod's annotation does, and its GI.
            taken = {d.id for m in self.migs for d in m or () if d.id}
            if want.device_uuid in taken:
                warnings.append(
                    TopologyError(
                        obj, f"{field}.deviceUUID", f"{want.device_uuid} is another device's id"
                    )
                )
            else:
                device_id = want.device_uuid
                if want.gpu_instance_id is not None and want.gpu_instance_id != gi:
                    if self._may_take_gi(want.gpu_instance_id, dev, devices):
                        gi = want.gpu_instance_id
                    else:
                        warnings.append(TopologyError(
                            obj, f"{field}.gpuinstanceid",
                            f"{want.gpu_instance_id} is not the GI id the driver gives {dev.name} at "
                            f"position {dev.position}, or is another instance's: {gi} kept",
                        ))  # fmt: skip
        status = DeviceStatus(allocated_by, {uid: usage})
        devices[found[0]] = MigDevice(name, position, gi, device_id, status)

    def _may_take_gi(self, gi: int, dev: MigDevice, devices: list[MigDevice]) -> bool:
        """Whether a pod's annotation may give `dev` this GI id: one the driver could give its
        profile there, and no other instance's on the GPU (two would be one series)."""
        profile = self.model.profile(dev.name) if self.model else None
        return (
            self.model is not None
            and profile is not None
            and gi in self.model.gpu_instance_ids(profile, dev.position)
            and all(d.gpu_instance_id != gi for d in devices if d is not dev)
        )

    def _place_whole(
        self,
        pod: Obj,
        obj: str,
        allocated_by: AllocatedBy,
        uid: str,
        warnings: list[TopologyError],
        count: int,
    ) -> None:
        if count == 0:
            return
        free = self._free_gpus(uid)
        if len(free) < count:
            raise TopologyError(
                obj,
                "spec.containers[].resources.limits[nvidia.com/gpu]",
                f"asks for {count} GPUs, node {self.name} has {len(free)} free",
            )
        self._hold(pod, obj, allocated_by, uid, warnings, free[:count])

    def _hold(
        self,
        pod: Obj,
        obj: str,
        allocated_by: AllocatedBy,
        uid: str,
        warnings: list[TopologyError],
        indices: list[int],
    ) -> None:
        if not indices:
            return
        fb_total = self.model.fb_total_mib if self.model else self.node.gpu_memory
        usage = pod_usage(pod, obj, fb_total, warnings)
        for i in indices:
            gpu = self.gpus[i]
            self.gpus[i] = Gpu(gpu.id, DeviceStatus(allocated_by, {uid: usage}), gpu.mig_devices)


def _kept_statuses(
    node: NodeTopology, previous: NodeTopology | None
) -> Iterator[tuple[int, int | None, DeviceStatus]]:
    """(GPU index, MIG device index in `node` or None, status in `previous`) of each device that
    had a status in `previous` and that `node` still has: the same whole GPU, or a MIG device of
    the same profile with the same GPU instance id."""
    if previous is None:
        return
    for g, (now, before) in enumerate(zip(node.gpus, previous.gpus, strict=False)):
        if now.mig_devices is None and before.mig_devices is None and before.status is not None:
            yield g, None, before.status
        index = {(d.gpu_instance_id, d.name): i for i, d in enumerate(now.mig_devices or ())}
        for dev in before.mig_devices or ():
            d = index.get((dev.gpu_instance_id, dev.name))
            if d is not None and dev.status is not None:
                yield g, d, dev.status


# pod uid -> (GPU index, MIG device index or None for the whole GPU, container) it held
Kept = Mapping[str, tuple[tuple[int, int | None, str], ...]]


def held_devices(node: NodeTopology, previous: NodeTopology | None) -> Kept:
    """What each pod held in `previous` (the node's last result, or what the updater wrote
    before a restart) that `node`'s devices still have."""
    kept: dict[str, list[tuple[int, int | None, str]]] = {}
    for g, d, status in _kept_statuses(node, previous):
        holder = status.allocated_by
        for uid in status.pod_gpu_usage_status:
            kept.setdefault(uid, []).append((g, d, holder.container if holder else ""))
    return {uid: tuple(held) for uid, held in kept.items()}


# pod uid -> (GPU index, MIG device index or None, replica, container) it held on shared devices
KeptReplicas = Mapping[str, tuple[tuple[int, int | None, int, str], ...]]


def held_replicas(node: NodeTopology, previous: NodeTopology | None) -> KeptReplicas:
    """The replicas each pod held in `previous` on devices `node` still has (as held_devices)."""
    if previous is None or node.sharing is None or previous.sharing is None:
        return {}
    kept: dict[str, list[tuple[int, int | None, int, str]]] = {}
    for g, d, status in _kept_statuses(node, previous):
        for r in status.replicas:
            kept.setdefault(r.pod_uid, []).append((g, d, r.index, r.holder.container))
    limit = node.sharing.replicas  # fewer replicas now: those past the count are gone
    return {uid: tuple(h for h in held if h[2] < limit) for uid, held in kept.items()}


def named_holders(
    node: NodeTopology, previous: NodeTopology | None
) -> dict[tuple[int, int | None], AllocatedBy]:
    """The pod each shared device that `node` still has named in `previous`: it stays named for
    as long as it holds a replica there."""
    if previous is None or node.sharing is None or previous.sharing is None:
        return {}
    return {
        (g, d): status.allocated_by
        for g, d, status in _kept_statuses(node, previous)
        if status.replicas and status.allocated_by is not None
    }


def _uid(pod: Obj) -> str:
    meta = _meta(pod)
    return str(meta.get("uid") or pod_key(pod))


def allocate(
    name: str,
    node: NodeTopology,
    pods: Iterable[Obj],
    warnings: list[TopologyError],
    single: bool = False,
    previous: NodeTopology | None = None,
) -> NodeTopology:
    """The node with the devices its pods hold, and their simulated usage. `single`: the node
    is labelled with GFD's single strategy; `previous`: the node's last result, whose pods keep
    what they held there for as long as they live (older pods ending never moves them).

    A pod that cannot be placed is reported and skipped; the others are placed regardless.
    """
    holding = [p for p in pods if holds_gpu(p)]
    live = {_uid(p) for p in holding}
    kept = {uid: held for uid, held in held_devices(node, previous).items() if uid in live}
    replicas = {uid: held for uid, held in held_replicas(node, previous).items() if uid in live}
    state = _Node(name, node, single, kept, replicas, named_holders(node, previous))
    # Pods that held devices place first, then new pods, oldest first, in what is left.
    holders = kept.keys() | replicas.keys()
    for pod in sorted(holding, key=lambda p: (_uid(p) not in holders, _pod_order(p))):
        try:
            state.place(pod, warnings)
            continue
        except TopologyError as e:
            warnings.append(e)
        except Exception as e:  # the last guard: one odd object never stops the rest
            warnings.append(
                TopologyError(pod_ref(pod), "?", f"cannot be read: {type(e).__name__}: {e}")
            )
        # A pod that does not fit holds nothing, not even what it kept: what it kept is free for
        # the pods placed after it now, as it would be on the next pass, where it holds nothing.
        state.release(_uid(pod))
    return state.result()


def document(name: str, node: NodeTopology, strategy: str | None) -> Topology:
    """The `topology.yml` of one node: the cluster schema with just this node under `nodes:`."""
    return Topology(mig_strategy=strategy or "none", nodes={name: node})
