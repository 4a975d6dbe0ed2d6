"""GPU faults in the series (topology/faults.py's catalog, exporter/readings.py's `_health`).

What a user checks: each fault of the catalog shows on a whole GPU, a static-MIG GPU (its
instances carry the GPU-level fields), a MIG GPU without instances and a shared GPU (one series
per replica) as the values its definition gives, written here from the catalog's words (a count
at the start, a rate a minute while it lasts, ns throttled), never read back from the output;
every generation serves them as a valid exposition; a lost GPU's series go and come back; the
counters never go down, and a restarted exporter serves what a long-running one does.

Real lines that back a value (/tmp/faults-facts.md, Q4):
- dcgm-exporter PR #254: "The dcgm returns the DCGM_FI_DEV_CLOCK_THROTTLE_REASONS with value 96.
  The 96 is a result of ... SW_THERMAL|HW_THERMAL" (0x20 | 0x40);
- dcgm-exporter #317: `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",...,modelName="NVIDIA A30",
  GPU_I_PROFILE="1g.6gb",GPU_I_ID="3",...} 1` on an idle MIG instance (1 = GPU_IDLE);
- DCGM #235: `DCGM_FI_DEV_XID_ERRORS{err_code="45", err_msg="Preemptive cleanup, due to previous
  errors -- Most likely to see when running multiple cuda", ...}` with value 45, and DCGM #227
  "The value of DCGM_FI_DEV_XID_ERROR is the actual XID number".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import cast

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import dcgm, nvml, readings
from exporter.fields import FIELDS, GPU, MIG, Counters, canonical, parse_counters
from exporter.generations import DEFAULT, G483, GENERATIONS, Generation
from exporter.many import NodesExporter
from exporter.readings import HEALTH_FIELDS, Reading
from mig_exporter.web.server import Published
from tests.support.base import examples, run_cli
from tests.support.fakenvml import FakeNvml, h100_mixed, without_mig
from tests.support.promtext import Series, duplicates, parse, promtool_findings
from topology import faults
from topology.catalog import GpuModel, model_for_product
from topology.model import (
    AllocatedBy,
    DeviceStatus,
    Fault,
    Gpu,
    MigDevice,
    NodeTopology,
    PodUsage,
    Replica,
    Sharing,
    Topology,
    Utilization,
)

PRODUCT = "NVIDIA-A100-SXM4-40GB"
_MODEL = model_for_product(PRODUCT)
assert _MODEL is not None
MODEL: GpuModel = _MODEL
FIG = MODEL.figures
T0 = 1_790_000_000  # a collection step's start: the faults begin here
T = T0 + 600  # read ten minutes later
MINUTES = (T - T0) / 60

# Every field a fault moves, in dcgm-exporter's counters CSV format (its etc/default-counters.csv
# lines, uncommented; /tmp/faults-facts.md Q2), with the GPU's own values a throttle moves.
FAULT_CSV = """\
# DCGM FIELD, Prometheus metric type, help message
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).
DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).
DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).
DCGM_FI_DEV_POWER_MGMT_LIMIT,         gauge, Power management limit (in W).
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).
DCGM_FI_DEV_FB_USED,     gauge, Framebuffer memory used (in MiB).
DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.
DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus.
DCGM_FI_DEV_XID_ERRORS,              gauge,   Value of the last XID error encountered.
DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,  gauge,   Current clock throttle reasons.
DCGM_FI_DEV_POWER_VIOLATION,       counter, Throttling duration due to power constraints (in ns).
DCGM_FI_DEV_THERMAL_VIOLATION,     counter, Throttling duration due to thermal constraints (in ns).
DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.
DCGM_FI_DEV_ECC_SBE_AGG_TOTAL, counter, Total number of single-bit persistent ECC errors.
DCGM_FI_DEV_ECC_DBE_AGG_TOTAL, counter, Total number of double-bit persistent ECC errors.
DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, counter, Total number of NVLink flow-control CRC errors.
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors
DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors
DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed
DCGM_FI_DRIVER_VERSION, label, Driver Version
"""
# The same fields by DCGM's newer names (dcgm_fields.h `#define OLD NEW`), as a file may name them.
RENAMED = {
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED",
}


def counters_of(text: str) -> Counters:
    counters, warnings = parse_counters(text, "test")
    assert warnings == []
    return counters


FAULT_COUNTERS = counters_of(FAULT_CSV)
NEW_NAMES = FAULT_CSV
for _old, _new in RENAMED.items():
    NEW_NAMES = NEW_NAMES.replace(f"{_old},", f"{_new},")
NEW_COUNTERS = counters_of(NEW_NAMES)

XID = "DCGM_FI_DEV_XID_ERRORS"
REASONS = "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
SBE = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")
DBE = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")
UNCORRECTABLE = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
CORRECTABLE = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
NVLINK = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
          "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")  # fmt: skip
POWER_VIOLATION, THERMAL_VIOLATION = "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION"
FAULT_FAMILIES = (XID, REASONS, *SBE, *DBE, UNCORRECTABLE, CORRECTABLE, REMAP_FAILURE, PCIE_REPLAY,
                  *NVLINK, POWER_VIOLATION, THERMAL_VIOLATION)  # fmt: skip
WHOLE_ONLY = (UNCORRECTABLE, CORRECTABLE, REMAP_FAILURE)  # fields.py: remapped rows, MIG off only
SM_CLOCK, GPU_TEMP, MEMORY_TEMP = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
)
POWER, POWER_LIMIT = "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_MGMT_LIMIT"
THROTTLE_MOVES = (SM_CLOCK, GPU_TEMP, MEMORY_TEMP, POWER)  # what a throttle may move besides
COUNTER_FAMILIES = tuple(c.name for c in FAULT_COUNTERS.metrics if c.type == "counter")
NS = 1_000_000_000
# DCGM's clocks-event bits (dcgm_fields.h DCGM_CLOCKS_EVENT_REASON_*).
GPU_IDLE, SW_POWER_CAP, SW_THERMAL, HW_THERMAL = 0x1, 0x4, 0x20, 0x40

# --- the node: a GPU of each layout -------------------------------------------------------------


def _held(pod: str, busy: int) -> DeviceStatus:
    holder = AllocatedBy("ml", pod, "main", uid=f"uid-{pod}")
    return DeviceStatus(holder, {f"uid-{pod}": PodUsage(Utilization(busy, busy), fb_used=2000)})


def _instance(profile: str, at: int, status: DeviceStatus | None) -> MigDevice:
    p = MODEL.profile(profile)
    assert p is not None
    return MigDevice(profile, at, MODEL.gpu_instance_id(p, at), f"MIG-{profile}-{at}", status)


def _shared() -> DeviceStatus:
    a, b = AllocatedBy("ml", "a", "main"), AllocatedBy("ml", "b", "main")
    usage = {"uid-a": PodUsage(Utilization(50, 50), fb_used=1000)}
    return DeviceStatus(a, usage, replicas=(Replica(0, a, "uid-a"), Replica(1, b, "uid-b")))


# layout -> (GPU, kind of its series, how many series each field has, whether it is idle)
LAYOUTS = {
    "whole": (Gpu("GPU-00000000-whole", _held("train", 80)), GPU, 1, False),
    "static-mig": (
        Gpu("GPU-11111111-static-mig", None, (_instance("3g.20gb", 0, _held("infer", 60)),
                                              _instance("1g.5gb", 4, None))),
        MIG, 2, False,
    ),
    "mig-no-instances": (Gpu("GPU-22222222-mig-empty", None, ()), "mig-empty", 1, True),
    "shared": (Gpu("GPU-33333333-shared", _shared()), GPU, 2, False),  # --kubernetes-virtual-gpus
}  # fmt: skip


def node_with(faulty: dict[str, tuple[Fault, ...]] | None = None, **gpu: object) -> NodeTopology:
    """The four layouts on one static-MIG node, time-sliced two ways; `faulty`: faults by layout."""
    faulty = faulty or {}
    gpus = tuple(replace(g, faults=faulty.get(name, ()), **gpu)  # type: ignore[arg-type]
                 for name, (g, *_) in LAYOUTS.items())  # fmt: skip
    return NodeTopology(len(gpus), MODEL.total_memory_mib, PRODUCT, gpus=gpus,
                        sharing=Sharing("time-slicing", 2))  # fmt: skip


def options(g: Generation = DEFAULT, counters: Counters = FAULT_COUNTERS) -> dcgm.Options:
    """A fresh exporter's options: its own energy meter."""
    return dcgm.Options("node-a", counters=counters, generation=g, virtual_gpus=True)


