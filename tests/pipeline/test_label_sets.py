"""dcgm-exporter 4.8's label set (`--dcgm-exporter-version 4.8`) against its real line (dra.md), and
its `pci_bus_id` against the ResourceSlice's bus address of the same GPU."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from status_updater.devices import build_node
from status_updater.objects import slim_node
from status_updater.resourceslices import node_slices
from tests.support.base import ROOT, SAMPLES, run_cli
from tests.support.promtext import Series, parse

# The real line of a static-MIG A30 instance held by a DRA claim (dcgm-exporter PR #664).
REAL = next(
    m[1]
    for m in re.finditer(
        r"`(DCGM_FI_DEV_SM_CLOCK\{[^`]*\} \d+)`",
        (ROOT / "tests" / "reference" / "dra.md").read_text(),
    )
)
STATIC = SAMPLES / "static" / "nodes" / "a100-40gb-mixed.yaml"


def topology() -> str:
    """The static-MIG sample node's topology ConfigMap, as render writes it."""
    rendered = run_cli("status_updater", "render", "--nodes", str(STATIC))
    assert rendered.returncode == 0, rendered.stderr
    return rendered.stdout


def serve_once(tmp_path: Path, *flags: str) -> list[Series]:
    """The exporter's series for that node."""
    path = tmp_path / "cm.yaml"
    path.write_text(topology())
    done = run_cli("exporter", "--topology-file", str(path), "--node-name", "a100-40gb-static",
                   "--hostname", "a100-40gb-static", "--once", *flags)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return parse(done.stdout)


def test_the_labels_are_in_the_real_lines_order(tmp_path: Path) -> None:
    (real,) = parse(f"# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n{REAL}\n")
    ours = next(s for s in serve_once(tmp_path, "--dcgm-exporter-version", "4.8")
                if s.name == "DCGM_FI_DEV_SM_CLOCK" and "GPU_I_PROFILE" in s.label_names)  # fmt: skip
    # The real line is shortened (no label fields) and held by a claim (its pod and dra_*
    # labels); nobody holds the sample's instances, and a free device has no pod labels.
    shared = [n for n in real.label_names
              if not n.startswith("dra_") and n not in ("container", "namespace", "pod")]  # fmt: skip
    assert [n for n in ours.label_names if n in shared] == shared
    assert [n for n in ours.label_names if n not in shared] == ["DCGM_FI_DRIVER_VERSION"]


def test_the_default_label_set_is_the_run_ai_dumps(tmp_path: Path) -> None:
    names = {n for s in serve_once(tmp_path) for n in s.label_names}
    assert "Hostname" in names and not {"hostname", "pci_bus_id"} & names


def test_pci_bus_id_is_the_slices_bus_address_of_the_same_gpu(tmp_path: Path) -> None:
    series = serve_once(tmp_path, "--dcgm-exporter-version", "4.8")
    by_uuid = {s.label("UUID"): s.label("pci_bus_id") for s in series}
    node = slim_node(yaml.safe_load(STATIC.read_text()))
    slices = node_slices(node, build_node(node))
    parents = {
        d["attributes"]["parentUUID"]["string"]: d["attributes"]["resource.kubernetes.io/pciBusID"][
            "string"
        ]
        for s in slices
        for d in s["spec"]["devices"]
    }
    assert len(by_uuid) == len(parents) == 2  # two GPUs, each its own address
    for uuid, dcgm_form in by_uuid.items():
        domain, rest = dcgm_form.split(":", 1)
        assert parents[uuid] == f"{int(domain, 16):04x}:{rest.lower()}"


def test_an_unknown_version_is_a_usage_error() -> None:
    done = run_cli("exporter", "--once", "--dcgm-exporter-version", "4.9")
    assert done.returncode == 2
    assert "--dcgm-exporter-version" in done.stderr and "4.8" in done.stderr


HELD = """\
mig-strategy: mixed
nodes:
  node-a:
    gpu-count: 2
    gpu-memory: 40960
    gpu-product: NVIDIA-A100-SXM4-40GB
    gpus:
    - id: GPU-0
      mig-devices:
      - id: MIG-1
        name: 1g.5gb
        position: 2
        gpu-instance-id: 9
        status:
          dra-claims:
          - {claim: c1, claim-namespace: ns, device: gpu-0-mig-1g5gb-19-2, pool: node-a,
             namespace: ns, pod: p1, container: ctr0}
          - {claim: c1, claim-namespace: ns, device: gpu-0-mig-1g5gb-19-2, pool: node-a,
             namespace: ns, pod: p1, container: ctr1}
      - name: 1g.5gb
        position: 3
        gpu-instance-id: 10
    - id: GPU-1
      status:
        dra-claims:
        - {claim: whole, claim-namespace: ns, device: gpu-1, pool: node-a,
           namespace: ns, pod: p2, container: main}
"""


def held(tmp_path: Path, *flags: str) -> list[Series]:
    path = tmp_path / "topology.yml"
    path.write_text(HELD)
    done = run_cli("exporter", "--topology-file", str(path), "--node-name", "node-a",
                   "--hostname", "node-a", "--once", *flags)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [s for s in parse(done.stdout) if s.name == "DCGM_FI_DEV_SM_CLOCK"]


def test_with_dra_each_container_holding_a_device_has_its_copy_labelled_as_the_real_line(
    tmp_path: Path,
) -> None:
    (real,) = parse(f"# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n{REAL}\n")
    series = held(tmp_path, "--kubernetes-enable-dra")
    mig = [s for s in series if dict(s.labels).get("GPU_I_ID") == "9"]
    assert [s.label("container") for s in mig] == ["ctr0", "ctr1"]
    for s in mig:
        assert [n for n in s.label_names if n != "DCGM_FI_DRIVER_VERSION"] == list(real.label_names)
        assert {n: s.label(n) for n in s.label_names if n.startswith("dra_")} == {
            "dra_claim_name": "c1", "dra_claim_namespace": "ns",
            "dra_device_name": "gpu-0-mig-1g5gb-19-2", "dra_driver_name": "gpu.nvidia.com",
            "dra_mig_device_uuid": "MIG-1", "dra_mig_profile": "1g.5gb", "dra_pool_name": "node-a",
        }  # fmt: skip
        assert (s.label("namespace"), s.label("pod")) == ("ns", "p1")
    (free,) = [s for s in series if dict(s.labels).get("GPU_I_ID") == "10"]  # no claim: as it was
    # Nobody holds it: no pod labels at all, as 4.8.3 serves a free device (PR #664's real line).
    assert not [n for n in free.label_names if n.startswith("dra_") or n == "pod"]
    (whole,) = [s for s in series if s.label("gpu") == "1"]
    assert whole.label("dra_device_name") == "gpu-1" and whole.label("pod") == "p2"
    assert "dra_mig_profile" not in whole.label_names


def test_without_dra_a_claimed_device_names_no_pod(tmp_path: Path) -> None:
    """dcgm-exporter learns a DRA device's pods only in DRA mode."""
    series = held(tmp_path)
    assert len(series) == 3
    assert {s.label("pod") for s in series} == {""}
    assert not [n for s in series for n in s.label_names if n.startswith("dra_")]
