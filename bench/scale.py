"""The status-updater and the many-nodes exporter at the planned scale, beside the old ways.

    .venv/bin/python -m bench.scale [--nodes 5000] [--gpus 8] [--runs 3] [--events 2000]
                                    [--rate 200] [--exporter-nodes 1000]

The cluster: A100-40GB dynamic-MIG nodes with --gpus GPUs of 4 instances each, every instance held
by a Running pod (5,000 nodes: 160,000 pods). One run prints one line per figure:

1. initial sync: every Node and Pod into a fresh `ClusterState`, settled, and every node's
   `topology.yml` text and digest made as `PerNodeWriter` makes them; beside it the whole-cluster
   path, `reconcile` of everything and `dump_yaml` of the single layout's one document. Median of
   --runs runs each.
2. pod event -> its node's new document: --events events (a pod deleted, the same pod added back, a
   pod's `run.ai/simulated-fb-used` changed, on random nodes) sent at a real --rate per second;
   each timed from `set_pod`/`delete_pod` through `settle()` to the new text and digest. p50, p99,
   max. Beside it the whole-cluster path for one event (median of --runs).
3. the size of one fully allocated node's `topology.yml`, and of the whole-cluster document.
4. updater memory, in a fresh subprocess: realistic Node and Pod JSON (managedFields, status,
   last-applied-configuration, ...) listed in pages of 500 through `mig_exporter.kube.api.list_all` exactly as
   the controller lists them (slimmed as each page arrives), settled, every document made; VmRSS
   after gc and the peak (VmHWM). Then again with the raw objects kept, as a cache of whole
   objects would. The same subprocess times that realistic initial sync (JSON parsing included).
5. many-nodes exporter with --exporter-nodes nodes: one node changes -> its ConfigMap parsed,
   `update_source`, `snapshot()` (p50, p99 of --changes); scraping the whole `/metrics` body from
   `MetricsServer` beside prometheus_client serving a collector that builds the families of every
   node on each scrape (p50, p99 of --scrapes, loopback).

Benchmarks are not timed tests: `tests/live/test_bench.py` runs a tiny size and only checks that every
figure is printed. Lines saying "not a figure" only tell where the time went (garbage collection,
the kinds of pod event).
"""

from __future__ import annotations

import argparse
import base64
import gc
import hashlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import yaml
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily

from exporter import dcgm
from exporter.many import NodesExporter
from mig_exporter.kube.api import list_all
from mig_exporter.web.server import MetricsServer, Published
from status_updater import objects as rc
from status_updater.pernode import CONFIGMAP_LIMIT, digest
from status_updater.reconcile import document
from status_updater.state import ClusterState, reconcile
from status_updater.usage import ANNOTATION_FB_USED
from tests.support.oracle import families
from topology import configmap as contract
from topology.model import NodeTopology, Topology, dump_yaml

LAYOUT = {0: "2g.10gb", 4: "1g.5gb", 5: "1g.5gb", 6: "1g.5gb"}  # 4 instances per GPU
NAMESPACE = "gpu-operator"
T = TypeVar("T")
Docs = dict[str, tuple[str, str]]  # node -> (topology.yml, sha256)


# --- the cluster -----------------------------------------------------------------------------------


def node_obj(n: int, gpus: int) -> dict[str, Any]:
    """Node n, with what reconcile reads: GFD labels and run:ai's MIG annotations."""
    config = "version: v1\nmig-configs:\n  selected:\n  - devices: all\n    mig-enabled: true\n    mig-devices:\n"
    config += "".join(f"      {p}: {n}\n" for p, n in LAYOUT.items())
    mapping = {str(g): {str(p): f"MIG-{n:05d}-{g}-{p}" for p in LAYOUT} for g in range(gpus)}
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "40960", "nvidia.com/mig.strategy": "mixed",
        "node-role.kubernetes.io/runai-dynamic-mig": "true", "node-role.kubernetes.io/runai-mig-enabled": "true",
    }  # fmt: skip
    annotations = {
        "run.ai/mig.config": config,
        "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode(),
    }
    meta = {"name": f"gpu-node-{n:05d}", "labels": labels, "annotations": annotations}
    return {"kind": "Node", "metadata": meta}