def serve(node: NodeTopology, at: float = T, g: Generation = DEFAULT,
          counters: Counters = FAULT_COUNTERS) -> str:  # fmt: skip
    return dcgm.render(node, options(g, counters), at).decode()


def of_gpu(series: Iterable[Series], uuid: str) -> dict[str, list[Series]]:
    out: dict[str, list[Series]] = {}
    for s in series:
        if s.label("UUID") == uuid:
            out.setdefault(canonical(s.name), []).append(s)
    return out


# --- 1. each fault on each layout ---------------------------------------------------------------


def minutes_of(rate: float, since: int = T0, until: int = T) -> int:
    """Errors of a fault counting `rate` a minute, from `since` to `until`, whole ones."""
    return int(rate * (until - since) / 60)


# case -> (its faults, the fault families' values it sets: the others are a healthy GPU's)
CASES: dict[str, tuple[tuple[Fault, ...], dict[str, float]]] = {
    # The value is the Xid itself (DCGM #227, DCGM #235's err_code="45" line).
    "xid-13": ((Fault("xid", T0, xid=13),), {XID: 13}),
    "xid-119": ((Fault("xid", T0, xid=119),), {XID: 119}),
    # The latest Xid begun that still lasts: 31 ended, 48 began after 13.
    "xids-latest-lasting": ((Fault("xid", T0, xid=13), Fault("xid", T0 + 100, xid=48),
                             Fault("xid", T0 + 200, T0 + 300, xid=31)), {XID: 48}),
    "xid-ended": ((Fault("xid", T0, T0 + 300, xid=94),), {}),
    # 1 at its start, then the catalog's 6 a minute for 10 minutes: 61, volatile and aggregate.
    "ecc-sbe": ((Fault("ecc-sbe", T0),), dict.fromkeys(SBE, 1 + 6 * MINUTES)),
    "ecc-sbe-count-rate": ((Fault("ecc-sbe", T0, count=3, rate=0.25),),
                           dict.fromkeys(SBE, 3 + minutes_of(0.25))),
    # Ended after 5 minutes: what it counted stays.
    "ecc-sbe-ended": ((Fault("ecc-sbe", T0, T0 + 300),),
                      dict.fromkeys(SBE, 1 + minutes_of(6, until=T0 + 300))),
    "ecc-dbe": ((Fault("ecc-dbe", T0, count=2),), {**dict.fromkeys(DBE, 2), XID: 48}),
    "row-remap": ((Fault("row-remap", T0, count=3),), {UNCORRECTABLE: 3, XID: 63}),
    "row-remap-correctable": ((Fault("row-remap", T0, count=2, correctable=True),),
                              {CORRECTABLE: 2}),
    "row-remap-failure": ((Fault("row-remap-failure", T0),), {REMAP_FAILURE: 1, XID: 64}),
    "pcie-replay": ((Fault("pcie-replay", T0),), {PCIE_REPLAY: minutes_of(60)}),
    "pcie-replay-rate": ((Fault("pcie-replay", T0, rate=1.5),), {PCIE_REPLAY: 15}),
    "nvlink-crc": ((Fault("nvlink-crc", T0),), dict.fromkeys(NVLINK, minutes_of(60))),
    # Throttled 600 s: 600e9 ns; SW_THERMAL | HW_THERMAL = 96 (PR #254's real value).
    "thermal": ((Fault("thermal", T0),), {THERMAL_VIOLATION: 600 * NS,
                                          REASONS: SW_THERMAL | HW_THERMAL}),
    "thermal-ended": ((Fault("thermal", T0, T0 + 120),), {THERMAL_VIOLATION: 120 * NS}),
    "power": ((Fault("power", T0),), {POWER_VIOLATION: 600 * NS, REASONS: SW_POWER_CAP}),
    "lost": ((Fault("lost", T0),), {}),
    "xid-79": ((Fault("xid", T0, xid=79),), {}),  # fallen off the bus: lost
    "lost-ended": ((Fault("lost", T0, T0 + 300), Fault("ecc-sbe", T0, count=4, rate=0)),
                   dict.fromkeys(SBE, 4)),
    "unmonitored": ((Fault("unmonitored", T0),), {}),
}  # fmt: skip
LOST_CASES = {"lost", "xid-79"}


