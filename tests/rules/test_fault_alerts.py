"""The GPU health alerts of deploy/base/prometheus-rule.yaml, unit-tested by promtool on the
simulator's own output under each fault, for every dcgm-exporter generation.

Each case is a node of four A100s (GPU 3 in MIG mode, two instances) whose `faults:` are written
as the updater writes them into topology.yml (topology/model.py: fault, since, until, xid, count,
source). The exporter serves it (exporter.dcgm.render: what `python -m exporter --once` prints at
that time) once a minute for half an hour, as each generation, with its default counters file or
with the opt-in lines an alert needs (ECC, clocks-event reasons, violation times, power limit).
Each sample is stored as a Prometheus scraping it through deploy/base/servicemonitor.yaml would
(empty labels dropped, the exporter's pod/namespace/container renamed exported_*, the target's
labels added; a series gone from a scrape is marked stale). Only the families the rules read are
kept. Then `promtool test rules` checks every health alert at each checkpoint: which GPUs alert,
with which labels and text, and that no other GPU does.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter import dcgm
from exporter.fields import Counters, parse_counters
from exporter.generations import G490, GENERATIONS, Generation
from tests.support.base import ROOT
from tests.support.promtext import parse
from topology.model import NodeTopology, load_yaml, time_text

RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"
GROUP = "mig-exporter-gpu-health.rules"
ALERTS = (
    "GpuXidFatal", "GpuXidError", "GpuEccDoubleBitError", "GpuRowRemapFailure", "GpuLost",
    "GpuThermalThrottling", "GpuPowerThrottling",
)  # fmt: skip
NODE = "gpu-node-1"
MODEL = "NVIDIA A100-SXM4-40GB"
UUIDS = (
    "GPU-0b6f3c1e-3a55-4c0e-9d7a-2f1e8c9b4a10",
    "GPU-1c7a4d2f-4b66-4d1f-8e8b-3a2f9dac5b21",
    "GPU-2d8b5e3a-5c77-4e2a-9f9c-4b3a0ebd6c32",
    "GPU-3e9c6f4b-6d88-4f3b-a0ad-5c4b1fce7d43",  # MIG mode: a 2g.10gb and a 1g.5gb
)
T0 = 1_790_000_040  # on a minute, so on the exporter's 10-s collection steps
MINUTES = 30
# What Prometheus adds scraping the exporter through servicemonitor.yaml (honorLabels false).
TARGET = {
    "instance": "10.244.1.7:9400", "job": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
    "pod": "nvidia-dcgm-exporter-7xk2p", "service": "nvidia-dcgm-exporter",
    "container": "nvidia-dcgm-exporter", "endpoint": "gpu-metrics",
}  # fmt: skip

# Counters file lines no generation's default file has, as docs/prometheus-grafana.md gives them:
# 4.9.0 under DCGM 4.7's names where it renames (its users would write those).
ECC = (
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.\n"
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.\n"
)
VIOLATIONS = (
    "DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in us).\n"
    "DCGM_FI_DEV_THERMAL_VIOLATION, counter, Throttling duration due to thermal constraints (in us).\n"
)


def reasons(g: Generation) -> str:
    name = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" if g is G490 else "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"
    return f"{name}, gauge, Current clock throttle reasons.\n"


def power_limit(g: Generation) -> str:
    name = (
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS" if g is G490
        else "DCGM_FI_DEV_POWER_MGMT_LIMIT"
    )  # fmt: skip
    return f"{name}, gauge, Power management limit (in W).\n"


OPT_IN: dict[str, Callable[[Generation], str]] = {
    "default": lambda g: "",
    "ecc": lambda g: ECC,
    "reasons": lambda g: ECC + reasons(g) + VIOLATIONS + power_limit(g),
    "violations": lambda g: VIOLATIONS,
    "power-limit": power_limit,
}


@dataclass(frozen=True, eq=False)  # hashed by identity: scraped() caches by case
class Case:
    """One node's faults (by GPU index: the `faults:` entries, `since`/`until` in minutes from
    the start), the counters lines served, and the alerts expected at each checkpoint minute
    (alert -> {GPU index: $value}; an alert not named expects none)."""

    name: str
    faults: dict[int, list[dict[str, Any]]]
    counters: str
    checks: dict[int, dict[str, dict[int, float]]] = field(default_factory=dict)


CASES = (
    # Fatal and other Xids: GPU 0's 119 (GSP RPC timeout) is overwritten by an application's 13
    # at 20m; GPU 1's 94 (contained ECC error) warns; GPU 3's 48 is seen on both its MIG
    # instances, one alert. GPU 2 never alerts.
    Case(
        "xid",
        {
            0: [{"fault": "xid", "since": 3, "xid": 119}, {"fault": "xid", "since": 20, "xid": 13}],
            1: [{"fault": "xid", "since": 3, "xid": 94}],
            3: [{"fault": "xid", "since": 3, "xid": 48}],
        },
        "default",
        {
            2: {},
            4: {"GpuXidFatal": {0: 119, 3: 48}, "GpuXidError": {1: 94}},
            22: {"GpuXidFatal": {3: 48}, "GpuXidError": {1: 94}},
        },
    ),
    # Two double-bit errors at 5m (with their Xid 48): the ECC alert while they are within its
    # 10-minute window, the Xid's for as long as it is the last one.
    Case(
        "ecc-dbe",
        {0: [{"fault": "ecc-dbe", "since": 5, "count": 2}]},
        "ecc",
        {
            4: {},
            6: {"GpuEccDoubleBitError": {0: 1}, "GpuXidFatal": {0: 48}},
            20: {"GpuXidFatal": {0: 48}},
        },
    ),
    # Row remapping failed on GPU 1 (Xid 64); a row remapped on GPU 0 (Xid 63) only warns.
    Case(
        "row-remap",
        {
            0: [{"fault": "row-remap", "since": 4, "count": 1}],
            1: [{"fault": "row-remap-failure", "since": 4}],
        },
        "default",
        {3: {}, 5: {"GpuRowRemapFailure": {1: 1}, "GpuXidFatal": {1: 64}, "GpuXidError": {0: 63}}},
    ),
    # GPU 1 lost from 5m to 15m, GPU 3 (MIG) fallen off the bus (Xid 79) from 5m: alerts once
    # gone for 2 minutes, while GPUs 0 and 2 still serve; GPU 1's ends when it is back.
    Case(
        "lost",
        {
            1: [{"fault": "lost", "since": 5, "until": 15}],
            3: [{"fault": "xid", "since": 5, "xid": 79}],
        },
        "default",
        {4: {}, 6: {}, 8: {"GpuLost": {1: 1, 3: 1}}, 18: {"GpuLost": {3: 1}}},
    ),
)
# Thermal (GPU 0) and power (GPU 1) throttling from 2m, read from what each counters file has:
# the temperature by default (power at its limit cannot be told without the limit), the reasons,
# the violation times, or power against its limit.
THROTTLE = {0: [{"fault": "thermal", "since": 2}], 1: [{"fault": "power", "since": 2}]}
CASES += (
    Case("throttle-default", THROTTLE, "default",
         {6: {}, 8: {"GpuThermalThrottling": {0: 1}}}),
    Case("throttle-reasons", THROTTLE, "reasons",
         {6: {}, 8: {"GpuThermalThrottling": {0: 1}, "GpuPowerThrottling": {1: 1}}}),
    Case("throttle-violations", THROTTLE, "violations",
         {8: {}, 11: {"GpuThermalThrottling": {0: 1}, "GpuPowerThrottling": {1: 1}}}),
    Case("throttle-power-limit", THROTTLE, "power-limit",
         {6: {}, 8: {"GpuThermalThrottling": {0: 1}, "GpuPowerThrottling": {1: 1}}}),
)  # fmt: skip


def topology(case: Case) -> NodeTopology:
    """The node as topology.yml carries it, faults and all."""
    lines = [
        "mig-strategy: mixed", "nodes:", f"  {NODE}:", "    gpu-count: 4",
        "    gpu-memory: 40960", "    gpu-product: NVIDIA-A100-SXM4-40GB",
        "    is-dynamic-mig-enabled: false", "    gpus:",
    ]  # fmt: skip
    for index, uuid in enumerate(UUIDS):
        lines.append(f"    - id: {uuid}")
        if index == 3:
            lines += [
                "      mig-devices:",
                "      - {name: 2g.10gb, position: 0, gpu-instance-id: 5}",
                "      - {name: 1g.5gb, position: 4, gpu-instance-id: 7}",
            ]
        if entries := case.faults.get(index):
            lines.append("      faults:")
            for entry in entries:
                keys = {**entry, "source": "annotation"}
                for key in ("since", "until"):
                    if key in keys:
                        keys[key] = f'"{time_text(T0 + 60 * keys[key])}"'
                first, *rest = (f"{k}: {v}" for k, v in keys.items())
                lines += [f"      - {first}", *(f"        {r}" for r in rest)]
    return load_yaml("\n".join(lines) + "\n").nodes[NODE]


@cache
def rule_fields() -> frozenset[str]:
    """The fields the health alerts read."""
    return frozenset(re.findall(r"DCGM_FI_\w+", yaml.safe_dump(rules_by_alert())))


def counters(g: Generation, opt_in: str) -> Counters:
    text = g.counters_file.read_text() + OPT_IN[opt_in](g)
    found, warnings = parse_counters(text, f"{g.name} + {opt_in}")
    assert not warnings, warnings
    return found


def stored(labels: Iterable[tuple[str, str]]) -> dict[str, str]:
    """A series' labels as Prometheus stores them from the target."""
    out = {}
    for name, value in labels:
        if value:
            out[f"exported_{name}" if name in TARGET else name] = value
    return {**out, **TARGET}


