"""Reconcile: Nodes and Pods in, topology out; one bad object never takes the others with it."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import yaml
from freezegun import freeze_time

from exporter import dcgm
from status_updater.devices import build_node, gpu_uuid
from status_updater.objects import pod_key, slim_node, slim_pod
from status_updater.state import ClusterState, reconcile
from tests.support import oracle
from tests.support.base import SAMPLES
from topology.model import AllocatedBy, NodeTopology, Topology, dump_yaml

REAL_NODE: dict[str, Any] = yaml.safe_load(
    (SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text()
)
NAME = "qa-mig-worker-gpu-a100"


def mig_pod(name: str, position: int, *, phase: str = "Running", gpuindex: object = 0, profile: str = "1g.5gb",
            annotations: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    device = {"name": f"nvidia.com/mig-{profile}", "position": position, "gpuindex": gpuindex}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                     "annotations": {"runai-mig-device": json.dumps(device), **(annotations or {})}},
        "spec": {"nodeName": NAME, "containers": [{"name": "main"}, {"name": "sidecar"}]},
        "status": {"phase": phase},
    }  # fmt: skip


def whole_gpu_node(name: str, count: int = 2, product: str = "Tesla-K80") -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count), "nvidia.com/gpu.memory": "11441"}}}  # fmt: skip


def gpu_pod(name: str, node: str, gpus: int, created: str) -> dict[str, Any]:
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Running"}}  # fmt: skip


def after_one_ended(count: int, pods: list[tuple[str, int, str]], ended: str) -> ClusterState:
    """Node k80 of `count` whole GPUs once `pods` (name, GPUs, created) were placed and then the
    pod named `ended` ended: the others hold what they were given, whatever a fresh placement
    would give them now."""
    state = ClusterState()
    state.set_node(slim_node(whole_gpu_node("k80", count=count)))
    for name, gpus, created in pods:
        state.set_pod(slim_pod(gpu_pod(name, "k80", gpus, created)))
    state.settle()
    state.delete_pod(f"ns/{ended}")
    state.settle()
    return state


def devices(topology: Topology, node: str = NAME, gpu: int = 0) -> dict[int, Any]:
    return {d.position: d for d in topology.nodes[node].gpus[gpu].mig_devices or ()}


def test_real_node_gives_three_named_instances() -> None:
    topology, warnings = reconcile([REAL_NODE], [])
    assert warnings == []
    node = topology.nodes[NAME]
    assert (node.gpu_count, node.gpu_memory, node.gpu_product) == (
        1,
        40960,
        "NVIDIA-A100-SXM4-40GB",
    )
    assert node.is_dynamic_mig_enabled and topology.mig_strategy == "mixed"
    got = {p: (d.name, d.gpu_instance_id, d.id) for p, d in devices(topology).items()}
    assert got == {
        0: ("2g.10gb", 5, "MIG-298ef8da-e35f-5624-a935-1eb55fc58d0f"),
        4: ("1g.5gb", 7, "MIG-db7d5b53-1633-569e-a4ec-401c5d7e4a4d"),
        6: ("1g.5gb", 9, "MIG-a7096e9b-c577-5a19-b530-a69bc26aebe5"),
    }


def test_gpu_ids_are_stable_and_distinct() -> None:
    first, _ = reconcile([REAL_NODE], [])
    again, _ = reconcile([REAL_NODE], [])
    assert first.nodes[NAME].gpus[0].id == again.nodes[NAME].gpus[0].id == gpu_uuid(NAME, 0)
    assert gpu_uuid(NAME, 0) != gpu_uuid(NAME, 1) != gpu_uuid("other", 0)


def test_config_change_without_mapping_has_no_ids_until_mapped() -> None:
    node = json.loads(json.dumps(REAL_NODE))
    node["metadata"]["annotations"]["run.ai/mig.config"] = (
        "mig-configs: {selected: [{devices: [0], mig-enabled: true, mig-devices: {0: 3g.20gb, 4: 3g.20gb}}]}"
    )
    topology, warnings = reconcile([node], [])
    assert warnings == []
    assert {p: (d.name, d.id, d.gpu_instance_id) for p, d in devices(topology).items()} == {
        0: ("3g.20gb", None, 2),
        4: ("3g.20gb", None, 1),
    }
    mapping = {
        "0": [
            {"position": 0, "device_uuid": "MIG-new-0", "gpu_instance_id": 2},
            {"position": 4, "device_uuid": "MIG-new-4", "gpu_instance_id": 1},
        ]
    }
    node["metadata"]["annotations"]["run.ai/mig-mapping"] = base64.b64encode(
        json.dumps(mapping).encode()
    ).decode()
    topology, _ = reconcile([node], [])
    assert {p: d.id for p, d in devices(topology).items()} == {0: "MIG-new-0", 4: "MIG-new-4"}  # fmt: skip


def test_running_pod_takes_its_device_and_finished_pods_release_it() -> None:
    topology, warnings = reconcile([REAL_NODE], [mig_pod("a", 4, gpuindex="0"), mig_pod("done", 6, phase="Succeeded"),
                                                 mig_pod("failed", 0, phase="Failed", profile="2g.10gb")])  # fmt: skip
    assert warnings == []
    held = devices(topology)
    status = held[4].status
    assert status is not None and status.allocated_by is not None
    assert (
        status.allocated_by.namespace,
        status.allocated_by.pod,
        status.allocated_by.container,
    ) == ("team", "a", "main")
    assert list(status.pod_gpu_usage_status) == ["uid-a"]
    assert held[6].status is None and held[0].status is None


def test_usage_overrides_and_defaults() -> None:
    pods = [mig_pod("busy", 4, annotations={"run.ai/simulated-fb-used": "50%", "run.ai/simulated-gpu-utilization": "30-40"}),
            mig_pod("plain", 6)]  # fmt: skip
    topology, _ = reconcile([REAL_NODE], pods)
    busy = devices(topology)[4].status.pod_gpu_usage_status["uid-busy"]  # type: ignore[union-attr]
    plain = devices(topology)[6].status.pod_gpu_usage_status["uid-plain"]  # type: ignore[union-attr]
    assert (busy.fb_used, busy.utilization.min, busy.utilization.max) == (2432, 30, 40)
    assert (plain.fb_used, plain.utilization.min, plain.utilization.max) == (
        int(4864 * 0.9),
        80,
        100,
    )


def test_bad_pod_annotations_warn_and_keep_the_allocation() -> None:
    pod = mig_pod("odd", 4, annotations={"run.ai/simulated-fb-used": "lots"})
    topology, warnings = reconcile([REAL_NODE], [pod, mig_pod("lost", 2)])
    assert [str(w) for w in warnings] == [
        f"pod team/lost: metadata.annotations[runai-mig-device]: node {NAME} has no MIG device at GPU 0 position 2",
        "pod team/odd: metadata.annotations[run.ai/simulated-fb-used]: expected MiB or a percentage, got 'lots'",
    ]
    assert devices(topology)[4].status is not None


def test_one_bad_node_among_many_is_reported_and_the_rest_rendered() -> None:
    bad = json.loads(json.dumps(REAL_NODE))
    bad["metadata"]["name"] = "broken"
    bad["metadata"]["annotations"]["run.ai/mig.config"] = (
        "mig-configs: {selected: [{devices: [0], mig-enabled: true, mig-devices: {0: 9g.99gb}}]}"
    )
    topology, warnings = reconcile([bad, REAL_NODE, whole_gpu_node("k80")], [])
    assert sorted(topology.nodes) == ["k80", NAME]
    assert [str(w) for w in warnings] == [
        "node broken: gpus[0].mig-devices[0].name: unknown profile '9g.99gb' for A100-40GB "
        "(1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"
    ]
    # The live controller passes the last good topology: the bad node keeps its entry.
    before, _ = reconcile([REAL_NODE], [])
    renamed = Topology(before.mig_strategy, {"broken": before.nodes[NAME]})
    kept, _ = reconcile([bad], [], previous=renamed)
    assert kept.nodes["broken"] == before.nodes[NAME]


def test_non_gpu_nodes_are_left_out() -> None:
    topology, warnings = reconcile(
        [{"kind": "Node", "metadata": {"name": "cpu", "labels": {}}}], []
    )
    assert topology.nodes == {} and warnings == [] and topology.mig_strategy == "none"


def test_whole_gpus_go_to_pods_oldest_first() -> None:
    pods = [gpu_pod("late", "k80", 1, "2024-01-02T00:00:00Z"), gpu_pod("early", "k80", 1, "2024-01-01T00:00:00Z"),
            gpu_pod("greedy", "k80", 2, "2024-01-03T00:00:00Z")]  # fmt: skip
    topology, warnings = reconcile([whole_gpu_node("k80")], pods)
    holders = [
        g.status.allocated_by.pod if g.status and g.status.allocated_by else None
        for g in topology.nodes["k80"].gpus
    ]
    assert holders == ["early", "late"]
    assert [str(w) for w in warnings] == [
        "pod ns/greedy: spec.containers[0].resources.limits[nvidia.com/gpu]: asks for 2 GPUs, node k80 has 0 free"
    ]


@freeze_time("2026-11-22 10:00:00")
def test_whole_gpu_series_follow_the_pod_and_the_clock() -> None:
    pod = gpu_pod("train", "k80", 1, "2024-01-01T00:00:00Z")
    pod["metadata"]["annotations"] = {
        "run.ai/simulated-gpu-utilization": "40-60",
        "run.ai/simulated-fb-used": "1000",
    }
    topology, _ = reconcile([whole_gpu_node("k80")], [pod])
    from time import time

    fams = {f.name: f for f in oracle.families(topology.nodes["k80"], dcgm.Options("h"), time())}
    (busy_util, idle_util) = [v for _, v in fams[dcgm.GPU_UTIL].samples]
    assert 40 <= busy_util <= 60 and idle_util == 0
    labels, used = fams[dcgm.FB_USED].samples[0]
    assert used == 1000 and dict(labels)["pod"] == "train" and dict(labels)["namespace"] == "ns"
    assert dict(labels)["container"] == "c" and dict(labels)["modelName"] == "Tesla-K80"
    assert [v for _, v in fams[dcgm.FB_FREE].samples] == [11441 - 1000, 11441]


def test_odd_values_in_annotations_are_one_line_warnings() -> None:
    pods = [
        mig_pod("minus", 4, gpuindex="--0"),
        mig_pod("huge", 6, annotations={"run.ai/simulated-fb-used": "inf%"}),
        mig_pod("ok", 0, profile="2g.10gb"),
    ]
    pods[1]["metadata"]["annotations"]["run.ai/simulated-fb-used"] = "1e400%"
    odd_node = json.loads(json.dumps(REAL_NODE))
    odd_node["metadata"]["name"] = "odd"
    odd_node["metadata"]["annotations"]["run.ai/mig.config"] = 5
    topology, warnings = reconcile([REAL_NODE, odd_node], pods)
    assert [str(w) for w in warnings] == [
        "node odd: metadata.annotations[run.ai/mig.config]: expected a string, got 5",
        "pod team/huge: metadata.annotations[run.ai/simulated-fb-used]: need 0% to 100%, got '1e400%'",
        "pod team/minus: metadata.annotations[runai-mig-device].gpuindex: expected an integer, got '--0'",
    ]
    held = devices(topology)
    assert held[0].status is not None and held[6].status is not None  # default usage, still held
    assert held[4].status is None


def test_pending_and_unknown_pods_keep_their_device() -> None:
    topology, _ = reconcile(
        [REAL_NODE],
        [mig_pod("starting", 4, phase="Pending"), mig_pod("lost-kubelet", 6, phase="Unknown")],
    )
    assert devices(topology)[4].status is not None and devices(topology)[6].status is not None


def test_pod_names_a_device_the_mapping_has_not_reached() -> None:
    node = json.loads(json.dumps(REAL_NODE))
    node["metadata"]["annotations"].pop("run.ai/mig-mapping")
    pods = [mig_pod("a", 4), mig_pod("b", 6)]
    for pod, gi in zip(pods, (7, 9), strict=True):
        device = json.loads(pod["metadata"]["annotations"]["runai-mig-device"])
        pod["metadata"]["annotations"]["runai-mig-device"] = json.dumps(
            {**device, "deviceUUID": "MIG-same", "gpuinstanceid": gi}
        )
    topology, warnings = reconcile([node], pods)
    assert devices(topology)[4].id == "MIG-same" and devices(topology)[4].gpu_instance_id == 7
    assert devices(topology)[6].id is None  # not a second device with the same id
    assert [str(w) for w in warnings] == [
        "pod team/b: metadata.annotations[runai-mig-device].deviceUUID: MIG-same is another device's id"
    ]


def test_single_strategy_counts_physical_gpus() -> None:
    node = yaml.safe_load((SAMPLES / "nodes" / "a100-80gb-single-strategy.yaml").read_text())
    topology, warnings = reconcile([node], [])
    single = topology.nodes["a100-80gb-single"]
    assert warnings == [] and topology.mig_strategy == "single"
    # GFD labels count 2 MIG devices; they sit on one A100 80GB.
    assert (single.gpu_count, single.gpu_product, single.gpu_memory) == (
        1,
        "NVIDIA-A100-80GB-PCIe",
        81920,
    )
    assert [(d.name, d.position) for d in single.gpus[0].mig_devices or ()] == [
        ("1g.10gb", 0),
        ("1g.10gb", 1),
    ]


def test_single_strategy_gpus_of_a_run_ai_node() -> None:
    """GFD counts MIG devices: the GPUs are those mig.config names, or with `devices: all`
    the count over the devices per GPU (never fewer than one)."""
    sample = yaml.safe_load((SAMPLES / "nodes" / "a100-80gb-single-strategy.yaml").read_text())
    config = sample["metadata"]["annotations"]["run.ai/mig.config"]
    named = json.loads(json.dumps(sample))
    named["metadata"]["name"] = "named"
    named["metadata"]["labels"]["nvidia.com/gpu.count"] = "3"
    named["metadata"]["annotations"]["run.ai/mig.config"] = config.replace(
        "devices: all", "devices: [0]"
    )
    four = json.loads(json.dumps(sample))
    four["metadata"]["name"] = "four"
    four["metadata"]["labels"]["nvidia.com/gpu.count"] = "4"
    # The GPUs are counted up to the highest one named, not by the entries: GPU 1 alone is two.
    second = json.loads(json.dumps(named))
    second["metadata"]["name"] = "second"
    second["metadata"]["annotations"]["run.ai/mig.config"] = config.replace(
        "devices: all", "devices: [1]"
    )
    topology, _ = reconcile([named, four, second], [])
    assert {n: node.gpu_count for n, node in topology.nodes.items()} == {
        "named": 1, "four": 2, "second": 2}  # fmt: skip
    assert [bool(g.mig_devices) for g in topology.nodes["second"].gpus] == [False, True]
    assert dump_yaml(topology).count("gpu-count: 2\n") == 2


def test_a_mapping_that_is_not_base64_json_names_its_node() -> None:
    bad = json.loads(json.dumps(REAL_NODE))
    bad["metadata"]["annotations"]["run.ai/mig-mapping"] = "%%%"
    topology, warnings = reconcile([bad], [])
    assert [str(w) for w in warnings] == [
        f"node {NAME}: metadata.annotations[run.ai/mig-mapping]: is not base64-encoded JSON: "
        "Only base64 data is allowed"
    ]
    assert NAME not in topology.nodes


def test_a_mapping_copied_to_another_node_is_a_bad_node() -> None:
    twin = json.loads(json.dumps(REAL_NODE))
    twin["metadata"]["name"] = "twin"
    topology, warnings = reconcile([REAL_NODE, twin], [])
    assert NAME in topology.nodes and "twin" not in topology.nodes
    assert str(warnings[0]).startswith(
        "node twin: gpus[0].mig-devices[0].id: duplicate id MIG-298ef8da"
    )


def advertising_node(name: str, product: str, count: int, status: dict[str, Any]) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)}
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}, "status": status}


def test_a_node_that_only_advertises_mig_resources_gets_those_instances() -> None:
    """A simulated static-MIG node without nvidia.com/mig.config (what a simulator that only
    advertises the resources makes): its instances, spread evenly over its GPUs, placed as the
    driver places them; the pods requesting them are labelled; too many is one line."""
    mixed = advertising_node("mixed", "NVIDIA-H100-80GB-HBM3", 2, {"allocatable": {
        "cpu": "8", "nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "4", "nvidia.com/mig-3g.40gb": "2"}})  # fmt: skip
    single = advertising_node("single", "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb", 6, {})
    too_many = advertising_node("too-many", "NVIDIA-H100-80GB-HBM3", 1,
                                {"capacity": {"nvidia.com/mig-3g.40gb": "3"}})  # fmt: skip
    uneven = advertising_node("uneven", "NVIDIA-H100-80GB-HBM3", 2,
                              {"allocatable": {"nvidia.com/mig-1g.10gb": "3"}})  # fmt: skip
    pod = gpu_pod("server", "single", 1, "2026-01-01T00:00:00Z")  # single: nvidia.com/gpu
    topology, warnings = reconcile([mixed, single, too_many, uneven], [pod])
    # Not divisible: the lower GPU takes the remainder, none is lost.
    assert [len(g.mig_devices or ()) for g in topology.nodes["uneven"].gpus] == [2, 1]
    # H100 (halves not swapped): 3g at 4 (GI 2), then the 1g at the first free of 6, 4, 5, 0, 1.
    for gpu in (0, 1):
        assert {p: (d.name, d.gpu_instance_id) for p, d in devices(topology, "mixed", gpu).items()} == {
            0: ("1g.10gb", 7), 1: ("1g.10gb", 8), 4: ("3g.40gb", 2)}  # fmt: skip
    # Single strategy: gpu.count counts the 6 MIG devices, 3 fit a GPU: 2 GPUs of three 2g.10gb.
    assert [len(g.mig_devices or ()) for g in topology.nodes["single"].gpus] == [3, 3]
    held = [d for g in topology.nodes["single"].gpus for d in g.mig_devices or () if d.status]
    assert [(d.status.allocated_by, d.gpu_instance_id) for d in held if d.status] == [
        (
            AllocatedBy("ns", "server", "c", "uid-server"),
            3,
        )  # GPU 0's lowest GI (2g at 4: GI 3, halves swapped)
    ]
    assert topology.nodes["too-many"].gpus[0].mig_devices == ()
    assert [str(w) for w in warnings] == [
        "node too-many: status.allocatable: on GPU 0: 3 x 3g.40gb is more than the 2 that fit "
        "(no nvidia.com/mig.config)"
    ]


def test_what_an_advertising_node_counts_and_what_it_does_not() -> None:
    """Only positive whole counts of plain MIG resources make instances: a shared profile's
    count is instances times replicas, not a layout; zero or unreadable counts are nothing."""
    odd = advertising_node("odd", "NVIDIA-H100-80GB-HBM3", 1, {"allocatable": {
        "nvidia.com/mig-1g.10gb.shared": "8", "nvidia.com/gpu.shared": "4", "nvidia.com/mig-1g.10gb": "lots",
        "nvidia.com/mig-2g.20gb": "0", "nvidia.com/mig-3g.40gb": "1"}})  # fmt: skip
    zero = advertising_node("zero", "NVIDIA-H100-80GB-HBM3", 1,
                            {"allocatable": {"nvidia.com/mig-1g.10gb": "0"}})  # fmt: skip
    small = advertising_node("small", "NVIDIA-A100-SXM4-40GB-MIG-2g.10gb", 3, {})  # 3 fit one GPU
    topology, warnings = reconcile([odd, zero, small], [])
    assert warnings == []
    shapes = {
        name: [
            None if g.mig_devices is None else [d.name for d in g.mig_devices] for g in node.gpus
        ]
        for name, node in topology.nodes.items()
    }
    assert shapes == {"odd": [["3g.40gb"]], "zero": [None], "small": [["2g.10gb"] * 3]}


def dynamic_node_with_whole_gpus(name: str) -> dict[str, Any]:
    """A run:ai dynamic-MIG node of 3 A100s whose mig.config partitions GPU 0 only."""
    config = {"mig-configs": {"selected": [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"0": "2g.10gb", "4": "1g.5gb"}},
        {"devices": [1, 2], "mig-enabled": False}]}}  # fmt: skip
    mapping = {"0": {"0": f"MIG-{name}-0-0", "4": f"MIG-{name}-0-4"}}
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "3",
              "nvidia.com/mig.strategy": "mixed", "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true"}  # fmt: skip
    annotations = {"run.ai/mig.config": json.dumps(config),
                   "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode()}  # fmt: skip
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }


def test_whole_gpus_of_a_dynamic_mig_node_go_oldest_first_and_stay() -> None:
    """On a run:ai node, a pod without a MIG annotation asks for whole GPUs: those without MIG,
    the lowest index first, oldest pod first; it keeps its GPU when an older pod ends."""
    node = dynamic_node_with_whole_gpus("dyn")
    early, late = (
        gpu_pod("early", "dyn", 1, "2024-01-01T00:00:00Z"),
        gpu_pod("late", "dyn", 1, "2024-01-02T00:00:00Z"),
    )
    greedy = gpu_pod("greedy", "dyn", 2, "2024-01-03T00:00:00Z")  # fmt: skip
    late["metadata"]["annotations"] = {"run.ai/simulated-fb-used": "lots"}  # the default is used
    state = ClusterState.of([node], [late, greedy, early])

    def holders() -> list[str | None]:
        result = state.results["dyn"]
        assert isinstance(result, NodeTopology)
        return [g.status.allocated_by.pod if g.status and g.status.allocated_by else None
                for g in result.gpus]  # fmt: skip

    assert holders() == [None, "early", "late"]
    result = state.results["dyn"]
    assert isinstance(result, NodeTopology)
    status = result.gpus[1].status
    assert status is not None and status.allocated_by == AllocatedBy(
        "ns", "early", "c", "uid-early"
    )
    assert list(status.pod_gpu_usage_status) == ["uid-early"]
    assert [str(w) for w in state.all_warnings()] == [
        "pod ns/late: metadata.annotations[run.ai/simulated-fb-used]: expected MiB or a percentage, got 'lots'",
        "pod ns/greedy: spec.containers[].resources.limits[nvidia.com/gpu]: asks for 2 GPUs, node dyn has 0 free",
    ]
    state.delete_pod(pod_key(early))
    state.settle()
    assert holders() == [None, None, "late"]  # not moved to the lower GPU
    state.set_pod(slim_pod(gpu_pod("next", "dyn", 1, "2024-01-04T00:00:00Z")))
    state.settle()
    assert holders() == [None, "next", "late"]


def test_claims_on_a_run_ai_node_that_cannot_be_met_are_one_line_each() -> None:
    """Pods without a creation time go by namespace, then name; a second claim on a device, or
    one past the node's GPUs, is refused; a claim naming the wrong profile still holds it."""
    first, second = mig_pod("first", 4), mig_pod("second", 4)
    wrong, far = mig_pod("wrong", 6, profile="2g.10gb"), mig_pod("far", 0, gpuindex=1)
    z, a = mig_pod("z", 0, profile="2g.10gb"), mig_pod("a", 0, profile="2g.10gb")
    z["metadata"]["namespace"], a["metadata"]["namespace"] = "alpha", "beta"
    del z["spec"]["containers"]  # no container to name
    topology, warnings = reconcile([REAL_NODE], [second, wrong, far, a, z, first])
    assert {p: d.status.allocated_by for p, d in devices(topology).items() if d.status} == {
        0: AllocatedBy("alpha", "z", "", "uid-z"),
        4: AllocatedBy("team", "first", "main", "uid-first"),
        6: AllocatedBy("team", "wrong", "main", "uid-wrong"),
    }
    assert [str(w) for w in warnings] == [
        "pod beta/a: metadata.annotations[runai-mig-device]: device already held by pod alpha/z",
        f"pod team/far: metadata.annotations[runai-mig-device]: node {NAME} has no MIG device at GPU 1 position 0",
        "pod team/second: metadata.annotations[runai-mig-device]: device already held by pod team/first",
        "pod team/wrong: metadata.annotations[runai-mig-device].name: asks for 2g.10gb, device is 1g.5gb",
    ]


