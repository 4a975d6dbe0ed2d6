"""GPU sharing: time-slicing and MPS replicas from the device plugin's labels, spread over the GPUs
as the plugin spreads them, and served as dcgm-exporter serves a shared GPU, in both its modes.

Golden: a shared GPU's series are the real whole-GPU (and MIG) dumps' series, byte for byte in
their HELP, TYPE, order and labels, with the sharing pods' labels and, in virtual-GPU mode, one
copy per replica held with `vgpu` after the pod labels. Expected placements follow the plugin's
rule written out here (fewest replicas taken first, oldest pod first), not the code's output.
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.cli import parser
from status_updater.devices import build_node
from status_updater.objects import pod_key, slim_node, slim_pod
from status_updater.placement import place_pods
from status_updater.state import ClusterState, reconcile
from tests.live.test_live import running
from tests.pipeline.test_cli import get
from tests.pipeline.test_golden import masked, real
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.status_updater.test_static import (
    MIG_LABEL_NAMES,
    pod,
    real_node_static,
    render,
    write,
)
from tests.support.base import SAMPLES, run_cli
from tests.support.kubeapi import eventually
from tests.support.promtext import Series, by_name, parse
from topology.errors import TopologyError
from topology.model import Sharing, Topology, dump_yaml, load_yaml
from topology.sharing import parse_sharing
from topology.show import picture
from topology.validate import errors

WHOLE = yaml.safe_load((SAMPLES / "whole-gpu" / "a100-40gb-mig-disabled.yaml").read_text())
NODE = WHOLE["metadata"]["name"]
WHOLE_DUMP = real("a100-40gb-mig-disabled.prom")
MIG_DUMP = real("a100-40gb-active-2x1g.5gb-1x2g.10gb.prom")
# What pods sharing a GPU change: its memory, load, clock (besides what moves in time anyway).
LOAD = frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL",
                  "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_SM_CLOCK"})  # fmt: skip
FB_MIB = 40384  # the A100-40GB's usable memory (FB_USED + FB_FREE of the idle dump)
_EMPTY_POD = 'container="",namespace="",pod=""'


def shared(node: dict[str, Any], strategy: str, replicas: int = 4, *, resource: str = "gpu",
           renamed: bool = False) -> dict[str, Any]:  # fmt: skip
    """The node as GFD labels it with the device plugin's sharing configured."""
    node = copy.deepcopy(node)
    labels = node["metadata"]["labels"]
    labels[f"nvidia.com/{resource}.replicas"] = str(replicas)
    labels[f"nvidia.com/{resource}.sharing-strategy"] = strategy
    if not renamed:
        labels["nvidia.com/gpu.product"] += "-SHARED"
    return node


def sharing_pod(name: str, created: str, fb: int, util: int, *, node: str = NODE,
                resource: str = "nvidia.com/gpu", count: int = 1) -> dict[str, Any]:  # fmt: skip
    return pod(name, node, created, {"main": {resource: str(count)}}, annotations={
        "run.ai/simulated-fb-used": str(fb), "run.ai/simulated-gpu-utilization": str(util)})  # fmt: skip


def served(tmp_path: Path, node: dict[str, Any], pods: list[dict[str, Any]],
           *flags: str) -> tuple[str, list[str]]:  # fmt: skip
    """What the exporter serves for the node (with `flags`), and the updater's warnings."""
    nodes = write(tmp_path / "nodes.yaml", node)
    pod_file = write(tmp_path / "pods.yaml", *pods) if pods else None
    rendered = render([nodes], [pod_file] if pod_file else None)
    cm = tmp_path / "cm.yaml"
    cm.write_text(rendered.stdout)
    name = node["metadata"]["name"]
    out = run_cli("exporter", "--topology-file", str(cm), "--node-name", name, "--once", *flags)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    return out.stdout, rendered.warnings


