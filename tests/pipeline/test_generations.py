"""Every dcgm-exporter generation (`--dcgm-exporter-version`) against its facts.

Goldens are real lines from dcgm-exporter's issues and PRs, or, where no released image was ever
quoted, lines its code at the release writes (each says which). Every sample node is served in
every generation as a valid exposition, and a property holds the generations to the table: on
any node they serve the same series, differing only in names, units, labels and format as their
rows say.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import dcgm
from exporter.fields import ALIASES, canonical, parse_counters
from exporter.generations import (
    DEFAULT,
    G483,
    G484,
    G490,
    GENERATIONS,
    Generation,
    generation,
    go_value,
)
from tests.support.base import examples, run_cli
from tests.support.promtext import Series, duplicates, parse, promtool_findings
from topology.catalog import MODELS, GpuModel
from topology.configmap import parse_document
from topology.model import (
    AllocatedBy,
    DeviceStatus,
    DraClaim,
    Fault,
    Gpu,
    MigDevice,
    NodeTopology,
    PodUsage,
    Utilization,
)

NOW = 1_790_000_000.0
SAMPLES = (
    "--nodes", "samples/mig/nodes", "samples/mig/static/nodes", "samples/mig/whole-gpu",
    "samples/mig/sharing/a100-40gb-time-sliced.yaml", "samples/mig/dra/nodes.yaml",
    "--pods", "samples/mig/pods", "samples/mig/static/pods", "samples/mig/sharing/pods.yaml",
    "samples/mig/dra/pods.yaml", "--claims", "samples/mig/dra/claims.yaml",
)  # fmt: skip


@cache
def sample_nodes() -> dict[str, NodeTopology]:
    done = run_cli("status_updater", "render", *SAMPLES)
    assert done.returncode == 0, done.stderr
    return dict(parse_document(done.stdout, "samples").nodes)


def serve(node: NodeTopology, g: Generation, **options: bool) -> str:
    dra = options.pop("dra", g.dra and any(
        d.status and d.status.dra_claims for gpu in node.gpus
        for d in (gpu, *(gpu.mig_devices or ()))))  # fmt: skip
    return dcgm.render(node, dcgm.Options("node-a", generation=g, dra=dra, **options), NOW).decode()


# --- goldens -------------------------------------------------------------------------------------

# A whole GPU nobody holds, on a 4.8.3-era build (dcgm-exporter PR #664, DRA on an A30; that
# build's counters file had no DCGM_FI_DRIVER_VERSION row): no pod labels at all.
PR_664_FREE = (
    'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-f50641a9-38d7-6df1-0bec-e661b4ca1847",'
    'pci_bus_id="00000000:3B:00.0",device="nvidia0",modelName="NVIDIA A30",'
    'hostname="nim-operator-72q5r53"} 210'
)
# Template-era lines (pre-4.8.3): DCGM's profile names, which 4.8.4 replaced by NVML's.
ISSUE_713 = (
    'GPU_I_PROFILE="7g.79gb"'  # an A100 80GB PCIe configured all-7g.80gb (gpu-operator #687)
)
ISSUE_544 = 'GPU_I_PROFILE="1g.11gb"'  # an H100 NVL configured all-1g.12gb


def whole_gpu_node(product: str, held: bool = False) -> NodeTopology:
    status = DeviceStatus(AllocatedBy("ns", "p", "c")) if held else None
    return NodeTopology(1, 24_576, product, gpus=(Gpu("GPU-f50641a9", status),))


def mig_node(product: str, profile: str) -> NodeTopology:
    model = next(m for m in MODELS if product in m.product_labels)
    p = model.profile(profile)
    assert p is not None
    dev = MigDevice(profile, p.placements[0], model.gpu_instance_id(p, p.placements[0]))
    return NodeTopology(1, model.total_memory_mib, product, gpus=(Gpu("GPU-1", None, (dev,)),))


def labels_of(text: str, family: str) -> list[Series]:
    return [s for s in parse(text) if s.name == family]


@pytest.mark.parametrize("g", [G483, G484, G490], ids=lambda g: g.name)
def test_a_free_gpu_is_labelled_as_the_real_4_8_3_era_line(g: Generation) -> None:
    (real,) = parse(f"# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n{PR_664_FREE}\n")
    text = serve(whole_gpu_node("NVIDIA-A30"), g)
    clock = next(s for s in parse(text) if canonical(s.name) == "DCGM_FI_DEV_SM_CLOCK")
    driver_label = next(n for n in clock.label_names if canonical(n) == "DCGM_FI_DRIVER_VERSION")
    assert [n for n in clock.label_names if n != driver_label] == list(real.label_names)


def test_2022_names_a_free_gpus_pods_empty_as_the_run_ai_dumps() -> None:
    (clock, *_) = labels_of(serve(whole_gpu_node("NVIDIA-A30"), DEFAULT), "DCGM_FI_DEV_SM_CLOCK")
    assert [(n, clock.label(n)) for n in ("container", "namespace", "pod")] == [
        ("container", ""), ("namespace", ""), ("pod", "")]  # fmt: skip
    assert "pci_bus_id" not in clock.label_names and "Hostname" in clock.label_names


@pytest.mark.parametrize(
    ("product", "profile", "golden"),
    [("NVIDIA-A100-80GB-PCIe", "7g.80gb", ISSUE_713), ("NVIDIA-H100-NVL", "1g.12gb", ISSUE_544)],
)
def test_up_to_4_8_3_a_profile_is_dcgms_name_from_4_8_4_nvmls(
    product: str, profile: str, golden: str
) -> None:
    for g in (DEFAULT, G483):
        assert golden in serve(mig_node(product, profile), g), g.name
    for g in (G484, G490):
        text = serve(mig_node(product, profile), g)
        assert f'GPU_I_PROFILE="MIG {profile}"' in text, g.name


def test_an_a100_40gbs_profiles_are_the_same_in_dcgm_and_nvml() -> None:
    """The run:ai dumps' names (DCGM's), which the design card's samples show."""
    for p in ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"):
        assert f'GPU_I_PROFILE="{p}"' in serve(mig_node("NVIDIA-A100-SXM4-40GB", p), DEFAULT)


