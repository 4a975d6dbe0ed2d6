"""A fake NVML: the pynvml calls the exporter makes, over GPUs built from the MIG catalog.

`FakeNvml(gpus).install(setattr)` replaces exactly those functions of the real pynvml module
(`FUNCTIONS`; a test checks the exporter calls no other). The real module's constants, error
classes and structures stay, so the exporter runs the code path it runs on a real GPU, and a
fault is the NVMLError pynvml itself would raise.

Each GPU answers as its kind does on real hardware: a GPU in MIG mode has no utilization, encoder
or decoder readings (NOT_SUPPORTED); a GPU without MIG support answers NOT_SUPPORTED to the MIG
calls; MIG memory is the catalog's MiB for the profile, less what the instance uses.

`python -m tests.support.fakenvml SCENARIO [exporter arguments]`, from the repository root, runs
`python -m exporter` over a scenario's fake, so the CLI can be tested in its own process as a user runs it.
"""

from __future__ import annotations

import sys
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from topology.catalog import GpuModel, Profile, model_for_product, nvml_model_name
from topology.model import NodeTopology

MIB = 1 << 20
FUNCTIONS = (
    "nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUUID", "nvmlDeviceGetName",
    "nvmlDeviceGetSerial", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetBrand", "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetFieldValues", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPcieReplayCounter",
    "nvmlDeviceGetRemappedRows", "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetEncoderUtilization", "nvmlDeviceGetDecoderUtilization",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetGpuInstanceById", "nvmlGpuInstanceGetInfo",
)  # fmt: skip


@dataclass
class FakeMig:
    profile: Profile
    start: int  # placement start, in memory slices
    gpu_instance_id: int
    used_bytes: int = 6 * MIB + 12_345  # an idle instance: the real dumps' 6 MiB

    @property
    def total_bytes(self) -> int:
        return self.profile.memory_mib * MIB


@dataclass
class FakeGpu:
    name: str
    uuid: str
    memory_mib: int  # total, reserved part included
    reserved_mib: int
    mig: bool | None  # None: the GPU cannot do MIG
    instances: list[FakeMig] = field(default_factory=list)
    serial: str = "1564720004631"
    minor: int = 0
    bus_id: bytes = b"00000000:07:00.0"  # pynvml gives bytes, as the C struct holds
    used_bytes: int = 512 * MIB + 77
    power_mw: int = 61_234
    limit_mw: int = 400_000
    energy_mj: int = 3_046_515_871
    sm_clock: int = 1410
    mem_clock: int = 1215
    temp_c: int = 31
    memory_temp_c: int | None = 33  # None: no memory sensor (GDDR)
    util: tuple[int, int] = (37, 12)
    enc_dec: tuple[int, int] = (0, 3)
    pcie_replays: int = 0
    # correctable, uncorrectable, pending, failed
    remapped: tuple[int, int, int, int] = (1, 0, 0, 0)
    mig_pending: bool | None = None  # MIG mode after the next reset; None: as now
    brand: int = 14  # NVML_BRAND_NVIDIA
    memory_temp_type: int = 1  # NVML_VALUE_TYPE_UNSIGNED_INT: how NVML hands the value over
    # Field id -> (NVML value type, value) that nvmlDeviceGetFieldValues answers, over the above:
    # any field, any type, any value (a NaN double) a driver might hand over; None: NOT_SUPPORTED.
    field_values: dict[int, tuple[int, int | float] | None] = field(default_factory=dict)


def catalog_gpu(
    model: GpuModel, name: str, index: int, layout: list[tuple[str, int]] | None
) -> FakeGpu:
    """A GPU of `model`: MIG on with `layout` ([(profile, start)]), or MIG off when None."""
    instances = []
    for profile_name, start in layout or []:
        profile = model.profile(profile_name)
        assert profile is not None, profile_name
        instances.append(FakeMig(profile, start, model.gpu_instance_id(profile, start)))
    return FakeGpu(
        name=name,
        uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{name}/{index}')}",
        memory_mib=model.total_memory_mib,
        reserved_mib=model.total_memory_mib - model.fb_total_mib,
        mig=layout is not None,
        instances=instances,
        minor=index,
        limit_mw=int(model.figures.max_power_w * 1000),
    )


def from_topology(node: NodeTopology) -> list[FakeGpu]:
    """The GPUs a node's topology describes, as NVML would list them (its UUIDs, its layout)."""
    model = model_for_product(node.gpu_product)
    assert model is not None, node.gpu_product
    name = nvml_model_name(node.gpu_product)
    gpus = []
    for index, gpu in enumerate(node.gpus):
        layout = None
        if gpu.mig_devices is not None:
            layout = [(d.name, d.position) for d in gpu.mig_devices]
        fake = catalog_gpu(model, name, index, layout)
        fake.uuid = gpu.id
        for inst, dev in zip(fake.instances, gpu.mig_devices or (), strict=True):
            inst.gpu_instance_id = dev.gpu_instance_id
        gpus.append(fake)
    return gpus


