"""The shipped PrometheusRule: promtool checks it and runs its unit tests (tests/rules/).

promtool reads plain rule files, so the CRD's `spec` (its `groups`) is written to one first,
exactly as the Prometheus operator hands it to Prometheus.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.base import ROOT

RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"
UNIT_TESTS = ROOT / "tests" / "rules" / "mig-rules-test.yaml"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary, (
        "promtool is required: run ./scripts/install-test-tools (Debian package prometheus)"
    )
    return subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def crd() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULE.read_text())
    return doc


def unit_test_dir(tmp_path: Path, spec: dict[str, Any]) -> Path:
    """rules.yaml (the CRD's groups) beside a copy of the unit tests that load it."""
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return tmp_path


def test_the_rule_is_a_prometheus_operator_object() -> None:
    doc = crd()
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["metadata"]["name"] == "mig-exporter"
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    assert {r.get("record") or r.get("alert") for r in rules} == {
        "mig:fb_used_mib:sum", "mig:fb_free_mib:sum", "mig:fb_used:ratio",
        "MigInstanceMemoryNearFull", "MigExporterShardingMismatch", "MigExporterShardsMissing",
        # GPU health, unit-tested on the simulator's output (tests/rules/test_fault_alerts.py).
        "GpuXidFatal", "GpuXidError", "GpuEccDoubleBitError", "GpuRowRemapFailure", "GpuLost",
        "GpuThermalThrottling", "GpuPowerThrottling",
    }  # fmt: skip


def test_promtool_checks_the_rules(tmp_path: Path) -> None:
    directory = unit_test_dir(tmp_path, crd()["spec"])
    result = promtool("check", "rules", "rules.yaml", cwd=directory)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    directory = unit_test_dir(tmp_path, crd()["spec"])
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=directory)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("what", "old", "new"),
    [
        ("threshold", "> 0.95", "> 0.99"),
        ("duration", "5m", "10m"),
        ("grouping", "sum by (Hostname, modelName, GPU_I_PROFILE)", "sum by (Hostname, modelName)"),
        (
            "whole GPUs left out",
            'DCGM_FI_DEV_FB_USED{GPU_I_PROFILE!=""}\n',
            "DCGM_FI_DEV_FB_USED\n",
        ),
        # Each generation's difference (tests/rules/ has its input series).
        ("4.8.3's hostname", '"Hostname", "$1", "hostname"', '"Hostname", "$1", "Hostname"'),
        (
            "4.8.4's profile",
            '"GPU_I_PROFILE", "$1", "GPU_I_PROFILE", "MIG (.+)"',
            '"x", "", "x", ""',
        ),
        ("4.9.0's name", "or DCGM_FI_DEV_FB_USED_BYTES", "or DCGM_FI_DEV_FB_USED_TOTAL"),
        ("4.9.0's unit", '_BYTES{GPU_I_PROFILE!=""} / 1048576', '_BYTES{GPU_I_PROFILE!=""}'),
        ("4.9.0's driver", '"DCGM_FI_DRIVER_VERSION", "$1"', '"x", "$1"'),
        ("4.8.3's labels", "max without (hostname, pci_bus_id,", "max without (hostname,"),
        (
            "shard counts compared",
            "(mig_exporter_total_shards) != 0",
            "(mig_exporter_total_shards) > 1",
        ),
        (
            "each shard once",
            "sum by (job) (2 ^ mig_exporter_shard_ordinal)",
            "count by (job) (mig_exporter_shard_ordinal)",
        ),
        ("shards' patience", "for: 15m", "for: 30m"),
    ],
)
def test_the_unit_tests_catch_a_broken_rule(tmp_path: Path, what: str, old: str, new: str) -> None:
    text = RULE.read_text()
    assert old in text, what
    broken: dict[str, Any] = yaml.safe_load(text.replace(old, new, 1))
    directory = unit_test_dir(tmp_path, broken["spec"])
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=directory)
    assert result.returncode != 0, f"{what}: a broken rule passed its unit tests"


def test_the_documented_scrape_config_is_valid(tmp_path: Path) -> None:
    """The plain scrape config docs/prometheus-grafana.md gives users without the operator."""
    doc = (ROOT / "docs" / "prometheus-grafana.md").read_text()
    section = doc[doc.index("\n## Scrape\n") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") : section.index("```\n", 8)]
    config = yaml.safe_load(block)
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "nvidia-dcgm-exporter" and job["honor_labels"] is False
    # Debian builds Prometheus without Kubernetes discovery, so promtool there rejects the key
    # itself: the discovery is checked here, the rest (relabelling included) by promtool.
    assert job.pop("kubernetes_sd_configs") == [
        {"role": "pod", "namespaces": {"names": ["gpu-operator"]}}
    ]
    job["static_configs"] = [{"targets": ["127.0.0.1:9400"]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