@pytest.mark.parametrize(
    ("value", "decimal", "text"),
    [(0, False, "0"), (1410, False, "1410"), (999_999, False, "999999"),
     (1_000_000, False, "1e+06"), (4_335_301_032, False, "4.335301032e+09"),
     (115.325, True, "115.325"), (302.206, True, "302.206"), (0.1234567, True, "0.123457"),
     (0.00001, True, "1e-05"), (0.0001, True, "0.0001"), (1.41e9, True, "1.41e+09"),
     (1, True, "1"), (-1, False, "-1")],
)  # fmt: skip
def test_values_from_4_8_3_are_gos_shortest_form(value: float, decimal: bool, text: str) -> None:
    """The collector's `%d`/`%f` string, parsed to a float64 and written by expfmt with
    `strconv.AppendFloat(f, 'g', -1, 64)` (its writeFloat). Go's rule, applied by hand: no Go
    toolchain could run here."""
    assert go_value(value, decimal) == text


def test_the_xid_series_carries_err_code_and_err_msg_among_the_sorted_attributes() -> None:
    """Written from 4.8.3's code (collector toMetric; no real 4.8.x XID line was ever quoted):
    after the label fields, before namespace and pod. A GPU with no Xid yet has no series from
    4.8.3 (DCGM has no sample: dcgm-exporter #646, #700); 2022 wrote 0 (the run:ai dumps)."""
    node = whole_gpu_node("NVIDIA-A30", held=True)
    assert "DCGM_FI_DEV_XID_ERRORS{" not in serve(node, G483)
    assert labels_of(serve(node, DEFAULT), "DCGM_FI_DEV_XID_ERRORS")[0].value == 0
    xid48 = Fault(fault="xid", xid=48, since=0)
    node = replace(node, gpus=(replace(node.gpus[0], faults=(xid48,)),))
    (xid,) = labels_of(serve(node, G483), "DCGM_FI_DEV_XID_ERRORS")
    assert xid.label_names[-5:] == ("container", "err_code", "err_msg", "namespace", "pod")
    assert (xid.label("err_code"), xid.label("err_msg"), xid.value) == (
        "48", "Double Bit ECC Error", 48)  # fmt: skip
    assert "err_code" not in serve(node, DEFAULT)


