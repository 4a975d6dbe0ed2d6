"""Placement: which pod holds which device of a node, by named policies.

A policy is one way pods get devices (`Policy`: a name, whether it applies to a pod on a node,
and how it places it). The first in `POLICIES` that applies to a pod places it; adding an
allocation source is adding one policy module and its place in this list (docs/design.md).
DRA pods place first: a device a claim was allocated is that claim's (one device, one holder;
sharing's replicas aside), and a pod of the device plugin or run:ai that held it is moved to a
free device, said once, or holds nothing. Then pods that held devices in the node's last result
place and keep them (`kept.py`); then the others, oldest first. A pod that does not fit is
reported and holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from status_updater.claims import PodHolds
from status_updater.objects import (
    Obj,
    holds_gpu,
    odd_requests,
    pod_order,
    pod_ref,
    pod_uid,
    requests,
    shown,
)
from status_updater.placement import dra, kai, requested, runai, shared, whole
from status_updater.placement.board import Board, Policy
from status_updater.placement.kept import dra_holders, held_devices, held_replicas, named_holders
from topology.errors import TopologyError
from topology.model import DraClaim, NodeTopology

POLICIES: tuple[Policy, ...] = (
    dra.POLICY,  # devices DRA claims were allocated (the scheduler chose them)
    kai.POLICY,  # KAI's reservation pods (their GPU, idle) and fraction pods (a share of it)
    shared.POLICY,  # a node whose devices are shared: replicas, whatever else it is
    requested.POLICY,  # static MIG and whole GPUs: the device plugin's requests
    runai.POLICY,  # run:ai dynamic MIG: the pod's annotation names its instance
    whole.POLICY,  # run:ai dynamic MIG, no annotation: whole GPUs
)


def place_pods(
    name: str,
    node: NodeTopology,
    pods: Iterable[Obj],
    warnings: list[TopologyError],
    single: bool = False,
    previous: NodeTopology | None = None,
    dynamic: bool = False,
    holds: PodHolds | None = None,
    shares: int | None = None,
) -> NodeTopology:
    """The node with the devices its pods hold, and their simulated usage. `single`: the node
    is labelled with GFD's single strategy; `previous`: the node's last result, whose pods keep
    what they held there for as long as they live (older pods ending never moves them);
    `dynamic`: the node's DRA driver runs DynamicMIG (a claim's partition makes its instance);
    `holds`: the devices the pods' DRA claims hold, by pod uid; `shares`: N of the DRA driver's
    `--consumable-shares N` on the node, where it has one.

    A pod that cannot be placed is reported and skipped; the others are placed regardless.
    """
    holding = [p for p in pods if holds_gpu(p)]
    live = {pod_uid(p) for p in holding}
    kept = {uid: held for uid, held in held_devices(node, previous).items() if uid in live}
    replicas = {uid: held for uid, held in held_replicas(node, previous).items() if uid in live}
    board = Board(name, node, single, kept, replicas, named_holders(node, previous), dynamic,
                  holds, shares)  # fmt: skip
    # DRA pods place first: a device the scheduler allocated to a claim is the claim's, whoever
    # held it (one device, one holder). Then pods that held devices, then new pods, oldest first,
    # in what is left; KAI's fraction pods last, once every reservation pod holds its GPU.
    holders = kept.keys() | replicas.keys() | dra_holders(previous)
    order = {pod_uid(p): (not dra.applies(board, p), kai.is_fraction(p),
                          pod_uid(p) not in holders, pod_order(p))
             for p in holding}  # fmt: skip
    failed: list[Obj] = []
    said: dict[str, list[TopologyError]] = {}  # pod uid -> what placing it said
    for pod in sorted(holding, key=lambda p: order[pod_uid(p)]):
        if not _try(board, pod, said.setdefault(pod_uid(pod), []), order[pod_uid(pod)][0]):
            failed.append(pod)
    # A pod that does not fit releases what it kept, too late for the pods placed before it
    # (a DRA claim took a device of each, say): those that did not fit try once more in what
    # is left, so that no device sits free while a pod that fits it holds nothing.
    if any(board.kept.get(pod_uid(p)) or board.kept_replicas.get(pod_uid(p)) for p in failed):
        for pod in failed:
            said[pod_uid(pod)] = []
            _try(board, pod, said[pod_uid(pod)], order[pod_uid(pod)][0])
    warnings += [w for found in said.values() for w in found]
    return board.result()


def _try(board: Board, pod: Obj, warnings: list[TopologyError], moves: bool) -> bool:
    """Place one pod; False (reported, holding nothing) where it does not fit. `moves`: the pod
    is not DRA's, so that a device a claim took from it is said."""
    try:
        _place(board, pod, warnings)
        if moves:
            warnings += _lost_to_claims(board, pod)
        return True
    except TopologyError as e:
        warnings.append(e)
    except Exception as e:  # the last guard: one odd object never stops the rest
        warnings.append(
            TopologyError(pod_ref(pod), "?", f"cannot be read: {type(e).__name__}: {e}")
        )
    # A pod that does not fit holds nothing, not even what it kept: what it kept is free for
    # the pods placed after it now, as it would be on the next pass, where it holds nothing.
    board.release(pod_uid(pod))
    return False


def _lost_to_claims(board: Board, pod: Obj) -> list[TopologyError]:
    """A pod of the device plugin or run:ai that held devices a DRA claim holds now, said once
    (the pass it moves; it holds another device, or the error of one that does not fit says)."""
    uid = pod_uid(pod)
    held = [(g, d, c) for g, d, c in board.kept.get(uid, ())]
    held += [(g, d, c) for g, d, _, c in board.kept_replicas.get(uid, ())]
    lost: dict[tuple[int, int | None], tuple[str, DraClaim]] = {}
    for g, d, container in held:
        claim = board.claim_on(g, d)
        if claim is not None and (g, d) not in lost:
            lost[g, d] = (container, claim)
    if not lost:
        return []
    now = [board.where(g, d) for g, d in board.devices_of(uid)]
    fields = {a.container: f"{a.field}.resources.limits[{a.resource}]" for a in requests(pod)}
    return [
        TopologyError(
            pod_ref(pod),
            fields.get(container, "spec.containers"),
            f"{board.where(g, d)} it held is DRA claim {c.claim_namespace}/{c.claim}'s "
            f"({c.device}, which the scheduler allocated): it holds "
            f"{', '.join(now) or 'nothing'} now",
        )
        for (g, d), (container, c) in lost.items()
    ]


def _place(board: Board, pod: Obj, warnings: list[TopologyError]) -> None:
    for field, resource, value in odd_requests(pod):
        # The kubelet would never run it: the pod holds nothing, as one that does not fit.
        raise TopologyError(
            pod_ref(pod),
            f"{field}.resources.limits[{resource}]",
            f"expected a whole number of devices, got {shown(value)}: not placed",
        )
    policy = next(p for p in POLICIES if p.applies(board, pod))
    policy.place(board, pod, warnings)
