"""Grafana dashboard for the MIG instances this exporter serves, generated with the foundation SDK.

`grafana/mig-dashboard.json` is this module's output; edit the code here, never the JSON. From the
repository root, regenerate it with either of

    python -m grafana.dashboard
    python grafana/dashboard.py

(`grafana-foundation-sdk` comes with the test extras), and commit both files:
tests/deploy/test_dashboard.py fails while they disagree. tests/grafana/test_dashboard_schema.py
holds the JSON to Grafana's own schema (`@grafana/schema` under `tsc --strict`: no key Grafana
does not know), and tests/deploy/test_promql.py parses every query with `promql-parser`.

Import it in Grafana with Dashboards > New > Import > Upload dashboard JSON file, or provision the
file from a ConfigMap. Pick the Prometheus data source in the `datasource` variable; every panel and
variable query goes through it. The `Hostname`, `gpu` and `GPU_I_PROFILE` variables narrow the
panels to nodes, GPUs and MIG profiles (multi-select, "All" matches `.*`).

Every query reads each dcgm-exporter generation (docs/upgrade.md) and shows what 2022's shows:
its names (`Hostname`, `GPU_I_PROFILE` without NVML's `MIG ` prefix) and its units (MiB, not
4.9.0's bytes), so one dashboard serves a fleet before, during and after an upgrade, and a
panel's lines go on across it. The fragments that know the generations are `HOST_MATCHERS`,
`PROFILE_MATCHER`, the `Field`s and `as_2022` below; tests/live/test_prometheus_generations.py
runs every query against each generation's exporter and compares the answers.

The Health row shows each physical GPU's errors (last Xid, ECC, remapped rows, PCIe replays,
NVLink CRC errors, time throttled) and how many GPUs each node serves: what the GPU health alerts
of deploy/base/prometheus-rule.yaml read. ECC, NVLink CRC and violation times (`OPT_IN`) are in
no generation's default counters file; their panels stay empty until a counters file asks for
them, and `queries` leaves them out unless asked (tests/live/test_prometheus_faults.py runs them).

The pod table reads `exported_pod`, `exported_namespace` and `exported_container`: what the
exporter's `pod`, `namespace` and `container` labels become when Prometheus scrapes it with
`honor_labels: false`, its default.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as dashboard_builders
from grafana_foundation_sdk.builders import prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    Dashboard,
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    VariableRefresh,
    VariableSort,
    VariableType,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUTPUT = Path(__file__).resolve().parent / "mig-dashboard.json"

UID = "mig-exporter"
TITLE = "MIG instances (dcgm-exporter)"

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

# What changed across dcgm-exporter's generations (docs/upgrade.md), in one place: the hostname
# label is `Hostname` up to 2022 and `hostname` from 4.8.3; GPU_I_PROFILE is NVML's name from 4.8.4,
# `MIG 1g.5gb` for 2022's `1g.5gb`; 4.9.0 renames fields and serves some in base units. The queries
# select both sides and show the old names and units.

# A series carries one of the two hostname labels: the other is absent, and matches as empty.
HOST_MATCHERS = 'Hostname=~"$Hostname|", hostname=~"$Hostname|"'
# A chosen profile with or without NVML's prefix ("All" is `.*`: whole GPUs, no profile, too).
PROFILE_MATCHER = 'GPU_I_PROFILE=~"(MIG )?($GPU_I_PROFILE)"'
# Label matchers shared by the queries: GPU-level series (power) and per-MIG-instance series.
GPU_MATCHERS = HOST_MATCHERS + ', gpu=~"$gpu"'
INSTANCE_MATCHERS = GPU_MATCHERS + ", " + PROFILE_MATCHER
INSTANCE_LABELS = "Hostname, gpu, GPU_I_PROFILE, GPU_I_ID"
INSTANCE_LEGEND = "{{Hostname}} gpu {{gpu}} {{GPU_I_PROFILE}} GI {{GPU_I_ID}}"


@dataclass(frozen=True)
class Field:
    """A DCGM field by its name up to 4.8.4 and by 4.9.0's, read back in the old name's unit
    (`new` empty: the same name in every generation)."""

    old: str
    new: str = ""
    to_old_unit: str = ""  # what turns the new name's value into the old unit

    def select(self, matchers: str) -> str:
        """The field's series under either name, in the old unit (a target serves one name)."""
        if not self.new:
            return f"{self.old}{{{matchers}}}"
        return f"({self.old}{{{matchers}}} or {self.new}{{{matchers}}}{self.to_old_unit})"

    def rate(self, matchers: str) -> str:
        """A counter's per-second rate over 5 minutes, under either name, in the old unit."""
        if not self.new:
            return f"rate({self.old}{{{matchers}}}[5m])"
        return (
            f"(rate({self.old}{{{matchers}}}[5m]) or "
            f"rate({self.new}{{{matchers}}}[5m]){self.to_old_unit})"
        )

    def names(self) -> str:
        """A matcher of both names, for the variables' `label_values`."""
        return f'__name__=~"{self.old}|{self.new}"'