def test_families_by_name_and_series_by_label_signature_from_4_8_3() -> None:
    node = sample_nodes()["qa-mig-worker-gpu-a100"] if "qa-mig-worker-gpu-a100" in sample_nodes() \
        else next(iter(sample_nodes().values()))  # fmt: skip
    text = serve(node, G483)
    families = re.findall(r"^# TYPE (\S+)", text, re.M)
    assert families == sorted(families)
    for family in families:
        series = labels_of(text, family)
        signatures = [";".join(f"{len(n)}:{n}={len(v)}:{v}" for n, v in sorted(s.labels))
                      for s in series]  # fmt: skip
        assert signatures == sorted(signatures), family


# --- every sample in every generation -------------------------------------------------------------


def sample_cases() -> Iterator[tuple[str, Generation]]:
    for name in sorted(sample_nodes()):
        for g in GENERATIONS:
            yield name, g


@pytest.mark.parametrize(("name", "g"), list(sample_cases()), ids=lambda x: getattr(x, "name", x))
def test_every_sample_node_is_a_valid_exposition_in_every_generation(
    name: str, g: Generation
) -> None:
    text = serve(sample_nodes()[name], g)
    assert text
    assert promtool_findings(text) == []
    assert duplicates(parse(text)) == []


# --- the generations differ only where the table says ---------------------------------------------

MIG_MODELS = [m for m in MODELS if m.memory_slots == 8]


def busy(pod: str) -> DeviceStatus:
    """A device a pod holds and uses: 30 to 90 % busy, 2 GiB of memory."""
    return DeviceStatus(
        AllocatedBy("ns", pod, "c"), {f"uid-{pod}": PodUsage(Utilization(30, 90), 2048)}
    )


@st.composite
def nodes(draw: st.DrawFn) -> NodeTopology:
    """A node of a catalog GPU: each GPU whole (held or free) or in MIG with one profile placed
    as often as it fits, some instances held; dynamic (run:ai) or static MIG."""
    model: GpuModel = draw(st.sampled_from(MIG_MODELS))
    gpus = []
    for index in range(draw(st.integers(1, 3))):
        held = draw(st.booleans())
        status = busy(f"p{index}") if held else None
        if draw(st.booleans()):
            gpus.append(Gpu(f"GPU-{index}", status))
            continue
        profile = draw(st.sampled_from(model.profiles))
        devices, used = [], 0
        for start in profile.placements:
            if start >= used and len(devices) < profile.max_count:
                pod = busy(f"m{index}-{start}")
                devices.append(MigDevice(profile.name, start,
                                         model.gpu_instance_id(profile, start),
                                         None, pod if draw(st.booleans()) else None))  # fmt: skip
                used = start + profile.memory_slices
        gpus.append(Gpu(f"GPU-{index}", None, tuple(devices)))
    return NodeTopology(len(gpus), model.total_memory_mib, model.product_labels[0],
                        draw(st.booleans()), tuple(gpus))  # fmt: skip


# The 11 unit changes of 4.9.0 (its release notes: clocks in Hz, energy in J, utilizations as
# 0-1 ratios, framebuffer in bytes, NVLink in bytes/s), written here apart from fields.ALIASES.
UNITS = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": 1e6, "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": 1e6,
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 1e-3,
    "DCGM_FI_DEV_GPU_UTIL_RATIO": 0.01, "DCGM_FI_DEV_MEMORY_UTIL_RATIO": 0.01,
    "DCGM_FI_DEV_ENC_UTIL_RATIO": 0.01, "DCGM_FI_DEV_DEC_UTIL_RATIO": 0.01,
    "DCGM_FI_DEV_FB_FREE_BYTES": 2**20, "DCGM_FI_DEV_FB_USED_BYTES": 2**20,
    "DCGM_FI_DEV_FB_RESERVED_BYTES": 2**20, "DCGM_FI_DEV_FB_CAPACITY_BYTES": 2**20,
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": 1_024_000,
}  # fmt: skip


def _unit(name: str) -> float:
    return UNITS.get(name, 1)


