"""The incremental cluster state: any order of events ends where a fresh reconcile of the final
objects ends, and an event costs its own node only."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater import devices
from status_updater import state as state_module
from status_updater.objects import NODE_LABELS, pod_key, slim_node, slim_pod
from status_updater.state import ClusterState, Unreadable
from tests.support.base import examples
from topology import migparted
from topology.model import NodeTopology

LAYOUT = {0: "2g.10gb", 4: "1g.5gb", 5: "1g.5gb", 6: "1g.5gb"}


def node(name: str, *, mapping_from: str | tuple[str, str] | None = None, strategy: str = "mixed",
         broken: bool = False, uid: str = "") -> dict[str, Any]:  # fmt: skip
    """A 2-GPU A100 node; its mapping names MIG ids after `mapping_from` (a copy: a duplicate),
    or GPU by GPU after the two nodes it names."""
    config = {"mig-configs": {"selected": [{"devices": "all", "mig-enabled": True,
                                            "mig-devices": dict(LAYOUT)}]}}  # fmt: skip
    sources = mapping_from if isinstance(mapping_from, tuple) else (mapping_from or name,) * 2
    mapping = {str(g): {str(p): f"MIG-{source}-{g}-{p}" for p in LAYOUT}
               for g, source in enumerate(sources)}  # fmt: skip
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "two" if broken else "2",
              "nvidia.com/mig.strategy": strategy, "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true", "kubernetes.io/hostname": name}  # fmt: skip
    annotations = {"run.ai/mig.config": json.dumps(config),
                   "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode(),
                   "node.alpha.kubernetes.io/ttl": "0"}  # fmt: skip
    return {"kind": "Node", "metadata": {"name": name, "uid": uid or f"uid-{name}", "labels": labels,
                                         "annotations": annotations},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip


def pod(name: str, node_name: str, gpu: int, position: int, *, fb: str = "100",
        phase: str = "Running") -> dict[str, Any]:  # fmt: skip
    device = {"name": f"nvidia.com/mig-{LAYOUT[position]}", "position": position, "gpuindex": gpu}
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "annotations": {"runai-mig-device": json.dumps(device), "run.ai/simulated-fb-used": fb,
                                         "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": node_name, "containers": [{"name": "main", "image": "burn",
                                                            "env": [{"name": "X", "value": "1"}]}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready"}]}}  # fmt: skip


def cpu_pod(name: str, node_name: str) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "web"},
            "spec": {"nodeName": node_name, "containers": [{"name": "web"}]},
            "status": {"phase": "Running"}}  # fmt: skip


NAMES = ["a", "b", "c"]
# Everything that can happen: nodes come, change and go; pods come, change, move, finish, go.
events = st.one_of(
    st.tuples(st.just("node"), st.sampled_from(NAMES), st.sampled_from(["plain", "broken", "copy-a", "single"])),
    st.tuples(st.just("delete-node"), st.sampled_from(NAMES), st.just("")),
    st.tuples(st.just("pod"), st.sampled_from(["p1", "p2", "p3", "p4"]),
              st.tuples(st.sampled_from(NAMES), st.integers(0, 1), st.sampled_from(list(LAYOUT)),
                        st.sampled_from(["100", "200", "lots"]), st.sampled_from(["Running", "Succeeded"]))),
    st.tuples(st.just("delete-pod"), st.sampled_from(["p1", "p2", "p3", "p4"]), st.just("")),
    st.tuples(st.just("cpu-pod"), st.sampled_from(["w1", "w2"]), st.sampled_from(NAMES)),
)  # fmt: skip


def build_node(name: str, kind: str) -> dict[str, Any]:
    if kind == "broken":
        return node(name, broken=True)
    if kind == "copy-a":
        return node(name, mapping_from="a")
    return node(name, strategy="single" if kind == "single" else "mixed")


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(events, max_size=25), st.integers(0, 5))
def test_any_order_of_events_ends_where_a_fresh_reconcile_ends(
    history: list[tuple[str, str, Any]], settle_every: int
) -> None:
    state = ClusterState()
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    claims: dict[str, Any] = {}  # pod -> (node, GPU, position, fb, phase) it asks for
    for i, (kind, name, arg) in enumerate(history):
        if kind == "node":
            nodes[name] = build_node(name, arg)
            state.set_node(slim_node(copy.deepcopy(nodes[name])))
        elif kind == "delete-node":
            nodes.pop(name, None)
            state.delete_node(name)
        elif kind in ("pod", "cpu-pod"):
            obj = (
                pod(name, arg[0], arg[1], arg[2], fb=arg[3], phase=arg[4])
                if kind == "pod"
                else cpu_pod(name, arg)
            )
            pods[pod_key(obj)] = obj
            state.set_pod(slim_pod(copy.deepcopy(obj)))
            if kind == "pod":
                claims[name] = arg
            else:
                claims.pop(name, None)
        else:
            claims.pop(name, None)
            pods.pop(f"team/{name}", None)
            state.delete_pod(f"team/{name}")
        if settle_every and i % settle_every == 0:
            state.settle()
    state.settle()
    fresh = ClusterState.of(nodes.values(), pods.values())
    # Pods keep what they hold: where two live pods claim one device, the first keeps it, where a
    # fresh start gives it to the older. The end is then a fresh reconcile that remembers what
    # was written, as a restarted updater does; with no such claim, a fresh reconcile.
    live = [a for a in claims.values() if a[4] == "Running" and a[0] in nodes]
    if len({a[:3] for a in live}) < len(live):
        fresh.remember({n: r for n, r in state.results.items() if isinstance(r, NodeTopology)})
        fresh.settle()
    assert state.results == fresh.results
    assert state.strategy() == fresh.strategy()
    assert {n: [str(w) for w in state.node_warnings(n)] for n in state.results} == {
        n: [str(w) for w in fresh.node_warnings(n)] for n in fresh.results
    }


def test_an_event_costs_its_own_node_only() -> None:
    state = ClusterState.of([node("a"), node("b")], [pod("p1", "a", 0, 0), pod("p2", "b", 0, 4)])
    before = dict(state.results)
    state.set_pod(slim_pod(pod("p1", "a", 0, 0, fb="300")))
    assert state.settle() == {"a"}
    assert state.results["b"] is before["b"]  # not even recomputed
    # What reconcile does not read changes nothing: a pod without GPUs, a node's status.
    state.set_pod(slim_pod(cpu_pod("web", "a")))
    busy = node("b")
    busy["status"]["conditions"][0]["status"] = "False"
    busy["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] = "30"
    state.set_node(slim_node(busy))
    assert state.settle() == set()
    # A finished pod releases its device, a deleted node goes with its result.
    state.set_pod(slim_pod(pod("p2", "b", 0, 4, phase="Succeeded")))
    state.delete_node("a")
    assert state.settle() == {"a", "b"}
    assert set(state.results) == {"b"}
    # A re-list with the same objects costs nothing.
    state.reset_nodes(map(slim_node, [node("b")]))
    state.reset_pods(map(slim_pod, [cpu_pod("web", "a")]))
    assert state.settle() == set()


def test_only_what_reconcile_reads_is_kept() -> None:
    state = ClusterState()
    state.set_pod(slim_pod(pod("p1", "a", 0, 0)))
    state.set_pod(slim_pod(cpu_pod("web", "a")))  # never holds a GPU: not kept at all
    raw = node("a")
    raw["metadata"]["labels"]["kubernetes.io/hostname"] = "a"
    state.set_node(slim_node(raw))
    (kept,) = state.pods["a"].values()
    assert kept["metadata"]["annotations"] == {
        "runai-mig-device": json.dumps(
            {"name": "nvidia.com/mig-2g.10gb", "position": 0, "gpuindex": 0}
        ),
        "run.ai/simulated-fb-used": "100",
    }
    assert "managedFields" not in kept["metadata"]
    assert kept["spec"] == {
        "nodeName": "a",
        "containers": [{"name": "main", "resources": {"limits": {}}}],
    }
    labels = raw["metadata"]["labels"]
    kept_labels = state.nodes["a"]["metadata"]["labels"].keys()
    raw["metadata"]["labels"]["feature.node.kubernetes.io/cpu-cpuid.AVX"] = "true"  # NFD's
    state.set_node(slim_node(raw))
    # Every label a fault policy may select nodes by: all but NFD's CPU and kernel facts.
    nfd = {k for k in labels if k.startswith("feature.node.kubernetes.io/")}
    assert kept_labels == labels.keys() - nfd and set(NODE_LABELS) & labels.keys() and nfd
    assert "node.alpha.kubernetes.io/ttl" not in state.nodes["a"]["metadata"]["annotations"]
    assert state.node_uid("a") == "uid-a"


def test_a_copied_id_makes_the_later_name_the_bad_node_in_any_order() -> None:
    for order in (["a", "b"], ["b", "a"]):
        state = ClusterState()
        for name in order:
            state.set_node(slim_node(node(name, mapping_from="a")))
            state.settle()
        assert isinstance(state.results["a"], NodeTopology)
        bad = state.results["b"]
        assert isinstance(bad, Unreadable)
        assert str(bad.reason).startswith(
            "node b: gpus[0].mig-devices[0].id: duplicate id MIG-a-0-0 (also node a)"
        )
    # Fixed: b is good again, a untouched.
    state.set_node(slim_node(node("b")))
    assert state.settle() == {"b"}
    assert isinstance(state.results["b"], NodeTopology)


def test_a_node_claiming_the_ids_of_two_others_judges_both_again() -> None:
    older, newer = "2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z"
    b, c = node("b"), node("c")
    for n in (b, c):
        n["metadata"]["creationTimestamp"] = newer
    a = node("a", mapping_from=("b", "c"))  # b's ids on GPU 0, c's on GPU 1
    a["metadata"]["creationTimestamp"] = older  # the oldest Node keeps them
    state = ClusterState.of([b, c], [])
    state.set_node(slim_node(a))
    state.settle()
    assert [type(state.results[n]).__name__ for n in "abc"] == ["NodeTopology", "Unreadable", "Unreadable"]  # fmt: skip
    state.delete_node("a")
    state.settle()
    assert all(isinstance(state.results[n], NodeTopology) for n in "bc")


def test_a_node_that_breaks_the_builder_is_one_line_and_the_others_are_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    build = devices.build_node

    def fragile(node: dict[str, Any], *args: Any) -> Any:
        if node["metadata"]["name"] == "b":
            raise ValueError("an odd value")  # a bug, not bad input: the last guard holds
        return build(node, *args)

    monkeypatch.setattr(state_module, "build_node", fragile)
    state = ClusterState.of([node("a"), node("b")], [])
    assert isinstance(state.results["a"], NodeTopology)
    assert [str(w) for w in state.node_warnings("b")] == [
        "node b: ?: cannot be read: ValueError: an odd value"
    ]


def test_a_label_change_that_keeps_the_devices_is_still_a_change() -> None:
    state = ClusterState.of([node("a")], [])
    state.set_node(slim_node(node("a", strategy="single")))
    assert state.settle() == {"a"}
    assert state.node_strategy("a") == "single"


# --- what mutation testing found unpinned --------------------------------------------------------


def test_the_cluster_strategy_is_the_most_common_label() -> None:
    state = ClusterState.of([node("a"), node("b"), node("c", strategy="single")], [])
    assert state.strategy() == "mixed"
    state = ClusterState.of([node("a", strategy="single"), node("b", strategy="single"),
                             node("c")], [])  # fmt: skip
    assert state.strategy() == "single"
    assert ClusterState.of([], []).strategy() == "none"
    assert ClusterState.of([node("a"), node("b", strategy="single")], []).strategy() == "mixed"


def test_unknown_nodes_have_no_strategy_uid_or_warnings() -> None:
    state = ClusterState.of([node("a")], [])
    assert (state.node_strategy("nope"), state.node_uid("nope"), state.node_warnings("nope")) == (
        None, None, []
    )  # fmt: skip
    assert (state.node_strategy("a"), state.node_uid("a")) == ("mixed", "uid-a")


def test_a_relist_drops_what_it_no_longer_holds() -> None:
    state = ClusterState.of([node("a"), node("b")], [pod("p1", "a", 0, 0), pod("p2", "a", 0, 4)])
    state.reset_nodes(map(slim_node, [node("a")]))
    state.reset_pods(map(slim_pod, [pod("p2", "a", 0, 4)]))
    state.settle()
    assert set(state.results) == {"a"}
    result = state.results["a"]
    assert isinstance(result, NodeTopology)
    held = [d.position for d in result.gpus[0].mig_devices or () if d.status]
    assert held == [4]


def test_remembered_placements_replace_the_state_own() -> None:
    from tests.status_updater.test_reconcile import after_one_ended, gpu_pod, whole_gpu_node

    state = ClusterState.of([whole_gpu_node("k80", count=2)],
                            [gpu_pod("b", "k80", 1, "2026-01-02T00:00:00Z")])  # fmt: skip
    result = state.results["k80"]
    assert isinstance(result, NodeTopology) and result.gpus[0].status is not None
    # Another leader wrote b on GPU 1: taking over, this replica follows what was written.
    written = after_one_ended(
        2, [("a", 1, "2026-01-01T00:00:00Z"), ("b", 1, "2026-01-02T00:00:00Z")], ended="a"
    )
    state.remember(written.topology().nodes)
    assert state.settle() == {"k80"}
    assert state.results["k80"] == written.results["k80"]


def test_layouts_given_to_of_are_the_ones_static_nodes_use() -> None:
    from tests.status_updater.test_static import static_node
    from topology import migparted

    layouts = migparted.parse(
        "version: v1\nmig-configs:\n  mine:\n  - devices: all\n    mig-enabled: true\n"
        "    mig-devices: {3g.20gb: 2}\n", "cm"
    )  # fmt: skip
    n = static_node("s", "NVIDIA-A100-SXM4-40GB", 1, "mine")
    result = ClusterState.of([n], [], layouts).results["s"]
    assert isinstance(result, NodeTopology)
    assert [d.name for d in result.gpus[0].mig_devices or ()] == ["3g.20gb", "3g.20gb"]
    builtin = ClusterState.of([n], []).results["s"]  # NVIDIA's layouts have no `mine`
    assert isinstance(builtin, NodeTopology) and builtin.gpus[0].mig_devices == ()


def test_new_layouts_rebuild_the_static_nodes_only() -> None:
    """The GPU operator's layouts changed: static-MIG nodes are computed again, a run:ai node is
    not, even with the operator's layout label (run:ai's labels win; its result cannot change)."""
    static = {"kind": "Node", "metadata": {"name": "s", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "1",
        "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-1g.5gb"}}}  # fmt: skip
    dynamic = node("d")
    dynamic["metadata"]["labels"]["nvidia.com/mig.config"] = "all-1g.5gb"
    state = ClusterState.of([static, dynamic], [])
    state.set_layouts({"all-1g.5gb": migparted.builtin()["all-3g.20gb"]})
    assert state.settle() == {"s"}
    assert state.reconsidered == {"s"}


def test_an_id_a_node_gave_up_is_free_for_another() -> None:
    """a's mapping stops naming a's ids (re-mapped after b's): a no longer claims them, so a
    newer node b naming them later owns them, and b is no bad node."""
    older, newer = "2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z"
    a, b = node("a"), node("b", mapping_from="a")
    a["metadata"]["creationTimestamp"], b["metadata"]["creationTimestamp"] = older, newer
    state = ClusterState.of([a], [])
    remapped = node("a", mapping_from="c")  # a's devices now named MIG-c-…
    remapped["metadata"]["creationTimestamp"] = older
    state.set_node(slim_node(remapped))
    state.settle()
    state.set_node(slim_node(b))
    state.settle()
    assert all(isinstance(state.results[n], NodeTopology) for n in "ab")


def test_a_node_without_a_creation_time_is_the_newest_where_ids_clash() -> None:
    """b copied a's ids, but only b says when it was created: a, never read as older than
    anything, is the bad node, in either order."""
    a, b = node("a"), node("b", mapping_from="a")
    b["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    for order in ([a, b], [b, a]):
        state = ClusterState.of(order, [])
        assert isinstance(state.results["b"], NodeTopology)
        bad = state.results["a"]
        assert isinstance(bad, Unreadable)
        assert str(bad.reason).startswith(
            "node a: gpus[0].mig-devices[0].id: duplicate id MIG-a-0-0 (also node b)"
        )


def test_a_pod_that_finishes_gives_its_device_back() -> None:
    state = ClusterState.of([node("a")], [pod("p1", "a", 0, 0)])
    held = [d for g in state.results["a"].gpus for d in g.mig_devices or () if d.status]
    assert held and held[0].status is not None and held[0].status.allocated_by is not None
    state.set_pod(slim_pod(pod("p1", "a", 0, 0, phase="Succeeded")))
    state.settle()
    assert state.pods.get("a", {}) == {}
    result = state.results["a"]
    assert isinstance(result, NodeTopology)
    assert not [d for g in result.gpus for d in g.mig_devices or () if d.status]


@pytest.mark.parametrize("containers", [None, "main", {"name": "main"}, 7])
def test_a_pod_whose_containers_are_no_list_holds_no_gpu(containers: object) -> None:
    """A hostile pod at the edge: asked before it is slimmed, never a crash of the watch."""
    from status_updater.objects import may_hold_gpu

    raw = {"metadata": {"name": "x", "namespace": "ns"}, "status": {"phase": "Running"},
           "spec": {"nodeName": "a", "containers": containers}}  # fmt: skip
    assert may_hold_gpu(raw) is False


def test_a_pod_seen_again_on_another_node_leaves_the_first() -> None:
    """Its delete missed (a watch gap), a pod of the same name comes back on another node: the
    first node's device is free again, not held by a ghost."""
    state = ClusterState.of([node("a"), node("b")], [pod("p1", "a", 0, 0)])
    state.set_pod(slim_pod(pod("p1", "b", 0, 0)))
    state.settle()
    holders = {
        name: [d.status.allocated_by.pod for g in result.gpus for d in g.mig_devices or ()
               if d.status and d.status.allocated_by]
        for name, result in state.results.items()
        if isinstance(result, NodeTopology)
    }  # fmt: skip
    assert holders == {"a": [], "b": ["p1"]}
