"""Copies of the topology model keep every field: the updater copies a model object with changes
by `dataclasses.replace` only, never by listing its fields (a field added to the model later would
be dropped there, silently: it takes its default).

The objects are generated from `dataclasses.fields`, every field set to a value that is not its
default, so a field added to the model is covered without a change here; a field of a type the
filler does not know fails `test_every_model_class_is_filled_with_no_default_left` until it is
taught. Each object goes through the paths that copy it (the placement board and its policies,
`reconcile_node`, `ids.without_id`), and every field the path is not meant to change must
come out as it went in.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import types
from collections.abc import Mapping
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest

from status_updater.ids import without_id
from status_updater.placement.board import Board
from status_updater.reconcile import reconcile_node
from topology import dra, model
from topology.catalog import model_for_product
from topology.errors import TopologyError
from topology.model import DeviceStatus, Gpu, MigDevice, NodeTopology

MODEL_CLASSES = sorted(
    (c for c in vars(model).values()
     if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == model.__name__),
    key=lambda c: c.__name__,
)  # fmt: skip
PRODUCT = "NVIDIA-A100-SXM4-40GB"  # the catalog's: its MIG profiles are real to the policies
NODE = "n"


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


class Filler:
    """Model objects with every field set, each to a value of its type that is not its default
    and (numbers and strings) no other field's: a field dropped by a copy shows."""

    def __init__(self) -> None:
        self.count = itertools.count(1)

    def build(self, cls: type[Any], **given: object) -> Any:
        hints = get_type_hints(cls)
        values = {
            f.name: given[f.name] if f.name in given
            else self.value(hints[f.name], f"{cls.__name__}.{f.name}", _default(f))
            for f in dataclasses.fields(cls)
        }  # fmt: skip
        return cls(**values)

    def value(self, tp: Any, where: str, default: object = dataclasses.MISSING) -> Any:
        origin, args = get_origin(tp), get_args(tp)
        if tp is bool:
            return default is not True
        if tp is int:
            return next(value for value in self.count if value != default)
        if tp is float:
            return next(self.count) + 0.5
        if tp is str:
            return f"{where}-{next(self.count)}"
        if origin in (Union, types.UnionType):
            return self.value(next(a for a in args if a is not type(None)), where)
        if origin is Literal:
            return next(a for a in args if a != default)
        if origin is tuple:
            if len(args) == 2 and args[1] is Ellipsis:
                return (self.value(args[0], where),)
            return tuple(self.value(a, where) for a in args)
        if origin in (Mapping, dict):
            return {self.value(args[0], where): self.value(args[1], where)}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return next(m for m in tp if m != default)
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return self.build(tp)
        if tp is TopologyError:
            return TopologyError(f"{where}-obj", "field", "message")
        raise TypeError(f"{where}: a {tp!r}: teach test_copies.Filler.value to fill it")


def differences(
    before: object, after: object, changes: frozenset[str], path: str = ""
) -> list[str]:
    """Each field of `before` that `after` does not keep, by its path (`gpus[].status`), but
    those in `changes`: what the path means to change. A status a device gets where it had none
    is placement."""
    if path in changes or (path.endswith("status") and before is None):
        return []
    if dataclasses.is_dataclass(before) and type(before) is type(after):
        return [d for f in dataclasses.fields(before) for d in differences(
            getattr(before, f.name), getattr(after, f.name), changes,
            f"{path}.{f.name}" if path else f.name)]  # fmt: skip
    if isinstance(before, tuple) and isinstance(after, tuple) and len(before) == len(after):
        return [d for b, a in zip(before, after, strict=True)
                for d in differences(b, a, changes, f"{path}[]")]  # fmt: skip
    return [] if before == after else [f"{path}: {before!r} became {after!r}"]


# What placement changes: a GPU's status is the pods' (the board starts every GPU free), and of a
# MIG device's status that a pod joins (a claim on it, a replica of it), its pods' usage, replicas
# and claims.
PLACED = frozenset({
    "gpus[].status",
    *(f"gpus[].mig_devices[].status.{name}"
      for name in ("pod_gpu_usage_status", "replicas", "dra_claims")),
})  # fmt: skip


def pod(name: str, limits: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A running pod of node n: its first container's `limits`."""
    container: dict[str, Any] = {"name": "main"}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"nodeName": NODE, "containers": [container]},
        "status": {"phase": "Running"},
    }


def placed(
    node: NodeTopology,
    pods: list[dict[str, Any]],
    holds: Mapping[str, list[dict[str, str]]] | None = None,
) -> tuple[NodeTopology, list[TopologyError]]:
    """Placed as the state places them, `holds` the pods' DRA devices by uid."""
    node_obj = {"kind": "Node", "metadata": {"name": NODE}}
    return reconcile_node(node_obj, pods, built=(node, []), holds=holds)


def holders(node: NodeTopology) -> set[str]:
    statuses = [g.status for g in node.gpus]
    statuses += [d.status for g in node.gpus for d in g.mig_devices or ()]
    return {uid for s in statuses if s is not None for uid in s.pod_gpu_usage_status}


def mig_1g(fill: Filler, position: int, **given: object) -> MigDevice:
    built: MigDevice = fill.build(MigDevice, name="1g.5gb", position=position, **given)
    return built


@pytest.mark.parametrize("cls", MODEL_CLASSES, ids=lambda c: c.__name__)
def test_every_model_class_is_filled_with_no_default_left(cls: type[Any]) -> None:
    built = Filler().build(cls)
    left = [f.name for f in dataclasses.fields(cls) if getattr(built, f.name) == _default(f)]
    assert not left, f"{cls.__name__}: {left} left at the default"


