"""Real GPUs read through NVML (pynvml, package nvidia-ml-py): the simulated path's series, real values.

`open_nvml` loads and initialises NVML (or says in one line why it cannot); `collect` reads every
GPU and MIG device into a `NodeSample`; `entities` turns a sample into series subjects with the
one label builder of both paths (series.py), so `dcgm.subject_fragments` renders both. A collection
runs on its own interval and scrapes serve its last rendering: they never call NVML.

What NVML reads, per GPU: name (`modelName`), UUID, minor number (`device`), serial, brand, MIG
mode, clocks, temperatures, power and its limit, the energy counter, PCIe replays, remapped rows,
memory (v2, with the reserved part, where the driver has it), and with MIG off utilization,
encoder and decoder. Per MIG device: its GPU instance id, profile (from its name, as
`nvidia-smi -L` prints it), placement and memory. A MIG instance's series carry its GPU's clocks,
temperatures, power and energy, as DCGM's do. DCGM's own fields (profiling, XID, NVLink, ECC
counters, violations) are left out, not faked: zeros would read as an idle, healthy GPU.

A value NVML does not support on a GPU (NOT_SUPPORTED, NO_PERMISSION, a function the driver lacks)
is a series left out, and so is one NVML hands over as a double that is NaN or infinite (no
reading, as DCGM's blank values, which dcgm-exporter leaves out): `dcgm.value_text` writes only
finite floats. A GPU NVML calls lost, or that is no longer listed, has its series gone.
Any other failure fails the whole collection: the exporter keeps the last one and says why.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from exporter import dcgm
from exporter.fields import canonical
from exporter.readings import Reading
from exporter.series import InstanceSeries, Labels, Subject, gpu_subjects, in_output_order
from mig_exporter.common.text import one_line
from topology.model import NodeTopology

MIB = 1 << 20
# nvidia-smi's "Product Brand" names of NVML's nvmlBrandType_t, which DCGM_FI_DEV_BRAND carries.
BRANDS = {
    1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
    7: "NVIDIA Virtual Applications", 8: "NVIDIA Virtual PC", 9: "NVIDIA Virtual Compute Server",
    10: "NVIDIA RTX Virtual Workstation", 11: "NVIDIA Cloud Gaming", 12: "Quadro RTX",
    13: "NVIDIA RTX", 14: "NVIDIA", 15: "GeForce RTX", 16: "Titan RTX",
}  # fmt: skip
# NVML's answers that mean "this GPU has no such value", not "something is wrong".
_ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_FUNCTION_NOT_FOUND")


class NvmlUnavailable(Exception):
    """NVML cannot be used at all here: no package, no library, no driver, no GPU."""


class CollectionFailed(Exception):
    """An NVML call failed during a collection: which call, on which GPU, and NVML's reason."""


class _Lost(Exception):
    """NVML says the GPU is gone (fell off the bus): its series go, the others stay."""


@dataclass(frozen=True)
class Memory:
    """Framebuffer in MiB, as DCGM floors it: used and free separately."""

    used: int
    free: int
    total: int
    reserved: int | None  # NVML before memory v2 has no reserved part


@dataclass(frozen=True)
class Instance:
    """One MIG device: its GPU instance and that instance's memory."""

    gpu_instance_id: int
    profile: str  # `1g.5gb`: the GPU instance profile, the `GPU_I_PROFILE` label
    order: tuple[int, int]  # (memory slices, placement start): dcgm-exporter's series order
    memory: Memory


@dataclass(frozen=True)
class GpuSample:
    index: int
    minor: int
    uuid: str
    name: str
    pci_bus_id: str  # NVML's form, `00000000:07:00.0`
    serial: str
    brand: str
    mig: bool
    values: dict[str, int | float]  # Reading attribute -> value, for what NVML had
    instances: tuple[Instance, ...]


@dataclass(frozen=True)
class NodeSample:
    driver_version: str
    nvml_version: str
    gpus: tuple[GpuSample, ...]
    lost: tuple[str, ...] = ()  # GPUs NVML still lists but calls lost: "GPU 1 (GPU-…)"


