"""Issue 9's promises for any input: bounded, isolated, valid output, nothing lost or moved.

The generated part mutates real sample objects (the nodes and pods of samples/mig) the way an
attacker or a broken controller would, one node and its pods at a time, and checks that every
other node is untouched, that what the updater writes the exporter reads back, and that every
exposition is valid. The named cases below pin one promise each.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter import dcgm
from exporter.node import node_of
from mig_exporter.common.yamlload import flow_depth_exceeds, load_document
from status_updater.objects import slim_node, slim_pod
from status_updater.reconcile import document
from status_updater.state import ClusterState, Unreadable
from tests.status_updater.test_reconcile import REAL_NODE, after_one_ended, gpu_pod, whole_gpu_node
from tests.status_updater.test_static import pod as static_pod
from tests.status_updater.test_static import static_node
from tests.support import tree
from tests.support.base import SAMPLES, examples
from tests.support.promtext import parse
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology, dump_yaml, load_yaml

OPTIONS = dcgm.Options(hostname="h", driver_version="520.56.06", counters=dcgm.default_counters())
NOW = 1_790_000_000.0


def documents(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            out += doc["items"] if doc.get("kind") == "List" else [doc]
    return out


def sample_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every sample node (dynamic, static, single, whole-GPU, shared) and pod, plus two whole-GPU pods
    on each node (on MIG nodes they find nothing to take, which is a warning)."""
    objects = [
        o
        for folder in ("nodes", "static/nodes", "pods", "static/pods", "sharing")
        for path in sorted((SAMPLES / folder).glob("*.yaml"))
        for o in documents(path)
    ]
    whole = documents(SAMPLES / "whole-gpu" / "a100-40gb-mig-disabled.yaml")
    whole[0]["metadata"]["name"] = "whole-gpu-node"  # the sample shares the MIG node's name
    nodes = [o for o in objects if o["kind"] == "Node"] + whole
    pods = [o for o in objects if o["kind"] == "Pod"]
    for n in nodes:
        name = n["metadata"]["name"]
        pods += [gpu_pod(f"w{i}-{name}", name, 1, f"2026-01-0{i}T00:00:00Z") for i in (1, 2)]
    return nodes, pods


NODES, PODS = sample_cluster()
NAMES = [n["metadata"]["name"] for n in NODES]
BASE = ClusterState.of(NODES, PODS)

# What attackers and broken controllers write: odd scalars, huge and deep texts, alias bombs,
# numbers that overflow, other nodes' ids, times in other formats, wrong types.
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefg", "bcdefgh", strict=True)
)
HOSTILE: list[object] = [
    "", " ", "\n", "a\nb", "\x00", "\x1b[31m", "\u202e", "-1", "0", "99999999999999999999999",
    "1e999", "nan", "inf", "1e999%", "150%", "-5%", "[" * 5000, "{" * 100_000, BOMB, "x" * 300_000,
    "true", "null", "~", "0x10", "5.5", "50-20", "0-1000", "1-2-3", "mixed", "single", "bogus",
    "all-balanced", "all-1g.5gb", "all-7g.80gb",
    '{"name":"nvidia.com/mig-1g.5gb","position":4,"gpuindex":0}',
    '{"name":"nvidia.com/mig-1g.5gb","position":99999999999999999999,"gpuindex":0}',
    '{"name":"nvidia.com/mig-1g.5gb","position":6,"gpuindex":0,"deviceUUID":"MIG-298ef8da-b6ed-5a22-8aca-9c1ed1aa4219"}',
    base64.b64encode(b"[" * 100_000).decode(),
    base64.b64encode(b'{"0": {"0": "MIG-298ef8da-b6ed-5a22-8aca-9c1ed1aa4219"}}').decode(),
    "2026-01-01T00:00:00+05:00", "2026-01-01T00:00:00.5Z", "not a time",
    None, 5, -3, 1.5, math.nan, True, [], {}, ["a"], {"a": "b"}, [[[]]],
]  # fmt: skip
KEYS = ["run.ai/mig.config", "run.ai/mig-mapping", "nvidia.com/mig.strategy",
        "nvidia.com/gpu.count", "nvidia.com/gpu.product", "nvidia.com/gpu.memory",
        "nvidia.com/mig.config", "runai-mig-device", "run.ai/simulated-fb-used",
        "run.ai/simulated-gpu-utilization", "node-role.kubernetes.io/runai-dynamic-mig",
        "node-role.kubernetes.io/runai-mig-enabled"]  # fmt: skip


