"""KAI on simulated nodes in a running updater (`status_updater run` against the API emulator):
with --kai-node-selector, a KWOK node it picks reports KAI's node conditions, and a reservation
pod gets `run.ai/reserve_for_gpu_index`, the uuid of the GPU the topology gives it (what KAI's
binder waits for); its fraction pods share that GPU. A node KWOK does not simulate, or one the
selector does not pick, is never written to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from status_updater import kainodes
from status_updater.objects import slim_node, slim_pod
from status_updater.reconcile import reconcile_node
from tests.status_updater.test_daemon import NS, run_daemon
from tests.status_updater.test_kai import fraction, reservation
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.support.kubeapi import KubeAPI, eventually
from topology import kai
from topology.model import NodeTopology, load_yaml


def topology(kube: KubeAPI, name: str) -> NodeTopology | None:
    cm = kube.find("configmaps", f"topology-{name}", NS)
    return load_yaml(cm["data"]["topology.yml"]).nodes[name] if cm else None


def conditions(kube: KubeAPI, name: str) -> dict[str, str]:
    node = kube.find("nodes", name) or {}
    return {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}


def annotations(kube: KubeAPI, name: str, namespace: str) -> dict[str, Any]:
    pod = kube.find("pods", name, namespace) or {}
    return dict(pod.get("metadata", {}).get("annotations") or {})


def on(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["spec"]["nodeName"] = node
    return pod


@pytest.mark.parametrize("selector", ["type=kwok", ""])
def test_kai_sees_a_simulated_node_ready_and_its_reservation_pods_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, selector: str
) -> None:
    with KubeAPI.start() as kube:
        simulated = whole_gpu_node("kwok-0")
        simulated["metadata"]["labels"]["type"] = "kwok"
        simulated["metadata"].setdefault("annotations", {})[kainodes.KWOK_ANNOTATION] = "fake"
        real = whole_gpu_node("real-0")  # KAI's own parts run there: never written to
        real["metadata"]["labels"]["type"] = "kwok"
        for node in (simulated, real):
            kube.create("nodes", node)
        pods = [on(reservation("g1", 0, uid="r-sim"), "kwok-0"),
                on(fraction("half", ["g1"], 1, gpu_fraction="0.5"), "kwok-0"),
                on(reservation("g2", 0, uid="r-real"), "real-0")]  # fmt: skip
        pods[2]["metadata"]["name"] = "gpu-reservation-real"
        for pod in pods:
            kube.create("pods", pod, namespace=pod["metadata"]["namespace"])

        def scenario() -> None:
            eventually(lambda: all(conditions(kube, "kwok-0").get(t) == "True"
                                   for t in kainodes.CONDITIONS), timeout=10)  # fmt: skip
            sim = eventually(lambda: topology(kube, "kwok-0"))
            held = next(g for g in sim.gpus if g.status and g.status.fractions)
            assert held.status.allocated_by.pod == "gpu-reservation-r-sim"
            name, ns = "gpu-reservation-r-sim", "kai-resource-reservation"
            eventually(lambda: annotations(kube, name, ns).get(kai.GPU_INDEX) == held.id)
            # The real node: placed alike, but nothing written on its pods or its status.
            eventually(lambda: topology(kube, "real-0"))
            assert kai.GPU_INDEX not in annotations(kube, "gpu-reservation-real", ns)
            assert conditions(kube, "real-0") == {}

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 60, scenario,
                          kai_selector=selector) == 0  # fmt: skip


def test_without_the_flag_nothing_kai_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeAPI.start() as kube:
        simulated = whole_gpu_node("kwok-0")
        simulated["metadata"].setdefault("annotations", {})[kainodes.KWOK_ANNOTATION] = "fake"
        kube.create("nodes", simulated)
        pod = on(reservation("g1", 0, uid="r-sim"), "kwok-0")
        kube.create("pods", pod, namespace="kai-resource-reservation")

        def scenario() -> None:
            sim = eventually(lambda: topology(kube, "kwok-0"))
            assert any(g.status and g.status.allocated_by for g in sim.gpus)
            assert kai.GPU_INDEX not in annotations(kube, "gpu-reservation-r-sim",
                                                    "kai-resource-reservation")  # fmt: skip
            assert conditions(kube, "kwok-0") == {}

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 60, scenario) == 0


def test_only_a_picked_kwok_node_is_written_and_only_what_it_lacks() -> None:
    def node(kwok: bool, labels: dict[str, str], ready: bool) -> dict[str, Any]:
        out = whole_gpu_node("n")
        out["metadata"]["labels"] |= labels
        if kwok:
            out["metadata"].setdefault("annotations", {})[kainodes.KWOK_ANNOTATION] = "fake"
        if ready:
            out["status"] = {"conditions": [{"type": t, "status": "True"}
                                            for t in kainodes.CONDITIONS]}  # fmt: skip
        return out

    slim = kainodes.slimmer(lambda n: {"kind": "Node"}, "type=kwok")
    assert kainodes.needs_condition(slim(node(True, {"type": "kwok"}, False)))
    assert not kainodes.needs_condition(slim(node(True, {"type": "kwok"}, True)))  # said already
    assert not kainodes.needs_condition(slim(node(True, {"type": "gpu"}, False)))  # not picked
    assert not kainodes.needs_condition(slim(node(False, {"type": "kwok"}, False)))  # a real node
    # A reservation pod already marked (by itself, or by an earlier pass) is left alone.
    picked = slim(node(True, {"type": "kwok"}, True))
    marked = reservation("g", 0)
    marked["metadata"]["annotations"][kai.GPU_INDEX] = "GPU-x"
    gpu = whole_gpu_node("n")
    pods = [slim_pod(marked), slim_pod(reservation("h", 0))]
    placed, _ = reconcile_node(slim_node(gpu), pods)
    assert [name for _, name, _ in kainodes.reservations_to_mark(picked, pods, placed)] == [
        "gpu-reservation-h"]  # fmt: skip
