"""`--source nvml`: real GPUs read through pynvml, here over the fake NVML of tests/support/fakenvml.py.

The fake replaces only pynvml's functions, so the exporter's own NVML code runs as on a GPU. Each
fake GPU is built from the MIG catalog; expected values come from the fake's raw NVML answers
(bytes, mW), never from the exporter's output.
"""

from __future__ import annotations

import ctypes.util
import logging
import math
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import cli, dcgm, nvml
from exporter.cli import parser
from exporter.collector import NvmlExporter
from exporter.fields import parse_counters
from exporter.generations import G483
from mig_exporter.web.server import MetricsServer, Published
from status_updater.state import reconcile
from tests.live.test_live import running
from tests.pipeline.test_cli import free_port, get
from tests.status_updater.test_reconcile import gpu_pod, whole_gpu_node
from tests.support.base import ROOT, examples, run_cli
from tests.support.fakenvml import (
    FUNCTIONS,
    MIB,
    SAMPLE_TOPOLOGY,
    FakeNvml,
    a100_sample,
    from_topology,
    h100_mixed,
    whole_a100s,
    without_mig,
)
from tests.support.kubeapi import eventually
from tests.support.promtext import by_name, parse
from topology.catalog import model_for_product
from topology.configmap import parse_document
from topology.errors import TopologyError
from topology.model import Topology

