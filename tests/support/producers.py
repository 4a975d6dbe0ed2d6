"""Nodes and Pods exactly as the real producers write them, for the conformance tests (issue #21).

Each function reproduces a documented format from its facts; nothing here calls the product.

- run-ai/fake-gpu-operator 0.2.0 (`fgo_node`). Its mig-faker reads run:ai's `run.ai/mig.config`
  annotation (YAML, one config `selected`, devices at positions). It writes two things. The
  first is `run.ai/mig-mapping`: base64 of compact JSON, GPU index -> `[{position, device_uuid,
  gpu_instance_id}]`, with a fresh random `MIG-<uuid4>` per instance. The `gpu_instance_id` it
  writes is the *profile* id from its 40GB or 80GB table, picked by a substring of the product
  label. The second is the label `nvidia.com/mig.config.state=success`. The node's other labels
  come from fake-gpu-operator's status-exporter and status-updater, and from run:ai (the
  dynamic-MIG node roles).
- run:ai's scheduler (`runai_pod`): the `runai-mig-device` annotation (>= 2.9 format) of a pod
  holding one instance. Its ids are copied from the node's mapping entry.
- The NVIDIA GPU operator (`gpu_operator_node`). mig-manager writes `nvidia.com/mig.config` (a
  layout of mig-parted's `config-default.yaml`, `MIG_PARTED_DEFAULT`) and `.config.state`. GPU
  feature discovery adds its labels under the single or mixed strategy. The device plugin fills
  `status.capacity` and `status.allocatable`.
- `device_plugin_pod`: a pod that asks for MIG instances, or for GPUs, in its resource limits.

Profile facts (placements, slices, SMs, engines, memory) are taken from the project's copy of
the reference, `tests/reference/mig-profiles.json`. Random values are drawn from the
`random.Random` passed in, so one seed always gives the same objects.
"""

from __future__ import annotations

import base64
import json
import random
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).resolve().parents[1] / "reference" / "mig-profiles.json"

Obj = dict[str, Any]
# One GPU's instances as a config lists them: (start memory slice, profile), in config order.
Layout = tuple[tuple[int, str], ...]


# --- the reference's profile facts ---------------------------------------------------------------


@dataclass(frozen=True)
class RefProfile:
    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int
    placements: tuple[int, ...]  # valid start memory slices
    multiprocessors: int
    memory_mib: int
    engines: tuple[int, int, int, int]  # copy, decoder, jpeg, ofa


@dataclass(frozen=True)
class RefModel:
    key: str
    product: str  # GFD's `nvidia.com/gpu.product`: the first NVML name, blanks as dashes
    memory_slots: int
    total_memory_mib: int
    profiles: Mapping[str, RefProfile]

    @property
    def compute_slots(self) -> int:
        return max(p.compute_slices for p in self.profiles.values())


def _first_int(value: object) -> int:
    """The first MiB figure of a per-driver-era mapping (`{"R520+": 4864, "exact": true}`)."""
    values = value.values() if isinstance(value, dict) else [value]
    found = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return found[0] if found else 0


@cache
def reference_model(key: str) -> RefModel:
    """A model of the reference (`A100-40GB`, `H100-80GB` ...) with its profiles."""
    doc = json.loads(REFERENCE.read_text())["gpus"][key]
    profiles = {}
    for p in doc["profiles"]:
        engines = [int(n) for n in str(p.get("ce_nvdec_jpeg_ofa") or "0/0/0/0").split("/")]
        profiles[p["name"]] = RefProfile(
            name=p["name"],
            compute_slices=p["compute_slices"],
            memory_slices=p["memory_slices"],
            max_instances=p["max_instances"],
            placements=tuple(sorted(x["start"] for x in p["placements"])),
            multiprocessors=p.get("sm_count") or 0,
            memory_mib=_first_int(p.get("memory_mib")),
            engines=(engines[0], engines[1], engines[2], engines[3]),
        )
    return RefModel(
        key=key,
        product=doc["models"][0].replace(" ", "-"),
        memory_slots=doc["memory_slots"],
        total_memory_mib=_first_int(doc.get("total_memory_mib")),
        profiles=profiles,
    )


