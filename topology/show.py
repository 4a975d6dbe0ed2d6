"""A topology drawn for a person: each GPU a bar of its memory slots, instances over their slots.

    node qa-mig-worker-gpu-a100  (NVIDIA-A100-SXM4-40GB, 1 GPU)
      slot   0       1       2       3       4       5       6       7
      gpu 0 |2g.10gb        |...............|1g.5gb |.......|1g.5gb |.......|
            |GI 5           |unused         |GI 7   |unused |GI 9   |unused |
            |job-2g-idle-0-0|               |job-1g~|       |job-gp~|       |
             GI 5  runai-p1/job-2g-idle-0-0
             GI 7  runai-p1/job-1g-idle-0-0
             GI 9  runai-p1/job-gpu-burn-0-0

An instance covers the slots `position .. position + memory_slices` of its profile (the catalog's
geometry; `position` is the logical start slice). Its rows are the profile, the GI id and the pod
holding it (`namespace/name`, the bare name where that does not fit, or `free`); a label too long
for its cell ends in `~`, and every pod not shown in full is listed below the bar. A device DRA
claims hold is held by the first claim's pod, and each claim is listed below the bar with its
pods (`GI 9 DRA claim ns/claim: ns/pod`). A GPU with MIG disabled is one `whole GPU` bar. Instances that cannot be drawn (unknown profile, outside the GPU,
overlapping) are listed with `!`.

Plain ASCII, aligned whatever the input holds. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from topology.catalog import GpuModel, model_for_product
from topology.errors import TopologyError
from topology.model import AllocatedBy, DeviceStatus, Gpu, NodeTopology, Topology

MIN_SLOT_WIDTH = 7  # characters inside one memory slot: "1g.10gb"
MAX_SLOT_WIDTH = 10  # "1g.12gb+me"; longer labels are cut
NO_MIG_SLOTS = 8  # the bar length of a GPU without a catalog entry (drawn whole)
CUT = "~"


@dataclass(frozen=True)
class _Block:
    """A run of memory slots drawn as one cell: an instance, unused slots, or the whole GPU."""

    start: int
    span: int
    top: str  # profile, or "whole GPU"
    middle: str  # "GI n", "unused", or why the GPU is whole
    holder: AllocatedBy | None
    gi: int | None = None
    unused: bool = False


@dataclass(frozen=True)
class _Plan:
    slots: int
    blocks: tuple[_Block, ...]
    problems: tuple[str, ...]
    mig: bool


def picture(topology: Topology, node: str | None = None, *, obj: str = "topology") -> str:
    """Every node (or only `node`), sorted by name; TopologyError when `node` is not there."""
    if node is not None and node not in topology.nodes:
        known = ", ".join(_ascii(n) for n in sorted(topology.nodes)[:10]) or "none"
        more = f" and {len(topology.nodes) - 10} more" if len(topology.nodes) > 10 else ""
        raise TopologyError(
            obj, f"nodes.{_ascii(node)}", f"is not in the topology (nodes: {known}{more})"
        )
    names = [node] if node is not None else sorted(topology.nodes)
    if not names:
        return "no nodes\n"
    return "\n".join("\n".join(_node(name, topology.nodes[name])) + "\n" for name in names)


def _node(name: str, node: NodeTopology) -> list[str]:
    model = model_for_product(node.gpu_product)
    plans = [_plan(gpu, model) for gpu in node.gpus]
    count = f"{node.gpu_count} GPU{'' if node.gpu_count == 1 else 's'}"
    if len(node.gpus) != node.gpu_count:
        count += f", {len(node.gpus)} listed"
    if node.sharing is not None:
        count += f", {node.sharing.strategy} x{node.sharing.replicas}"
    lines = [f"node {_ascii(name)}  ({_ascii(node.gpu_product)}, {count})"]
    if not plans:
        return [*lines, "  no GPUs listed"]
    width = _slot_width(plans)
    label = len(f"  gpu {len(plans) - 1} ")
    if any(p.mig for p in plans):
        ruler = "".join(str(s).ljust(width + 1) for s in range(plans[0].slots))
        lines.append(f"{'  slot':<{label + 1}}{ruler}".rstrip())
    for index, (gpu, plan) in enumerate(zip(node.gpus, plans, strict=True)):
        lines += _gpu(f"  gpu {index}".ljust(label), plan, width)
        lines += _replicas(gpu, " " * label)
        lines += _claims(gpu, " " * label)
    return lines


def _devices(gpu: Gpu) -> list[tuple[str, DeviceStatus | None]]:
    """The GPU and each of its MIG instances, keyed as the notes under a bar name them."""
    return [("", gpu.status)] + [(f"GI {d.gpu_instance_id} ", d.status)
                                 for d in gpu.mig_devices or ()]  # fmt: skip


def _holding(status: DeviceStatus | None) -> AllocatedBy | None:
    """Who a device's cell names: the pod the device plugin or run:ai gave it, else the first
    pod a DRA claim gives it."""
    if status is None:
        return None
    if status.allocated_by is not None or not status.dra_claims:
        return status.allocated_by
    return status.dra_claims[0].holder


def _claims(gpu: Gpu, indent: str) -> list[str]:
    """Which DRA claims hold the GPU (or each MIG instance), and for which pods."""
    lines = []
    for what, status in _devices(gpu):
        pods: dict[tuple[str, str], list[str]] = {}
        for c in status.dra_claims if status is not None else ():
            who = f"{_ascii(c.holder.namespace)}/{_ascii(c.holder.pod)}"
            held = pods.setdefault((c.claim_namespace, c.claim), [])
            if who not in held:
                held.append(who)
        lines += [f"{indent}{what}DRA claim {_ascii(ns)}/{_ascii(claim)}: {', '.join(held)}"
                  for (ns, claim), held in pods.items()]  # fmt: skip
    return lines


def _replicas(gpu: Gpu, indent: str) -> list[str]:
    """Who holds each replica of the GPU (or of each MIG instance) when it is shared."""
    return [
        f"{indent}{what}replicas: " + ", ".join(
            f"{r.index} {_ascii(r.holder.namespace)}/{_ascii(r.holder.pod)}" for r in status.replicas)
        for what, status in _devices(gpu) if status is not None and status.replicas
    ]  # fmt: skip


def _plan(gpu: Gpu, model: GpuModel | None) -> _Plan:
    if model is None or gpu.mig_devices is None:
        return _whole(gpu, model)
    slots = model.memory_slots
    owner: list[str | None] = [None] * slots
    blocks: list[_Block] = []
    problems: list[str] = []
    for dev in gpu.mig_devices:  # file order, as validate.py: a later instance is the overlap
        what = f"{_ascii(dev.name)}@{dev.position} GI {dev.gpu_instance_id}"
        profile = model.profile(dev.name)
        if profile is None:
            problems.append(f"{what} not drawn: no such profile on {model.key}")
            continue
        span = range(dev.position, dev.position + profile.memory_slices)
        if span.stop > slots:
            problems.append(f"{what} not drawn: outside the {slots} memory slots")
            continue
        clash = sorted({o for s in span if (o := owner[s]) is not None})
        if clash:
            problems.append(f"{what} not drawn: overlaps {', '.join(clash)}")
            continue
        for s in span:
            owner[s] = what
        holder = _holding(dev.status)
        gi = dev.gpu_instance_id
        blocks.append(_Block(dev.position, len(span), _ascii(dev.name), f"GI {gi}", holder, gi))
    start = 0
    while start < slots:  # each run of unused slots is one block
        if owner[start] is not None:
            start += 1
            continue
        end = start
        while end < slots and owner[end] is None:
            end += 1
        blocks.append(_Block(start, end - start, "", "unused", None, unused=True))
        start = end
    blocks.sort(key=lambda b: b.start)
    return _Plan(slots, tuple(blocks), tuple(problems), mig=True)


def _whole(gpu: Gpu, model: GpuModel | None) -> _Plan:
    """MIG disabled, or a GPU the catalog has no MIG geometry for: one block over every slot."""
    why = "MIG disabled" if model is not None else "no MIG"
    holder = _holding(gpu.status)
    slots = model.memory_slots if model is not None else NO_MIG_SLOTS
    n = len(gpu.mig_devices or ())
    problems = [f"{n} MIG device{'' if n == 1 else 's'} listed on a GPU without MIG: not drawn"]
    block = _Block(0, slots, "whole GPU", why, holder)
    return _Plan(slots, (block,), tuple(problems if n else ()), mig=False)


def _slot_width(plans: list[_Plan]) -> int:
    """Wide enough that every instance's profile and GI id fit, within the bounds."""
    need = MIN_SLOT_WIDTH
    for plan in plans:
        for b in plan.blocks:
            if plan.mig and not b.unused:
                longest = max(len(b.top), len(b.middle))
                need = max(need, -(-(longest - b.span + 1) // b.span))  # ceiling division
    return min(need, MAX_SLOT_WIDTH)


def _gpu(label: str, plan: _Plan, width: int) -> list[str]:
    rows = ["|", "|", "|"]
    notes: list[tuple[str, str]] = []  # (key, namespace/pod) of the pods not shown in full
    for b in plan.blocks:
        inner = b.span * width + b.span - 1
        if b.unused:
            cells = ("." * inner, _fit(b.middle, inner), " " * inner)
        else:
            holder, shortened = _holder(b.holder, inner)
            cells = (_fit(b.top, inner), _fit(b.middle, inner), holder)
            if shortened and b.holder is not None:
                key = "GPU" if b.gi is None else f"GI {b.gi}"
                notes.append((key, f"{_ascii(b.holder.namespace)}/{_ascii(b.holder.pod)}"))
        rows = [row + cell + "|" for row, cell in zip(rows, cells, strict=True)]
    pad = " " * len(label)
    lines = [label + rows[0], pad + rows[1], pad + rows[2]]
    keys = max((len(key) for key, _ in notes), default=0)
    lines += [f"{pad} {key:<{keys}}  {pod}" for key, pod in notes]
    lines += [f"{pad} ! {problem}" for problem in plan.problems]
    return lines


def _holder(a: AllocatedBy | None, width: int) -> tuple[str, bool]:
    """The holder row of a cell, and whether it shows less than `namespace/pod`."""
    if a is None:
        return _fit("free", width), False
    full = f"{_ascii(a.namespace)}/{_ascii(a.pod)}"
    if len(full) <= width:
        return full.ljust(width), False
    return _fit(_ascii(a.pod), width), True


def _fit(text: str, width: int) -> str:
    """`text` in exactly `width` characters, cut with `~` when longer."""
    if len(text) <= width:
        return text.ljust(width)
    return text[: width - 1] + CUT


def _ascii(text: str) -> str:
    """Printable ASCII only, one character for one: nothing in the input can break alignment."""
    return "".join(c if " " <= c <= "~" else "?" for c in text)
