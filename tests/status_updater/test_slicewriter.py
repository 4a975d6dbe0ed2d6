"""`status_updater run --dra-node-selector`: the ResourceSlices it publishes on the API, as a
scheduler (and `kubectl get resourceslices`) sees them. The daemon runs in this process against
the emulator over HTTP, with the official client."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from status_updater import slicewriter
from status_updater.devices import build_node
from status_updater.dra import DraOptions, node_slimmer
from status_updater.resourceslices import node_slices
from status_updater.slicewriter import _Templates, _Text
from tests.deploy.test_deploy import UPDATER, bound_rules, render
from tests.deploy.test_helm import layout_objects
from tests.status_updater.test_daemon import run_daemon
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.status_updater.test_resourceslices import gpu_node
from tests.support.base import SAMPLES, examples
from tests.support.kubeapi import JournalEntry, KubeAPI, eventually
from tests.support.rbac import allowed, request_of
from topology.catalog import MODELS, GpuModel
from topology.configmap import LABEL_MANAGED_BY, MANAGER
from topology.errors import TopologyError

NODES = list(yaml.safe_load_all((SAMPLES / "dra" / "nodes.yaml").read_text()))
KWOK = DraOptions("type=kwok", dynamic_mig=True)
STATIC = DraOptions("type=kwok", dynamic_mig=False)


def sample(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A sample node, with these labels changed."""
    node = copy.deepcopy(next(n for n in NODES if n["metadata"]["name"] == name))
    node["metadata"]["labels"].update(labels or {})
    return node


def pool(kube: KubeAPI, node: str, ours: bool = True) -> dict[str, dict[str, Any]]:
    """The slices of a node's pool the updater wrote (`ours`) or all of them, by name."""
    return {
        s["metadata"]["name"]: s
        for s in kube.list_objects("resourceslices")
        if s["spec"]["pool"]["name"] == node
        and (not ours or (s["metadata"].get("labels") or {}).get(LABEL_MANAGED_BY) == MANAGER)
    }


def expected(kube: KubeAPI, name: str, dra: DraOptions) -> list[dict[str, Any]]:
    """What the driver would publish for the Node as the API holds it (its uid the API's)."""
    slim = node_slimmer(dra)(kube.get("nodes", name))
    return node_slices(slim, build_node(slim), **dra.slices())


def published(kube: KubeAPI, name: str, dra: DraOptions) -> int | None:
    """The pool's generation once it holds exactly what the driver would publish, all its
    slices at that generation; None until then."""
    found = pool(kube, name)
    want = expected(kube, name, dra)
    if set(found) != {s["metadata"]["name"] for s in want}:
        return None
    generations = {s["spec"]["pool"]["generation"] for s in found.values()}
    if len(generations) != 1:
        return None
    for s in want:
        have = found[s["metadata"]["name"]]
        spec = {**have["spec"], "pool": {**have["spec"]["pool"], "generation": 1}}
        if spec != s["spec"] or have["metadata"].get("ownerReferences") != s["metadata"].get(
            "ownerReferences"
        ):
            return None
    return generations.pop()


def slice_writes(kube: KubeAPI) -> list[JournalEntry]:
    return [
        e
        for e in kube.journal()
        if not e.harness
        and "resourceslices" in e.path
        and e.method in ("POST", "PUT", "PATCH", "DELETE")
    ]


def assert_the_dra_install_allows_what_was_asked(kube: KubeAPI) -> None:
    """Each DRA request the updater made (resource.k8s.io) is one deploy/dra/'s RBAC grants its
    ServiceAccount, and the chart's DRA install's."""
    asked = {r for e in kube.journal() if not e.harness and (r := request_of(e)) is not None}
    dra = {r for r in asked if r.group == "resource.k8s.io"}
    assert {(r.verb, r.resource) for r in dra} >= {("list", "resourceclaims"),
                                                   ("watch", "resourceclaims"),
                                                   ("create", "resourceslices")}  # fmt: skip
    for install in (render("dra"), layout_objects("dra")):
        cluster, _ = bound_rules(install, UPDATER)
        for r in dra:
            assert allowed(cluster, r.verb, r.resource, r.group, r.name), r


