"""What KAI's node-side parts write, on simulated nodes where none of them runs (`--kai-node-selector`).

On a real GPU node two things KAI waits for are written by programs that run there:
- the reservation pod itself writes `run.ai/reserve_for_gpu_index` (its GPU's uuid) on its pod
  once NVML shows it the GPU (KAI's `resourcereservation` binary). KAI's binder waits 40 s for it,
  then deletes the reservation pod and fails the bind. On a KWOK node no container runs, so the
  updater writes it: the uuid of the GPU placement gave the reservation pod (fake-gpu-operator
  does the same).
- the gpu-fractioning operator's daemon reports the node condition
  `gpu-fractioning.nvidia.com/Ready` (the first cut: `gpu-sharing.nvidia.com/Ready`), without
  which KAI's NvFractions mode places no fractional pod on the node. The updater sets both True.

Only on the nodes the selector picks that KWOK simulates (annotation `kwok.x-k8s.io/node:
fake`): on a real node the real parts say it, and the updater must not say it for them.
Pure: the slim node carries whether it is picked and what it reports (`slimmer`); the controller
makes the calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from mig_exporter.kube import selectors
from status_updater.objects import Obj, metadata, names, strings
from topology import kai
from topology.model import NodeTopology

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
CONDITIONS = (kai.READY_CONDITION, "gpu-sharing.nvidia.com/Ready")
PICKED = "kai-picked"  # in a slim node: the selector picks it, and KWOK simulates it
READY = "kai-ready"  # in a slim node: it reports every condition of CONDITIONS True
REASON = "SimulatedNode"


def slimmer(
    inner: Callable[[Obj], dict[str, Any]], selector_text: str | None
) -> Callable[[Obj], dict[str, Any]]:
    """`inner`'s slim node, with whether the selector picks it (judged on all its labels) and
    whether it reports KAI's conditions True already. None: no selector, `inner` itself."""
    if selector_text is None:
        return inner
    picks = selectors.parse(selector_text)

    def slim(node: Obj) -> dict[str, Any]:
        out = inner(node)
        meta = metadata(node)
        labels = {k: v for k, v in strings(meta.get("labels")).items() if isinstance(v, str)}
        kwok = strings(meta.get("annotations")).get(KWOK_ANNOTATION) == "fake"
        if kwok and picks(labels):
            out[PICKED] = True
            out[READY] = _reports_ready(node)
        return out

    return slim


def _reports_ready(node: Obj) -> bool:
    status = strings(node.get("status"))
    found = status.get("conditions")
    conditions: list[object] = found if isinstance(found, list) else []
    ready = {c.get("type") for c in conditions
             if isinstance(c, Mapping) and c.get("status") == "True"}  # fmt: skip
    return all(t in ready for t in CONDITIONS)


def condition_patch(now: str) -> dict[str, Any]:
    """A strategic merge patch of the Node's status: KAI's conditions True (merged by type,
    leaving the node's other conditions alone)."""
    return {"status": {"conditions": [
        {"type": t, "status": "True", "reason": REASON, "lastHeartbeatTime": now,
         "lastTransitionTime": now,
         "message": "the node is simulated: its GPU fractions are the status updater's"}
        for t in CONDITIONS]}}  # fmt: skip


def needs_condition(node: Obj) -> bool:
    return bool(node.get(PICKED)) and not node.get(READY)


def reservations_to_mark(
    node: Obj, pods: Iterable[Obj], placed: NodeTopology | None
) -> Iterator[tuple[str, str, str]]:
    """(namespace, name, GPU uuid) of each reservation pod on a picked node that holds a GPU
    and has no `run.ai/reserve_for_gpu_index` yet."""
    if not node.get(PICKED) or placed is None:
        return
    held: dict[tuple[str, str], str] = {}
    for gpu in placed.gpus:
        a = gpu.status.allocated_by if gpu.status else None
        if a is not None:
            held.setdefault((a.namespace, a.pod), gpu.id)
    for pod in pods:
        meta = metadata(pod)
        namespace, name = names(pod)
        if not kai.is_reservation(namespace, strings(meta.get("labels"))):
            continue
        if kai.GPU_INDEX in strings(meta.get("annotations")):
            continue
        uuid = held.get((namespace, name))
        if uuid is not None:
            yield namespace, name, uuid
