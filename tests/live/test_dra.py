"""DRA as a user runs it: the updater and the all-nodes exporter as processes (deploy/dra/'s
flags) against the emulated API, KWOK-like nodes, the driver's DeviceClasses, and the test in
the roles nothing runs here: the resource-claim controller (a claim from a pod's template) and
the scheduler (an allocation from the published slices, by tests/support/allocator.py)."""

from __future__ import annotations

import copy
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from tests.live.test_live import Daemons, running
from tests.pipeline.test_cli import get
from tests.support.allocator import Allocator
from tests.support.base import ROOT, SAMPLES
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import Series, by_name, parse
from topology.catalog import model_for_product

DRA = SAMPLES / "dra"
NS = "gpu-test"
NODES = {n["metadata"]["name"]: n for n in yaml.safe_load_all((DRA / "nodes.yaml").read_text())}
TEMPLATES = list(yaml.safe_load_all((DRA / "claim-templates.yaml").read_text()))
CLASSES = list(yaml.safe_load_all((ROOT / "deploy" / "dra" / "deviceclasses.yaml").read_text()))
DRA_LABELS = ("dra_claim_name", "dra_claim_namespace", "dra_device_name", "dra_driver_name",
              "dra_pool_name")  # fmt: skip


def start(d: Daemons, *updater_args: str, exporter_args: tuple[str, ...] = ()) -> str:
    """The cluster's objects, the updater publishing for type=kwok, and the exporter's URL."""
    for node in NODES.values():
        d.kube.create("nodes", copy.deepcopy(node))
    for cls in CLASSES:
        d.kube.create("deviceclasses", cls)
    for template in TEMPLATES:
        d.kube.create("resourceclaimtemplates", template, namespace=NS)
    d.updater("updater-0", "--dra-node-selector", "type=kwok", *updater_args)
    return d.exporter("--all-nodes", "--node-selector", "type=kwok", "--kubernetes-enable-dra",
                      *exporter_args)  # fmt: skip


def pool(kube: KubeAPI, node: str) -> list[dict[str, Any]]:
    return [s for s in kube.list_objects("resourceslices") if s["spec"]["pool"]["name"] == node]


def published(kube: KubeAPI, node: str) -> list[dict[str, Any]] | None:
    """The node's slices once its pool is complete (as the scheduler waits for it)."""
    found = pool(kube, node)
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in found}
    return found if counts == {len(found)} else None


def pod_with_template(name: str, template: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "ctr0", "image": "ubuntu:24.04",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]}}  # fmt: skip


def claim_from_template(kube: KubeAPI, pod: dict[str, Any], entry: str = "gpu") -> str:
    """What the resource-claim controller does: the claim, owned by the pod, and its name in the
    pod's status."""
    template_name = pod["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    template = kube.get("resourceclaimtemplates", template_name, NS)
    name = f"{pod['metadata']['name']}-{entry}-x7k2p"
    owner = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
             "uid": pod["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    kube.create("resourceclaims", {
        "metadata": {"name": name, "ownerReferences": [owner],
                     "annotations": {"resource.kubernetes.io/pod-claim-name": entry}},
        "spec": template["spec"]["spec"]}, namespace=NS)  # fmt: skip
    statuses = [{"name": entry, "resourceClaimName": name}]
    kube.patch("pods", pod["metadata"]["name"], {"status": {"resourceClaimStatuses": statuses}}, NS)
    return name


def allocate(kube: KubeAPI, claim: str, pod: dict[str, Any], node: str, device: str) -> None:
    """What the scheduler does: the claim's allocation, reserved for the pod, then the pod bound."""
    request = kube.get("resourceclaims", claim, NS)["spec"]["devices"]["requests"][0]["name"]
    result = {"request": request, "driver": "gpu.nvidia.com", "pool": node, "device": device}
    status = {
        "allocation": {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"],
                         "uid": pod["metadata"]["uid"]}],
    }  # fmt: skip
    kube.patch("resourceclaims", claim, {"status": status}, NS)
    kube.patch("pods", pod["metadata"]["name"],
               {"spec": {"nodeName": node}, "status": {"phase": "Running"}}, NS)  # fmt: skip


def held(url: str, pod: str) -> list[Series]:
    """The pod's copies of one field's series."""
    status, body = get(f"{url}/metrics")
    assert status == 200
    # A free device has no pod label (DRA mode is dcgm-exporter 4.8.3's generation).
    return [
        s for s in by_name(parse(body), "DCGM_FI_DEV_FB_USED") if dict(s.labels).get("pod") == pod
    ]