def test_the_catalogs_default_rates_are_the_ones_the_cases_count() -> None:
    assert {k: faults.CATALOG[k].rate for k in ("ecc-sbe", "pcie-replay", "nvlink-crc")} == {
        "ecc-sbe": 6, "pcie-replay": 60, "nvlink-crc": 60}  # fmt: skip
    covered = {f.fault for fs, _ in CASES.values() for f in fs}
    assert covered == set(faults.CATALOG)


@cache
def healthy(g: Generation = DEFAULT) -> str:
    return serve(node_with(), g=g)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", list(CASES))
def test_each_fault_shows_on_each_layout_as_its_definition_says(case: str, layout: str) -> None:
    """The faulty GPU's fault series have the case's values on every series it has (each
    instance, each replica), remapped rows only with MIG off; its other series are a healthy
    GPU's but for what a throttle moves; the node's other GPUs are untouched."""
    fs, changes = CASES[case]
    gpu, kind, copies, idle = LAYOUTS[layout]
    text = serve(node_with({layout: fs}))
    series, before = parse(text), parse(healthy())
    mine, was = of_gpu(series, gpu.id), of_gpu(before, gpu.id)
    for other, _, _, _ in LAYOUTS.values():
        if other is not gpu:
            assert of_gpu(series, other.id) == of_gpu(before, other.id)
    if case in LOST_CASES:
        assert mine == {}, "a lost GPU's series are gone, its instances' with them"
        return
    # Idle: DCGM's GPU_IDLE (#317's real line: 1 on an idle MIG instance).
    want = {**dict.fromkeys(FAULT_FAMILIES, 0), REASONS: GPU_IDLE if idle else 0, **changes}
    if case == "thermal":  # an idle GPU slowed down is still idle; one held at its power limit not
        want[REASONS] = SW_THERMAL | HW_THERMAL | (GPU_IDLE if idle else 0)
    for family in FAULT_FAMILIES:
        values = [s.value for s in mine.get(family, [])]
        if family in WHOLE_ONLY and kind != GPU:
            assert values == [], f"{family} is served with MIG off only"
        else:
            assert values == [want[family]] * copies, family
    for family, got in mine.items():
        if family in FAULT_FAMILIES or (case in ("thermal", "power") and family in THROTTLE_MOVES):
            continue
        assert got == was[family], f"{case} moved {family}"
    if case == "unmonitored":  # a taint only: nothing served changes
        assert text == healthy()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_thermal_slowdown_is_hot_and_clocked_down(layout: str) -> None:
    """Above the model's hottest busy temperature (at its power limit), the SM clock down from
    what the same GPU reads healthy at the same time."""
    gpu, *_ = LAYOUTS[layout]
    hot = of_gpu(parse(serve(node_with({layout: CASES["thermal"][0]}))), gpu.id)
    was = of_gpu(parse(healthy()), gpu.id)
    for temp in hot[GPU_TEMP]:
        assert temp.value > FIG.gpu_temp_max_c
    assert [m.value - t.value for m, t in zip(hot[MEMORY_TEMP], hot[GPU_TEMP], strict=True)] == [
        FIG.memory_temp_offset_c] * len(hot[GPU_TEMP])  # fmt: skip
    assert all(h.value < w.value for h, w in zip(hot[SM_CLOCK], was[SM_CLOCK], strict=True))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_power_capping_holds_power_at_its_limit_and_clocks_down(layout: str) -> None:
    """Power at the limit (the sensor wanders by under half a watt, never past the limit)."""
    gpu, *_ = LAYOUTS[layout]
    capped = of_gpu(parse(serve(node_with({layout: CASES["power"][0]}))), gpu.id)
    was = of_gpu(parse(healthy()), gpu.id)
    assert {s.value for s in capped[POWER_LIMIT]} == {FIG.max_power_w}
    for p in capped[POWER]:
        assert FIG.max_power_w - 0.5 <= p.value <= FIG.max_power_w
    assert all(c.value < w.value for c, w in zip(capped[SM_CLOCK], was[SM_CLOCK], strict=True))


