"""Simulated readings of a node's GPUs at one collection: what DCGM would read from the hardware.

Deterministic for a topology and a time: values are sampled once per collection step
(`STEP_S`), every pod's utilization is drawn from its range by a hash of its uid and the step, and
everything else follows from that:

- activity (`PROF_GR_ENGINE_ACTIVE`) of an instance or whole GPU is its pods' utilization;
- the GPU's load is its instances' activity weighted by their compute slices (a fully busy 1g
  instance is 1/7 of an A100), or the whole GPU's utilization;
- power = the idle power of the GPU's mode + (power limit - idle) x load; temperatures follow
  power; the SM clock drops to idle only on an idle GPU with MIG off (DCGM shows it held at its
  maximum in MIG mode); the per-model figures are `catalog.Figures`;
- DRAM and pipe activity are fixed shares of activity, `MEM_COPY_UTIL` is DRAM activity in %;
- the energy counter integrates power over time (`EnergyMeter`).
An idle GPU therefore reads ~0 activity and its idle power, as the real idle dumps do.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from topology import faults
from topology.catalog import GENERIC_FIGURES, Figures, GpuModel
from topology.model import DeviceStatus, Fault, Gpu, MigDevice

STEP_S = 10  # simulated values are sampled (and utilization redrawn) every this many seconds
# An instance nobody uses: what the A100-40GB dump `idle-1g.5gb-allocated` shows, FB_USED 6 and
# FB_FREE 4857 of 4864 MiB. DCGM floors used and free bytes separately, so their sum is a MiB short.
MIG_IDLE_FB_USED_MIB = 6
MIG_IDLE_ROUNDING_MIB = 1
# Shares of activity, near the active dump's (DRAM 0.62 at 1.0 activity).
DRAM_SHARE, TENSOR_SHARE, SM_SHARE, OCCUPANCY_SHARE = 0.62, 0.25, 0.95, 0.45
FP64_SHARE, FP32_SHARE, FP16_SHARE = 0.05, 0.35, 0.15
# PCIe traffic in bytes/s: the idle dump's order of magnitude, plus what a busy GPU moves.
PCIE_IDLE_TX, PCIE_IDLE_RX, PCIE_BUSY_TX, PCIE_BUSY_RX = (
    16_000,
    12_000,
    2_000_000_000,
    4_000_000_000,
)
# Throttled (a thermal or power fault): the SM clock drops to this share of its most; a thermal
# slowdown holds the GPU this far above its hottest busy temperature.
THROTTLED_CLOCK_SHARE, THERMAL_RISE_C = 0.6, 12
XID_WINDOW_S = 300.0  # dcgm-exporter's --xid-count-window-size default, 300000 ms
# A counter "since boot" needs a boot: a fixed time per GPU (in the 30 days from 2025-01-01 UTC).
BOOT_EPOCH_S, BOOT_SPREAD_S = 1_735_689_600, 30 * 86_400


class Reading(NamedTuple):
    """One series subject's values: a whole GPU, a MIG instance, or a MIG GPU without instances.

    Built by keyword (nvml._reading, the tests), but in the simulation's hot constructor
    (`_activity_reading`, see _HOT_ORDER). A named tuple: 5,000 nodes make 200,000 of them every
    10-s step, and a tuple is far cheaper to make and keep than a frozen dataclass.

    Each value is read by the fields that declare it as their reading (fields.FIELDS, checked at
    import). None is a value the source does not have (NVML has no profiling fields): its series
    is left out, as dcgm-exporter leaves out a field DCGM cannot read. The simulation has every
    value.
    """

    sm_clock: int | None
    mem_clock: int | None
    gpu_temp: int | None
    memory_temp: int | None
    power: float | None
    power_limit: float | None
    energy: int | None
    gpu_util: int | None
    mem_copy_util: int | None
    activity: float | None
    sm_active: float | None
    sm_occupancy: float | None
    tensor: float | None
    fp64: float | None
    fp32: float | None
    fp16: float | None
    dram: float | None
    fb_used: int | None
    fb_free: int | None
    fb_reserved: int | None
    fb_total: int | None
    pcie_tx: int | None
    pcie_rx: int | None
    # DCGM's clocks-event reasons: GPU_IDLE on an idle GPU, what throttling sets (faults).
    clocks_event_reasons: int | None = 0
    # Errors and states a healthy GPU reads 0 for; faults move them (topology/faults.py), NVML
    # reads some on a real GPU.
    pcie_replay: int | None = 0
    enc_util: int | None = 0
    dec_util: int | None = 0
    remapped_uncorrectable: int | None = 0
    remapped_correctable: int | None = 0
    remap_failure: int | None = 0
    xid: int | None = 0  # the last Xid
    ecc_sbe: int | None = 0  # volatile and aggregate alike: no driver reload is simulated
    ecc_dbe: int | None = 0
    nvlink_crc_flit: int | None = 0
    nvlink_crc_data: int | None = 0
    power_violation: int | None = 0  # ns
    thermal_violation: int | None = 0  # ns
    # (Xid, events) DCGM recorded in the Xid-count window (DCGM_EXP_XID_ERRORS_COUNT), by Xid.
    xid_window: tuple[tuple[int, int], ...] | None = ()
    zero: int | None = 0  # fields only DCGM itself reads that no fault moves: 0 here


def step_of(now: float) -> int:
    return int(now // STEP_S)


def _draw(key: str) -> float:
    """A number in [0, 1) fixed by `key`."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) / 2**64


