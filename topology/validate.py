"""Checks a topology against the MIG catalog: what no real GPU could be partitioned into."""

from __future__ import annotations

from collections.abc import Iterator

from topology.catalog import model_for_product
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology


def node_errors(name: str, node: NodeTopology) -> list[TopologyError]:
    """Everything wrong with one node, each error naming the node and the field."""
    return list(_node_errors(name, node))


def _node_errors(name: str, node: NodeTopology) -> Iterator[TopologyError]:
    obj = f"node {name}"
    if len(node.gpus) > node.gpu_count:
        yield TopologyError(
            obj, f"gpus[{node.gpu_count}]", f"GPU index >= gpu-count {node.gpu_count}"
        )
    yield from _replica_errors(obj, node)
    model = model_for_product(node.gpu_product)
    for gi, gpu in enumerate(node.gpus):
        if not gpu.mig_devices:
            continue
        if model is None:
            yield TopologyError(
                obj, f"gpus[{gi}].mig-devices", f"GPU {node.gpu_product!r} does not support MIG"
            )
            continue
        used: dict[int, str] = {}  # memory slice -> the device holding it
        counts: dict[str, int] = {}
        instances: dict[int, str] = {}  # GI id -> the device that has it
        for di, dev in enumerate(gpu.mig_devices):
            where = f"gpus[{gi}].mig-devices[{di}]"
            profile = model.profile(dev.name)
            if profile is None:
                known = ", ".join(p.name for p in model.profiles)
                yield TopologyError(
                    obj, f"{where}.name", f"unknown profile {dev.name!r} for {model.key} ({known})"
                )
                continue
            if dev.position + profile.memory_slices > model.memory_slots:
                yield TopologyError(
                    obj,
                    f"{where}.position",
                    f"{dev.name} at {dev.position} is outside the GPU's "
                    f"{model.memory_slots} memory slices",
                )
                continue
            if dev.position not in profile.placements:
                starts = ", ".join(map(str, profile.placements))
                yield TopologyError(
                    obj,
                    f"{where}.position",
                    f"{dev.name} cannot start at {dev.position} (valid: {starts})",
                )
                continue
            span = range(dev.position, dev.position + profile.memory_slices)
            clash = sorted({used[s] for s in span if s in used})
            if clash:
                yield TopologyError(
                    obj,
                    f"{where}.position",
                    f"{dev.name}@{dev.position} overlaps {', '.join(clash)}",
                )
                continue
            # (GPU, GI) is a series' identity: two instances with one id are one series twice,
            # which Prometheus rejects whole as a duplicate sample.
            other = instances.setdefault(dev.gpu_instance_id, f"{dev.name}@{dev.position}")
            if other != f"{dev.name}@{dev.position}":
                yield TopologyError(
                    obj, f"{where}.gpu-instance-id", f"{dev.gpu_instance_id} is also {other}'s"
                )
                continue
            used.update({s: f"{dev.name}@{dev.position}" for s in span})
            counts[dev.name] = counts.get(dev.name, 0) + 1
            if counts[dev.name] > profile.max_count:
                yield TopologyError(
                    obj, f"{where}.name", f"more than {profile.max_count} {dev.name} on one GPU"
                )


def _replica_errors(obj: str, node: NodeTopology) -> Iterator[TopologyError]:
    """A shared device's replicas: on a node that shares, each index once and below the count."""
    devices = [(f"gpus[{gi}]", gpu.status) for gi, gpu in enumerate(node.gpus)]
    devices += [(f"gpus[{gi}].mig-devices[{di}]", dev.status)
                for gi, gpu in enumerate(node.gpus) for di, dev in enumerate(gpu.mig_devices or ())]  # fmt: skip
    count = node.sharing.replicas if node.sharing else 0
    for where, status in devices:
        seen: set[int] = set()
        for ri, replica in enumerate(status.replicas if status else ()):
            field = f"{where}.status.replicas[{ri}].replica"
            if replica.index >= count:
                why = f"is {replica.index}, the node shares each device {count} ways"
                yield TopologyError(obj, field, why if count else "the node does not share GPUs")
            elif replica.index in seen:
                yield TopologyError(obj, field, f"replica {replica.index} is listed twice")
            seen.add(replica.index)


def duplicate_id_errors(topology: Topology) -> list[TopologyError]:
    """GPU and MIG ids must be unique across the whole topology."""
    seen: dict[str, str] = {}
    errors = []
    for name in sorted(topology.nodes):
        for gi, gpu in enumerate(topology.nodes[name].gpus):
            ids = [(f"gpus[{gi}].id", gpu.id)]
            ids += [
                (f"gpus[{gi}].mig-devices[{di}].id", d.id)
                for di, d in enumerate(gpu.mig_devices or ())
                if d.id is not None
            ]
            for field, uid in ids:
                where = f"node {name} {field}"
                if uid in seen:
                    errors.append(
                        TopologyError(
                            f"node {name}", field, f"duplicate id {uid} (also {seen[uid]})"
                        )
                    )
                else:
                    seen[uid] = where
    return errors


def errors(topology: Topology) -> list[TopologyError]:
    """All problems of a topology; empty when it is valid."""
    unread = [topology.invalid[name] for name in sorted(topology.invalid)]
    found = [e for name, node in sorted(topology.nodes.items()) for e in node_errors(name, node)]
    return unread + found + duplicate_id_errors(topology)
