"""DRA claims in the live state: pods and ResourceClaims come from two watches, in any order, and
the topology is the same as if they had all been read at once; a claim's change re-places only
the nodes of the pods using it."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any
from unittest.mock import ANY

import pytest
import yaml

from status_updater.claims import read_claim
from status_updater.devices import build_node
from status_updater.dra import DraOptions, node_slimmer
from status_updater.objects import claim_refs, slim_pod
from status_updater.resourceslices import node_slices
from status_updater.state import ClusterState
from tests.status_updater.test_resourceslices import gpu_node
from tests.support.base import SAMPLES
from topology.catalog import MODELS
from topology.errors import TopologyError
from topology.model import NodeTopology

DRA = SAMPLES / "dra"
NODES = list(yaml.safe_load_all((DRA / "nodes.yaml").read_text()))
PODS = list(yaml.safe_load_all((DRA / "pods.yaml").read_text()))
CLAIMS = list(yaml.safe_load_all((DRA / "claims.yaml").read_text()))
# The sample nodes as the updater's Node informer keeps them under --dra-dynamic-mig.
SLIM = node_slimmer(DraOptions("", dynamic_mig=True))


def by_name(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return copy.deepcopy(next(o for o in objects if o["metadata"]["name"] == name))


def claimed(state: ClusterState, node: str) -> dict[str, list[tuple[str, str, int | None]]]:
    """device -> (pod, container, GI id of the instance) for each holder on the node."""
    result = state.results[node]
    assert isinstance(result, NodeTopology)
    found: dict[str, list[tuple[str, str, int | None]]] = {}
    for gpu in result.gpus:
        for c in gpu.status.dra_claims if gpu.status else ():
            found.setdefault(c.device, []).append((c.holder.pod, c.holder.container, None))
        for dev in gpu.mig_devices or ():
            for c in dev.status.dra_claims if dev.status else ():
                found.setdefault(c.device, []).append(
                    (c.holder.pod, c.holder.container, dev.gpu_instance_id)
                )
    return found


def h100_instances(state: ClusterState) -> list[tuple[str, int]]:
    result = state.results["dra-h100"]
    assert isinstance(result, NodeTopology)
    return [(d.name, d.position) for d in result.gpus[0].mig_devices or ()]


Event = Callable[[ClusterState], None]
EVENTS: dict[str, Event] = {
    "nodes": lambda s: s.reset_nodes(map(SLIM, NODES)),
    "infer-small": lambda s: s.set_pod(slim_pod(by_name(PODS, "infer-small"))),
    "dynamic-infer": lambda s: s.set_pod(slim_pod(by_name(PODS, "dynamic-infer"))),
    "small-claim": lambda s: s.set_claim(read_claim(by_name(CLAIMS, "infer-small-mig-7xq2k"))),
    "half-claim": lambda s: s.set_claim(read_claim(by_name(CLAIMS, "half-h100"))),
}


@pytest.mark.parametrize("order", list(itertools.permutations(EVENTS)), ids="-".join)
def test_pods_and_claims_in_any_order_give_what_reading_them_at_once_gives(
    order: tuple[str, ...],
) -> None:
    state = ClusterState()
    for i, name in enumerate(order):
        EVENTS[name](state)
        if i % 2:
            state.settle()  # some events settle alone, some together
    state.settle()
    pods = [by_name(PODS, "infer-small"), by_name(PODS, "dynamic-infer")]
    at_once = ClusterState.of(NODES, pods, claims=CLAIMS, slim=SLIM)
    assert state.results == at_once.results
    assert claimed(state, "dra-h100") == {"gpu-0-mig-3g40gb-9-4": [("dynamic-infer", "ctr0", 2)]}
    assert claimed(state, "dra-a100") == {
        "gpu-0-mig-1g5gb-19-2": [("infer-small", "ctr0", claimed(at_once, "dra-a100")[
            "gpu-0-mig-1g5gb-19-2"][0][2])]}  # fmt: skip


def settled(*claims: str) -> ClusterState:
    state = ClusterState()
    state.reset_nodes(map(SLIM, NODES))
    state.reset_pods(map(slim_pod, PODS))
    state.reset_claims(read_claim(by_name(CLAIMS, c)) for c in claims)
    state.settle()
    return state


def test_a_released_claim_takes_its_dynamic_instance_with_it_and_touches_only_its_node() -> None:
    state = settled("half-h100", "infer-small-mig-7xq2k")
    assert h100_instances(state) == [("3g.40gb", 4)]
    released = by_name(CLAIMS, "half-h100")
    del released["status"]  # deallocated: the driver destroys the instance at unprepare
    state.set_claim(read_claim(released))
    assert state.settle() == {"dra-h100"}
    assert state.reconsidered == {"dra-h100"}
    assert h100_instances(state) == []
    assert claimed(state, "dra-a100")  # the other node's claim is as it was


def test_a_deleted_claim_and_a_claim_moved_to_another_device_are_followed() -> None:
    state = settled("half-h100")
    moved = by_name(CLAIMS, "half-h100")
    moved["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0-mig-3g40gb-9-0"
    state.set_claim(read_claim(moved))
    state.settle()
    assert h100_instances(state) == [("3g.40gb", 0)]
    state.delete_claim(("gpu-test", "half-h100"))
    state.settle()
    assert h100_instances(state) == []


def test_a_claim_not_yet_reserved_for_the_pod_gives_it_nothing() -> None:
    pending = by_name(CLAIMS, "half-h100")
    del pending["status"]["reservedFor"]  # allocated, the pod not admitted yet
    state = settled()
    state.set_claim(read_claim(pending))
    state.settle()
    assert h100_instances(state) == []


def test_a_pod_gone_no_longer_follows_its_claim() -> None:
    state = settled("half-h100")
    state.delete_pod("gpu-test/dynamic-infer")
    state.settle()
    assert h100_instances(state) == []
    state.delete_claim(("gpu-test", "half-h100"))
    assert state.settle() == set()
    assert state.reconsidered == set()  # nothing used it any more: no node computed again


def test_a_claim_of_another_driver_or_namespace_is_not_the_pods() -> None:
    other = by_name(CLAIMS, "half-h100")
    other["status"]["allocation"]["devices"]["results"][0]["driver"] = "nic.example.com"
    elsewhere = by_name(CLAIMS, "half-h100")
    elsewhere["metadata"]["namespace"] = "team-b"
    state = settled()
    state.reset_claims([read_claim(other), read_claim(elsewhere)])
    state.settle()
    assert h100_instances(state) == []


def test_a_pod_names_the_claims_of_its_entries_and_templates() -> None:
    pod = by_name(PODS, "train-pair")
    pod["spec"]["containers"].append(
        {"name": "side", "resources": {"claims": [{"name": "own", "request": "gpu"}]}}
    )
    pod["spec"]["resourceClaims"].append({"name": "own", "resourceClaimName": "shared-gpu"})
    pod["spec"]["resourceClaims"].append({"name": "unmade", "resourceClaimTemplateName": "t"})
    assert claim_refs(pod) == [
        {"container": "ctr0", "claim": "train-pair-migs-p4m9t", "request": ""},
        {"container": "side", "claim": "shared-gpu", "request": "gpu"},
    ]


@pytest.mark.parametrize("name", ["a-first", "z-last"])
def test_a_claim_allocated_later_over_an_instance_never_takes_it_from_its_holder(
    name: str,
) -> None:
    """Whatever the newcomer's name (pods of one second are placed by name) and whether it is
    older: the pod holding the made instance keeps it, and the overlapping claim holds nothing
    until it goes."""
    state = settled("half-h100")
    assert h100_instances(state) == [("3g.40gb", 4)]
    pod = by_name(PODS, "dynamic-infer")
    pod["metadata"].update(name=name, uid=f"uid-{name}", creationTimestamp="2020-01-01T00:00:00Z")
    pod["spec"]["resourceClaims"][0]["resourceClaimName"] = "whole-h100"
    claim = by_name(CLAIMS, "half-h100")
    claim["metadata"]["name"] = "whole-h100"
    claim["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0-mig-7g80gb-0-0"
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": name, "uid": f"uid-{name}"}]
    state.set_pod(slim_pod(pod))
    state.set_claim(read_claim(claim))
    state.settle()
    assert claimed(state, "dra-h100") == {"gpu-0-mig-3g40gb-9-4": [("dynamic-infer", "ctr0", 2)]}
    assert any("overlaps instance 3g.40gb@4" in str(w) for w in state.node_warnings("dra-h100"))
    state.delete_claim(("gpu-test", "half-h100"))
    state.settle()
    assert claimed(state, "dra-h100") == {"gpu-0-mig-7g80gb-0-0": [(name, "ctr0", 0)]}


def offered() -> list[Any]:
    """(model, mode, device name) of every device the slices offer on a one-GPU node: MIG off,
    static MIG as mig-parted's all-balanced layout builds it, and every partition."""
    cases = []
    for model in MODELS:
        for layout, dynamic in ((None, False), ("all-balanced", False), ("all-enabled", True),
                                ("all-disabled", True), ("all-balanced", True)):  # fmt: skip
            node = gpu_node("n", model.product_labels[0], 1, layout, dynamic)
            try:
                found = node_slices(node, build_node(node), dynamic=dynamic)
            except TopologyError:
                continue  # a layout the model has no profiles for
            mode = f"{layout or 'mig-off'}{'-dynamic' if dynamic else ''}"
            cases += [pytest.param(node, d["name"], id=f"{model.key}-{mode}-{d['name']}")
                      for s in found for d in s["spec"].get("devices", [])]  # fmt: skip
    return cases