def test_the_board_keeps_every_field_it_does_not_place() -> None:
    fill = Filler()
    node = fill.build(NodeTopology, gpus=tuple(fill.build(Gpu) for _ in range(3)))
    assert all(g.status is not None and g.mig_devices for g in node.gpus)
    board = Board(NODE, node)
    who = pod("p")
    warnings: list[TopologyError] = []
    holder = fill.build(model.AllocatedBy)
    board.hold(who, "pod ns/p", holder, "uid-p", warnings, [0])
    status = fill.build(DeviceStatus)
    board.set_status(1, None, status)
    board.set_status(2, 0, status)
    board.release("uid-p")
    after = board.result()
    assert not warnings
    assert [g.status for g in after.gpus][1:] == [status, None]
    assert after.gpus[0].status is not None and after.gpus[0].status.allocated_by == holder
    assert after.gpus[2].mig_devices is not None and after.gpus[2].mig_devices[0].status == status
    assert not differences(node, after, PLACED | {"gpus[].mig_devices[].status"})


def test_static_mig_and_dra_placement_keep_every_field() -> None:
    """The device plugin's whole GPU and MIG instance, and DRA claims: a whole GPU, and a MIG
    instance that a claim (the same one) holds already, whose status the claim joins."""
    fill = Filler()
    a100 = model_for_product(PRODUCT)
    assert a100 is not None
    profile = a100.profile("1g.5gb")
    assert profile is not None
    claimed = fill.build(DeviceStatus)
    gpus = (
        fill.build(Gpu, mig_devices=None),  # the plugin's whole GPU
        fill.build(Gpu, mig_devices=(mig_1g(fill, 0, status=None), mig_1g(fill, 1, status=claimed))),
        fill.build(Gpu, mig_devices=None),  # DRA's whole GPU
    )  # fmt: skip
    node = fill.build(NodeTopology, gpu_product=PRODUCT, is_dynamic_mig_enabled=False,
                      sharing=None, gpus=gpus)  # fmt: skip
    claim = claimed.dra_claims[0]
    holds = [{"pool": NODE, "claim": claim.claim, "claim-namespace": claim.claim_namespace,
              "container": "main", "device": device}
             for device in (dra.gpu_device(2), dra.mig_device(1, profile, 1))]  # fmt: skip
    pods = [
        pod("whole", {"nvidia.com/gpu": "1"}),
        pod("mig", {"nvidia.com/mig-1g.5gb": "1"}),
        pod("claimant"),
    ]
    after, warnings = placed(node, pods, {"uid-claimant": holds})
    assert warnings == []
    assert holders(after) >= {"uid-whole", "uid-mig", "uid-claimant"}
    assert not differences(node, after, PLACED)


def test_run_ai_placement_keeps_every_field() -> None:
    """A run:ai dynamic-MIG node: the instance a pod's annotation names, and whole GPUs."""
    fill = Filler()
    gpus = (fill.build(Gpu, mig_devices=(mig_1g(fill, 3, status=None),)),
            fill.build(Gpu, mig_devices=None))  # fmt: skip
    node = fill.build(NodeTopology, gpu_product=PRODUCT, is_dynamic_mig_enabled=True,
                      sharing=None, gpus=gpus)  # fmt: skip
    device = {"name": "nvidia.com/mig-1g.5gb", "position": 3, "gpuindex": 0}
    named = pod("named")
    named["metadata"]["annotations"] = {"runai-mig-device": json.dumps(device)}
    after, warnings = placed(node, [named, pod("whole", {"nvidia.com/gpu": "1"})])
    assert warnings == []
    assert holders(after) == {"uid-named", "uid-whole"}
    assert not differences(node, after, PLACED)


def test_shared_placement_keeps_every_field() -> None:
    """Replicas of a whole GPU, and of a MIG instance whose status its replicas join."""
    fill = Filler()
    shared = fill.build(DeviceStatus, dra_claims=())  # a claim's device is not shared
    gpus = (fill.build(Gpu, mig_devices=None),
            fill.build(Gpu, mig_devices=(mig_1g(fill, 0, status=shared),)))  # fmt: skip
    node = fill.build(NodeTopology, gpu_product=PRODUCT, is_dynamic_mig_enabled=False,
                      sharing=model.Sharing("time-slicing", 2), gpus=gpus)  # fmt: skip
    pods = [pod("gpu", {"nvidia.com/gpu": "1"}), pod("mig", {"nvidia.com/mig-1g.5gb": "1"})]
    after, warnings = placed(node, pods)
    assert warnings == []
    assert holders(after) >= {"uid-gpu", "uid-mig"}
    assert not differences(node, after, PLACED)


def test_taking_an_id_off_keeps_every_other_field() -> None:
    fill = Filler()
    gpus = tuple(fill.build(Gpu, mig_devices=(fill.build(MigDevice), fill.build(MigDevice)))
                 for _ in range(2))  # fmt: skip
    node = fill.build(NodeTopology, gpus=gpus)
    taken = gpus[1].mig_devices[1].id
    after = without_id(node, taken)
    assert [d.id for g in after.gpus for d in g.mig_devices or ()].count(None) == 1
    assert taken not in {d.id for g in after.gpus for d in g.mig_devices or ()}
    assert differences(node, after, frozenset()) == [
        f"gpus[].mig_devices[].id: {taken!r} became None"
    ]
