"""Every container kind that can hold a device: app containers, regular init containers and
sidecars (init containers with `restartPolicy: Always`, GA in Kubernetes 1.33), through the
device plugin's limits and through DRA claims.

The oracle is Kubernetes' own rule, written out here: a pod needs, of each resource, the most any
regular init container needs beside the sidecars started before it, or its app containers' and
sidecars' together if more (k8s.io/component-helpers `resource.AggregateContainerRequests`, KEP-753);
the kubelet's device manager gives a sidecar's and an app container's devices to them alone, and
a regular init container's to the containers after it (`devicemanager.Allocate`).
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from status_updater.claims import read_claim
from status_updater.objects import slim_pod
from status_updater.state import ClusterState
from tests.status_updater.test_claims import CLAIMS, PODS, by_name, claimed
from tests.status_updater.test_resourceslices import gpu_node
from tests.status_updater.test_sharing import served, shared
from tests.status_updater.test_static import static_node
from tests.support.base import examples
from topology.model import DeviceStatus, NodeTopology

Container = tuple[str, int]  # (kind: init | sidecar | app, devices it asks for)


def effective(containers: list[Container]) -> int:
    """Kubernetes' effective request of a pod (AggregateContainerRequests)."""
    init, sidecars = 0, 0
    for kind, n in containers:
        if kind == "sidecar":
            sidecars += n
            init = max(init, sidecars)
        elif kind == "init":
            init = max(init, n + sidecars)
    return max(init, sum(n for kind, n in containers if kind == "app") + sidecars)


def device_pod(name: str, node: str, resource: str, containers: list[Container]) -> dict[str, Any]:
    """A pod whose containers (`c0`, `c1`, ... in the order given, init containers first) ask
    for `resource`."""

    def container(i: int, kind: str, n: int) -> dict[str, Any]:
        c: dict[str, Any] = {
            "name": f"c{i}",
            "resources": {"limits": {resource: str(n)} if n else {}},
        }
        if kind == "sidecar":
            c["restartPolicy"] = "Always"
        return c

    made = [(kind, container(i, kind, n)) for i, (kind, n) in enumerate(containers)]
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": node,
                 "initContainers": [c for kind, c in made if kind != "app"],
                 "containers": [c for kind, c in made if kind == "app"]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def runai_node(name: str, gpus: int) -> dict[str, Any]:
    """A run:ai dynamic-MIG node whose GPUs all have MIG off: pods get whole GPUs."""
    config = {"mig-configs": {"selected": [{"devices": list(range(gpus)), "mig-enabled": False}]}}
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/mig.strategy": "mixed", "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true"}  # fmt: skip
    annotations = {"run.ai/mig.config": json.dumps(config),
                   "run.ai/mig-mapping": base64.b64encode(b"{}").decode()}  # fmt: skip
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }


def whole_node(name: str, gpus: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/gpu.memory": "15360"}  # fmt: skip
    return {"kind": "Node", "metadata": {"name": name, "labels": labels}}


# (node kind, the resource its pods ask for, the node holding `n` of them, or more where the
# node's devices come in other sizes, and whether exactly `n` fit)
NODES = {
    "whole-gpus": ("nvidia.com/gpu", whole_node, True),
    "run:ai-whole-gpus": ("nvidia.com/gpu", runai_node, True),
    "static-mig": ("nvidia.com/mig-1g.5gb",
                   lambda name, n: static_node(name, "NVIDIA-A100-SXM4-40GB", -(-n // 7),
                                               "all-1g.5gb"), False),
    "time-sliced": ("nvidia.com/gpu", lambda name, n: shared(whole_node(name, -(-n // 4)),
                                                              "time-slicing", 4), False),
}  # fmt: skip


def holders(result: NodeTopology) -> Counter[tuple[str, str, str]]:
    """(pod, container, device) of each device held, replicas each one."""
    found: Counter[tuple[str, str, str]] = Counter()

    def count(status: DeviceStatus | None, device: str) -> None:
        if status is None:
            return
        for r in status.replicas:
            found[r.holder.pod, r.holder.container, f"{device} replica {r.index}"] += 1
        if not status.replicas and status.allocated_by is not None:
            found[status.allocated_by.pod, status.allocated_by.container, device] += 1

    for g, gpu in enumerate(result.gpus):
        count(gpu.status, f"gpu {g}")
        for d in gpu.mig_devices or ():
            count(d.status, f"gpu {g} GI {d.gpu_instance_id}")
    return found


containers_strategy = st.lists(
    st.tuples(st.sampled_from(["init", "sidecar", "app"]), st.integers(0, 3)),
    min_size=1,
    max_size=6,
).map(lambda cs: sorted(cs, key=lambda c: c[0] == "app"))  # init containers come first


@settings(max_examples=examples(80), deadline=None)
@given(kind=st.sampled_from(sorted(NODES)), containers=containers_strategy)
def test_a_pod_holds_its_effective_request_and_each_running_container_its_own(
    kind: str, containers: list[Container]
) -> None:
    """Whatever mix of init containers, sidecars and app containers: the pod holds as many
    devices as Kubernetes' effective request (no fewer: none is shown free while the pod holds
    it; no more), each sidecar and app container holds what it asks for under its own name, the
    regular init containers only what no later container reuses; a node with one device fewer
    gives the pod nothing; and once an older pod's devices are free, the pod placed again keeps
    every one of its own."""
    want = effective(containers)
    assume(want > 0 and any(k == "app" for k, _ in containers))
    resource, make_node, exact = NODES[kind]
    older = device_pod("a", "n", resource, [("app", 1)])
    older["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    pod = device_pod("p", "n", resource, containers)
    state = ClusterState.of([make_node("n", want + 1)], [older, pod])
    result = state.results["n"]
    assert isinstance(result, NodeTopology)
    assert state.node_warnings("n") == []
    held = {k: v for k, v in holders(result).items() if k[0] == "p"}
    assert sum(held.values()) == want
    per_container = Counter(container for _, container, _ in held)
    running = sum(n for k, n in containers if k != "init")
    for i, (k, n) in enumerate(containers):
        if k != "init":
            assert per_container[f"c{i}"] == n, (i, k, held)
    assert sum(per_container[f"c{i}"] for i, (k, _) in enumerate(containers) if k == "init") == (
        want - running
    )
    # The older pod ends: the pod is placed again, and nothing of it moves to what it freed.
    state.delete_pod("ns/a")
    state.settle()
    again = state.results["n"]
    assert isinstance(again, NodeTopology)
    assert holders(again) == held
    if exact:
        short = ClusterState.of([make_node("n", want - 1)] if want > 1 else [], [pod])
        assert all(not holders(r) for r in short.results.values() if isinstance(r, NodeTopology))


def test_a_sidecars_gpu_is_served_with_the_sidecars_name(tmp_path: Path) -> None:
    """What a user checks: the exporter's series of the GPU a sidecar (a log shipper with its
    own GPU, say) holds name the sidecar, and the app container's its own."""
    pod = device_pod("p", "n", "nvidia.com/gpu", [("sidecar", 1), ("app", 1)])
    pod["spec"]["initContainers"][0]["name"] = "encoder"
    pod["spec"]["containers"][0]["name"] = "main"
    out, warnings = served(tmp_path, whole_node("n", 2) | {"apiVersion": "v1"}, [pod])
    assert warnings == []
    gpu_util = [line for line in out.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    containers = sorted(line.split('container="')[1].split('"')[0] for line in gpu_util)
    assert containers == ["encoder", "main"]


def _claim_pod(uses: dict[str, tuple[str, list[str]]]) -> dict[str, Any]:
    """dynamic-infer with its containers: name -> (kind, the claim entries it uses)."""
    pod = by_name(PODS, "dynamic-infer")
    pod["spec"]["nodeName"] = "n"
    pod["spec"]["resourceClaims"] = [{"name": "a", "resourceClaimName": "claim-a"},
                                     {"name": "b", "resourceClaimName": "claim-b"}]  # fmt: skip
    made = {kind: [] for kind in ("init", "sidecar", "app")}
    for name, (kind, entries) in uses.items():
        c: dict[str, Any] = {"name": name, "resources": {"claims": [{"name": e} for e in entries]}}
        if kind == "sidecar":
            c["restartPolicy"] = "Always"
        made[kind].append(c)
    pod["spec"]["initContainers"] = made["init"] + made["sidecar"]
    pod["spec"]["containers"] = made["app"] or [{"name": "idle"}]
    return pod


def _claim(name: str, device: str) -> dict[str, Any]:
    claim = by_name(CLAIMS, "half-h100")
    claim["metadata"]["name"] = name
    claim["status"]["allocation"]["devices"]["results"][0].update(pool="n", device=device)
    return claim


# containers (name -> kind, claim entries used) -> device -> the containers holding it
CLAIM_USES = [
    ({"proxy": ("sidecar", ["a"]), "main": ("app", ["b"])},
     {"gpu-0": ["proxy"], "gpu-1": ["main"]}),
    ({"check": ("init", ["a"]), "main": ("app", ["b"])},  # only the init container used it
     {"gpu-0": ["check"], "gpu-1": ["main"]}),
    ({"check": ("init", ["a"]), "main": ("app", ["a"])},  # the app container after it runs
     {"gpu-0": ["main"]}),
    ({"check": ("init", ["a", "b"]), "proxy": ("sidecar", ["a"])},
     {"gpu-0": ["proxy"], "gpu-1": ["check"]}),
    ({"proxy": ("sidecar", ["a"]), "main": ("app", ["a"])},  # both run: both hold it
     {"gpu-0": ["proxy", "main"]}),
]  # fmt: skip


@pytest.mark.parametrize(("uses", "expected"), CLAIM_USES)
def test_a_claim_a_sidecar_or_init_container_uses_is_held_by_it(
    uses: dict[str, tuple[str, list[str]]], expected: dict[str, list[str]]
) -> None:
    """DRA: a claim's device is held by the containers whose `resources.claims` name it,
    sidecars and init containers included (a claim is the pod's until it ends); a regular init
    container has ended once an app container runs, so a device both use is the app's."""
    state = ClusterState()
    state.set_node(gpu_node("n", "NVIDIA-A100-SXM4-80GB", 2))
    state.set_pod(slim_pod(_claim_pod(uses)))
    state.set_claim(read_claim(_claim("claim-a", "gpu-0")))
    state.set_claim(read_claim(_claim("claim-b", "gpu-1")))
    state.settle()
    assert state.node_warnings("n") == []
    found = {device: sorted(c for _, c, _ in held) for device, held in claimed(state, "n").items()}
    assert found == {device: sorted(names) for device, names in expected.items()}


@pytest.mark.parametrize(
    ("containers", "field"),
    [
        ([("sidecar", "1.5"), ("app", "1")], "spec.initContainers[0]"),
        ([("init", "1"), ("init", "500m"), ("app", "1")], "spec.initContainers[1]"),
        ([("init", "1"), ("app", "0"), ("app", "-1")], "spec.containers[1]"),
    ],
)
def test_a_request_no_kubelet_takes_is_said_where_it_is(
    containers: list[tuple[str, str]], field: str
) -> None:
    """A GPU limit that is no whole number, in whichever container: the pod holds nothing, and
    the warning names that container's field."""
    pod = device_pod("p", "n", "nvidia.com/gpu", [(kind, 0) for kind, _ in containers])
    listed = [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]
    for c, (_, value) in zip(listed, containers, strict=True):
        c["resources"]["limits"] = {"nvidia.com/gpu": value}
    state = ClusterState.of([whole_node("n", 4)], [pod])
    result = state.results["n"]
    assert isinstance(result, NodeTopology) and not holders(result)
    [warning] = state.node_warnings("n")
    assert str(warning).startswith(f"pod ns/p: {field}.resources.limits[nvidia.com/gpu]: ")