@pytest.mark.parametrize(("node", "device"), offered())
def test_every_device_the_slices_offer_is_placed_when_a_claim_is_given_it(
    node: dict[str, Any], device: str
) -> None:
    """What the updater publishes, the scheduler may allocate: each device, claimed alone on the
    empty node, is held by the pod with no warning."""
    pod = by_name(PODS, "dynamic-infer")
    pod["spec"]["nodeName"] = "n"
    claim = by_name(CLAIMS, "half-h100")
    claim["status"]["allocation"]["devices"]["results"][0].update(pool="n", device=device)
    state = ClusterState()
    state.set_node(node)
    state.set_pod(slim_pod(pod))
    state.set_claim(read_claim(claim))
    state.settle()
    assert state.node_warnings("n") == []
    assert claimed(state, "n") == {device: [("dynamic-infer", "ctr0", ANY)]}


def test_a_hopper_gpu_handed_out_whole_turns_mig_off_and_is_never_also_partitioned() -> None:
    """Dynamic MIG offers an H100 with MIG on whole too: given whole, the GPU is shown with MIG
    off (the driver turns it off); a pod also given a partition of it holds nothing."""
    whole = by_name(CLAIMS, "half-h100")
    whole["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0"
    state = settled()
    state.set_claim(read_claim(whole))
    state.settle()
    result = state.results["dra-h100"]
    assert isinstance(result, NodeTopology)
    assert result.gpus[0].mig_devices is None
    assert claimed(state, "dra-h100") == {"gpu-0": [("dynamic-infer", "ctr0", None)]}
    both = copy.deepcopy(whole)
    both["status"]["allocation"]["devices"]["results"].append(
        {"request": "mig", "driver": "gpu.nvidia.com", "pool": "dra-h100",
         "device": "gpu-0-mig-1g10gb-19-0"})  # fmt: skip
    state.set_claim(read_claim(both))
    state.settle()
    assert claimed(state, "dra-h100") == {}
    assert [str(w) for w in state.node_warnings("dra-h100")] == [
        "pod gpu-test/dynamic-infer: claims[gpu-test/half-h100]: device gpu-0-mig-1g10gb-19-0: "
        "GPU 0 is handed out whole: not placed"
    ]


def extended_pod(status: dict[str, Any] | None) -> dict[str, Any]:
    """A pod asking for `nvidia.com/gpu: 1` on a DRA node, the scheduler's extended-resource claim
    named in its status (`status`, or not yet)."""
    return {"kind": "Pod",
            "metadata": {"name": "plain", "namespace": "ns", "uid": "uid-plain",
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n", "containers": [
                {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running", **({"extendedResourceClaimStatus": status}
                                              if status else {})}}  # fmt: skip


def test_a_gpu_limit_served_through_dra_holds_the_device_its_claim_was_allocated() -> None:
    """The DeviceClass gpu.nvidia.com names `nvidia.com/gpu` its extended resource: the scheduler
    allocates a claim for such a pod and maps the container to it. The pod holds that claim's GPU,
    not the first free one its limit would give it, and nothing before the claim is seen."""
    status = {"resourceClaimName": "plain-extended-resources-4xk2q",
              "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu",
                                   "requestName": "container-0-request-0"}]}  # fmt: skip
    claim = by_name(CLAIMS, "half-h100")
    claim["metadata"].update(name="plain-extended-resources-4xk2q", namespace="ns")
    claim["status"]["allocation"]["devices"]["results"] = [
        {"request": "container-0-request-0", "driver": "gpu.nvidia.com", "pool": "n",
         "device": "gpu-1"}]  # fmt: skip
    claim["status"]["reservedFor"] = [{"resource": "pods", "name": "plain", "uid": "uid-plain"}]
    state = ClusterState()
    state.set_node(gpu_node("n", "NVIDIA-A100-SXM4-40GB", 2))
    state.set_pod(slim_pod(extended_pod(status)))
    state.settle()
    assert claimed(state, "n") == {}  # the claim is not seen yet: not the first free GPU either
    result = state.results["n"]
    assert isinstance(result, NodeTopology)
    assert [g.status for g in result.gpus] == [None, None]
    state.set_claim(read_claim(claim))
    state.settle()
    assert claimed(state, "n") == {"gpu-1": [("plain", "main", None)]}
    assert state.node_warnings("n") == []
    # Without DRA (no such status), the same pod is the device plugin's: its limit places it.
    plain = ClusterState()
    plain.set_node(gpu_node("n", "NVIDIA-A100-SXM4-40GB", 2))
    plain.set_pod(slim_pod(extended_pod(None)))
    plain.settle()
    held = plain.results["n"]
    assert isinstance(held, NodeTopology) and held.gpus[0].status is not None


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_partition_is_made_only_under_dynamic_mig_and_refused_once_otherwise(
    dynamic: bool,
) -> None:
    """Without DynamicMIG the driver publishes no partition: a claim given one (a hand-written
    allocation) holds nothing, and the warning names the claim."""
    node = gpu_node("n", "NVIDIA-H100-80GB-HBM3", 1, "all-enabled", dynamic)
    pod = by_name(PODS, "dynamic-infer")
    pod["spec"]["nodeName"] = "n"
    claim = by_name(CLAIMS, "half-h100")
    claim["status"]["allocation"]["devices"]["results"][0].update(pool="n")
    state = ClusterState()
    state.set_node(node)
    state.set_pod(slim_pod(pod))
    state.set_claim(read_claim(claim))
    state.settle()
    if dynamic:
        assert state.node_warnings("n") == []
        assert claimed(state, "n") == {"gpu-0-mig-3g40gb-9-4": [("dynamic-infer", "ctr0", 2)]}
        return
    assert claimed(state, "n") == {}
    assert [str(w) for w in state.node_warnings("n")] == [
        "pod gpu-test/dynamic-infer: claims[gpu-test/half-h100]: device gpu-0-mig-3g40gb-9-4 is "
        "no MIG device of GPU 0, and partitions are made only under the DRA driver's DynamicMIG "
        "(--dra-dynamic-mig): not placed"
    ]


