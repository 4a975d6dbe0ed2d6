"""The DCGM fields the exporter can serve, and the counters CSV that selects them.

Each field is one declaration (`FIELDS`): its name, dcgm-exporter's type and help for it, where it
is served, its value in a reading (readings.Reading), whether it prints with decimals and whether
it moves in time. `declare` checks them at import: a field without a reading, or a value of a
reading that no field serves, stops the exporter there, with what to fix.

A counters CSV is dcgm-exporter's own format (`-f/--collectors FILE`), so users keep the file they
have: one field a line, `DCGM_FI_…, gauge|counter|label, help`, `#` starts a comment. Metric
fields become families, with the file's name, type and help; `label` fields become labels on
every series, after the hostname. A field is named by its legacy name or by DCGM's newer one
(`ALIASES`): the name served is the file's, and a base-unit name serves the value in its unit
(`DCGM_FI_DEV_SM_CLOCK_HERTZ`: the SM clock in Hz), as DCGM watches a field by the id its name
resolves to. Each dcgm-exporter generation's default file is in counters/ (generations.py).

Where a field is served follows the dumps:
- GPU: a GPU with MIG off gets every field;
- MIG: each MIG instance gets the GPU-level fields (clocks, temperatures, power, energy, PCIe
  replays, XID, NVLink: its GPU's value), its own memory and profiling fields, and never the
  utilization fields (GPU_UTIL, MEM_COPY_UTIL, ENC_UTIL, DEC_UTIL) nor the remapped rows;
- EMPTY: a GPU with MIG on and no instance gets the GPU-level and profiling fields, without
  memory (the dump `mig-enabled-empty`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.readings import Reading
from mig_exporter.common.files import UnreadableFile, read_text

log = logging.getLogger("exporter")

GPU, MIG, EMPTY = "gpu", "mig", "mig-empty"  # what a series describes
XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
_EVERYWHERE = frozenset({GPU, MIG, EMPTY})
_WHOLE = frozenset({GPU})
_MEMORY = frozenset({GPU, MIG})
_PCIE = frozenset({GPU, EMPTY})
COUNTERS = Path(__file__).with_name("counters")  # each generation's default fields (generations.py)
MAX_COUNTERS_BYTES = 1 << 20
TYPES = ("gauge", "counter", "label")


@dataclass(frozen=True)
class Field:
    """A DCGM field, whole."""

    name: str
    type: str  # dcgm-exporter's, gauge or counter; a counters file says what is served
    help: str  # dcgm-exporter's; likewise
    where: frozenset[str]  # the kinds of series (GPU, MIG, EMPTY) that carry it
    # One value of a Reading; None: no series. DCGM_EXP_XID_ERRORS_COUNT's is (Xid, events)
    # pairs: a series each (dcgm.py).
    read: Callable[[Reading], int | float | tuple[tuple[int, int], ...] | None]
    decimal: bool = False  # a DCGM double: printed with six decimals, as dcgm-exporter does
    # Whether its simulated value changes with the clock: a node serving only fields that do not
    # is rendered once per change of its topology, not on every collection step.
    moves: bool = True


class FieldError(Exception):
    """A field declared wrong: raised at import, so no exporter runs with it."""


@dataclass(frozen=True)
class _Mark:
    """Stands for one value of a Reading in the probe `declare` reads each field's reading from."""

    name: str


def declare(*fields: Field) -> dict[str, Field]:
    """The fields by name, checked: each reads one value of a Reading, and each value of a
    Reading is read by a field (one that no field reads would be computed and never served)."""
    values = list(Reading._fields)
    marks: dict[str, Any] = {name: _Mark(name) for name in values}
    probe = Reading(**marks)  # what a field's reading returns names the value it reads
    out: dict[str, Field] = {}
    read: set[str] = set()
    for f in fields:
        if f.name in out:
            raise FieldError(f"{f.name} is declared twice")
        if f.type not in ("gauge", "counter") or not f.help or not f.where <= _EVERYWHERE:
            raise FieldError(f"{f.name}: needs a type (gauge or counter), a help, known kinds")
        if not f.where:
            raise FieldError(f"{f.name}: is served nowhere (no kind of series)")
        try:
            got: object = f.read(probe)
        except Exception:  # not callable, or computes: either way not one value
            got = None
        if not isinstance(got, _Mark):
            raise FieldError(
                f"{f.name}: its reading must be one value of readings.Reading, "
                "e.g. lambda r: r.power"
            )
        read.add(got.name)
        out[f.name] = f
    if unread := sorted(set(values) - read):
        raise FieldError(
            f"readings.Reading.{unread[0]} is read by no field: declare its field in "
            "exporter/fields.py, or take it out of Reading"
        )
    return out