def idle_whole(fs: tuple[Fault, ...] = ()) -> NodeTopology:
    return NodeTopology(1, MODEL.total_memory_mib, PRODUCT, gpus=(Gpu("GPU-idle", faults=fs),))


def test_throttling_an_idle_gpu_never_raises_its_clock_nor_its_activity() -> None:
    """An idle GPU with MIG off runs at its idle clock: a slowdown holds it there (a clocks-event
    reason says why a clock is lower, never higher) and reads GPU_IDLE | SW_THERMAL | HW_THERMAL.
    Power capping holds its power at the limit, but what it runs stays what its pods run: its
    utilization, activity, memory copy and PCIe traffic are an idle GPU's."""
    (idle,) = (of_gpu(parse(serve(idle_whole())), "GPU-idle"),)
    hot = of_gpu(parse(serve(idle_whole(CASES["thermal"][0]))), "GPU-idle")
    assert hot[SM_CLOCK][0].value <= idle[SM_CLOCK][0].value == FIG.sm_clock_idle_mhz
    assert hot[REASONS][0].value == GPU_IDLE | SW_THERMAL | HW_THERMAL
    capped = of_gpu(parse(serve(idle_whole(CASES["power"][0]))), "GPU-idle")
    assert capped[SM_CLOCK][0].value <= idle[SM_CLOCK][0].value
    assert FIG.max_power_w - 0.5 <= capped[POWER][0].value
    for family in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                   "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_PCIE_TX_BYTES"):  # fmt: skip
        assert capped[family] == idle[family], family


def test_a_fault_field_is_served_only_where_a_counters_file_names_it() -> None:
    """No generation's default counters file selects the clocks-event reasons, ECC or violation
    fields (dcgm-exporter's default-counters.csv keeps them commented out): a thermal GPU's
    default output has none. DCGM's newer names serve the same values as the legacy ones."""
    node = node_with({name: CASES["thermal"][0] + CASES["ecc-dbe"][0] for name in LAYOUTS})
    extra = {REASONS, *SBE, *DBE, POWER_VIOLATION, THERMAL_VIOLATION, *NVLINK}
    for g in GENERATIONS:
        text = dcgm.render(node, dcgm.Options("node-a", generation=g), T).decode()
        assert not {canonical(s.name) for s in parse(text)} & extra, g.name
    legacy = sorted((canonical(s.name), s.labels, s.value) for s in parse(serve(node)))
    renamed = parse(serve(node, counters=NEW_COUNTERS))
    assert {s.name for s in renamed} >= {
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "DCGM_FI_DEV_XID_ERROR",
    }
    assert sorted((canonical(s.name), s.labels, s.value) for s in renamed) == legacy


# --- 2. every fault in every generation ---------------------------------------------------------

# err_msg of the catalog's Xids: dcgm-exporter's internal/pkg/collector/xid_errors.go
# (xidErrCodeToText, its PR #588's texts of the driver R580 Xid catalog).
REAL_XID_TEXTS = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}
HEALTHY_GPU = LAYOUTS["whole"][0].id


@pytest.mark.parametrize("g", GENERATIONS, ids=lambda g: g.name)
@pytest.mark.parametrize("case", list(CASES))
def test_every_fault_is_a_valid_exposition_in_every_generation(case: str, g: Generation) -> None:
    """The fault on every layout but the whole GPU, which stays healthy: promtool finds nothing
    beyond DCGM's own naming, no series twice; XID carries err_code and err_msg from 4.8.3 (the
    Xid and dcgm-exporter's text for it), and a GPU with no Xid has no XID series there, a 0 in
    2022."""
    fs, _ = CASES[case]
    node = node_with({name: fs for name in LAYOUTS if name != "whole"})
    counters = NEW_COUNTERS if g is GENERATIONS[-1] else FAULT_COUNTERS
    text = serve(node, g=g, counters=counters)
    assert promtool_findings(text) == []
    series = parse(text)
    assert duplicates(series) == []
    xids = [s for s in series if canonical(s.name) == XID]
    healthy_xid = [s for s in xids if s.label("UUID") == HEALTHY_GPU]
    if g.xid_blank:
        assert healthy_xid == []
        assert all(s.value != 0 for s in xids)
    else:
        assert [s.value for s in healthy_xid] == [0]
    for s in xids:
        if g.xid_labels:
            assert s.label("err_code") == str(int(s.value))
            assert s.label("err_msg") == (REAL_XID_TEXTS[int(s.value)] if s.value else "No Error")
        else:
            assert "err_code" not in s.label_names and "err_msg" not in s.label_names