def fits(model: RefModel, layout: Layout) -> bool:
    """Whether one GPU can hold these instances at these starts. Each start must be one of its
    profile's placements. The blocks must not overlap. The counts and compute slices must stay
    within what the GPU has."""
    used: set[int] = set()
    counts: dict[str, int] = {}
    compute = 0
    for start, name in layout:
        p = model.profiles[name]
        block = set(range(start, start + p.memory_slices))
        if start not in p.placements or block & used:
            return False
        used |= block
        counts[name] = counts.get(name, 0) + 1
        compute += p.compute_slices
        if counts[name] > p.max_instances:
            return False
    return compute <= model.compute_slots


def as_many_as_fit(model: RefModel, name: str) -> Layout:
    """All of one profile, as many as fit, each at the lowest free placement."""
    layout: Layout = ()
    for start in model.profiles[name].placements:
        if fits(model, (*layout, (start, name))):
            layout = (*layout, (start, name))
    return layout


def uuid4(rng: random.Random) -> uuid.UUID:
    """A random (version 4) UUID drawn from `rng`: google/uuid's `uuid.New()`, reproducibly."""
    return uuid.UUID(int=rng.getrandbits(128), version=4)


# --- run-ai/fake-gpu-operator 0.2.0 --------------------------------------------------------------

# mig-faker's `migInstanceNameToGpuInstanceId`. The product label picks the table by substring.
# Both tables hold profile ids, although the JSON key says `gpu_instance_id`.
FGO_PROFILE_IDS: Mapping[str, Mapping[str, int]] = {
    "40GB": {"1g.5gb": 19, "1g.5gb+me": 20, "1g.10gb": 15, "2g.10gb": 14, "3g.20gb": 9,
             "4g.20gb": 5, "7g.40gb": 0},
    "80GB": {"1g.10gb": 19, "1g.10gb+me": 20, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9,
             "4g.40gb": 5, "7g.80gb": 0},
}  # fmt: skip


def fgo_table(product_label: str) -> Mapping[str, int]:
    """The table mig-faker uses for a product. It raises for a product it does not support,
    and then the faker writes nothing."""
    for size in ("40GB", "80GB"):
        if size in product_label:
            return FGO_PROFILE_IDS[size]
    raise ValueError(f"gpuProduct {product_label} not supported")


@dataclass(frozen=True)
class FgoPool:
    """A node pool of fake-gpu-operator's Helm values, and the reference model it simulates."""

    gpu_product: str  # as configured: an NVML name, with blanks
    gpu_memory: int  # MiB, as the status-exporter labels it
    gpu_count: int
    model: str  # reference model key


# The built-in `a100` and `h100` profiles (templates/profiles/builtin.yaml, 8 devices each).
FGO_A100 = FgoPool("NVIDIA A100-SXM4-40GB", 40960, 8, "A100-40GB")
FGO_H100 = FgoPool("NVIDIA H100 80GB HBM3", 81920, 8, "H100-80GB")
# An A100-80GB has no built-in profile. It is a legacy pool with gpuProduct and gpuMemory.
FGO_A100_80GB = FgoPool("NVIDIA-A100-SXM4-80GB", 81920, 4, "A100-80GB")
# The upgrade e2e fixture's legacy pool (test/e2e/upgrade/fixtures/values-upgrade.yaml).
FGO_A100_UPGRADE = FgoPool("NVIDIA-A100-SXM4-40GB", 40000, 4, "A100-40GB")


def sanitize_label_value(value: str) -> str:
    """The status-exporter's `sanitizeLabelValue`. It turns every character outside
    `[a-zA-Z0-9._-]` into `-`, cuts the value at 63 characters, and trims non-alphanumerics
    from both ends."""
    value = re.sub(r"[^a-zA-Z0-9._-]", "-", value)[:63]
    return re.sub(r"^[^a-zA-Z0-9]+|[^a-zA-Z0-9]+$", "", value)


def fgo_mig_config(model: RefModel, gpus: Mapping[int, Layout | None]) -> str:
    """run:ai's `run.ai/mig.config`. It has one entry per GPU index. None stands for
    `mig-enabled: false`. `size` is the memory slice count, which the faker ignores."""
    lines = ["version: v1", "mig-configs:", "  selected:"]
    for index, layout in gpus.items():
        lines += [f"  - devices: [{index}]", f"    mig-enabled: {str(layout is not None).lower()}"]
        if not layout:
            lines.append("    mig-devices: []")
            continue
        lines.append("    mig-devices:")
        for start, name in layout:
            size = model.profiles[name].memory_slices
            lines += [
                f"      - name: {name}",
                f"        position: {start}",
                f"        size: {size}",
            ]
    return "\n".join(lines)


