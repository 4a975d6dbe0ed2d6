"""The dcgm-exporter generations the exporter can be, as data: one row each (`GENERATIONS`).

A generation says everything about `/metrics` that changed between the releases users run: which
fields are collected by default and under which names and units (its counters file), the labels
and their order, what a device nobody holds looks like, how values are written, in which order
families and series come, how a MIG profile is named, and which options it has. The rest of the
exporter asks the row, never a version string. Adding a generation is a row, its counters file
(counters/<name>.csv) and real lines for its golden (tests/pipeline/test_generations.py).

Where each fact comes from is in the row's `source` and in docs/upgrade.md (generated from this
table); the facts no code or real output could settle are said there, and in the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Literal

from exporter.fields import COUNTERS

ProfileNames = Literal["dcgm", "nvml"]


def printf_value(value: float, decimal: bool) -> str:
    """dcgm-exporter up to 4.8.2: the collector's string as it is, `%d` for DCGM's integers and
    `%f` (six decimals) for its doubles."""
    return f"{value:.6f}" if decimal else str(int(value))


def go_value(value: float, decimal: bool) -> str:
    """dcgm-exporter from 4.8.3: the collector's string (`%d`, or `%f` for a double: six
    decimals) parsed to a float64 and written by prometheus/common's expfmt,
    `strconv.AppendFloat(f, 'g', -1, 64)`: the shortest digits that read back the same, in
    exponent form from 1e+06 and below 1e-04 (Go's 'g' with shortest precision switches at
    exponent 6): `115.325`, `0`, `4.335301032e+09`."""
    f = float(f"{value:.6f}") if decimal else float(value)
    if f == 0:
        return "0"
    if f.is_integer() and -_EXACT < f < _EXACT:  # an integer a float holds exactly: its digits
        n = int(f)
        if -1_000_000 < n < 1_000_000:
            return str(n)
        digits = str(abs(n))
        mantissa = digits.rstrip("0")
        point = "." + mantissa[1:] if len(mantissa) > 1 else ""
        return f"{'-' if n < 0 else ''}{mantissa[0]}{point}e+{len(digits) - 1:02d}"
    text = repr(f)  # Python's repr is the shortest round-trip digits too
    if "e" not in text and 1e-4 <= abs(f) < 1e6:
        return text
    sign, digits_, exponent = Decimal(text).normalize().as_tuple()
    assert isinstance(exponent, int)
    magnitude = len(digits_) + exponent - 1  # the power of ten of the first digit
    mantissa = "".join(map(str, digits_))
    mantissa = mantissa[0] + ("." + mantissa[1:] if len(mantissa) > 1 else "")
    if -4 <= magnitude < 6:  # only reached for repr's own exponent forms
        return format(Decimal(text).normalize(), "f")
    return f"{'-' if sign else ''}{mantissa}e{'-' if magnitude < 0 else '+'}{abs(magnitude):02d}"


_EXACT = float(2**53)  # below it a float's integer value has no more digits than its shortest form


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One dcgm-exporter generation's output (see the module's doc)."""

    name: str  # what --dcgm-exporter-version takes
    released: str
    dcgm: str  # the DCGM it ships with
    source: str  # where its facts were read
    counters_file: Path  # its default counters: fields, names (and so units), types, help
    # Labels: `pci_bus_id` after UUID; the hostname label's name.
    bus_label: bool
    hostname_label: Literal["Hostname", "hostname"]
    # A device nobody holds: container/namespace/pod="" (True) or no pod labels at all.
    free_pod_labels: bool
    # Families by name and each family's series by label signature (expfmt, from 4.8.3), or
    # families in the counters' order and series in the GPUs' order (the template).
    sorted_output: bool
    value_style: Literal["printf", "go"]
    # GPU_I_PROFILE: DCGM's name (`<slices>g.<ceil(MiB/1024)>gb`) or NVML's, as it returns it.
    profile_names: ProfileNames
    xid_labels: bool  # err_code and err_msg on DCGM_FI_DEV_XID_ERRORS
    # No DCGM_FI_DEV_XID_ERRORS series before a GPU's first Xid (DCGM has no sample, and the
    # exporter leaves a blank out: dcgm-exporter #646, #700), or a 0.
    xid_blank: bool
    dra: bool  # --kubernetes-enable-dra
    pod_labels: bool  # --kubernetes-enable-pod-labels
    pod_uid: bool  # --kubernetes-enable-pod-uid: pod_uid on a device plugin's holders and replicas
    dra_pod_uid: bool  # and on DRA-attributed series
    dra_uuid_always: bool  # dra_mig_device_uuid="" on a MIG device of unknown uuid (4.8.4: none)
    exporter_metrics: bool  # --enable-exporter-metrics
    # With --kubernetes-virtual-gpus, each holder's own FB_USED and GPU_UTIL from its processes
    # (from 4.5.3: its PR #594), beside the device's own.
    per_process: bool = False
    go: str = ""  # the Go release it was built with (go_info), where known
    aliases: tuple[str, ...] = ()

    @property
    def value_text(self) -> Callable[[float, bool], str]:
        """How it writes a value (an integer, or a double when `decimal`)."""
        return go_value if self.value_style == "go" else printf_value


G2022 = Generation(
    name="2022",
    aliases=("default",),
    released="2022",
    dcgm="2.x (driver 520.56.06)",
    source="the run:ai dumps in samples/mig/metrics/ (dcgm-exporter's template era)",
    counters_file=COUNTERS / "2022.csv",
    bus_label=False,
    hostname_label="Hostname",
    free_pod_labels=True,
    sorted_output=False,
    value_style="printf",
    profile_names="dcgm",
    xid_labels=False,
    xid_blank=False,
    dra=False,
    pod_labels=False,
    pod_uid=False,
    dra_pod_uid=False,
    dra_uuid_always=True,
    exporter_metrics=False,
)
# Each later generation as what changed from the one before.
G483 = replace(
    G2022,
    name="4.8.3",
    aliases=("4.8",),
    released="2026-07-15",
    dcgm="4.6.0",
    source="tag 4.6.0-4.8.3 (commit 7ad5832, its release PR #711)",
    counters_file=COUNTERS / "4.8.3.csv",
    bus_label=True,
    hostname_label="hostname",
    free_pod_labels=False,
    sorted_output=True,
    value_style="go",
    xid_labels=True,
    xid_blank=True,
    dra=True,
    pod_labels=True,
    pod_uid=True,
    per_process=True,
)
G484 = replace(
    G483,
    name="4.8.4",
    aliases=(),
    released="2026-09-18",
    dcgm="4.6.1",
    source="tag 4.6.1-4.8.4 (its release PR #745; code read at commits fafd151 and 8dc9e11)",
    counters_file=COUNTERS / "4.8.4.csv",
    profile_names="nvml",
    dra_pod_uid=True,
    dra_uuid_always=False,
    exporter_metrics=True,
    go="go1.27.1",
)
G490 = replace(
    G484,
    name="4.9.0",
    released="2026-10",
    dcgm="4.7.0",
    source="its release notes (no 4.9.0 code could be read: as 4.8.4, with DCGM 4.7's names)",
    counters_file=COUNTERS / "4.9.0.csv",
    go="go1.27.3",
)
GENERATIONS = (G2022, G483, G484, G490)
DEFAULT = G2022  # the design card's samples are this generation's
BY_NAME = {n: g for g in GENERATIONS for n in (g.name, *g.aliases)}
FIRST_WITH_DRA = next(g for g in GENERATIONS if g.dra)


def generation(name: str) -> Generation:
    """The generation a name or alias names; KeyError otherwise."""
    return BY_NAME[name]