@pytest.mark.parametrize("product", ["NVIDIA-A100-SXM4-40GB", "NVIDIA-H100-80GB-HBM3"])
def test_dynamic_mig_destroys_the_layouts_instances_and_keeps_only_its_claims(
    product: str,
) -> None:
    """DestroyUnknownMIGDevices: a mig-manager layout does not survive the driver's start; MIG
    stays on where it cannot toggle (A100) and goes off where it can (H100). Static MIG keeps
    the layout."""
    static = build_node(gpu_node("n", product, 2, "all-balanced"))
    assert all(g.mig_devices for g in static.gpus)
    dynamic = build_node(gpu_node("n", product, 2, "all-balanced", dynamic=True))
    toggles = "H100" in product
    assert [g.mig_devices for g in dynamic.gpus] == [None if toggles else ()] * 2


def one_pod_claims(node: str, *results: tuple[str, str]) -> ClusterState:
    """dynamic-infer on `node`, its claim allocated (pool, device) for each of `results`."""
    pod = by_name(PODS, "dynamic-infer")
    pod["spec"]["nodeName"] = node
    claim = by_name(CLAIMS, "half-h100")
    claim["status"]["allocation"]["devices"]["results"] = [
        {"request": f"r{i}", "driver": "gpu.nvidia.com", "pool": pool, "device": device}
        for i, (pool, device) in enumerate(results)
    ]
    state = ClusterState()
    for name in ("n", "other"):
        state.set_node(gpu_node(name, "NVIDIA-H100-80GB-HBM3", 1, "all-enabled", dynamic=True))
    state.set_pod(slim_pod(pod))
    state.set_claim(read_claim(claim))
    state.settle()
    return state


