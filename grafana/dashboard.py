"""Grafana dashboard for the MIG instances this exporter serves, generated with the foundation SDK.

`grafana/mig-dashboard.json` is this module's output; edit the code here, never the JSON. From the
repository root, regenerate it with either of

    python -m grafana.dashboard
    python grafana/dashboard.py

(`grafana-foundation-sdk` comes with the test extras), and commit both files:
tests/deploy/test_dashboard.py fails while they disagree.

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

The pod table reads `exported_pod`, `exported_namespace` and `exported_container`: what the
exporter's `pod`, `namespace` and `container` labels become when Prometheus scrapes it with
`honor_labels: false`, its default.
"""

from __future__ import annotations

import json
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
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    VariableRefresh,
    VariableSort,
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
    """A DCGM field by its name up to 4.8.4 and by 4.9.0's, read back in the old name's unit."""

    old: str
    new: str
    to_old_unit: str = ""  # what turns the new name's value into the old unit

    def select(self, matchers: str) -> str:
        """The field's series under either name, in the old unit (a target serves one name)."""
        return f"({self.old}{{{matchers}}} or {self.new}{{{matchers}}}{self.to_old_unit})"

    def names(self) -> str:
        """A matcher of both names, for the variables' `label_values`."""
        return f'__name__=~"{self.old}|{self.new}"'


FB_USED = Field("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_USED_BYTES", " / 1048576")  # MiB
FB_FREE = Field("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_FREE_BYTES", " / 1048576")  # MiB
GR_ENGINE_ACTIVE = Field("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO")
POWER_USAGE = Field("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS")  # W both


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


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return (
        prometheus.Dataquery().datasource(DATASOURCE).expr(expr).legend_format(legend).ref_id("A")
    )


def _timeseries(
    title: str, description: str, expr: str, legend: str, unit: str, width: int = HALF
) -> timeseries.Panel:
    """A line per series, with a table legend showing the last and the highest value."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(_query(expr, legend))
        .unit(unit)
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
    model: dict[str, Any] = json.loads(json.dumps(builder.build(), cls=JSONEncoder))
    return model


def render(model: dict[str, Any]) -> str:
    """The committed file's text: sorted keys, two-space indent, a trailing newline."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def queries(model: dict[str, Any]) -> list[str]:
    """Every panel query's PromQL, in panel order, for tests that run them against Prometheus.

    The expressions use only the `$Hostname`, `$gpu` and `$GPU_I_PROFILE` variables, no other
    Grafana macro, so substituting `.*` for those makes them plain PromQL.
    """
    exprs: list[str] = []
    for panel in model.get("panels", []):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if isinstance(expr, str) and expr:
                exprs.append(expr)
    return exprs


def main() -> int:
    OUTPUT.write_text(render(build()), encoding="utf-8")
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