def allocate(kube: KubeAPI, pod: str) -> None:
    """The sample pod, and its claim as the scheduler allocates it (reserved for the pod's uid,
    which the API gave it)."""
    body = next(p for p in yaml.safe_load_all((SAMPLES / "dra" / "pods.yaml").read_text())
                if p["metadata"]["name"] == pod)  # fmt: skip
    uid = kube.create("pods", body, namespace="gpu-test")["metadata"]["uid"]
    for claim in yaml.safe_load_all((SAMPLES / "dra" / "claims.yaml").read_text()):
        reserved = claim["status"]["reservedFor"]
        if reserved[0]["name"] == pod:
            reserved[0]["uid"] = uid
            kube.create("resourceclaims", claim, namespace="gpu-test")


def topology_text(kube: KubeAPI, node: str) -> str:
    cm = kube.find("configmaps", f"topology-{node}", "gpu-ops")
    return cm["data"]["topology.yml"] if cm else ""


def foreign_slice(node: str) -> dict[str, Any]:
    """A slice the real driver published (generateName's random tail, no label of ours)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-gpu.nvidia.com-x7k2p"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 7, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}  # fmt: skip


def test_the_selected_gpu_nodes_get_the_drivers_slices_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeAPI.start() as kube:
        for node in NODES:
            kube.create("nodes", node)
        kube.create("nodes", whole_gpu_node("k80"))  # a GPU node the selector does not pick
        kube.create("nodes", {"metadata": {"name": "cpu", "labels": {"type": "kwok"}}})
        kube.create("resourceslices", foreign_slice("k80"))

        def scenario() -> None:
            for name in ("dra-a100", "dra-h100"):
                assert eventually(lambda n=name: published(kube, n, KWOK), timeout=10) == 1
            for s in kube.list_objects("resourceslices"):
                kubernetes_validate.validate(s, "1.35", strict=True)
            # The owner is the Node as the API holds it: the garbage collector deletes them.
            owner = pool(kube, "dra-a100")["00000-gpu.nvidia.com-dra-a100"]["metadata"]
            assert (
                owner["ownerReferences"][0]["uid"]
                == kube.get("nodes", "dra-a100")["metadata"]["uid"]
            )
            assert owner["labels"] == {LABEL_MANAGED_BY: MANAGER}
            assert len(pool(kube, "dra-a100")) == 3  # the counter sets, then a slice per GPU
            (left,) = pool(kube, "k80", ours=False).values()  # the driver's, as it was
            assert left["spec"] == foreign_slice("k80")["spec"]
            assert not pool(kube, "cpu")  # no GPU node: nothing to offer
            # What does not change a node's devices writes no slice again: a pod given one.
            before = len(slice_writes(kube))
            kube.patch("nodes", "dra-h100", {"metadata": {"annotations": {"note": "x"}}})
            allocate(kube, "dynamic-infer")
            eventually(lambda: "dra-claims" in topology_text(kube, "dra-h100"), timeout=5)
            assert len(slice_writes(kube)) == before

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, KWOK) == 0


def test_a_node_whose_devices_change_is_published_again_under_the_next_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeAPI.start() as kube:
        kube.create("nodes", sample("dra-a100", {"nvidia.com/mig.config": "all-enabled"}))

        def scenario() -> None:
            assert eventually(lambda: published(kube, "dra-a100", KWOK), timeout=10) == 1
            assert len(pool(kube, "dra-a100")) == 3
            # MIG off: two whole GPUs, no counters, after the driver's (split) empty counter slice.
            labels = {"nvidia.com/mig.config": "all-disabled"}
            kube.patch("nodes", "dra-a100", {"metadata": {"labels": labels}})
            assert eventually(lambda: published(kube, "dra-a100", KWOK), timeout=5) == 2
            assert pool(kube, "dra-a100")["00000-gpu.nvidia.com-dra-a100"]["spec"] == {
                "driver": "gpu.nvidia.com", "nodeName": "dra-a100",
                "pool": {"name": "dra-a100", "generation": 2, "resourceSliceCount": 3},
            }  # fmt: skip
            devices = [d["name"] for s in pool(kube, "dra-a100").values()
                       for d in s["spec"].get("devices", [])]  # fmt: skip
            assert sorted(devices) == ["gpu-0", "gpu-1"]
            assert {s["spec"]["pool"]["resourceSliceCount"]
                    for s in pool(kube, "dra-a100").values()} == {3}  # fmt: skip

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, KWOK) == 0
        assert_the_dra_install_allows_what_was_asked(kube)


def test_slices_edited_or_deleted_by_someone_are_repaired_and_others_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeAPI.start() as kube:
        kube.create("nodes", sample("dra-a100"))
        kube.create("resourceslices", foreign_slice("dra-a100"))

        def scenario() -> None:
            assert eventually(lambda: published(kube, "dra-a100", STATIC), timeout=10) == 1
            name = "00000-gpu.nvidia.com-dra-a100"
            edited = copy.deepcopy(pool(kube, "dra-a100")[name])
            edited["spec"]["devices"] = edited["spec"]["devices"][:1]
            kube.replace("resourceslices", name, edited)
            # The watch sees it (the resync is 30 s away): written again, a newer generation.
            assert eventually(lambda: published(kube, "dra-a100", STATIC), timeout=5) == 2
            kube.delete("resourceslices", name)
            assert eventually(lambda: published(kube, "dra-a100", STATIC), timeout=5) == 3
            assert (
                kube.get("resourceslices", "dra-a100-gpu.nvidia.com-x7k2p")["spec"]["pool"]
                == foreign_slice("dra-a100")["spec"]["pool"]
            )

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, STATIC) == 0
        assert_the_dra_install_allows_what_was_asked(kube)


def test_slices_go_with_their_node_and_a_restart_keeps_what_is_right(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeAPI.start() as kube:
        for node in NODES:
            kube.create("nodes", node)
        # Left by a run before: the slices of a node deleted while the updater was down.
        gone = copy.deepcopy(foreign_slice("gone"))
        gone["metadata"] = {"name": "00000-gpu.nvidia.com-gone",
                            "labels": {LABEL_MANAGED_BY: MANAGER}}  # fmt: skip
        kube.create("resourceslices", gone)

        def first() -> None:
            eventually(lambda: published(kube, "dra-h100", KWOK), timeout=10)
            eventually(lambda: not pool(kube, "gone"))

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, first, KWOK) == 0
        writes = len(slice_writes(kube))

        def second() -> None:
            eventually(lambda: kube.find("configmaps", "topology-dra-h100", "gpu-ops"))
            assert published(kube, "dra-h100", KWOK) == 1  # it holds what it should: kept
            assert len(slice_writes(kube)) == writes
            kube.delete("nodes", "dra-h100")
            eventually(lambda: not pool(kube, "dra-h100"), timeout=5)
            # No longer selected: its slices go, the node stays.
            kube.patch("nodes", "dra-a100", {"metadata": {"labels": {"type": None}}})
            eventually(lambda: not pool(kube, "dra-a100"), timeout=5)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, second, KWOK) == 0
        assert_the_dra_install_allows_what_was_asked(kube)


def test_without_the_dra_api_the_configmaps_are_still_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with KubeAPI.start() as kube:
        node = whole_gpu_node("k80")
        node["metadata"]["labels"]["type"] = "kwok"
        kube.create("nodes", node)
        # A cluster before Kubernetes 1.34: resource.k8s.io/v1 is not served.
        for plural in ("resourceslices", "resourceclaims"):
            kube.fail_next(10**6, status=404, plural=plural)

        def scenario() -> None:
            eventually(lambda: kube.find("configmaps", "topology-k80", "gpu-ops"), timeout=10)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, KWOK) == 0


@pytest.mark.parametrize("status", [403, 422])
def test_a_refusal_every_node_meets_is_one_line_not_one_a_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:  # fmt: skip
    """A permission every node lacks (RBAC, a policy: 403) or a limit every pool passes (422):
    one line names the nodes refused for that reason in a pass (a few, and how many more), each
    node named once however often it is tried; the ConfigMaps are written all the same."""
    names = [f"kwok-{i:02d}" for i in range(40)]
    with KubeAPI.start() as kube:
        for name in names:
            node = whole_gpu_node(name)
            node["metadata"]["labels"]["type"] = "kwok"
            kube.create("nodes", node)
        kube.fail_next(10**6, status=status, method="POST", plural="resourceslices")

        def scenario() -> None:
            for name in names:
                eventually(lambda n=name: kube.find("configmaps", f"topology-{n}", "gpu-ops"))
            eventually(lambda: len([e for e in kube.journal() if e.fault]) >= 2 * len(names),
                       timeout=10)  # fmt: skip

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, KWOK) == 0
    said = [m for m in caplog.messages if m.startswith("ResourceSlices of node")]
    assert 1 <= len(said) <= 3, said  # a line a pass that met the refusal for the first time
    assert all(f"HTTP {status}" in m and "more" in m for m in said)
    named = [n for m in said for n in names if f"{n}," in m or f"{n} " in m or f"{n}:" in m]
    assert len(named) == len(set(named))  # no node said twice


def test_a_pool_the_api_refuses_never_holds_back_the_others_or_the_configmaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An admission webhook or a validation limit refuses one node's slices (422): the other
    nodes' slices and every ConfigMap are written at once, the refusal is said once, and the
    node is tried again, with backoff, until the API takes it."""
    with KubeAPI.start() as kube:
        for node in NODES:
            kube.create("nodes", node)
        kube.fail_next(10**6, status=422, method="POST", plural="resourceslices", about="dra-a100'")

        def scenario() -> None:
            for name in ("dra-a100-80gb", "dra-h100"):
                assert eventually(lambda n=name: published(kube, n, KWOK), timeout=5) == 1
            for node in NODES:
                name = node["metadata"]["name"]
                eventually(lambda n=name: kube.find("configmaps", f"topology-{n}", "gpu-ops"))
            time.sleep(2.5)  # a few retries
            refused = [e for e in kube.journal() if e.fault == 422]
            assert 2 <= len(refused) <= 4  # after 1 s, then 2 s: backoff, not a retry per loop
            assert not pool(kube, "dra-a100")
            kube.call(lambda e: e.faults.clear())  # the API takes it from now on
            assert eventually(lambda: published(kube, "dra-a100", KWOK), timeout=10) == 1

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, KWOK) == 0
    said = [m for m in caplog.messages if "ResourceSlices of node dra-a100:" in m]
    assert said == ["ResourceSlices of node dra-a100: HTTP 422 Unprocessable Entity; retrying"]


