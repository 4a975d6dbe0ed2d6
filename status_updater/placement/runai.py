"""Policy: run:ai's dynamic MIG. A pod holds the MIG device its `runai/mig-device` annotation
names (GPU, position, profile; once run:ai has made it, its uuid and GI id)."""

from __future__ import annotations

from dataclasses import replace

from status_updater.objects import (
    Obj,
    annotation,
    first_container,
    metadata,
    pod_ref,
    pod_uid,
    strings,
)
from status_updater.objects import holder as objects_holder
from status_updater.placement.board import Board, Policy
from status_updater.usage import pod_usage
from topology import runai
from topology.errors import TopologyError
from topology.model import DeviceStatus, MigDevice

FIELD = f"metadata.annotations[{runai.ANNOTATION_POD_MIG_DEVICE}]"


def _annotation(pod: Obj) -> str | None:
    annotations = strings(metadata(pod).get("annotations"))
    return annotation(annotations, runai.ANNOTATION_POD_MIG_DEVICE, pod_ref(pod))


def applies(board: Board, pod: Obj) -> bool:
    """A dynamic-MIG node's pod with the annotation; one that is not a string is placed here
    too, so that `place` says so (read once there: this runs for every pod)."""
    value = strings(metadata(pod).get("annotations")).get(runai.ANNOTATION_POD_MIG_DEVICE)
    return board.node.is_dynamic_mig_enabled and value is not None and value != ""


def place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    obj = pod_ref(pod)
    want = runai.parse_pod_mig_device(_annotation(pod) or "", obj)
    devices = board.migs[want.gpu_index] if want.gpu_index < len(board.migs) else None
    found = [i for i, d in enumerate(devices or []) if d.position == want.position]
    if devices is None or not found:
        raise TopologyError(
            obj,
            FIELD,
            f"node {board.name} has no MIG device at GPU {want.gpu_index} position {want.position}",
        )
    key = (want.gpu_index, want.position)
    if key in board.holders:
        raise TopologyError(obj, FIELD, f"device already held by {board.holders[key]}")
    claim = board.claim_on(want.gpu_index, found[0])
    if claim is not None:  # DRA pods place first: the scheduler's allocation is the device's
        raise TopologyError(obj, FIELD, f"device {board.where(want.gpu_index, found[0])} is held "
                            f"by DRA claim {claim.claim_namespace}/{claim.claim} "
                            f"({claim.device}): not placed")  # fmt: skip
    dev = devices[found[0]]
    if dev.name != want.profile:
        warnings.append(
            TopologyError(obj, f"{FIELD}.name", f"asks for {want.profile}, device is {dev.name}")
        )
    usage = pod_usage(pod, obj, board.mig_fb_total(dev.name), warnings)
    board.holders[key] = obj
    gi, device_id = dev.gpu_instance_id, dev.id
    if dev.id is None and want.device_uuid is not None:
        gi, device_id = _named(board, obj, want, dev, devices, warnings)
    status = DeviceStatus(
        allocated_by=objects_holder(pod, first_container(pod)),
        pod_gpu_usage_status={pod_uid(pod): usage},
    )
    devices[found[0]] = replace(dev, gpu_instance_id=gi, id=device_id, status=status)


def _named(
    board: Board,
    obj: str,
    want: runai.PodMigDevice,
    dev: MigDevice,
    devices: list[MigDevice],
    warnings: list[TopologyError],
) -> tuple[int, str | None]:
    """(GI id, uuid) of a device the mapping has not named yet: the pod's annotation names it,
    and its GI, where they are the driver's and no other device's."""
    gi = dev.gpu_instance_id
    taken = {d.id for m in board.migs for d in m or () if d.id}
    if want.device_uuid in taken:
        warnings.append(
            TopologyError(obj, f"{FIELD}.deviceUUID", f"{want.device_uuid} is another device's id")
        )
        return gi, dev.id
    if want.gpu_instance_id is not None and want.gpu_instance_id != gi:
        if _may_take_gi(board, want.gpu_instance_id, dev, devices):
            gi = want.gpu_instance_id
        else:
            warnings.append(TopologyError(
                obj, f"{FIELD}.gpuinstanceid",
                f"{want.gpu_instance_id} is not the GI id the driver gives {dev.name} at "
                f"position {dev.position}, or is another instance's: {gi} kept",
            ))  # fmt: skip
    return gi, want.device_uuid


def _may_take_gi(board: Board, gi: int, dev: MigDevice, devices: list[MigDevice]) -> bool:
    """Whether a pod's annotation may give `dev` this GI id: one the driver could give its
    profile there, and no other instance's on the GPU (two would be one series)."""
    profile = board.model.profile(dev.name) if board.model else None
    return (
        board.model is not None
        and profile is not None
        and gi in board.model.gpu_instance_ids(profile, dev.position)
        and all(d.gpu_instance_id != gi for d in devices if d is not dev)
    )


POLICY = Policy("run:ai annotation", applies, place)