def test_4_9_0_changes_the_units_its_release_notes_list() -> None:
    renamed = {c.name for c in dcgm.default_counters(G490).metrics} - {
        c.name for c in dcgm.default_counters(G484).metrics}  # fmt: skip
    new = "DCGM_FI_DEV_FB_CAPACITY_BYTES"  # collected by default from 4.9.0, in bytes
    scaled = {n for n in renamed if ALIASES[n].scale != 1} - {new}
    assert {n: ALIASES[n].scale for n in scaled} == {n: u for n, u in UNITS.items() if n != new}
    assert len(scaled) == 11
    assert len(renamed - {"DCGM_FI_DEV_FB_CAPACITY_BYTES"}) == 22  # and the driver label: 23


def normalized(text: str, g: Generation, node: NodeTopology) -> dict[tuple[object, ...], float]:
    """Each series as the 2022 generation would name it: legacy names and units, no pci_bus_id
    or err_*, `Hostname`, empty pod labels where a free device has none, DCGM's profile name."""
    model = next(m for m in MODELS if node.gpu_product in m.product_labels)
    model = model.for_driver(dcgm.DEFAULT_DRIVER_VERSION)
    dcgm_name = {p.name: dcgm.profile_label(DEFAULT, p.name, p.compute_slices, p.memory_mib)
                 for p in model.profiles}  # fmt: skip
    out = {}
    for s in parse(text):
        labels = {
            canonical(n): v for n, v in s.labels if n not in ("pci_bus_id", "err_code", "err_msg")
        }
        labels["Hostname"] = labels.pop("hostname", labels.get("Hostname", ""))
        for pod_label in ("container", "namespace", "pod"):
            labels.setdefault(pod_label, "")
        if g.profile_names == "nvml" and "GPU_I_PROFILE" in labels:
            labels["GPU_I_PROFILE"] = dcgm_name[labels["GPU_I_PROFILE"].removeprefix("MIG ")]
        out[(canonical(s.name), *sorted(labels.items()))] = s.value / _unit(s.name)
    return out


@settings(derandomize=True, max_examples=examples(40), deadline=None)
@given(nodes(), st.sampled_from([G483, G484, G490]))
def test_a_generation_differs_from_2022_only_as_its_row_says(
    node: NodeTopology, g: Generation
) -> None:
    old, new = serve(node, DEFAULT), serve(node, g)
    before, after = normalized(old, DEFAULT, node), normalized(new, g, node)
    if g.xid_blank:  # no series before a GPU's first Xid, where 2022 wrote 0
        before = {k: v for k, v in before.items() if k[0] != "DCGM_FI_DEV_XID_ERRORS" or v}
    both = {canonical(c.name) for c in dcgm.default_counters(g).metrics} & {
        c.name for c in dcgm.default_counters(DEFAULT).metrics}  # fmt: skip
    assert {k for k in after if k[0] in both} == {k for k in before if k[0] in both}
    for key in before.keys() & after.keys():
        assert math.isclose(after[key], before[key], rel_tol=1e-6, abs_tol=1e-6), key
    served = {k[0] for k in after}
    assert served <= {canonical(c.name) for c in dcgm.default_counters(g).metrics}


def test_every_name_and_alias_selects_its_generation() -> None:
    for g in GENERATIONS:
        for name in (g.name, *g.aliases):
            assert generation(name) is g
    assert generation("4.8") is G483 and generation("default") is DEFAULT


# --- pod_uid ---------------------------------------------------------------------------------------


def pod_uid_series(version: str, *flags: str) -> dict[str, list[Series]]:
    """The sample nodes' SM clock series, as `render` writes them (the pods' uids included)."""
    nodes = sample_nodes()
    out = {}
    for name in ("a100-time-sliced", "dra-a100-80gb"):
        g = generation(version)
        text = serve(nodes[name], g, pod_uid="--kubernetes-enable-pod-uid" in flags,
                     virtual_gpus="--kubernetes-virtual-gpus" in flags)  # fmt: skip
        out[name] = [s for s in parse(text) if canonical(s.name) == "DCGM_FI_DEV_SM_CLOCK"]
    return out