FAKENVML = ["-m", "tests.support.fakenvml"]  # run from the repository root
SAMPLE_NODE = "qa-mig-worker-gpu-a100"
# Fields only DCGM reads (its profiling module, XID events, NVLink counters): NVML has none.
DCGM_ONLY = {
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    f = FakeNvml([h100_mixed(0), without_mig(1)])
    f.install(monkeypatch.setattr)
    f.nvmlInit()
    return f


def read(fake: FakeNvml, options: dcgm.Options | None = None) -> list:  # type: ignore[type-arg]
    return parse(nvml.render(nvml.collect(pynvml), options or dcgm.Options("h")).decode())


def test_the_exporter_calls_exactly_the_functions_the_fake_implements() -> None:
    source = "".join(p.read_text() for p in (ROOT / "exporter").glob("*.py"))
    called = set(re.findall(r'"(nvml[A-Z]\w+)"', source)) | set(
        re.findall(r"\bnv\.(nvml[A-Z]\w+)\(", source)
    )
    assert called == set(FUNCTIONS)


def test_the_sample_a100_reads_as_the_simulated_path_serves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml(a100_sample())
    fake.install(monkeypatch.setattr)
    fake.nvmlInit()
    options = dcgm.Options("h", driver_version=fake.driver)
    node = parse_document(SAMPLE_TOPOLOGY.read_text(), "sample").nodes[SAMPLE_NODE]
    simulated = parse(dcgm.render(node, options, time.time()).decode())
    real = read(fake, options)
    # The same families in the same order, less the fields only DCGM has.
    names = list(dict.fromkeys(s.name for s in simulated))
    assert list(dict.fromkeys(s.name for s in real)) == [n for n in names if n not in DCGM_ONLY]
    # Each family: the same series, label names, label values and order.
    for name in dict.fromkeys(s.name for s in real):
        assert [s.labels for s in by_name(real, name)] == [
            s.labels for s in by_name(simulated, name)
        ]
    # Memory is NVML's bytes, floored to MiB as DCGM floors them: used and free separately.
    gpu = fake.gpus[0]
    by_id = {str(m.gpu_instance_id): m for m in gpu.instances}
    for s in by_name(real, "DCGM_FI_DEV_FB_USED"):
        assert s.value == by_id[s.label("GPU_I_ID")].used_bytes // MIB
    for s in by_name(real, "DCGM_FI_DEV_FB_FREE"):
        m = by_id[s.label("GPU_I_ID")]
        assert s.value == (m.total_bytes - m.used_bytes) // MIB
    assert not by_name(real, "DCGM_FI_DEV_GPU_UTIL")  # no utilization in MIG mode


def test_mixed_h100_profiles_and_a_gpu_without_mig(fake: FakeNvml) -> None:
    series = read(fake)
    h100, l4 = fake.gpus
    model = model_for_product("NVIDIA-H100-80GB-HBM3")
    assert model is not None
    # One series per instance, smaller instances first as dcgm-exporter lists them, each with
    # the GI id the driver gives its placement.
    mig = [s for s in by_name(series, "DCGM_FI_DEV_FB_USED") if s.label("gpu") == "0"]
    expected = sorted(h100.instances, key=lambda m: (m.profile.memory_slices, m.start))
    assert [(s.label("GPU_I_PROFILE"), s.label("GPU_I_ID")) for s in mig] == [
        (m.profile.name, str(model.gpu_instance_id(m.profile, m.start))) for m in expected
    ]
    assert {s.label("modelName") for s in mig} == {"NVIDIA H100 80GB HBM3"}
    assert {s.label("UUID") for s in mig} == {h100.uuid}  # the GPU's, as DCGM labels instances
    # GPU-level values on each instance's series, in DCGM's units and print format.
    for s in by_name(series, "DCGM_FI_DEV_POWER_USAGE"):
        gpu = fake.gpus[int(s.label("gpu"))]
        assert s.value == gpu.power_mw / 1000
    text = nvml.render(nvml.collect(pynvml), dcgm.Options("h")).decode()
    assert f"}} {h100.power_mw / 1000:.6f}\n" in text
    assert f"}} {h100.energy_mj}\n" in text
    # The GPU without MIG: one series per field, with utilization, encoder and decoder.
    whole = [s for s in series if s.label("gpu") == "1"]
    assert all("GPU_I_ID" not in s.label_names for s in whole)
    values = {s.name: s.value for s in whole}
    assert values["DCGM_FI_DEV_GPU_UTIL"] == l4.util[0]
    assert values["DCGM_FI_DEV_MEM_COPY_UTIL"] == l4.util[1]
    assert values["DCGM_FI_DEV_ENC_UTIL"] == l4.enc_dec[0]
    assert values["DCGM_FI_DEV_DEC_UTIL"] == l4.enc_dec[1]
    assert {s.label("device") for s in whole} == {f"nvidia{l4.minor}"}  # the minor, not the index
    assert values["DCGM_FI_DEV_FB_USED"] == l4.used_bytes // MIB
    free = (l4.memory_mib - l4.reserved_mib) * MIB - l4.used_bytes
    assert values["DCGM_FI_DEV_FB_FREE"] == free // MIB
    assert values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == l4.remapped[0]
    # GDDR has no memory temperature sensor: that series is left out, not zero.
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in values
    assert [s.label("gpu") for s in by_name(series, "DCGM_FI_DEV_MEMORY_TEMP")] == ["0"] * 3
    assert not [s for s in by_name(series, "DCGM_FI_DEV_GPU_UTIL") if s.label("gpu") == "0"]


def test_a_counters_file_selects_the_fields_and_nvml_fills_the_label_fields(
    fake: FakeNvml,
) -> None:
    counters, warnings = parse_counters(
        "DCGM_FI_DEV_FB_TOTAL, gauge, total\nDCGM_FI_DEV_GPU_TEMP, gauge, temp\n"
        "DCGM_FI_DEV_SERIAL, label, s\nDCGM_FI_NVML_VERSION, label, n\n"
        "DCGM_FI_DEV_BRAND, label, b\n",
        "test",
    )
    assert not warnings
    series = read(fake, dcgm.Options("h", counters=counters))
    assert list(dict.fromkeys(s.name for s in series)) == [
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_GPU_TEMP",
    ]
    first = series[0]
    assert first.label_names[-7:] == ("Hostname", "DCGM_FI_DEV_SERIAL", "DCGM_FI_NVML_VERSION",
                                      "DCGM_FI_DEV_BRAND", "container", "namespace", "pod")  # fmt: skip
    labels = dict(first.labels)
    assert labels["DCGM_FI_DEV_SERIAL"] == fake.gpus[int(labels["gpu"])].serial
    assert labels["DCGM_FI_NVML_VERSION"] == f"12.{fake.driver}"
    assert labels["DCGM_FI_DEV_BRAND"] == "NVIDIA"
    h100_total = {s.label("GPU_I_PROFILE"): s.value for s in series
                  if s.name == "DCGM_FI_DEV_FB_TOTAL" and s.label("gpu") == "0"}  # fmt: skip
    assert h100_total == {m.profile.name: m.profile.memory_mib for m in fake.gpus[0].instances}


def test_dcgm_exporter_4_8s_labels_carry_nvmls_bus_address(fake: FakeNvml) -> None:
    fake.gpus[1].bus_id = b"00000000:D8:00.0"
    series = read(fake, dcgm.Options("node-a", generation=G483))
    assert series[0].label_names[:5] == ("gpu", "UUID", "pci_bus_id", "device", "modelName")
    buses = {s.label("gpu"): s.label("pci_bus_id") for s in series}
    assert buses == {"0": "00000000:07:00.0", "1": "00000000:D8:00.0"}
    assert {s.label("hostname") for s in series} == {"node-a"}
    assert not [s for s in series if "Hostname" in s.label_names]


def test_a_driver_without_memory_v2_has_no_reserved_part(fake: FakeNvml) -> None:
    counters, _ = parse_counters(
        "DCGM_FI_DEV_FB_USED, gauge, u\nDCGM_FI_DEV_FB_RESERVED, gauge, r\n", "test"
    )
    options = dcgm.Options("h", counters=counters)
    l4 = fake.gpus[1]
    reserved = {
        s.label("gpu"): s.value for s in by_name(read(fake, options), "DCGM_FI_DEV_FB_RESERVED")
    }
    assert reserved == {"1": l4.reserved_mib}  # MIG instances: no reserved part of their own
    fake.memory_v2 = False
    series = read(fake, options)
    assert not by_name(series, "DCGM_FI_DEV_FB_RESERVED")
    used = [s.value for s in by_name(series, "DCGM_FI_DEV_FB_USED") if s.label("gpu") == "1"]
    assert used == [(l4.used_bytes + l4.reserved_mib * MIB) // MIB]


@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
        ("NVIDIA A100-SXM4-40GB MIG 1c.2g.10gb", "2g.10gb"),  # a compute instance of a 2g
        (b"NVIDIA A30 MIG 2g.12gb", "2g.12gb"),  # nvidia-ml-py before 11.515: bytes
        ("3g.40gb", "3g.40gb"),  # a name without the GPU's
    ],
)
def test_the_profile_is_the_gpu_instances(name: str | bytes, profile: str) -> None:
    assert nvml.profile_of(nvml.text_of(name)) == profile