@pytest.mark.parametrize(
    "inner", ["gpu-0-mig-1g10gb-19-5", "gpu-0-mig-1g10gb-19-6", "gpu-0-mig-2g20gb-14-4"]
)
def test_a_partition_inside_one_made_for_the_same_pod_is_an_overlap(inner: str) -> None:
    """Both partitions are made for one pod: the second lies inside the first's memory slices
    (3g at 4 holds 4 to 7), so the pod holds nothing."""
    state = one_pod_claims("n", ("n", "gpu-0-mig-3g40gb-9-4"), ("n", inner))
    assert claimed(state, "n") == {}
    (warning,) = state.node_warnings("n")
    assert f"device {inner} overlaps instance 3g.40gb@4: not placed" in str(warning)
    beside = one_pod_claims("n", ("n", "gpu-0-mig-3g40gb-9-4"), ("n", "gpu-0-mig-1g10gb-19-3"))
    assert set(claimed(beside, "n")) == {"gpu-0-mig-3g40gb-9-4", "gpu-0-mig-1g10gb-19-3"}


def test_a_claim_of_another_nodes_pool_is_never_placed_on_the_pods_node() -> None:
    """The device is on `other` (its pool): the pod on `n` holds nothing of `n`'s."""
    state = one_pod_claims("n", ("other", "gpu-0-mig-3g40gb-9-4"))
    assert claimed(state, "n") == {} and claimed(state, "other") == {}
    result = state.results["n"]
    assert isinstance(result, NodeTopology) and result.gpus[0].mig_devices is None