@pytest.mark.parametrize(
    "xid", sorted((set(faults.XIDS) | faults.NON_FATAL_XIDS) - faults.LOST_XIDS)
)
def test_each_documented_xid_has_dcgm_exporters_text(xid: int) -> None:
    """The catalog's Xids and those the DRA driver skips, as dcgm-exporter 4.8.3 labels them."""
    node = node_with({"whole": (Fault("xid", T0, xid=xid),)})
    (s,) = [s for s in parse(serve(node, g=G483)) if s.name == XID]
    assert (s.label("err_code"), s.label("err_msg"), s.value) == (
        str(xid), REAL_XID_TEXTS[xid], xid)  # fmt: skip


# --- 3. a lost GPU goes and comes back ----------------------------------------------------------

LOST_SINCE, LOST_UNTIL = T0 + 105, T0 + 305  # not on a step: within one
STEADY = counters_of("\n".join(line for line in FAULT_CSV.splitlines()
                               if "ENERGY" not in line))  # fmt: skip


def lost_node(fault: Fault) -> NodeTopology:
    return node_with({"static-mig": (fault, Fault("ecc-sbe", T0))})


def uuids(text: str) -> set[str]:
    return {s.label("UUID") for s in parse(text)}


def gone(t: float) -> bool:
    return LOST_SINCE <= t < LOST_UNTIL


LOST = LAYOUTS["static-mig"][0].id
LOST_INSTANCES = {str(d.gpu_instance_id) for d in LAYOUTS["static-mig"][0].mig_devices or ()}
LOST_FAULTS = [Fault("lost", LOST_SINCE, LOST_UNTIL),
               Fault("xid", LOST_SINCE, LOST_UNTIL, xid=79)]  # fmt: skip


@pytest.mark.parametrize("fault", LOST_FAULTS, ids=["lost", "xid-79"])
def test_a_lost_gpu_goes_and_comes_back_through_collection_steps(fault: Fault) -> None:
    """Step by step (`NodeSeries.at`, as the exporters do), every 5 s: the GPU and its
    instances are gone exactly while it is lost, the node's other GPUs serve throughout, and
    each step is what an exporter started then serves."""
    node = lost_node(fault)
    series = dcgm.NodeSeries(node, options(), T0)
    others: set[tuple[str, tuple[tuple[str, str], ...]]] | None = None
    for t in range(T0, T0 + 400, 5):
        series = series.at(t)
        text = b"".join(series.page()).decode()
        assert (LOST in uuids(text)) is not gone(t), t
        assert dcgm.lost_gpus(node, t) == ({1} if gone(t) else frozenset())
        instances = {s.label("GPU_I_ID") for s in parse(text) if s.label("UUID") == LOST}
        assert instances == (set() if gone(t) else LOST_INSTANCES), t
        keys = {(s.name, s.labels) for s in parse(text) if s.label("UUID") != LOST}
        assert keys == (others if others is not None else keys)
        others = keys
        assert text == b"".join(dcgm.NodeSeries(node, options(), t).page()).decode(), t


@pytest.mark.parametrize("fault", LOST_FAULTS, ids=["lost", "xid-79"])
def test_the_many_nodes_exporter_takes_a_lost_gpu_away_within_a_step(fault: Fault) -> None:
    """--all-nodes, snapshot every 5 s: gone within one collection step of the fault's start,
    back within one of its end; the node's other GPUs and the other node serve throughout."""
    now = [float(T0)]
    many = NodesExporter(options(), Published(), clock=lambda: now[0])
    many.update_source("topology-a", Topology("mixed", {"a": lost_node(fault)}), "a")
    many.update_source("topology-b", Topology("mixed", {"b": node_with()}), "b")
    step = dcgm.UTILIZATION_STEP_S
    for t in range(T0, T0 + 400, 5):
        now[0] = t
        text = many.snapshot().body.decode()
        hosts = {(s.label("Hostname"), s.label("UUID")) for s in parse(text)}
        assert {("b", g.id) for g, *_ in LAYOUTS.values()} <= hosts
        assert {("a", g.id) for g, *_ in LAYOUTS.values() if g.id != LOST} <= hosts
        if LOST_SINCE + step <= t < LOST_UNTIL:
            assert ("a", LOST) not in hosts, t
        elif t < LOST_SINCE or t >= LOST_UNTIL + step:
            assert ("a", LOST) in hosts, t


# --- 4. counters never go down, and restarts serve the same ------------------------------------

_KINDS = sorted(faults.CATALOG)


@st.composite
def a_fault(draw: st.DrawFn) -> Fault:
    kind = draw(st.sampled_from(_KINDS))
    since = T0 + draw(st.integers(-600, 3000))
    until = draw(st.none() | st.integers(0, 3000).map(lambda d: since + d))
    return Fault(
        kind, since, until,
        xid=draw(st.sampled_from(faults.XIDS)) if kind == "xid" else None,
        count=draw(st.integers(0, 10**6)),
        rate=draw(st.none() | st.floats(0, 10**6, allow_nan=False)),
        correctable=draw(st.booleans()),
    )  # fmt: skip