@settings(max_examples=examples(40), deadline=None)
@given(
    model=st.sampled_from(MODELS),
    layout=st.sampled_from([None, "all-enabled", "all-disabled", "all-balanced"]),
    count=st.integers(1, 10),
    options=st.fixed_dictionaries(
        {
            "dynamic": st.booleans(),
            "layout": st.sampled_from(["split", "combined"]),
            "list_attributes": st.booleans(),
        }
    ),
    names=st.lists(st.text(alphabet="abz09.-", min_size=1, max_size=70), min_size=2, max_size=3),
    driver=st.sampled_from([{}, {"nvidia.com/cuda.driver.major": "535"}]),
    uid=st.booleans(),
)
def test_slices_made_from_a_template_are_the_slices_made_alone(
    model: GpuModel, layout: str | None, count: int, options: dict[str, Any],
    names: list[str], driver: dict[str, str], uid: bool,
) -> None:  # fmt: skip
    """Nodes of one shape share their slices' JSON, their names and GPU uuids put in: the same
    text and digest as each node's own slices, whatever its name (a long one is hashed)."""
    templates = _Templates()
    for name in names:
        node = gpu_node(name, model.product_labels[0], count, layout, options["dynamic"], **driver)
        if not uid:
            node["metadata"]["uid"] = None
        devices = build_node(node)
        alone = [_Text.of(s) for s in node_slices(node, devices, **options)]
        made = templates.texts(node, devices, options)
        assert [(t.name, t.meta, t.spec, t.digest) for t in made] == [
            (t.name, t.meta, t.spec, t.digest) for t in alone]  # fmt: skip