def series_text(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


@cache
def scraped(case: Case, g: Generation) -> dict[str, list[float | None]]:
    """Each series the rules read, by its text, with its value at each minute (None: absent)."""
    node = topology(case)
    options = dcgm.Options(NODE, generation=g, counters=counters(g, case.counters))
    read = rule_fields()
    out: dict[str, list[float | None]] = {}
    for minute in range(MINUTES + 1):
        text = dcgm.render(node, options, T0 + 60 * minute).decode()
        # The families read, parsed (and so checked) whole: a family's lines all start with its
        # name, its HELP and TYPE lines with `# HELP <name> `, `# TYPE <name> `.
        kept = "".join(
            line for line in text.splitlines(keepends=True)
            if (line.split(" ", 3)[2] if line.startswith("#") else re.split(r"[{ ]", line)[0])
            in read
        )  # fmt: skip
        for s in parse(kept):
            key = series_text(s.name, stored(s.labels))
            out.setdefault(key, [None] * (MINUTES + 1))[minute] = s.value
    return out


def values_text(values: list[float | None]) -> str:
    """promtool's notation: a value, `_` for none, `stale` where a series has just gone."""
    out = []
    for i, v in enumerate(values):
        if v is not None:
            out.append(repr(v))
        else:
            out.append("stale" if i and values[i - 1] is not None else "_")
    return " ".join(out)


@cache
def rules_by_alert() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load(RULE.read_text())["spec"]
    (group,) = [g for g in spec["groups"] if g["name"] == GROUP]
    return {r["alert"]: r for r in group["rules"] if "alert" in r}


def template(text: str, labels: dict[str, str], value: float) -> str:
    """The annotation as Prometheus writes it: the forms the rules use, `{{ $labels.x }}` and
    `{{ $value }}` (an integer's digits)."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
    return text.replace("{{ $value }}", f"{value:g}")


def expected(alert: str, gpus: dict[int, float]) -> list[dict[str, Any]]:
    rule = rules_by_alert()[alert]
    out = []
    for index, value in sorted(gpus.items()):
        gpu = {"Hostname": NODE, "gpu": str(index), "UUID": UUIDS[index], "modelName": MODEL}
        out.append(
            {
                "exp_labels": {**rule["labels"], **gpu},
                "exp_annotations": {
                    k: template(v, gpu, value) for k, v in rule["annotations"].items()
                },
            }
        )
    return out


def unit_tests(names: tuple[str, ...] = ()) -> dict[str, Any]:
    """The promtool unit tests: one group per case (those `names`d, or all) and generation."""
    groups = []
    for case in CASES:
        if names and case.name not in names:
            continue
        for g in GENERATIONS:
            series = scraped(case, g)
            assert series, (case.name, g.name)
            checks = [
                {"eval_time": f"{minute}m", "alertname": alert,
                 "exp_alerts": expected(alert, firing.get(alert, {}))}
                for minute, firing in sorted(case.checks.items())
                for alert in ALERTS
            ]  # fmt: skip
            groups.append(
                {
                    "name": f"{case.name} on {g.name}",
                    "interval": "1m",
                    "input_series": [
                        {"series": s, "values": values_text(v)} for s, v in sorted(series.items())
                    ],
                    "alert_rule_test": checks,
                }
            )
    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": groups}


@cache
def unit_test_text(names: tuple[str, ...] = ()) -> str:
    """The unit tests as promtool reads them (JSON is YAML, and quick to write)."""
    return json.dumps(unit_tests(names), indent=1)


def promtool_test(
    tmp_path: Path, rule_text: str, names: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, "promtool is required: run ./scripts/install-test-tools"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(yaml.safe_load(rule_text)["spec"]))
    (tmp_path / "faults-test.yaml").write_text(unit_test_text(names))
    return subprocess.run(
        [binary, "test", "rules", "faults-test.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_cases_check_every_health_alert_firing() -> None:
    """Each alert fires in some case, on some generation-independent GPU, so none passes by
    never firing; and every case's faults are what the exporter serves (not a silent no-op)."""
    fired = {a for case in CASES for check in case.checks.values() for a in check if check[a]}
    assert fired == set(ALERTS)
    assert set(rules_by_alert()) == set(ALERTS)
    for case in CASES:
        assert any(case.faults.values()), case.name


def test_the_simulator_serves_each_fault_as_its_generation() -> None:
    """The input really differs by generation: 2022's Xid 0 on a healthy GPU, none from 4.8.3
    (and its err_code), 4.9.0's names."""
    case = CASES[0]
    names = {g.name: {k.split("{")[0] for k in scraped(case, g)} for g in GENERATIONS}
    assert "DCGM_FI_DEV_XID_ERROR" in names["4.9.0"] and "DCGM_FI_DEV_XID_ERRORS" in names["2022"]
    healthy_2022 = [v for k, v in scraped(case, GENERATIONS[0]).items()
                    if k.startswith("DCGM_FI_DEV_XID_ERRORS{") and UUIDS[2] in k]  # fmt: skip
    assert healthy_2022 == [[0.0] * (MINUTES + 1)]
    for g in GENERATIONS[1:]:
        xids = [k for k in scraped(case, g) if k.startswith("DCGM_FI_DEV_XID_ERROR")]
        assert (
            xids and all('err_code="' in k for k in xids) and not any(UUIDS[2] in k for k in xids)
        )


def test_the_health_alerts_on_the_simulators_output(tmp_path: Path) -> None:
    result = promtool_test(tmp_path, RULE.read_text())
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


# A rule broken as an edit could break it, and the case that must catch it (promtool runs that
# case only, on every generation).
BROKEN = [
    ("4.9.0's Xid name", "xid", "(DCGM_FI_DEV_XID_ERRORS or DCGM_FI_DEV_XID_ERROR) == 48",
     "DCGM_FI_DEV_XID_ERRORS == 48"),
    ("a fatal Xid left out", "xid", "or DCGM_FI_DEV_XID_ERROR) == 119",
     "or DCGM_FI_DEV_XID_ERROR) == 1190"),
    ("a warning Xid left out", "xid", "or DCGM_FI_DEV_XID_ERROR) == 94",
     "or DCGM_FI_DEV_XID_ERROR) == 940"),
    ("an application's Xid made fatal", "xid", "or DCGM_FI_DEV_XID_ERROR) == 120",
     "or DCGM_FI_DEV_XID_ERROR) == 13"),
    ("the ECC window", "ecc-dbe", "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m])",
     "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[30m])"),
    ("4.9.0's remap name", "row-remap",
     "DCGM_FI_DEV_ROW_REMAP_FAILURE or DCGM_FI_DEV_ROW_REMAP_FAILED",
     "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    ("the lost GPU's patience", "lost", "for: 2m", "for: 10m"),
    ("a lost GPU's node by 4.8.3's hostname", "lost",
     'label_replace(DCGM_FI_DEV_GPU_TEMP or DCGM_FI_DEV_GPU_TEMP_CELSIUS, "Hostname"',
     'label_replace(DCGM_FI_DEV_GPU_TEMP or DCGM_FI_DEV_GPU_TEMP_CELSIUS, "x"'),
    ("the temperature threshold", "throttle-default", ">= 80", ">= 90"),
    ("the thermal reason bits", "throttle-reasons", "/ 32) % 4 > 0", "/ 128) % 4 > 0"),
    ("the power cap bit", "throttle-reasons", "/ 4) % 2 == 1", "/ 8) % 2 == 1"),
    ("4.9.0's reasons name", "throttle-reasons",
     "floor((DCGM_FI_DEV_CLOCK_THROTTLE_REASONS or DCGM_FI_DEV_CLOCKS_EVENT_REASONS) / 4)",
     "floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS / 4)"),
    ("violation time in ns", "throttle-violations",
     "rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) > 0.5e9",
     "rate(DCGM_FI_DEV_POWER_VIOLATION[5m]) > 0.5e12"),
    ("the power limit", "throttle-power-limit", ">= 0.98 *", ">= 1.01 *"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "case", "old", "new"), BROKEN, ids=[b[0] for b in BROKEN])
def test_the_unit_tests_catch_a_broken_rule(
    tmp_path: Path, what: str, case: str, old: str, new: str
) -> None:
    text = RULE.read_text()
    assert text.count(old) == 1, what
    assert case in {c.name for c in CASES}, what
    result = promtool_test(tmp_path, text.replace(old, new), (case,))
    assert result.returncode != 0, f"{what}: a broken rule passed its unit tests"
    out = result.stdout + result.stderr
    assert "alertname: " in out, f"{what}: not an alert that failed\n{out[-3000:]}"
