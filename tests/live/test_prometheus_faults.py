"""The GPU health alerts and the dashboard's Health row, live: a real Prometheus (Debian's)
scrapes exporters serving GPUs with faults, once per dcgm-exporter generation, and evaluates the
shipped PrometheusRule.

Each generation's exporter serves the same node of four A100s (its own host name,
`gpu-node-gen<version>`), with a counters file that adds the opt-in lines an alert or panel needs
(ECC, clocks-event reasons, violation times, NVLink CRC; 4.9.0's names where it renames) to the
generation's default one. The faults are in the topology file with absolute times, some already
begun, some a few seconds ahead, so Prometheus sees them start:

- GPU 0: Xid 119 (GSP RPC timeout) and power capping, begun a minute ago;
- GPU 1: row remapping failed a minute ago (Xid 64), then double-bit ECC errors (Xid 48) ahead;
- GPU 2: lost, ahead (its series go);
- GPU 3: thermal slowdown, begun a minute ago.

Every generation must raise the same alerts, in the same state, on the same GPUs: the fatal Xid,
the remap failure and the ECC errors firing (no `for`), the lost GPU and the throttling pending
(their `for` is minutes). Every rule evaluates without an error. And every query of the
Health row, the opt-in ones too, has data on every generation. It takes about 30 s.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.generations import G490, GENERATIONS, Generation
from grafana.dashboard import OUTPUT as DASHBOARD
from grafana.dashboard import queries
from tests.live.test_prometheus import (
    prometheus_binary,
    query_at,
    rules_evaluated,
    start,
    start_prometheus,
    substitute,
)
from tests.pipeline.test_cli import free_port, get
from tests.support.base import ROOT
from tests.support.kubeapi import eventually
from topology.model import time_text

RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"
UUIDS = (
    "GPU-0b6f3c1e-3a55-4c0e-9d7a-2f1e8c9b4a10",
    "GPU-1c7a4d2f-4b66-4d1f-8e8b-3a2f9dac5b21",
    "GPU-2d8b5e3a-5c77-4e2a-9f9c-4b3a0ebd6c32",
    "GPU-3e9c6f4b-6d88-4f3b-a0ad-5c4b1fce7d43",
)
AHEAD_S = 12  # faults "ahead" begin this long after the exporters start: a step or two later
# (alert, state, gpu) every generation raises once the faults ahead have begun.
EXPECTED = {
    ("GpuXidFatal", "firing", "0"),  # Xid 119
    ("GpuXidFatal", "firing", "1"),  # Xid 48, the latest (64 before it)
    ("GpuRowRemapFailure", "firing", "1"),
    ("GpuEccDoubleBitError", "firing", "1"),
    ("GpuLost", "pending", "2"),
    ("GpuPowerThrottling", "pending", "0"),
    ("GpuThermalThrottling", "pending", "3"),
}


def tag(g: Generation) -> str:
    return "gen" + g.name.replace(".", "")


def counters_file(g: Generation, directory: Path) -> Path:
    """The generation's default counters and the opt-in lines, under its names."""
    new = g is G490
    extra = [
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, counter, Total number of single-bit volatile ECC errors.",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.",
        "DCGM_FI_DEV_POWER_VIOLATION, counter, Throttling duration due to power constraints (in us).",
        "DCGM_FI_DEV_THERMAL_VIOLATION, counter, Throttling duration due to thermal constraints (in us).",
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS" if new else "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
        + ", gauge, Current clock throttle reasons.",
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL" if new
         else "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL") + ", counter, NVLink flit CRC errors.",
        ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL" if new
         else "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL") + ", counter, NVLink data CRC errors.",
    ]  # fmt: skip
    path = directory / f"counters-{g.name}.csv"
    path.write_text(g.counters_file.read_text() + "\n".join(extra) + "\n")
    return path


def topology_file(node: str, now: float, directory: Path) -> Path:
    begun, ahead = int(now) - 60, int(now) + AHEAD_S

    def fault(kind: str, since: int, **keys: object) -> list[str]:
        lines = [f"      - fault: {kind}", f'        since: "{time_text(since)}"']
        lines += [f"        {k}: {v}" for k, v in keys.items()]
        return [*lines, "        source: annotation"]

    faults = {
        0: fault("xid", begun, xid=119) + fault("power", begun),
        1: fault("row-remap-failure", begun) + fault("ecc-dbe", ahead, count=2),
        2: fault("lost", ahead),
        3: fault("thermal", begun),
    }
    lines = ["mig-strategy: none", "nodes:", f"  {node}:", "    gpu-count: 4",
             "    gpu-memory: 40960", "    gpu-product: NVIDIA-A100-SXM4-40GB",
             "    is-dynamic-mig-enabled: false", "    gpus:"]  # fmt: skip
    for index, uuid in enumerate(UUIDS):
        lines += [f"    - id: {uuid}", "      faults:", *faults[index]]
    path = directory / "topology.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


