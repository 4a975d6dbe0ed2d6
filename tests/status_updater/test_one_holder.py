"""One device, one holder, whatever the mix of sources: pods of the device plugin, run:ai's
annotations and DRA claims on one node (sharing's replicas aside, tests/status_updater/
test_sharing.py).

The rule (docs/dra.md#claims): a device a claim was allocated is the claim's, as the scheduler
made it; a pod of the device plugin or run:ai that held it moves to a free device of its kind, or
holds nothing; a second claim on a device holds nothing while the first holds it. Each loser is
one warning naming it, the device and the claim, said once (in the pass it loses).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from status_updater.claims import read_claim
from status_updater.dra import DraOptions, node_slimmer
from status_updater.objects import slim_pod
from status_updater.state import ClusterState, NodeResult
from tests.status_updater.test_claims import CLAIMS, PODS, by_name
from tests.status_updater.test_reconcile import dynamic_node_with_whole_gpus
from tests.status_updater.test_resourceslices import devices, gpu_node, slices
from tests.support.base import examples
from topology import dra
from topology.catalog import model_for_product
from topology.model import DeviceStatus, NodeTopology

SLIM = node_slimmer(DraOptions(""))  # every GPU node is DRA's, static MIG

# node kind -> the node, and what its device-plugin pods ask for (a MIG profile, or whole GPUs)
NODES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "whole": (gpu_node("n", "NVIDIA-A100-SXM4-40GB", 3), ["nvidia.com/gpu"]),
    "static": (gpu_node("n", "NVIDIA-A100-SXM4-40GB", 2, "all-balanced"),
               ["nvidia.com/mig-1g.5gb", "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb"]),
    # time-slicing: pods share a GPU by replicas (two each), never with a claim
    "time-sliced": (gpu_node("n", "NVIDIA-A100-SXM4-40GB", 3, **{
        "nvidia.com/gpu.replicas": "2", "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
        ["nvidia.com/gpu"]),
    # run:ai: GPU 0 has 2g.10gb at 0 and 1g.5gb at 4 (a pod's annotation names one), 1 and 2 whole
    "runai": (SLIM({**dynamic_node_with_whole_gpus("n"), "kind": "Node"}),
              ["nvidia.com/gpu", "runai:0", "runai:4"]),
}  # fmt: skip


def day(n: int) -> str:
    return f"2026-01-{n + 1:02d}T00:00:00Z"


def plugin_pod(i: int, asks: str, count: int, age: int) -> dict[str, Any]:
    """`plugin-<i>`: a device-plugin pod asking `count` of `asks`, or run:ai's pod whose
    annotation names GPU 0's instance at a position (`runai:<position>`)."""
    pod: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"name": f"plugin-{i}", "namespace": "ns", "uid": f"uid-plugin-{i}",
                     "creationTimestamp": day(age)},
        "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    if asks.startswith("runai:"):
        position = int(asks.split(":")[1])
        name = "nvidia.com/mig-2g.10gb" if position == 0 else "nvidia.com/mig-1g.5gb"
        device = {"name": name, "position": position, "gpuindex": 0}
        pod["metadata"]["annotations"] = {"runai-mig-device": json.dumps(device)}
    else:
        pod["spec"]["containers"][0]["resources"] = {"limits": {asks: str(count)}}
    return pod