counted_st = st.dictionaries(st.sampled_from(faults.COUNTERS), st.integers(0, 10**9), max_size=4)


@settings(max_examples=examples(40), deadline=None)
@given(
    by_layout=st.fixed_dictionaries({name: st.lists(a_fault(), max_size=4) for name in LAYOUTS}),
    counted=st.fixed_dictionaries({name: counted_st for name in LAYOUTS}),
    times=st.lists(st.integers(T0 - 700, T0 + 6700), min_size=1, max_size=10, unique=True),
    g=st.sampled_from(GENERATIONS),
)
def test_counters_never_go_down_and_a_restart_serves_the_same(
    by_layout: dict[str, list[Fault]], counted: dict[str, dict[str, int]], times: list[int],
    g: Generation,
) -> None:  # fmt: skip
    """Whatever the faults (begun, ended, ahead, lost, any count and rate) and what cleared
    faults counted: each counter series' value at a step is at least its value at any earlier
    step (a series that went with its GPU comes back no lower), and an exporter started at any
    step (a fresh NodeSeries) serves byte for byte what the long-running one serves."""
    node = node_with()
    node = replace(node, gpus=tuple(
        replace(gpu, faults=tuple(by_layout[name]), counted=tuple(sorted(counted[name].items())))
        for gpu, name in zip(node.gpus, LAYOUTS, strict=True)))  # fmt: skip
    times = sorted(times)
    series = dcgm.NodeSeries(node, options(g, STEADY), times[0])
    last: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for t in times:
        series = series.at(t)
        text = b"".join(series.page())
        assert text == b"".join(dcgm.NodeSeries(node, options(g, STEADY), t).page()), t
        for s in parse(text.decode()):
            if s.name in COUNTER_FAMILIES:
                key = (s.name, frozenset(s.labels))
                assert s.value >= last.get(key, 0), (s, last.get(key))
                last[key] = s.value


# --- 5. the hot constructor and the NVML path ---------------------------------------------------

_value = st.integers(0, 10**6)


@settings(max_examples=examples(60), deadline=None)
@given(values=st.lists(_value, min_size=31, max_size=31, unique=True),
       activity=st.floats(0, 1, allow_nan=False))  # fmt: skip
def test_the_hot_constructor_is_the_keyword_built_reading(
    values: list[int], activity: float
) -> None:
    """Distinct values everywhere, so any two fields swapped in `_HOT_ORDER`, the level tuple or
    the health tuple fail."""
    level = tuple(values[:11])
    fb = tuple(values[11:15])
    reasons = values[15]
    health = {
        "pcie_replay": values[16], "enc_util": values[17], "dec_util": values[18],
        "remapped_uncorrectable": values[19], "remapped_correctable": values[20],
        "remap_failure": values[21], "xid": values[22], "ecc_sbe": values[23],
        "ecc_dbe": values[24], "nvlink_crc_flit": values[25], "nvlink_crc_data": values[26],
        "power_violation": values[27], "thermal_violation": values[28], "zero": values[29],
        "xid_window": ((values[30], 1),),
    }  # fmt: skip
    assert set(health) == set(HEALTH_FIELDS)
    sm, mem, temp, mem_temp, power, limit, energy, util, copy, tx, rx = level
    want = Reading(
        sm_clock=sm, mem_clock=mem, gpu_temp=temp, memory_temp=mem_temp, power=power,
        power_limit=limit, energy=energy, gpu_util=util, mem_copy_util=copy, activity=activity,
        sm_active=activity * readings.SM_SHARE, sm_occupancy=activity * readings.OCCUPANCY_SHARE,
        tensor=activity * readings.TENSOR_SHARE, fp64=activity * readings.FP64_SHARE,
        fp32=activity * readings.FP32_SHARE, fp16=activity * readings.FP16_SHARE,
        dram=activity * readings.DRAM_SHARE, fb_used=fb[0], fb_free=fb[1], fb_reserved=fb[2],
        fb_total=fb[3], pcie_tx=tx, pcie_rx=rx, clocks_event_reasons=reasons, **health,
    )  # fmt: skip
    got = readings._activity_reading(
        level,  # type: ignore[arg-type]
        activity,
        fb,
        tuple(health[name] for name in HEALTH_FIELDS),
        reasons,
    )
    assert got == want and type(got) is Reading


@settings(max_examples=examples(60), deadline=None)
@given(fs=st.lists(a_fault(), max_size=5), counted=counted_st,
       at=st.integers(T0 - 700, T0 + 6700), mig=st.booleans())  # fmt: skip