@dataclass(frozen=True)
class Fleet:
    url: str
    started: float


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("faults")
    prometheus_binary()  # none: fail before any exporter starts
    node = "gpu-node-1"
    now = time.time()
    topology = topology_file(node, now, tmp_path)
    procs, targets, ports = [], [], []
    try:
        for g in GENERATIONS:
            port = free_port()
            procs.append(start([sys.executable, "-m", "exporter", "--topology-file", str(topology),
                                "--node-name", node, "--hostname", f"gpu-node-{tag(g)}",
                                "--address", "127.0.0.1", "--port", str(port),
                                "--dcgm-exporter-version", g.name,
                                "--collectors", str(counters_file(g, tmp_path))],
                               tmp_path / f"exporter-{g.name}.log"))  # fmt: skip
            targets.append({"targets": [f"127.0.0.1:{port}"], "labels": {"generation": g.name}})
            ports.append(port)
        for port in ports:
            eventually(
                lambda port=port: get(f"http://127.0.0.1:{port}/health")[0] == 200, timeout=15
            )
        rules = yaml.safe_load(RULE.read_text())["spec"]
        proc, url = start_prometheus(tmp_path, rules, targets)
        procs.append(proc)
        eventually(lambda: len(query_at(url, "up == 1", time.time())) == len(targets), timeout=30)
        yield Fleet(url, now)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def alerts(url: str) -> dict[str, set[tuple[str, str, str]]]:
    """The health alerts Prometheus holds, by the generation whose host they name."""
    out: dict[str, set[tuple[str, str, str]]] = {tag(g): set() for g in GENERATIONS}
    for series in query_at(url, 'ALERTS{alertname=~"Gpu.*"}', time.time()):
        labels = series["metric"]
        host = labels["Hostname"].removeprefix("gpu-node-")
        assert labels["UUID"] == UUIDS[int(labels["gpu"])], labels
        assert labels["modelName"] == "NVIDIA A100-SXM4-40GB", labels
        out[host].add((labels["alertname"], labels["alertstate"], labels["gpu"]))
    return out


def test_every_generation_raises_the_fault_alerts(fleet: Fleet) -> None:
    before = alerts(fleet.url)
    if time.time() < fleet.started + AHEAD_S - 1:  # (on a slow machine, the fleet came up late)
        for generation, found in before.items():
            ahead = {a for a in found if a[0] in ("GpuEccDoubleBitError", "GpuLost")}
            assert not ahead, f"{generation}: alerts before their faults began: {ahead}"

    def settled() -> dict[str, set[tuple[str, str, str]]] | None:
        found = alerts(fleet.url)
        return found if all(a == EXPECTED for a in found.values()) else None

    try:
        eventually(settled, timeout=AHEAD_S + 30, interval=0.5)
    except AssertionError:
        pytest.fail(f"alerts by generation: {alerts(fleet.url)}\nexpected on each: {EXPECTED}")


def test_every_rule_evaluates_without_error_under_faults(fleet: Fleet) -> None:
    """With the opt-in fields served and GPUs failing, on every generation at once, no rule of
    the file fails its evaluation (and so stays silent)."""
    errors = rules_evaluated(fleet.url, yaml.safe_load(RULE.read_text())["spec"])
    assert not {name: e for name, e in errors.items() if e}, errors


def test_every_health_query_has_data_on_every_generation(fleet: Fleet) -> None:
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    (row,) = [p for p in model["panels"] if p["type"] == "row"]
    health = [t["expr"] for p in model["panels"] if p["id"] > row["id"] for t in p["targets"]]
    assert set(health) <= set(queries(model, opt_in=True)) and len(health) >= 10
    everything = {"Hostname": ".*", "gpu": ".*", "GPU_I_PROFILE": ".*"}
    hosts = {f"gpu-node-{tag(g)}" for g in GENERATIONS}
    for expr in health:
        promql = substitute(expr, everything)
        # A rate needs two scrapes of its counter.
        answer = eventually(lambda promql=promql: query_at(fleet.url, promql, time.time()))
        assert {s["metric"]["Hostname"] for s in answer} == hosts, expr
