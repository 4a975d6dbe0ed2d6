"""`--source nvml` on real GPUs: what their NVML answered, replayed, against what was served there.

Each folder of `tests/reference/nvml/` was recorded on a machine with an NVIDIA GPU by
`python -m tests.support.nvmlrecord` (the folder's README says which and when): NVML's answers to
every call of one collection, the exposition rendered from that collection there, the daemon's
own `/metrics` page, and `nvidia-smi`'s view of the same GPU. Replaying the answers must render
the same bytes here; the labels must agree with what `nvidia-smi` said; the MIG catalog must
agree with the profiles the driver listed.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from exporter import dcgm, nvml
from exporter.generations import GENERATIONS, Generation, generation
from tests.support.base import ROOT
from tests.support.nvmlreplay import Replay
from tests.support.promtext import duplicates, parse, promtool_findings
from topology.catalog import model_for_product

RECORDINGS = sorted(p for p in (ROOT / "tests/reference/nvml").iterdir() if p.is_dir())
MIB = 1 << 20


def _render(folder: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> str:
    replay = Replay(folder / "nvml-calls.json")
    replay.install(monkeypatch.setattr)
    nv = nvml.open_nvml()
    sample = nvml.collect(nv)
    options = dcgm.Options(hostname=replay.hostname, generation=generation(version))
    return nvml.render(sample, options).decode()


def _smi(folder: Path) -> dict[str, str]:
    """The `nvidia-smi --query-gpu` line recorded beside the answers, by column."""
    text = (folder / "nvidia-smi-L-mig.txt").read_text()
    table = text[text.index("name, pci.bus_id") :]
    rows = list(csv.reader(io.StringIO(table), skipinitialspace=True))
    return dict(zip(rows[0], rows[1], strict=True))


RENDERED = [
    (folder, path) for folder in RECORDINGS for path in sorted(folder.glob("metrics-*.txt"))
]


@pytest.mark.parametrize(("folder", "rendered"), RENDERED, ids=lambda p: p.name)
def test_replayed_answers_render_what_the_gpu_machine_served(
    folder: Path, rendered: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each generation's exposition, as the exporter rendered it on the GPU machine."""
    version = rendered.stem.removeprefix("metrics-")
    assert _render(folder, monkeypatch, version) == rendered.read_text()


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_the_labels_are_what_nvidia_smi_says_of_the_gpu(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    smi = _smi(folder)
    series = parse(_render(folder, monkeypatch, "4.8.3"))
    clock = next(s for s in series if s.name == "DCGM_FI_DEV_SM_CLOCK")
    assert clock.label("modelName") == smi["name"]
    assert clock.label("pci_bus_id") == smi["pci.bus_id"]
    assert clock.label("DCGM_FI_DRIVER_VERSION") == smi["driver_version"]
    # Framebuffer: DCGM floors used and free to MiB, nvidia-smi rounds; both leave the reserved
    # part out.
    fb = {s.name: s.value for s in series if s.name.startswith("DCGM_FI_DEV_FB_")}
    total, reserved = (
        int(smi[k].split()[0]) for k in ("memory.total [MiB]", "memory.reserved [MiB]")
    )
    assert (
        total - reserved - 1
        <= fb["DCGM_FI_DEV_FB_FREE"] + fb["DCGM_FI_DEV_FB_USED"]
        <= total - reserved
    )


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_the_daemons_page_on_the_gpu_machine_is_valid_and_complete(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = (folder / "served.txt").read_text()
    assert promtool_findings(served) == []
    # The exporter's own series (`mig_exporter_…`) follow the DCGM families.
    page = parse("".join(line for line in served.splitlines(keepends=True) if "DCGM_" in line))
    assert duplicates(page) == []
    rendered = {
        (s.name, frozenset(s.labels)) for s in parse(_render(folder, monkeypatch, "default"))
    }
    dcgm_series = {(s.name, frozenset(s.labels)) for s in page}
    assert dcgm_series == rendered


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
def test_the_catalog_has_the_profiles_the_driver_lists(folder: Path) -> None:
    replay = Replay(folder / "nvml-calls.json")
    name = next(c["result"] for c in replay.document["calls"] if c["call"] == "nvmlDeviceGetName")
    model = model_for_product(name.replace(" ", "-"))  # GFD's spelling
    assert model is not None, name
    listed = {}
    for entry in replay.document["profiles"]:
        if "info" in entry:
            info = entry["info"]["fields"]
            listed[info["name"].removeprefix("MIG ")] = (
                info["id"], info["sliceCount"], info["memorySizeMB"], info["instanceCount"],
                info["multiprocessorCount"], info["copyEngineCount"], info["decoderCount"],
                info["encoderCount"], info["jpegCount"], info["ofaCount"],
            )  # fmt: skip
    ours = {
        p.name: (p.profile_id, p.compute_slices, p.memory_mib, p.max_count, e.multiprocessors,
                 e.copy_engines, e.decoders, e.encoders, e.jpeg_engines, e.ofa_engines)
        for p in model.profiles
        for e in [p.engines]
    }  # fmt: skip
    assert ours == listed


@pytest.mark.parametrize("folder", RECORDINGS, ids=lambda p: p.name)
@pytest.mark.parametrize("g", GENERATIONS, ids=lambda g: g.name)
def test_every_generation_renders_the_real_answers_as_a_valid_exposition(
    folder: Path, g: Generation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine was lent before the generations landed: only 2022's rendering was recorded
    there; the others are rendered here from its answers."""
    text = _render(folder, monkeypatch, g.name)
    assert promtool_findings(text) == []
    assert duplicates(parse(text)) == []
