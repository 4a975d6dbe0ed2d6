"""mig-parted configs (the GPU operator's ConfigMap, or its config.yaml): every refusal names
the file, the field, and the GPU it is about."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from topology import migparted
from topology.catalog import model_for_product
from topology.errors import TopologyError

CONFIG = """
version: v1
mig-configs:
  first-only: [{devices: [0], mig-enabled: true, mig-devices: {"1g.5gb": 7}}]
  first-off: [{devices: [0], mig-enabled: false}]
"""


def refusal(call: Callable[[], object]) -> str:
    with pytest.raises(TopologyError) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize(
    ("call", "said"),
    [
        (lambda: migparted.load("version: [", "f.yaml"), "f.yaml: config: is not valid YAML: "),
        (lambda: migparted.load("", "f.yaml"), "f.yaml: config: expected a mapping, got nothing"),
        (lambda: migparted.load("kind: ConfigMap\ndata: {config.yaml: '['}\n", "cm.yaml"),
         "cm.yaml: data[config.yaml]: is not valid YAML: "),
        (lambda: migparted.parse("[", "configmap ns/c", "data[config.yaml]"),
         "configmap ns/c: data[config.yaml]: is not valid YAML: "),
    ],
)  # fmt: skip
def test_a_bad_config_names_its_field(call: Callable[[], object], said: str) -> None:
    assert refusal(call).startswith(said)


def test_a_layout_without_an_entry_for_a_gpu_names_the_gpu_and_its_model() -> None:
    layouts = migparted.parse(CONFIG, "test")
    field = "node n: metadata.labels[nvidia.com/mig.config]"
    a100 = model_for_product("NVIDIA-A100-SXM4-40GB")
    assert refusal(lambda: migparted.node_layout(layouts, "first-only", a100, 2, "node n")) == (
        f"{field}: layout 'first-only' has no entry for GPU 1 (A100-40GB)"
    )
    # A GPU the catalog does not know (no model to name).
    assert refusal(lambda: migparted.node_layout(layouts, "first-off", None, 2, "node n")) == (
        f"{field}: layout 'first-off' has no entry for GPU 1 (this GPU)"
    )