def without_mig(index: int = 0) -> FakeGpu:
    """An NVIDIA L4: no MIG, GDDR without a memory temperature sensor."""
    return FakeGpu(
        name="NVIDIA L4", uuid=f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'L4/{index}')}",
        memory_mib=23034, reserved_mib=464, mig=None, minor=index + 2, limit_mw=72_000,
        memory_temp_c=None, enc_dec=(4, 3),
    )  # fmt: skip


def h100_mixed(index: int = 0) -> FakeGpu:
    """An H100 80GB with mixed profiles: 3g.40gb@0, 1g.20gb@4, 1g.10gb@6 (slice 7 free)."""
    model = model_for_product("NVIDIA-H100-80GB-HBM3")
    assert model is not None
    layout = [("1g.10gb", 6), ("3g.40gb", 0), ("1g.20gb", 4)]  # NVML lists them in its own order
    return catalog_gpu(model, "NVIDIA H100 80GB HBM3", index, layout)


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None  # the MIG device slot
    gpu_instance: int | None = None


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu], driver: str = "550.127.05") -> None:
        self.gpus = gpus
        self.driver = driver
        self.calls: Counter[str] = Counter()
        self.fail: dict[str, int] = {}  # function -> the NVML error every call of it raises
        self.lost: set[int] = set()  # GPU indexes NVML calls lost
        self.memory_v2 = True  # False: a driver before R510, without nvmlDeviceGetMemoryInfo_v2
        self.initialised = False
        self.fields_asked: set[int] = set()  # the field ids nvmlDeviceGetFieldValues was asked

    def install(self, set_attribute: Callable[[Any, str, Any], None] = setattr) -> None:
        """Replace pynvml's functions with this fake's (`monkeypatch.setattr` in a test)."""
        for name in FUNCTIONS:
            set_attribute(pynvml, name, self._counted(name, getattr(self, name)))

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name in self.fail:
                raise pynvml.NVMLError(self.fail[name])
            if name != "nvmlInit" and not self.initialised:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
            handle = args[0] if args and isinstance(args[0], _Handle) else None
            if handle is not None and handle.gpu in self.lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return fn(*args, **kwargs)

        return call

    # --- the system --------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetNVMLVersion(self) -> str:
        return f"12.{self.driver}"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # --- a GPU or a MIG device ---------------------------------------------------------------

    def _gpu(self, h: _Handle) -> FakeGpu:
        return self.gpus[h.gpu]

    def _whole(self, h: _Handle) -> FakeGpu:
        """A GPU-level value: MIG device handles do not have it."""
        if h.mig is not None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self._gpu(h)

    def _mig(self, h: _Handle) -> FakeMig:
        assert h.mig is not None
        return self._gpu(h).instances[h.mig]

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        if h.mig is not None:
            return f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{self._gpu(h).uuid}/{h.mig}')}"
        return self._gpu(h).uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        gpu = self._gpu(h)
        return gpu.name if h.mig is None else f"{gpu.name} MIG {self._mig(h).profile.name}"

    def nvmlDeviceGetSerial(self, h: _Handle) -> str:
        return self._whole(h).serial

    def nvmlDeviceGetMinorNumber(self, h: _Handle) -> int:
        return self._whole(h).minor

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._whole(h).bus_id)

    def nvmlDeviceGetBrand(self, h: _Handle) -> int:
        return self._whole(h).brand

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        gpu = self._whole(h)
        if gpu.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pending = gpu.mig if gpu.mig_pending is None else gpu.mig_pending
        on, off = int(pynvml.NVML_DEVICE_MIG_ENABLE), int(pynvml.NVML_DEVICE_MIG_DISABLE)
        return [on if gpu.mig else off, on if pending else off]

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        gpu = self._whole(h)
        return {pynvml.NVML_CLOCK_SM: gpu.sm_clock, pynvml.NVML_CLOCK_MEM: gpu.mem_clock}[clock]

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._whole(h).temp_c

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: list[int]) -> Any:
        gpu = self._whole(h)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for value, field_id in zip(values, field_ids, strict=True):
            value.fieldId = field_id
            self.fields_asked.add(field_id)
            given: tuple[int, int | float] | None = None
            if field_id in gpu.field_values:
                given = gpu.field_values[field_id]
            elif field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and gpu.memory_temp_c is not None:
                given = (gpu.memory_temp_type, gpu.memory_temp_c)
            if given is not None:
                kind, number = given
                value.nvmlReturn = pynvml.NVML_SUCCESS
                value.valueType = kind
                member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal",
                          5: "siVal", 6: "usVal"}[kind]  # fmt: skip
                setattr(value.value, member, number)
            else:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        return self._whole(h).power_mw

    def nvmlDeviceGetPowerManagementLimit(self, h: _Handle) -> int:
        return self._whole(h).limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        return self._whole(h).energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        return self._whole(h).pcie_replays

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        return self._whole(h).remapped

    def _no_mig(self, h: _Handle) -> FakeGpu:
        """Utilization: a GPU in MIG mode has none (NVML answers NOT_SUPPORTED)."""
        gpu = self._whole(h)
        if gpu.mig:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        gpu = self._no_mig(h)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util
        return util

    def nvmlDeviceGetEncoderUtilization(self, h: _Handle) -> list[int]:
        return [self._no_mig(h).enc_dec[0], 167_000]

    def nvmlDeviceGetDecoderUtilization(self, h: _Handle) -> list[int]:
        return [self._no_mig(h).enc_dec[1], 167_000]

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> Any:
        if h.mig is not None:
            mig = self._mig(h)
            total, used, reserved = mig.total_bytes, mig.used_bytes, 0
        else:
            gpu = self._gpu(h)
            total, used = gpu.memory_mib * MIB, gpu.used_bytes
            reserved = gpu.reserved_mib * MIB
        if version is not None and not self.memory_v2:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if version is None:  # v1: the reserved part counts as used
            info = pynvml.c_nvmlMemory_t()
            info.total, info.used, info.free = total, used + reserved, total - used - reserved
            return info
        assert version == pynvml.nvmlMemory_v2
        info2 = pynvml.c_nvmlMemory_v2_t()
        info2.total, info2.reserved, info2.used = total, reserved, used
        info2.free = total - reserved - used
        return info2

    # --- MIG ---------------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        gpu = self._whole(h)
        if gpu.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, slot: int) -> _Handle:
        gpu = self._whole(h)
        if not gpu.mig or slot >= len(gpu.instances):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(h.gpu, mig=slot)

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        if h.mig is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(h).gpu_instance_id

    def nvmlDeviceGetGpuInstanceById(self, h: _Handle, gpu_instance_id: int) -> _Handle:
        gpu = self._whole(h)
        for slot, mig in enumerate(gpu.instances):
            if mig.gpu_instance_id == gpu_instance_id:
                return _Handle(h.gpu, gpu_instance=slot)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, h: _Handle) -> Any:
        assert h.gpu_instance is not None
        mig = self._gpu(h).instances[h.gpu_instance]
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = mig.gpu_instance_id, mig.profile.profile_id
        info.placement.start, info.placement.size = mig.start, mig.profile.memory_slices
        return info