def with_pod(line: str, container: str, namespace: str, pod_name: str, vgpu: int | None) -> str:
    """A real dump's series line as it reads with a pod (and a replica) named."""
    labels = f'container="{container}",namespace="{namespace}",pod="{pod_name}"'
    if vgpu is not None:
        labels += f',vgpu="{vgpu}"'
    assert _EMPTY_POD in line
    return line.replace(_EMPTY_POD, labels)


def expected(dump: str, holders: list[tuple[str, int | None]]) -> str:
    """The dump with each series line once per (pod, replica) in `holders`, as dcgm-exporter
    copies it; comment lines as they are."""
    out = []
    for line in dump.splitlines():
        if line.startswith("#") or not line:
            out.append(line)
            continue
        out += [with_pod(line, "main", "team", name, vgpu) for name, vgpu in holders]
    return "\n".join(out) + "\n"


def value(series: list[Series], name: str) -> set[float]:
    return {s.value for s in by_name(series, name)}


# --- labels ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("labels", "sharing"),
    [
        ({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
         Sharing("time-slicing", 4)),
        ({"nvidia.com/gpu.replicas": "3", "nvidia.com/gpu.sharing-strategy": "mps"},
         Sharing("mps", 3)),
        ({"nvidia.com/gpu.replicas": "2"}, Sharing("time-slicing", 2)),  # GFD before strategies
        ({"nvidia.com/gpu.replicas": "0"}, None),  # the real node's label: nothing shared
        ({"nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none"}, None),
        ({"nvidia.com/gpu.replicas": "8", "nvidia.com/gpu.sharing-strategy": "none"}, None),
        ({"nvidia.com/mig-1g.5gb.replicas": "2", "nvidia.com/mig-2g.10gb.replicas": "3",
          "nvidia.com/mig-2g.10gb.sharing-strategy": "time-slicing"},
         Sharing("time-slicing", 3)),  # the largest count of the node's shared resources
        ({"example.com/gpu.replicas": "4"}, None),  # not NVIDIA's
    ],
)  # fmt: skip
def test_sharing_is_read_from_gfd_labels(labels: dict[str, str], sharing: Sharing | None) -> None:
    assert parse_sharing(labels, "node n") == sharing


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({"nvidia.com/gpu.replicas": "four"},
         "node n: metadata.labels[nvidia.com/gpu.replicas]: expected 0 to 1024, got 'four'"),
        ({"nvidia.com/gpu.replicas": "99999"},
         "node n: metadata.labels[nvidia.com/gpu.replicas]: expected 0 to 1024, got '99999'"),
        ({"nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "fair"},
         "node n: metadata.labels[nvidia.com/gpu.sharing-strategy]: must be time-slicing, mps "
         "or none, got 'fair'"),
    ],
)  # fmt: skip
def test_a_bad_sharing_label_is_one_line_naming_it(labels: dict[str, str], message: str) -> None:
    with pytest.raises(TopologyError) as e:
        parse_sharing(labels, "node n")
    assert str(e.value) == message


