"""Parsers for the run:ai dynamic-MIG labels and annotations on Nodes and Pods.

Each parser is total: it returns a value or raises TopologyError naming the object and field.
Both generations of each annotation are real and both are accepted.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from mig_exporter.common.text import one_line
from mig_exporter.common.yamlload import load_document, load_json
from topology import migparted
from topology.catalog import base_product
from topology.errors import TopologyError

LABEL_DYNAMIC_MIG = "node-role.kubernetes.io/runai-dynamic-mig"
LABEL_MIG_ENABLED = "node-role.kubernetes.io/runai-mig-enabled"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_STRATEGY = "nvidia.com/mig.strategy"
ANNOTATION_MIG_CONFIG = "run.ai/mig.config"
ANNOTATION_MIG_MAPPING = "run.ai/mig-mapping"
ANNOTATION_POD_MIG_DEVICE = "runai-mig-device"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MAX_GPUS_PER_NODE = 64  # a sanity bound: the largest nodes carry 8 or 16


def _int(value: object, obj: str, field: str) -> int:
    """An int, also from a decimal string (`"1"`): run:ai writes both."""
    if isinstance(value, bool):
        raise TopologyError(obj, field, f"expected an integer, got {value!r}")
    if isinstance(value, int):
        result = value
    elif isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,9}\s*", value):
        result = int(value)
    else:
        raise TopologyError(obj, field, f"expected an integer, got {value!r}")
    if result < 0:
        raise TopologyError(obj, field, f"must be >= 0, got {result}")
    return result


# --- node labels ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeLabels:
    gpu_product: str  # the GPU model, without the single strategy's -MIG-<profile> suffix
    gpu_count: int
    gpu_memory: int
    mig_strategy: str | None
    is_dynamic_mig_enabled: bool


def is_gpu_node(labels: Mapping[str, str]) -> bool:
    return bool(labels.get(LABEL_PRODUCT))


def parse_node_labels(labels: Mapping[str, str], obj: str) -> NodeLabels:
    def label(key: str) -> str:
        return f"metadata.labels[{key}]"

    product = labels.get(LABEL_PRODUCT, "")
    if not isinstance(product, str) or not product:
        raise TopologyError(
            obj, label(LABEL_PRODUCT), f"expected a GPU model name, got {product!r}"
        )
    count = _int(labels.get(LABEL_COUNT, "1"), obj, label(LABEL_COUNT))
    if count > MAX_GPUS_PER_NODE:
        raise TopologyError(
            obj, label(LABEL_COUNT), f"{count} GPUs on one node is more than {MAX_GPUS_PER_NODE}"
        )
    memory = _int(labels.get(LABEL_MEMORY, "0"), obj, label(LABEL_MEMORY))
    strategy = labels.get(LABEL_STRATEGY)
    if strategy is not None and strategy not in ("none", "single", "mixed"):
        raise TopologyError(
            obj, label(LABEL_STRATEGY), f"must be none, single or mixed, got {strategy!r}"
        )
    dynamic = labels.get(LABEL_DYNAMIC_MIG) == "true" and labels.get(LABEL_MIG_ENABLED) == "true"
    return NodeLabels(base_product(product), count, memory, strategy, dynamic)


# --- run.ai/mig.config ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MigLayout:
    """What `run.ai/mig.config` asks for: per GPU index, MIG on/off and (position, profile)s."""

    enabled: Mapping[int, bool]
    devices: Mapping[int, tuple[tuple[int, str], ...]]


def parse_mig_config(text: str, obj: str, gpu_count: int) -> MigLayout:
    """mig-parted's format (topology/migparted.py) with one config, `selected`, at positions."""
    field = f"metadata.annotations[{ANNOTATION_MIG_CONFIG}]"
    try:
        doc = load_document(text)
    except yaml.YAMLError as e:
        raise TopologyError(obj, field, f"is not valid YAML: {one_line(e)}") from None
    configs = doc.get("mig-configs") if isinstance(doc, dict) else None
    selected = configs.get("selected") if isinstance(configs, dict) else None
    where = f"{field}.mig-configs.selected"
    if not isinstance(selected, list):
        raise TopologyError(obj, where, "expected a list")
    enabled: dict[int, bool] = {}
    devices: dict[int, tuple[tuple[int, str], ...]] = {}
    for i, entry in enumerate(migparted.entries(selected, obj, where, _positions)):
        indices = range(gpu_count) if entry.devices is None else entry.devices
        for k, index in enumerate(indices):
            if index >= gpu_count:
                raise TopologyError(
                    obj, f"{where}[{i}].devices[{k}]", f"GPU index {index} >= gpu count {gpu_count}"
                )
            enabled[index] = entry.mig_enabled
            devices[index] = tuple((pos, name) for name, pos in entry.mig_devices)
    return MigLayout(enabled, devices)


def _positions(value: object, obj: str, field: str) -> tuple[tuple[str, int], ...]:
    return tuple((name, pos) for pos, name in _mig_devices(value, obj, field))