def fgo_mapping(product_label: str, gpus: Mapping[int, Layout | None], rng: random.Random) -> str:
    """mig-faker's `FakeMapping` for this config, as the annotation value.

    The entries go in config order, with every entry mapped whatever its `mig-enabled`. Each
    instance gets `MIG-<uuid4>` and its profile id. Go's `json.Marshal` writes the map's int
    keys as strings, sorted as strings, and the JSON is compact and base64-encoded.
    """
    table = fgo_table(product_label)
    mapping: dict[int, list[dict[str, Any]]] = {}
    for index, layout in gpus.items():
        mapping[index] = [
            {"position": start, "device_uuid": f"MIG-{uuid4(rng)}", "gpu_instance_id": table[name]}
            for start, name in layout or ()
        ]
    ordered = {str(k): mapping[k] for k in sorted(mapping, key=str)}
    return base64.b64encode(json.dumps(ordered, separators=(",", ":")).encode()).decode()


def read_mig_mapping(node: Obj) -> dict[int, Any]:
    """A node's `run.ai/mig-mapping`, decoded: GPU index -> its entries (a list of objects in
    the current format, `{position: uuid}` in the older one)."""
    text = node["metadata"]["annotations"]["run.ai/mig-mapping"]
    doc = json.loads(base64.b64decode(text))
    return {int(k): v for k, v in doc.items()}


def fgo_node(
    name: str,
    pool: FgoPool,
    gpus: Mapping[int, Layout | None],
    rng: random.Random,
    *,
    pool_name: str = "default",
    mig_strategy: str = "mixed",
) -> Obj:
    """A GPU node of a fake-gpu-operator cluster with run:ai dynamic MIG, after mig-faker has
    handled its `run.ai/mig.config`."""
    product = sanitize_label_value(pool.gpu_product)
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        # The user's pool label, which the status-updater selects nodes by.
        "run.ai/simulated-gpu-node-pool": pool_name,
        # status-exporter, labels_builder.go BuildNodeLabels
        "nvidia.com/gpu.memory": str(pool.gpu_memory),
        "nvidia.com/gpu.product": product,
        "nvidia.com/mig.strategy": mig_strategy,
        "nvidia.com/gpu.count": str(pool.gpu_count),
        "nvidia.com/gpu.present": "true",
        "run.ai/fake.gpu": "true",
        # status-updater, labels.go: a real (not KWOK) node gets all four
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dra-plugin-gpu": "true",
        "nvidia.com/gpu.deploy.compute-domain-dra-plugin": "true",
        # run:ai's dynamic MIG node roles. mig-faker's DaemonSet selects the first.
        "node-role.kubernetes.io/runai-dynamic-mig": "true",
        "node-role.kubernetes.io/runai-mig-enabled": "true",
        # mig-faker, set before the annotation
        "nvidia.com/mig.config.state": "success",
    }
    uid = str(uuid4(rng))
    annotations = {
        "run.ai/mig.config": fgo_mig_config(reference_model(pool.model), gpus),
        "run.ai/mig-mapping": fgo_mapping(product, gpus, rng),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": uid,
            "creationTimestamp": "2025-06-01T08:00:00Z",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {},
        "status": {},
    }