FB_USED = Field("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", " / 1048576")  # MiB
FB_FREE = Field("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES", " / 1048576")  # MiB
GR_ENGINE_ACTIVE = Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO")
POWER_USAGE = Field("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS")  # W both
# The health row's fields (docs/faults.md has what each fault moves). Every generation's default
# counters file has the first ones; `OPT_IN` are commented out in each (dcgm-exporter's own
# default file too), so their panels are empty until a counters file asks for them
# (docs/prometheus-grafana.md, "Health row", has the lines).
XID = Field("DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR")
GPU_TEMP = Field("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS")
REMAPPED_UNCORRECTABLE = Field(
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL"
)
REMAPPED_CORRECTABLE = Field(
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"
)
REMAP_FAILURE = Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED")
PCIE_REPLAY = Field("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL")
ECC_SBE = Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
ECC_DBE = Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")
NVLINK_CRC_FLIT = Field(
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL"
)
NVLINK_CRC_DATA = Field(
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL"
)
THERMAL_VIOLATION = Field("DCGM_FI_DEV_THERMAL_VIOLATION")  # ns throttled, whatever the help says
POWER_VIOLATION = Field("DCGM_FI_DEV_POWER_VIOLATION")
OPT_IN = (ECC_SBE, ECC_DBE, NVLINK_CRC_FLIT, NVLINK_CRC_DATA, THERMAL_VIOLATION, POWER_VIOLATION)


def with_hostname(expr: str) -> str:
    """`Hostname` set from `hostname` where a generation names it so."""
    return f'label_replace({expr}, "Hostname", "$1", "hostname", "(.+)")'


def as_2022(expr: str) -> str:
    """2022's labels whatever the generation: `Hostname`, and GPU_I_PROFILE without `MIG `."""
    return (
        f'label_replace({with_hostname(expr)}, "GPU_I_PROFILE", "$1", "GPU_I_PROFILE", "MIG (.+)")'
    )


def per_instance(expr: str) -> str:
    """One series per MIG instance (or whole GPU), labelled as in 2022 on every generation."""
    return f"max by ({INSTANCE_LABELS}) ({as_2022(expr)})"


GPU_LABELS = "Hostname, gpu"
GPU_LEGEND = "{{Hostname}} gpu {{gpu}}"


def per_gpu(expr: str) -> str:
    """One series per physical GPU, labelled `Hostname` on every generation: a MIG instance
    repeats its GPU's fields."""
    return f"max by ({GPU_LABELS}) ({with_hostname(expr)})"


HEIGHT = 8
HALF = 12
FULL = 24


def _variable(
    name: str, label: str, query: str, regex: str = ""
) -> dashboard_builders.QueryVariable:
    """A multi-select variable whose "All" matches every value; `regex` keeps its first group
    of each value the query lists (Grafana lists each resulting value once)."""
    variable = (
        dashboard_builders.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.NATURAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )
    return variable.regex(regex) if regex else variable


def _query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().datasource(DATASOURCE).expr(expr).legend_format(legend).ref_id(ref)
    )


