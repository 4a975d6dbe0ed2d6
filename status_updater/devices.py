"""A node's GPUs and MIG devices, from its labels and annotations, before any pod is placed.

One function per kind of node, as its producer describes it:

- run:ai dynamic MIG (`runai_dynamic_node`): `run.ai/mig.config` and the mig-faker's mapping,
  read in `dynamic_mig.py`;
- static MIG (`static_mig_node`): the mig-parted layout `nvidia.com/mig.config` names;
- advertised only (`advertised_node`): a MIG node with no layout label, whose device plugin
  advertises `nvidia.com/mig-<profile>` (a simulator's node);
- whole GPUs (`whole_gpu_node`): everything else.

Ids are uuid5 of node, GPU index (and GI): stable across runs, restarts and replicas.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from status_updater.dra import DYNAMIC, SELECTED
from status_updater.dynamic_mig import runai_mig_devices
from status_updater.objects import (
    QUANTITY,
    Obj,
    advertised_migs,
    metadata,
    node_name,
    static_layout,
    strings,
)
from topology import dra, migparted, runai
from topology.catalog import MIG_SUFFIX, GpuModel, model_for_product
from topology.errors import TopologyError
from topology.model import Gpu, MigDevice, NodeTopology, Sharing
from topology.sharing import SHARED_SUFFIX, parse_sharing, shared_by_allocatable
from topology.validate import node_errors

_GPU_NAMESPACE = uuid.UUID("6f1c2a4e-3b7d-5e8f-9a0b-1c2d3e4f5a6b")


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{uuid.uuid5(_GPU_NAMESPACE, f'{node_name}/{index}')}"


def mig_uuid(node_name: str, index: int, gpu_instance_id: int) -> str:
    """A static-MIG instance's id: stable for its node, GPU and GI (mig-manager's are random)."""
    return f"MIG-{uuid.uuid5(_GPU_NAMESPACE, f'{node_name}/{index}/{gpu_instance_id}')}"


def build_node(
    node: Obj,
    layouts: migparted.Layouts | None = None,
    warnings: list[TopologyError] | None = None,
) -> NodeTopology:
    """A node's GPUs and MIG devices, without allocations. Raises TopologyError if unusable.

    A static-MIG node takes its layout from `layouts` (mig-parted's, default the built-in ones);
    a layout that cannot be applied is a warning, and leaves MIG on with no instance.
    """
    found: list[TopologyError] = [] if warnings is None else warnings
    name = node_name(node)
    obj = f"node {name}"
    raw = strings(metadata(node).get("labels"))
    labels = runai.parse_node_labels(raw, obj)
    product = str(raw.get(runai.LABEL_PRODUCT, ""))
    model = model_for_product(labels.gpu_product)
    if labels.is_dynamic_mig_enabled:  # run:ai's dynamic MIG shares by its own fractions
        topo = runai_dynamic_node(node, labels, model, product, found)
    else:
        config = static_layout(node)
        advertised = None
        if config is None and model is not None:
            advertised = _advertised(node, model, product, labels.gpu_count)
        sharing = parse_sharing(raw, obj) or shared_by_allocatable(
            advertised_migs(node), labels.gpu_count
        )
        if config is not None:
            topo = static_mig_node(node, config, labels, model, product, layouts, sharing, found)
        elif advertised is not None:
            assert model is not None  # only a catalog model's advertised devices are placed
            topo = advertised_node(node, advertised, labels, model, product, sharing, found)
        else:
            topo = whole_gpu_node(name, labels, model, product, sharing)
        if node.get(DYNAMIC) and model is not None:
            topo = _instances_destroyed(topo, model)
    if node.get(SELECTED):  # a DRA node: the exporter names the driver its slices name
        topo = replace(topo, driver_version=dra.labelled(raw, dra.LABEL_DRIVER, dra.DRA_DRIVER))
    errors = node_errors(name, topo)
    if errors:
        raise errors[0]
    return topo


def _instances_destroyed(topo: NodeTopology, model: GpuModel) -> NodeTopology:
    """The node as the DRA driver's DynamicMIG leaves it at start: every MIG device it did not
    make destroyed (a claim's are placed later), and MIG off where no instance is left on a GPU
    whose MIG mode toggles without a reset; an Ampere GPU keeps MIG on."""
    off = model.mig_toggles_without_reset
    gpus = tuple(
        g if g.mig_devices is None else replace(g, mig_devices=None if off else ())
        for g in topo.gpus
    )
    return replace(topo, gpus=gpus)


def node_memory(labels: runai.NodeLabels, model: GpuModel | None, product: str) -> int:
    """A GPU's memory in MiB: the label's, or the catalog's where the label is missing or (GFD's
    single strategy, product `<model>-MIG-<profile>`) carries the MIG device's memory."""
    if model is not None and (labels.gpu_memory == 0 or MIG_SUFFIX in product):
        return model.total_memory_mib
    return labels.gpu_memory


def runai_dynamic_node(
    node: Obj,
    labels: runai.NodeLabels,
    model: GpuModel | None,
    product: str,
    warnings: list[TopologyError],
) -> NodeTopology:
    """A run:ai dynamic-MIG node: its GPUs with the instances run:ai asked for. Not shared:
    run:ai shares by its own fractions."""
    name = node_name(node)
    per_gpu = runai_mig_devices(node, labels, model, product, warnings)
    gpus = tuple(Gpu(id=gpu_uuid(name, i), mig_devices=m) for i, m in enumerate(per_gpu))
    memory = node_memory(labels, model, product)
    return NodeTopology(
        gpu_count=len(gpus),
        gpu_memory=memory,
        gpu_product=labels.gpu_product,
        is_dynamic_mig_enabled=True,
        gpus=gpus,
    )


def whole_gpu_node(
    name: str,
    labels: runai.NodeLabels,
    model: GpuModel | None,
    product: str,
    sharing: Sharing | None,
) -> NodeTopology:
    """A node of whole GPUs (MIG off, or a model MIG does not know)."""
    gpus = tuple(Gpu(id=gpu_uuid(name, i)) for i in range(labels.gpu_count))
    memory = node_memory(labels, model, product)
    return NodeTopology(
        gpu_count=labels.gpu_count,
        gpu_memory=memory,
        gpu_product=labels.gpu_product,
        gpus=gpus,
        sharing=sharing,
    )


def static_mig_node(
    node: Obj,
    config: str,
    labels: runai.NodeLabels,
    model: GpuModel | None,
    product: str,
    layouts: migparted.Layouts | None,
    sharing: Sharing | None,
    warnings: list[TopologyError],
) -> NodeTopology:
    """A static-MIG node: per GPU, what mig-manager leaves of the layout `config` names in
    `layouts` (default the built-in ones)."""
    obj = f"node {node_name(node)}"
    found = migparted.builtin() if layouts is None else layouts
    count = labels.gpu_count
    if MIG_SUFFIX in product and model is not None:
        count = _single_strategy_gpus(found, config, model, product, labels.gpu_count, obj)
    try:
        per_gpu = migparted.node_layout(found, config, model, count, obj)
    except TopologyError as e:
        warnings.append(e)
        per_gpu = [migparted.GpuLayout(True, ())] * count
    return _static_topology(node, per_gpu, labels, model, product, sharing, warnings)


def advertised_node(
    node: Obj,
    advertised: list[tuple[tuple[str, int], ...]],
    labels: runai.NodeLabels,
    model: GpuModel,
    product: str,
    sharing: Sharing | None,
    warnings: list[TopologyError],
) -> NodeTopology:
    """A MIG node without a layout label: per GPU, the instances its advertised resources
    imply, placed as mig-parted places them."""
    obj = f"node {node_name(node)}"
    try:
        per_gpu = []
        for i, counts in enumerate(advertised):
            try:
                per_gpu.append(migparted.GpuLayout(True, migparted.place(model, counts)))
            except migparted.Unplaceable as e:  # no label to blame: what the node advertises
                raise TopologyError(
                    obj, "status.allocatable", f"on GPU {i}: {e} (no {migparted.LABEL_CONFIG})"
                ) from None
    except TopologyError as e:
        warnings.append(e)
        per_gpu = [migparted.GpuLayout(True, ())] * len(advertised)
    return _static_topology(node, per_gpu, labels, model, product, sharing, warnings)


def _static_topology(
    node: Obj,
    per_gpu: list[migparted.GpuLayout],
    labels: runai.NodeLabels,
    model: GpuModel | None,
    product: str,
    sharing: Sharing | None,
    warnings: list[TopologyError],
) -> NodeTopology:
    name = node_name(node)
    gpus = _static_gpus(name, model, per_gpu)
    if sharing is not None and sharing.strategy == "mps" and any(g.mig_devices for g in gpus):
        warnings.append(TopologyError(
            f"node {name}", "metadata.labels[nvidia.com/gpu.sharing-strategy]",
            "MPS cannot share MIG devices (the device plugin refuses it): not shared",
        ))  # fmt: skip
        sharing = None
    memory = node_memory(labels, model, product)
    return NodeTopology(
        gpu_count=len(gpus),
        gpu_memory=memory,
        gpu_product=labels.gpu_product,
        gpus=tuple(gpus),
        sharing=sharing,
    )


def _single_strategy_gpus(
    layouts: migparted.Layouts,
    config_name: str,
    model: GpuModel,
    raw_product: str,
    labelled: int,
    obj: str,
) -> int:
    """Single strategy: gpu.count counts MIG devices of the product's profile. Per GPU, the
    layout's number of them; if the layout changed since GFD wrote the labels (a relabel of a
    simulated node), as many as fit, as in the all-<profile> layouts."""
    profile = model.profile(raw_product.split(MIG_SUFFIX, 1)[1])
    per_gpu = profile.max_count if profile else 1
    try:
        (first, *_) = migparted.node_layout(layouts, config_name, model, 1, obj)
        if profile is not None and {p for _, p in first.devices} == {profile.name}:
            per_gpu = len(first.devices)
    except TopologyError:
        pass  # reported when the layout is applied, with the node's real GPU count
    return max(1, -(-labelled // per_gpu))


def _advertised(
    node: Obj, model: GpuModel, raw_product: str, labelled: int
) -> list[tuple[tuple[str, int], ...]] | None:
    """A MIG node without `nvidia.com/mig.config` (a simulator that only advertises the
    resources): per GPU, the (profile, count)s its advertised instances imply, spread evenly
    (single strategy: `nvidia.com/gpu.count` of the product's profile, as many per GPU as fit)."""
    if MIG_SUFFIX in raw_product:
        profile = model.profile(raw_product.split(MIG_SUFFIX, 1)[1])
        if profile is None:
            return None
        totals = {profile.name: labelled}
        gpus = max(1, -(-labelled // profile.max_count))
    else:
        totals = {}
        for resource, value in advertised_migs(node).items():
            # A shared profile's count is its instances times their replicas: not a layout.
            if resource.endswith(SHARED_SUFFIX) or not resource.startswith(
                runai.MIG_RESOURCE_PREFIX
            ):
                continue
            if QUANTITY.fullmatch(value) and int(value) > 0:
                totals[resource.removeprefix(runai.MIG_RESOURCE_PREFIX)] = int(value)
        gpus = labelled
    if not totals:
        return None
    per_gpu = []
    for i in range(gpus):  # GPU i's share: the lower GPUs take the remainder
        shares = {p: n // gpus + (i < n % gpus) for p, n in totals.items()}
        per_gpu.append(tuple(sorted((p, k) for p, k in shares.items() if k)))
    return per_gpu


def _static_gpus(
    name: str, model: GpuModel | None, per_gpu: list[migparted.GpuLayout]
) -> list[Gpu]:
    """The GPUs of a static-MIG node with these instances, ids from node, GPU and GI."""
    gpus = []
    for index, layout in enumerate(per_gpu):
        migs: tuple[MigDevice, ...] | None = None
        if layout.mig_enabled and model is not None:
            devices = []
            for position, profile_name in layout.devices:
                profile = model.profile(profile_name)
                if profile is None:
                    continue  # never: placed from the catalog's profiles
                gi = model.gpu_instance_id(profile, position)
                devices.append(
                    MigDevice(
                        name=profile_name,
                        position=position,
                        gpu_instance_id=gi,
                        id=mig_uuid(name, index, gi),
                    )
                )
            migs = tuple(devices)
        gpus.append(Gpu(id=gpu_uuid(name, index), mig_devices=migs))
    return gpus