def fb_used(status: DeviceStatus | None, fb_total: int) -> int:
    if status is None:
        return 0
    return min(sum(u.fb_used for u in status.pod_gpu_usage_status.values()), fb_total)


class EnergyMeter:
    """`TOTAL_ENERGY_CONSUMPTION` of each GPU: a counter that never goes back.

    Within a process it integrates each step's power exactly, so its rate is the power series.
    A process does not know what the GPU drew before it started, so it starts each GPU at the most
    the GPU can have drawn since its boot (the power limit all along). Any earlier process's
    count is at most that, so the counter never decreases across restarts; it only jumps up.

    Within a process it never goes back either, per (node, GPU), whatever the clock does and
    however often a GPU goes and comes back (KWOK nodes come and go all day):
    - a clock that goes back adds nothing, and a GPU counts from where it was when it catches up;
    - a GPU that goes is no longer counted (the meter holds what is served, not all that ever
      was), but its last count is kept among the last `RETIRED` gone, and it comes back from
      there if it is still kept;
    - one forgotten since starts again as a new one does, at the most it can have drawn, taken
      at the latest time the meter has seen (not the clock's, which may have gone back). Its
      earlier count was no more, as long as its limit did not go down (a node re-created as a
      smaller model with the same GPU ids, which is also a new series: `modelName` changed):
      it began at that most and added at most its limit since, as power is capped at the limit
      and nothing counts before boot or for a clock that went back.
    """

    RETIRED = 4096  # gone GPUs whose last count is kept: about 1 MiB at most

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (node, GPU id) -> (time, mJ, W since): GPU ids are unique in a cluster the updater
        # describes, but not in every hand-written topology.
        self._gpus: dict[tuple[str, str], tuple[float, float, float]] = {}
        self._retired: dict[tuple[str, str], float] = {}  # gone GPUs' last mJ, oldest first
        self._latest = float("-inf")  # the latest time any GPU was read at

    def read(self, node: str, gpu_id: str, at: float, power_w: float, limit_w: float) -> int:
        with self._lock:
            self._latest = max(self._latest, at)
            boot = _boot(gpu_id)
            last = self._gpus.get((node, gpu_id))
            if last is None:
                t = self._latest  # not the clock's time: it may have gone back since
                most = limit_w * max(t - boot, 0.0) * 1000
                mj = max(most, self._retired.pop((node, gpu_id), 0.0))
            else:
                t, mj, drawn = last
                if at > t:  # a clock that went back adds nothing
                    # Nothing drawn before boot: the count stays within `limit x since boot`.
                    mj += drawn * (max(at, boot) - max(t, boot)) * 1000
                    t = at
            # A GPU draws at most its limit: more would count past where it would come back.
            self._gpus[node, gpu_id] = (t, mj, min(max(power_w, 0.0), limit_w))
            return int(mj)

    def drop(self, node: str, gpu_ids: Iterable[str]) -> None:
        """Stop counting GPUs that are gone; one that comes back starts again (never lower)."""
        with self._lock:
            for gpu_id in gpu_ids:
                last = self._gpus.pop((node, gpu_id), None)
                if last is not None:
                    self._retired[node, gpu_id] = last[1]
                    if len(self._retired) > self.RETIRED:
                        del self._retired[next(iter(self._retired))]

    def __len__(self) -> int:
        """GPUs being counted: those served now."""
        return len(self._gpus)


