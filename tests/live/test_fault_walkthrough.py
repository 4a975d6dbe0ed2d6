"""docs/faults.md's walkthrough, step by step: a fleet fault policy in a KWOK-like cluster.

The updater (with DRA, as deploy/dra/ runs it) and the all-nodes exporter are processes against
the emulated API, with the sample DRA nodes (samples/mig/dra/nodes.yaml) and the sample policy
(samples/mig/faults/xid48-policy.yaml, its start moved to two seconds from now: the sample waits
one to three minutes). The test plays the scheduler (tests/support/allocator.py keeps claims off
NoSchedule devices, as kube-scheduler does under DRADeviceTaints), and a real Prometheus
(Debian's) scrapes the exporter with the shipped PrometheusRule.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.live.test_dra import (
    NS,
    allocate,
    claim_from_template,
    pod_with_template,
    published,
    start,
)
from tests.live.test_live import NS as UPDATER_NS
from tests.live.test_live import running
from tests.live.test_prometheus import query_at, start_prometheus
from tests.pipeline.test_cli import get
from tests.support.allocator import Allocator
from tests.support.base import ROOT, SAMPLES
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import by_name, parse
from topology.model import time_text

POLICY = yaml.safe_load((SAMPLES / "faults" / "xid48-policy.yaml").read_text())
RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"


@contextmanager
def prometheus(exporter: str, work: Path) -> Iterator[str]:
    """Prometheus scraping the exporter's /metrics every second with the shipped rules."""
    rules = yaml.safe_load(RULE.read_text())["spec"]
    targets = [{"targets": [exporter.removeprefix("http://")]}]
    proc, url = start_prometheus(work, rules, targets, honor_labels=True)
    try:
        eventually(lambda: query_at(url, "up == 1", time.time()), timeout=30)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def firing(url: str) -> set[tuple[str, str, str]]:
    """(alert, node, GPU) of every health alert firing."""
    return {(a["metric"]["alertname"], a["metric"]["Hostname"], a["metric"]["gpu"])
            for a in query_at(url, 'ALERTS{alertname=~"Gpu.*",alertstate="firing"}', time.time())}  # fmt: skip


def policy_starting_at(at: float) -> dict[str, Any]:
    cm = copy.deepcopy(POLICY)
    spec = yaml.safe_load(cm["data"]["policy.yaml"])
    spec["start"] = {"at": time_text(int(at))}
    cm["data"]["policy.yaml"] = yaml.safe_dump(spec)
    return cm


def status(kube: KubeAPI) -> dict[str, Any] | None:
    cm = kube.get("configmaps", POLICY["metadata"]["name"], UPDATER_NS)
    text = (cm["metadata"].get("annotations") or {}).get("mig-exporter/fault-status")
    return json.loads(text) if text else None


def device_gpu(device: dict[str, Any]) -> int:
    """The GPU index a device of the driver's is on (`gpu-<minor>…`)."""
    return int(device["name"].split("-")[1])


def test_a_fleet_policy_reaches_the_series_the_taints_and_the_scheduler(tmp_path: Path) -> None:
    with running(tmp_path) as d:
        kube = d.kube
        url = start(d)
        eventually(lambda: published(kube, "dra-a100"), timeout=20)
        with prometheus(url, tmp_path) as prom:
            at = time.time() + 2
            kube.create("configmaps", policy_starting_at(at), namespace=UPDATER_NS)

            # 1. What it hit, at once: two GPUs (the sample's count), each with its start.
            said = eventually(lambda: status(kube), timeout=10)
            assert said["gpus"] == 2 and len(said["hits"]) == 2
            hits = {(h["node"], h["gpu"]) for h in said["hits"]}
            assert all(h["since"] == time_text(int(at)) for h in said["hits"])

            # 2. The topology: each hit GPU's fault, with its start, in its node's document.
            for node, gpu in hits:
                doc = yaml.safe_load(
                    kube.get("configmaps", f"topology-{node}", UPDATER_NS)["data"]["topology.yml"]
                )
                (fault,) = doc["nodes"][node]["gpus"][gpu]["faults"]
                assert (fault["fault"], fault["xid"], fault["source"]) == (
                    "xid",
                    48,
                    "policy/xid48",
                )

            # 3. The series: from the start on, a hit node's page shows Xid 48 on the GPU hit.
            def xid(node: str) -> dict[str, float]:
                code, body = get(f"{url}/metrics/nodes/{node}")
                assert code == 200
                return {dict(s.labels)["gpu"]: s.value
                        for s in by_name(parse(body), "DCGM_FI_DEV_XID_ERRORS")}  # fmt: skip

            for node, gpu in hits:
                eventually(lambda n=node, g=gpu: xid(n).get(str(g)) == 48, timeout=15)
            assert time.time() >= at

            # 4. Prometheus: the fatal-Xid alert fires for each GPU hit, and no other alert.
            expected = {("GpuXidFatal", node, str(gpu)) for node, gpu in hits}
            eventually(lambda: firing(prom) == expected, timeout=20, interval=0.5)

            # 5. The taints: every published device of a hit GPU, and no other.
            def tainted() -> dict[tuple[str, str], list[dict[str, str]]] | None:
                found = {}
                for node in ("dra-a100", "dra-h100", "dra-a100-80gb"):
                    slices = published(kube, node)
                    if slices is None:
                        return None
                    for s in slices:
                        for dev in s["spec"]["devices"]:
                            found[(node, dev["name"])] = dev.get("taints", [])
                return found

            def settled() -> dict[tuple[str, str], list[dict[str, str]]] | None:
                found = tainted()
                return found if found and any(found.values()) else None

            devices = eventually(settled, timeout=15)
            xid48 = [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]
            for (node, name), taints in devices.items():
                hit = (node, int(name.split("-")[1])) in hits
                assert taints == (xid48 if hit else []), (node, name)

            # 6. A claim keeps off them: the scheduler allocates 1g.5gb instances on dra-a100 from
            # its untainted GPU only, and none once those are taken.
            slices = published(kube, "dra-a100")
            assert slices is not None
            scheduler = Allocator(slices)
            free = [dev for s in slices for dev in s["spec"]["devices"]
                    if dev["attributes"]["profile"]["string"] == "1g.5gb"
                    and ("dra-a100", device_gpu(dev)) not in hits]  # fmt: skip
            for i in range(len(free)):
                pod = kube.create("pods", pod_with_template(f"job-{i}", "mig-1g5gb"), namespace=NS)
                claim = claim_from_template(kube, pod)
                device = scheduler.allocate("mig", "1g.5gb")
                assert device is not None and ("dra-a100", device_gpu(device)) not in hits
                allocate(kube, claim, pod, "dra-a100", device["name"])
            if any(node == "dra-a100" for node, _ in hits):
                assert scheduler.allocate("mig", "1g.5gb") is None  # the rest are tainted
                tolerant = scheduler.allocate("mig", "1g.5gb", frozenset({"gpu.nvidia.com/xid"}))
                assert tolerant is not None and ("dra-a100", device_gpu(tolerant)) in hits

            # 7. Clear: the policy deleted, the taints go and the Xid with them.
            kube.delete("configmaps", POLICY["metadata"]["name"], UPDATER_NS)
            eventually(lambda: (found := tainted()) is not None and not any(found.values()),
                       timeout=15)  # fmt: skip
            # The exporter serves DRA as 4.8.3 and later do: no Xid series before the next Xid.
            for node, gpu in hits:
                eventually(lambda n=node, g=gpu: str(g) not in xid(n), timeout=15)
            eventually(lambda: not firing(prom), timeout=20, interval=0.5)