def _timeseries(
    title: str,
    description: str,
    expr: str,
    legend: str,
    unit: str,
    width: int = HALF,
    more: tuple[tuple[str, str], ...] = (),
) -> timeseries.Panel:
    """A line per series, with a table legend showing the last and the highest value; `more`
    queries (expression, legend) add their lines to the first's."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(_query(expr, legend))
    )
    for ref, (other, other_legend) in zip("BCDEF", more, strict=False):
        panel = panel.with_target(_query(other, other_legend, ref))
    panel = (
        panel.unit(unit)
        .min(0)
        .height(HEIGHT)
        .span(width)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(
            common_builders.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    if unit == "percentunit":
        panel = panel.max(1)
    return panel


def _pod_table() -> table.Panel:
    labels = f"{INSTANCE_LABELS}, exported_namespace, exported_pod, exported_container"
    held = FB_USED.select(INSTANCE_MATCHERS + ', exported_pod!=""')
    expr = f"max by ({labels}) ({as_2022(held)})"
    columns = [
        "Hostname",
        "gpu",
        "GPU_I_PROFILE",
        "GPU_I_ID",
        "exported_namespace",
        "exported_pod",
        "exported_container",
        "Value",
    ]
    organize = DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True},
            "indexByName": {name: index for index, name in enumerate(columns)},
            "renameByName": {
                "GPU_I_PROFILE": "profile",
                "GPU_I_ID": "GPU instance",
                "exported_namespace": "namespace",
                "exported_pod": "pod",
                "exported_container": "container",
                "Value": "frame buffer used",
            },
        },
    )
    query = (
        prometheus.Dataquery()
        .datasource(DATASOURCE)
        .expr(expr)
        .instant()
        .format(PromQueryFormat.TABLE)
        .legend_format("__auto")
        .ref_id("A")
    )
    return (
        table.Panel()
        .title("Which pod holds which instance")
        .description(
            "The pod, namespace and container each MIG instance is allocated to now, with the "
            "frame buffer it uses. Instances without a pod are left out."
        )
        .datasource(DATASOURCE)
        .with_target(query)
        .with_transformation(organize)
        .unit("decmbytes")
        .filterable(True)
        .height(HEIGHT)
        .span(FULL)
    )


def _health_panels() -> list[timeseries.Panel]:
    """The Health row: per physical GPU (the profile filter does not apply), what the fault
    alerts of deploy/base/prometheus-rule.yaml read."""
    m = GPU_MATCHERS
    return [
        _timeseries(
            "Last Xid per GPU",
            "The last Xid each GPU reported (DCGM_FI_DEV_XID_ERRORS, or 4.9.0's "
            "DCGM_FI_DEV_XID_ERROR), 0 for none: from 4.8.3 a GPU has no Xid series before its "
            "first Xid, so every GPU serving a temperature reads 0 until then. DCGM holds the "
            "last Xid until the next one or an exporter restart. Fatal ones (48, 64, 74, 79, 95, "
            "119, 120, 140) alert GpuXidFatal.",
            per_gpu(f"{XID.select(m)} or {GPU_TEMP.select(m)} * 0"),
            GPU_LEGEND,
            "none",
        ),
        _timeseries(
            "ECC errors per GPU (rate)",
            "Single- and double-bit ECC errors a second over 5 minutes "
            "(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL). Not in any "
            "default counters file: empty until yours has their lines. A double-bit error "
            "alerts GpuEccDoubleBitError.",
            per_gpu(ECC_SBE.rate(m)),
            GPU_LEGEND + " single-bit",
            "cps",
            more=((per_gpu(ECC_DBE.rate(m)), GPU_LEGEND + " double-bit"),),
        ),
        _timeseries(
            "Remapped rows and remap failure per GPU",
            "Rows remapped for uncorrectable and for correctable memory errors "
            "(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, _CORRECTABLE_; 4.9.0's "
            "DCGM_FI_DEV_ROW_REMAP_*_TOTAL), and whether remapping failed (1: "
            "DCGM_FI_DEV_ROW_REMAP_FAILURE, 4.9.0's _FAILED; alerts GpuRowRemapFailure). "
            "DCGM serves them for GPUs with MIG off.",
            per_gpu(REMAPPED_UNCORRECTABLE.select(m)),
            GPU_LEGEND + " uncorrectable",
            "none",
            more=(
                (per_gpu(REMAPPED_CORRECTABLE.select(m)), GPU_LEGEND + " correctable"),
                (per_gpu(REMAP_FAILURE.select(m)), GPU_LEGEND + " remap failed"),
            ),
        ),
        _timeseries(
            "PCIe replays and NVLink CRC errors per GPU (rate)",
            "PCIe replays a second over 5 minutes (DCGM_FI_DEV_PCIE_REPLAY_COUNTER, 4.9.0's "
            "DCGM_FI_DEV_PCIE_REPLAY_TOTAL), and NVLink flow-control and data CRC errors "
            "(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, _DATA_; not in any default "
            "counters file).",
            per_gpu(PCIE_REPLAY.rate(m)),
            GPU_LEGEND + " PCIe replays",
            "cps",
            more=(
                (per_gpu(NVLINK_CRC_FLIT.rate(m)), GPU_LEGEND + " NVLink CRC flit"),
                (per_gpu(NVLINK_CRC_DATA.rate(m)), GPU_LEGEND + " NVLink CRC data"),
            ),
        ),
        _timeseries(
            "Time throttled per GPU (fraction)",
            "Share of the last 5 minutes each GPU's clocks were held down for heat and for "
            "power: the rate of DCGM_FI_DEV_THERMAL_VIOLATION and DCGM_FI_DEV_POWER_VIOLATION, "
            "nanoseconds a second, over 10^9. Not in any default counters file. Minutes of it "
            "alert GpuThermalThrottling and GpuPowerThrottling.",
            per_gpu(f"{THERMAL_VIOLATION.rate(m)} / 1e9"),
            GPU_LEGEND + " thermal",
            "percentunit",
            more=((per_gpu(f"{POWER_VIOLATION.rate(m)} / 1e9"), GPU_LEGEND + " power"),),
        ),
        _timeseries(
            "GPUs reporting per node",
            "How many GPUs of each node serve series (a temperature, DCGM_FI_DEV_GPU_TEMP or "
            "4.9.0's DCGM_FI_DEV_GPU_TEMP_CELSIUS). A drop while the node still answers is a "
            "GPU DCGM can no longer read (fallen off the bus): GpuLost alerts it.",
            f"count by (Hostname) ({per_gpu(GPU_TEMP.select(m))})",
            "{{Hostname}}",
            "none",
        ),
    ]


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model, plain dicts and lists."""
    fb_used = FB_USED.select(INSTANCE_MATCHERS)
    fb_free = FB_FREE.select(INSTANCE_MATCHERS)
    panels: list[timeseries.Panel | table.Panel] = [
        _timeseries(
            "Frame buffer used per instance",
            "Frame buffer memory (MiB) in use on each MIG instance (DCGM_FI_DEV_FB_USED, "
            "or 4.9.0's DCGM_FI_DEV_FB_USED_BYTES in MiB).",
            per_instance(fb_used),
            INSTANCE_LEGEND,
            "decmbytes",
        ),
        _timeseries(
            "Frame buffer free per instance",
            "Frame buffer memory (MiB) still free on each MIG instance (DCGM_FI_DEV_FB_FREE, "
            "or 4.9.0's DCGM_FI_DEV_FB_FREE_BYTES in MiB).",
            per_instance(fb_free),
            INSTANCE_LEGEND,
            "decmbytes",
        ),
        _timeseries(
            "Memory used per instance (fraction)",
            "Share of each MIG instance's frame buffer in use: FB_USED / (FB_USED + FB_FREE).",
            per_instance(f"{fb_used} / ({fb_used} + {fb_free})"),
            INSTANCE_LEGEND,
            "percentunit",
        ),
        _timeseries(
            "Graphics engine activity per instance",
            "Fraction of time the graphics engine of each MIG instance was busy "
            "(DCGM_FI_PROF_GR_ENGINE_ACTIVE, or 4.9.0's DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO; "
            "0 to 1).",
            per_instance(GR_ENGINE_ACTIVE.select(INSTANCE_MATCHERS)),
            INSTANCE_LEGEND,
            "percentunit",
        ),
        _timeseries(
            "Power per GPU",
            "Power draw (W) of each physical GPU (DCGM_FI_DEV_POWER_USAGE, or 4.9.0's "
            "DCGM_FI_DEV_BOARD_POWER_WATTS). It is a GPU-level "
            "field repeated on every MIG instance, so the query keeps one series per GPU; "
            "the MIG profile filter does not apply.",
            f"max by (Hostname, gpu) ({with_hostname(POWER_USAGE.select(GPU_MATCHERS))})",
            "{{Hostname}} gpu {{gpu}}",
            "watt",
            width=FULL,
        ),
        _pod_table(),
    ]
    builder = (
        dashboard_builders.Dashboard(TITLE)
        .uid(UID)
        .description("Frame buffer, activity, power and pods of NVIDIA MIG instances.")
        .tags(["gpu", "mig", "dcgm-exporter"])
        .editable()
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard_builders.DatasourceVariable("datasource")
            .label("Data source")
            .type("prometheus")
        )
        # The hosts under either label: `label_values` reads one, so the Hostname and hostname
        # of each host's series are listed and the regex picks whichever is there.
        .with_variable(
            _variable(
                "Hostname",
                "Host",
                f"query_result(count by (Hostname, hostname) ({{{FB_USED.names()}}}))",
                regex='/[Hh]ostname="([^"]+)"/',
            )
        )
        .with_variable(
            _variable("gpu", "GPU", f"label_values({{{FB_USED.names()}, {HOST_MATCHERS}}}, gpu)")
        )
        .with_variable(
            _variable(
                "GPU_I_PROFILE",
                "MIG profile",
                f"label_values({{{FB_USED.names()}, {GPU_MATCHERS}}}, GPU_I_PROFILE)",
                regex="/^(?:MIG )?(.+)$/",  # 2022's names: NVML's without its prefix
            )
        )
    )
    # The builder positions panels left to right, wrapping at 24 columns; ids keep links stable.
    for number, panel in enumerate(panels, start=1):
        builder = builder.with_panel(panel.id(number))
    # The Health row, open: its panels follow it at the top level (numbered after it).
    row = len(panels) + 1
    builder = builder.with_row(dashboard_builders.Row("Health").id(row).collapsed(False))
    for number, panel in enumerate(_health_panels(), start=row + 1):
        builder = builder.with_panel(panel.id(number))
    built = without_interval_settings(builder.build())
    model: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder))
    return model


