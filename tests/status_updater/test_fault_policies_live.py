"""Faults in a running updater (`status_updater run`, in this process against the API emulator,
with DRA slices): a fault policy ConfigMap created, edited badly and deleted, and a Node's fault
annotation with a start ahead, as a user sees them in the topology ConfigMap, the policy's
`mig-exporter/fault-status` annotation, the logs and the ResourceSlices."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from status_updater import faults
from status_updater.dra import DraOptions
from tests.status_updater.test_daemon import NS, run_daemon
from tests.status_updater.test_reconcile import whole_gpu_node
from tests.support.kubeapi import KubeAPI, eventually
from topology import faults as catalog
from topology.model import NodeTopology, load_yaml, parse_time, time_text

STATIC = DraOptions("type=kwok", dynamic_mig=False)
POLICY = {"nodeSelector": "type=kwok", "gpus": {"count": 1},
          "fault": {"fault": "ecc-dbe", "count": 4}}  # fmt: skip


def policy_cm(body: object) -> dict[str, Any]:
    return {"metadata": {"name": "dbe", "labels": {faults.POLICY_LABEL: "true"}},
            "data": {faults.POLICY_KEY: yaml.safe_dump(body)}}  # fmt: skip


def topology(kube: KubeAPI) -> NodeTopology | None:
    cm = kube.find("configmaps", "topology-k80", NS)
    return load_yaml(cm["data"]["topology.yml"]).nodes["k80"] if cm else None


def sources(kube: KubeAPI) -> list[list[str]]:
    topo = topology(kube)
    return [[f.source for f in g.faults] for g in topo.gpus] if topo else []


def taints(kube: KubeAPI) -> dict[str, list[dict[str, str]]]:
    return {
        d["name"]: d.get("taints", [])
        for s in kube.list_objects("resourceslices")
        if s["spec"]["pool"]["name"] == "k80"
        for d in s["spec"].get("devices", [])
    }


def status(kube: KubeAPI) -> dict[str, Any] | None:
    cm = kube.find("configmaps", "dbe", NS)
    text = ((cm or {}).get("metadata", {}).get("annotations") or {}).get(faults.STATUS_ANNOTATION)
    return json.loads(text) if text else None


def test_a_policy_and_an_annotation_in_a_running_updater(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with KubeAPI.start() as kube:
        node = whole_gpu_node("k80")
        node["metadata"]["labels"]["type"] = "kwok"
        kube.create("nodes", node)

        def scenario() -> None:
            eventually(lambda: taints(kube) == {"gpu-0": [], "gpu-1": []}, timeout=10)
            assert sources(kube) == [[], []]

            # A policy: one GPU of the selected nodes gets 4 double-bit ECC errors (Xid 48).
            created = kube.create("configmaps", policy_cm(POLICY), namespace=NS)
            since = created["metadata"]["creationTimestamp"]
            hit = eventually(lambda: next((i for i, s in enumerate(sources(kube)) if s), None))
            assert sources(kube)[hit] == ["policy/dbe"] and sources(kube)[1 - hit] == []
            (fault,) = topology(kube).gpus[hit].faults  # type: ignore[union-attr]
            assert (fault.fault, fault.count, fault.since, fault.until) == (
                "ecc-dbe", 4, parse_time(since), None)  # fmt: skip
            assert eventually(lambda: status(kube)) == {
                "gpus": 1,
                "nodes": 1,
                "hits": [{"node": "k80", "gpu": hit, "since": since}],
            }
            xid48 = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]
            eventually(lambda: taints(kube)[f"gpu-{hit}"] == xid48, timeout=5)

            # A bad edit: said once, the last good policy kept; again the same: not said again.
            bad = {**POLICY, "fault": {"fault": "fire"}}
            kube.replace("configmaps", "dbe", policy_cm(bad), namespace=NS)
            eventually(lambda: any("(fault policy)" in m for m in caplog.messages), timeout=5)
            kube.patch("configmaps", "dbe", {"metadata": {"labels": {"edited": "twice"}}}, NS)

            # A fault on the other GPU with its start two seconds ahead, for two seconds: its
            # slice is tainted once it begins, and no longer once it ends.
            start = int(time.time()) + 2
            entry = {"gpu": 1 - hit, "fault": "xid", "xid": 13, "since": time_text(start),
                     "for": "2s"}  # fmt: skip
            annotations = {catalog.ANNOTATION: json.dumps([entry])}
            kube.patch("nodes", "k80", {"metadata": {"annotations": annotations}})
            eventually(lambda: sources(kube)[1 - hit] == ["annotation"], timeout=5)
            assert taints(kube)[f"gpu-{1 - hit}"] == [] or time.time() >= start
            xid13 = [{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}]
            eventually(lambda: taints(kube)[f"gpu-{1 - hit}"] == xid13, timeout=5)
            assert time.time() >= start
            eventually(lambda: taints(kube)[f"gpu-{1 - hit}"] == [], timeout=5)
            assert time.time() >= start + 2
            # The bad policy was never taken: its fault is still there.
            assert sources(kube)[hit] == ["policy/dbe"]
            assert taints(kube)[f"gpu-{hit}"] == xid48

            # Deleted: its fault is cleared, and what it counted stays counted.
            kube.delete("configmaps", "dbe", NS)
            eventually(lambda: sources(kube)[hit] == [], timeout=5)
            assert dict(topology(kube).gpus[hit].counted) == {catalog.DBE: 4}  # type: ignore[union-attr]
            eventually(lambda: taints(kube)[f"gpu-{hit}"] == [], timeout=5)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario, STATIC) == 0
    said = [m for m in caplog.messages if "(fault policy)" in m]
    assert said == [
        "configmap gpu-ops/dbe (fault policy): data[policy.yaml].fault.fault: must be one of "
        f"{', '.join(catalog.CATALOG)}, got 'fire'; its last good version is kept"
    ]


def test_without_dra_a_node_label_counts_the_gpus_a_device_plugin_would_mark_unhealthy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--fault-node-labels: `mig-exporter/unhealthy-gpus` while a fatal Xid lasts (not for
    Xid 13, the application's), every GPU of the node for a lost one, gone once cleared."""
    with KubeAPI.start() as kube:
        kube.create("nodes", whole_gpu_node("k80"))

        def label() -> str | None:
            return (kube.get("nodes", "k80")["metadata"].get("labels") or {}).get(
                faults.UNHEALTHY_LABEL
            )

        def annotate(entries: list[dict[str, Any]] | None) -> None:
            text = None if entries is None else json.dumps(entries)
            kube.patch("nodes", "k80", {"metadata": {"annotations": {catalog.ANNOTATION: text}}})

        def scenario() -> None:
            eventually(lambda: topology(kube) is not None, timeout=10)
            annotate([{"gpu": 0, "fault": "xid", "xid": 13}])
            eventually(lambda: sources(kube) == [["annotation"], []], timeout=5)
            time.sleep(0.5)  # a turn of the writer: no label for the application's Xid
            assert label() is None
            annotate([{"gpu": 1, "fault": "xid", "xid": 48}])
            eventually(lambda: label() == "1", timeout=5)
            annotate([{"gpu": 1, "fault": "lost"}])
            eventually(lambda: label() == "2", timeout=5)  # GPU_IS_LOST: all of them
            annotate(None)
            eventually(lambda: label() is None, timeout=5)

        assert run_daemon(kube, tmp_path, monkeypatch, "per-node", 30.0, scenario,
                          node_labels=True) == 0  # fmt: skip