def paths(obj: object, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(obj, dict):
        found += [p for k, v in obj.items() for p in paths(v, (*path, k))]
    elif isinstance(obj, list):
        found += [p for i, v in enumerate(obj) for p in paths(v, (*path, i))]
    return found


def mutate(obj: dict[str, Any], rnd: random.Random) -> dict[str, Any]:
    """The object with one to three values replaced or labels/annotations added. Its name,
    kind and node stay, so the damage is known to belong to one node."""
    obj = copy.deepcopy(obj)
    for _ in range(rnd.randint(1, 3)):
        if rnd.random() < 0.5:
            path = rnd.choice(paths(obj))
            if (
                not path
                or path[0] == "kind"
                or path[:2] in {("metadata", "name"), ("spec", "nodeName")}
            ):
                continue  # fmt: skip
            parent = obj
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = copy.deepcopy(rnd.choice(HOSTILE))
        else:
            meta = obj.setdefault("metadata", {})
            if isinstance(meta, dict):
                where = rnd.choice(["labels", "annotations"])
                if not isinstance(meta.get(where), dict):
                    meta[where] = {}
                meta[where][rnd.choice(KEYS)] = copy.deepcopy(rnd.choice(HOSTILE))
    return obj


def exposition_problems(node: NodeTopology) -> list[str]:
    """What is wrong with a node's exposition: duplicate series, values that are no number."""
    problems, seen = [], set()
    for s in parse(dcgm.render(node, OPTIONS, NOW).decode()):
        key = (s.name, tuple(sorted(s.labels)))
        if key in seen:
            problems.append(f"duplicate series {key}")
        seen.add(key)
        if not math.isfinite(s.value):
            problems.append(f"{s.name} = {s.value}")
    return problems


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(NAMES), st.randoms(use_true_random=False))
def test_one_hostile_node_and_its_pods_harm_only_that_node(victim: str, rnd: random.Random) -> None:
    nodes = [mutate(n, rnd) if n["metadata"]["name"] == victim else n for n in NODES]
    pods = [mutate(p, rnd) if p["spec"]["nodeName"] == victim else p for p in PODS]
    state = ClusterState.of(nodes, pods)

    # Isolated: every other node's entry is what it was without the attacker.
    for name, result in BASE.results.items():
        if name != victim:
            assert state.results.get(name) == result, name
    # Never silent, and every message one line.
    for warning in state.all_warnings():
        assert "\n" not in str(warning) and len(str(warning)) < 1500
    # What the updater writes, the exporter reads back and serves as valid series.
    for name, result in state.results.items():
        if isinstance(result, NodeTopology):
            doc = document(name, result, state.node_strategy(name))
            back = load_yaml(dump_yaml(doc), "ConfigMap")
            assert back == doc
            assert exposition_problems(node_of(back, name, "ConfigMap") or result) == []
    # The single layout: one document, and each innocent exporter reads its node from it.
    whole = load_yaml(dump_yaml(state.topology()), "ConfigMap")
    for name, result in BASE.results.items():
        if name != victim and isinstance(result, NodeTopology):
            assert node_of(whole, name, "ConfigMap") == result


def test_sample_cluster_is_served_whole_before_any_attack() -> None:
    # The generated test compares against this: it must hold every kind of node, all good.
    assert set(BASE.results) == set(NAMES)
    assert all(isinstance(r, NodeTopology) for r in BASE.results.values())
    kinds = {(r.is_dynamic_mig_enabled, any(g.mig_devices for g in r.gpus))
             for r in BASE.results.values() if isinstance(r, NodeTopology)}  # fmt: skip
    assert kinds == {(True, True), (False, True), (False, False)}


# --- named cases ---------------------------------------------------------------------------------


def test_a_bad_strategy_label_stays_on_its_node() -> None:
    bad = copy.deepcopy(REAL_NODE)
    bad["metadata"]["name"] = "aaa-bad"
    bad["metadata"]["labels"]["nvidia.com/mig.strategy"] = "bogus"
    good = [static_node(f"n{i}", "NVIDIA-A100-SXM4-40GB", 1, "all-1g.5gb") for i in range(1)]
    state = ClusterState.of([bad, *good], [])
    assert state.strategy() == "mixed"  # a tie between "bogus" and "mixed" once chose bogus
    whole = load_yaml(dump_yaml(state.topology()), "ConfigMap")
    assert node_of(whole, "n0", "ConfigMap") == state.results["n0"]
    assert isinstance(state.results["aaa-bad"], Unreadable)
    assert "metadata.labels[nvidia.com/mig.strategy]" in str(state.results["aaa-bad"].reason)