# Fields DCGM reads from the driver and a healthy GPU reads 0 for, which the simulation serves
# as 0 (and NVML does not serve): errors, violations, NVLink.
def _zeros(kind: str, help_text: str, where: frozenset[str], **names: str) -> list[Field]:
    return [
        Field(name, kind, help_text.format(what), where, lambda r: r.zero, moves=False)
        for name, what in names.items()
    ]


def _sbe(r: Reading) -> int | None:
    return r.ecc_sbe


def _dbe(r: Reading) -> int | None:
    return r.ecc_dbe


FIELDS = declare(
    Field("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
          _EVERYWHERE, lambda r: r.sm_clock),
    Field("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
          _EVERYWHERE, lambda r: r.mem_clock, moves=False),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
          _EVERYWHERE, lambda r: r.memory_temp),
    Field("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
          _EVERYWHERE, lambda r: r.gpu_temp),
    Field("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
          _EVERYWHERE, lambda r: r.power, decimal=True),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).",
          _EVERYWHERE, lambda r: r.power_limit, decimal=True, moves=False),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
          "Total energy consumption since boot (in mJ).", _EVERYWHERE, lambda r: r.energy),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
          _EVERYWHERE, lambda r: r.pcie_replay, moves=False),
    Field("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
          _WHOLE, lambda r: r.gpu_util),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
          _WHOLE, lambda r: r.mem_copy_util),
    Field("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
          _WHOLE, lambda r: r.enc_util, moves=False),
    Field("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
          _WHOLE, lambda r: r.dec_util, moves=False),
    Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
          _EVERYWHERE, lambda r: r.xid, moves=False),
    # Throttled time counts in ns, whatever a counters file's help says (dcgm_fields.h).
    Field("DCGM_FI_DEV_POWER_VIOLATION", "counter", "Time throttled by the power limit (in ns).",
          _EVERYWHERE, lambda r: r.power_violation, moves=False),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Time throttled by temperature (in ns).",
          _EVERYWHERE, lambda r: r.thermal_violation, moves=False),
    # dcgm-exporter's Xid-count collector (its xid_collector.go): off unless a counters file
    # names it, as in dcgm-exporter's own default file.
    Field(XID_COUNT, "gauge",
          "Count of XID Errors within user-specified time window (see xid-count-window-size "
          "param).", _EVERYWHERE, lambda r: r.xid_window, moves=False),
    Field("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
          "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
          _EVERYWHERE, lambda r: r.clocks_event_reasons),
    *_zeros("counter", "Time throttled by {} (in us).", _EVERYWHERE,
            DCGM_FI_DEV_SYNC_BOOST_VIOLATION="sync boost",
            DCGM_FI_DEV_BOARD_LIMIT_VIOLATION="the board's limit",
            DCGM_FI_DEV_LOW_UTIL_VIOLATION="low utilization",
            DCGM_FI_DEV_RELIABILITY_VIOLATION="reliability limits"),
    Field("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
          _MEMORY, lambda r: r.fb_free, moves=False),
    Field("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
          _MEMORY, lambda r: r.fb_used, moves=False),
    Field("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
          _MEMORY, lambda r: r.fb_reserved, moves=False),
    Field("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory in all (in MiB).",
          _MEMORY, lambda r: r.fb_total, moves=False),
    # Volatile (since the driver loaded) and aggregate (the GPU's life) alike: the simulated
    # driver is never reloaded.
    *(Field(name, "counter", f"ECC errors: {what}.", _EVERYWHERE, read, moves=False)
      for name, what, read in (
          ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "single-bit, since the driver loaded", _sbe),
          ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "single-bit, over the GPU's life", _sbe),
          ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "double-bit, since the driver loaded", _dbe),
          ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "double-bit, over the GPU's life", _dbe))),
    *_zeros("counter", "Retired pages: {}.", _WHOLE,
            DCGM_FI_DEV_RETIRED_SBE="single-bit errors",
            DCGM_FI_DEV_RETIRED_DBE="double-bit errors",
            DCGM_FI_DEV_RETIRED_PENDING="pending retirement"),
    Field("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
          "NVLink errors of all lanes: flow-control CRC.", _EVERYWHERE,
          lambda r: r.nvlink_crc_flit, moves=False),
    Field("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
          "NVLink errors of all lanes: data CRC.", _EVERYWHERE,
          lambda r: r.nvlink_crc_data, moves=False),
    *_zeros("counter", "NVLink errors of all lanes: {}.", _EVERYWHERE,
            DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL="replays",
            DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL="recoveries"),
    *_zeros("counter", "{}", _EVERYWHERE,
            DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL="Total number of NVLink bandwidth counters for all lanes."),
    # A GPU without vGPU reads 0, on every MIG instance too (dcgm-exporter #317's real lines).
    *_zeros("gauge", "{}", _EVERYWHERE, DCGM_FI_DEV_VGPU_LICENSE_STATUS="vGPU License status"),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
          "Number of remapped rows for uncorrectable errors", _WHOLE,
          lambda r: r.remapped_uncorrectable, moves=False),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
          "Number of remapped rows for correctable errors", _WHOLE,
          lambda r: r.remapped_correctable, moves=False),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
          _WHOLE, lambda r: r.remap_failure, moves=False),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
          "Ratio of time the graphics engine is active (in %).",
          _EVERYWHERE, lambda r: r.activity, decimal=True),
    Field("DCGM_FI_PROF_SM_ACTIVE", "gauge", "Ratio of cycles an SM has a warp assigned.",
          _EVERYWHERE, lambda r: r.sm_active, decimal=True),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "Ratio of warps resident on an SM to its most.",
          _EVERYWHERE, lambda r: r.sm_occupancy, decimal=True),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
          "Ratio of cycles the tensor (HMMA) pipe is active (in %).",
          _EVERYWHERE, lambda r: r.tensor, decimal=True),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the FP64 pipe is active.",
          _EVERYWHERE, lambda r: r.fp64, decimal=True),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the FP32 pipe is active.",
          _EVERYWHERE, lambda r: r.fp32, decimal=True),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the FP16 pipe is active.",
          _EVERYWHERE, lambda r: r.fp16, decimal=True),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
          "Ratio of cycles the device memory interface is active sending or receiving data (in %).",
          _EVERYWHERE, lambda r: r.dram, decimal=True),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
          "The rate of data transmitted over the PCIe bus - including both protocol headers and "
          "data payloads - in bytes per second.", _PCIE, lambda r: r.pcie_tx),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
          "The rate of data received over the PCIe bus - including both protocol headers and "
          "data payloads - in bytes per second.", _PCIE, lambda r: r.pcie_rx),
)  # fmt: skip
# Label fields: a value every series of a GPU carries (dcgm._label_value, nvml._label_fields).
LABEL_FIELDS = (
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
)