def test_pod_uid_names_each_holders_uid_after_pod_and_before_vgpu() -> None:
    uids = {
        "notebook-a": "5f0c0e1a-0000-4000-8000-000000000000",
        "notebook-b": "5f0c1e1a-0000-4000-8000-000000000001",
    }  # samples/mig/sharing/pods.yaml
    series = pod_uid_series("4.8.3", "--kubernetes-enable-pod-uid", "--kubernetes-virtual-gpus")
    shared = [s for s in series["a100-time-sliced"] if "vgpu" in s.label_names]
    assert shared
    for s in shared:
        assert s.label_names[-3:] == ("pod", "pod_uid", "vgpu")
        if s.label("pod") in uids:
            assert s.label("pod_uid") == uids[s.label("pod")]


def test_pod_uid_reaches_dra_copies_from_4_8_4_only() -> None:
    """4.8.3's DRA block sets pod, namespace, container and dra_* only (kubernetes.go Process);
    4.8.4 adds pod_uid through addPodIdentityAttributes."""
    held = [s for s in pod_uid_series("4.8.3", "--kubernetes-enable-pod-uid")["dra-a100-80gb"]
            if "dra_claim_name" in s.label_names]  # fmt: skip
    assert held and all("pod_uid" not in s.label_names for s in held)
    held = [s for s in pod_uid_series("4.8.4", "--kubernetes-enable-pod-uid")["dra-a100-80gb"]
            if "dra_claim_name" in s.label_names]  # fmt: skip
    assert held and all(s.label("pod_uid") == "2d7f4a90-8e1b-4c6d-b3a5-7c9e0f1d2b44" for s in held)


def test_without_the_flag_no_series_has_a_pod_uid() -> None:
    for g in ("4.8.3", "4.9.0"):
        for series in pod_uid_series(g, "--kubernetes-virtual-gpus").values():
            assert all("pod_uid" not in s.label_names for s in series)


def test_pod_uid_in_a_generation_without_it_is_one_line_and_exit_2() -> None:
    done = run_cli("exporter", "--topology-file", "samples/mig/topology/a100-40gb-active.yaml",
                   "--node-name", "qa-mig-worker-gpu-a100", "--once",
                   "--kubernetes-enable-pod-uid")  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("has no pod_uid (from 4.8.3)")


# --- pod labels ------------------------------------------------------------------------------------

LABELLED_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  namespace: ml
  uid: 0e1f2a3b-0000-4000-8000-00000000000a
  labels:
    app.kubernetes.io/name: trainer
    pod: clash
    9lives: cat
    team: vision
    __hidden: x
    Alpha-team: first
spec:
  nodeName: qa-mig-worker-gpu-a100
  containers:
  - name: main
    resources: {limits: {nvidia.com/gpu: '1'}}
