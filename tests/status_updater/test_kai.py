"""KAI-Scheduler's GPU fractions: reservation pods hold GPUs, fraction pods share them.

What a KAI user checks: each fraction pod is on the GPU its group's reservation pod holds, with
the memory KAI gives it (gpu-fraction of the node's GPU memory floored to 100 MiB, gpu-memory,
or NvFractions' request); the GPU's series name the reservation pod and read the sum of its
fraction pods' usage; a pod without its reservation pod, in another compute mode, or asking
more than is left is said in one line; nothing is placed twice, whatever the order and mix.
"""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater.objects import slim_node, slim_pod
from status_updater.reconcile import reconcile_node
from status_updater.state import reconcile
from tests.support.base import SAMPLES, examples, run_cli
from tests.support.promtext import by_name, parse
from topology import kai
from topology.model import DeviceStatus, NodeTopology, load_yaml

NODES, PODS = SAMPLES / "kai" / "nodes.yaml", SAMPLES / "kai" / "pods.yaml"
H100_LABEL_MIB = 81559


def items(path: Any) -> list[dict[str, Any]]:
    return list(yaml.safe_load(path.read_text())["items"]) if "items" in path.read_text() else [
        yaml.safe_load(path.read_text())]  # fmt: skip


def node(gpus: int = 4, name: str = "n") -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(H100_LABEL_MIB), "nvidia.com/mig.strategy": "none"}}}  # fmt: skip


def stamp(t: int) -> str:
    return f"2026-01-01T00:{t // 60:02d}:{t % 60:02d}Z"


