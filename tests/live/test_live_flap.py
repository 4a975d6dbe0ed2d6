"""GPU labels that flap, as GPU feature discovery restarting takes them off and puts them back:
against the emulator, with the updater as a process, the running pods keep their GPUs through the
flap and across a restart of the updater that reads back the ConfigMap it wrote."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.live.test_live import NS, Daemons
from tests.support.kubeapi import KubeAPI, eventually

NODE = "k80-flap"
CM = f"topology-{NODE}"
TEAM = "team"
PRODUCT = "nvidia.com/gpu.product"


def node() -> dict[str, Any]:
    labels = {PRODUCT: "Tesla-K80", "nvidia.com/gpu.count": "2"}
    return {"metadata": {"name": NODE, "labels": labels}}


def pod(name: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1"}
    return {"metadata": {"name": name},
            "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def holders(kube: KubeAPI) -> list[str | None] | None:
    """Per GPU, the pod its ConfigMap names (None: no such ConfigMap)."""
    cm = kube.find("configmaps", CM, NS)
    if cm is None:
        return None
    gpus = yaml.safe_load(cm["data"]["topology.yml"])["nodes"][NODE]["gpus"]
    return [(g.get("status") or {}).get("allocated-by", {}).get("pod") for g in gpus]


def test_a_flapping_node_keeps_its_pods_on_their_gpus_across_a_restart(tmp_path: Path) -> None:
    with KubeAPI.start(strict=True) as kube:
        d = Daemons(kube, tmp_path, "per-node")
        try:
            kube.create("nodes", node())
            d.updater()
            kube.create("pods", pod("first"), namespace=TEAM)
            eventually(lambda: holders(kube) == ["first", None], timeout=20)
            kube.create("pods", pod("second"), namespace=TEAM)
            eventually(lambda: holders(kube) == ["first", "second"], timeout=10)
            # first ends: second stays on GPU 1, where a placement from scratch would give GPU 0.
            kube.delete("pods", "first", namespace=TEAM)
            eventually(lambda: holders(kube) == [None, "second"], timeout=10)

            kube.patch("nodes", NODE, {"metadata": {"labels": {PRODUCT: None}}})
            eventually(lambda: holders(kube) is None, timeout=10)  # no GPU node: its ConfigMap goes
            kube.patch("nodes", NODE, {"metadata": {"labels": {PRODUCT: "Tesla-K80"}}})
            eventually(lambda: holders(kube) == [None, "second"], timeout=10)

            # A restart reads back what it wrote: the flap again, seen by a new updater.
            d.procs[0].terminate()
            assert d.procs[0].wait(timeout=10) == 0
            d.updater("updater-1")
            kube.patch("nodes", NODE, {"metadata": {"labels": {PRODUCT: None}}})
            eventually(lambda: holders(kube) is None, timeout=20)
            kube.patch("nodes", NODE, {"metadata": {"labels": {PRODUCT: "Tesla-K80"}}})
            eventually(lambda: holders(kube) == [None, "second"], timeout=10)
            for name in ("updater-0", "updater-1"):
                assert "Traceback" not in d.log(name)
        finally:
            d.stop()