def _mig_devices(value: object, obj: str, field: str) -> tuple[tuple[int, str], ...]:
    """`{0: 3g.20gb, 4: 1g.5gb}` (older) or `[{name: 3g.40gb, position: 4, size: 4}]` (current)."""
    if value is None:
        return ()
    pairs: list[tuple[int, str]] = []
    if isinstance(value, dict):
        for pos, name in value.items():
            where = f"{field}[{pos}]"
            if not isinstance(name, str) or not name:
                raise TopologyError(obj, where, f"expected a profile name, got {name!r}")
            pairs.append((_int(pos, obj, where), name))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            where = f"{field}[{i}]"
            if not isinstance(item, dict):
                raise TopologyError(obj, where, f"expected a mapping, got {item!r}")
            name = item.get("name")
            if not isinstance(name, str) or not name:
                raise TopologyError(obj, f"{where}.name", f"expected a profile name, got {name!r}")
            pairs.append((_int(item.get("position"), obj, f"{where}.position"), name))
    else:
        raise TopologyError(obj, field, f"expected a mapping or a list, got {value!r}")
    return tuple(sorted(pairs))


# --- run.ai/mig-mapping --------------------------------------------------------------------------


@dataclass(frozen=True)
class MappedDevice:
    uuid: str
    gpu_instance_id: int | None  # only the current format carries it


def parse_mig_mapping(text: str, obj: str) -> dict[tuple[int, int], MappedDevice]:
    """base64(JSON) -> {(gpu index, position): device}.

    `{"0": {"0": "MIG-…"}}` (older: index -> position -> uuid) or
    `{"1": [{"position": 4, "device_uuid": "MIG-…", "gpu_instance_id": 1}]}` (current).
    """
    field = f"metadata.annotations[{ANNOTATION_MIG_MAPPING}]"
    try:
        raw = base64.b64decode(text.strip(), validate=True)
        doc = load_json(raw)
    except (binascii.Error, ValueError) as e:
        raise TopologyError(obj, field, f"is not base64-encoded JSON: {one_line(e)}") from None
    if not isinstance(doc, dict):
        raise TopologyError(obj, field, f"expected a JSON object, got {type(doc).__name__}")
    mapping: dict[tuple[int, int], MappedDevice] = {}
    for gpu_key, devices in doc.items():
        gpu = _int(gpu_key, obj, f"{field}[{gpu_key}]")
        where = f"{field}[{gpu_key}]"
        entries: list[tuple[object, object, object, str]]
        if isinstance(devices, dict):
            entries = [(pos, uuid, None, f"{where}[{pos}]") for pos, uuid in devices.items()]
        elif isinstance(devices, list):
            entries = []
            for i, d in enumerate(devices):
                if not isinstance(d, dict):
                    raise TopologyError(obj, f"{where}[{i}]", f"expected an object, got {d!r}")
                gi = d.get("gpu_instance_id")
                entries.append((d.get("position"), d.get("device_uuid"), gi, f"{where}[{i}]"))
        else:
            raise TopologyError(obj, where, f"expected an object or a list, got {devices!r}")
        for pos, uuid, gi, w in entries:
            if not isinstance(uuid, str) or not uuid.startswith("MIG-"):
                raise TopologyError(obj, w, f"expected a MIG-<uuid> device id, got {uuid!r}")
            position = _int(pos, obj, f"{w}.position")
            instance = None if gi is None else _int(gi, obj, f"{w}.gpu_instance_id")
            mapping[(gpu, position)] = MappedDevice(uuid, instance)
    return mapping


# --- pod runai-mig-device ------------------------------------------------------------------------


@dataclass(frozen=True)
class PodMigDevice:
    profile: str  # 1g.5gb
    position: int
    gpu_index: int
    device_uuid: str | None
    gpu_instance_id: int | None


def parse_pod_mig_device(text: str, obj: str) -> PodMigDevice:
    """The pod annotation `runai-mig-device` (JSON); `gpuindex` may be an int or a string."""
    field = f"metadata.annotations[{ANNOTATION_POD_MIG_DEVICE}]"
    try:
        doc: Any = load_json(text)
    except ValueError as e:
        raise TopologyError(obj, field, f"is not JSON: {one_line(e)}") from None
    if not isinstance(doc, dict):
        raise TopologyError(obj, field, f"expected a JSON object, got {type(doc).__name__}")
    name = doc.get("name")
    if not isinstance(name, str) or not name.startswith(MIG_RESOURCE_PREFIX):
        raise TopologyError(
            obj, f"{field}.name", f"expected nvidia.com/mig-<profile>, got {name!r}"
        )
    uuid = doc.get("deviceUUID", doc.get("instanceid"))
    if uuid is not None and not isinstance(uuid, str):
        raise TopologyError(obj, f"{field}.deviceUUID", f"expected a string, got {uuid!r}")
    gi = doc.get("gpuinstanceid")
    return PodMigDevice(
        profile=name.removeprefix(MIG_RESOURCE_PREFIX),
        position=_int(doc.get("position"), obj, f"{field}.position"),
        gpu_index=_int(doc.get("gpuindex"), obj, f"{field}.gpuindex"),
        device_uuid=uuid or None,
        gpu_instance_id=None if gi is None else _int(gi, obj, f"{field}.gpuinstanceid"),
    )
