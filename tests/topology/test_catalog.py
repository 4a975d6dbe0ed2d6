"""The MIG catalog against the reference facts (shared/reference/mig-profiles.md).

`reference/mig-profiles.json` is a copy of the project's reference file (its sources are in
mig-profiles.md): the catalog computes each model's profiles from a few figures, and every fact
it computes is compared here with what was observed or published.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.base import ROOT, SAMPLES
from tests.support.promtext import parse
from topology.catalog import MODELS, GpuModel, base_product, model_for_product, nvml_model_name

REFERENCE = json.loads((ROOT / "tests" / "reference" / "mig-profiles.json").read_text())
# The catalog's key where the reference names the model otherwise.
REFERENCE_KEY = {"H100-96GB": "H100-96GB-GH200", "H100-PCIe-80GB": "H100-80GB"}

# (start, size) -> GI id for orientation A (identity) and B (halves swapped): mig-profiles.md 3.1.
GI_TABLE = {
    (0, 8): (0, 0), (0, 4): (1, 2), (4, 4): (2, 1), (0, 2): (3, 5), (2, 2): (4, 6), (4, 2): (5, 3),
    (6, 2): (6, 4), (0, 1): (7, 11), (1, 1): (8, 12), (2, 1): (9, 13), (3, 1): (10, 14),
    (4, 1): (11, 7), (5, 1): (12, 8), (6, 1): (13, 9),
}  # fmt: skip


def test_a100_40gb_uses_the_sampled_driver_memory() -> None:
    model = model_for_product("NVIDIA-A100-SXM4-40GB")
    assert model is not None
    memory = {p.name: p.memory_mib for p in model.profiles}
    assert memory["1g.5gb"] == 4864
    assert memory["2g.10gb"] == 9856
    assert memory["7g.40gb"] == 40192
    assert model.total_memory_mib == 40960


def test_sample_gpu_instance_ids() -> None:
    model = model_for_product("NVIDIA-A100-SXM4-40GB")
    assert model is not None
    gi = {(n, pos): model.gpu_instance_id(model.profile(n), pos) for n, pos in  # type: ignore[arg-type]
          [("2g.10gb", 0), ("1g.5gb", 4), ("1g.5gb", 5), ("1g.5gb", 6), ("7g.40gb", 0)]}  # fmt: skip
    assert gi == {
        ("2g.10gb", 0): 5,
        ("1g.5gb", 4): 7,
        ("1g.5gb", 5): 8,
        ("1g.5gb", 6): 9,
        ("7g.40gb", 0): 0,
    }


@pytest.mark.parametrize("model", [m for m in MODELS if m.memory_slots == 8], ids=lambda m: m.key)
def test_every_placement_gets_the_tree_gi_id(model) -> None:  # type: ignore[no-untyped-def]
    column = 1 if model.swapped_halves else 0
    for profile in model.profiles:
        for start in profile.placements:
            assert (
                model.gpu_instance_id(profile, start)
                == GI_TABLE[(start, profile.memory_slices)][column]
            )


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_profiles_fit_their_gpu(model) -> None:  # type: ignore[no-untyped-def]
    names = [p.name for p in model.profiles]
    assert len(names) == len(set(names))
    for p in model.profiles:
        assert all(s >= 0 and s + p.memory_slices <= model.memory_slots for s in p.placements)
        assert p.max_count * p.memory_slices <= model.memory_slots
        assert 0 < p.memory_mib <= model.total_memory_mib
        assert p.name.startswith(f"{p.compute_slices}g.")


def test_a30_gi_ids() -> None:
    model = model_for_product("NVIDIA-A30")
    assert model is not None
    ids = [model.gpu_instance_id(model.profile("1g.6gb"), s) for s in range(4)]  # type: ignore[arg-type]
    assert ids == [3, 4, 5, 6]
    assert model.gpu_instance_id(model.profile("4g.24gb"), 0) == 0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("label", "model_name"),
    [
        ("NVIDIA-A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA-A100-80GB-PCIe-MIG-1g.10gb", "NVIDIA A100 80GB PCIe"),
        ("NVIDIA-H200", "NVIDIA H200"),
        ("Tesla-K80", "Tesla-K80"),  # not in the catalog: kept as labelled
    ],
)
def test_model_name_as_dcgm_reports_it(label: str, model_name: str) -> None:
    assert nvml_model_name(label) == model_name


def test_single_strategy_product_is_the_gpu_model() -> None:
    assert base_product("NVIDIA-A100-80GB-PCIe-MIG-1g.10gb") == "NVIDIA-A100-80GB-PCIe"
    model = model_for_product("NVIDIA-A100-80GB-PCIe-MIG-1g.10gb")
    assert model is not None and model.key == "A100-80GB"


@pytest.mark.parametrize(
    ("label", "key", "profiles"),
    [
        (
            "NVIDIA-H100-80GB-HBM3",
            "H100-80GB",
            {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
        ),
        (
            "NVIDIA-H200",
            "H200-141GB",
            {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
        ),
        (
            "NVIDIA-A100-SXM4-80GB",
            "A100-80GB",
            {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
        ),
    ],
)
def test_profile_names_per_model(label: str, key: str, profiles: set[str]) -> None:
    model = model_for_product(label)
    assert model is not None and model.key == key
    assert profiles <= {p.name for p in model.profiles}


def reference(model: GpuModel) -> dict[str, Any]:
    return REFERENCE["gpus"][REFERENCE_KEY.get(model.key, model.key)]  # type: ignore[no-any-return]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_profile_is_the_references(model: GpuModel) -> None:
    """Id, slices, placements, how many fit, and a memory size observed in some driver era (where
    one was); the reference's PCI ids; every profile of the reference is in the catalog (A30's
    2g.12gb+me with an inferred id: none was published)."""
    ref = reference(model)
    assert model.memory_slots == ref["memory_slots"]
    # The H100 80GB's reference lists both parts; the catalog has the PCIe part apart.
    h100 = [m.pci_ids for m in MODELS if m.key.startswith("H100-") and m.key.endswith("80GB")]
    ids = set(model.pci_ids) if model.key not in ("H100-80GB", "H100-PCIe-80GB") else {
        i for found in h100 for i in found}  # fmt: skip
    assert {pci.split()[-1] for pci in ref["pci_device_ids"]} <= ids
    known = {p["name"]: p for p in ref["profiles"]}
    assert {p.name for p in model.profiles} == set(known)
    for p in model.profiles:
        fact = known[p.name]
        if fact["profile_id"] is None:
            fact = {**fact, "profile_id": p.profile_id}  # not observed: the catalog infers it
        starts = tuple(placement["start"] for placement in fact["placements"])
        assert (p.profile_id, p.compute_slices, p.memory_slices, p.placements, p.max_count) == (
            fact["profile_id"], fact["compute_slices"], fact["memory_slices"], starts,
            fact["max_instances"],
        ), p.name  # fmt: skip
        observed = {v for v in (fact["memory_mib"] or {}).values() if type(v) is int}
        assert p.memory_mib in observed or not observed, p.name  # B200's 3g, 4g, 7g: not observed


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_profiles_engines_are_the_references(model: GpuModel) -> None:
    """Multiprocessors and copy engines, decoders, JPEG and OFA engines, where the reference has
    them (B200's 3g, 4g and 7g were not captured): what a DRA MIG device's capacities say."""
    known = {p["name"]: p for p in reference(model)["profiles"]}
    compared = 0
    for p in model.profiles:
        fact = known[p.name]
        e = p.engines
        if model.key == "H100-PCIe-80GB":  # SXM5's table: fewer SMs, the 7g's 114 observed
            assert e.multiprocessors <= fact["sm_count"], p.name
            assert p.compute_slices < 7 or e.multiprocessors == 114
            compared += 1
        elif fact.get("sm_count") is not None:
            assert e.multiprocessors == fact["sm_count"], p.name
            compared += 1
        if fact.get("ce_nvdec_jpeg_ofa") is not None:
            counts = tuple(int(n) for n in fact["ce_nvdec_jpeg_ofa"].split("/"))
            assert (e.copy_engines, e.decoders, e.jpeg_engines, e.ofa_engines) == counts, p.name
            compared += 1
        assert e.encoders == 0, p.name  # no MIG GPU of the catalog has NVENC
    assert compared >= 8, "the reference gives engines for at least the 1g and 2g profiles"


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_instances_without_a_placement_go_where_the_driver_puts_them(model: GpuModel) -> None:
    """`nvidia-smi mig -cgi` without a placement takes the first free start of the driver's order
    (reference 3.2, 8-slot GPUs); the A30's was not observed: lowest start first."""
    order = REFERENCE["gi_id_rule"]["default_cgi_placement_order_logical"]
    for p in model.profiles:
        if model.memory_slots == 4 or p.memory_slices == 8:
            assert p.preferred == p.placements, p.name
            continue
        key = {1: "size1", 2: "size2", 4: "size4_3g"}[p.memory_slices]
        want = [s for s in order[key] if s in p.placements]
        assert p.preferred == tuple(want + [s for s in p.placements if s not in want]), p.name


@pytest.mark.parametrize("dump", ["a100-40gb-active-2x1g.5gb-1x2g.10gb", "a100-40gb-mig-disabled"])
def test_fb_totals_are_what_the_sampled_dumps_show(dump: str) -> None:
    """FB_USED + FB_FREE of each instance (or of the GPU with MIG off) in the real A100-40GB dumps
    the catalog was read from: DCGM loses a MiB of 2g.10gb's 9856 to rounding."""
    model = model_for_product("NVIDIA-A100-SXM4-40GB")
    assert model is not None
    totals: dict[tuple[str, str], float] = {}
    for s in parse((SAMPLES / "metrics" / f"{dump}.prom").read_text()):
        if s.name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
            labels = dict(s.labels)
            key = (labels.get("GPU_I_PROFILE", ""), labels.get("GPU_I_ID", ""))
            totals[key] = totals.get(key, 0) + s.value
    assert totals
    for (name, _), total in totals.items():
        profile = model.profile(name) if name else None
        assert total == (profile.fb_total_mib if profile else model.fb_total_mib), name
