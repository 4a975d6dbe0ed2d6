"""Policy: KAI-Scheduler's GPU fractions (topology/kai.py reads the pods' keys).

A reservation pod holds its GPU as the device plugin hands it one (the policy that would place
it without KAI), and uses none of it: a `sleep` that never makes a CUDA context. The GPU it holds
is its GPU group's. A fraction pod shares the GPU of each of its groups: it is one of the
device's `fractions`, and its usage joins the device's, so the device reads the sum of its
fraction pods' usage, and its series name the reservation pod, as dcgm-exporter names the pod the
kubelet gave the GPU.

Fraction pods place after every other pod (`place_pods`): a group's GPU is known only once its
reservation pod holds it, and a fraction pod older than its re-created reservation pod must not
look for it first. A fraction pod whose group has no reservation pod on the node (yet, or any
more), or whose compute mode is not its GPU's, holds nothing, said in one line. One that asks more
memory than its GPU has left is held at what is left, and said: it runs (KAI bound it), but the
GPU has no more to give.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from status_updater.objects import APP, Obj, containers, metadata, names, pod_ref, pod_uid, strings
from status_updater.objects import holder as objects_holder
from status_updater.placement import requested, runai, shared, whole
from status_updater.placement.board import Board, Device, Policy
from status_updater.usage import ANNOTATION_FB_USED, pod_usage
from topology import kai
from topology.errors import TopologyError
from topology.model import DeviceStatus, Fraction, PodUsage, Utilization

# What a reservation pod uses of its GPU: nothing (it never opens a CUDA context).
IDLE = PodUsage(Utilization(0, 0), 0)
# A reservation pod holds its GPU as it would without KAI: the first of these that applies.
_HOLDING = (shared.POLICY, requested.POLICY, runai.POLICY, whole.POLICY)


def _labels(pod: Obj) -> Mapping[str, object]:
    return strings(metadata(pod).get("labels"))


def _annotations(pod: Obj) -> Mapping[str, object]:
    return strings(metadata(pod).get("annotations"))


def is_reservation(pod: Obj) -> bool:
    return kai.is_reservation(names(pod)[0], _labels(pod))


def is_fraction(pod: Obj) -> bool:
    return kai.is_fraction(names(pod)[0], _labels(pod), _annotations(pod))


def applies(board: Board, pod: Obj) -> bool:
    return is_reservation(pod) or is_fraction(pod)


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    if is_reservation(pod):
        _reserve(board, pod, warnings)
    else:
        _share(board, pod, warnings)


def _reserve(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    uid = pod_uid(pod)
    found = kai.groups(_labels(pod))
    if not found:  # checked before it holds anything: a pod that fails holds nothing
        raise TopologyError(pod_ref(pod), f"metadata.labels[{kai.GROUP}]", "a reservation pod "
                            "names no GPU group: not placed")  # fmt: skip
    group = found[0]
    policy = next(p for p in _HOLDING if p.applies(board, pod))
    policy.place(board, pod, warnings)
    for g, d in board.devices_of(uid):
        status = board.status(g, d)
        assert status is not None  # the pod holds it
        board.set_status(g, d, replace(status, pod_gpu_usage_status={
            **status.pod_gpu_usage_status, uid: IDLE}))  # fmt: skip
        # Two live reservation pods of one group (a re-created one before the old one ended):
        # the group's GPU is the first's, the one that held it longest (it placed first).
        board.groups.setdefault(group, (g, d))
        board.group_modes.setdefault(group, kai.reservation_mode(_annotations(pod)))


def _device_memory(board: Board, g: int, d: int | None) -> int:
    """A GPU's memory as KAI counts fractions of it (its node label, floored to 100 MiB); a
    MIG instance's, its own."""
    if d is None and (counted := kai.node_memory(board.node.gpu_memory)):
        return min(counted, board.fb_total(g, d))
    return board.fb_total(g, d)


def _share(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj, uid = pod_ref(pod), pod_uid(pod)
    # The first app container is the default (KAI's container 0); init containers may be named.
    named = [(kind != APP, str(c.get("name", ""))) for _, kind, c in containers(pod)]
    ask = kai.ask(_annotations(pod), [name for _, name in sorted(named)], obj)
    found = kai.groups(_labels(pod))
    if not found:
        raise TopologyError(obj, f"metadata.labels[{kai.GROUP}]", "asks for a GPU fraction but "
                            "is in no GPU group (KAI's binder labels it when it binds): holds "
                            "nothing")  # fmt: skip
    devices: list[tuple[str, Device]] = []
    for group in found:
        label = kai.GROUP if len(found) == 1 else f"{kai.GROUP_PREFIX}{group}"
        dev = board.groups.get(group)
        if dev is None:
            raise TopologyError(obj, f"metadata.labels[{label}]", f"GPU group {group} has no "
                                f"reservation pod on node {board.name} (yet, or any more): "
                                "holds nothing")  # fmt: skip
        if any(dev == other for _, other in devices):
            raise TopologyError(obj, f"metadata.labels[{label}]", f"GPU groups {devices[0][0]} "
                                f"and {group} share {board.where(*dev)}: holds nothing")  # fmt: skip
        want = ask.mode or kai.DEFAULT_MODE
        status = board.status(*dev)
        modes = {f.compute_mode or kai.DEFAULT_MODE for f in status.fractions} if status else set()
        modes |= {board.group_modes[group]} if board.group_modes.get(group) else set()
        if modes and want not in modes:
            raise TopologyError(obj, f"metadata.annotations[{kai.NV_PREFIX}{ask.container}"
                                f"{kai.NV_MODE}]", f"asks compute mode {want}; GPU group {group} "
                                f"shares {board.where(*dev)} in {', '.join(sorted(modes))}: "
                                "holds nothing")  # fmt: skip
        devices.append((group, dev))
    if ask.devices != len(found):
        warnings.append(TopologyError(
            obj, f"metadata.annotations[{kai.DEVICES}]", f"asks for {ask.devices} GPUs, is in "
            f"{len(found)} GPU groups: shares those",
        ))  # fmt: skip
    holder = objects_holder(pod, ask.container)
    for group, (g, d) in devices:
        status = board.status(g, d) or DeviceStatus()
        total = board.fb_total(g, d)
        counted = _device_memory(board, g, d)
        asked = ask.mib(counted)
        left = max(counted - sum(f.memory for f in status.fractions), 0)
        memory = min(asked, left)
        if asked > left:
            warnings.append(TopologyError(
                obj, "metadata.annotations", f"asks for {asked} MiB of {board.where(g, d)} "
                f"(GPU group {group}), which has {left} of {counted} MiB left: holds {memory}",
            ))  # fmt: skip
        limit = ask.most(counted)
        most = total if limit is None else min(limit, total)
        usage = pod_usage(pod, obj, most, warnings)
        if ANNOTATION_FB_USED not in _annotations(pod):
            usage = replace(usage, fb_used=min(memory, most))
        fraction = Fraction(replace(holder, uid=uid), group, memory, ask.mode)
        board.set_status(g, d, replace(
            status, pod_gpu_usage_status={**status.pod_gpu_usage_status, uid: usage},
            fractions=(*status.fractions, fraction),
        ))  # fmt: skip


POLICY = Policy("KAI fractions", applies, place)