def test_a_bad_sharing_label_is_its_nodes_problem_only() -> None:
    bad = shared(WHOLE, "time-slicing")
    bad["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "-1"
    good = shared(WHOLE, "time-slicing")
    good["metadata"]["name"] = "other"
    topology, warnings = reconcile([bad, good], [])
    assert set(topology.nodes) == {"other"}
    assert [str(w) for w in warnings] == [
        f"node {NODE}: metadata.labels[nvidia.com/gpu.replicas]: expected 0 to 1024, got '-1'"
    ]


# --- placement ---------------------------------------------------------------------------------


def two_gpu_node(replicas: int, strategy: str = "time-slicing", name: str = "n2") -> dict[str, Any]:
    node = shared(WHOLE, strategy, replicas)
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    return node


def placement(topology: Any, name: str = "n2") -> list[list[tuple[int, str]]]:
    """Per GPU: (replica, pod) held, by replica."""
    return [[(r.index, r.holder.pod) for r in (g.status.replicas if g.status else ())]
            for g in topology.nodes[name].gpus]  # fmt: skip


def test_replicas_spread_over_the_least_loaded_gpu_oldest_pod_first() -> None:
    # Six pods, created p0 … p5, listed in another order: the oldest is placed first, each on
    # the GPU with the fewest replicas taken (the lower index on a tie), in its lowest free one.
    pods = [sharing_pod(f"p{i}", f"2026-01-01T00:00:0{i}Z", 1000, 10, node="n2")
            for i in (3, 0, 5, 1, 4, 2)]  # fmt: skip
    topology, warnings = reconcile([two_gpu_node(4)], pods)
    assert warnings == []
    assert placement(topology) == [[(0, "p0"), (1, "p2"), (2, "p4")],
                                   [(0, "p1"), (1, "p3"), (2, "p5")]]  # fmt: skip
    # A pod asking for more replicas than are free gets none; the others keep theirs.
    greedy = sharing_pod("greedy", "2026-01-01T00:01:00Z", 1000, 10, node="n2", count=3)
    topology, warnings = reconcile([two_gpu_node(4)], [*pods, greedy])
    assert [str(w) for w in warnings] == [
        "pod team/greedy: spec.containers[0].resources.limits[nvidia.com/gpu]: asks for 3 GPU "
        "replicas, node n2 has 2 free"
    ]
    assert placement(topology)[0] == [(0, "p0"), (1, "p2"), (2, "p4")]


def test_a_pod_asking_for_two_replicas_gets_them_on_two_gpus() -> None:
    pods = [sharing_pod("two", "2026-01-01T00:00:00Z", 1000, 10, node="n2", count=2)]
    topology, _ = reconcile([two_gpu_node(4)], pods)
    assert placement(topology) == [[(0, "two")], [(0, "two")]]


def test_a_pod_prefers_gpus_it_has_not_picked_when_loads_tie() -> None:
    # x1 holds GPU 1's replica 0 (x0, on GPU 0, ended). y's four replicas: GPU 0, then GPU 1
    # (loads 1:1), GPU 0 (1:2), and at 2:2 GPU 1 again, which y has picked once, not twice.
    x0, x1 = (sharing_pod(f"x{i}", f"2026-01-01T00:00:0{i}Z", 1000, 10, node="n2") for i in (0, 1))
    state = ClusterState.of([two_gpu_node(4)], [x0, x1])
    state.delete_pod(pod_key(x0))
    state.set_pod(slim_pod(sharing_pod("y", "2026-01-01T00:00:02Z", 1000, 10, node="n2", count=4)))
    state.settle()
    assert placement(state.topology()) == [[(0, "y"), (1, "y")], [(0, "x1"), (1, "y"), (2, "y")]]


def test_each_container_of_a_sharing_pod_gets_its_own_replicas() -> None:
    two = pod(
        "two",
        "n2",
        "2026-01-01T00:00:00Z",
        {"a": {"nvidia.com/gpu": "1"}, "b": {"nvidia.com/gpu": "2"}},
    )
    topology, warnings = reconcile([two_gpu_node(4)], [two])
    assert warnings == []
    by_container = [[(r.index, r.holder.container) for r in (g.status.replicas if g.status else ())]
                    for g in topology.nodes["n2"].gpus]  # fmt: skip
    assert by_container == [[(0, "a"), (1, "b")], [(0, "b")]]
    # The kubelet allocates the containers in turn: the second sees the first's replica taken,
    # and its one replica goes to the other GPU.
    ones = pod("ones", "n2", "2026-01-01T00:00:00Z",
               {"a": {"nvidia.com/gpu": "1"}, "b": {"nvidia.com/gpu": "1"}})  # fmt: skip
    topology, warnings = reconcile([two_gpu_node(4)], [ones])
    assert warnings == []
    assert [[(r.index, r.holder.container) for r in (g.status.replicas if g.status else ())]
            for g in topology.nodes["n2"].gpus] == [[(0, "a")], [(0, "b")]]  # fmt: skip


def test_a_pod_keeps_its_replica_and_the_named_pod_stays_while_it_lives() -> None:
    node = two_gpu_node(4)
    pods = [sharing_pod(f"p{i}", f"2026-01-01T00:00:0{i}Z", 1000, 10, node="n2") for i in range(4)]
    state_topology, _ = reconcile([node], pods)
    assert placement(state_topology) == [[(0, "p0"), (1, "p2")], [(0, "p1"), (1, "p3")]]
    # p0 ends and p9 arrives (older by its timestamp, but new to the node): p2 keeps replica 1,
    # p9 takes the free replica 0, and the GPU still names p2, which has shared it longest.
    state = ClusterState()
    state.set_node(slim_node(node))
    for p in pods:
        state.set_pod(slim_pod(p))
    state.settle()
    state.delete_pod(pod_key(pods[0]))
    state.set_pod(slim_pod(sharing_pod("p9", "2025-12-31T00:00:00Z", 1000, 10, node="n2")))
    state.settle()
    topology = state.topology()
    assert placement(topology) == [[(0, "p9"), (1, "p2")], [(0, "p1"), (1, "p3")]]
    status = topology.nodes["n2"].gpus[0].status
    assert status is not None and status.allocated_by is not None
    assert status.allocated_by.pod == "p2"


def test_mps_caps_each_pods_memory_and_time_slicing_does_not(tmp_path: Path) -> None:
    share = FB_MIB // 4  # the MPS control daemon's pinned memory limit per client
    pods = [sharing_pod("big", "2026-01-01T00:00:00Z", share + 1, 10),
            sharing_pod("small", "2026-01-01T00:00:01Z", share, 10)]  # fmt: skip
    text, warnings = served(tmp_path, shared(WHOLE, "mps"), pods)
    assert warnings == [
        f"pod team/big: metadata.annotations[run.ai/simulated-fb-used]: {share + 1} MiB does "
        f"not fit the device's {share} MiB"
    ]
    default = int(share * 0.9)  # the pod's fair share, used in part, as any pod's default
    assert value(parse(text), "DCGM_FI_DEV_FB_USED") == {default + share}
    text, warnings = served(tmp_path, shared(WHOLE, "time-slicing"), pods)
    assert warnings == []  # memory is not isolated: one pod may take most of it
    assert value(parse(text), "DCGM_FI_DEV_FB_USED") == {2 * share + 1}


# --- golden: the real dumps, shared --------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
@pytest.mark.parametrize("virtual", [False, True], ids=["default", "virtual-gpus"])
def test_a_shared_gpu_nobody_uses_is_the_real_dump(
    tmp_path: Path, strategy: str, virtual: bool
) -> None:
    flags = ["--kubernetes-virtual-gpus"] if virtual else []
    text, warnings = served(tmp_path, shared(WHOLE, strategy), [], *flags)
    assert warnings == []
    assert masked(text) == masked(WHOLE_DUMP)  # the device series stays, no vgpu


@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
@pytest.mark.parametrize("virtual", [False, True], ids=["default", "virtual-gpus"])
def test_a_gpu_shared_by_three_pods(tmp_path: Path, strategy: str, virtual: bool) -> None:
    pods = [sharing_pod("a", "2026-01-01T00:00:00Z", 3000, 50),
            sharing_pod("c", "2026-01-01T00:00:02Z", 1000, 40),
            sharing_pod("b", "2026-01-01T00:00:01Z", 2000, 30)]  # fmt: skip
    flags = ["--kubernetes-virtual-gpus"] if virtual else []
    text, warnings = served(tmp_path, shared(WHOLE, strategy), pods, *flags)
    assert warnings == []
    # Default mode: the GPU's one series names the pod that shares it longest (the oldest);
    # virtual-GPU mode: one copy per pod, by replica, the oldest pod in replica 0.
    holders: list[tuple[str, int | None]] = (
        [("a", 0), ("b", 1), ("c", 2)] if virtual else [("a", None)]
    )
    assert masked(text, LOAD) == masked(expected(WHOLE_DUMP, holders), LOAD)
    # The GPU is one device: its memory is the pods' sum, its load theirs, capped at 100 %.
    series = parse(text)
    assert value(series, "DCGM_FI_DEV_FB_USED") == {6000}
    assert value(series, "DCGM_FI_DEV_FB_FREE") == {FB_MIB - 6000}
    assert value(series, "DCGM_FI_DEV_GPU_UTIL") == {100}


@pytest.mark.parametrize("virtual", [False, True], ids=["default", "virtual-gpus"])
def test_time_slicing_on_static_mig_instances(tmp_path: Path, virtual: bool) -> None:
    # The real node as the GPU operator runs it, two 3g.20gb instances, each time-sliced twice.
    node = shared(real_node_static("all-3g.20gb"), "time-slicing", 2, resource="mig-3g.20gb")
    pods = [sharing_pod(f"p{i}", f"2026-01-01T00:00:0{i}Z", 1000 * (i + 1), 10,
                        resource="nvidia.com/mig-3g.20gb") for i in range(3)]  # fmt: skip
    flags = ["--kubernetes-virtual-gpus"] if virtual else []
    text, warnings = served(tmp_path, node, pods, *flags)
    assert warnings == []
    series = parse(text)
    fb = by_name(series, "DCGM_FI_DEV_FB_USED")
    # p0 and p2 share the first instance (the lower GI id), p1 has the second to itself.
    gis = sorted({int(s.label("GPU_I_ID")) for s in fb})
    assert len(gis) == 2
    pods_on = {(s.label("GPU_I_ID"), s.label("pod"), dict(s.labels).get("vgpu")) for s in fb}
    if virtual:
        assert pods_on == {(str(gis[0]), "p0", "0"), (str(gis[0]), "p2", "1"),
                           (str(gis[1]), "p1", "0")}  # fmt: skip
    else:
        assert pods_on == {(str(gis[0]), "p0", None), (str(gis[1]), "p1", None)}
    assert {s.label("GPU_I_ID"): s.value for s in fb} == {str(gis[0]): 4000, str(gis[1]): 2000}
    # Each series as a real MIG instance's: its label names in order (and `vgpu` last), the
    # real dump's families in its order.
    names = MIG_LABEL_NAMES + (("vgpu",) if virtual else ())
    assert {s.label_names for s in series if "GPU_I_ID" in s.label_names} == {names}
    assert list(dict.fromkeys(s.name for s in series)) == list(
        dict.fromkeys(s.name for s in parse(MIG_DUMP))
    )


def test_a_shared_instance_s_default_use_is_a_share_of_the_instance() -> None:
    # 90 % of its part of the 3g.20gb instance (19968 MiB, two replicas), not of the GPU.
    node = shared(real_node_static("all-3g.20gb"), "time-slicing", 2, resource="mig-3g.20gb")
    quiet = pod("quiet", NODE, "2026-01-01T00:00:00Z", {"main": {"nvidia.com/mig-3g.20gb": "1"}})
    topology, warnings = reconcile([node], [quiet])
    assert warnings == []
    held = [d.status for g in topology.nodes[NODE].gpus for d in g.mig_devices or () if d.status]
    assert [u.fb_used for s in held for u in s.pod_gpu_usage_status.values()] == [
        int(19968 // 2 * 0.9)
    ]


def test_replicas_of_one_profile_stay_on_its_instances_which_keep_their_ids() -> None:
    plain = real_node_static("all-balanced")  # 1g.5gb x2, 2g.10gb, 3g.20gb
    node = shared(plain, "time-slicing", 2, resource="mig-1g.5gb")
    small = pod("small", NODE, "2026-01-01T00:00:00Z", {"main": {"nvidia.com/mig-1g.5gb": "3"}})
    topology, warnings = reconcile([node], [small])
    unshared, _ = reconcile([plain], [])
    assert warnings == []
    devices = [d for g in topology.nodes[NODE].gpus for d in g.mig_devices or ()]
    before = [d for g in unshared.nodes[NODE].gpus for d in g.mig_devices or ()]
    assert [d.id for d in devices] == [d.id for d in before]
    assert [(d.name, len(d.status.replicas)) for d in devices if d.status] == [
        ("1g.5gb", 2),
        ("1g.5gb", 1),
    ]


def test_the_renamed_resource_is_shared_the_same_way(tmp_path: Path) -> None:
    node = shared(WHOLE, "time-slicing", renamed=True)
    node["status"] = {"allocatable": {"nvidia.com/gpu.shared": "4"}}
    pods = [
        sharing_pod("a", "2026-01-01T00:00:00Z", 3000, 50, resource="nvidia.com/gpu.shared"),
        sharing_pod("b", "2026-01-01T00:00:01Z", 2000, 30, resource="nvidia.com/gpu.shared"),
    ]
    text, warnings = served(tmp_path, node, pods, "--kubernetes-virtual-gpus")
    assert warnings == []
    fb = by_name(parse(text), "DCGM_FI_DEV_FB_USED")
    assert [(s.label("pod"), s.label("vgpu"), s.value) for s in fb] == [
        ("a", "0", 5000),
        ("b", "1", 5000),
    ]
    assert {s.label("modelName") for s in fb} == {"NVIDIA A100-SXM4-40GB"}  # no -SHARED


def test_the_written_topology_says_who_holds_each_replica(tmp_path: Path) -> None:
    pods = [sharing_pod("a", "2026-01-01T00:00:00Z", 3000, 50)]
    rendered = render([write(tmp_path / "n.yaml", shared(WHOLE, "mps", 3))],
                      [write(tmp_path / "p.yaml", *pods)])  # fmt: skip
    entry = rendered.nodes[NODE]
    assert entry["sharing"] == {"strategy": "mps", "replicas": 3}
    assert entry["gpu-product"] == "NVIDIA-A100-SXM4-40GB"
    assert entry["gpus"][0]["status"]["replicas"] == [
        {"replica": 0, "namespace": "team", "pod": "a", "container": "main", "pod-uid": "uid-a"}
    ]


# --- live: the daemons on the emulated API -------------------------------------------------------


def test_live_four_replicas_six_pods_spread_and_per_pod_series(tmp_path: Path) -> None:
    node = two_gpu_node(4, name="gpu-share")
    node["metadata"].pop("creationTimestamp", None)
    node["metadata"].pop("resourceVersion", None)
    node["metadata"].pop("uid", None)
    node.pop("status", None)
    with running(tmp_path) as d:
        # The API server stamps creationTimestamp itself, to the second: p5 is created a second
        # before the others, so it is the oldest whatever its name. The pods exist before the
        # updater starts, so its first list holds them all and places them oldest first (a pod
        # that came alone would keep the replica it got then: a pod never moves).
        d.kube.create("nodes", node)
        for i in (5, 0, 1, 2, 3, 4):
            d.kube.create("pods", sharing_pod(f"p{i}", "2026-01-01T00:00:00Z", 1000 * (i + 1), 10,
                                              node="gpu-share"), namespace="team")  # fmt: skip
            if i == 5:
                time.sleep(1.1)
        d.updater()
        url = d.exporter("--node-name", "gpu-share", "--kubernetes-virtual-gpus")

        def served_pods() -> dict[str, list[tuple[str, str]]]:
            series = by_name(parse(get(f"{url}/metrics")[1].split("# HELP mig_")[0]),
                             "DCGM_FI_DEV_FB_USED")  # fmt: skip
            out: dict[str, list[tuple[str, str]]] = {}
            for s in series:
                out.setdefault(s.label("gpu"), []).append((s.label("vgpu"), s.label("pod")))
            return out

        # The spread the device plugin makes: oldest pod first, on the GPU with fewer taken.
        want = {"0": [("0", "p5"), ("1", "p1"), ("2", "p3")],
                "1": [("0", "p0"), ("1", "p2"), ("2", "p4")]}  # fmt: skip
        eventually(lambda: served_pods() == want, timeout=30)
        cm = d.kube.find("configmaps", "topology-gpu-share", "gpu-operator")
        entry = yaml.safe_load(cm["data"]["topology.yml"])["nodes"]["gpu-share"]
        assert entry["sharing"] == {"strategy": "time-slicing", "replicas": 4}
        # Each pod's series has the GPU's values: its memory is the sum of its pods'.
        series = by_name(parse(get(f"{url}/metrics")[1].split("# HELP mig_")[0]),
                         "DCGM_FI_DEV_FB_USED")  # fmt: skip
        assert {(s.label("gpu"), s.value) for s in series} == {
            ("0", 6000 + 2000 + 4000),
            ("1", 1000 + 3000 + 5000),
        }
        # p0 ends: its replica goes, the others keep theirs.
        d.kube.delete("pods", "p0", namespace="team")
        want["1"] = [("1", "p2"), ("2", "p4")]
        eventually(lambda: served_pods() == want, timeout=30)


def test_replicas_held_before_a_restart_are_kept() -> None:
    # What the updater wrote before it restarted: p1 on GPU 0, p0 on GPU 1, the reverse of what
    # a fresh start would choose. Read back, it is what the pods keep.
    node = two_gpu_node(4)
    pods = [sharing_pod(f"p{i}", f"2026-01-01T00:00:0{i}Z", 1000, 10, node="n2") for i in range(2)]
    fresh, _ = reconcile([node], pods)
    gpu0, gpu1 = fresh.nodes["n2"].gpus
    written = replace(fresh.nodes["n2"], gpus=(replace(gpu0, status=gpu1.status),
                                               replace(gpu1, status=gpu0.status)))  # fmt: skip
    remembered = load_yaml(dump_yaml(Topology(nodes={"n2": written}))).nodes["n2"]
    built = build_node(node)
    again = place_pods("n2", built, pods, [], previous=remembered)
    assert placement(Topology(nodes={"n2": again})) == [[(0, "p1")], [(0, "p0")]]


def test_virtual_gpus_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not parser().parse_args(["--node-name", "n"]).kubernetes_virtual_gpus
    monkeypatch.setenv("KUBERNETES_VIRTUAL_GPUS", "true")
    assert parser().parse_args(["--node-name", "n"]).kubernetes_virtual_gpus


def test_a_node_advertising_only_the_shared_resource_is_shared() -> None:
    # A simulated node without GFD's labels: 8 `nvidia.com/gpu.shared` on 2 GPUs are 4 each.
    node = copy.deepcopy(WHOLE)
    node["metadata"]["name"] = "n2"
    node["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    node["status"] = {"allocatable": {"nvidia.com/gpu.shared": "8"}}
    pods = [sharing_pod(f"p{i}", f"2026-01-01T00:00:0{i}Z", 1000, 10, node="n2",
                        resource="nvidia.com/gpu.shared") for i in range(3)]  # fmt: skip
    topology, warnings = reconcile([node], pods)
    assert warnings == []
    assert topology.nodes["n2"].sharing == Sharing("time-slicing", 4)
    assert placement(topology) == [[(0, "p0"), (1, "p2")], [(0, "p1")]]
    node["status"] = {"allocatable": {"nvidia.com/gpu.shared": "2"}}  # one each: not shared
    topology, _ = reconcile([node], [])
    assert topology.nodes["n2"].sharing is None


def test_replicas_a_topology_lists_are_checked() -> None:
    def doc(sharing: str) -> str:
        return f"""
nodes:
  n:
    gpu-count: 1
    gpu-memory: 40960
    gpu-product: NVIDIA-A100-SXM4-40GB
    {sharing}
    gpus:
    - id: GPU-1
      status:
        replicas:
        - {{replica: 2, namespace: t, pod: a, container: c, pod-uid: u1}}
        - {{replica: 0, namespace: t, pod: b, container: c, pod-uid: u2}}
        - {{replica: 0, namespace: t, pod: c, container: c, pod-uid: u3}}
"""

    assert [str(e) for e in errors(load_yaml(doc("sharing: {strategy: mps, replicas: 2}")))] == [
        "node n: gpus[0].status.replicas[0].replica: is 2, the node shares each device 2 ways",
        "node n: gpus[0].status.replicas[2].replica: replica 0 is listed twice",
    ]
    unshared = [str(e) for e in errors(load_yaml(doc("")))]
    assert unshared[0] == "node n: gpus[0].status.replicas[0].replica: the node does not share GPUs"
    bad = load_yaml(doc("sharing: {strategy: fair, replicas: 2}"))
    assert [str(e) for e in bad.invalid.values()] == [
        "topology: nodes.n.sharing.strategy: must be one of time-slicing, mps, got 'fair'"
    ]


def test_topology_show_lists_who_holds_each_replica() -> None:
    node = shared(WHOLE, "time-slicing", 4)
    pods = [sharing_pod(n, f"2026-01-01T00:00:0{i}Z", 1000, 10) for i, n in enumerate("abc")]
    topology, _ = reconcile([node], pods)
    lines = picture(topology).splitlines()
    assert lines[0] == f"node {NODE}  (NVIDIA-A100-SXM4-40GB, 1 GPU, time-slicing x4)"
    assert lines[-1].split() == ["replicas:", "0", "team/a,", "1", "team/b,", "2", "team/c"]


def test_mps_on_mig_instances_is_refused_in_one_line_and_nothing_is_shared(tmp_path: Path) -> None:
    node = shared(real_node_static("all-3g.20gb"), "mps", 2, resource="mig-3g.20gb")
    pods = [sharing_pod("p0", "2026-01-01T00:00:00Z", 1000, 10, resource="nvidia.com/mig-3g.20gb")]
    nodes = write(tmp_path / "nodes.yaml", node)
    rendered = render([nodes], [write(tmp_path / "pods.yaml", *pods)])
    name = node["metadata"]["name"]
    assert rendered.warnings == [
        f"node {name}: metadata.labels[nvidia.com/gpu.sharing-strategy]: MPS cannot share MIG "
        "devices (the device plugin refuses it): not shared"
    ]
    assert "sharing" not in rendered.nodes[name]


def test_a_pod_asking_for_every_replica_of_the_largest_sharing_gets_them_spread_evenly() -> None:
    """1,024 replicas per GPU (the most a label may say): every one is handed out, alternating
    between the GPUs as the distributed policy does; one more than the node has is refused."""
    node = two_gpu_node(1024)
    topology, warnings = reconcile([node], [sharing_pod("all", "2026-01-01T00:00:00Z", 10, 10,
                                                        node="n2", count=2048)])  # fmt: skip
    assert warnings == []
    assert placement(topology) == [[(r, "all") for r in range(1024)]] * 2
    topology, warnings = reconcile([node], [sharing_pod("more", "2026-01-01T00:00:00Z", 10, 10,
                                                        node="n2", count=2049)])  # fmt: skip
    assert placement(topology) == [[], []]
    assert [w.message for w in warnings] == ["asks for 2049 GPU replicas, node n2 has 2048 free"]


@pytest.mark.parametrize(("strategy", "most"), [("time-slicing", 11441), ("mps", 11441 // 2)])
def test_a_shared_gpu_the_catalog_does_not_know_has_its_memory_label(
    strategy: str, most: int
) -> None:
    """A K80 (no MIG, not in the catalog) shared by two: the node's gpu.memory label is the
    GPU's memory; a pod's default use is 90 % of its share, and MPS caps each pod at it."""
    node = shared(whole_gpu_node("k80", count=1), strategy, 2)
    quiet = sharing_pod("quiet", "2026-01-01T00:00:00Z", 0, 10, node="k80")
    del quiet["metadata"]["annotations"]["run.ai/simulated-fb-used"]
    big = sharing_pod("big", "2026-01-01T00:00:01Z", most + 1, 10, node="k80")
    topology, warnings = reconcile([node], [quiet, big])
    assert [str(w) for w in warnings] == [
        f"pod team/big: metadata.annotations[run.ai/simulated-fb-used]: {most + 1} MiB does "
        f"not fit the device's {most} MiB"
    ]
    (gpu,) = topology.nodes["k80"].gpus
    assert gpu.status is not None
    assert gpu.status.pod_gpu_usage_status["uid-quiet"].fb_used == int(11441 // 2 * 0.9)