def test_a_value_the_gpu_does_not_support_is_left_out(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    series = read(fake)
    assert not by_name(series, "DCGM_FI_DEV_POWER_USAGE")
    assert by_name(series, "DCGM_FI_DEV_GPU_TEMP")


def exporter_for(fake: FakeNvml, **kw: object) -> NvmlExporter:
    return NvmlExporter(pynvml, dcgm.Options("h"), Published(), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "function", [f for f in FUNCTIONS if f not in ("nvmlInit", "nvmlShutdown")]
)
def test_a_failing_call_keeps_the_last_collection_and_says_it_is_stale(
    fake: FakeNvml, function: str
) -> None:
    now = [1000.0]
    exporter = exporter_for(fake, clock=lambda: now[0])
    exporter.collect()
    good = exporter.snapshot()
    assert good.healthy and good.ready
    fake.fail[function] = pynvml.NVML_ERROR_UNKNOWN
    now[0] = 1030.0
    exporter.collect()
    stale = exporter.snapshot()
    assert stale.body == good.body  # the last good values, still served
    assert not stale.healthy
    h100, l4 = (f"GPU {i} ({g.uuid})" for i, g in enumerate(fake.gpus))
    where = {
        "nvmlSystemGetDriverVersion": "the system", "nvmlSystemGetNVMLVersion": "the system",
        "nvmlDeviceGetCount": "the system", "nvmlDeviceGetHandleByIndex": "GPU 0",
        "nvmlDeviceGetUUID": "GPU 0",
        # A MIG device's own calls (the H100's GPU-level memory is not read in MIG mode).
        "nvmlDeviceGetMemoryInfo": f"{h100} MIG device 0",
        "nvmlDeviceGetGpuInstanceId": f"{h100} MIG device 0",
        "nvmlDeviceGetGpuInstanceById": f"{h100} MIG device 0",
        "nvmlGpuInstanceGetInfo": f"{h100} MIG device 0",
        # Only the L4 has MIG off, and so utilization, encoder and decoder.
        "nvmlDeviceGetUtilizationRates": l4, "nvmlDeviceGetEncoderUtilization": l4,
        "nvmlDeviceGetDecoderUtilization": l4,
    }.get(function, h100)  # fmt: skip
    assert stale.reason == (
        f"stale: NVML {function} on {where}: Unknown Error; "
        "the last good one is from 1970-01-01T00:16:40Z"
    )
    own = stale.own.decode()
    assert "mig_exporter_nvml_failed_collections_total 1.0\n" in own
    assert "mig_exporter_nvml_last_collection_timestamp_seconds 1000.0\n" in own
    del fake.fail[function]
    exporter.collect()
    again = exporter.snapshot()
    assert again.healthy and again.reason == "ok"
    assert "mig_exporter_nvml_failed_collections_total 1.0\n" in again.own.decode()


def test_nothing_is_served_before_the_first_good_collection(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_TIMEOUT
    exporter = exporter_for(fake)
    exporter.collect()
    snapshot = exporter.snapshot()
    assert not snapshot.ready and not snapshot.healthy
    assert "nothing collected yet" in snapshot.reason


def test_a_gpu_that_disappears_takes_its_series_with_it(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = exporter_for(fake)
    exporter.collect()
    assert {s.label("gpu") for s in parse(exporter.snapshot().body.decode())} == {"0", "1"}
    fake.lost.add(0)  # fell off the bus: NVML answers GPU_IS_LOST
    exporter.collect()
    exporter.collect()
    snapshot = exporter.snapshot()
    assert {s.label("gpu") for s in parse(snapshot.body.decode())} == {"1"}
    assert snapshot.healthy
    assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == [
        "NVML reports GPU 0 lost: its series are gone"
    ]
    fake.lost.clear()
    fake.gpus.pop(1)  # no longer listed at all
    exporter.collect()
    assert {s.label("gpu") for s in parse(exporter.snapshot().body.decode())} == {"0"}


def test_a_topology_names_the_pods_holding_whole_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = [whole_gpu_node("n1", 2, "NVIDIA-A100-SXM4-40GB")]
    topology, _ = reconcile(cluster, [gpu_pod("train", "n1", 1, "2026-01-01T00:00:00Z")])
    node = topology.nodes["n1"]
    fake = FakeNvml(from_topology(node))  # the same GPUs, MIG disabled
    fake.install(monkeypatch.setattr)
    fake.nvmlInit()
    sample = nvml.collect(pynvml)
    holders = {
        s.label("UUID"): (s.label("container"), s.label("namespace"), s.label("pod"))
        for s in parse(nvml.render(sample, dcgm.Options("h"), node).decode())
    }
    held = {g.id for g in node.gpus if g.status and g.status.allocated_by}
    assert len(held) == 1
    assert holders == {
        g.uuid: ("c", "ns", "train") if g.uuid in held else ("", "", "") for g in fake.gpus
    }
    without = parse(nvml.render(sample, dcgm.Options("h")).decode())
    assert {(s.label("pod"), s.label("namespace")) for s in without} == {("", "")}


def test_scrapes_serve_the_last_collection_and_never_call_nvml(fake: FakeNvml) -> None:
    published = Published()
    exporter = NvmlExporter(pynvml, dcgm.Options("h"), published, interval_s=0.2)
    stop = threading.Event()
    loop = threading.Thread(target=exporter.run, args=(stop,), daemon=True)
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while fake.calls["nvmlSystemGetDriverVersion"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fake.calls["nvmlSystemGetDriverVersion"] >= 3  # it collects on its interval
        exporter.interval_s = 3600  # from the next collection on: no more during the scrapes
        time.sleep(0.5)
        before = sum(fake.calls.values())
        for _ in range(20):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as r:
                assert by_name(parse(r.read().decode().split("# HELP mig_")[0]),
                               "DCGM_FI_DEV_FB_USED")  # fmt: skip
        assert sum(fake.calls.values()) == before
    finally:
        stop.set()
        exporter.wake.set()
        loop.join(5)
        server.stop()


def test_the_cli_serves_the_fake_gpus_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, *FAKENVML, "h100-mixed", "--port", "0", "--address", "127.0.0.1",
         "--hostname", "gpu-host", "-c", "200"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        port = int(re.search(r":(\d+)/metrics", line)[1])  # type: ignore[index]
        # Listening comes first, the first collection right after: healthy once it is in.
        eventually(lambda: get(f"http://127.0.0.1:{port}/health")[0] == 200, timeout=10)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
            series = parse(r.read().decode().split("# HELP mig_")[0])
        assert {s.label("Hostname") for s in series} == {"gpu-host"}
        assert len({s.label("GPU_I_ID") for s in by_name(series, "DCGM_FI_DEV_FB_USED")
                    if "GPU_I_ID" in s.label_names}) == 3  # fmt: skip
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_no_gpu_is_one_line_and_exit_2() -> None:
    result = subprocess.run([sys.executable, *FAKENVML, "no-gpu", "--once"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "no GPU" in one_line_error(result)


def test_without_the_nvidia_library_it_is_one_line_and_exit_2() -> None:
    # The real pynvml: on this machine without an NVIDIA driver, libnvidia-ml.so.1 is missing.
    if ctypes.util.find_library("nvidia-ml"):
        pytest.fail("this test needs a machine without libnvidia-ml (the CI machine has none)")
    error = one_line_error(run_cli("exporter", "--source", "nvml", "--once"))
    assert "libnvidia-ml.so.1" in error


def test_without_the_pynvml_package_it_is_one_line_and_exit_2() -> None:
    code = ("import sys; sys.modules['pynvml'] = None; from exporter.cli import main; "
            "sys.exit(main(['--source', 'nvml', '--once']))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert "nvidia-ml-py" in one_line_error(result)


def test_the_collect_interval_is_dcgm_exporters(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parser().parse_args(["--source", "nvml"]).collect_interval == 30_000
    monkeypatch.setenv("DCGM_EXPORTER_INTERVAL", "5000")
    assert parser().parse_args(["--source", "nvml"]).collect_interval == 5_000
    assert parser().parse_args(["-c", "250"]).collect_interval == 250


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--source", "nvml", "--all-nodes"],
         "--source nvml reads this machine's GPUs: not with --all-nodes"),
        (["--source", "nvml", "-c", "50"],
         "argument -c/--collect-interval: 50 ms is too short: at least 100"),
        (["--source", "nvml", "-c", "soon"],
         "argument -c/--collect-interval: 'soon' is not a whole number of ms"),
        (["--source", "nvml", "--watch-topology", "--topology-file", "x.yaml", "--node-name", "n"],
         "--watch-topology and --topology-file: one topology, not both"),
        (["--source", "nvml", "--watch-topology", "--once", "--node-name", "n"],
         "--once reads a --topology-file, it does not watch"),
        (["--watch-topology", "--node-name", "n"],
         "--watch-topology goes with --source nvml (the topology source watches anyway)"),
    ],
)  # fmt: skip
def test_nvml_usage_errors(args: list[str], says: str) -> None:
    result = run_cli("exporter", *args)
    assert result.returncode == 2 and "usage:" in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == f"python -m exporter: error: {says}"


def test_once_with_a_topology_file_names_the_pods(tmp_path: Path) -> None:
    node = parse_document(SAMPLE_TOPOLOGY.read_text(), "sample").nodes[SAMPLE_NODE]
    result = subprocess.run(
        [sys.executable, *FAKENVML, "a100-sample", "--once", "--mig-pod-labels",
         "--topology-file", str(SAMPLE_TOPOLOGY), "--node-name", SAMPLE_NODE],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    pods = {(s.label("GPU_I_ID"), s.label("pod"))
            for s in by_name(parse(result.stdout), "DCGM_FI_DEV_FB_USED")}  # fmt: skip
    expected = {
        (str(d.gpu_instance_id), d.status.allocated_by.pod if d.status and d.status.allocated_by else "")
        for d in node.gpus[0].mig_devices or ()
    }  # fmt: skip
    assert pods == expected and any(pod for _, pod in pods)


def test_a_failing_call_in_once_is_one_line_and_exit_1(tmp_path: Path) -> None:
    code = (
        "import sys, pynvml; from tests.support import fakenvml; "
        "f = fakenvml.FakeNvml([fakenvml.h100_mixed()]); "
        "f.fail['nvmlDeviceGetPowerUsage'] = pynvml.NVML_ERROR_UNKNOWN; f.install(); "
        "from exporter.cli import main; sys.exit(main(['--source', 'nvml', '--once']))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: NVML nvmlDeviceGetPowerUsage on GPU 0 ({h100_mixed().uuid}): Unknown Error"
    ]


def test_watch_topology_names_the_pods_as_the_cluster_changes(tmp_path: Path) -> None:
    # The updater and the exporter as real processes on the emulated API; the exporter reads
    # the fake GPUs and takes pod names from the node's ConfigMap.
    node = "gpu-1"
    with running(tmp_path) as d:
        d.updater()
        port = free_port()
        d.start("tests.support.fakenvml", f"whole-a100:{node}", "--watch-topology", "--node-name", node,
                "--address", "127.0.0.1", "--port", str(port), "-c", "200", name="nvml")  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        d.kube.create(
            "nodes", {"apiVersion": "v1", **whole_gpu_node(node, 2, "NVIDIA-A100-SXM4-40GB")}
        )
        pod = {"apiVersion": "v1", **gpu_pod("train", node, 1, "2026-01-01T00:00:00Z")}
        d.kube.create("pods", pod, namespace="ns")

        def holders() -> dict[str, str]:
            series = by_name(parse(get(f"{url}/metrics")[1].split("# HELP mig_")[0]),
                             "DCGM_FI_DEV_FB_USED")  # fmt: skip
            return {s.label("UUID"): s.label("pod") for s in series}

        uuids = [g.uuid for g in whole_a100s(node)]
        eventually(lambda: sorted(holders().values()) == ["", "train"], timeout=20)
        assert set(holders()) == set(uuids)
        assert get(f"{url}/health") == (200, "ok\n")
        d.kube.delete("pods", "train", namespace="ns")
        eventually(lambda: set(holders().values()) == {""}, timeout=20)


# --- the collector's own logic, in this process --------------------------------------------------


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        ("NVML_ERROR_LIBRARY_NOT_FOUND", True),
        ("NVML_ERROR_DRIVER_NOT_LOADED", True),
        ("NVML_ERROR_NO_PERMISSION", False),
    ],
)
def test_nvml_that_cannot_start_is_one_reason(
    monkeypatch: pytest.MonkeyPatch, error: str, hint: bool
) -> None:
    f = FakeNvml([h100_mixed()])
    f.install(monkeypatch.setattr)
    f.fail["nvmlInit"] = getattr(pynvml, error)
    with pytest.raises(nvml.NvmlUnavailable) as e:
        nvml.open_nvml()
    text = str(pynvml.NVMLError(getattr(pynvml, error)))
    suffix = ": is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?"
    assert str(e.value) == f"NVML cannot start: {text}" + (suffix if hint else "")


def test_nvml_without_gpus_or_a_count_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    f = FakeNvml([])
    f.install(monkeypatch.setattr)
    with pytest.raises(nvml.NvmlUnavailable, match=r"^NVML sees no GPU on this machine$"):
        nvml.open_nvml()
    assert not f.initialised  # shut down again
    f.gpus.append(h100_mixed())
    assert nvml.open_nvml() is pynvml
    f.fail["nvmlDeviceGetCount"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(nvml.NvmlUnavailable, match=r"^NVML cannot count the GPUs: Unknown Error$"):
        nvml.open_nvml()


def test_without_the_package_the_reason_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(nvml.NvmlUnavailable) as e:
        nvml.open_nvml()
    assert str(e.value) == "--source nvml needs the nvidia-ml-py package (pip install nvidia-ml-py)"


def topology_doc(node: str, uuid: str, pod: str) -> Topology:
    text = f"""
nodes:
  {node}:
    gpu-count: 1
    gpu-memory: 23034
    gpu-product: NVIDIA-L4
    gpus:
    - id: {uuid}
      status:
        allocated-by: {{namespace: ns, pod: {pod}, container: c}}
"""
    return parse_document(text, "doc")


def test_the_collector_takes_pod_names_from_the_topology_and_keeps_the_last_good(
    fake: FakeNvml,
) -> None:
    exporter = exporter_for(fake, node_name="n1")
    exporter.collect()
    l4 = fake.gpus[1].uuid

    def pods() -> set[str]:
        return {s.label("pod") for s in parse(exporter.snapshot().body.decode())
                if s.label("UUID") == l4}  # fmt: skip

    assert pods() == {""}
    exporter.sink.update(topology_doc("n1", l4, "a"), "ConfigMap ns/topology-n1")
    assert pods() == {"a"} and exporter.snapshot().healthy
    # Another node's document: this node is missing from it. The last good names stay.
    exporter.sink.update(topology_doc("n2", l4, "b"), "ConfigMap ns/topology-n1")
    snapshot = exporter.snapshot()
    assert pods() == {"a"} and not snapshot.healthy
    assert snapshot.reason.endswith("; pod labels from the last good topology")
    assert "nodes.n1" in snapshot.reason
    # An invalid entry for this node: counted once as a node problem.
    bad = parse_document(
        "nodes:\n  n1:\n    gpu-count: 1\n    gpu-memory: 1\n    gpu-product: NVIDIA-L4\n"
        "    gpus: [{id: ''}]\n",
        "doc",
    )
    exporter.sink.update(bad, "ConfigMap ns/topology-n1")
    exporter.sink.update(bad, "ConfigMap ns/topology-n1")
    assert exporter.invalid.value("node") == 1
    assert pods() == {"a"} and not exporter.snapshot().healthy
    # Unreadable: counted by its kind, and said.
    bad = TopologyError("ConfigMap ns/topology-n1", "topology.yml", "not valid YAML")
    exporter.sink.rejected(bad.obj, bad)
    assert exporter.invalid.value("configmap") == 1
    assert "not valid YAML; pod labels from the last good topology" in exporter.snapshot().reason
    exporter.sink.problem("the API cannot be reached")
    assert exporter.snapshot().reason == "the API cannot be reached"
    exporter.sink.update(topology_doc("n1", l4, "c"), "ConfigMap ns/topology-n1")
    assert pods() == {"c"} and exporter.snapshot().healthy


def test_a_stopped_topology_source_turns_health_to_503(fake: FakeNvml) -> None:
    exporter = exporter_for(fake, node_name="n1", interval_s=3600)
    stop = threading.Event()
    dead = threading.Thread(target=lambda: None, name="watch")
    dead.start()
    dead.join()
    loop = threading.Thread(target=exporter.run, args=(stop, [dead]), daemon=True)
    loop.start()
    try:
        eventually(lambda: "the topology source watch stopped" in exporter.snapshot().reason,
                   timeout=10)  # fmt: skip
        assert not exporter.snapshot().healthy
    finally:
        stop.set()
        exporter.wake.set()
        loop.join(5)


def test_what_a_gpu_does_not_say_is_left_empty_or_guessed(fake: FakeNvml) -> None:
    h100, l4 = fake.gpus
    h100.brand = 99  # a brand this exporter does not know
    fake.fail["nvmlDeviceGetSerial"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.fail["nvmlDeviceGetMinorNumber"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.fail["nvmlDeviceGetEncoderUtilization"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    counters, _ = parse_counters(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT, gauge, l\nDCGM_FI_DEV_ENC_UTIL, gauge, e\n"
        "DCGM_FI_DEV_DEC_UTIL, gauge, d\nDCGM_FI_DEV_SERIAL, label, s\n"
        "DCGM_FI_DEV_BRAND, label, b\n",
        "test",
    )
    series = read(fake, dcgm.Options("h", counters=counters))
    by_gpu = {s.label("gpu"): s for s in by_name(series, "DCGM_FI_DEV_POWER_MGMT_LIMIT")}
    assert by_gpu["0"].value == h100.limit_mw / 1000 and by_gpu["1"].value == l4.limit_mw / 1000
    assert {s.label("DCGM_FI_DEV_BRAND") for s in series if s.label("gpu") == "0"} == {"Unknown"}
    assert {s.label("DCGM_FI_DEV_BRAND") for s in series if s.label("gpu") == "1"} == {"NVIDIA"}
    assert {s.label("DCGM_FI_DEV_SERIAL") for s in series} == {""}
    assert {(s.label("gpu"), s.label("device")) for s in series} == {("0", "nvidia0"),
                                                                      ("1", "nvidia1")}  # fmt: skip
    assert not by_name(series, "DCGM_FI_DEV_ENC_UTIL")  # not supported: left out
    assert [s.value for s in by_name(series, "DCGM_FI_DEV_DEC_UTIL")] == [l4.enc_dec[1]]
    fake.fail["nvmlDeviceGetBrand"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    assert {
        s.label("DCGM_FI_DEV_BRAND") for s in read(fake, dcgm.Options("h", counters=counters))
    } == {""}


def test_mig_mode_is_the_current_one_not_the_pending_one(fake: FakeNvml) -> None:
    h100, l4 = fake.gpus
    h100.mig_pending = False  # MIG goes off at the next reset: still on now
    l4.mig, l4.mig_pending = False, True  # could be on after a reset: off now
    series = read(fake)
    assert {s.label("GPU_I_PROFILE") for s in series if s.label("gpu") == "0"} == {
        m.profile.name for m in h100.instances
    }
    assert [s.value for s in by_name(series, "DCGM_FI_DEV_GPU_UTIL")] == [l4.util[0]]


def test_without_placements_instances_are_in_gpu_instance_id_order(fake: FakeNvml) -> None:
    fake.fail["nvmlDeviceGetGpuInstanceById"] = pynvml.NVML_ERROR_NO_PERMISSION
    series = by_name(read(fake), "DCGM_FI_DEV_FB_USED")
    ids = [int(s.label("GPU_I_ID")) for s in series if s.label("gpu") == "0"]
    assert ids == sorted(m.gpu_instance_id for m in fake.gpus[0].instances)


@pytest.mark.parametrize("kind", [0, 1, 2, 3, 4, 5])
def test_a_field_value_is_read_whatever_its_type(fake: FakeNvml, kind: int) -> None:
    fake.gpus[0].memory_temp_type = kind
    values = {s.value for s in by_name(read(fake), "DCGM_FI_DEV_MEMORY_TEMP")}
    assert values == {fake.gpus[0].memory_temp_c}


# Infinities, and NaNs of either sign with any payload (a driver's NaN need not be Python's).
NON_FINITE = st.sampled_from([math.inf, -math.inf]) | st.builds(
    lambda sign, payload: struct.unpack("<d", struct.pack("<Q", sign | 0x7FF << 52 | payload))[0],
    st.sampled_from([0, 1 << 63]),
    st.integers(1, (1 << 52) - 1),
)


@settings(derandomize=True, max_examples=examples(40), deadline=None)
@given(st.data())
def test_a_field_handed_over_as_nan_or_infinite_reads_as_one_the_gpu_does_not_have(
    data: st.DataObject,
) -> None:
    """Any field NVML hands over as a double (nvmlDeviceGetFieldValues), on any GPU: NaN or an
    infinity is no reading, left out as dcgm-exporter leaves out a blank value. The collection
    stays good and every other series is served as before."""
    fake = FakeNvml([h100_mixed(0), without_mig(1)])
    with pytest.MonkeyPatch.context() as patch:
        fake.install(patch.setattr)
        fake.nvmlInit()
        nvml.collect(pynvml)  # which fields the exporter asks NVML for
        gpu = fake.gpus[data.draw(st.sampled_from(range(len(fake.gpus))), "gpu")]
        field_id = data.draw(st.sampled_from(sorted(fake.fields_asked)), "field")
        gpu.field_values[field_id] = None  # NOT_SUPPORTED
        without = nvml.render(nvml.collect(pynvml), dcgm.Options("h"))
        gpu.field_values[field_id] = (pynvml.NVML_VALUE_TYPE_DOUBLE, data.draw(NON_FINITE, "value"))
        exporter = NvmlExporter(pynvml, dcgm.Options("h"), Published())
        exporter.collect()
        snap = exporter.snapshot()
    assert (snap.healthy, snap.reason) == (True, "ok")
    assert snap.body == without
    assert all(math.isfinite(s.value) for s in parse(snap.body.decode()))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_once_with_a_nan_memory_temperature_prints_the_rest(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: float
) -> None:
    fake = FakeNvml([h100_mixed(0), without_mig(1)])
    fake.gpus[0].memory_temp_type = pynvml.NVML_VALUE_TYPE_DOUBLE
    fake.gpus[0].memory_temp_c = value  # type: ignore[assignment]
    fake.install(monkeypatch.setattr)
    assert cli.main(["--source", "nvml", "--once", "--hostname", "h"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    temps = {s.label("gpu") for s in by_name(parse(out), "DCGM_FI_DEV_MEMORY_TEMP")}
    assert temps == set()  # GPU 0's is no reading, and the L4 has no memory sensor
    assert {s.label("gpu") for s in by_name(parse(out), "DCGM_FI_DEV_GPU_TEMP")} == {"0", "1"}


def test_a_mig_gpu_without_instances_reads_as_the_real_empty_dump(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = parse_document(SAMPLE_TOPOLOGY.read_text(), "sample").nodes[SAMPLE_NODE]
    empty = replace(node, gpus=(replace(node.gpus[0], mig_devices=()),))
    fake = FakeNvml(from_topology(empty))
    fake.install(monkeypatch.setattr)
    fake.nvmlInit()
    options = dcgm.Options("h", driver_version=fake.driver)
    real = read(fake, options)
    simulated = parse(dcgm.render(empty, options, time.time()).decode())
    names = [n for n in dict.fromkeys(s.name for s in simulated) if n not in DCGM_ONLY]
    assert list(dict.fromkeys(s.name for s in real)) == names
    assert [s.labels for s in real] == [s.labels for s in simulated if s.name in names]
    assert not by_name(real, "DCGM_FI_DEV_FB_USED")  # the dump has no memory for it


@pytest.mark.parametrize("pod_labels", [False, True])
def test_mig_instances_are_named_where_the_simulated_path_names_them(
    monkeypatch: pytest.MonkeyPatch, pod_labels: bool
) -> None:
    node = parse_document(SAMPLE_TOPOLOGY.read_text(), "sample").nodes[SAMPLE_NODE]
    fake = FakeNvml(from_topology(node))
    fake.install(monkeypatch.setattr)
    fake.nvmlInit()
    sample = nvml.collect(pynvml)
    for dynamic in (True, False):
        shown = replace(node, is_dynamic_mig_enabled=dynamic)
        options = dcgm.Options("h", mig_pod_labels=pod_labels)
        ours = parse(nvml.render(sample, options, shown).decode())
        simulated = parse(dcgm.render(shown, options, time.time()).decode())
        assert {(s.label("GPU_I_ID"), s.label("pod")) for s in ours} == {
            (s.label("GPU_I_ID"), s.label("pod")) for s in simulated
        }
        assert any(s.label("pod") for s in ours) == (pod_labels or not dynamic)


def test_the_collector_says_each_change_once_and_counts_every_failure(
    fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO")
    exporter = exporter_for(fake, node_name="n1")
    before = time.time()
    exporter.collect()
    stamp = float(re.search(r"timestamp_seconds ([0-9.e+]+)\n", exporter.own_metrics().decode())[1])  # type: ignore[index]
    assert before - 0.001 <= stamp <= time.time() + 0.001  # the wall clock (to the ms), by default
    fake.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_TIMEOUT
    exporter.collect()
    exporter.collect()
    del fake.fail["nvmlDeviceGetPowerUsage"]
    exporter.collect()
    exporter.sink.problem("the API cannot be reached")
    exporter.sink.update(topology_doc("n1", fake.gpus[1].uuid, "a"), "ConfigMap ns/topology-n1")
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [m for m in messages if m[0] == "INFO"] == [
        ("INFO", "NVML is good again"), ("INFO", "the topology is good again")]  # fmt: skip
    warnings = [m for _, m in messages if _ == "WARNING"]
    assert len(warnings) == 2 and warnings[0].startswith("stale: NVML nvmlDeviceGetPowerUsage")
    assert warnings[1] == "the API cannot be reached"
    own = exporter.own_metrics().decode()
    assert own.splitlines()[:3] == [
        "# HELP mig_exporter_nvml_failed_collections_total NVML collections that failed; the "
        "last good one stays served.",
        "# TYPE mig_exporter_nvml_failed_collections_total counter",
        "mig_exporter_nvml_failed_collections_total 2.0",
    ]
    assert own.splitlines()[3:5] == [
        "# HELP mig_exporter_nvml_last_collection_timestamp_seconds When the served values were "
        "collected.",
        "# TYPE mig_exporter_nvml_last_collection_timestamp_seconds gauge",
    ]
    assert 'mig_exporter_invalid_objects_total{kind="node"} 0.0' in own


def test_a_failing_shutdown_after_once_is_a_debug_line_only(
    fake: FakeNvml, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    fake.fail["nvmlShutdown"] = pynvml.NVML_ERROR_UNKNOWN  # nothing left to do about it
    caplog.set_level(logging.DEBUG, logger="exporter")
    assert cli.main(["--source", "nvml", "--once"]) == 0
    out, err = capsys.readouterr()
    assert by_name(parse(out), "DCGM_FI_DEV_GPU_TEMP") and err == ""
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said == [("DEBUG", "nvmlShutdown: Unknown Error")]
