"""Placement: which pod holds which device of a node, by named policies.

A policy is one way pods get devices (`Policy`: a name, whether it applies to a pod on a node,
and how it places it). The first in `POLICIES` that applies to a pod places it; adding an
allocation source is adding one policy module and its place in this list (docs/design.md).
Pods that held devices in the node's last result place first and keep them (`kept.py`); then
the others, oldest first. A pod that does not fit is reported and holds nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from status_updater.objects import (
    Obj,
    holds_gpu,
    odd_requests,
    pod_order,
    pod_ref,
    pod_uid,
    shown,
)
from status_updater.placement import dra, requested, runai, shared, whole
from status_updater.placement.board import Board, Policy
from status_updater.placement.kept import dra_holders, held_devices, held_replicas, named_holders
from topology.errors import TopologyError
from topology.model import NodeTopology

POLICIES: tuple[Policy, ...] = (
    dra.POLICY,  # devices DRA claims were allocated (the scheduler chose them)
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
) -> NodeTopology:
    """The node with the devices its pods hold, and their simulated usage. `single`: the node
    is labelled with GFD's single strategy; `previous`: the node's last result, whose pods keep
    what they held there for as long as they live (older pods ending never moves them);
    `dynamic`: the node's DRA driver runs DynamicMIG (a claim's partition makes its instance).

    A pod that cannot be placed is reported and skipped; the others are placed regardless.
    """
    holding = [p for p in pods if holds_gpu(p)]
    live = {pod_uid(p) for p in holding}
    kept = {uid: held for uid, held in held_devices(node, previous).items() if uid in live}
    replicas = {uid: held for uid, held in held_replicas(node, previous).items() if uid in live}
    board = Board(name, node, single, kept, replicas, named_holders(node, previous), dynamic)
    # Pods that held devices place first, then new pods, oldest first, in what is left.
    holders = kept.keys() | replicas.keys() | dra_holders(previous)
    for pod in sorted(holding, key=lambda p: (pod_uid(p) not in holders, pod_order(p))):
        try:
            _place(board, pod, warnings)
            continue
        except TopologyError as e:
            warnings.append(e)
        except Exception as e:  # the last guard: one odd object never stops the rest
            warnings.append(
                TopologyError(pod_ref(pod), "?", f"cannot be read: {type(e).__name__}: {e}")
            )
        # A pod that does not fit holds nothing, not even what it kept: what it kept is free for
        # the pods placed after it now, as it would be on the next pass, where it holds nothing.
        board.release(pod_uid(pod))
    return board.result()


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