def test_an_empty_container_name_is_written_and_read_back() -> None:
    node = whole_gpu_node("k80")
    pod = gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z")
    pod["spec"]["containers"][0]["name"] = ""
    state = ClusterState.of([node], [pod])
    result = state.results["k80"]
    assert isinstance(result, NodeTopology)
    assert result.gpus[0].status and result.gpus[0].status.allocated_by
    assert result.gpus[0].status.allocated_by.container == ""
    assert node_of(load_yaml(dump_yaml(state.topology())), "k80", "cm") == result


def test_a_pod_naming_another_nodes_mig_id_takes_nothing_from_that_node() -> None:
    owner = REAL_NODE["metadata"]["name"]
    taken = next(d.id for g in BASE.results[owner].gpus for d in g.mig_devices or () if d.id)  # type: ignore[union-attr]
    other = static_node("aaa-first-by-name", "NVIDIA-A100-SXM4-40GB", 2, "all-1g.5gb")
    other["metadata"]["labels"] |= {
        "node-role.kubernetes.io/runai-dynamic-mig": "true",
        "node-role.kubernetes.io/runai-mig-enabled": "true",
    }
    # GPU 1 has MIG off: the claim is dropped from GPU 0's instances, GPU 1 stays as it is.
    other["metadata"]["annotations"] = {"run.ai/mig.config": yaml.safe_dump(
        {"mig-configs": {"selected": [{"devices": [0], "mig-enabled": True,
                                       "mig-devices": {"0": "3g.20gb", "4": "3g.20gb"}},
                                      {"devices": [1], "mig-enabled": False}]}})}  # fmt: skip
    device = {"name": "nvidia.com/mig-3g.20gb", "position": 4, "gpuindex": 0, "deviceUUID": taken}
    thief = static_pod("thief", "aaa-first-by-name", "2026-01-01T00:00:00Z", {"c": {}},
                       annotations={"runai-mig-device": json.dumps(device)})  # fmt: skip
    whole = gpu_pod("whole", "aaa-first-by-name", 1, "2026-01-01T00:00:00Z")  # takes GPU 1
    before = ClusterState.of([REAL_NODE], []).results[owner]
    state = ClusterState.of([REAL_NODE, other], [thief, whole])
    assert state.results[owner] == before  # not removed, not changed
    mine = state.results["aaa-first-by-name"]
    assert isinstance(mine, NodeTopology)  # the node is fine: only the pod's claim was wrong
    honest = copy.deepcopy(thief)
    honest["metadata"]["annotations"]["runai-mig-device"] = json.dumps(
        {k: v for k, v in device.items() if k != "deviceUUID"}
    )
    assert (
        mine == ClusterState.of([other], [honest, whole]).results["aaa-first-by-name"]
    )  # all else kept
    held = [d for g in mine.gpus for d in g.mig_devices or () if d.status]
    assert [(d.position, d.id, d.status.allocated_by.pod) for d in held] == [(4, None, "thief")]  # type: ignore[union-attr]
    assert [g.mig_devices is None for g in mine.gpus] == [False, True]
    assert mine.gpus[1].status is not None and mine.gpus[1].status.allocated_by.pod == "whole"  # type: ignore[union-attr]


def test_a_newer_node_copying_ids_never_takes_them_from_the_older_one() -> None:
    owner = copy.deepcopy(REAL_NODE)
    owner["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    copycat = copy.deepcopy(REAL_NODE)
    copycat["metadata"]["name"] = "aaa-copycat"  # sorts first by name
    copycat["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00+05:00"
    alone = ClusterState.of([owner], []).results[owner["metadata"]["name"]]
    for order in ([owner, copycat], [copycat, owner]):
        state = ClusterState()
        for node in order:
            state.set_node(slim_node(node))
            state.settle()
        assert state.results[owner["metadata"]["name"]] == alone
        assert isinstance(state.results["aaa-copycat"], Unreadable)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (BOMB + "i: [" + ", ".join(["*h"] * 9) + "]\n",
         "expands its aliases to far more values than its text holds"),
        ("[" * 200_000, "nests more than 1000 levels deep"),
        ("{a: " * 5000 + "1" + "}" * 5000, "nests more than 1000 levels deep"),
    ],
    ids=["alias-bomb", "deep-flow", "deep-mapping"],
)  # fmt: skip
def test_hostile_yaml_is_refused_within_bounds(text: str, says: str) -> None:
    with pytest.raises(yaml.YAMLError) as e:
        load_document(text)
    assert str(e.value) == says