def without_interval_settings(built: Dashboard) -> Dashboard:
    """The dashboard without the defaults the SDK writes for `auto`, `auto_min` and
    `auto_count` on every variable: they are an interval variable's "Auto" option, Grafana's
    schema (`@grafana/schema`) has no such keys on the others
    (tests/grafana/test_dashboard_schema.py)."""
    for variable in built.templating.list_val or []:
        if variable.type_val != VariableType.INTERVAL:
            variable.auto = variable.auto_min = variable.auto_count = None
    return built


def render(model: dict[str, Any]) -> str:
    """The committed file's text: sorted keys, two-space indent, a trailing newline."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def queries(model: dict[str, Any], opt_in: bool = False) -> list[str]:
    """Every panel query's PromQL, in panel order (a collapsed row's panels too), for tests that
    run them against Prometheus: those that have data on an exporter serving its generation's
    default counters, or with `opt_in` also those reading a field a counters file must ask for
    (`OPT_IN`: ECC, NVLink CRC, violation times), empty there.

    The expressions use only the `$Hostname`, `$gpu` and `$GPU_I_PROFILE` variables, no other
    Grafana macro, so substituting `.*` for those makes them plain PromQL.
    """
    opt_in_names = re.compile(
        r"\b(" + "|".join(n for f in OPT_IN for n in (f.old, f.new) if n) + r")\{"
    )
    exprs: list[str] = []
    for panel in model.get("panels", []):
        for inner in (panel, *panel.get("panels", [])):
            for target in inner.get("targets", []):
                expr = target.get("expr")
                if isinstance(expr, str) and expr and (opt_in or not opt_in_names.search(expr)):
                    exprs.append(expr)
    return exprs


def main() -> int:
    OUTPUT.write_text(render(build()), encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
