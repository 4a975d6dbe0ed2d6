"""The DCGM fields the exporter can serve, and the counters CSV that selects them.

A counters CSV is dcgm-exporter's own format (`-f/--collectors FILE`), so users keep the file they
have: one field a line, `DCGM_FI_…, gauge|counter|label, help`, `#` starts a comment. Metric
fields become families in the file's order, with the file's type and help; `label` fields become
labels on every series, after `Hostname`. The default (default-counters.csv beside this module) is
the field set of the real dumps in samples/mig/metrics/, in their order.

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
from dataclasses import dataclass
from pathlib import Path

from common.files import UnreadableFile, read_text

log = logging.getLogger("exporter")

GPU, MIG, EMPTY = "gpu", "mig", "mig-empty"  # what a series describes
_EVERYWHERE = frozenset({GPU, MIG, EMPTY})
_WHOLE = frozenset({GPU})
_MEMORY = frozenset({GPU, MIG})
_PCIE = frozenset({GPU, EMPTY})
DEFAULT_COUNTERS = Path(__file__).with_name("default-counters.csv")
MAX_COUNTERS_BYTES = 1 << 20
TYPES = ("gauge", "counter", "label")


@dataclass(frozen=True)
class Field:
    """A DCGM field: what it reads (an attribute of readings.Reading) and where it is served."""

    name: str
    reading: str
    where: frozenset[str]
    decimal: bool = False  # a DCGM double: printed with six decimals, as dcgm-exporter does


def _fields(*fields: Field) -> dict[str, Field]:
    return {f.name: f for f in fields}


FIELDS = _fields(
    Field("DCGM_FI_DEV_SM_CLOCK", "sm_clock", _EVERYWHERE),
    Field("DCGM_FI_DEV_MEM_CLOCK", "mem_clock", _EVERYWHERE),
    Field("DCGM_FI_DEV_MEMORY_TEMP", "memory_temp", _EVERYWHERE),
    Field("DCGM_FI_DEV_GPU_TEMP", "gpu_temp", _EVERYWHERE),
    Field("DCGM_FI_DEV_POWER_USAGE", "power", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy", _EVERYWHERE),
    Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay", _EVERYWHERE),
    Field("DCGM_FI_DEV_GPU_UTIL", "gpu_util", _WHOLE),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_util", _WHOLE),
    Field("DCGM_FI_DEV_ENC_UTIL", "enc_util", _WHOLE),
    Field("DCGM_FI_DEV_DEC_UTIL", "dec_util", _WHOLE),
    Field("DCGM_FI_DEV_XID_ERRORS", "zero", _EVERYWHERE),
    *(
        Field(f"DCGM_FI_DEV_{v}_VIOLATION", "zero", _EVERYWHERE)
        for v in ("POWER", "THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "LOW_UTIL", "RELIABILITY")
    ),
    Field("DCGM_FI_DEV_FB_FREE", "fb_free", _MEMORY),
    Field("DCGM_FI_DEV_FB_USED", "fb_used", _MEMORY),
    Field("DCGM_FI_DEV_FB_RESERVED", "fb_reserved", _MEMORY),
    Field("DCGM_FI_DEV_FB_TOTAL", "fb_total", _MEMORY),
    *(
        Field(f"DCGM_FI_DEV_ECC_{kind}_{scope}_TOTAL", "zero", _EVERYWHERE)
        for kind in ("SBE", "DBE")
        for scope in ("VOL", "AGG")
    ),
    *(Field(f"DCGM_FI_DEV_RETIRED_{r}", "zero", _WHOLE) for r in ("SBE", "DBE", "PENDING")),
    *(
        Field(f"DCGM_FI_DEV_NVLINK_{e}_ERROR_COUNT_TOTAL", "zero", _EVERYWHERE)
        for e in ("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY")
    ),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "zero", _EVERYWHERE),
    Field("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_uncorrectable", _WHOLE),
    Field("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_correctable", _WHOLE),
    Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remap_failure", _WHOLE),
    Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "activity", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_SM_ACTIVE", "sm_active", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "fp64", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "fp32", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "fp16", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_DRAM_ACTIVE", "dram", _EVERYWHERE, decimal=True),
    Field("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx", _PCIE),
    Field("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx", _PCIE),
)
# Label fields: the value each series of a GPU carries (see dcgm.label_values).
LABEL_FIELDS = (
    "DCGM_FI_DRIVER_VERSION",
    "DCGM_FI_NVML_VERSION",
    "DCGM_FI_DEV_BRAND",
    "DCGM_FI_DEV_SERIAL",
)


@dataclass(frozen=True)
class Counter:
    """One selected metric field: its family's name, type and help as the CSV says."""

    field: Field
    type: str
    help: str

    @property
    def name(self) -> str:
        return self.field.name


@dataclass(frozen=True)
class Counters:
    metrics: tuple[Counter, ...]
    labels: tuple[str, ...]  # label fields, in the file's order


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
        if kind not in TYPES:
            warnings.append(
                f"{where}: {name}: type {kind!r} is not one of {', '.join(TYPES)}: skipped"
            )
        elif name in seen:
            warnings.append(f"{where}: {name} is listed twice: the first is used")
        elif kind == "label" and name in LABEL_FIELDS:
            labels.append(name)
        elif kind != "label" and name in FIELDS:
            metrics.append(Counter(FIELDS[name], kind, help_text))
        elif name in FIELDS or name in LABEL_FIELDS:
            role = "a metric" if name in FIELDS else "a label"
            warnings.append(f"{where}: {name} is {role} field, not {kind}: skipped")
        else:
            warnings.append(f"{where}: {name} is not a field this exporter serves: skipped")
        seen.add(name)
    if not metrics:
        raise CountersError(f"{source}: no field this exporter serves")
    return Counters(tuple(metrics), tuple(labels)), warnings


def read_counters(path: Path = DEFAULT_COUNTERS) -> Counters:
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