def test_a_leader_keeps_its_lease_while_it_publishes_against_a_slow_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every Lease call answered 4 s late while 150 nodes are published: a try (read, then
    patch) takes 8 s, within the 10 s renew deadline, so the leader leads throughout (a fixed
    3 s call timeout lost the Lease whenever the API was busy)."""
    nodes = 150
    with KubeAPI.start() as kube:
        for i in range(nodes):
            node = sample("dra-a100-80gb")  # one whole GPU: cheap slices
            node["metadata"]["name"] = f"kwok-{i:03d}"
            kube.create("nodes", node)
        kube.call(lambda emu: emu.slow(600, 4.0, "leases"))

        before_shutdown: list[str] = []

        def scenario() -> None:
            names = [f"kwok-{i:03d}" for i in range(nodes)]
            eventually(lambda: all(pool(kube, n) for n in names), timeout=60)
            time.sleep(12)  # at least one more renewal, each of its calls 4 s late
            before_shutdown.append(caplog.text)

        with caplog.at_level("INFO"):
            assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, STATIC) == 0
        (said,) = before_shutdown
        assert "acquired leadership" in said
        assert "lost leadership" not in said  # only at the shutdown, when it is released
        assert len({s["spec"]["nodeName"] for s in kube.list_objects("resourceslices")}) == nodes


def _no_counters(obj: dict[str, Any]) -> None:
    """An API server without DRAPartitionableDevices: the counters it does not know are gone."""
    spec = obj.get("spec") or {}
    spec.pop("sharedCounters", None)
    for device in spec.get("devices") or ():
        device.pop("consumesCounters", None)


def test_an_api_that_changes_what_it_stores_has_each_pool_written_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the API answered is what it holds: after the watch lists again (410) and at a
    resync, the slices it changed are not written again, forever. A shape whose first answer
    differs is never taken on trust."""
    with KubeAPI.start() as kube:
        kube.call(lambda emu: emu.rewrites.__setitem__("resourceslices", _no_counters))
        for name in ("dra-h100", "dra-a100"):
            kube.create("nodes", sample(name))

        def scenario() -> None:
            eventually(lambda: len(pool(kube, "dra-h100")) == 2 and len(pool(kube, "dra-a100")) == 3,
                       timeout=10)  # fmt: skip
            assert not any("consumesCounters" in d for s in pool(kube, "dra-h100").values()
                           for d in s["spec"].get("devices", []))  # fmt: skip
            time.sleep(1.0)
            written = len(slice_writes(kube))
            kube.expire_watches(10)  # every watch lists again: the slices are judged anew
            kube.cut_watches()
            time.sleep(4.0)  # past the 3 s resync, and the pass the relist starts
            assert len(slice_writes(kube)) == written

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 3.0, scenario, KWOK) == 0