SAMPLE_TOPOLOGY = Path(__file__).resolve().parents[2] / "samples/mig/topology/a100-40gb-active.yaml"


def a100_sample() -> list[FakeGpu]:
    """The A100-40GB of the shared sample: 2g.10gb@0, 1g.5gb@4, 1g.5gb@6, as its topology says."""
    from topology.configmap import parse_document

    topology = parse_document(SAMPLE_TOPOLOGY.read_text(), str(SAMPLE_TOPOLOGY))
    return from_topology(topology.nodes["qa-mig-worker-gpu-a100"])


def whole_a100s(node: str, count: int = 2) -> list[FakeGpu]:
    """A100-40GBs with MIG off, with the UUIDs the status updater gives a node's whole GPUs."""
    from status_updater.devices import gpu_uuid

    model = model_for_product("NVIDIA-A100-SXM4-40GB")
    assert model is not None
    gpus = [catalog_gpu(model, "NVIDIA A100-SXM4-40GB", i, None) for i in range(count)]
    for index, gpu in enumerate(gpus):
        gpu.uuid = gpu_uuid(node, index)
    return gpus


SCENARIOS: dict[str, Callable[[], list[FakeGpu]]] = {
    "a100-sample": a100_sample,
    "h100-mixed": lambda: [h100_mixed(0), without_mig(1)],
    "no-gpu": list,
}


def scenario(name: str) -> list[FakeGpu]:
    """A named scenario, or `whole-a100:NODE`: NODE's whole A100s as the updater names them."""
    kind, _, node = name.partition(":")
    return whole_a100s(node) if kind == "whole-a100" else SCENARIOS[name]()


if __name__ == "__main__":
    from exporter.cli import main

    FakeNvml(scenario(sys.argv[1])).install()
    sys.exit(main(["--source", "nvml", *sys.argv[2:]]))