def open_nvml() -> ModuleType:
    """pynvml, initialised, with at least one GPU; NvmlUnavailable (one line) otherwise."""
    try:
        nv = importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable(
            "--source nvml needs the nvidia-ml-py package (pip install nvidia-ml-py)"
        ) from None
    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        hint = ""
        if e.value in (nv.NVML_ERROR_LIBRARY_NOT_FOUND, nv.NVML_ERROR_DRIVER_NOT_LOADED):
            hint = ": is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?"
        raise NvmlUnavailable(f"NVML cannot start: {one_line(e)}{hint}") from None
    try:
        count = nv.nvmlDeviceGetCount()
    except nv.NVMLError as e:
        raise NvmlUnavailable(f"NVML cannot count the GPUs: {one_line(e)}") from None
    if count == 0:
        nv.nvmlShutdown()
        raise NvmlUnavailable("NVML sees no GPU on this machine")
    return nv


class _Reader:
    """The NVML calls of one collection, each failure named by call and GPU."""

    def __init__(self, nv: ModuleType) -> None:
        self.nv = nv
        self.absent = frozenset(getattr(nv, name) for name in _ABSENT)

    def call(
        self, where: str, name: str, *args: Any, absent: frozenset[int] = frozenset(), **kw: Any
    ) -> Any:
        """pynvml's `name`; None for an answer in `absent`, `_Lost` for a lost GPU."""
        try:
            return getattr(self.nv, name)(*args, **kw)
        except self.nv.NVMLError as e:
            if e.value in absent:
                return None
            if e.value == self.nv.NVML_ERROR_GPU_IS_LOST:
                raise _Lost(where) from None
            raise CollectionFailed(f"NVML {name} on {where}: {one_line(e)}") from None

    def optional(self, where: str, name: str, *args: Any, **kw: Any) -> Any:
        """A value a GPU may not have: None then."""
        return self.call(where, name, *args, absent=self.absent, **kw)


def text_of(value: str | bytes) -> str:
    # nvidia-ml-py returns str; releases before 11.515 returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _memory(info: Any) -> Memory:
    reserved = getattr(info, "reserved", None)
    return Memory(
        used=info.used // MIB,
        free=info.free // MIB,
        total=info.total // MIB,
        reserved=None if reserved is None else reserved // MIB,
    )


def profile_of(mig_device_name: str) -> str:
    """`NVIDIA A100-SXM4-40GB MIG 1g.5gb` -> `1g.5gb`; a compute instance smaller than its GPU
    instance (`MIG 1c.2g.10gb`) -> the GPU instance's profile, `2g.10gb`."""
    profile = mig_device_name.rsplit(" MIG ", 1)[-1].strip()
    head, _, rest = profile.partition(".")
    return rest if head.endswith("c") and rest else profile