def test_a_pass_writes_at_least_one_node_and_leaves_the_rest_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no time for a pass at all, each pass still publishes a node: every node is
    published, over as many passes."""
    monkeypatch.setattr(slicewriter, "PASS_S", 0.0)
    with KubeAPI.start() as kube:
        names = [f"kwok-{i}" for i in range(6)]
        for name in names:
            node = sample("dra-a100-80gb")
            node["metadata"]["name"] = name
            kube.create("nodes", node)

        def scenario() -> None:
            eventually(lambda: all(pool(kube, n) for n in names), timeout=15)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, STATIC) == 0


def test_a_template_whose_node_cannot_be_built_names_the_node() -> None:
    node = gpu_node("bad-node", "NVIDIA-H100-80GB-HBM3", 2, "all-enabled", True,
                    **{"nvidia.com/cuda.driver.major": "five"})  # fmt: skip
    with pytest.raises(TopologyError, match=r"^node bad-node: metadata\.labels"):
        _Templates().texts(node, build_node(node), KWOK.slices())


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_an_answers_version_is_its_metadatas_however_the_api_spaces_its_json(
    separators: tuple[str, str],
) -> None:
    answer = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"name": "s", "resourceVersion": "41"},
              "spec": {"devices": [{"name": "gpu-0", "attributes": {
                  "resourceVersion": {"string": "9"}}}]}}  # fmt: skip
    assert slicewriter._version_of(json.dumps(answer, separators=separators).encode()) == "41"