status: {phase: Running}
"""


def labelled(tmp_path: Path, *updater: str) -> Path:
    (tmp_path / "pod.yaml").write_text(LABELLED_POD)
    done = run_cli("status_updater", "render", "--nodes", "samples/mig/whole-gpu",
                   "--pods", str(tmp_path / "pod.yaml"), *updater)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (tmp_path / "cm.yaml").write_text(done.stdout)
    return tmp_path / "cm.yaml"


def served_labels(path: Path, *exporter: str) -> list[tuple[str, str]]:
    done = run_cli("exporter", "--topology-file", str(path), "--node-name",
                   "qa-mig-worker-gpu-a100", "--hostname", "h", "--once", *exporter)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (clock,) = [s for s in parse(done.stdout) if canonical(s.name) == "DCGM_FI_DEV_SM_CLOCK"]
    return list(clock.labels)


def test_pod_labels_are_sanitised_and_sorted_with_the_label_fields_before_the_attributes(
    tmp_path: Path,
) -> None:
    """dcgm-exporter 4.8.3's SanitizeLabelName and copyPodLabels: `.`/`/` to `_`, a leading
    digit prefixed, a leading `__` cut to one `_`, a name in use renamed `pod_label_<name>`; in
    the labels map with DCGM_FI_DRIVER_VERSION, in name order, before container, namespace, pod."""
    path = labelled(tmp_path, "--pod-labels")
    labels = served_labels(path, "--dcgm-exporter-version", "4.8.3",
                           "--kubernetes-enable-pod-labels")  # fmt: skip
    names = [n for n, _ in labels]
    # One map, sorted by name as bytes: a label before `DCGM_…` comes before the driver's.
    assert names[names.index("hostname") + 1 :] == [
        "Alpha_team",
        "DCGM_FI_DRIVER_VERSION", "_9lives", "_hidden", "app_kubernetes_io_name", "pod_label_pod",
        "team", "container", "namespace", "pod",
    ]  # fmt: skip
    assert dict(labels)["pod_label_pod"] == "clash" and dict(labels)["pod"] == "trainer"


def test_the_allowlist_matches_anywhere_in_the_raw_key_and_a_bad_pattern_is_skipped(
    tmp_path: Path,
) -> None:
    path = labelled(tmp_path, "--pod-labels")
    labels = served_labels(path, "--dcgm-exporter-version", "4.8.3", "--kubernetes-enable-pod-labels",
                           "--kubernetes-pod-label-allowlist-regex", "kubernetes.io,(unclosed",
                           "--kubernetes-pod-label-allowlist-regex", "^te")  # fmt: skip
    assert {"app_kubernetes_io_name", "team"} <= {n for n, _ in labels}
    assert not {"_9lives", "pod_label_pod", "_hidden"} & {n for n, _ in labels}


def test_the_updater_copies_only_what_its_allowlist_lets_through_and_nothing_unasked(
    tmp_path: Path,
) -> None:
    assert "labels:" not in labelled(tmp_path).read_text().split("topology.yml")[1]
    path = labelled(tmp_path, "--pod-labels", "--pod-label-allowlist-regex", "^team$")
    labels = served_labels(path, "--dcgm-exporter-version", "4.9.0",
                           "--kubernetes-enable-pod-labels")  # fmt: skip
    assert dict(labels)["team"] == "vision" and "app_kubernetes_io_name" not in dict(labels)


def test_without_the_exporter_flag_the_copied_labels_are_not_served(tmp_path: Path) -> None:
    path = labelled(tmp_path, "--pod-labels")
    assert "team" not in dict(served_labels(path, "--dcgm-exporter-version", "4.8.3"))
    done = run_cli("exporter", "--topology-file", str(path), "--node-name",
                   "qa-mig-worker-gpu-a100", "--once", "--kubernetes-enable-pod-labels")  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("has no pod labels (from 4.8.3)")


def feature_cases() -> Iterator[tuple[str, str]]:
    from exporter.cli import FEATURES

    for feature in FEATURES:
        for g in GENERATIONS:
            if not getattr(g, feature.column):
                yield feature.flag, g.name


@pytest.mark.parametrize(("flag", "version"), list(feature_cases()))
def test_every_option_a_generation_lacks_is_refused_in_one_line(flag: str, version: str) -> None:
    """The generation table says which generation has which option; asking another for it is
    one line and exit 2, whichever option it is."""
    done = run_cli("exporter", "--topology-file", "samples/mig/topology/a100-40gb-active.yaml",
                   "--node-name", "qa-mig-worker-gpu-a100", "--once",
                   "--dcgm-exporter-version", version, f"--{flag.replace('_', '-')}")  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    (line,) = [ln for ln in done.stderr.splitlines() if "error:" in ln]
    assert f"dcgm-exporter {version} has no" in line


def test_a_dra_mig_profile_stays_nvmls_name_whatever_gpu_i_profile_says() -> None:
    """The ResourceSlice's `profile` and dcgm-exporter's `dra_mig_profile` come from the DRA
    driver (NVML's names); only GPU_I_PROFILE changes with the generation."""
    node = sample_nodes()["dra-a100"]
    for g in (G483, G484, G490):
        held = [s for s in parse(serve(node, g)) if "dra_mig_profile" in s.label_names]
        assert held, g.name
        for s in held:
            nvml_name = s.label("dra_mig_profile")
            assert s.label("GPU_I_PROFILE") == (
                f"MIG {nvml_name}" if g.profile_names == "nvml" else nvml_name  # an A100 40GB's
            )


def test_a_counters_file_may_name_a_field_either_way_and_the_name_says_the_unit() -> None:
    """As go-dcgm resolves a name to its field: a legacy name keeps its unit in 4.9.0, a
    base-unit name has its own in 2022."""
    node = whole_gpu_node("NVIDIA-A100-SXM4-40GB")
    text = "\n".join(("DCGM_FI_DEV_SM_CLOCK, gauge, MHz", "DCGM_FI_DEV_SM_CLOCK_HERTZ, gauge, Hz",
                      "DCGM_FI_DEV_FB_FREE_BYTES, gauge, bytes", "DCGM_FI_DEV_FB_FREE, gauge, MiB",
                      "DCGM_FI_SYSTEM_DRIVER_VERSION, label, driver"))  # fmt: skip
    counters, warnings = parse_counters(text, "test")
    assert warnings == []
    for g in (DEFAULT, G490):
        served = {s.name: s for s in parse(dcgm.render(
            node, dcgm.Options("h", generation=g, counters=counters), NOW).decode())}  # fmt: skip
        assert (
            served["DCGM_FI_DEV_SM_CLOCK_HERTZ"].value == served["DCGM_FI_DEV_SM_CLOCK"].value * 1e6
        )
        assert (
            served["DCGM_FI_DEV_FB_FREE_BYTES"].value == served["DCGM_FI_DEV_FB_FREE"].value * 2**20
        )
        assert served["DCGM_FI_DEV_SM_CLOCK"].label("DCGM_FI_SYSTEM_DRIVER_VERSION")


def go_shortest(f: float) -> str:
    """Go's `strconv.FormatFloat(f, 'g', -1, 64)`, written from its rule alone: the shortest
    digits that read back as f, in exponent form when the exponent is below -4 or from 6."""
    if f == 0:
        return "0"
    sign, digits, exponent = Decimal(repr(f)).normalize().as_tuple()
    assert isinstance(exponent, int)
    magnitude = len(digits) + exponent - 1
    text = "".join(map(str, digits))
    if -4 <= magnitude < 6:
        return format(Decimal(repr(f)).normalize(), "f")
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if magnitude < 0 else '+'}{abs(magnitude):02d}"