def test_read_plan_puts_each_faults_value_in_its_named_field(
    fs: list[Fault], counted: dict[str, int], at: int, mig: bool
) -> None:
    """read_plan's readings, the GPU's and each instance's, by field name against the fault
    state at the step: no value lands in a neighbour's field."""
    gpu = LAYOUTS["static-mig" if mig else "whole"][0]
    gpu = replace(gpu, faults=tuple(fs), counted=tuple(sorted(counted.items())))
    instances = gpu.mig_devices or ()
    plan = readings.plan_gpu(gpu, MODEL, MODEL.total_memory_mib, instances)
    own, per_instance = readings.read_plan(plan, at, (readings.EnergyMeter(), "n"))
    state = faults.state(gpu.faults, gpu.counted, readings.step_of(at) * readings.STEP_S)
    c = state.counters
    for r in (own, *per_instance):
        assert (r.xid, r.ecc_sbe, r.ecc_dbe, r.remapped_uncorrectable, r.remapped_correctable,
                r.remap_failure, r.pcie_replay, r.nvlink_crc_flit, r.nvlink_crc_data,
                r.thermal_violation, r.power_violation, r.enc_util, r.dec_util, r.zero) == (
            state.xid, c[faults.SBE], c[faults.DBE], c[faults.REMAP_UNCORRECTABLE],
            c[faults.REMAP_CORRECTABLE], int(state.remap_failure), c[faults.PCIE_REPLAY],
            c[faults.NVLINK_FLIT], c[faults.NVLINK_DATA], c[faults.THERMAL_NS],
            c[faults.POWER_NS], 0, 0, 0)  # fmt: skip
        assert r.clocks_event_reasons is not None
        assert r.clocks_event_reasons & (SW_THERMAL | HW_THERMAL | SW_POWER_CAP) == state.reasons
    assert len(per_instance) == len(instances)


# What only DCGM reads (its Xid events, ECC, NVLink, violation and clocks-event fields): NVML's
# readings have none, so `--source nvml` serves none of them, faults or not.
DCGM_ONLY = ("xid", "ecc_sbe", "ecc_dbe", "nvlink_crc_flit", "nvlink_crc_data",
             "power_violation", "thermal_violation", "clocks_event_reasons", "zero")  # fmt: skip


def test_nvml_readings_have_no_fault_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([h100_mixed(0), without_mig(1)])
    fake.install(monkeypatch.setattr)
    fake.nvmlInit()
    sample = nvml.collect(pynvml)
    subjects = nvml.entities(sample, options())
    assert subjects
    for _, _, r in subjects:
        assert {name: getattr(r, name) for name in DCGM_ONLY} == dict.fromkeys(DCGM_ONLY)
    # A topology naming the same GPUs with faults changes nothing NVML serves.
    gpus = tuple(Gpu(g.uuid, faults=CASES["thermal"][0] + CASES["ecc-dbe"][0]) for g in sample.gpus)
    node = NodeTopology(len(gpus), 1, "NVIDIA-H100-80GB-HBM3", gpus=gpus)
    text = nvml.render(sample, options(), node).decode()
    assert text == nvml.render(sample, options()).decode()
    served = {canonical(s.name) for s in parse(text)}
    probe = Reading._make(Reading._fields)  # each value its own name
    dcgm_only = {name for name, f in FIELDS.items() if cast(object, f.read(probe)) in DCGM_ONLY}
    assert not served & dcgm_only


# --- 6. a healthy node is what it was ------------------------------------------------------------