def test_brackets_inside_names_are_not_depth() -> None:
    node = whole_gpu_node("k80")
    pod = gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z")
    pod["metadata"]["namespace"] = "[" * 3000  # the emulator lets anything through
    state = ClusterState.of([node], [pod])
    assert load_yaml(dump_yaml(state.topology())).nodes["k80"] == state.results["k80"]


# --- nothing moved -------------------------------------------------------------------------------


def holders(state: ClusterState, name: str) -> dict[str, list[tuple[int, int | None]]]:
    """pod -> the (GPU, GPU instance id or None for the whole GPU)s it holds."""
    result = state.results[name]
    assert isinstance(result, NodeTopology)
    found: dict[str, list[tuple[int, int | None]]] = {}
    for g, gpu in enumerate(result.gpus):
        if gpu.status and gpu.status.allocated_by:
            found.setdefault(gpu.status.allocated_by.pod, []).append((g, None))
        for d in gpu.mig_devices or ():
            if d.status and d.status.allocated_by:
                found.setdefault(d.status.allocated_by.pod, []).append((g, d.gpu_instance_id))
    return found


def test_a_whole_gpu_stays_with_its_pod_when_an_older_pod_ends() -> None:
    state = ClusterState()
    state.set_node(slim_node(whole_gpu_node("k80", count=4)))
    for i, name in enumerate(["a", "b", "c"]):
        state.set_pod(slim_pod(gpu_pod(name, "k80", 1, f"2026-01-0{i + 1}T00:00:00Z")))
    state.settle()
    assert holders(state, "k80") == {"a": [(0, None)], "b": [(1, None)], "c": [(2, None)]}
    state.delete_pod("ns/a")
    # A pod created "before" the others (clock skew, a restore) arrives late: it gets what is
    # free, and takes nothing from pods that already hold devices.
    state.set_pod(slim_pod(gpu_pod("early", "k80", 2, "2025-01-01T00:00:00Z")))
    state.settle()
    assert holders(state, "k80") == {"b": [(1, None)], "c": [(2, None)],
                                     "early": [(0, None), (3, None)]}  # fmt: skip


def test_a_mig_instance_stays_with_its_pod_when_an_older_pod_ends() -> None:
    node = static_node("s", "NVIDIA-A100-SXM4-40GB", 1, "all-1g.5gb")
    state = ClusterState()
    state.set_node(slim_node(node))
    one = {"c": {"nvidia.com/mig-1g.5gb": "1"}}
    for i, name in enumerate(["a", "b"]):
        state.set_pod(slim_pod(static_pod(name, "s", f"2026-01-0{i + 1}T00:00:00Z", one)))
    state.settle()
    before = holders(state, "s")
    state.delete_pod("team/a")
    state.settle()
    assert holders(state, "s") == {"b": before["b"]}


def test_a_restarted_updater_keeps_the_assignments_it_wrote() -> None:
    state = after_one_ended(
        3, [("a", 1, "2026-01-01T00:00:00Z"), ("b", 1, "2026-01-02T00:00:00Z")], ended="a"
    )
    written = load_yaml(dump_yaml(state.topology()))
    # A fresh process: it reads back what it wrote, then lists the cluster.
    fresh = ClusterState()
    fresh.remember(written.nodes)
    fresh.reset_nodes(map(slim_node, [whole_gpu_node("k80", count=3)]))
    fresh.reset_pods(map(slim_pod, [gpu_pod("b", "k80", 1, "2026-01-02T00:00:00Z")]))
    fresh.settle()
    assert holders(fresh, "k80") == {"b": [(1, None)]}
    # Without that memory, the pod would be placed afresh (on GPU 0): the memory is what keeps it.
    assert holders(ClusterState.of([whole_gpu_node("k80", 3)], [gpu_pod("b", "k80", 1, "x")]), "k80") == {"b": [(0, None)]}  # fmt: skip


def test_pod_age_is_compared_as_time_not_text() -> None:
    # As text, "…T10:00:00+05:00" (05:00 UTC) sorts after "…T06:00:00Z".
    pods = [gpu_pod("later", "k80", 1, "2026-01-01T06:00:00Z"),
            gpu_pod("earlier", "k80", 1, "2026-01-01T10:00:00+05:00")]  # fmt: skip
    state = ClusterState.of([whole_gpu_node("k80", count=1)], pods)
    assert holders(state, "k80") == {"earlier": [(0, None)]}
    assert [str(w) for w in state.node_warnings("k80")] == [
        "pod ns/later: spec.containers[0].resources.limits[nvidia.com/gpu]: asks for 1 GPUs, "
        "node k80 has 0 free"
    ]


