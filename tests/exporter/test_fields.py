"""Every dcgm field: the counters CSV that picks them, and simulated values that hang together.

What a user checks: a counters file from a real dcgm-exporter works here, bad lines are one-line
warnings, and the numbers behave like a GPU's (idle is idle, load raises power and activity, the
energy counter only goes up, the same clock gives the same numbers).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from freezegun import freeze_time

from exporter import dcgm
from exporter.fields import FIELDS, Counters, FieldError, declare, parse_counters, read_counters
from exporter.readings import EnergyMeter
from tests.exporter.test_exporter import MIG, whole_gpu
from tests.support import oracle
from tests.support.base import SAMPLES, run_cli
from tests.support.promtext import Series, by_name, parse
from topology.catalog import model_for_product
from topology.configmap import parse_document
from topology.model import AllocatedBy, DeviceStatus, NodeTopology, PodUsage, Utilization

SAMPLE = SAMPLES / "topology" / "a100-40gb-active.yaml"
NODE = "qa-mig-worker-gpu-a100"
WHOLE_ONLY = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
              "DCGM_FI_DEV_DEC_UTIL")  # fmt: skip
GPU_LEVEL = ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
             "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE",
             "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
             "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")  # fmt: skip
NOW = "2026-11-22 10:00:05"


def once(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out = run_cli("exporter", "--topology-file", str(SAMPLE), "--node-name", NODE, "--once",
                  *args, env=env)  # fmt: skip
    return out.returncode, out.stdout, out.stderr


def node_series(node: NodeTopology, options: dcgm.Options | None = None) -> list[Series]:
    return parse(dcgm.render(node, options or dcgm.Options("h"), time.time()).decode())


def one(series: list[Series], name: str) -> float:
    (s,) = by_name(series, name)
    return s.value


# --- the counters CSV -----------------------------------------------------------------------


def test_a_counters_file_picks_the_fields_their_order_help_and_type(tmp_path: Path) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text(
        "# Format: DCGM FIELD, Prometheus metric type, help message\n"
        "\n"
        "DCGM_FI_DEV_FB_USED,   gauge, Used (MiB).\n"
        "  DCGM_FI_DEV_GPU_TEMP , gauge, Hot (C).\n"
        "DCGM_FI_DEV_POWER_MGMT_LIMIT, gauge, Power limit (W).\n"
        "DCGM_FI_DEV_BRAND, label, Brand\n"
        "DCGM_FI_DRIVER_VERSION, label, Driver\n"
    )
    code, out, err = once("-f", str(csv))
    assert (code, err) == (0, "")
    families = [line.split()[2] for line in out.splitlines() if line.startswith("# TYPE")]
    assert families == [
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ]
    assert "# HELP DCGM_FI_DEV_GPU_TEMP Hot (C).\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n" in out
    series = parse(out)
    assert len(by_name(series, "DCGM_FI_DEV_GPU_TEMP")) == 3  # one per MIG instance
    # Label fields in the file's order, after Hostname, as dcgm-exporter places them.
    names = series[0].label_names
    assert names[names.index("Hostname") + 1 :] == (
        "DCGM_FI_DEV_BRAND", "DCGM_FI_DRIVER_VERSION", "container", "namespace", "pod",
    )  # fmt: skip
    assert {s.label("DCGM_FI_DEV_BRAND") for s in series} == {"NVIDIA"}
    # Without a label line, no DCGM_FI_DRIVER_VERSION label: the file decides.
    csv.write_text("DCGM_FI_DEV_FB_USED, counter, Used.\n")
    code, out, err = once(env={"DCGM_EXPORTER_COLLECTORS": str(csv)})
    assert (code, err) == (0, "")
    assert "# TYPE DCGM_FI_DEV_FB_USED counter\n" in out
    assert all("DCGM_FI_DRIVER_VERSION" not in s.label_names for s in parse(out))


def test_an_unknown_or_odd_line_is_a_one_line_warning_and_the_rest_served(tmp_path: Path) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text(
        "DCGM_FI_DEV_FB_USED, gauge, Used.\n"
        "DCGM_FI_DEV_NOT_A_FIELD, gauge, what\n"
        "DCGM_FI_DEV_GPU_TEMP, histogram, no such type\n"
        "DCGM_FI_DEV_FB_USED, gauge, twice\n"
        "DCGM_FI_DEV_FB_FREE\n"
    )
    code, out, err = once("-f", str(csv))
    assert code == 0
    lines = err.splitlines()
    assert len(lines) == 4, err
    assert "line 2" in lines[0] and "DCGM_FI_DEV_NOT_A_FIELD" in lines[0]
    assert "line 3" in lines[1] and "histogram" in lines[1]
    assert "line 4" in lines[2] and "twice" in lines[2]
    assert "line 5" in lines[3]
    assert [line.split()[2] for line in out.splitlines() if line.startswith("# TYPE")] == [
        "DCGM_FI_DEV_FB_USED"
    ]


def test_each_skipped_line_says_why_and_the_lines_after_it_are_read() -> None:
    counters, warnings = parse_counters(
        "DCGM_FI_DEV_GPU_TEMP\n"  # no type
        ", gauge, no name\n"
        "DCGM_FI_DEV_SM_CLOCK, , no type\n"
        "DCGM_FI_DEV_GPU_TEMP, label, a metric as a label\n"
        "DCGM_FI_DRIVER_VERSION, gauge, a label as a metric\n"
        "DCGM_FI_DEV_MEM_CLOCK, gauge\n"  # no help: served, with an empty one
        "DCGM_FI_DEV_FB_USED, gauge, Used, in MiB, of the instance.\n"
        "DCGM_FI_DEV_SERIAL, label, serial\n",
        "f",
    )
    assert warnings == [
        "f line 1: expected 'DCGM_FI_FIELD, type, help': skipped",
        "f line 2: expected 'DCGM_FI_FIELD, type, help': skipped",
        "f line 3: DCGM_FI_DEV_SM_CLOCK: type '' is not one of gauge, counter, label: skipped",
        "f line 4: DCGM_FI_DEV_GPU_TEMP is a metric field, not label: skipped",
        "f line 5: DCGM_FI_DRIVER_VERSION is a label field, not gauge: skipped",
    ]
    assert [(c.name, c.type, c.help) for c in counters.metrics] == [
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", ""),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Used, in MiB, of the instance."),  # commas kept
    ]
    assert counters.labels == ("DCGM_FI_DEV_SERIAL",)


def test_a_skipped_line_is_logged_as_it_was_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "counters.csv"
    path.write_text("DCGM_FI_DEV_NOPE, gauge, x\nDCGM_FI_DEV_FB_USED, gauge, u\n")
    read_counters(path)
    assert [r.getMessage() for r in caplog.records] == [
        f"counters file {path} line 1: DCGM_FI_DEV_NOPE is not a field this exporter serves: skipped"
    ]


def test_label_fields_of_the_simulated_path() -> None:
    counters, _ = parse_counters(
        "DCGM_FI_DEV_FB_USED, gauge, u\nDCGM_FI_NVML_VERSION, label, n\n"
        "DCGM_FI_DEV_SERIAL, label, s\nDCGM_FI_DEV_BRAND, label, b\n",
        "f",
    )
    node = parse_document(SAMPLE.read_text(), "s").nodes[NODE]
    for driver, nvml_version in (("470.82.01", "11.470.82.01"), ("520.56.06", "11.520.56.06"),
                                 ("525.60.13", "12.525.60.13"), ("579.1", "12.579.1"),
                                 ("580.65.06", "13.580.65.06"), ("odd", "11.odd")):  # fmt: skip
        options = dcgm.Options("h", driver_version=driver, counters=counters)
        labels = {dict(s.labels)["DCGM_FI_NVML_VERSION"] for s in node_series(node, options)}
        assert labels == {nvml_version}, driver
    series = node_series(node, dcgm.Options("h", counters=counters))
    serials = {s.label("DCGM_FI_DEV_SERIAL") for s in series}
    # One serial per GPU, fixed by its UUID: 13 digits like a real board's.
    assert len(serials) == 1 and re.fullmatch(r"\d{1,13}", serials.pop() or "")
    assert {s.label("DCGM_FI_DEV_BRAND") for s in series} == {"NVIDIA"}
    other = replace(node, gpus=(replace(node.gpus[0], id="GPU-other"),))
    assert {
        s.label("DCGM_FI_DEV_SERIAL")
        for s in node_series(other, dcgm.Options("h", counters=counters))
    } != {s.label("DCGM_FI_DEV_SERIAL") for s in series}


def test_which_fields_move_in_time_follows_what_each_gpu_serves() -> None:
    def only(name: str) -> Counters:
        return parse_counters(f"{name}, gauge, x\n", "f")[0]

    mig = parse_document(SAMPLE.read_text(), "s").nodes[NODE]
    empty = replace(mig, gpus=(replace(mig.gpus[0], mig_devices=()),))
    whole_a100 = replace(mig, gpus=(replace(mig.gpus[0], mig_devices=None),))
    util, pcie = only("DCGM_FI_DEV_GPU_UTIL"), only("DCGM_FI_PROF_PCIE_TX_BYTES")
    assert dcgm.moves_in_time(whole_a100, util)  # a whole GPU serves its utilization
    assert not dcgm.moves_in_time(mig, util) and not dcgm.moves_in_time(empty, util)
    assert dcgm.moves_in_time(empty, pcie)  # PCIe bytes: whole GPUs and empty MIG GPUs only
    assert not dcgm.moves_in_time(mig, pcie)
    assert not dcgm.moves_in_time(whole_a100, only("DCGM_FI_DEV_FB_USED"))


def test_families_hold_only_the_fields_served_where_they_are_served() -> None:
    mig = parse_document(SAMPLE.read_text(), "s").nodes[NODE]
    names = {f.name for f in oracle.families(mig, dcgm.Options("h"), time.time())}
    assert names.isdisjoint(WHOLE_ONLY)
    assert set(GPU_LEVEL) <= names


# --- the field declarations ------------------------------------------------------------------


def test_the_default_counters_give_each_field_its_declared_type_and_help() -> None:
    """counters/2022.csv, the default, is the dumps' field set: what it says of a field is the field's own
    declaration (fields.FIELDS), so the two cannot drift apart."""
    for counter in dcgm.default_counters().metrics:
        assert (counter.type, counter.help) == (counter.field.type, counter.field.help), counter


def test_a_field_without_a_reading_or_a_reading_without_a_field_fails_at_import() -> None:
    """`declare` runs at import: a declaration that reads no value of a Reading, or a Reading
    value that no field reads (computed, never served), stops the exporter with what to fix."""
    every = list(FIELDS.values())
    temp = FIELDS["DCGM_FI_DEV_GPU_TEMP"]
    computed = replace(temp, read=lambda r: (r.gpu_temp or 0) + 1)
    missing = replace(temp, read=None)  # type: ignore[arg-type]
    for bad in (computed, missing):
        others = [f for f in every if f is not temp]
        with pytest.raises(FieldError) as raised:
            declare(*others, bad)
        assert str(raised.value) == (
            "DCGM_FI_DEV_GPU_TEMP: its reading must be one value of readings.Reading, "
            "e.g. lambda r: r.power"
        )
    with pytest.raises(FieldError) as raised:
        declare(*(f for f in every if f is not temp))
    assert str(raised.value) == (
        "readings.Reading.gpu_temp is read by no field: declare its field in exporter/fields.py, "
        "or take it out of Reading"
    )
    with pytest.raises(FieldError, match="DCGM_FI_DEV_GPU_TEMP is declared twice"):
        declare(*every, temp)
    assert declare(*every) == FIELDS


def test_dropping_a_gpu_the_meter_never_counted_is_harmless() -> None:
    meter = EnergyMeter()
    meter.drop("n", ["GPU-never-seen"])
    assert len(meter) == 0


@pytest.mark.parametrize("kind", ["fifo", "directory", "no usable field", "binary", "missing"])
def test_an_unusable_counters_file_exits_2_in_one_line(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "counters.csv"
    if kind == "fifo":
        os.mkfifo(path)  # never opened for writing: a blocking read would hang
    elif kind == "directory":
        path.mkdir()
    elif kind == "no usable field":
        path.write_text("DCGM_FI_DEV_NOPE, gauge, x\n")
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    code, out, err = once("-f", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and str(path) in err and "Traceback" not in err


def test_the_default_field_set_is_the_dumps(tmp_path: Path) -> None:
    """Every family of the real MIG-disabled dump, in its order, with its HELP text."""
    dump = (SAMPLES / "metrics" / "a100-40gb-mig-disabled.prom").read_text()
    headers = [line for line in dump.splitlines() if line.startswith("#")]
    ours = [line for line in dcgm.join([dcgm.fragments(
        whole_gpu(0, 0).nodes["n"], dcgm.Options("h"), 0)]).decode().splitlines()
        if line.startswith("#")]  # fmt: skip
    assert ours == headers


# --- where each field is served -------------------------------------------------------------


@freeze_time(NOW)
def test_mig_instances_repeat_gpu_fields_and_have_their_own_activity() -> None:
    series = node_series(MIG.nodes[NODE])
    for name in WHOLE_ONLY:
        assert by_name(series, name) == [], name
    for name in GPU_LEVEL:
        per_instance = by_name(series, name)
        assert len(per_instance) == 3 and len({s.value for s in per_instance}) == 1, name
    activity = {
        s.label("GPU_I_ID"): s.value for s in by_name(series, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    }
    assert activity == {"7": 0, "9": 1, "5": 0}  # the gpu-burn pod holds GI 9
    # With --mig-pod-labels the holder is named; by default the labels stay empty (run:ai).
    assert {s.label("pod") for s in series} == {""}
    named = node_series(MIG.nodes[NODE], dcgm.Options("h", mig_pod_labels=True))
    holders = {s.label("GPU_I_ID"): s.label("pod") for s in by_name(named, "DCGM_FI_DEV_FB_USED")}
    assert holders == {"7": "job-1g-idle-0-0", "9": "job-gpu-burn-0-0", "5": "job-2g-idle-0-0"}


@freeze_time(NOW)
def test_a_mig_enabled_gpu_without_instances_has_gpu_level_series_only() -> None:
    node = MIG.nodes[NODE]
    empty = replace(node, gpus=(replace(node.gpus[0], mig_devices=()),))
    series = node_series(empty)
    assert {s.name for s in series} >= set(GPU_LEVEL)
    assert not by_name(series, "DCGM_FI_DEV_FB_USED") and not by_name(
        series, "DCGM_FI_DEV_GPU_UTIL"
    )
    assert all("GPU_I_ID" not in s.label_names for s in series)
    assert one(series, "DCGM_FI_PROF_GR_ENGINE_ACTIVE") == 0


# --- values that hang together --------------------------------------------------------------


def mig_node(utilization: int) -> NodeTopology:
    """The sample node with every instance held by a pod at `utilization` percent."""
    node = MIG.nodes[NODE]
    devices = tuple(
        replace(d, status=DeviceStatus(AllocatedBy("ns", f"p{i}", "c"),
                                       {f"u{i}": PodUsage(Utilization(utilization, utilization), 10)}))
        for i, d in enumerate(node.gpus[0].mig_devices or ())
    )  # fmt: skip
    return replace(node, gpus=(replace(node.gpus[0], mig_devices=devices),))


@freeze_time(NOW)
def test_an_idle_mig_gpu_draws_its_idle_power_and_load_raises_it() -> None:
    model = model_for_product(MIG.nodes[NODE].gpu_product)
    assert model is not None
    figures = model.figures
    idle = node_series(mig_node(0))
    assert by_name(idle, "DCGM_FI_DEV_POWER_USAGE")[0].value == pytest.approx(
        figures.mig_idle_power_w, abs=0.5
    )
    assert all(s.value == 0 for s in by_name(idle, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"))
    assert all(s.value == 0 for s in by_name(idle, "DCGM_FI_PROF_DRAM_ACTIVE"))
    busy = node_series(mig_node(100))
    # Instances on 2 + 1 + 1 of the 7 compute slices, all busy: 4/7 of the way to the limit.
    expected = figures.mig_idle_power_w + (figures.max_power_w - figures.mig_idle_power_w) * 4 / 7
    power = by_name(busy, "DCGM_FI_DEV_POWER_USAGE")[0].value
    assert power == pytest.approx(expected, abs=0.5)
    assert (
        by_name(busy, "DCGM_FI_DEV_GPU_TEMP")[0].value
        > by_name(idle, "DCGM_FI_DEV_GPU_TEMP")[0].value
    )
    assert all(s.value == 1 for s in by_name(busy, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"))


@freeze_time(NOW)
def test_whole_gpu_power_and_activity_follow_utilization() -> None:
    rows = []
    for percent in (0, 30, 60, 100):
        series = [
            s for s in node_series(whole_gpu(percent, percent).nodes["n"]) if s.label("gpu") == "0"
        ]
        assert one(series, "DCGM_FI_DEV_GPU_UTIL") == percent
        rows.append(tuple(one(series, name) for name in (
            "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")))  # fmt: skip
    for column in zip(*rows, strict=True):
        assert list(column) == sorted(column) and column[0] < column[-1]
    assert rows[-1][2] == 1 and rows[0][1] == 0 and 0 < rows[-1][1] <= 100


def test_the_same_clock_gives_the_same_exposition() -> None:
    with freeze_time(NOW):
        first = dcgm.render(MIG.nodes[NODE], dcgm.Options("h"), time.time())
        again = dcgm.render(MIG.nodes[NODE], dcgm.Options("h"), time.time())
    assert first == again
    with freeze_time("2026-11-22 10:00:25"):
        later = dcgm.render(MIG.nodes[NODE], dcgm.Options("h"), time.time())
    assert later != first


def energy_of(node: NodeTopology, meter: EnergyMeter, at: float) -> tuple[float, float]:
    series = parse(dcgm.render(node, dcgm.Options("h", energy=meter), at).decode())
    return (by_name(series, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[0].value,
            by_name(series, "DCGM_FI_DEV_POWER_USAGE")[0].value)  # fmt: skip


def test_energy_integrates_power_and_never_goes_back_across_restarts() -> None:
    step = dcgm.UTILIZATION_STEP_S
    start = 1_795_000_000.0
    node = mig_node(100)
    meter = EnergyMeter()
    last, power = energy_of(node, meter, start)
    for k in range(1, 40):
        if k == 20:
            node = mig_node(0)  # the load stops: the counter slows, never drops
        energy, now_power = energy_of(node, meter, start + k * step)
        assert energy - last == pytest.approx(power * step * 1000, abs=1)  # mJ
        last, power = energy, now_power
    # A restarted exporter (a fresh meter) at any later time reads at least the last count.
    for later in (1, step, 3600):
        restarted, _ = energy_of(node, EnergyMeter(), start + 39 * step + later)
        assert restarted >= last


def test_a_node_of_unknown_model_still_gets_plausible_figures() -> None:
    node = NodeTopology(1, 16384, "Some-Future-GPU", gpus=whole_gpu(50, 50).nodes["n"].gpus[:1])
    series = node_series(node)
    assert 0 < one(series, "DCGM_FI_DEV_POWER_USAGE") < 1000
    assert one(series, "DCGM_FI_DEV_FB_USED") + one(series, "DCGM_FI_DEV_FB_FREE") == 16384


# --- how the simulated values hang together ------------------------------------------------------

EVERY = parse_counters(
    "\n".join(
        f"{name}, gauge, x" for name in FIELDS if name != "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    )
    + "\n",
    "every field",
)[0]
PIPES = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
         "DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
         "DCGM_FI_PROF_PIPE_FP16_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")  # fmt: skip


def a100_whole(percent: int) -> NodeTopology:
    """The sampled A100-40GB with MIG off, its one GPU held by a pod `percent` % busy."""
    mig = parse_document(SAMPLE.read_text(), "s").nodes[NODE]
    usage = PodUsage(Utilization(percent, percent), 1000)
    gpu = replace(mig.gpus[0], mig_devices=None,
                  status=DeviceStatus(AllocatedBy("ns", "p", "c"), {"uid": usage}))  # fmt: skip
    return replace(mig, is_dynamic_mig_enabled=False, gpus=(gpu,))


@freeze_time(NOW)
def test_each_activity_is_a_part_of_the_engines_and_follows_the_load() -> None:
    idle = {s.name: s.value for s in node_series(a100_whole(0), dcgm.Options("h", counters=EVERY))}
    busy = {s.name: s.value for s in node_series(a100_whole(60), dcgm.Options("h", counters=EVERY))}
    assert busy["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0.6
    for name in PIPES:
        assert idle[name] == 0, name
        assert 0 < busy[name] <= busy["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], name
    # The memory copy engine's utilization is the DRAM interface's activity, in percent.
    assert busy["DCGM_FI_DEV_MEM_COPY_UTIL"] == round(100 * busy["DCGM_FI_PROF_DRAM_ACTIVE"])
    # The clock drops only when the GPU is idle; PCIe traffic rises with the load.
    model = model_for_product("NVIDIA-A100-SXM4-40GB")
    assert model is not None
    assert (idle["DCGM_FI_DEV_SM_CLOCK"], busy["DCGM_FI_DEV_SM_CLOCK"]) == (
        model.figures.sm_clock_idle_mhz, model.figures.sm_clock_max_mhz)  # fmt: skip
    for name in ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"):
        assert busy[name] > 100 * idle[name] > 0, name
    # Power as a sensor reads it, in milliwatts; its limit, the board's.
    assert round(busy["DCGM_FI_DEV_POWER_USAGE"], 3) == busy["DCGM_FI_DEV_POWER_USAGE"]
    assert busy["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == model.figures.max_power_w
    # The whole GPU's memory: what DCGM reserves, and all of it.
    assert busy["DCGM_FI_DEV_FB_TOTAL"] == model.total_memory_mib
    assert busy["DCGM_FI_DEV_FB_RESERVED"] == model.total_memory_mib - model.fb_total_mib
    assert busy["DCGM_FI_DEV_FB_USED"] + busy["DCGM_FI_DEV_FB_FREE"] == model.fb_total_mib
    assert busy["DCGM_FI_DEV_FB_USED"] == 1000


def test_a_new_counter_starts_within_what_the_gpu_can_have_drawn_since_boot() -> None:
    from exporter.readings import BOOT_EPOCH_S, BOOT_SPREAD_S

    now = BOOT_EPOCH_S + 100 * 86_400.0
    for gpu in ("GPU-a", "GPU-b", "GPU-c"):
        mj = EnergyMeter().read("n", gpu, now, 100.0, 400.0)
        most, least = (400.0 * (now - BOOT_EPOCH_S - s) * 1000 for s in (0, BOOT_SPREAD_S))
        assert least <= mj <= most


def test_utilization_draws_cover_the_whole_range() -> None:
    node = whole_gpu(0, 100).nodes["n"]
    seen = {one([s for s in node_series_at(node, 1_790_000_000 + 10 * step) if s.label("gpu") == "0"],
                "DCGM_FI_DEV_GPU_UTIL") for step in range(200)}  # fmt: skip
    assert min(seen) < 10 and max(seen) > 90


def node_series_at(node: NodeTopology, now: float) -> list[Series]:
    return parse(dcgm.render(node, dcgm.Options("h"), now).decode())