def runai_pod(
    name: str,
    namespace: str,
    node: str,
    gpu_index: int,
    entry: Mapping[str, Any],
    profile: str,
    gpu_type: str,
    created: str,
    rng: random.Random,
) -> Obj:
    """A pod that run:ai's scheduler placed on one MIG instance. `entry` is the node's
    mapping entry for that instance, whose ids the scheduler copies into `runai-mig-device`
    (>= 2.9: `gpuindex` a string, `deviceUUID` and `gpuinstanceid` as in the mapping)."""
    device = {
        "name": f"nvidia.com/mig-{profile}",
        "position": entry["position"],
        "gpuamount": int(profile.split("g.", 1)[0]),
        "deviceUUID": entry["device_uuid"],
        "gpuinstanceid": entry["gpu_instance_id"],
        "gpuindex": str(gpu_index),
        "gputype": gpu_type,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid4(rng)),
            "creationTimestamp": created,
            "labels": {"app": "runaijob", "project": namespace.removeprefix("runai-")},
            "annotations": {
                "runai-mig-device": json.dumps(device, separators=(",", ":")),
                f"nvidia.com/mig-{profile}": "1",
                "received-resource-type": "MigInstance",
                "runai-allocated-gpu-memory": "0",
                "runai-allocated-gpus": "0",
                "runai-allocated-mig-gpus": "1",
            },
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "runai-scheduler",
            "containers": [{"name": "main", "image": "gcr.io/run-ai-demo/quickstart"}],
        },
        "status": {"phase": "Running"},
    }


# --- the NVIDIA GPU operator: mig-manager, GPU feature discovery, the device plugin -------------