def test_an_overflowing_override_keeps_the_allocation() -> None:
    pod = gpu_pod("p", "k80", 1, "2026-01-01T00:00:00Z")
    pod["metadata"]["annotations"] = {"run.ai/simulated-fb-used": "1e400%",
                                      "run.ai/simulated-gpu-utilization": "9" * 5000}  # fmt: skip
    state = ClusterState.of([whole_gpu_node("k80", count=1)], [pod])
    assert holders(state, "k80") == {"p": [(0, None)]}
    assert len(state.node_warnings("k80")) == 2


def test_topology_error_is_one_bounded_line() -> None:
    e = TopologyError("pod a\nb", "x", "got " + repr("y\r\n" * 1000) + "\x1b[2J")
    assert "\n" not in str(e) and "\r" not in str(e) and "\x1b" not in str(e)
    assert str(e).startswith("pod a\\nb: x: got ") and len(str(e)) < 1000
    assert Topology().invalid == {}


def test_keys_longer_than_yaml_allows_implicitly_are_written_and_read_back() -> None:
    # YAML's implicit keys stop at 1024 characters; an unvalidated pod uid or node name may not.
    name, uid = "n" * 3000, "[" * 5000
    pod = gpu_pod("p", name, 1, "2026-01-01T00:00:00Z")
    pod["metadata"]["uid"] = uid
    state = ClusterState.of([whole_gpu_node(name)], [pod])
    text = dump_yaml(state.topology())
    assert load_yaml(text) == state.topology()
    assert list(load_yaml(text).nodes[name].gpus[0].status.pod_gpu_usage_status) == [uid]  # type: ignore[union-attr]
    assert tree.dump({"k" * 2000: {"v": 1}, "short": 2}) == (
        f"? {'k' * 2000}\n:\n  v: 1\nshort: 2\n"
    )
    assert yaml.safe_load(tree.dump({"k" * 2000: {"v": 1}})) == {"k" * 2000: {"v": 1}}


def test_an_older_pod_that_lost_devices_takes_none_from_a_younger_one() -> None:
    state = ClusterState()
    state.set_node(slim_node(whole_gpu_node("k80", count=6)))
    for name, day, gpus in (("f1", "01", 1), ("f2", "02", 2), ("a", "03", 2)):
        state.set_pod(slim_pod(gpu_pod(name, "k80", gpus, f"2026-01-{day}T00:00:00Z")))
    state.settle()
    state.delete_pod("ns/f1")
    state.set_pod(slim_pod(gpu_pod("b", "k80", 1, "2026-01-04T00:00:00Z")))
    state.settle()
    state.delete_pod("ns/f2")
    state.settle()
    assert holders(state, "k80") == {"a": [(3, None), (4, None)], "b": [(0, None)]}
    # The node shrinks to 4 GPUs: a keeps GPU 3 and needs one more. It takes a free one, never
    # b's (b stays on GPU 0).
    state.set_node(slim_node(whole_gpu_node("k80", count=4)))
    state.settle()
    assert holders(state, "k80") == {"a": [(1, None), (3, None)], "b": [(0, None)]}


def test_a_pod_that_kept_some_devices_places_before_an_older_newcomer() -> None:
    state = after_one_ended(
        3, [("x", 1, "2026-01-01T00:00:00Z"), ("b", 2, "2026-01-03T00:00:00Z")], ended="x"
    )
    assert holders(state, "k80") == {"b": [(1, None), (2, None)]}
    # At once: the node shrinks (b loses GPU 2) and a pod created before b is bound to it.
    # b, which runs, places first: it keeps GPU 1 and takes GPU 0; the newcomer waits.
    state.set_node(slim_node(whole_gpu_node("k80", count=2)))
    state.set_pod(slim_pod(gpu_pod("early", "k80", 1, "2026-01-02T00:00:00Z")))
    state.settle()
    assert holders(state, "k80") == {"b": [(0, None), (1, None)]}
    assert [str(w) for w in state.node_warnings("k80")] == [
        "pod ns/early: spec.containers[0].resources.limits[nvidia.com/gpu]: asks for 1 GPUs, "
        "node k80 has 0 free"
    ]


def test_nesting_is_counted_across_closed_brackets() -> None:
    # Deep after some brackets closed is still deep: only what is open counts.
    assert flow_depth_exceeds("[" * 600 + "]" + "[" * 600, limit=1000)
    assert not flow_depth_exceeds("[" * 600 + "]" * 600 + "[" * 600, limit=1000)
    assert not flow_depth_exceeds("[" * 1000, limit=1000) and flow_depth_exceeds(
        "[" * 1001, limit=1000
    )