def test_a_node_without_faults_moves_as_before_and_loses_no_gpu() -> None:
    """A node that serves only fields that do not move stays still without faults, however
    much cleared faults counted; a fault makes it move (faults begin, count and end)."""
    still = counters_of("DCGM_FI_DEV_FB_USED, gauge, u\nDCGM_FI_DEV_XID_ERRORS, gauge, x\n"
                        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, s\n")  # fmt: skip
    node = node_with()
    assert not dcgm.moves_in_time(node, still)
    assert dcgm.moves_in_time(node, FAULT_COUNTERS)  # power, clocks, activity move
    cleared = node_with(counted=((faults.SBE, 7), (faults.THERMAL_NS, 5 * NS)))
    assert not dcgm.moves_in_time(cleared, still)
    assert dcgm.moves_in_time(node_with({"whole": CASES["xid-13"][0]}), still)
    for t in (T0 - 10**6, T0, T, T0 + 10**7):
        assert dcgm.lost_gpus(node, t) == frozenset()
        assert dcgm.lost_gpus(cleared, t) == frozenset()
    ahead = node_with({name: (Fault("lost", T + 10),) for name in LAYOUTS})
    assert dcgm.lost_gpus(ahead, T) == frozenset()
    assert dcgm.lost_gpus(ahead, T + 10) == frozenset(range(len(LAYOUTS)))


@pytest.mark.parametrize("g", GENERATIONS, ids=lambda g: g.name)
def test_faults_ahead_or_unwatched_change_nothing_served(g: Generation) -> None:
    """Byte for byte the healthy node's output, in each generation's own counters too."""
    ahead = tuple(f for fs, _ in CASES.values() for f in fs if f.fault != "lost")
    ahead = tuple(replace(f, since=T + 3600, until=None) for f in ahead)
    for counters in (FAULT_COUNTERS, dcgm.default_counters(g)):
        base = serve(node_with(), g=g, counters=counters)
        for fs in (ahead, (Fault("unmonitored", T0),), (Fault("lost", T0 - 100, T0),)):
            faulty = node_with(dict.fromkeys(LAYOUTS, fs))
            assert serve(faulty, g=g, counters=counters) == base


def test_what_cleared_faults_counted_changes_only_the_counters() -> None:
    """`counted` (an ended fault, cleared): the same series, the same values but the counters
    it names, each up by exactly what it counted."""
    counted = {faults.SBE: 61, faults.DBE: 2, faults.REMAP_UNCORRECTABLE: 3,
               faults.REMAP_CORRECTABLE: 4, faults.PCIE_REPLAY: 600, faults.NVLINK_FLIT: 5,
               faults.NVLINK_DATA: 6, faults.THERMAL_NS: 120 * NS, faults.POWER_NS: 7 * NS}  # fmt: skip
    by_family = {
        SBE[0]: faults.SBE, SBE[1]: faults.SBE, DBE[0]: faults.DBE, DBE[1]: faults.DBE,
        UNCORRECTABLE: faults.REMAP_UNCORRECTABLE, CORRECTABLE: faults.REMAP_CORRECTABLE,
        PCIE_REPLAY: faults.PCIE_REPLAY, NVLINK[0]: faults.NVLINK_FLIT,
        NVLINK[1]: faults.NVLINK_DATA, THERMAL_VIOLATION: faults.THERMAL_NS,
        POWER_VIOLATION: faults.POWER_NS,
    }  # fmt: skip
    assert set(by_family) == set(COUNTER_FAMILIES) and set(counted) == set(faults.COUNTERS)
    for g in GENERATIONS:
        before = parse(serve(node_with(), g=g))
        after = parse(serve(node_with(counted=tuple(sorted(counted.items()))), g=g))
        assert [(s.name, s.labels) for s in after] == [(s.name, s.labels) for s in before]
        for b, a in zip(before, after, strict=True):
            assert a.value == b.value + counted.get(by_family.get(b.name, ""), 0), (g.name, b)


def test_every_xid_of_dcgm_exporter_s_table_has_its_text_and_others_are_unknown() -> None:
    """Its table runs from 0 to 172 (xid_errors.go); a real line (DCGM #235) shows 45's text.
    Past the table: "Unknown Error", as dcgm-exporter writes it."""
    from exporter.xid import TEXTS, xid_text

    assert sorted(TEXTS) == list(range(173))
    assert xid_text(45) == (
        "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda"
    )
    assert (xid_text(8), xid_text(173), xid_text(10_000)) == (
        "GPU stopped processing", "Unknown Error", "Unknown Error")  # fmt: skip
    assert all(text and "\t" not in text for text in TEXTS.values())


XID_COUNT_CSV = (
    "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n"
    "DCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID Errors within user-specified time window "
    "(see xid-count-window-size param).\n"
    "DCGM_FI_DRIVER_VERSION, label, Driver Version\n"
)


def test_the_xid_count_collector_counts_each_xid_in_its_window_as_dcgm_exporter_does(
    tmp_path: Path,
) -> None:
    """dcgm-exporter PR #239's real line (an Xid 42 injected on a T400): the label fields, then
    `window_size_in_ms` and `xid`, the count of that Xid's events in the window; a GPU with none
    has one series of 0 without `xid` (expcollector.go). Off unless the counters file names it."""
    import time as clock

    from exporter.fields import read_counters

    csv = tmp_path / "counters.csv"
    csv.write_text(XID_COUNT_CSV)
    now = float(int(clock.time()))
    entries = (Fault(fault="xid", xid=42, since=int(now) - 20),
               Fault(fault="xid", xid=42, since=int(now) - 100, until=int(now) - 90),
               Fault(fault="ecc-dbe", since=int(now) - 200),  # its Xid 48
               Fault(fault="xid", xid=8, since=int(now) - 400))  # before the window  # fmt: skip
    node = NodeTopology(2, 4096, "NVIDIA-T400-4GB", False,
                        (Gpu(id="GPU-b9f9", faults=entries), Gpu(id="GPU-other")))  # fmt: skip
    options = dcgm.Options("workstation", counters=read_counters(csv))
    text = dcgm.render(node, options, now).decode()
    found = [s for s in parse(text) if s.name == "DCGM_EXP_XID_ERRORS_COUNT"]
    assert [(s.label("gpu"), dict(s.labels).get("xid"), s.value) for s in found] == [
        ("0", "42", 2), ("0", "48", 1), ("1", None, 0)]  # fmt: skip
    assert [n for n, _ in found[0].labels][-6:-2] == [
        "DCGM_FI_DRIVER_VERSION", "window_size_in_ms", "xid", "container"]  # fmt: skip
    assert found[0].label("window_size_in_ms") == "300000"
    shorter = replace(options, xid_count_window_ms=60_000)
    counts = {(s.label("gpu"), dict(s.labels).get("xid")): s.value
              for s in parse(dcgm.render(node, shorter, now).decode())
              if s.name == "DCGM_EXP_XID_ERRORS_COUNT"}  # fmt: skip
    assert counts == {("0", "42"): 1, ("1", None): 0}
    assert "DCGM_EXP_XID_ERRORS_COUNT" not in dcgm.render(node, dcgm.Options("h"), now).decode()
    for g in GENERATIONS:  # every generation: valid, no series twice
        served = dcgm.render(node, replace(options, generation=g), now).decode()
        assert not duplicates(parse(served)) and not promtool_findings(served)


def test_the_xid_count_window_comes_from_its_flag_or_variable(tmp_path: Path) -> None:
    from exporter.cli import parser

    assert parser().parse_args([]).xid_count_window_size == 300_000
    assert parser().parse_args(["-x", "60000"]).xid_count_window_size == 60_000
    done = run_cli("exporter", "--xid-count-window-size", "0", "--once")
    assert done.returncode == 2 and "expected milliseconds above 0, got '0'" in done.stderr