@dataclass(frozen=True)
class Alias:
    """Another name of a field: DCGM 4.6's canonical name for a legacy one (same id, same unit),
    or a base-unit field of DCGM 4.6.1/4.7 (its own id: the same quantity, in another unit)."""

    field: str  # the legacy name, as FIELDS and LABEL_FIELDS hold it
    scale: float = 1  # its value is the legacy field's times this


_MIB = float(1 << 20)
# DCGM's names of the same fields. The pure renames are `#define OLD NEW` in DCGM 4.6.0's
# dcgm_fields.h (go-dcgm resolves both names to one id); the scaled ones are the base-unit fields
# dcgm-exporter 4.9.0 serves (its release notes: clocks in Hz, energy in J, utilization ratios,
# framebuffer bytes, NVLink bytes/s; ids from go-dcgm v1.4611.0 and DCGM 4.7's docs). NVLink's
# factor is inferred: DCGM computes the legacy value as KiB/s / 1000 (docs/upgrade.md).
ALIASES = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": Alias("DCGM_FI_DEV_SM_CLOCK", 1e6),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": Alias("DCGM_FI_DEV_MEM_CLOCK", 1e6),
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": Alias("DCGM_FI_DEV_MEMORY_TEMP"),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": Alias("DCGM_FI_DEV_GPU_TEMP"),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": Alias("DCGM_FI_DEV_POWER_USAGE"),
    "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS": Alias("DCGM_FI_DEV_POWER_MGMT_LIMIT"),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": Alias("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": Alias("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": Alias("DCGM_FI_DEV_GPU_UTIL", 0.01),
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": Alias("DCGM_FI_DEV_MEM_COPY_UTIL", 0.01),
    "DCGM_FI_DEV_ENC_UTIL_RATIO": Alias("DCGM_FI_DEV_ENC_UTIL", 0.01),
    "DCGM_FI_DEV_DEC_UTIL_RATIO": Alias("DCGM_FI_DEV_DEC_UTIL", 0.01),
    "DCGM_FI_DEV_XID_ERROR": Alias("DCGM_FI_DEV_XID_ERRORS"),
    # dcgm_fields.h: DCGM_FI_DEV_CLOCK_THROTTLE_REASONS is the deprecated name of field 112.
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": Alias("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": Alias("DCGM_FI_DEV_FB_TOTAL", _MIB),
    "DCGM_FI_DEV_FB_FREE_BYTES": Alias("DCGM_FI_DEV_FB_FREE", _MIB),
    "DCGM_FI_DEV_FB_USED_BYTES": Alias("DCGM_FI_DEV_FB_USED", _MIB),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": Alias("DCGM_FI_DEV_FB_RESERVED", _MIB),
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": Alias(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", 1_024_000
    ),
    "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL": Alias("DCGM_FI_DEV_RETIRED_SBE"),
    "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL": Alias("DCGM_FI_DEV_RETIRED_DBE"),
    "DCGM_FI_DEV_PAGE_RETIRED_PENDING": Alias("DCGM_FI_DEV_RETIRED_PENDING"),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": Alias(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    ),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": Alias(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
    ),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": Alias("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": Alias(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"
    ),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": Alias("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": Alias("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": Alias("DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO": Alias("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    "DCGM_FI_PROF_SM_UTIL_RATIO": Alias("DCGM_FI_PROF_SM_ACTIVE"),
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": Alias("DCGM_FI_PROF_SM_OCCUPANCY"),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": Alias("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": Alias("DCGM_FI_PROF_DRAM_ACTIVE"),
    "DCGM_FI_PROF_FP64_UTIL_RATIO": Alias("DCGM_FI_PROF_PIPE_FP64_ACTIVE"),
    "DCGM_FI_PROF_FP32_UTIL_RATIO": Alias("DCGM_FI_PROF_PIPE_FP32_ACTIVE"),
    "DCGM_FI_PROF_FP16_UTIL_RATIO": Alias("DCGM_FI_PROF_PIPE_FP16_ACTIVE"),
    "DCGM_FI_SYSTEM_DRIVER_VERSION": Alias("DCGM_FI_DRIVER_VERSION"),
    "DCGM_FI_SYSTEM_NVML_VERSION": Alias("DCGM_FI_NVML_VERSION"),
    "DCGM_FI_DEV_GPU_BRAND": Alias("DCGM_FI_DEV_BRAND"),
    "DCGM_FI_DEV_BOARD_SERIAL": Alias("DCGM_FI_DEV_SERIAL"),
}


