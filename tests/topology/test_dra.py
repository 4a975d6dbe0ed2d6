"""The DRA driver's names, as its code builds them and real clusters show them (dra.md)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topology import dra
from topology.catalog import MODELS, model_for_product

A100 = model_for_product("NVIDIA-A100-SXM4-40GB")
A30 = model_for_product("NVIDIA-A30")


@pytest.mark.parametrize(
    ("model", "profile", "minor", "start", "name"),
    [
        # dcgm-exporter PR #664's A30 line, and the Kueue sample's A100 devices (dra.md)
        (A30, "1g.6gb", 1, 0, "gpu-1-mig-1g6gb-14-0"),
        (A100, "1g.10gb", 0, 0, "gpu-0-mig-1g10gb-15-0"),
        (A100, "7g.40gb", 0, 0, "gpu-0-mig-7g40gb-0-0"),
        (A100, "1g.5gb+me", 0, 3, "gpu-0-mig-1g5gb-me-20-3"),
    ],
)
def test_mig_device_names_are_the_drivers(model, profile, minor, start, name) -> None:  # type: ignore[no-untyped-def]
    assert model is not None
    p = model.profile(profile)
    assert p is not None
    assert dra.mig_device(minor, p, start) == name


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.key)
def test_every_device_of_a_gpu_has_its_own_dns_label_name(model) -> None:  # type: ignore[no-untyped-def]
    """A ResourceSlice's device names are DNS labels, unique in their pool."""
    names = [dra.mig_device(0, p, start) for p in model.profiles for start in p.placements]
    names += [dra.gpu_device(0), dra.counter_set(0)]
    assert len(set(names)) == len(names)
    for name in names:
        assert _DNS_LABEL.fullmatch(name) and len(name) <= 63, name


def test_bus_ids_in_dcgm_and_resource_slice_forms() -> None:
    # dcgm-exporter keeps NVML's 8-digit domain in upper case; the driver trims it to 4, lower case.
    assert dra.pci_bus_id(0) == "00000000:07:00.0"
    assert dra.resource_pci_bus_id(0) == "0000:07:00.0"
    assert dra.resource_pci_bus_id(6) == "0000:b7:00.0"


@given(st.integers(min_value=0, max_value=4095))
def test_a_gpus_bus_id_is_its_own_and_the_same_address_in_both_forms(index: int) -> None:
    dcgm, slice_form = dra.pci_bus_id(index), dra.resource_pci_bus_id(index)
    domain, rest = dcgm.split(":", 1)
    assert slice_form == f"{int(domain, 16):04x}:{rest.lower()}"
    others = {dra.pci_bus_id(i) for i in range(max(0, index - 8), index)}
    assert dcgm not in others


@pytest.mark.parametrize(
    ("text", "version"),
    [("520.56.06", "520.56.6"), ("580.65.06", "580.65.6"), ("8.0", "8.0.0"), ("12", "12.0.0")],
)
def test_versions_are_written_as_the_driver_coerces_them(text: str, version: str) -> None:
    assert dra.version(text) == version


@pytest.mark.parametrize("text", ["", "520.56.06.1", "v520", "5\u0660.1", "520..1"])
def test_what_is_no_version_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected a version"):
        dra.version(text)
