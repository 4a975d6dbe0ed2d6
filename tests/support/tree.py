"""Oracles for the topology's text: the schema as a plain tree, written by the generic block-YAML
writer (`yamltext.dump`).

The product writes `topology.yml` straight from the dataclasses (`model.dump_yaml`) for speed;
this is the slow, obvious form it is checked against (tests/topology/test_topology_model.py,
tests/topology/test_yamltext.py).
"""

from __future__ import annotations

from typing import Any

from topology.model import AllocatedBy, DeviceStatus, Fault, MigDevice, Topology, time_text
from topology.yamltext import dump

__all__ = ["dump", "to_dict"]


def _labels(holder: AllocatedBy) -> dict[str, Any]:
    return {"labels": dict(holder.labels)} if holder.labels else {}


def _status_to_dict(status: DeviceStatus) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if status.allocated_by is not None:
        a = status.allocated_by
        out["allocated-by"] = {"namespace": a.namespace, "pod": a.pod, "container": a.container,
                               **({"pod-uid": a.uid} if a.uid else {}), **_labels(a)}  # fmt: skip
    if status.pod_gpu_usage_status:
        out["pod-gpu-usage-status"] = {
            uid: {
                "utilization": {"min": u.utilization.min, "max": u.utilization.max},
                "fb-used": u.fb_used,
                "is-inference-pod": u.is_inference_pod,
            }
            for uid, u in sorted(status.pod_gpu_usage_status.items())
        }
    if status.replicas:
        out["replicas"] = [
            {"replica": r.index, "namespace": r.holder.namespace, "pod": r.holder.pod,
             "container": r.holder.container, "pod-uid": r.pod_uid, **_labels(r.holder)}
            for r in status.replicas
        ]  # fmt: skip
    if status.dra_claims:
        out["dra-claims"] = [
            {"claim": c.claim, "claim-namespace": c.claim_namespace, "device": c.device,
             "pool": c.pool, "namespace": c.holder.namespace, "pod": c.holder.pod,
             "container": c.holder.container,
             **({"pod-uid": c.holder.uid} if c.holder.uid else {}), **_labels(c.holder),
             **({"made": True} if c.made else {}),
             **({"share-id": c.share_id} if c.share_id else {}),
             **({"consumed-memory": c.consumed_memory} if c.consumed_memory is not None else {})}
            for c in status.dra_claims
        ]  # fmt: skip
    if status.fractions:
        out["fractions"] = [
            {"namespace": f.holder.namespace, "pod": f.holder.pod,
             "container": f.holder.container, "pod-uid": f.holder.uid, "gpu-group": f.group,
             "memory": f.memory, **({"compute-mode": f.compute_mode} if f.compute_mode else {}),
             **_labels(f.holder)}
            for f in status.fractions
        ]  # fmt: skip
    return out


def _mig_to_dict(dev: MigDevice) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if dev.id is not None:
        out["id"] = dev.id
    out |= {"name": dev.name, "position": dev.position, "gpu-instance-id": dev.gpu_instance_id}
    if dev.status is not None:
        out["status"] = _status_to_dict(dev.status)
    return out


def _fault_to_dict(f: Fault) -> dict[str, Any]:
    out: dict[str, Any] = {"fault": f.fault, "since": time_text(f.since)}
    if f.until is not None:
        out["until"] = time_text(f.until)
    if f.xid is not None:
        out["xid"] = f.xid
    if f.count != 1:
        out["count"] = f.count
    if f.rate is not None:
        out["rate"] = f.rate
    if f.correctable:
        out["correctable"] = True
    out["source"] = f.source
    return out


def to_dict(topology: Topology) -> dict[str, Any]:
    nodes: dict[str, Any] = {}
    for name in sorted(topology.nodes):
        node = topology.nodes[name]
        gpus = []
        for gpu in node.gpus:
            g: dict[str, Any] = {"id": gpu.id}
            if gpu.status is not None:
                g["status"] = _status_to_dict(gpu.status)
            if gpu.mig_devices is not None:
                g["mig-devices"] = [_mig_to_dict(d) for d in gpu.mig_devices]
            if gpu.faults:
                g["faults"] = [_fault_to_dict(f) for f in gpu.faults]
            if gpu.counted:
                g["counted"] = dict(gpu.counted)
            gpus.append(g)
        nodes[name] = {
            "gpu-count": node.gpu_count,
            "gpu-memory": node.gpu_memory,
            "gpu-product": node.gpu_product,
            "is-dynamic-mig-enabled": node.is_dynamic_mig_enabled,
            "gpus": gpus,
        }
        if node.sharing is not None:
            sharing = {"strategy": node.sharing.strategy, "replicas": node.sharing.replicas}
            nodes[name]["sharing"] = sharing
        if node.driver_version is not None:
            nodes[name]["driver-version"] = node.driver_version
    return {"mig-strategy": topology.mig_strategy, "nodes": nodes}
