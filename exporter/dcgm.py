"""The series a real dcgm-exporter serves for one node, built from a topology snapshot.

Pure: `families(node, options, now)` -> metric families; `fragments` -> each family's series lines
of one node; `join` -> the bytes of `/metrics` for one node or many (the series of a family stay
together, under one HELP and TYPE). They run once per change of the snapshot (and on the
utilization tick, for nodes whose values move in time), never per scrape.

On a dynamic-MIG node (the real dumps in samples/mig/):

    # HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
    # TYPE DCGM_FI_DEV_FB_FREE gauge
    DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-…",device="nvidia0",modelName="NVIDIA A100-SXM4-40GB",
      GPU_I_PROFILE="1g.5gb",GPU_I_ID="7",Hostname="…",DCGM_FI_DRIVER_VERSION="520.56.06",
      container="",namespace="",pod=""} 4766

one series per MIG instance, no DCGM_FI_DEV_GPU_UTIL, pod labels empty. On other GPUs:
DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_FREE and DCGM_FI_DEV_FB_USED per GPU, with the pod that holds it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from topology.catalog import GpuModel, model_for_product, nvml_model_name
from topology.model import DeviceStatus, Gpu, MigDevice, NodeTopology

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_USED = "DCGM_FI_DEV_FB_USED"
HELP = {
    GPU_UTIL: "GPU utilization (in %).",
    FB_FREE: "Framebuffer memory free (in MiB).",
    FB_USED: "Framebuffer memory used (in MiB).",
}
MIG_LABELS = (
    "gpu", "UUID", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID", "Hostname",
    "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod",
)  # fmt: skip
ORDER = (GPU_UTIL, FB_FREE, FB_USED)  # dcgm-exporter's family order
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname", "container", "namespace", "pod")
DEFAULT_DRIVER_VERSION = "520.56.06"
# An instance nobody uses: what the A100-40GB dump `idle-1g.5gb-allocated` shows, FB_USED 6 and
# FB_FREE 4857 of 4864 MiB. DCGM floors used and free bytes separately, so their sum is a MiB short.
MIG_IDLE_FB_USED_MIB = 6
MIG_IDLE_ROUNDING_MIB = 1
# Simulated utilization is redrawn in steps of this many seconds (deterministic per pod and step).
UTILIZATION_STEP_S = 10


@dataclass(frozen=True)
class Options:
    hostname: str
    driver_version: str = DEFAULT_DRIVER_VERSION


Labels = tuple[tuple[str, str], ...]  # (name, value) in dcgm-exporter's order


@dataclass(frozen=True)
class Family:
    name: str
    samples: list[tuple[Labels, int]] = field(default_factory=list)

    @property
    def help(self) -> str:
        return HELP[self.name]


def utilization(status: DeviceStatus | None, now: float) -> int:
    """Percent busy at time `now`: each pod draws from its range, the same value all step long."""
    if status is None or not status.pod_gpu_usage_status:
        return 0
    step = int(now // UTILIZATION_STEP_S)
    total = 0
    for uid, usage in sorted(status.pod_gpu_usage_status.items()):
        lo, hi = usage.utilization.min, usage.utilization.max
        digest = hashlib.blake2b(f"{uid}/{step}".encode(), digest_size=8).digest()
        total += lo + round((hi - lo) * int.from_bytes(digest) / 2**64)
    return min(total, 100)


def _fb_used(status: DeviceStatus | None, fb_total: int) -> int:
    if status is None:
        return 0
    return min(sum(u.fb_used for u in status.pod_gpu_usage_status.values()), fb_total)


def _mig_fb(model: GpuModel, dev: MigDevice) -> tuple[int, int]:
    """(used, free) of one instance in MiB."""
    profile = model.profile(dev.name)
    if profile is None:  # validation keeps these out; stay total anyway
        return 0, 0
    used = _fb_used(dev.status, profile.fb_total_mib)
    if used == 0:
        used = MIG_IDLE_FB_USED_MIB
        return used, profile.memory_mib - used - MIG_IDLE_ROUNDING_MIB
    return used, profile.fb_total_mib - used


def _mig_order(model: GpuModel, dev: MigDevice) -> tuple[int, int]:
    # dcgm-exporter lists smaller instances first (the dump: 1g@4, 1g@6, then 2g@0).
    profile = model.profile(dev.name)
    return (profile.memory_slices if profile else 0, dev.position)


def families(node: NodeTopology, options: Options, now: float) -> list[Family]:
    """DCGM series of one node's GPUs at time `now` (seconds since the epoch)."""
    model = model_for_product(node.gpu_product)
    model_name = nvml_model_name(node.gpu_product)
    util, free, used = Family(GPU_UTIL), Family(FB_FREE), Family(FB_USED)
    for index, gpu in enumerate(node.gpus):
        base = (str(index), gpu.id, f"nvidia{index}", model_name)
        if gpu.mig_devices is not None and model is not None:
            for dev in sorted(gpu.mig_devices, key=lambda d: _mig_order(model, d)):
                values = (
                    *base, dev.name, str(dev.gpu_instance_id), options.hostname,
                    options.driver_version, "", "", "",
                )  # fmt: skip
                labels = tuple(zip(MIG_LABELS, values, strict=True))
                fb_used, fb_free = _mig_fb(model, dev)
                used.samples.append((labels, fb_used))
                free.samples.append((labels, fb_free))
            continue
        total = model.fb_total_mib if model else node.gpu_memory
        gpu_used = _fb_used(gpu.status, total)
        labels = tuple(zip(GPU_LABELS, (*base, options.hostname, *_holder(gpu)), strict=True))
        util.samples.append((labels, utilization(gpu.status, now)))
        used.samples.append((labels, gpu_used))
        free.samples.append((labels, total - gpu_used))
    return [f for f in (util, free, used) if f.samples]


def _holder(gpu: Gpu) -> tuple[str, str, str]:
    """container, namespace, pod of the pod holding a whole GPU (empty when free)."""
    a = gpu.status.allocated_by if gpu.status else None
    return (a.container, a.namespace, a.pod) if a else ("", "", "")


def moves_in_time(node: NodeTopology) -> bool:
    """Whether the node's values change with the clock: whole GPUs in use show utilization."""
    return any(
        gpu.mig_devices is None and gpu.status is not None and gpu.status.pod_gpu_usage_status
        for gpu in node.gpus
    )


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _series(f: Family) -> bytes:
    lines = []
    for labels, value in f.samples:
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        lines.append(f"{f.name}{{{text}}} {value}\n")
    return "".join(lines).encode()


def fragments(node: NodeTopology, options: Options, now: float) -> dict[str, bytes]:
    """The series lines of one node, per family: what `join` puts together."""
    return {f.name: _series(f) for f in families(node, options, now)}


_HEADERS = {name: f"# HELP {name} {HELP[name]}\n# TYPE {name} gauge\n".encode() for name in ORDER}


def join(parts: Iterable[Mapping[str, bytes]]) -> bytes:
    """Prometheus text format as dcgm-exporter writes it: integers print without a decimal point.

    `parts` are `fragments` of one or more nodes; each family is written once, its series in
    the order of `parts`.
    """
    parts = list(parts)
    out: list[bytes] = []
    for name in ORDER:
        chunks = [p[name] for p in parts if p.get(name)]
        if chunks:
            out.append(_HEADERS[name])
            out += chunks
    return b"".join(out)


def exposition(fams: Iterable[Family]) -> bytes:
    return join([{f.name: _series(f) for f in fams}])


def render(node: NodeTopology | None, options: Options, now: float) -> bytes:
    return b"" if node is None else join([fragments(node, options, now)])