def _boot(gpu_id: str) -> float:
    """When the GPU booted: a fixed time per GPU, so a count "since boot" has a start."""
    return BOOT_EPOCH_S + int(_draw(f"boot/{gpu_id}") * BOOT_SPREAD_S)


def _mig_fb(model: GpuModel, dev: MigDevice) -> tuple[int, int, int]:
    """(used, free, total) of one instance in MiB."""
    profile = model.profile(dev.name)
    if profile is None:  # validation keeps these out; stay total anyway
        return 0, 0, 0
    used = fb_used(dev.status, profile.fb_total_mib)
    if used == 0:
        used = MIG_IDLE_FB_USED_MIB
        return used, profile.memory_mib - used - MIG_IDLE_ROUNDING_MIB, profile.memory_mib
    return used, profile.fb_total_mib - used, profile.memory_mib


# A GPU's own values, which each of its series carries: SM and memory clocks, GPU and memory
# temperatures, power and its limit, energy, utilization, memory copy utilization, PCIe TX and RX.
GpuLevel = tuple[int, int, int, int, float, float, int, int | None, int | None, int, int]
# The hot constructor below makes 200,000 readings a step at 5,000 nodes: it builds each from its
# values in Reading's order, with no keywords to parse (they took a quarter of a step). Its order
# is this, checked against Reading's fields at import; tests check it against keyword-built ones.
_HOT_ORDER = (
    "sm_clock", "mem_clock", "gpu_temp", "memory_temp", "power", "power_limit", "energy",
    "gpu_util", "mem_copy_util", "activity", "sm_active", "sm_occupancy", "tensor", "fp64",
    "fp32", "fp16", "dram", "fb_used", "fb_free", "fb_reserved", "fb_total", "pcie_tx", "pcie_rx",
    "clocks_event_reasons",
)  # fmt: skip
# What faults set, the rest of a Reading (each GPU's, in `_health`).
HEALTH_FIELDS = Reading._fields[len(_HOT_ORDER) :]
if Reading._fields[: len(_HOT_ORDER)] != _HOT_ORDER:
    raise ImportError("readings._HOT_ORDER is not Reading's first fields: make them agree")
HEALTHY = tuple(Reading._field_defaults[name] for name in HEALTH_FIELDS)  # a healthy GPU's
HOT = len(_HOT_ORDER)  # a healthy GPU's reading is its first HOT values and HEALTHY
BLANK = (None,) * len(HEALTH_FIELDS)  # none of them: a copy that serves other fields only
_new = tuple.__new__


def _activity_reading(
    level: GpuLevel,
    activity: float,
    fb: tuple[int | None, ...],
    health: tuple[object, ...],
    reasons: int,
) -> Reading:
    sm, mem, temp, mem_temp, power, limit, energy, util, copy, tx, rx = level
    used, free, reserved, total = fb
    return _new(Reading, (
        sm, mem, temp, mem_temp, power, limit, energy, util, copy, activity,
        activity * SM_SHARE, activity * OCCUPANCY_SHARE, activity * TENSOR_SHARE,
        activity * FP64_SHARE, activity * FP32_SHARE, activity * FP16_SHARE,
        activity * DRAM_SHARE, used, free, reserved, total, tx, rx, reasons, *health,
    ))  # fmt: skip


Pods = tuple[tuple[str, int, int], ...]  # (uid, lowest %, highest %) of each pod, by uid


