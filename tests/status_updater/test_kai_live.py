"""KAI on simulated nodes in a running updater (`status_updater run` against the API emulator):
with --kai-node-selector, a KWOK node it picks reports KAI's node conditions, and a reservation
pod gets `run.ai/reserve_for_gpu_index`, the uuid of the GPU the topology gives it (what KAI's
binder waits for); its fraction pods share that GPU. A node KWOK does not simulate, or one the
selector does not pick, is never written to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from status_updater import kainodes
from status_updater.controller import Controller
from status_updater.objects import slim_node, slim_pod
from status_updater.reconcile import reconcile_node
from tests.status_updater.test_controller import Recorder
from tests.status_updater.test_daemon import NS, run_daemon
from tests.status_updater.test_kai import NODES, PODS, fraction, items, reservation
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.support.base import run_cli
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import parse
from topology import kai
from topology.configmap import parse_document
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


def shares(node: NodeTopology) -> set[tuple[str, tuple[tuple[str, int], ...]]]:
    """Each held GPU: its holder, and its fraction pods with their memory."""
    return {(g.status.allocated_by.pod, tuple(sorted((f.holder.pod, f.memory)
                                                     for f in g.status.fractions)))
            for g in node.gpus if g.status and g.status.allocated_by}  # fmt: skip


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


def test_the_kai_sample_in_a_running_updater_is_what_render_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sample cluster created in the API: the live updater shares the GPUs as render does
    (the API gives the pods their own uids and creation times, so which GPU each reservation pod
    gets may differ), and the exporter reading its ConfigMap names each reservation pod with its
    fraction pods' summed memory, each fraction pod with its own."""
    rendered = run_cli("status_updater", "render", "--nodes", str(NODES), "--pods", str(PODS))
    expected = parse_document(rendered.stdout, "render").nodes["h100-kai-0"]
    with KubeAPI.start() as kube:
        for node in items(NODES):
            kube.create("nodes", node)
        for pod in items(PODS):
            kube.create("pods", pod, namespace=pod["metadata"]["namespace"])

        def scenario() -> None:
            live = eventually(lambda: topology(kube, "h100-kai-0"))
            assert shares(live) == shares(expected)
            cm = kube.find("configmaps", "topology-h100-kai-0", NS)
            path = tmp_path / "cm.yaml"
            path.write_text(yaml.safe_dump(cm))
            out = run_cli("exporter", "--topology-file", str(path), "--node-name", "h100-kai-0",
                          "--once", "--kubernetes-virtual-gpus", "--dcgm-exporter-version", "4.8.4")  # fmt: skip
            assert out.returncode == 0, out.stderr
            used = {(s.label("UUID"), dict(s.labels).get("pod", "")): s.value
                    for s in parse(out.stdout) if s.name == "DCGM_FI_DEV_FB_USED"}  # fmt: skip
            for gpu in live.gpus:
                if gpu.status and gpu.status.fractions:
                    assert used[gpu.id, ""] == sum(f.memory for f in gpu.status.fractions)
                    for f in gpu.status.fractions:
                        assert used[gpu.id, f.holder.pod] == f.memory

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 60, scenario) == 0


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_bad_kai_node_selector_is_one_line_and_exit_2(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["status_updater", "run"]
    if how == "flag":
        args += ["--kai-node-selector", "type in (kwok"]
    else:
        monkeypatch.setenv("KAI_NODE_SELECTOR", "type in (kwok")
    done = run_cli(*args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if "error:" in x]
    assert "--kai-node-selector" in line and "KAI_NODE_SELECTOR" in line


def test_a_pass_of_kai_writes_ends_in_time_and_the_rest_follows() -> None:
    """Thousands of picked nodes at the first pass never hold the ConfigMaps' writer: a pass
    writes for at most its time (a node's at least); the next pass writes the rest."""

    class Core:
        def __init__(self) -> None:
            self.patched: list[str] = []

        def patch_node_status(self, name: str, body: Any, **_: Any) -> None:
            self.patched.append(name)

    core = Core()
    controller = Controller(core, Recorder(), kai_selector="")  # type: ignore[arg-type]
    controller.kai_pass_s = 0.0
    slim = kainodes.slimmer(slim_node, "")
    names = [f"kwok-{i}" for i in range(3)]
    for name in names:
        node = whole_gpu_node(name)
        node["metadata"].setdefault("annotations", {})[kainodes.KWOK_ANNOTATION] = "fake"
        controller.state.nodes[name] = slim(node)
    for turn in range(1, 4):
        controller._write_kai(set(names))
        assert len(core.patched) == turn  # one node a pass, at the least
        for name in core.patched:  # what the node watch shows once written
            controller.state.nodes[name][kainodes.READY] = True
    assert core.patched == names
    controller._write_kai(set(names))
    assert core.patched == names  # nothing left: nothing written again