def reservation(group: str, t: int, uid: str | None = None, mode: str = "") -> dict[str, Any]:
    annotations = {f"{kai.NV_PREFIX}{kai.RESERVATION_CONTAINER}{kai.NV_MODE}": mode} if mode else {}
    return {"kind": "Pod", "metadata": {
        "name": f"gpu-reservation-{uid or group}", "namespace": "kai-resource-reservation",
        "uid": uid or f"r-{group}", "creationTimestamp": stamp(t), "annotations": annotations,
        "labels": {"app": "kai-resource-reservation", kai.GROUP: group}},
        "spec": {"nodeName": "n", "containers": [{"name": "resource-reservation", "resources": {
            "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}}  # fmt: skip


def fraction(name: str, groups: list[str], t: int, **annotations: str) -> dict[str, Any]:
    labels = ({kai.GROUP: groups[0]} if len(groups) == 1
              else {f"{kai.GROUP_PREFIX}{g}": g for g in groups})  # fmt: skip
    return {"kind": "Pod", "metadata": {
        "name": name, "namespace": "team", "uid": f"u-{name}", "creationTimestamp": stamp(t),
        "labels": labels, "annotations": {k.replace("_", "-"): v for k, v in annotations.items()}},
        "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"}}  # fmt: skip


def place(pods: list[dict[str, Any]], previous: NodeTopology | None = None,
          gpus: int = 4) -> tuple[NodeTopology, list[str]]:  # fmt: skip
    result, warnings = reconcile_node(slim_node(node(gpus)), [slim_pod(p) for p in pods],
                                      previous=previous)  # fmt: skip
    return result, [str(w) for w in warnings]


def statuses(topology: NodeTopology) -> list[DeviceStatus]:
    return [g.status for g in topology.gpus if g.status is not None]


def sharing(topology: NodeTopology) -> dict[str, list[tuple[int, int]]]:
    """Each fraction pod's (GPU, memory) shares."""
    out: dict[str, list[tuple[int, int]]] = {}
    for i, g in enumerate(topology.gpus):
        for f in g.status.fractions if g.status else ():
            out.setdefault(f.holder.pod, []).append((i, f.memory))
    return out


# --- the sample, through render and the exporter -----------------------------------------------


def asked_mib(pod: dict[str, Any]) -> int:
    """What a sample pod asks of each GPU, by KAI's rules, from its annotations."""
    a = pod["metadata"]["annotations"]
    for key, value in a.items():
        if key.endswith(kai.NV_REQUEST):
            return int(value.removesuffix("Gi")) * 1024
    if kai.FRACTION in a:
        return int(Decimal(a[kai.FRACTION]) * (H100_LABEL_MIB // 100 * 100))
    return int(a[kai.MEMORY])


def test_the_sample_places_each_fraction_pod_on_its_groups_gpu_as_kai_counts_it() -> None:
    rendered = run_cli("status_updater", "render", "--nodes", str(NODES), "--pods", str(PODS))
    assert rendered.returncode == 0, rendered.stderr
    cm = yaml.safe_load(rendered.stdout)["items"][0]
    topology = load_yaml(cm["data"]["topology.yml"]).nodes["h100-kai-0"]
    pods = items(PODS)
    reserved = {p["metadata"]["labels"][kai.GROUP]: p["metadata"]["name"] for p in pods
                if p["metadata"]["namespace"] == "kai-resource-reservation"}  # fmt: skip
    fractions = [p for p in pods if p["metadata"].get("annotations", {}).get(
        "received-resource-type") == "Fraction"]  # fmt: skip
    for pod in fractions:
        name = pod["metadata"]["name"]
        groups = kai.groups(pod["metadata"]["labels"])
        held = [(g.status.allocated_by.pod, f.memory) for g in topology.gpus
                if g.status and g.status.allocated_by
                for f in g.status.fractions if f.holder.pod == name]  # fmt: skip
        if not all(group in reserved for group in groups):
            assert held == []  # its reservation pod is gone: it holds nothing
            assert f"pod team-a/{name}: metadata.labels[{kai.GROUP}]: GPU group " in rendered.stderr
            continue
        assert sorted(held) == sorted((reserved[g], asked_mib(pod)) for g in groups)
    # The reservation pods use nothing; the GPU reads its fraction pods' sum.
    for gpu in topology.gpus:
        if gpu.status and gpu.status.fractions:
            own = gpu.status.pod_gpu_usage_status[gpu.status.allocated_by.uid]
            assert (own.fb_used, own.utilization.max) == (0, 0)
    assert rendered.stderr.count("warning:") == 1  # the orphan, once


def test_the_exporter_names_the_reservation_pod_with_the_summed_memory(tmp_path: Any) -> None:
    rendered = run_cli("status_updater", "render", "--nodes", str(NODES), "--pods", str(PODS))
    cm = tmp_path / "cm.yaml"
    cm.write_text(rendered.stdout)
    out = run_cli("exporter", "--topology-file", str(cm), "--node-name", "h100-kai-0", "--once")
    assert out.returncode == 0, out.stderr
    topology = load_yaml(yaml.safe_load(rendered.stdout)["items"][0]["data"]["topology.yml"])
    series = by_name(parse(out.stdout), "DCGM_FI_DEV_FB_USED")
    for i, gpu in enumerate(topology.nodes["h100-kai-0"].gpus):
        if not (gpu.status and gpu.status.fractions):
            continue
        (line,) = [s for s in series if s.label("gpu") == str(i)]
        assert line.label("pod") == gpu.status.allocated_by.pod
        assert line.label("namespace") == "kai-resource-reservation"
        assert line.value == sum(u.fb_used for u in gpu.status.pod_gpu_usage_status.values())
        assert line.value == sum(f.memory for f in gpu.status.fractions)


# --- the rules, case by case -------------------------------------------------------------------


def test_a_fraction_pod_older_than_its_re_created_reservation_pod_follows_it() -> None:
    pods = [fraction("f", ["g"], 0, gpu_fraction="0.5"), reservation("g", 10, uid="r1")]
    first, warnings = place(pods)
    assert warnings == [] and sharing(first) == {"f": [(0, 40750)]}
    # The reservation pod is re-created (a new uid, younger than the fraction pod) while a whole
    # GPU pod took GPU 0 meanwhile: the fraction pod follows the new one, never placed twice.
    whole = {"kind": "Pod", "metadata": {"name": "w", "namespace": "team", "uid": "u-w",
             "creationTimestamp": stamp(20)}, "spec": {"nodeName": "n", "containers": [
             {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
             "status": {"phase": "Running"}}  # fmt: skip
    second, warnings = place([pods[0], whole], previous=first)
    assert sharing(second) == {} and len(warnings) == 1  # no reservation pod: said, nothing held
    third, warnings = place([pods[0], whole, reservation("g", 30, uid="r2")], previous=second)
    assert warnings == [] and sharing(third) == {"f": [(1, 40750)]}
    assert third.gpus[1].status.allocated_by.uid == "r2"  # the whole GPU pod kept GPU 0


def test_pods_in_different_compute_modes_never_share_a_gpu() -> None:
    nv = {f"{kai.NV_PREFIX}main{kai.NV_REQUEST}": "8Gi"}
    pods = [reservation("g", 0, mode="sm-sharing"),
            fraction("sm", ["g"], 1, **nv, **{f"{kai.NV_PREFIX}main{kai.NV_MODE}": "sm-sharing"}),
            fraction("ts", ["g"], 2, **nv, **{f"{kai.NV_PREFIX}main{kai.NV_MODE}": "time-slicing"})]  # fmt: skip
    result, warnings = place([{**p, "metadata": {**p["metadata"], "annotations": {
        k: v for k, v in p["metadata"]["annotations"].items()}}} for p in pods])  # fmt: skip
    assert sharing(result) == {"sm": [(0, 8192)]}
    (line,) = warnings
    assert (
        "pod team/ts:" in line and "asks compute mode time-slicing" in line and "sm-sharing" in line
    )


def test_more_than_the_gpu_has_left_is_held_at_what_is_left_and_said() -> None:
    pods = [reservation("g", 0), fraction("a", ["g"], 1, gpu_fraction="0.7"),
            fraction("b", ["g"], 2, gpu_fraction="0.7")]  # fmt: skip
    result, warnings = place(pods)
    memory = H100_LABEL_MIB // 100 * 100
    assert sharing(result) == {
        "a": [(0, int(memory * 0.7))],
        "b": [(0, memory - int(memory * 0.7))],
    }
    (line,) = warnings
    assert "pod team/b:" in line and f"of {memory} MiB left" in line
    assert sum(f.memory for f in result.gpus[0].status.fractions) <= memory


def test_a_limit_caps_what_a_pod_uses() -> None:
    pods = [reservation("g", 0), fraction("a", ["g"], 1, **{
        f"{kai.NV_PREFIX}main{kai.NV_REQUEST}": "8Gi", f"{kai.NV_PREFIX}main{kai.NV_LIMIT}": "10Gi",
        "run.ai/simulated-fb-used": "30000"})]  # fmt: skip
    result, warnings = place(pods)
    usage = result.gpus[0].status.pod_gpu_usage_status["u-a"]
    assert usage.fb_used <= 10 * 1024
    assert any("run.ai/simulated-fb-used" in w for w in warnings)


def test_a_bad_annotation_is_that_pods_problem_in_one_line() -> None:
    pods = [reservation("g", 0), fraction("bad", ["g"], 1, gpu_fraction="half"),
            fraction("good", ["g"], 2, gpu_memory="1000")]  # fmt: skip
    result, warnings = place(pods)
    assert sharing(result) == {"good": [(0, 1000)]}
    (line,) = warnings
    assert (
        line.startswith("pod team/bad: metadata.annotations[gpu-fraction]: ") and "\n" not in line
    )


# --- any mix of groups, orders and missing halves ----------------------------------------------

GROUPS = ["g0", "g1", "g2", "g3", "g4", "g5"]
asks = st.one_of(
    st.sampled_from(["0.1", "0.25", "0.5", "0.7", "1", "2", "x"]).map(lambda v: {"gpu_fraction": v}),
    st.integers(1, 90_000).map(lambda v: {"gpu_memory": str(v)}),
    st.tuples(st.integers(1, 80), st.sampled_from(["", "time-slicing", "sm-sharing"])).map(
        lambda v: {f"{kai.NV_PREFIX}main{kai.NV_REQUEST}": f"{v[0]}Gi",
                   **({f"{kai.NV_PREFIX}main{kai.NV_MODE}": v[1]} if v[1] else {})}),
)  # fmt: skip
clusters = st.tuples(
    st.lists(
        st.tuples(
            st.sampled_from(GROUPS),
            st.integers(0, 99),
            st.sampled_from(["", "time-slicing", "sm-sharing"]),
        ),
        max_size=6,
        unique_by=lambda r: r[0],
    ),
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(GROUPS), min_size=0, max_size=3, unique=True),
            st.integers(0, 99),
            asks,
        ),
        max_size=8,
    ),
    st.integers(1, 4),
)


@settings(max_examples=examples(120), deadline=None)
@given(clusters, st.randoms(use_true_random=False))
def test_any_mix_is_a_fixed_point_and_nothing_is_placed_twice(cluster: Any, rnd: Any) -> None:
    reservations, fractions_asked, gpus = cluster
    pods = [reservation(g, t, mode=m) for g, t, m in reservations]
    pods += [fraction(f"f{i}", groups, t, **a) for i, (groups, t, a) in enumerate(fractions_asked)]
    rnd.shuffle(pods)
    first, warnings = place(pods, gpus=gpus)
    # Fixed point: placing again from what was placed (in another order) gives the same.
    again, _ = place(list(reversed(pods)), previous=first, gpus=gpus)
    assert again == first
    memory = H100_LABEL_MIB // 100 * 100
    held_groups = {g.status.allocated_by.uid: i for i, g in enumerate(first.gpus)
                   if g.status and g.status.allocated_by}  # fmt: skip
    for i, gpu in enumerate(first.gpus):
        fracs = gpu.status.fractions if gpu.status else ()
        # Never over the GPU, never one pod twice on a GPU, all in one compute mode.
        assert sum(f.memory for f in fracs) <= memory
        assert len({f.holder.uid for f in fracs}) == len(fracs)
        assert len({f.compute_mode or kai.DEFAULT_MODE for f in fracs}) <= 1
        for f in fracs:  # on its group's reservation pod's GPU
            assert held_groups.get(f"r-{f.group}") == i
    # A pod holding nothing is said: each fraction pod is placed or has a line.
    placed = {f.holder.pod for s in statuses(first) for f in s.fractions}
    for i in range(len(fractions_asked)):
        assert f"f{i}" in placed or any(f"pod team/f{i}:" in w for w in warnings)
    # One bad pod never harms another: without the pods that hold nothing, the others hold
    # exactly what they held.
    kept = [
        p for p in pods if p["metadata"]["namespace"] != "team" or p["metadata"]["name"] in placed
    ]
    alone, _ = place(copy.deepcopy(kept), gpus=gpus)
    assert sharing(alone) == sharing(first)


def test_a_cluster_reconciles_reservation_and_fraction_pods_across_nodes() -> None:
    """Reservation and fraction pods of the same group id on two nodes are two groups: each
    node's fraction pods share that node's reserved GPU."""
    a, b = node(2, "a"), node(2, "b")
    pods = []
    for name in ("a", "b"):
        r = reservation("g", 0, uid=f"r-{name}")
        f = fraction(f"f{name}", ["g"], 1, gpu_memory="1000")
        for p in (r, f):
            p["spec"]["nodeName"] = name
        pods += [r, f]
    topology, warnings = reconcile([a, b], pods)
    assert warnings == []
    for name in ("a", "b"):
        assert sharing(topology.nodes[name]) == {f"f{name}": [(0, 1000)]}


def test_a_reservation_pod_without_a_group_is_said_and_holds_nothing() -> None:
    bad = reservation("g", 0)
    bad["metadata"]["labels"][kai.GROUP] = ""
    result, warnings = place([bad, reservation("h", 1), fraction("f", ["h"], 2, gpu_memory="100")])
    assert sharing(result) == {"f": [(0, 100)]}  # the next reservation pod took GPU 0
    (line,) = warnings
    assert line.startswith("pod kai-resource-reservation/gpu-reservation-g: metadata.labels[")