def canonical(name: str) -> str:
    """The legacy name of a field named either way (a label field's value is looked up by it)."""
    alias = ALIASES.get(name)
    return alias.field if alias is not None else name


@dataclass(frozen=True)
class Counter:
    """One selected metric field: its family's name, type and help as the CSV says; the name
    is the CSV's, as dcgm-exporter serves it, and names the unit (`ALIASES`)."""

    field: Field
    type: str
    help: str
    name: str
    scale: float = 1  # the served value is the field's reading times this


@dataclass(frozen=True)
class Counters:
    metrics: tuple[Counter, ...]
    labels: tuple[str, ...]  # label fields as the file names them, in its order


class CountersError(Exception):
    """A counters file that cannot be used at all (unreadable, or no field to serve)."""


def parse_counters(text: str, source: str) -> tuple[Counters, list[str]]:
    """The fields a counters CSV selects, and a one-line warning for each line skipped."""
    metrics: list[Counter] = []
    labels: list[str] = []
    seen: set[str] = set()
    warnings: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) < 2 or not parts[0]:
            warnings.append(f"{where}: expected 'DCGM_FI_FIELD, type, help': skipped")
            continue
        name, kind = parts[0], parts[1]
        help_text = parts[2] if len(parts) == 3 else ""
        alias = ALIASES.get(name)
        known = alias.field if alias is not None else name
        if kind not in TYPES:
            warnings.append(
                f"{where}: {name}: type {kind!r} is not one of {', '.join(TYPES)}: skipped"
            )
        elif name in seen:
            warnings.append(f"{where}: {name} is listed twice: the first is used")
        elif kind == "label" and known in LABEL_FIELDS:
            labels.append(name)
        elif kind != "label" and known in FIELDS:
            scale = alias.scale if alias is not None else 1
            metrics.append(Counter(FIELDS[known], kind, help_text, name, scale))
        elif known in FIELDS or known in LABEL_FIELDS:
            role = "a metric" if known in FIELDS else "a label"
            warnings.append(f"{where}: {name} is {role} field, not {kind}: skipped")
        else:
            warnings.append(f"{where}: {name} is not a field this exporter serves: skipped")
        seen.add(name)
    if not metrics:
        raise CountersError(f"{source}: no field this exporter serves")
    return Counters(tuple(metrics), tuple(labels)), warnings


def read_counters(path: Path) -> Counters:
    """Read a counters CSV, logging each skipped line; CountersError when it cannot be used."""
    source = f"counters file {path}"
    try:
        text = read_text(path, MAX_COUNTERS_BYTES)
    except UnreadableFile as e:
        raise CountersError(f"{source}: {e}") from None
    counters, warnings = parse_counters(text, source)
    for w in warnings:
        log.warning("%s", w)
    return counters