def _pods(status: DeviceStatus | None) -> Pods:
    if status is None:
        return ()
    usage = sorted(status.pod_gpu_usage_status.items())
    return tuple((uid, u.utilization.min, u.utilization.max) for uid, u in usage)


def pod_percent(uid: str, lo: int, hi: int, step: int) -> int:
    """What one pod keeps its device busy in `step`, in percent: drawn from its range, the same
    value all step long."""
    return lo + round((hi - lo) * _draw(f"{uid}/{step}"))


def _utilization(pods: Pods, step: int) -> int:
    """Percent busy in `step`: its pods' together, at most 100."""
    return min(sum(pod_percent(uid, lo, hi, step) for uid, lo, hi in pods), 100)


@dataclass(frozen=True, slots=True)
class GpuPlan:
    """What a GPU reads that does not move in time: made once per topology, read every step."""

    gpu_id: str
    figures: Figures
    mig: bool  # one reading per instance, the GPU's own without memory
    pods: Pods  # with MIG off: the pods using the whole GPU
    fb: tuple[int | None, int | None, int | None, int | None]  # used, free, reserved, total
    # With MIG on, each instance: its pods, its compute slices, (used, free, total) MiB.
    instances: tuple[tuple[Pods, int, tuple[int, int, int]], ...]
    slots: int = 1  # the GPU's compute slices
    faults: tuple[Fault, ...] = ()  # its faults (topology/faults.py), past, present and ahead
    counted: tuple[tuple[str, int], ...] = ()  # what its cleared faults counted
    xid_window_s: float = XID_WINDOW_S  # DCGM_EXP_XID_ERRORS_COUNT's window


def plan_gpu(
    gpu: Gpu,
    model: GpuModel | None,
    gpu_memory: int,
    instances: tuple[MigDevice, ...],
    xid_window_s: float = XID_WINDOW_S,
) -> GpuPlan:
    """`instances`: the GPU's MIG instances in the order their readings are wanted."""
    figures = model.figures if model else GENERIC_FIGURES
    if gpu.mig_devices is not None and model is not None:
        shares = []
        for dev in instances:
            profile = model.profile(dev.name)
            slices = profile.compute_slices if profile else 0
            shares.append((_pods(dev.status), slices, _mig_fb(model, dev)))
        # A MIG GPU's own series (with no instance) has no memory.
        return GpuPlan(gpu_id=gpu.id, figures=figures, mig=True, pods=(),
                       fb=(None, None, None, None), instances=tuple(shares),
                       slots=model.compute_slots, faults=gpu.faults, counted=gpu.counted,
                       xid_window_s=xid_window_s)  # fmt: skip
    total = model.fb_total_mib if model else gpu_memory
    reserved = model.total_memory_mib - total if model else 0
    used = fb_used(gpu.status, total)
    fb = (used, total - used, reserved, total + reserved)
    return GpuPlan(gpu_id=gpu.id, figures=figures, mig=False, pods=_pods(gpu.status), fb=fb,
                   instances=(), faults=gpu.faults, counted=gpu.counted,
                   xid_window_s=xid_window_s)  # fmt: skip


def read_gpu(
    gpu: Gpu,
    model: GpuModel | None,
    gpu_memory: int,
    now: float,
    energy: tuple[EnergyMeter, str],
    instances: tuple[MigDevice, ...],
) -> tuple[Reading, list[Reading]]:
    """The GPU's own reading and one per instance (of `instances`, in their order). `energy` is
    the meter and the name it keeps this node's counters under (the series' Hostname)."""
    return read_plan(plan_gpu(gpu, model, gpu_memory, instances), now, energy)


