"""The two daemons as a user runs them: real processes, the official client over HTTP, a kubeconfig,
against kmock's KubernetesEmulator on 127.0.0.1 (plain, and extended with resourceVersions,
410 Gone, 409 conflicts and stream cuts in tests/support/kubeapi.py)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.pipeline.test_cli import free_port, get
from tests.support.base import ROOT, SAMPLES
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import by_name, parse

NS = "gpu-operator"
NODE = "qa-mig-worker-gpu-a100"
REAL_NODE: dict[str, Any] = yaml.safe_load(
    (SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text()
)


class Daemons:
    def __init__(self, kube: KubeAPI, tmp_path: Path, layout: str = "per-node") -> None:
        self.kube = kube
        self.layout = layout
        self.kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        self.procs: list[subprocess.Popen[str]] = []
        self.logs = tmp_path
        self.health_urls: dict[str, str] = {}

    def start(self, *args: str, name: str) -> subprocess.Popen[str]:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "TOPOLOGY_CM_NAMESPACE": NS,
               "POD_NAME": name, "PYTHONUNBUFFERED": "1", "TOPOLOGY_LAYOUT": self.layout}  # fmt: skip
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = (self.logs / f"{name}.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=log, stderr=log, text=True
        )
        self.procs.append(proc)
        return proc

    def updater(self, name: str = "updater-0", *args: str) -> subprocess.Popen[str]:
        """An updater, its /health and /metrics on a port of its own (`health_url(name)`)."""
        port = free_port()
        self.health_urls[name] = f"http://127.0.0.1:{port}"
        return self.start("status_updater", "run", "--metrics-address", "127.0.0.1",
                          "--metrics-port", str(port), *args, name=name)  # fmt: skip

    def exporter(self, *args: str, name: str = "exporter") -> str:
        port = free_port()
        args = args or ("--node-name", NODE)
        self.start("exporter", *args, "--address", "127.0.0.1", "--port", str(port), name=name)
        return f"http://127.0.0.1:{port}"

    @property
    def configmap(self) -> str:
        """The ConfigMap that holds NODE in this layout."""
        return "topology" if self.layout == "single" else f"topology-{NODE}"

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text()

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


LAYOUTS = ["per-node", "single"]


@pytest.fixture(params=[(s, layout) for s in (True, False) for layout in LAYOUTS],
                ids=lambda p: f"{'strict-emulator' if p[0] else 'plain-kmock'}-{p[1]}")  # fmt: skip
def daemons(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemons]:
    strict, layout = request.param
    with running(tmp_path, strict=strict, layout=layout) as d:
        yield d


@contextmanager
def running(tmp_path: Path, *, strict: bool = True, layout: str = "per-node") -> Iterator[Daemons]:
    """An emulated API and the daemons started on it, all stopped at the end."""
    with KubeAPI.start(strict=strict) as kube:
        d = Daemons(kube, tmp_path, layout)
        try:
            yield d
        finally:
            d.stop()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def topology(d: Daemons) -> dict[str, Any] | None:
    """The document of the ConfigMap that holds NODE (None when there is no such ConfigMap)."""
    cm = d.kube.find("configmaps", d.configmap, NS)
    return yaml.safe_load(cm["data"]["topology.yml"]) if cm else None


def mig_devices(d: Daemons) -> list[dict[str, Any]] | None:
    t = topology(d)
    node = (t or {}).get("nodes", {}).get(NODE)
    return node["gpus"][0].get("mig-devices") if node else None


def fb(url: str) -> dict[str, tuple[str, float]]:
    """GI id -> (profile, FB_USED) as the exporter serves it."""
    series = by_name(parse(get(f"{url}/metrics")[1]), "DCGM_FI_DEV_FB_USED")
    return {s.label("GPU_I_ID"): (s.label("GPU_I_PROFILE"), s.value) for s in series}


def node_object(config: str | None = None, mapping: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = REAL_NODE["metadata"]
    annotations = {}
    if config is not None:
        annotations["run.ai/mig.config"] = config
    if mapping is not None:
        annotations["run.ai/mig-mapping"] = base64.b64encode(json.dumps(mapping).encode()).decode()
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": meta["labels"], "annotations": annotations}}  # fmt: skip


def mig_pod(name: str, position: int, fb_used: int) -> dict[str, Any]:
    device = {
        "name": "nvidia.com/mig-1g.5gb",
        "position": position,
        "gpuamount": 1,
        "gpuindex": "0",
    }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "runai-p1", "uid": f"uid-{name}",
                     "annotations": {"runai-mig-device": json.dumps(device), "run.ai/simulated-fb-used": str(fb_used)}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "gpu-burn"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


FOUR_SMALL = "mig-configs: {selected: [{devices: [0], mig-enabled: true, mig-devices: {0: 1g.5gb, 1: 1g.5gb, 4: 1g.5gb, 6: 1g.5gb}}]}"
ONE_BIG = "mig-configs: {selected: [{devices: [0], mig-enabled: true, mig-devices: [{name: 7g.40gb, position: 0, size: 8}]}]}"


def test_cluster_changes_reach_the_configmap_and_metrics(daemons: Daemons) -> None:
    kube = daemons.kube
    daemons.updater()
    url = daemons.exporter()
    # The exporter has no topology yet: it says so.
    _status, reason = eventually(lambda: (r := get(f"{url}/health"))[0] == 503 and r, timeout=20)
    assert "ConfigMap gpu-operator/topology" in reason or "no topology" in reason

    # Node annotated: the topology appears, devices without ids until the mapping names them.
    kube.create("nodes", node_object(FOUR_SMALL))
    devices = eventually(lambda: mig_devices(daemons), timeout=20)
    assert [(d["name"], d["position"], d.get("id")) for d in devices] == [
        ("1g.5gb", 0, None), ("1g.5gb", 1, None), ("1g.5gb", 4, None), ("1g.5gb", 6, None)]  # fmt: skip
    mapping = {"0": [{"position": p, "device_uuid": f"MIG-{p}", "gpu_instance_id": gi}
                     for p, gi in ((0, 11), (1, 12), (4, 7), (6, 9))]}  # fmt: skip
    kube.patch(
        "nodes",
        NODE,
        {"metadata": {"annotations": node_object(FOUR_SMALL, mapping)["metadata"]["annotations"]}},
    )
    eventually(
        lambda: (
            [d.get("id") for d in mig_devices(daemons) or []]
            == ["MIG-0", "MIG-1", "MIG-4", "MIG-6"]
        ),
        timeout=10,
    )
    eventually(lambda: get(f"{url}/health")[0] == 200, timeout=10)
    assert fb(url) == {
        "11": ("1g.5gb", 6),
        "12": ("1g.5gb", 6),
        "7": ("1g.5gb", 6),
        "9": ("1g.5gb", 6),
    }

    # A pod takes the instance at position 6: its FB_USED rises.
    kube.create("pods", mig_pod("burn", 6, 4384), namespace="runai-p1")
    eventually(lambda: fb(url)["9"] == ("1g.5gb", 4384), timeout=10)
    held = next(d for d in mig_devices(daemons) or [] if d["position"] == 6)
    holder = dict(held["status"]["allocated-by"])
    assert holder.pop("pod-uid")  # the pod's metadata.uid, for pod_uid
    assert holder == {
        "namespace": "runai-p1",
        "pod": "burn",
        "container": "main",
    }

    # Pod deleted: released.
    kube.delete("pods", "burn", namespace="runai-p1")
    eventually(lambda: fb(url)["9"] == ("1g.5gb", 6), timeout=10)

    # Re-partitioned into one 7g.40gb: /metrics follows.
    kube.patch(
        "nodes",
        NODE,
        {"metadata": {"annotations": {"run.ai/mig.config": ONE_BIG, "run.ai/mig-mapping": None}}},
    )
    eventually(lambda: fb(url) == {"0": ("7g.40gb", 6)}, timeout=10)

    # Node deleted: its entry goes. The exporter (whose pod would go with the node) keeps the
    # last good series and says why it is stale.
    kube.delete("nodes", NODE)
    if daemons.layout == "single":
        eventually(lambda: topology(daemons) == {"mig-strategy": "none", "nodes": {}}, timeout=10)
        gone = f"nodes.{NODE}: is not in the topology"
    else:  # its own ConfigMap goes with it
        eventually(lambda: kube.find("configmaps", daemons.configmap, NS) is None, timeout=10)
        gone = f"ConfigMap {NS}/topology-{NODE}: not found"
    _, reason = eventually(lambda: (r := get(f"{url}/health"))[0] == 503 and r, timeout=10)
    assert gone in reason
    assert fb(url) == {"0": ("7g.40gb", 6)}


def test_two_replicas_one_writer(daemons: Daemons) -> None:
    kube = daemons.kube
    kube.create("nodes", node_object(FOUR_SMALL))
    a, b = daemons.updater("updater-a"), daemons.updater("updater-b")
    eventually(lambda: mig_devices(daemons), timeout=20)
    lease = eventually(lambda: kube.find("leases", "topology-status-updater", NS), timeout=10)
    leader = lease["spec"]["holderIdentity"]
    assert leader in ("updater-a", "updater-b")
    for i in range(5):
        kube.create("pods", mig_pod(f"p{i}", [0, 1, 4, 6][i % 4], 100 + i), namespace="runai-p1")
    eventually(lambda: sum("status" in d for d in mig_devices(daemons) or []) == 4, timeout=10)
    time.sleep(1)
    follower = "updater-b" if leader == "updater-a" else "updater-a"
    # The standby waits without spinning while events arrive that it must not write.
    standby = b if leader == "updater-a" else a
    before = cpu_seconds(standby.pid)
    kube.create("pods", mig_pod("p-extra", 1, 7), namespace="runai-p1")
    time.sleep(2)
    assert cpu_seconds(standby.pid) - before < 0.5
    assert "wrote ConfigMap" in daemons.log(leader)
    assert "wrote ConfigMap" not in daemons.log(follower)
    assert "device already held by" in daemons.log(leader)  # the fifth pod asks for a taken device

    # The leader stops (SIGTERM: exit 0 within 2 s); the standby takes over and keeps writing.
    proc = a if leader == "updater-a" else b
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=5) == 0
    assert time.monotonic() - started < 2
    eventually(
        lambda: (
            kube.find("leases", "topology-status-updater", NS)["spec"]["holderIdentity"] == follower
        ),
        timeout=20,
    )
    # p0 goes; p4, which waited for the same instance, now holds it.
    kube.delete("pods", "p0", namespace="runai-p1")
    at_zero = lambda: next(d for d in mig_devices(daemons) or [] if d["position"] == 0)  # noqa: E731
    eventually(lambda: at_zero()["status"]["allocated-by"]["pod"] == "p4", timeout=15)
    # Said just after the write it reports, which the test may see first.
    eventually(lambda: "wrote ConfigMap" in daemons.log(follower), timeout=5)
    assert "Traceback" not in daemons.log(leader) + daemons.log(follower)


@pytest.fixture(params=LAYOUTS)
def strict(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemons]:
    with KubeAPI.start(strict=True) as kube:
        d = Daemons(kube, tmp_path, request.param)
        try:
            yield d
        finally:
            d.stop()


def test_watch_recovers_from_410_cuts_and_errors(strict: Daemons) -> None:
    kube = strict.kube
    strict.updater()
    url = strict.exporter()
    kube.create("nodes", node_object(FOUR_SMALL))
    eventually(lambda: len(fb(url)) == 4, timeout=20)
    # Watches expire (410 Gone), streams are cut, and the API answers 500 a few times.
    kube.expire_watches(4)
    kube.cut_watches(abort=True)
    kube.fail_next(3, status=500, action="list")
    kube.create("pods", mig_pod("after-faults", 4, 321), namespace="runai-p1")
    eventually(lambda: fb(url)["7"] == ("1g.5gb", 321), timeout=20)
    kube.compact()
    kube.cut_watches()
    kube.delete("pods", "after-faults", namespace="runai-p1")
    eventually(lambda: fb(url)["7"] == ("1g.5gb", 6), timeout=20)
    assert "Traceback" not in strict.log("updater-0") + strict.log("exporter")


def test_exporter_keeps_the_last_good_topology(strict: Daemons) -> None:
    kube = strict.kube
    strict.updater()
    url = strict.exporter()
    kube.create("nodes", node_object(ONE_BIG))
    eventually(lambda: fb(url) == {"0": ("7g.40gb", 6)}, timeout=20)
    assert get(f"{url}/health") == (200, "ok\n")
    # Someone breaks the ConfigMap: metrics stay, health says why in one line.
    kube.patch("configmaps", strict.configmap, {"data": {"topology.yml": "nodes: ["}}, namespace=NS)
    _status, reason = eventually(lambda: (r := get(f"{url}/health"))[0] == 503 and r, timeout=10)
    assert "not valid YAML" in reason and len(reason.strip().splitlines()) == 1
    assert fb(url) == {"0": ("7g.40gb", 6)}


def test_pod_storm_gives_few_writes_and_a_conflict_is_reapplied(strict: Daemons) -> None:
    kube = strict.kube
    strict.updater()
    kube.create("nodes", node_object(FOUR_SMALL))
    eventually(lambda: mig_devices(strict), timeout=20)
    time.sleep(0.5)

    def writes() -> int:
        return sum(
            e.method in ("PATCH", "POST") and "/configmaps" in e.path for e in kube.journal()
        )

    before = writes()
    for i in range(60):  # a storm: 4 GPU pods among 56 others coming and going
        if i < 4:
            kube.create("pods", mig_pod(f"gpu-{i}", [0, 1, 4, 6][i], 100 + i), namespace="runai-p1")
        else:
            other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"web-{i}", "namespace": "web"},
                     "spec": {"nodeName": "cpu-node", "containers": [{"name": "web", "image": "nginx"}]},
                     "status": {"phase": "Running"}}  # fmt: skip
            kube.create("pods", other, namespace="web")
    eventually(lambda: sum("status" in d for d in mig_devices(strict) or []) == 4, timeout=10)
    time.sleep(1)
    assert writes() - before <= 8, (
        "a burst of pod events should coalesce into a few ConfigMap writes"
    )

    # The API answers 409 to the next write: the updater re-reads and applies again.
    kube.fail_next(1, status=409, method="PATCH", plural="configmaps")
    kube.delete("pods", "gpu-0", namespace="runai-p1")
    at_zero = lambda: next(d for d in mig_devices(strict) or [] if d["position"] == 0)  # noqa: E731
    eventually(lambda: "status" not in at_zero(), timeout=10)
    assert any(e.fault == 409 for e in kube.journal())


def test_configmap_change_reaches_metrics_within_a_second(strict: Daemons) -> None:
    kube = strict.kube
    url = strict.exporter()
    sample = "a100-40gb-active.yaml" if strict.layout == "single" else f"topology-{NODE}.yaml"
    text = (SAMPLES / "topology" / sample).read_text()
    kube.create("configmaps", yaml.safe_load(text), namespace=NS)
    eventually(lambda: len(fb(url)) == 3, timeout=20)
    inner = yaml.safe_load(yaml.safe_load(text)["data"]["topology.yml"])
    inner["nodes"][NODE]["gpus"][0]["mig-devices"] = [
        {"name": "7g.40gb", "position": 0, "gpu-instance-id": 0}
    ]
    kube.patch(
        "configmaps",
        strict.configmap,
        {"data": {"topology.yml": yaml.safe_dump(inner)}},
        namespace=NS,
    )
    eventually(lambda: fb(url) == {"0": ("7g.40gb", 6)}, timeout=1.0)
    # Deleted: the last good series stay, health says the ConfigMap is gone.
    kube.delete("configmaps", strict.configmap, namespace=NS)
    _status, reason = eventually(lambda: (r := get(f"{url}/health"))[0] == 503 and r, timeout=5)
    assert reason.startswith(f"ConfigMap gpu-operator/{strict.configmap}: not found")
    assert fb(url) == {"0": ("7g.40gb", 6)}


def test_bad_pods_never_stop_writes_and_a_reapplied_seed_is_repaired(strict: Daemons) -> None:
    kube = strict.kube
    strict.updater("updater-0", "--resync", "1")
    kube.create("nodes", node_object(FOUR_SMALL))
    eventually(lambda: mig_devices(strict), timeout=20)
    bad = mig_pod("bad-index", 0, 5)
    bad["metadata"]["annotations"]["runai-mig-device"] = bad["metadata"]["annotations"][
        "runai-mig-device"
    ].replace('"0"', '"--0"')
    huge = mig_pod("huge", 1, 5)
    huge["metadata"]["annotations"]["run.ai/simulated-fb-used"] = "1e400%"
    kube.create("pods", bad, namespace="runai-p1")
    kube.create("pods", huge, namespace="runai-p1")
    kube.create("pods", mig_pod("good", 4, 42), namespace="runai-p1")
    by_position = lambda: {d["position"]: d for d in mig_devices(strict) or []}  # noqa: E731
    eventually(
        lambda: by_position()[4].get("status", {}).get("allocated-by", {}).get("pod") == "good",
        timeout=10,
    )
    assert "status" in by_position()[1]  # held with the default usage
    assert "status" not in by_position()[0]
    log = strict.log("updater-0")
    assert (
        "pod runai-p1/bad-index: metadata.annotations[runai-mig-device].gpuindex: expected an integer, got '--0'"
        in log
    )
    assert (
        "pod runai-p1/huge: metadata.annotations[run.ai/simulated-fb-used]: need 0% to 100%, got '1e400%'"
        in log
    )

    # Someone else writes the ConfigMap (single: `kubectl apply -k deploy/` puts the empty seed
    # back): the leader notices and rewrites it.
    seed = yaml.safe_load(
        (ROOT / "deploy" / "single-layout" / "topology-configmap.yaml").read_text()
    )
    kube.patch("configmaps", strict.configmap, {"data": seed["data"]}, namespace=NS)
    assert topology(strict)["nodes"] in ({}, None)
    eventually(lambda: len(mig_devices(strict) or []) == 4, timeout=10)
    assert "Traceback" not in strict.log("updater-0")


def test_daemons_report_unusable_config_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "NODE_NAME": NODE}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    for args in (["exporter", "--port", "0"], ["status_updater", "run"]):
        result = subprocess.run(
            [sys.executable, "-m", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith(f"error: kubeconfig {tmp_path / 'missing'}:")
        assert len(result.stderr.strip().splitlines()) == 1
    result = subprocess.run([sys.executable, "-m", "exporter", "--port", "70000"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2 and "expected a port 0-65535, got '70000'" in result.stderr


def test_per_node_configmaps_follow_their_nodes_and_others_are_left_alone(tmp_path: Path) -> None:
    with KubeAPI.start(strict=True) as kube:
        d = Daemons(kube, tmp_path, "per-node")
        try:
            other = dict(
                node_object(FOUR_SMALL),
                metadata={**node_object(FOUR_SMALL)["metadata"], "name": "other"},
            )
            kube.create("nodes", node_object(FOUR_SMALL))
            kube.create("nodes", other)
            # Someone else's ConfigMap already has the name the updater would give "other".
            foreign = kube.create("configmaps", {"metadata": {"name": "topology-other"},
                                                 "data": {"topology.yml": "mine: true\n"}}, namespace=NS)  # fmt: skip
            d.updater()
            eventually(lambda: mig_devices(d), timeout=20)
            eventually(
                lambda: "exists and was not created by the updater" in d.log("updater-0"),
                timeout=10,
            )
            assert kube.get("configmaps", "topology-other", NS) == foreign

            # Deleted by hand: written again.
            kube.delete("configmaps", d.configmap, namespace=NS)
            eventually(lambda: mig_devices(d), timeout=10)

            # No GPU node any more (its GPU label removed): its ConfigMap goes.
            kube.patch("nodes", NODE, {"metadata": {"labels": {"nvidia.com/gpu.product": None}}})
            eventually(lambda: kube.find("configmaps", d.configmap, NS) is None, timeout=10)
            assert kube.get("configmaps", "topology-other", NS) == foreign
            assert "Traceback" not in d.log("updater-0")
        finally:
            d.stop()


def test_updater_health_and_own_metrics(strict: Daemons) -> None:
    kube = strict.kube
    kube.create("nodes", node_object(FOUR_SMALL))
    bad = json.loads(json.dumps(node_object(FOUR_SMALL)))
    bad["metadata"]["name"] = "bad-node"
    bad["metadata"]["labels"]["nvidia.com/gpu.count"] = "lots"
    kube.create("nodes", bad)
    strict.updater("updater-0")
    url = strict.health_urls["updater-0"]
    eventually(lambda: mig_devices(strict), timeout=20)
    eventually(lambda: get(f"{url}/health") == (200, "ok\n"), timeout=3)  # published each second
    _, text = get(f"{url}/metrics")
    series = {
        (s.name, tuple(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert series[("mig_status_updater_invalid_objects_total", (("kind", "node"),))] == 1
    assert series[("mig_status_updater_invalid_objects_total", (("kind", "pod"),))] == 0
    assert series[("mig_status_updater_leader", ())] == 1
    assert get(f"{url}/nothing")[0] == 404
    assert "metadata.labels[nvidia.com/gpu.count]: expected an integer, got 'lots'" in (
        strict.log("updater-0")
    )
