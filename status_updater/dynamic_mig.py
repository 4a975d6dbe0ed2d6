"""run:ai dynamic MIG: a node's MIG devices from `run.ai/mig.config` and the mig-faker's mapping.

run:ai writes the layout it asks for (`run.ai/mig.config`) and, once the instances exist, their
uuids and GI ids (`run.ai/mig-mapping`). fake-gpu-operator's mig-faker writes the GI *profile*
id there, so a mapped GI id is taken only where the driver could give it (mig-profiles.md §3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from status_updater.objects import Obj, annotation, metadata, node_name, strings
from topology import runai
from topology.catalog import MIG_SUFFIX, GpuModel
from topology.errors import TopologyError
from topology.model import MigDevice


def runai_mig_devices(
    node: Obj,
    labels: runai.NodeLabels,
    model: GpuModel | None,
    product: str,
    warnings: list[TopologyError],
) -> list[tuple[MigDevice, ...] | None]:
    """Per GPU, its MIG devices (None: MIG off); as many GPUs as the node has (GFD's single
    strategy counts MIG devices in `nvidia.com/gpu.count`: the GPUs are those mig.config names)."""
    obj = f"node {node_name(node)}"
    if model is None:
        raise TopologyError(
            obj,
            f"metadata.labels[{runai.LABEL_PRODUCT}]",
            f"{labels.gpu_product!r} is not a MIG-capable GPU in the catalog",
        )
    annotations = strings(metadata(node).get("annotations"))
    layout = None
    mapping: dict[tuple[int, int], runai.MappedDevice] = {}
    config = annotation(annotations, runai.ANNOTATION_MIG_CONFIG, obj)
    gpu_count = labels.gpu_count
    if config:
        layout = runai.parse_mig_config(config, obj, gpu_count)
    encoded = annotation(annotations, runai.ANNOTATION_MIG_MAPPING, obj)
    if encoded:
        mapping = runai.parse_mig_mapping(encoded, obj)
    if MIG_SUFFIX in product and layout is not None and layout.devices:
        gpu_count = _physical_gpus(layout, gpu_count)
    per_gpu: list[tuple[MigDevice, ...] | None] = []
    refused: dict[int, list[tuple[int, int]]] = {}
    for index in range(gpu_count):
        migs = None
        if layout is None or layout.enabled.get(index, True):
            wanted = layout.devices.get(index, ()) if layout else ()
            migs, not_taken = _mig_devices(model, index, wanted, mapping)
            if not_taken:
                refused[index] = not_taken
        per_gpu.append(migs)
    if refused:
        warnings.append(_refused_ids_warning(obj, refused))
    return per_gpu


def _physical_gpus(layout: runai.MigLayout, labelled: int) -> int:
    """Under the single strategy `nvidia.com/gpu.count` is the number of MIG devices, not GPUs:
    take the GPUs the mig.config names (with `devices: all`, MIG devices / devices per GPU)."""
    named = max(layout.devices) + 1
    if named < labelled:
        return named
    per_gpu = max(len(d) for d in layout.devices.values()) or 1
    return max(1, labelled // per_gpu)


def _mig_devices(
    model: GpuModel,
    gpu_index: int,
    wanted: Iterable[tuple[int, str]],
    mapping: Mapping[tuple[int, int], runai.MappedDevice],
) -> tuple[tuple[MigDevice, ...], list[tuple[int, int]]]:
    """One GPU's instances, and the (position, GI id) of each mapped GI id that was not taken.

    fake-gpu-operator's mig-faker writes the GI *profile* id (19 for every 1g.5gb) as
    `gpu_instance_id`. So a mapped id is taken only where the driver could give it to that
    profile at that placement, in either orientation; the others are derived from the placement
    in the orientation the taken ones show (the model's where they show none). A GPU has one
    orientation, so its ids are distinct; where the taken ones mix both and two instances would
    get one id, none is taken.
    """
    wanted = tuple(wanted)
    if {pos for (gpu, pos) in mapping if gpu == gpu_index} != {pos for pos, _ in wanted}:
        # The mapping describes another layout: run:ai rewrites it after a mig.config change,
        # and until then the new devices have no id.
        mapping = {}
    profiles = {
        pos: p
        for pos, name in wanted
        if (p := model.profile(name)) is not None and pos < model.memory_slots
    }

    def derived(position: int, swapped: bool) -> int:
        profile = profiles.get(position)
        # 0 where validation rejects the device right after: that id is never shown.
        return 0 if profile is None else model.gpu_instance_id(profile, position, swapped)

    mapped = {
        pos: m.gpu_instance_id
        for pos, _ in wanted
        if (m := mapping.get((gpu_index, pos))) is not None and m.gpu_instance_id is not None
    }
    usable = {
        pos: gi
        for pos, gi in mapped.items()
        if pos in profiles and gi in model.gpu_instance_ids(profiles[pos], pos)
    }
    orientations = (model.swapped_halves, not model.swapped_halves)
    swapped = next(
        (s for s in orientations if all(derived(p, s) == gi for p, gi in usable.items())),
        model.swapped_halves,
    )
    ids = {pos: usable.get(pos, derived(pos, swapped)) for pos, _ in wanted}
    if len(set(ids.values())) < len(ids):
        ids = {pos: derived(pos, swapped) for pos, _ in wanted}
    devices = tuple(
        MigDevice(
            name=name,
            position=position,
            gpu_instance_id=ids[position],
            id=m.uuid if (m := mapping.get((gpu_index, position))) else None,
        )
        for position, name in wanted
    )
    return devices, [(pos, gi) for pos, gi in mapped.items() if ids[pos] != gi]


def _refused_ids_warning(obj: str, refused: Mapping[int, list[tuple[int, int]]]) -> TopologyError:
    """One line for all of a node's mapped GI ids that were not taken."""
    count = sum(map(len, refused.values()))
    gpu, [(position, gi), *_] = next(iter(refused.items()))
    return TopologyError(
        obj,
        f"metadata.annotations[{runai.ANNOTATION_MIG_MAPPING}]",
        f"{count} gpu_instance_id value(s) are not the GI id the driver gives that profile at "
        f"that placement (GPU {gpu} position {position}: {gi}; fake-gpu-operator writes "
        "profile ids): ids derived from the placements, device uuids kept",
    )


# --- pods ----------------------------------------------------------------------------------------