def read_plan(
    plan: GpuPlan, now: float, energy: tuple[EnergyMeter, str]
) -> tuple[Reading, list[Reading]]:
    """`read_gpu` of a planned GPU: only what moves in time is worked out."""
    figures = plan.figures
    step = step_of(now)
    if plan.mig:
        activities = [_utilization(pods, step) / 100 for pods, _, _ in plan.instances]
        load = 0.0
        for a, (_, slices, _) in zip(activities, plan.instances, strict=True):
            load += a * slices / plan.slots
        load = min(load, 1.0)
        # DCGM has no utilization for a GPU in MIG mode: None, never served.
        idle_w, gpu_util, sm_clock = figures.mig_idle_power_w, None, figures.sm_clock_max_mhz
    else:
        gpu_util = _utilization(plan.pods, step)
        load = gpu_util / 100
        idle_w = figures.idle_power_w
        sm_clock = figures.sm_clock_max_mhz if gpu_util else figures.sm_clock_idle_mhz
    health, throttled = HEALTHY, None
    draw = load  # the share of its power limit it draws above idle
    if plan.faults or plan.counted:
        throttled = faults.state(plan.faults, plan.counted, step * STEP_S)
        events = faults.xid_events(plan.faults, step * STEP_S, plan.xid_window_s)
        health = _health(throttled, events)
        if throttled.power:  # held at its limit, whatever it runs: what it runs stays its pods'
            draw = 1.0
    # Power wanders by up to half a watt from step to step, as a real sensor's does.
    wander = _draw(f"power/{plan.gpu_id}/{step}") - 0.5
    power = round(
        min(idle_w + (figures.max_power_w - idle_w) * draw + wander, figures.max_power_w), 3
    )
    heat = (power - figures.idle_power_w) / (figures.max_power_w - figures.idle_power_w)
    gpu_temp = round(
        figures.gpu_temp_idle_c + (figures.gpu_temp_max_c - figures.gpu_temp_idle_c) * heat
    )
    if throttled is not None and (throttled.thermal or throttled.power):
        # Throttling lowers the clock, never raises it: an idle GPU's stays at its idle clock.
        sm_clock = min(sm_clock, round(figures.sm_clock_max_mhz * THROTTLED_CLOCK_SHARE))
        if throttled.thermal:
            gpu_temp = figures.gpu_temp_max_c + THERMAL_RISE_C
    meter, node = energy
    joules = meter.read(node, plan.gpu_id, step * STEP_S, power, figures.max_power_w)
    level: GpuLevel = (
        sm_clock, figures.mem_clock_mhz, gpu_temp, gpu_temp + figures.memory_temp_offset_c,
        power, figures.max_power_w, joules, gpu_util,
        None if gpu_util is None else round(100 * load * DRAM_SHARE),
        PCIE_IDLE_TX + round(PCIE_BUSY_TX * load), PCIE_IDLE_RX + round(PCIE_BUSY_RX * load),
    )  # fmt: skip
    # The clocks-event reasons are the GPU's: idle (clocks down because nothing runs; not one
    # held at its power limit), throttled.
    reasons = (0 if draw else faults.GPU_IDLE) | (throttled.reasons if throttled else 0)
    if not plan.mig:
        return _activity_reading(level, load, plan.fb, health, reasons), []
    gpu_reading = _activity_reading(level, 0.0, plan.fb, health, reasons)
    out = [
        _activity_reading(level, a, (u, f, 0, t), health, reasons)
        for a, (_, _, (u, f, t)) in zip(activities, plan.instances, strict=True)
    ]
    return gpu_reading, out


def _health(state: faults.State, events: tuple[tuple[int, int], ...]) -> tuple[object, ...]:
    """The readings' values a GPU's faults set, in HEALTH_FIELDS' order."""
    c = state.counters
    found: dict[str, object] = {
        "xid_window": events,
        "xid": state.xid,
        "ecc_sbe": c[faults.SBE],
        "ecc_dbe": c[faults.DBE],
        "remapped_correctable": c[faults.REMAP_CORRECTABLE],
        "remapped_uncorrectable": c[faults.REMAP_UNCORRECTABLE],
        "remap_failure": int(state.remap_failure),
        "pcie_replay": c[faults.PCIE_REPLAY],
        "nvlink_crc_flit": c[faults.NVLINK_FLIT],
        "nvlink_crc_data": c[faults.NVLINK_DATA],
        "thermal_violation": c[faults.THERMAL_NS],
        "power_violation": c[faults.POWER_NS],
    }
    return tuple(found.get(name, Reading._field_defaults[name]) for name in HEALTH_FIELDS)
