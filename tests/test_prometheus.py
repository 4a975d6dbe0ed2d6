"""A real Prometheus (Debian's package) scrapes the exporters, and the consumers' queries work.

The queries are the ones Kruize and the OpenShift console run (shared/reference/consumers.md).
Targets carry `namespace`/`pod`/`container` target labels like a ServiceMonitor's, with
honor_labels false, so the exporter's own pod labels arrive as `exported_*`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, SAMPLES, run_cli
from kubeapi import eventually
from test_cli import free_port, get

MIG_NODE = "qa-mig-worker-gpu-a100"
WHOLE_NODE = "a100-whole"  # the sampled machine with MIG disabled, as a second node


def whole_gpu_topology(tmp_path: Path) -> Path:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "train-0", "namespace": "team", "uid": "uid-train",
            "annotations": {"run.ai/simulated-gpu-utilization": "60-70", "run.ai/simulated-fb-used": "20000"},
        },
        "spec": {"nodeName": WHOLE_NODE, "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    (tmp_path / "pod.yaml").write_text(yaml.safe_dump(pod))
    node = yaml.safe_load((SAMPLES / "whole-gpu" / "a100-40gb-mig-disabled.yaml").read_text())
    node["metadata"]["name"] = WHOLE_NODE
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(node))
    rendered = run_cli(
        "status_updater",
        "render",
        "--nodes",
        str(tmp_path / "node.yaml"),
        "--pods",
        str(tmp_path / "pod.yaml"),
    )
    assert rendered.returncode == 0, rendered.stderr
    path = tmp_path / "whole.yaml"
    path.write_text(rendered.stdout)
    return path


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=out)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two exporters and one Prometheus scraping them every second, shared by this module's tests."""
    tmp_path = tmp_path_factory.mktemp("prometheus")
    binary = shutil.which("prometheus")
    assert binary, (
        "prometheus is required: run ./scripts/install-test-tools (Debian package prometheus)"
    )
    procs = []
    targets = []
    exporters = (("mig", MIG_NODE, SAMPLES / "topology" / "a100-40gb-active.yaml"),
                 ("whole", WHOLE_NODE, whole_gpu_topology(tmp_path)))  # fmt: skip
    for name, node, topology in exporters:
        port = free_port()
        procs.append(start([sys.executable, "-m", "exporter", "--topology-file", str(topology), "--node-name", node,
                            "--address", "127.0.0.1", "--port", str(port), "--hostname", f"nvidia-dcgm-exporter-{name}"],
                           tmp_path / f"exporter-{name}.log"))  # fmt: skip
        targets.append({"targets": [f"127.0.0.1:{port}"],
                        "labels": {"namespace": "gpu-operator", "pod": f"nvidia-dcgm-exporter-{name}",
                                   "container": "nvidia-dcgm-exporter"}})  # fmt: skip
        eventually(lambda port=port: get(f"http://127.0.0.1:{port}/health")[0] == 200, timeout=15)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "nvidia-dcgm-exporter", "honor_labels": False, "static_configs": targets}
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = free_port()
    procs.append(start([binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{web}"], tmp_path / "prometheus.log"))  # fmt: skip
    url = f"http://127.0.0.1:{web}"
    try:
        eventually(lambda: len(query(url, "up == 1")) == 2, timeout=30)
        yield url
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(
        f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5
    ) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def values(result: list[dict[str, Any]], key: str) -> dict[str, float]:
    return {r["metric"].get(key, ""): float(r["value"][1]) for r in result}


def test_kruize_frame_buffer_query_sees_every_mig_profile(prometheus: str) -> None:
    uuid = eventually(
        lambda: query(prometheus, 'DCGM_FI_DEV_FB_USED{GPU_I_PROFILE="2g.10gb"}'), timeout=20
    )[0]["metric"]["UUID"]
    promql = (f'max by (Hostname,device,GPU_I_PROFILE,modelName,UUID) '
              f'(max_over_time(DCGM_FI_DEV_FB_USED{{UUID="{uuid}"}}[1m]))')  # fmt: skip
    result = eventually(lambda: query(prometheus, promql), timeout=20)
    # Kruize reads these labels off every series (and fails on a missing one).
    for r in result:
        assert {"Hostname", "device", "GPU_I_PROFILE", "modelName", "UUID"} <= r["metric"].keys()
        assert r["metric"]["modelName"] == "NVIDIA A100-SXM4-40GB"
        assert r["metric"]["Hostname"] == "nvidia-dcgm-exporter-mig"
    assert values(result, "GPU_I_PROFILE") == {"1g.5gb": 4384, "2g.10gb": 153}


def test_instances_counted_and_summed_as_the_console_does(prometheus: str) -> None:
    count = eventually(
        lambda: query(
            prometheus, 'count(count by (UUID,GPU_I_ID) (DCGM_FI_DEV_FB_USED{GPU_I_ID!=""}))'
        ),
        timeout=20,
    )
    assert float(count[0]["value"][1]) == 3
    sums = query(
        prometheus, 'sum by (GPU_I_ID) (DCGM_FI_DEV_FB_USED{GPU_I_ID!=""} + DCGM_FI_DEV_FB_FREE)'
    )
    assert values(sums, "GPU_I_ID") == {"7": 4864, "9": 4864, "5": 9855}
    # No utilization series for MIG instances, as real dcgm-exporter.
    assert query(prometheus, 'DCGM_FI_DEV_GPU_UTIL{GPU_I_ID!=""}') == []
    # Empty pod labels are absent in Prometheus: no exported_* on MIG series.
    mig = query(prometheus, 'DCGM_FI_DEV_FB_USED{GPU_I_ID!=""}')
    assert all(not k.startswith("exported_") for r in mig for k in r["metric"])


def test_kruize_whole_gpu_query_finds_the_pod(prometheus: str) -> None:
    promql = ('avg by (Hostname,device,modelName,UUID,exported_container,exported_namespace) '
              '(avg_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace="team",exported_container="train"}[1m]))')  # fmt: skip
    (result,) = eventually(lambda: query(prometheus, promql), timeout=20)
    assert 60 <= float(result["value"][1]) <= 70
    assert result["metric"]["modelName"] == "NVIDIA A100-SXM4-40GB"
    (fb,) = query(prometheus, 'DCGM_FI_DEV_FB_USED{exported_pod="train-0"}')
    assert float(fb["value"][1]) == 20000
    assert fb["metric"]["pod"] == "nvidia-dcgm-exporter-whole"  # the scrape target's own label