def claim_objects(i: int, device: str, age: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """`claimant-<i>` and its claim `claim-<i>`, allocated `device` of node n."""
    pod = by_name(PODS, "dynamic-infer")
    pod["metadata"].update(
        name=f"claimant-{i}", uid=f"uid-claimant-{i}", creationTimestamp=day(age)
    )
    pod["spec"]["nodeName"] = "n"
    pod["spec"]["resourceClaims"][0]["resourceClaimName"] = f"claim-{i}"
    claim = by_name(CLAIMS, "half-h100")
    claim["metadata"]["name"] = f"claim-{i}"
    claim["status"]["allocation"]["devices"]["results"][0].update(pool="n", device=device)
    claim["status"]["reservedFor"] = [
        {"resource": "pods", "name": f"claimant-{i}", "uid": f"uid-claimant-{i}"}
    ]
    return pod, claim


def statuses(result: NodeResult | None) -> dict[str, DeviceStatus | None]:
    """Each device by the driver's name for it (`gpu-1`, `gpu-0-mig-1g5gb-19-4`)."""
    assert isinstance(result, NodeTopology)
    model = model_for_product(result.gpu_product)
    assert model is not None
    found: dict[str, DeviceStatus | None] = {}
    for g, gpu in enumerate(result.gpus):
        if gpu.mig_devices is None:
            found[dra.gpu_device(g)] = gpu.status
        for d in gpu.mig_devices or ():
            profile = model.profile(d.name)
            assert profile is not None
            found[dra.mig_device(g, profile, d.position)] = d.status
    return found


def pods_of(status: DeviceStatus | None) -> set[str]:
    if status is None:
        return set()
    return {u.removeprefix("uid-") for u in status.pod_gpu_usage_status}


def said(state: ClusterState) -> list[str]:
    return [str(w) for w in state.node_warnings("n")]


plugins = st.lists(st.tuples(st.integers(0, 2), st.integers(1, 2), st.integers(0, 9)), max_size=4)
claims = st.lists(st.tuples(st.integers(0, 99), st.integers(0, 9)), min_size=1, max_size=4)


@settings(max_examples=examples(120), deadline=None)
@given(
    kind=st.sampled_from(sorted(NODES)),
    plugin=plugins,
    claimed=claims,
    arrival=st.sampled_from(["plugin pods first", "claims first", "together"]),
)
# The older pod loses GPU 0, the younger GPU 1 and then does not fit either: GPU 2, which the
# younger held, is the older's, not left free.
@example(kind="whole", plugin=[(0, 1, 0), (0, 2, 1)], claimed=[(0, 5), (1, 5)],
         arrival="plugin pods first")  # fmt: skip
def test_one_device_one_holder_whatever_the_mix(
    kind: str,
    plugin: list[tuple[int, int, int]],
    claimed: list[tuple[int, int]],
    arrival: str,
) -> None:
    node, asks = NODES[kind]
    offered = sorted(devices(slices(node)))
    plugin_pods = [plugin_pod(i, asks[a % len(asks)], n, age) for i, (a, n, age) in
                   enumerate(plugin)]  # fmt: skip
    claim_pairs = [claim_objects(i, offered[pick % len(offered)], age)
                   for i, (pick, age) in enumerate(claimed)]  # fmt: skip
    state = ClusterState()
    state.set_node(node)
    if arrival == "claims first":
        for pod, claim in claim_pairs:
            state.set_pod(slim_pod(pod))
            state.set_claim(read_claim(claim))
        state.settle()
        for pod in plugin_pods:
            state.set_pod(slim_pod(pod))
    else:
        for pod in plugin_pods:
            state.set_pod(slim_pod(pod))
        if arrival == "plugin pods first":
            state.settle()
        for pod, claim in claim_pairs:
            state.set_pod(slim_pod(pod))
            state.set_claim(read_claim(claim))
    before = state.results.get("n")
    held_before = {d: pods_of(s) for d, s in statuses(before).items()} if before else {}
    state.settle()
    result = state.results["n"]
    found = statuses(result)
    warnings = said(state)

    # One holder per device: a claim's, or a pod's of the device plugin or run:ai.
    for name, status in found.items():
        if status is None:
            continue
        claims_on = {(c.claim_namespace, c.claim) for c in status.dra_claims}
        assert len(claims_on) <= 1, (name, status)
        if claims_on:
            assert status.allocated_by is None and not status.replicas, (name, status)
            assert all(p.startswith("claimant-") for p in pods_of(status)), (name, status)
        elif not status.replicas:
            assert len(pods_of(status)) == 1, (name, status)

    # The scheduler's allocation is authoritative: every device a claim names is held by a claim
    # naming it (the oldest claimant's); a claimant without its device is said once.
    naming: dict[str, list[int]] = {}
    for i, (_, claim) in enumerate(claim_pairs):
        naming.setdefault(
            claim["status"]["allocation"]["devices"]["results"][0]["device"], []
        ).append(i)
    for device, who in naming.items():
        status = found[device]
        assert status is not None and status.dra_claims, (device, found)
        (holder,) = pods_of(status)
        oldest = min(who, key=lambda i: (claimed[i][1], f"claimant-{i}"))
        assert holder == f"claimant-{oldest}", (device, holder, who)
        for i in who:
            if i != oldest:
                lines = [w for w in warnings if w.startswith(f"pod gpu-test/claimant-{i}:")]
                assert len(lines) == 1 and f"held by DRA claim gpu-test/claim-{oldest}" in lines[0]

    # A pod of the device plugin holds all it asks for or nothing, the latter said; none holds
    # nothing while what it asks for sits free.
    held = Counter(p for s in found.values() if s and not s.replicas for p in pods_of(s))
    held.update(r.holder.pod for s in found.values() if s for r in s.replicas)
    for i, pod in enumerate(plugin_pods):
        name = f"plugin-{i}"
        limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
        wanted = sum(int(v) for v in limits.values()) or 1
        lines = [w for w in warnings if w.startswith(f"pod ns/{name}:")]
        if held[name] == 0:
            assert lines, (name, warnings)
            if limits:
                (resource,) = limits
                profile = resource.removeprefix("nvidia.com/mig-").replace(".", "")
                per = 2 if kind == "time-sliced" else 1  # what one device offers
                free = [d for d, s in found.items() if s is None
                        and (profile in d if "mig" in resource else "mig" not in d)
                        for _ in range(per)]  # fmt: skip
                free += [d for d, s in found.items() if s and s.replicas
                         for _ in range(per - len(s.replicas))]  # fmt: skip
                assert len(free) < wanted, (name, free)
        else:
            assert held[name] == wanted, (name, held)
        # A device it held that a claim holds now: one line, naming the claim.
        for device, pods in held_before.items():
            status = found.get(device)
            if name in pods and status is not None and status.dra_claims:
                claim = status.dra_claims[0].claim
                naming_it = [w for w in lines if f"DRA claim gpu-test/{claim}" in w]
                assert len(naming_it) == 1, (name, device, lines)

    # Said once: the node placed again from the same objects says nothing new.
    if claim_pairs:
        pod, claim = claim_pairs[0]
        state.delete_claim(("gpu-test", claim["metadata"]["name"]))
        state.set_claim(read_claim(claim))
        state.settle()
        assert state.reconsidered == {"n"}
        # (A pod that does not fit may say so again with another count of free devices, once a
        # younger pod holds what it was given: how many are free is not this rule's.)
        conflicts = [w for w in said(state) if "DRA claim" in w and "free" not in w]
        assert set(conflicts) <= set(warnings), (said(state), warnings)
        assert state.results["n"] == result


def _plugin_pod_on(kind: str, request: str) -> ClusterState:
    """A node of `kind` with one older pod holding a device through `request`, placed."""
    node, _ = NODES[kind]
    state = ClusterState()
    state.set_node(node)
    state.set_pod(slim_pod(plugin_pod(0, request, 1, 0)))
    state.settle()
    return state


def _claimed(state: ClusterState, device: str) -> dict[str, Any]:
    """A claim allocated `device`, and its pod, added and placed; the claim."""
    pod, claim = claim_objects(0, device, 5)
    state.set_pod(slim_pod(pod))
    state.set_claim(read_claim(claim))
    state.settle()
    return claim


def test_a_claim_allocated_a_gpu_a_pod_held_moves_the_pod_and_says_so_once() -> None:
    """The example the DRA page gives: a device-plugin pod holds GPU 0; a claim is allocated
    GPU 0 (the two sources do not know of each other): the claim holds it, the pod moves to the
    free GPU 1, one warning says so, and nothing more is said on later passes. With no free GPU
    left, the pod holds nothing, said once."""
    state = _plugin_pod_on("whole", "nvidia.com/gpu")
    assert pods_of(statuses(state.results["n"])["gpu-0"]) == {"plugin-0"}
    claim = _claimed(state, "gpu-0")
    found = statuses(state.results["n"])
    assert pods_of(found["gpu-0"]) == {"claimant-0"}
    assert pods_of(found["gpu-1"]) == {"plugin-0"}
    assert said(state) == [
        "pod ns/plugin-0: spec.containers[0].resources.limits[nvidia.com/gpu]: GPU 0 it held is "
        "DRA claim gpu-test/claim-0's (gpu-0, which the scheduler allocated): it holds GPU 1 now"
    ]
    state.delete_claim(("gpu-test", "claim-0"))
    state.set_claim(read_claim(claim))
    state.settle()  # the node placed again from the same objects
    assert state.reconsidered == {"n"}
    assert said(state) == []  # said once
    for i, device in ((1, "gpu-1"), (2, "gpu-2")):
        other, taken = claim_objects(i, device, 6)
        state.set_pod(slim_pod(other))
        state.set_claim(read_claim(taken))
    state.settle()
    message = (
        "pod ns/plugin-0: spec.containers[0].resources.limits[nvidia.com/gpu]: asks for 1 GPUs, "
        "node n has 0 free (GPU 0: DRA claim gpu-test/claim-0; GPU 1: DRA claim "
        "gpu-test/claim-1; GPU 2: DRA claim gpu-test/claim-2)"
    )
    assert said(state) == [message]
    state.delete_claim(("gpu-test", "claim-2"))
    state.set_claim(read_claim(claim_objects(2, "gpu-2", 6)[1]))
    state.settle()
    assert said(state) == [message]  # the same line: the controller says it once


def test_a_run_ai_pod_whose_instance_a_claim_holds_holds_nothing() -> None:
    state = _plugin_pod_on("runai", "runai:4")
    _claimed(state, "gpu-0-mig-1g5gb-19-4")
    found = statuses(state.results["n"])
    assert pods_of(found["gpu-0-mig-1g5gb-19-4"]) == {"claimant-0"}
    assert said(state) == [
        "pod ns/plugin-0: metadata.annotations[runai-mig-device]: device GPU 0 GI 7 is held by "
        "DRA claim gpu-test/claim-0 (gpu-0-mig-1g5gb-19-4): not placed"
    ]
