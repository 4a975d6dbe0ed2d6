"""deploy/prometheus/: the scrape configs that make each node `exporter --all-nodes` serves its
own target, checked by promtool. Debian's Prometheus is built without Kubernetes discovery, so
the check swaps it for a static list of Nodes carrying the label it gives; the rest is checked
as shipped (and run by a real Prometheus in tests/live/test_many_targets.py)."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.base import ROOT
from tests.support.scrape import PROMETHEUS, shipped_config

OPERATOR = ROOT / "deploy" / "all-nodes" / "scrapeconfig.yaml"
FILES = sorted(p.name for p in PROMETHEUS.glob("*.yml"))


def test_both_are_shipped() -> None:
    assert FILES == ["kwok-nodes-sharded.yml", "kwok-nodes.yml"]
    assert OPERATOR.exists()  # the operator's, part of the all-nodes install


@pytest.mark.parametrize("name", FILES)
def test_promtool_accepts_the_scrape_config(name: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required: run ./scripts/install-test-tools"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(shipped_config(name)))
    done = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", FILES)
def test_each_node_is_its_own_target_at_its_page(name: str) -> None:
    (job,) = shipped_config(name)["scrape_configs"]
    rules = {r.get("target_label"): r for r in job["relabel_configs"]}
    assert rules["__metrics_path__"]["replacement"] == "/metrics/nodes/$1"
    assert rules["instance"]["source_labels"] == ["__meta_kubernetes_node_name"]
    assert rules["__address__"]["replacement"].endswith(".gpu-operator.svc:9400")


def operator_job(path: Path) -> dict[str, Any]:
    """A ScrapeConfig as the Prometheus operator writes it into Prometheus's configuration: its
    roles in lower case, its fields in snake case (the fields it uses)."""
    spec = yaml.safe_load(path.read_text())["spec"]
    snake = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    actions = {"HashMod": "hashmod", "Keep": "keep"}
    return {
        "job_name": spec["jobName"],
        "scrape_interval": spec["scrapeInterval"],
        "kubernetes_sd_configs": [
            {"role": sd["role"].lower(),
             "selectors": [{**s, "role": s["role"].lower()} for s in sd.get("selectors", [])]}
            for sd in spec["kubernetesSDConfigs"]
        ],
        "relabel_configs": [{snake.get(k, k): actions.get(v, v) if k == "action" else v
                             for k, v in r.items()} for r in spec["relabelings"]],
    }  # fmt: skip


def test_the_operator_s_scrape_config_is_the_plain_one() -> None:
    """deploy/all-nodes/scrapeconfig.yaml (its schema is checked with the other manifests in
    test_deploy.py) says to Prometheus what kwok-nodes-sharded.yml says, its modulus the
    install's replicas (as test_deploy.py checks)."""
    plain: dict[str, Any] = yaml.safe_load((PROMETHEUS / "kwok-nodes-sharded.yml").read_text())
    [job] = plain["scrape_configs"]
    for rule in job["relabel_configs"]:
        if rule.get("action") == "hashmod":
            rule["modulus"] = 1
    assert operator_job(OPERATOR) == job


def test_the_readme_shows_the_shipped_job() -> None:
    """The job a newcomer copies from the README is the one shipped (its interval aside)."""
    readme = (ROOT / "README.md").read_text()
    snippet = readme.split("  ```yaml\n", 1)[1].split("  ```", 1)[0]
    [shown] = yaml.safe_load(textwrap.dedent(snippet))
    [shipped] = yaml.safe_load((PROMETHEUS / "kwok-nodes.yml").read_text())["scrape_configs"]
    del shipped["scrape_interval"]
    assert shown == shipped