def pod_obj(n: int, g: int, p: int) -> dict[str, Any]:
    """The pod holding instance p of GPU g of node n, with what reconcile reads."""
    device = {"name": f"nvidia.com/mig-{LAYOUT[p]}", "position": p, "gpuindex": g}
    return {
        "kind": "Pod",
        "metadata": {"name": f"job-{n}-{g}-{p}", "namespace": "team", "uid": f"uid-{n}-{g}-{p}",
                     "annotations": {"runai-mig-device": json.dumps(device)}},
        "spec": {"nodeName": f"gpu-node-{n:05d}", "containers": [{"name": "main"}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


def cluster(nodes: int, gpus: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A100-40GB dynamic-MIG nodes, every instance held by a pod."""
    node_objs = [node_obj(n, gpus) for n in range(nodes)]
    pods = [pod_obj(n, g, p) for n in range(nodes) for g in range(gpus) for p in LAYOUT]
    return node_objs, pods


# --- measuring ---------------------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class GcClock:
    """The time Python's cyclic garbage collector takes, collection by collection (gc.callbacks).

    Not a tuning: the collector runs as it would in the updater; this only says where time went.
    """

    def __init__(self) -> None:
        self.total = 0.0  # seconds
        self.full = 0  # generation-2 collections
        self.count = 0
        self._start = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        self.total += time.perf_counter() - self._start
        self.count += 1
        self.full += info["generation"] == 2


GC = GcClock()


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def load() -> str:
    """The load average: other work on the machine shows here and in the tails."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine() -> str:
    def first(path: str, key: str) -> str:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), "?")

    memory = int(first("/proc/meminfo", "MemTotal").split()[0]) / 2**20
    yaml_c = "with" if yaml.__with_libyaml__ else "without"
    return (
        f"{first('/proc/cpuinfo', 'model name')}, {os.cpu_count()} cores, {memory:.0f} GiB, "
        f"Python {platform.python_version()}, PyYAML {yaml.__version__} {yaml_c} libyaml, "
        f"{time.strftime('%Y-%m-%d')}"
    )


# --- 1. initial sync -----------------------------------------------------------------------------


def _set_pod(state: ClusterState, pod: dict[str, Any]) -> None:
    """A pod event as the controller takes it: slimmed (by its informer), then into the state."""
    state.set_pod(rc.slim_pod(pod))


def node_document(state: ClusterState, name: str) -> tuple[str, str]:
    """A node's `topology.yml` and its digest, as `PerNodeWriter._document` makes them."""
    result = state.results[name]
    if not isinstance(result, NodeTopology):
        raise AssertionError(f"node {name} is unreadable: {result}")
    text = dump_yaml(document(name, result, state.node_strategy(name)))
    return text, digest(text)


def per_node_sync(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> tuple[ClusterState, Docs, float, float, float]:
    """(state, every node's document, seconds to settle, seconds to make the documents, seconds
    of garbage collection in both)."""
    gc_before = GC.total
    start = time.perf_counter()
    state = ClusterState()
    state.reset_nodes(map(rc.slim_node, nodes))
    state.reset_pods(map(rc.slim_pod, pods))
    state.settle()
    settled = time.perf_counter()
    docs = {name: node_document(state, name) for name in sorted(state.results)}
    return state, docs, settled - start, time.perf_counter() - settled, GC.total - gc_before


def whole_cluster(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> tuple[str, float, float, float]:
    """(the single layout's document, seconds to reconcile, seconds to dump, seconds of garbage
    collection in both)."""
    gc_before = GC.total
    (topology, warnings), reconcile_s = timed(lambda: reconcile(nodes, pods))
    assert not warnings, warnings[:3]
    text, dump_s = timed(lambda: dump_yaml(topology))
    return text, reconcile_s, dump_s, GC.total - gc_before


# --- 2. pod events -------------------------------------------------------------------------------


def pod_events(
    state: ClusterState, docs: Docs, pods: list[dict[str, Any]], count: int, rate: float
) -> tuple[list[float], list[float], float]:
    """Latencies of `count` pod events sent at `rate` per second, the garbage collection inside
    each, and the rate achieved."""
    rng = random.Random(42)
    by_key = {rc.pod_key(p): p for p in pods}
    keys = list(by_key)
    latencies: list[float] = []
    collected: list[float] = []
    removed = keys[0]
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        event: Callable[[], None]
        if i % 3 == 0:  # a running pod is deleted
            removed = rng.choice(keys)
            event = partial(state.delete_pod, removed)
            node = str(rc.pod_node(by_key[removed]))
        elif i % 3 == 1:  # ... and added back
            event = partial(_set_pod, state, by_key[removed])
            node = str(rc.pod_node(by_key[removed]))
        else:  # a pod's simulated usage changes
            key = rng.choice(keys)
            pod = by_key[key]
            meta = pod["metadata"]
            before = meta["annotations"].get(ANNOTATION_FB_USED)
            value = before  # MiB, below any device's default 90%: always a new usage
            while value == before:
                value = str(rng.randint(1, 4000))
            pod = {**pod, "metadata": {**meta, "annotations": {**meta["annotations"], ANNOTATION_FB_USED: value}}}  # fmt: skip
            by_key[key] = pod
            event = partial(_set_pod, state, pod)
            node = str(rc.pod_node(pod))
        old = docs[node][1]
        gc_before = GC.total
        t0 = time.perf_counter()
        event()
        changed = state.settle()
        for name in changed:
            docs[name] = node_document(state, name)
        latencies.append(time.perf_counter() - t0)
        collected.append(GC.total - gc_before)
        assert changed == {node} and docs[node][1] != old, (i, changed, node)
    return latencies, collected, count / (time.perf_counter() - start)


# --- 4. updater memory (a fresh subprocess) --------------------------------------------------------


def _hex(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _uid(*parts: object) -> str:
    return str(uuid.UUID(_hex(*parts)[:32]))


def _stamp(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1795075200 + seconds))


_EMPTY: dict[str, Any] = {}
_CONDITION_FIELDS = {".": _EMPTY, "f:lastProbeTime": _EMPTY, "f:lastTransitionTime": _EMPTY,
                     "f:status": _EMPTY, "f:type": _EMPTY}  # fmt: skip
_POD_SPEC_FIELDS = {
    "f:containers": {'k:{"name":"main"}': {
        ".": _EMPTY, "f:args": _EMPTY, "f:command": _EMPTY, "f:image": _EMPTY, "f:imagePullPolicy": _EMPTY,
        "f:env": {".": _EMPTY, **{f'k:{{"name":"{k}"}}': {".": _EMPTY, "f:name": _EMPTY, "f:value": _EMPTY}
                                  for k in ("NCCL_DEBUG", "OMP_NUM_THREADS", "DATA_DIR", "WANDB_MODE", "MASTER_PORT")}},
        "f:name": _EMPTY, "f:ports": {".": _EMPTY, 'k:{"containerPort":8080,"protocol":"TCP"}': {
            ".": _EMPTY, "f:containerPort": _EMPTY, "f:name": _EMPTY, "f:protocol": _EMPTY}},
        "f:resources": {".": _EMPTY, "f:limits": {".": _EMPTY, "f:cpu": _EMPTY, "f:memory": _EMPTY},
                        "f:requests": {".": _EMPTY, "f:cpu": _EMPTY, "f:memory": _EMPTY}},
        "f:terminationMessagePath": _EMPTY, "f:terminationMessagePolicy": _EMPTY,
        "f:volumeMounts": {".": _EMPTY, 'k:{"mountPath":"/data"}': {".": _EMPTY, "f:mountPath": _EMPTY, "f:name": _EMPTY},
                           'k:{"mountPath":"/dev/shm"}': {".": _EMPTY, "f:mountPath": _EMPTY, "f:name": _EMPTY}},
    }},
    "f:dnsPolicy": _EMPTY, "f:enableServiceLinks": _EMPTY, "f:restartPolicy": _EMPTY, "f:schedulerName": _EMPTY,
    "f:securityContext": _EMPTY, "f:terminationGracePeriodSeconds": _EMPTY,
    "f:volumes": {".": _EMPTY, 'k:{"name":"data"}': {".": _EMPTY, "f:name": _EMPTY, "f:persistentVolumeClaim": {
        ".": _EMPTY, "f:claimName": _EMPTY}}, 'k:{"name":"dshm"}': {".": _EMPTY, "f:emptyDir": {".": _EMPTY, "f:medium": _EMPTY}, "f:name": _EMPTY}},
}  # fmt: skip
_CONDITIONS = (
    "PodReadyToStartContainers",
    "Initialized",
    "Ready",
    "ContainersReady",
    "PodScheduled",
)
_ENV = {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4", "DATA_DIR": "/data/imagenet",
        "WANDB_MODE": "offline", "MASTER_PORT": "29500"}  # fmt: skip
_TOLERATIONS = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]  # fmt: skip
_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def raw_pod(n: int, g: int, p: int) -> dict[str, Any]:
    """Pod `pod_obj(n, g, p)` as the API serves it: what a run:ai training pod carries."""
    base = pod_obj(n, g, p)
    name, node = base["metadata"]["name"], base["spec"]["nodeName"]
    job = f"train-{n:05d}-{g}-{p}"
    uid, owner = _uid("pod", n, g, p), _uid("job", n, g, p)
    created, started = _stamp(n), _stamp(n + 9)
    ip = f"10.{64 + (n >> 8) % 64}.{n % 256}.{g * 8 + p + 2}"
    container_id = f"containerd://{_hex('container', n, g, p)}"
    token_volume = f"kube-api-access-{_hex('token', n, g, p)[:5]}"
    labels = {"app": "train", "release": "train", "project": "team-a", "runai/queue": "team-a",
              "job-name": job, "batch.kubernetes.io/job-name": job,
              "controller-uid": owner, "batch.kubernetes.io/controller-uid": owner}  # fmt: skip
    container = {
        "name": "main", "image": _IMAGE, "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "torch.distributed.run"],
        "args": ["--nproc_per_node=1", "train.py", f"--run-name={job}", "--epochs=90", "--batch-size=256"],
        "env": [{"name": k, "value": v} for k, v in _ENV.items()],
        "ports": [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}],
        "resources": {"limits": {"cpu": "4", "memory": "16Gi"}, "requests": {"cpu": "2", "memory": "8Gi"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }  # fmt: skip
    applied = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"annotations": base["metadata"]["annotations"], "labels": labels, "name": name, "namespace": "team"},
               "spec": {"containers": [container], "restartPolicy": "Never", "schedulerName": "runai-scheduler"}}  # fmt: skip
    annotations = {
        **base["metadata"]["annotations"],
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(applied, separators=(",", ":")) + "\n",
        "cni.projectcalico.org/containerID": _hex("sandbox", n, g, p),
        "cni.projectcalico.org/podIP": f"{ip}/32", "cni.projectcalico.org/podIPs": f"{ip}/32",
        "pod-group-name": f"pg-{job}-{owner}", "runai-job-id": owner, "received-resource-type": "MigInstance",
        "runai-allocated-mig-gpus": "1", "runai-calculated-status": "Running",
    }  # fmt: skip
    kubelet_fields = {"f:status": {
        "f:conditions": {f'k:{{"type":"{c}"}}': _CONDITION_FIELDS for c in _CONDITIONS},
        "f:containerStatuses": _EMPTY, "f:hostIP": _EMPTY, "f:hostIPs": _EMPTY, "f:phase": _EMPTY,
        "f:podIP": _EMPTY, "f:podIPs": {".": _EMPTY, f'k:{{"ip":"{ip}"}}': {".": _EMPTY, "f:ip": _EMPTY}},
        "f:startTime": _EMPTY}}  # fmt: skip
    managed = [
        {"manager": "kubectl-client-side-apply", "operation": "Update", "apiVersion": "v1", "time": created,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
             "f:annotations": {".": _EMPTY, "f:kubectl.kubernetes.io/last-applied-configuration": _EMPTY},
             "f:labels": {".": _EMPTY, **{f"f:{k}": _EMPTY for k in labels}}}, "f:spec": _POD_SPEC_FIELDS}},
        {"manager": "runai-scheduler", "operation": "Update", "apiVersion": "v1", "time": created,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {
             f"f:{k}": _EMPTY for k in annotations if not k.startswith(("kubectl", "cni"))}}}},
        {"manager": "calico", "operation": "Update", "apiVersion": "v1", "time": started, "fieldsType": "FieldsV1",
         "subresource": "status", "fieldsV1": {"f:metadata": {"f:annotations": {
             f"f:{k}": _EMPTY for k in annotations if k.startswith("cni")}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": started, "fieldsType": "FieldsV1",
         "subresource": "status", "fieldsV1": kubelet_fields},
    ]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": "team", "uid": uid, "resourceVersion": str(1_000_000 + n * 64 + g * 8 + p),
            "creationTimestamp": created, "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": owner,
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": managed,
        },
        "spec": {
            "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
                {"name": token_volume, "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
                ]}},
            ],
            "containers": [{**container, "volumeMounts": [*container["volumeMounts"], {
                "name": token_volume, "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": node,
            "securityContext": {}, "schedulerName": "runai-scheduler", "tolerations": _TOLERATIONS,
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": c, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                           for c in _CONDITIONS],
            "hostIP": f"172.16.{n // 256}.{n % 256}", "hostIPs": [{"ip": f"172.16.{n // 256}.{n % 256}"}],
            "podIP": ip, "podIPs": [{"ip": ip}], "startTime": created,
            "containerStatuses": [{
                "name": "main", "state": {"running": {"startedAt": started}}, "lastState": {}, "ready": True,
                "restartCount": 0, "image": _IMAGE, "imageID": f"nvcr.io/nvidia/pytorch@sha256:{_hex('image')}",
                "containerID": container_id, "started": True,
            }],
            "qosClass": "Burstable",
        },
    }  # fmt: skip


def raw_node(n: int, gpus: int) -> dict[str, Any]:
    """Node `node_obj(n, gpus)` as the API serves it: kubelet status, GFD and NFD labels, images."""
    base = node_obj(n, gpus)
    name = base["metadata"]["name"]
    created = _stamp(-86400 + n)
    feature_labels = {f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in (
        "ADX", "AESNI", "AVX", "AVX2", "AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL", "FMA3",
        "SHA", "VAES", "VPCLMULQDQ", "X87", "XSAVE")}  # fmt: skip
    labels = {
        **base["metadata"]["labels"], **feature_labels,
        "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": name,
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p4d.24xlarge", "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": f"us-east-1{'abc'[n % 3]}", "nvidia.com/cuda.driver.major": "520",
        "nvidia.com/cuda.driver.minor": "56", "nvidia.com/cuda.driver.rev": "06", "nvidia.com/cuda.runtime.major": "11",
        "nvidia.com/cuda.runtime.minor": "8", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.machine": "p4d.24xlarge", "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.present": "true", "nvidia.com/mig.capable": "true", "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.deploy.container-toolkit": "true", "nvidia.com/gpu.deploy.dcgm": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "true", "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.driver": "true", "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/gpu.deploy.mig-manager": "true", "nvidia.com/gpu.deploy.node-status-exporter": "true",
        "nvidia.com/gpu.deploy.operator-validator": "true", "run.ai/simulated-gpu-node-pool": "default",
    }  # fmt: skip
    annotations = {
        **base["metadata"]["annotations"],
        "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "csi.volume.kubernetes.io/nodeid": json.dumps({"ebs.csi.aws.com": f"i-{_hex('node', n)[:17]}"}),
        "nfd.node.kubernetes.io/feature-labels": ",".join(k.split("/", 1)[1] for k in feature_labels),
        "nfd.node.kubernetes.io/extended-resources": "", "projectcalico.org/IPv4Address": f"172.16.{n // 256}.{n % 256}/16",
    }  # fmt: skip
    mig = {"nvidia.com/mig-1g.5gb": str(3 * gpus), "nvidia.com/mig-2g.10gb": str(gpus)}
    capacity = {"cpu": "96", "ephemeral-storage": "104845292Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0",
                "memory": "1176300616Ki", "pods": "250", "nvidia.com/gpu": "0", **mig}  # fmt: skip
    images = [{"names": [f"registry.example.com/team/image-{i}@sha256:{_hex('img', i)}",
                         f"registry.example.com/team/image-{i}:v{i}.{n % 7}"], "sizeBytes": 1_000_000_000 + i * 7919}
              for i in range(50)]  # fmt: skip
    conditions = [
        {"type": t, "status": s, "lastHeartbeatTime": created, "lastTransitionTime": created, "reason": r, "message": m}
        for t, s, r, m in (
            ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        )
    ]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": _uid("node", n), "resourceVersion": str(500_000 + n), "creationTimestamp": created,
            "labels": labels, "annotations": annotations,
            "managedFields": [
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": created, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": _EMPTY for k in labels if k.startswith(("kubernetes", "beta"))}}}},
                {"manager": "nfd-master", "operation": "Update", "apiVersion": "v1", "time": created, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {f"f:{k}": _EMPTY for k in labels if k.startswith(("feature", "nvidia"))}}}},
                {"manager": "runai-mig-manager", "operation": "Update", "apiVersion": "v1", "time": created, "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {"f:run.ai/mig.config": _EMPTY, "f:run.ai/mig-mapping": _EMPTY}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": created, "fieldsType": "FieldsV1",
                 "subresource": "status", "fieldsV1": {"f:status": {
                     "f:allocatable": {f"f:{k}": _EMPTY for k in capacity}, "f:capacity": {f"f:{k}": _EMPTY for k in capacity},
                     "f:conditions": {f'k:{{"type":"{c["type"]}"}}': {"f:lastHeartbeatTime": _EMPTY} for c in conditions},
                     "f:images": _EMPTY, "f:nodeInfo": {"f:bootID": _EMPTY}}}},
            ],
        },
        "spec": {"podCIDR": f"10.{64 + (n >> 8) % 64}.{n % 256}.0/24", "podCIDRs": [f"10.{64 + (n >> 8) % 64}.{n % 256}.0/24"],
                 "providerID": f"aws:///us-east-1a/i-{_hex('node', n)[:17]}"},
        "status": {
            "capacity": capacity, "allocatable": {**capacity, "cpu": "95690m", "memory": "1165000000Ki"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": f"172.16.{n // 256}.{n % 256}"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": _hex("machine", n)[:32], "systemUUID": _uid("system", n), "bootID": _uid("boot", n),
                         "kernelVersion": "5.15.0-1051-aws", "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.12",
                         "kubeletVersion": "v1.30.2", "kubeProxyVersion": "v1.30.2", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    }  # fmt: skip


def _pager(kind: str, total: int, make: Callable[[int], dict[str, Any]], spent: list[float]) -> Any:
    """A list call serving `total` objects in pages, as the API does. The time spent making them
    (the API server's work, not the updater's) is added to spent[0], bytes served to spent[1], the
    garbage collection while making them to spent[2]."""

    def list_call(*, limit: int, _continue: str | None = None, **_: Any) -> SimpleNamespace:
        gc_before = GC.total
        t0 = time.perf_counter()
        first = int(_continue or 0)
        last = min(first + limit, total)
        meta: dict[str, Any] = {"resourceVersion": "2000000"}
        if last < total:
            meta["continue"] = str(last)
        body = {"apiVersion": "v1", "kind": f"{kind}List", "metadata": meta,
                "items": [make(i) for i in range(first, last)]}  # fmt: skip
        data = json.dumps(body, separators=(",", ":")).encode()
        spent[0] += time.perf_counter() - t0
        spent[1] += len(data)
        spent[2] += GC.total - gc_before
        return SimpleNamespace(data=data)

    return list_call


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(key))


def memory_child(nodes: int, gpus: int, keep_raw: bool) -> dict[str, Any]:
    """List, cache, settle and make every document as the updater does; what it cost."""
    gc.collect()
    baseline = _status_kib("VmRSS:")
    per_node = gpus * len(LAYOUT)
    positions = list(LAYOUT)

    def make_pod(i: int) -> dict[str, Any]:
        n, rest = divmod(i, per_node)
        g, k = divmod(rest, len(positions))
        return raw_pod(n, g, positions[k])

    node_spent, pod_spent = [0.0, 0, 0.0], [0.0, 0, 0.0]
    keep: Callable[[rc.Obj], Any] = lambda obj: obj  # noqa: E731
    gc_before = GC.total
    start = time.perf_counter()
    node_items, _ = list_all(
        _pager("Node", nodes, lambda n: raw_node(n, gpus), node_spent),
        {},
        keep if keep_raw else rc.slim_node,
    )
    pod_items, _ = list_all(
        _pager("Pod", nodes * per_node, make_pod, pod_spent), {}, keep if keep_raw else rc.slim_pod
    )
    listed = time.perf_counter()
    rss_listed = _status_kib("VmRSS:")
    state = ClusterState()
    # As the controller: the informers slimmed each page, the state keeps those objects.
    state.reset_nodes(node_items)
    state.reset_pods(pod_items)
    rss_both = _status_kib("VmRSS:")  # the listed objects and the state's own slimmed copies
    kept = (node_items, pod_items) if keep_raw else None
    del node_items, pod_items
    state.settle()
    settled = time.perf_counter()
    docs = {name: node_document(state, name) for name in sorted(state.results)}
    done = time.perf_counter()
    gc_s = GC.total - gc_before - node_spent[2] - pod_spent[2]
    gc.collect()
    rss = _status_kib("VmRSS:")
    # VmHWM, not ru_maxrss: a child started by vfork+exec inherits its parent's ru_maxrss.
    peak = _status_kib("VmHWM:")
    assert len(docs) == nodes and keep_raw == (kept is not None)
    return {
        "baseline_mib": baseline / 1024,
        "rss_mib": rss / 1024,
        "peak_mib": peak / 1024,
        "pod_bytes": pod_spent[1] / max(1, nodes * per_node),
        "node_bytes": node_spent[1] / max(1, nodes),
        "sync_s": done - start - node_spent[0] - pod_spent[0],
        "list_s": listed - start - node_spent[0] - pod_spent[0],  # JSON parse and slim
        "settle_s": settled - listed,
        "docs_s": done - settled,
        "gc_s": gc_s,  # of all the above
        "rss_listed_mib": rss_listed / 1024,
        "rss_both_mib": rss_both / 1024,
        "pods": nodes * per_node,
    }


def memory(nodes: int, gpus: int, keep_raw: bool) -> dict[str, Any]:
    """memory_child in a fresh interpreter, so the figure is its own."""
    command = [sys.executable, "-m", "bench.scale", "--memory-child", "raw" if keep_raw else "slim",
               "--nodes", str(nodes), "--gpus", str(gpus)]  # fmt: skip
    root = Path(__file__).resolve().parent.parent  # where `bench` is a package
    out = subprocess.run(command, check=True, capture_output=True, text=True, cwd=root).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# --- 5. many-nodes exporter ----------------------------------------------------------------------


def exporter_state(state: ClusterState, nodes: int, gpus: int) -> ClusterState:
    return state if len(state.results) >= nodes else ClusterState.of(*cluster(nodes, gpus))


def variants(state: ClusterState, names: list[str], count: int) -> Iterator[tuple[str, str]]:
    """`count` changes (node, its new topology.yml): a node loses one pod, or gets it back."""
    rng = random.Random(7)
    released: dict[str, str] = {}  # node -> its document with one pod released
    for _ in range(count):
        name = rng.choice(names)
        if name in released:
            yield name, node_document(state, name)[0]  # back to fully allocated
            del released[name]
            continue
        key, pod = rng.choice(sorted(state.pods[name].items()))
        state.delete_pod(key)
        state.settle()
        released[name] = node_document(state, name)[0]
        state.set_pod(pod)  # slim already: the state's own
        state.settle()
        yield name, released[name]


def scrape_times(url: str, count: int) -> tuple[list[float], int]:
    def get() -> bytes:
        with urllib.request.urlopen(url) as r:
            body: bytes = r.read()
            return body

    size = len(get())  # warm up
    return [timed(get)[1] for _ in range(count)], size


class NaiveCollector:
    """The prometheus_client way: on every scrape, fresh families of every node's series."""

    def __init__(self, nodes: dict[str, NodeTopology], options: dcgm.Options) -> None:
        self.nodes, self.options = nodes, options

    def collect(self) -> list[GaugeMetricFamily]:
        now = time.time()
        out: dict[str, GaugeMetricFamily] = {}
        for name in sorted(self.nodes):
            options = replace(self.options, hostname=name)
            for f in families(self.nodes[name], options, now):
                family = out.get(f.name)
                if family is None:
                    names = [k for k, _ in f.samples[0][0]]
                    family = out[f.name] = GaugeMetricFamily(f.name, f.help, labels=names)
                for labels, value in f.samples:
                    family.add_metric([v for _, v in labels], value)
        return [out[c.name] for c in self.options.counters.metrics if c.name in out]


def exporter_bench(state: ClusterState, count: int, changes: int, scrapes: int) -> dict[str, Any]:
    names = sorted(state.results)[:count]
    options = dcgm.Options("bench")
    published = Published()
    # A clock held still: a change's cost is measured without a step boundary's re-render in it,
    # which is measured on its own below.
    now = [time.time()]
    exporter = NodesExporter(options, published, clock=lambda: now[0])

    def configmap(name: str, text: str) -> dict[str, Any]:
        return contract.node_configmap(name, text, NAMESPACE, None)  # as the watch delivers it

    def configmap_event(cm: dict[str, Any]) -> tuple[str, Topology, str]:
        source = cm["metadata"]["name"]
        obj = f"ConfigMap {NAMESPACE}/{source}"
        return source, contract.configmap_topology(cm, obj), obj

    first = [configmap(name, node_document(state, name)[0]) for name in names]

    def initial() -> None:
        for cm in first:
            exporter.update_source(*configmap_event(cm))
        published.publish(exporter.snapshot())

    initial_s = timed(initial)[1]
    render_s, event_s = [], []
    for name, text in variants(state, names, changes):
        cm = configmap(name, text)
        t0 = time.perf_counter()
        event = configmap_event(cm)
        t1 = time.perf_counter()
        exporter.update_source(*event)
        published.publish(exporter.snapshot())
        t2 = time.perf_counter()
        render_s.append(t2 - t1)
        event_s.append(t2 - t0)
    assert published.snapshot.healthy, published.snapshot.reason
    step_s = []
    for _ in range(5):  # every STEP_S the values move: every GPU node is rendered again
        now[0] += dcgm.UTILIZATION_STEP_S
        step_s.append(timed(lambda: published.publish(exporter.snapshot()))[1])

    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    ours, ours_size = scrape_times(f"http://127.0.0.1:{server.port}/metrics", scrapes)
    server.stop()

    topologies = {n: r for n, r in state.results.items() if n in set(names)}
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NaiveCollector(topologies, options))  # type: ignore[arg-type]
    httpd, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    theirs, theirs_size = scrape_times(
        f"http://127.0.0.1:{httpd.server_port}/metrics", max(3, scrapes // 10)
    )  # seconds each: a tenth as many
    httpd.shutdown()
    httpd.server_close()
    return {
        "nodes": len(names), "initial_s": initial_s, "render": render_s, "event": event_s,
        "step": step_s,
        "ours": ours, "ours_size": ours_size, "theirs": theirs, "theirs_size": theirs_size,
    }  # fmt: skip


# --- the run -------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3, help="runs a median is taken of")
    ap.add_argument("--events", type=int, default=2000, help="pod events sent")
    ap.add_argument("--rate", type=float, default=200, help="pod events per second")
    ap.add_argument("--exporter-nodes", type=int, default=1000)
    ap.add_argument("--changes", type=int, default=200, help="node changes the exporter sees")
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--memory-child", choices=("slim", "raw"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        print(json.dumps(memory_child(args.nodes, args.gpus, args.memory_child == "raw")))
        return

    per_node = args.gpus * len(LAYOUT)
    print(f"# {machine()}; load average {load()}")
    print(f"# {args.nodes} nodes x {args.gpus} GPUs x {len(LAYOUT)} instances, "
          f"{args.nodes * per_node} pods; median of {args.runs} runs")  # fmt: skip
    sys.stdout.flush()

    # 1. initial sync, both paths, alternating
    nodes, pods = cluster(args.nodes, args.gpus)
    ours: list[tuple[float, float, float]] = []
    theirs: list[tuple[float, float, float]] = []
    for _ in range(args.runs):
        state, docs, *times = per_node_sync(nodes, pods)
        ours.append((times[0], times[1], times[2]))
        whole, *times = whole_cluster(nodes, pods)
        theirs.append((times[0], times[1], times[2]))
    assert len(docs) == args.nodes

    def med(runs: list[tuple[float, float, float]], i: int | None = None) -> float:
        return statistics.median(r[0] + r[1] if i is None else r[i] for r in runs)

    print(f"initial sync: per-node {med(ours):.2f} s (settle {med(ours, 0):.2f} s + {len(docs)} "
          f"documents {med(ours, 1):.2f} s; GC {med(ours, 2):.2f} s of it); whole-cluster "
          f"{med(theirs):.2f} s (reconcile {med(theirs, 0):.2f} s + dump {med(theirs, 1):.2f} s; "
          f"GC {med(theirs, 2):.2f} s of it); target <= 30 s")  # fmt: skip

    # 3. sizes (before the events change anything)
    node_bytes = len(docs[min(docs)][0].encode())
    whole_bytes = len(whole.encode())
    print(f"node topology.yml: {node_bytes} B ({node_bytes / 1024:.1f} KiB) for a fully allocated "
          f"{args.gpus}-GPU node, target <= 32 KiB; whole-cluster topology.yml {whole_bytes / 2**20:.1f} MiB, "
          f"one 1 MiB ConfigMap holds {CONFIGMAP_LIMIT * args.nodes // whole_bytes} such nodes")  # fmt: skip
    del whole
    sys.stdout.flush()

    # 2. pod events at a sustained rate, and the whole-cluster path for one event. The controller
    # freezes what a full list brought in once it has settled it: so does this.
    gc.freeze()
    full_before = GC.full
    latencies, collected, achieved = pod_events(state, docs, pods, args.events, args.rate)
    print(f"pod event -> node document: p50 {ms(pct(latencies, 50))}, p99 {ms(pct(latencies, 99))}, "
          f"max {ms(max(latencies))} over {len(latencies)} events at {achieved:.0f}/s "
          f"(asked {args.rate:.0f}/s); target p99 <= 5 ms")  # fmt: skip
    quiet = [t for t, c in zip(latencies, collected, strict=True) if c == 0] or [0.0]
    kinds = zip(
        ("delete", "add back", "usage change"), (latencies[k::3] for k in range(3)), strict=True
    )
    print(f"pod event GC and kinds (where the time goes, not a figure): the collector ran inside "
          f"{sum(c > 0 for c in collected)} of {len(collected)} events ({GC.full - full_before} full "
          f"collections during the run), up to {ms(max(collected))} in one; the other events' "
          f"p99 {ms(pct(quiet, 99))}; p50/p99 by kind: "
          + ", ".join(f"{k} {ms(pct(t, 50))}/{ms(pct(t, 99))}" for k, t in kinds if t))  # fmt: skip
    sys.stdout.flush()
    one_less = pods[1:]
    whole_event = [sum(whole_cluster(nodes, one_less)[1:]) for _ in range(args.runs)]
    print(f"pod event, whole-cluster path (reconcile all + dump all): "
          f"{statistics.median(whole_event):.2f} s per event")  # fmt: skip
    sys.stdout.flush()

    # 5. many-nodes exporter (from this state) and the prometheus_client way
    ex_state = exporter_state(state, args.exporter_nodes, args.gpus)
    del nodes, pods, docs
    ex = exporter_bench(ex_state, args.exporter_nodes, args.changes, args.scrapes)
    print(f"exporter initial render: {ex['nodes']} nodes {ex['initial_s']:.2f} s")
    print(f"exporter one node changes ({ex['nodes']} nodes, {len(ex['render'])} changes): "
          f"update_source + render p50 {ms(pct(ex['render'], 50))}, p99 {ms(pct(ex['render'], 99))}; "
          f"with parsing its ConfigMap p50 {ms(pct(ex['event'], 50))}, p99 {ms(pct(ex['event'], 99))}; "
          f"target <= 20 ms")  # fmt: skip
    print(f"exporter new step ({ex['nodes']} nodes, every one moves): render + join median "
          f"{statistics.median(ex['step']):.2f} s of every {dcgm.UTILIZATION_STEP_S} s")  # fmt: skip
    print(f"scrape /metrics ours ({ex['nodes']} nodes, {ex['ours_size'] / 2**20:.2f} MiB): "
          f"p50 {ms(pct(ex['ours'], 50))}, p99 {ms(pct(ex['ours'], 99))} over {len(ex['ours'])} scrapes")  # fmt: skip
    print(f"scrape /metrics prometheus_client ({ex['nodes']} nodes, {ex['theirs_size'] / 2**20:.2f} MiB): "
          f"p50 {ms(pct(ex['theirs'], 50))}, p99 {ms(pct(ex['theirs'], 99))} over {len(ex['theirs'])} scrapes")  # fmt: skip
    sys.stdout.flush()
    del state, ex_state, ex
    gc.collect()

    # 4. updater memory, each in a fresh process (one at a time)
    slim = memory(args.nodes, args.gpus, keep_raw=False)
    print(f"updater memory, slimmed cache: VmRSS {slim['rss_mib']:.0f} MiB, peak {slim['peak_mib']:.0f} MiB "
          f"(of which {slim['baseline_mib']:.0f} MiB before any object) for {args.nodes} nodes and "
          f"{slim['pods']} pods of {slim['pod_bytes']:.0f} B JSON each (nodes {slim['node_bytes']:.0f} B); "
          f"target <= 1024 MiB")  # fmt: skip
    print(f"initial sync from realistic objects: {slim['sync_s']:.2f} s (JSON parse + slim "
          f"{slim['list_s']:.2f} s, settle {slim['settle_s']:.2f} s, documents {slim['docs_s']:.2f} s; "
          f"GC {slim['gc_s']:.2f} s of it); target <= 30 s")  # fmt: skip
    print(f"updater memory during the initial sync: {slim['rss_listed_mib']:.0f} MiB once listed "
          f"(slimmed), {slim['rss_both_mib']:.0f} MiB while the state copies the list")  # fmt: skip
    sys.stdout.flush()
    raw = memory(args.nodes, args.gpus, keep_raw=True)
    print(
        f"updater memory, raw objects kept: VmRSS {raw['rss_mib']:.0f} MiB, peak {raw['peak_mib']:.0f} MiB"
    )

    print(f"# load average at the end {load()}")


if __name__ == "__main__":
    main()
