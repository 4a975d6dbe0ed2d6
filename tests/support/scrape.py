"""The shipped per-node scrape configs (deploy/prometheus/) as a Prometheus without Kubernetes
discovery can run them: for the promtool checks, the live Prometheus test and the benchmark."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.base import ROOT

PROMETHEUS = ROOT / "deploy" / "prometheus"
SELECTOR = "type=kwok,nvidia.com/gpu.product"
PRODUCT = "__meta_kubernetes_node_label_nvidia_com_gpu_product"


def shipped_config(
    name: str, nodes: tuple[str, ...] = ("kwok-gpu-00", "kwok-gpu-01"),
    cpu_nodes: tuple[str, ...] = (),
) -> dict[str, Any]:  # fmt: skip
    """A shipped scrape config, Kubernetes discovery of the Nodes swapped for a static list of
    them labelled as discovery labels them (`__meta_kubernetes_node_name`, and each label as
    `__meta_kubernetes_node_label_<name>`): `nodes` have GPUs (a GPU model label), `cpu_nodes`
    none, or an empty model label, as a KWOK node without GPUs may have (the selector's
    existence test lets them through)."""
    config: dict[str, Any] = yaml.safe_load((PROMETHEUS / name).read_text())
    for job in config["scrape_configs"]:
        (sd,) = job.pop("kubernetes_sd_configs")
        assert sd["role"] == "node" and sd["selectors"] == [{"role": "node", "label": SELECTOR}]
        job["static_configs"] = [
            {"targets": [node], "labels": {"__meta_kubernetes_node_name": node,
                                           PRODUCT: "NVIDIA-A100-SXM4-40GB"}}
            for node in nodes
        ] + [
            {"targets": [node], "labels": {"__meta_kubernetes_node_name": node, PRODUCT: ""}}
            for node in cpu_nodes
        ]  # fmt: skip
    return config