def _field_value(reader: _Reader, where: str, handle: Any, field_id: int) -> int | float | None:
    """One NVML field value (nvmlDeviceGetFieldValues), None when the GPU does not have it."""
    found = reader.optional(where, "nvmlDeviceGetFieldValues", handle, [field_id])
    if not found:
        return None
    fv = found[0]
    nv = reader.nv
    if fv.nvmlReturn != nv.NVML_SUCCESS:
        return None
    kinds = {
        nv.NVML_VALUE_TYPE_DOUBLE: "dVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nv.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }
    attr = kinds.get(fv.valueType)
    value: int | float | None = getattr(fv.value, attr) if attr else None
    return value


def _values(reader: _Reader, where: str, h: Any, mig: bool) -> dict[str, int | float]:
    nv = reader.nv
    opt = reader.optional
    power = opt(where, "nvmlDeviceGetPowerUsage", h)
    limit = opt(where, "nvmlDeviceGetPowerManagementLimit", h)
    rows = opt(where, "nvmlDeviceGetRemappedRows", h)
    out: dict[str, int | float | None] = {
        "sm_clock": opt(where, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
        "mem_clock": opt(where, "nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM),
        "gpu_temp": opt(where, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
        "memory_temp": _field_value(reader, where, h, nv.NVML_FI_DEV_MEMORY_TEMP),
        "power": None if power is None else power / 1000,  # mW -> W
        "power_limit": None if limit is None else limit / 1000,
        "energy": opt(where, "nvmlDeviceGetTotalEnergyConsumption", h),  # mJ, as DCGM's
        "pcie_replay": opt(where, "nvmlDeviceGetPcieReplayCounter", h),
    }
    if rows is not None:
        corrected, uncorrected, _pending, failed = rows
        out |= {
            "remapped_correctable": corrected,
            "remapped_uncorrectable": uncorrected,
            "remap_failure": failed,
        }
    if not mig:  # NVML has no utilization for a GPU in MIG mode, nor does DCGM
        util = opt(where, "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            out |= {"gpu_util": util.gpu, "mem_copy_util": util.memory}
        enc = opt(where, "nvmlDeviceGetEncoderUtilization", h)
        dec = opt(where, "nvmlDeviceGetDecoderUtilization", h)
        out |= {"enc_util": None if enc is None else enc[0],
                "dec_util": None if dec is None else dec[0]}  # fmt: skip
        memory = opt(where, "nvmlDeviceGetMemoryInfo", h, version=nv.nvmlMemory_v2)
        if memory is None:  # a driver before memory v2 (R510)
            memory = opt(where, "nvmlDeviceGetMemoryInfo", h)
        if memory is not None:
            m = _memory(memory)
            out |= {"fb_used": m.used, "fb_free": m.free, "fb_reserved": m.reserved,
                    "fb_total": m.total}  # fmt: skip
    return {k: v for k, v in out.items() if v is not None}


def _instances(reader: _Reader, where: str, h: Any) -> tuple[Instance, ...]:
    nv = reader.nv
    out = []
    for slot in range(reader.call(where, "nvmlDeviceGetMaxMigDeviceCount", h)):
        found = frozenset({nv.NVML_ERROR_NOT_FOUND})  # an empty slot
        mh = reader.call(where, "nvmlDeviceGetMigDeviceHandleByIndex", h, slot, absent=found)
        if mh is None:
            continue
        mig_where = f"{where} MIG device {slot}"
        gi_id = reader.call(mig_where, "nvmlDeviceGetGpuInstanceId", mh)
        profile = profile_of(text_of(reader.call(mig_where, "nvmlDeviceGetName", mh)))
        memory = _memory(reader.call(mig_where, "nvmlDeviceGetMemoryInfo", mh))
        # Placement needs the GPU instance; where NVML will not say, GI id order is the order
        # of the slices within one size.
        gi = reader.optional(mig_where, "nvmlDeviceGetGpuInstanceById", h, gi_id)
        info = None if gi is None else reader.optional(mig_where, "nvmlGpuInstanceGetInfo", gi)
        order = (0, gi_id) if info is None else (info.placement.size, info.placement.start)
        out.append(Instance(gi_id, profile, order, memory))
    return tuple(sorted(out, key=lambda i: (i.order, i.gpu_instance_id)))


def _gpu(reader: _Reader, index: int) -> GpuSample:
    nv = reader.nv
    where = f"GPU {index}"
    h = reader.call(where, "nvmlDeviceGetHandleByIndex", index)
    uuid = text_of(reader.call(where, "nvmlDeviceGetUUID", h))
    where = f"GPU {index} ({uuid})"
    mode = reader.optional(where, "nvmlDeviceGetMigMode", h)  # NOT_SUPPORTED: no MIG
    mig = mode is not None and mode[0] == nv.NVML_DEVICE_MIG_ENABLE
    minor = reader.optional(where, "nvmlDeviceGetMinorNumber", h)
    brand = reader.optional(where, "nvmlDeviceGetBrand", h)
    pci = reader.optional(where, "nvmlDeviceGetPciInfo", h)
    return GpuSample(
        index=index,
        minor=index if minor is None else minor,
        uuid=uuid,
        name=text_of(reader.call(where, "nvmlDeviceGetName", h)),
        pci_bus_id=text_of(pci.busId) if pci is not None else "",
        serial=text_of(reader.optional(where, "nvmlDeviceGetSerial", h) or ""),
        brand=BRANDS.get(brand, "Unknown") if brand is not None else "",
        mig=mig,
        values=_values(reader, where, h, mig),
        instances=_instances(reader, where, h) if mig else (),
    )


def collect(nv: ModuleType) -> NodeSample:
    """Every GPU NVML lists, and its MIG devices. CollectionFailed when a call fails."""
    reader = _Reader(nv)
    driver = text_of(reader.call("the system", "nvmlSystemGetDriverVersion"))
    nvml_version = text_of(reader.call("the system", "nvmlSystemGetNVMLVersion"))
    gpus, lost = [], []
    for index in range(reader.call("the system", "nvmlDeviceGetCount")):
        try:
            gpus.append(_gpu(reader, index))
        except _Lost as e:
            lost.append(str(e))
    return NodeSample(driver, nvml_version, tuple(gpus), tuple(lost))


def _label_fields(sample: NodeSample, gpu: GpuSample, options: dcgm.Options) -> Labels:
    values = {
        "DCGM_FI_DRIVER_VERSION": sample.driver_version,
        "DCGM_FI_NVML_VERSION": sample.nvml_version,
        "DCGM_FI_DEV_BRAND": gpu.brand,
        "DCGM_FI_DEV_SERIAL": gpu.serial,
    }
    return tuple((name, values[canonical(name)]) for name in options.counters.labels)


def _reading(values: dict[str, int | float], memory: Memory | None = None) -> Reading:
    v: dict[str, Any] = dict.fromkeys(Reading._fields) | values
    if memory is not None:
        v |= {"fb_used": memory.used, "fb_free": memory.free, "fb_total": memory.total,
              "fb_reserved": memory.reserved}  # fmt: skip
    return Reading(**v)


def entities(
    sample: NodeSample, options: dcgm.Options, node: NodeTopology | None = None
) -> list[Subject]:
    """The sample's series subjects in dcgm-exporter's order, labelled as `dcgm.entities` labels
    the simulated ones (series.py).

    `node`, the topology of this node where one is available, names the pod holding each whole
    GPU (by UUID), and each MIG instance where the simulated path would (static MIG, or
    `mig_pod_labels`); without it the pod labels are empty.
    """
    whole = {g.id: g for g in node.gpus} if node else {}
    name_holders = node is not None and (options.mig_pod_labels or not node.is_dynamic_mig_enabled)
    # Each pod's own FB_USED and GPU_UTIL need its processes, which this path does not read
    # (dcgm-exporter maps their pids to pods through /proc): one copy per holder, the device's.
    attribution = replace(options.attribution, per_process=False)
    out: list[Subject] = []
    for gpu in sample.gpus:
        labels = dcgm.gpu_labels(options, index=gpu.index, uuid=gpu.uuid, minor=gpu.minor,
                                 model=gpu.name, fields=_label_fields(sample, gpu, options),
                                 bus=gpu.pci_bus_id)  # fmt: skip
        known = whole.get(gpu.uuid)
        # The pods of its instances, by GPU instance id, where they are named.
        named = {d.gpu_instance_id: d for d in known.mig_devices or ()} if known else {}
        instances = [
            InstanceSeries(
                profile=_profile(i, options), gpu_instance_id=i.gpu_instance_id,
                status=d.status if (d := named.get(i.gpu_instance_id)) and name_holders else None,
                reading=_reading(gpu.values, i.memory), uuid=d.id if d else None,
                nvml_profile=i.profile)
            for i in gpu.instances
        ]  # fmt: skip
        status = known.status if known else None
        reading = _reading(gpu.values)
        out += gpu_subjects(labels, reading, status, instances if gpu.mig else None, attribution)
    if options.generation.sorted_output:
        out = [out[k] for k in in_output_order(out)]
    return out


def _profile(instance: Instance, options: dcgm.Options) -> str:
    """GPU_I_PROFILE as the generation names it. DCGM's name needs the profile's memory, which
    NVML gives the instance's memory as (its total)."""
    slices = int(instance.profile.split("g.", 1)[0]) if "g." in instance.profile else 0
    return dcgm.profile_label(options.generation, instance.profile, slices, instance.memory.total)


def render(sample: NodeSample, options: dcgm.Options, node: NodeTopology | None = None) -> bytes:
    return dcgm.join([dcgm.subject_fragments(entities(sample, options, node), options)], options)