def device_of(slices: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(d for s in slices for d in s["spec"].get("devices", []) if d["name"] == name)


def test_a_claim_from_a_template_reaches_metrics_with_its_dra_labels_within_a_second(
    tmp_path: Path,
) -> None:
    """Static MIG (dra-a100, mig-parted's all-balanced): three pods, each given a 1g.5gb by a
    claim made from the template and allocated from the published slices."""
    with running(tmp_path) as d:
        kube = d.kube
        url = start(d)
        slices = eventually(lambda: published(kube, "dra-a100"), timeout=20)
        scheduler = Allocator(slices)
        took = []
        for i in range(3):
            pod = kube.create("pods", pod_with_template(f"infer-{i}", "mig-1g5gb"), namespace=NS)
            claim = claim_from_template(kube, pod)
            device = scheduler.allocate("mig", "1g.5gb")
            assert device is not None
            allocate(kube, claim, pod, "dra-a100", device["name"])
            written = time.monotonic()
            (series,) = eventually(lambda p=pod: held(url, p["metadata"]["name"]), timeout=10)
            took.append(time.monotonic() - written)
            labels = dict(series.labels)
            attributes = device["attributes"]
            assert {k: labels[k] for k in DRA_LABELS} == {
                "dra_claim_name": claim, "dra_claim_namespace": NS,
                "dra_device_name": device["name"], "dra_driver_name": "gpu.nvidia.com",
                "dra_pool_name": "dra-a100"}  # fmt: skip
            assert (labels["namespace"], labels["container"]) == (NS, "ctr0")
            # The instance the slice offered: its profile, its uuid, its parent's bus address.
            assert labels["dra_mig_profile"] == labels["GPU_I_PROFILE"] == "1g.5gb"
            assert labels["dra_mig_device_uuid"] == attributes["uuid"]["string"]
            bus = attributes["resource.kubernetes.io/pciBusID"]["string"]  # 0000:07:00.0
            assert labels["pci_bus_id"] == f"0000{bus}".upper()  # DCGM's form: 00000000:07:00.0
            assert labels["UUID"] == attributes["parentUUID"]["string"]
        # Claim written to series served: the updater's coalescing window, a ConfigMap write and
        # the exporter's watch. The median, so that one slow moment of a busy machine is not it.
        assert statistics.median(took) <= 1.0, took
        assert "Traceback" not in d.log("updater-0") + d.log("exporter")


def test_dynamic_mig_makes_the_instance_a_claim_is_given_and_one_bad_claim_harms_none(
    tmp_path: Path,
) -> None:
    """--dra-dynamic-mig on dra-h100 (all-enabled): the instance appears, with the GI id the
    catalog gives its placement, when a partition is allocated, and goes when it is released.
    Its series name no pod and no claim, as dcgm-exporter 4.8 serves a DynamicMIG instance (its
    slice device has no uuid to map it by: #714), said once in the exporter's log."""
    with running(tmp_path) as d:
        kube = d.kube
        url = start(d, "--dra-dynamic-mig")
        slices = eventually(lambda: published(kube, "dra-h100"), timeout=20)
        scheduler = Allocator(slices)
        pod = kube.create("pods", pod_with_template("half", "mig-1g5gb"), namespace=NS)
        claim = claim_from_template(kube, pod)
        device = scheduler.allocate("mig", "3g.40gb")
        assert device is not None
        # Bad claims beside it: a device of no node, and one over the good one's memory slices.
        bad = []
        for i, name in enumerate(("gpu-7-mig-1g10gb-19-0", "gpu-0-mig-7g80gb-0-0")):
            other = kube.create("pods", pod_with_template(f"bad-{i}", "mig-1g5gb"), namespace=NS)
            bad.append((other, claim_from_template(kube, other), name))
        model = model_for_product(NODES["dra-h100"]["metadata"]["labels"][
            "nvidia.com/gpu.product"])  # fmt: skip
        assert model is not None
        profile = model.profile("3g.40gb")
        assert profile is not None
        start_slot = int(device["name"].rsplit("-", 1)[1])
        gi = model.gpu_instance_id(profile, start_slot)

        def instances() -> dict[str, dict[str, str]]:
            _, body = get(f"{url}/metrics")
            return {s.label("GPU_I_ID"): dict(s.labels)
                    for s in by_name(parse(body), "DCGM_FI_DEV_FB_USED")
                    if s.label("hostname") == "dra-h100" and "GPU_I_ID" in s.label_names}  # fmt: skip

        allocate(kube, claim, pod, "dra-h100", device["name"])
        eventually(lambda: str(gi) in instances(), timeout=10)
        for other, other_claim, name in bad:
            allocate(kube, other_claim, other, "dra-h100", name)
        eventually(lambda: "not placed" in d.log("updater-0"), timeout=10)
        # The good claim's instance, as the driver would have made it; the bad ones hold nothing.
        time.sleep(0.5)  # what the bad claims would have done is written by now
        found = instances()
        assert list(found) == [str(gi)]
        labels = found[str(gi)]
        assert labels["GPU_I_PROFILE"] == "3g.40gb"
        assert not labels.get("pod") and not any(k.startswith("dra_") for k in labels)
        said = eventually(lambda: d.log("exporter").count(f"{device['name']} on node dra-h100 "
                                                          "is a DynamicMIG instance"), timeout=5)  # fmt: skip
        assert said == 1
        for i in range(len(bad)):
            assert held(url, f"bad-{i}") == []
        log = d.log("updater-0")
        assert "device gpu-7-mig-1g10gb-19-0 is not on node dra-h100: not placed" in log
        assert "overlaps instance 3g.40gb" in log

        # Released (the pod ended, the claim deallocated): the driver destroys the instance. (The
        # bad claims go first: the 7g.80gb would fit once the 3g.40gb is gone.)
        for _, other_claim, _ in bad:
            kube.delete("resourceclaims", other_claim, NS)
        kube.patch("resourceclaims", claim, {"status": {"allocation": None, "reservedFor": None}},
                   NS)  # fmt: skip
        eventually(lambda: not instances(), timeout=10)
        assert "Traceback" not in d.log("updater-0") + d.log("exporter")


def test_claim_status_names_a_dynamic_instance_and_the_exporter_attributes_it_by_it(
    tmp_path: Path,
) -> None:
    """--dra-claim-status on both: the updater writes the claim's device with the uuid of the
    instance made for it into status.devices (the driver's #1456 design), keeping another
    driver's entry, and clears it on release; the exporter serves the instance with the claim's
    labels and that uuid as dra_mig_device_uuid."""
    with running(tmp_path) as d:
        kube = d.kube
        url = start(d, "--dra-dynamic-mig", "--dra-claim-status",
                    exporter_args=("--dra-claim-status",))  # fmt: skip
        slices = eventually(lambda: published(kube, "dra-h100"), timeout=20)
        pod = kube.create("pods", pod_with_template("half", "mig-1g5gb"), namespace=NS)
        claim = claim_from_template(kube, pod)
        other = {"driver": "net.example.com", "pool": "dra-h100", "device": "nic-0",
                 "conditions": [], "data": {"mac": "00:00:5e:00:53:01"}}  # fmt: skip
        kube.patch("resourceclaims", claim, {"status": {"devices": [other]}}, NS)
        device = Allocator(slices).allocate("mig", "3g.40gb")
        assert device is not None
        allocate(kube, claim, pod, "dra-h100", device["name"])

        def said() -> list[dict[str, Any]]:
            return kube.get("resourceclaims", claim, NS)["status"].get("devices") or []

        found = eventually(lambda: [e for e in said() if e["driver"] == "gpu.nvidia.com"],
                           timeout=10)  # fmt: skip
        (entry,) = found
        assert (entry["pool"], entry["device"]) == ("dra-h100", device["name"])
        assert [c["type"] for c in entry["conditions"]] == ["Ready"]
        assert other in said()
        (series,) = eventually(lambda: held(url, "half"), timeout=10)
        labels = dict(series.labels)
        assert labels["dra_device_name"] == device["name"]
        assert labels["dra_mig_device_uuid"] == entry["data"]["uuid"]
        assert entry["data"]["uuid"].startswith("MIG-")

        # Released: the entry goes, another driver's stays.
        kube.patch("resourceclaims", claim, {"status": {"allocation": None, "reservedFor": None}},
                   NS)  # fmt: skip
        eventually(lambda: said() == [other], timeout=10)
        assert "Traceback" not in d.log("updater-0") + d.log("exporter")
