"""The updater's writers, where no API is needed to see what they do."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from status_updater.single import SingleWriter, TooLarge
from status_updater.state import reconcile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from scale import cluster


def test_a_topology_over_one_configmap_is_refused_with_the_reason() -> None:
    topology, _ = reconcile(*cluster(nodes=80, gpus=8))
    writer = SingleWriter(None, "topology", "gpu-operator")  # type: ignore[arg-type]
    with pytest.raises(TooLarge) as e:
        writer.write(topology)  # refused before any API call
    message = str(e.value)
    assert message.startswith("ConfigMap gpu-operator/topology: topology.yml for 80 nodes is 1.")
    assert message.endswith(
        "MiB, over the 1 MiB a ConfigMap holds; not written; use --layout per-node"
    )