@settings(derandomize=True, max_examples=examples(500), deadline=None)
@given(st.one_of(st.integers(-(2**60), 2**60), st.floats(allow_nan=False, allow_infinity=False)))
def test_the_value_form_is_gos_for_any_integer_or_double(value: float) -> None:
    assert go_value(value, False) == go_shortest(float(value))


def test_label_fields_come_in_name_order_from_4_8_3_and_in_the_files_order_before() -> None:
    """dcgm-exporter 4.8.3 keeps the counters file's label fields in one map it writes sorted;
    the template era wrote them in the file's order."""
    text = "DCGM_FI_DEV_SM_CLOCK, gauge, MHz\nDCGM_FI_NVML_VERSION, label, x\nDCGM_FI_DRIVER_VERSION, label, x"
    counters, _ = parse_counters(text, "test")
    node = whole_gpu_node("NVIDIA-A100-SXM4-40GB")
    for g, order in ((DEFAULT, ["DCGM_FI_NVML_VERSION", "DCGM_FI_DRIVER_VERSION"]),
                     (G483, ["DCGM_FI_DRIVER_VERSION", "DCGM_FI_NVML_VERSION"])):  # fmt: skip
        (clock,) = parse(dcgm.render(node, dcgm.Options("h", generation=g, counters=counters),
                                     NOW).decode())  # fmt: skip
        assert [n for n in clock.label_names if n.startswith("DCGM_FI_")] == order, g.name


def test_a_dra_mig_device_of_unknown_uuid_has_it_empty_in_4_8_3_and_none_from_4_8_4() -> None:
    """4.8.3 sets dra_mig_device_uuid always (kubernetes.go Process); 4.8.4 only when known."""
    claim = DraClaim(AllocatedBy("ns", "p", "c"), "claim", "ns", "gpu-0-mig-1g5gb-19-6", "node-a")
    dev = MigDevice("1g.5gb", 6, 9, None, DeviceStatus(dra_claims=(claim,)))
    node = NodeTopology(1, 40960, "NVIDIA-A100-SXM4-40GB", False, (Gpu("GPU-1", None, (dev,)),))
    for g, present in ((G483, True), (G484, False), (G490, False)):
        held = [s for s in parse(serve(node, g)) if "dra_claim_name" in s.label_names]
        assert held, g.name
        for s in held:
            assert ("dra_mig_device_uuid" in s.label_names) is present, g.name
            assert not present or s.label("dra_mig_device_uuid") == ""