# mig-parted's deployments/systemd/config-default.yaml (the GPU operator's
# default-mig-parted-config): per model, layout -> {profile: count} on each GPU, None for MIG
# disabled. Every layout of the A100s and the H100-80GB; a sample of the A30's and the H200's.
_Layouts = dict[str, dict[str, int] | None]
_COMMON: _Layouts = {"all-disabled": None, "all-enabled": {}}
_EIGHT_SLOT_80GB: _Layouts = {
    "all-1g.10gb": {"1g.10gb": 7}, "all-1g.10gb.me": {"1g.10gb+me": 1},
    "all-1g.20gb": {"1g.20gb": 4}, "all-2g.20gb": {"2g.20gb": 3}, "all-3g.40gb": {"3g.40gb": 2},
    "all-4g.40gb": {"4g.40gb": 1}, "all-7g.80gb": {"7g.80gb": 1},
    "all-balanced": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
}  # fmt: skip
MIG_PARTED_DEFAULT: Mapping[str, Mapping[str, Mapping[str, int] | None]] = {
    "A100-40GB": _COMMON | {
        "all-1g.5gb": {"1g.5gb": 7}, "all-1g.5gb.me": {"1g.5gb+me": 1},
        "all-1g.10gb": {"1g.10gb": 4}, "all-2g.10gb": {"2g.10gb": 3},
        "all-3g.20gb": {"3g.20gb": 2}, "all-4g.20gb": {"4g.20gb": 1},
        "all-7g.40gb": {"7g.40gb": 1},
        "all-balanced": {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
    },
    "A100-80GB": _COMMON | _EIGHT_SLOT_80GB,
    "H100-80GB": _COMMON | _EIGHT_SLOT_80GB,
    "A30-24GB": _COMMON | {
        "all-1g.6gb": {"1g.6gb": 4}, "all-1g.6gb.me": {"1g.6gb+me": 1},
        "all-2g.12gb": {"2g.12gb": 2}, "all-4g.24gb": {"4g.24gb": 1},
        "all-balanced": {"1g.6gb": 2, "2g.12gb": 1},
    },
    "H200-141GB": _COMMON | {
        "all-1g.18gb": {"1g.18gb": 7}, "all-1g.35gb": {"1g.35gb": 4},
        "all-3g.71gb": {"3g.71gb": 2}, "all-7g.141gb": {"7g.141gb": 1},
        "all-balanced": {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
    },
}  # fmt: skip

# GFD's gpu.family and compute capability per model.
_ARCH = {"A100-40GB": ("ampere", 8, 0), "A100-80GB": ("ampere", 8, 0), "A30-24GB": ("ampere", 8, 0),
         "H100-80GB": ("hopper", 9, 0), "H200-141GB": ("hopper", 9, 0)}  # fmt: skip


# The reference has no measured total for the A30: nvidia-smi's nominal 24 GiB.
_A30_MEMORY_MIB = 24576


def _mig_device_labels(prefix: str, model: RefModel, profile: RefProfile, count: int) -> Obj:
    """GFD's labels of one MIG device type under `prefix`. That is `nvidia.com/gpu` (single
    strategy) or `nvidia.com/mig-<profile>` (mixed)."""
    copy, decoder, jpeg, ofa = profile.engines
    return {
        f"{prefix}.count": str(count),
        f"{prefix}.memory": str(profile.memory_mib),
        f"{prefix}.multiprocessors": str(profile.multiprocessors),
        f"{prefix}.product": f"{model.product}-MIG-{profile.name}",
        f"{prefix}.replicas": "1",
        f"{prefix}.slices.gi": str(profile.compute_slices),
        f"{prefix}.slices.ci": str(profile.compute_slices),
        f"{prefix}.engines.copy": str(copy),
        f"{prefix}.engines.decoder": str(decoder),
        f"{prefix}.engines.encoder": "0",
        f"{prefix}.engines.jpeg": str(jpeg),
        f"{prefix}.engines.ofa": str(ofa),
    }


def gpu_operator_node(
    name: str, model_key: str, layout: str, strategy: str, gpus: int, rng: random.Random
) -> Obj:
    """A static-MIG node of the NVIDIA GPU operator after mig-manager applied `layout` (a layout
    of mig-parted's default config) to each of its `gpus` GPUs. It has GFD's labels under
    `strategy` (`single` or `mixed`) and the device plugin's resources.

    Under the single strategy, `nvidia.com/gpu.product` carries `-MIG-<profile>`,
    `nvidia.com/gpu.count` counts MIG devices, and the device plugin advertises them as
    `nvidia.com/gpu`. That strategy needs every instance of the node to be of one profile.
    """
    model = reference_model(model_key)
    counts = MIG_PARTED_DEFAULT[model_key][layout]
    family, major, minor = _ARCH[model_key]
    labels: Obj = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.driver": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true",
        "nvidia.com/gpu.deploy.mig-manager": "true",
        "nvidia.com/cuda.driver.major": "535",
        "nvidia.com/cuda.driver.minor": "104",
        "nvidia.com/cuda.driver.rev": "05",
        "nvidia.com/gpu.family": family,
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/gpu.machine": "DGX-Server",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": strategy,
        # mig-manager
        "nvidia.com/mig.config": layout,
        "nvidia.com/mig.config.state": "success",
    }
    resources: dict[str, str]
    whole = {
        "nvidia.com/gpu.product": model.product,
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(model.total_memory_mib or _A30_MEMORY_MIB),
    }
    if counts is None:  # MIG off: whole GPUs, whatever the strategy
        labels |= whole | {"nvidia.com/gpu.replicas": "1"}
        resources = {"nvidia.com/gpu": str(gpus)}
    elif strategy == "single":
        if len(counts) != 1:
            raise ValueError(f"{layout}: the single strategy needs one profile, not {counts}")
        ((profile_name, per_gpu),) = counts.items()
        profile = model.profiles[profile_name]
        labels |= _mig_device_labels("nvidia.com/gpu", model, profile, per_gpu * gpus)
        resources = {"nvidia.com/gpu": str(per_gpu * gpus)}
    else:
        labels |= whole | {"nvidia.com/gpu.replicas": "0"}
        resources = {"nvidia.com/gpu": "0"}
        for profile_name, per_gpu in sorted(counts.items()):
            profile = model.profiles[profile_name]
            prefix = f"nvidia.com/mig-{profile_name}"
            labels |= _mig_device_labels(prefix, model, profile, per_gpu * gpus)
            resources[prefix] = str(per_gpu * gpus)
    node_resources = {"cpu": "64", "memory": "528279808Ki", "pods": "110"} | resources
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid4(rng)),
            "creationTimestamp": "2025-06-01T08:00:00Z",
            "labels": dict(sorted(labels.items())),
        },
        "spec": {},
        "status": {"capacity": node_resources, "allocatable": dict(node_resources)},
    }


def device_plugin_pod(
    name: str,
    namespace: str,
    node: str,
    containers: Sequence[tuple[str, Mapping[str, int]]],
    created: str,
    rng: random.Random,
) -> Obj:
    """A running pod whose containers ask the device plugin for resources: (container name,
    {`nvidia.com/mig-<profile>` or `nvidia.com/gpu`: count})."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid4(rng)),
            "creationTimestamp": created,
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": container,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "resources": {"limits": {k: str(v) for k, v in limits.items()}},
                }
                for container, limits in containers
            ],
        },
        "status": {"phase": "Running"},
    }