def test_a_run_ai_node_s_gpus_outside_its_layout_are_mig_enabled_and_empty() -> None:
    """run:ai turns MIG on for every GPU of a dynamic-MIG node; its mig.config lists only the
    GPUs that hold instances, and a node may have none yet."""
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "2",
              "nvidia.com/mig.strategy": "mixed", "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true"}  # fmt: skip
    config = {"mig-configs": {"selected": [{"devices": [0], "mig-enabled": True,
                                            "mig-devices": {"0": "3g.20gb"}}]}}  # fmt: skip
    bare = {"kind": "Node", "metadata": {"name": "n", "labels": labels}}
    laid = {"kind": "Node", "metadata": {"name": "n", "labels": labels,
                                         "annotations": {"run.ai/mig.config": json.dumps(config)}}}  # fmt: skip
    assert [g.mig_devices for g in build_node(bare).gpus] == [(), ()]
    first, second = build_node(laid).gpus
    assert [d.name for d in first.mig_devices or ()] == ["3g.20gb"] and second.mig_devices == ()


@pytest.mark.parametrize("value", [0, {}, [], False, 5, {"gpuindex": 0}])
def test_a_mig_device_annotation_that_is_no_string_is_said_even_when_empty(value: object) -> None:
    """An empty annotation is as if none were there (whole GPUs); any value that is not a
    string, falsy ones too, is the pod's error naming the field, never a silent whole GPU."""
    blank, odd = (gpu_pod(n, "dyn", 1, "2024-01-01T00:00:00Z") for n in ("blank", "odd"))
    blank["metadata"]["annotations"] = {"runai-mig-device": ""}
    odd["metadata"]["annotations"] = {"runai-mig-device": value}
    state = ClusterState.of([dynamic_node_with_whole_gpus("dyn")], [blank, odd])
    result = state.results["dyn"]
    assert isinstance(result, NodeTopology)
    assert [g.status.allocated_by.pod if g.status and g.status.allocated_by else None
            for g in result.gpus] == [None, "blank", None]  # fmt: skip
    assert [str(w) for w in state.all_warnings()] == [
        f"pod ns/odd: metadata.annotations[runai-mig-device]: expected a string, got {value!r}"
    ]


def test_a_pod_placement_breaks_on_is_one_warning_and_the_others_are_placed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last guard: a bug a pod's odd shape sets off never stops the other pods."""
    from status_updater import placement
    from status_updater.placement.board import Board, Policy
    from status_updater.reconcile import reconcile_node
    from topology.errors import TopologyError

    def breaks(board: Board, pod: dict[str, Any], warnings: list[TopologyError]) -> None:
        raise RuntimeError("boom")

    odd = Policy("breaks", lambda board, pod: pod["metadata"]["name"] == "odd", breaks)
    monkeypatch.setattr(placement, "POLICIES", (odd, *placement.POLICIES))
    pods = [slim_pod(gpu_pod(n, "k80", 1, "2026-01-01T00:00:00Z")) for n in ("odd", "fine")]
    result, warnings = reconcile_node(slim_node(whole_gpu_node("k80")), pods)
    assert [str(w) for w in warnings] == ["pod ns/odd: ?: cannot be read: RuntimeError: boom"]
    held = [g.status.allocated_by.pod for g in result.gpus if g.status and g.status.allocated_by]
    assert held == ["fine"]
