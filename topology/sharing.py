"""GPU sharing as the NVIDIA device plugin configures it, read from GPU feature discovery's labels.

With time-slicing or MPS, the plugin advertises each GPU (or static MIG instance) as `replicas`
devices, `<uuid>::0` … `<uuid>::<replicas-1>`, and GFD labels the node:

    nvidia.com/gpu.replicas: "4"              per device, not times the GPU count
    nvidia.com/gpu.sharing-strategy: time-slicing | mps | none
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB-SHARED   (-SHARED unless the resource is renamed)
    nvidia.com/mps.capable: "true"            MPS only, never with MIG
    nvidia.com/mig-1g.5gb.replicas: "4"       the same per MIG profile (mixed strategy)

With `renameByDefault` the resource is `nvidia.com/gpu.shared` (`nvidia.com/mig-1g.5gb.shared`)
instead of `nvidia.com/gpu`. Pure: labels in, `Sharing` out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from topology.errors import TopologyError
from topology.model import SHARING_STRATEGIES, Sharing
from topology.runai import MIG_RESOURCE_PREFIX

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_SUFFIX = ".shared"  # the renamed resource
SHARED_GPU_RESOURCE = GPU_RESOURCE + SHARED_SUFFIX
MAX_REPLICAS = 1024  # far above any real configuration; bounds what one label can make us hold


# Decimal digits as Kubernetes writes counts: str.isdigit() also takes `²` and `٣`, which int()
# refuses or reads, and any number of them, which int() refuses past 4,300.
_DIGITS = re.compile(r"[0-9]{1,9}")


def _resources(labels: Mapping[str, str]) -> list[str]:
    """The resources GFD labelled with sharing: `nvidia.com/gpu` and `nvidia.com/mig-<profile>`."""
    return sorted(
        key.removesuffix(".replicas")
        for key in labels
        if key.endswith(".replicas")
        and (key == f"{GPU_RESOURCE}.replicas" or key.startswith(MIG_RESOURCE_PREFIX))
    )


def parse_sharing(labels: Mapping[str, str], obj: str) -> Sharing | None:
    """The node's sharing, or None when nothing is shared (no label, 1 replica, strategy none).

    One strategy applies to the whole node (the plugin's rule); where resources have different
    replica counts, the largest is used. TopologyError for a count or strategy that is not one.
    """
    found: Sharing | None = None
    for resource in _resources(labels):
        key = f"{resource}.replicas"
        text = labels[key]
        if not _DIGITS.fullmatch(text) or not 0 <= int(text) <= MAX_REPLICAS:
            raise TopologyError(
                obj, f"metadata.labels[{key}]", f"expected 0 to {MAX_REPLICAS}, got {text!r}"
            )
        replicas = int(text)
        strategy_key = f"{resource}.sharing-strategy"
        strategy = labels.get(strategy_key, "time-slicing" if replicas > 1 else "none")
        if strategy not in (*SHARING_STRATEGIES, "none"):
            raise TopologyError(
                obj,
                f"metadata.labels[{strategy_key}]",
                f"must be time-slicing, mps or none, got {strategy!r}",
            )
        if strategy == "none" or replicas < 2:
            continue
        if found is None or replicas > found.replicas:
            found = Sharing(strategy, replicas)
    return found


def shared_by_allocatable(allocatable: Mapping[str, str], gpus: int) -> Sharing | None:
    """A node without GFD's sharing labels (a simulated one) that advertises the renamed
    `nvidia.com/gpu.shared`: its replicas per GPU are what it advertises over its GPU count.
    The strategy is not advertised; time-slicing is the plugin's usual one."""
    text = allocatable.get(SHARED_GPU_RESOURCE, "")
    if not _DIGITS.fullmatch(text) or gpus <= 0 or int(text) // gpus < 2:
        return None
    return Sharing("time-slicing", min(int(text) // gpus, MAX_REPLICAS))


def base_resource(resource: str) -> str:
    """`nvidia.com/gpu.shared` -> `nvidia.com/gpu`: what a renamed shared resource stands for."""
    return resource.removesuffix(SHARED_SUFFIX)
