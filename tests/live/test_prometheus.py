"""A real Prometheus (Debian's package) scrapes the exporters, and the consumers' queries work.

The queries are the ones Kruize, Grafana's DCGM dashboard (12239) and the OpenShift console run
(shared/reference/consumers.md), and every query of the dashboard this project ships.
Targets carry `namespace`/`pod`/`container` target labels like a ServiceMonitor's, with
honor_labels false, so the exporter's own pod labels arrive as `exported_*`.

Exporters: the sample MIG node as run:ai leaves it (no pod labels), a whole GPU with a pod,
a second MIG node served with --mig-pod-labels, whose instances name their pods, and a static-MIG
node of the GPU operator (samples/mig/static), whose instances name their pods as dcgm-exporter's;
and a fifth: a whole GPU time-sliced between two pods, served with --kubernetes-virtual-gpus.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from grafana.dashboard import OUTPUT as DASHBOARD
from grafana.dashboard import queries
from tests.pipeline.test_cli import free_port, get
from tests.support.base import ROOT, SAMPLES, run_cli
from tests.support.kubeapi import eventually

MIG_NODE = "qa-mig-worker-gpu-a100"
WHOLE_NODE = "a100-whole"  # the sampled machine with MIG disabled, as a second node
PODS_NODE = "a100-mig-pods"
STATIC_NODE = "a100-40gb-static"  # samples/mig/static: all-balanced on 2 GPUs, two pods
SHARED_NODE = "a100-shared"  # the whole GPU time-sliced, two pods, --kubernetes-virtual-gpus


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


def shared_gpu_topology(tmp_path: Path) -> Path:
    """The sampled machine's GPU time-sliced four ways, two inference pods sharing it."""
    node = yaml.safe_load((SAMPLES / "whole-gpu" / "a100-40gb-mig-disabled.yaml").read_text())
    node["metadata"]["name"] = SHARED_NODE
    node["metadata"]["labels"] |= {"nvidia.com/gpu.replicas": "4",
                                   "nvidia.com/gpu.sharing-strategy": "time-slicing",
                                   "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED"}  # fmt: skip
    pods = [
        {"kind": "Pod",
         "metadata": {"name": f"infer-{x}", "namespace": "share", "uid": f"uid-infer-{x}",
                      "creationTimestamp": f"2026-01-01T00:00:0{i}Z",
                      "annotations": {"run.ai/simulated-gpu-utilization": "30",
                                      "run.ai/simulated-fb-used": "4000"}},
         "spec": {"nodeName": SHARED_NODE, "containers": [
             {"name": f"infer-{x}", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
         "status": {"phase": "Running"}}
        for i, x in enumerate("ab")
    ]  # fmt: skip
    (tmp_path / "shared-node.yaml").write_text(yaml.safe_dump(node))
    (tmp_path / "shared-pods.yaml").write_text(yaml.safe_dump({"kind": "List", "items": pods}))
    rendered = run_cli("status_updater", "render", "--nodes", str(tmp_path / "shared-node.yaml"),
                       "--pods", str(tmp_path / "shared-pods.yaml"))  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    path = tmp_path / "shared.yaml"
    path.write_text(rendered.stdout)
    return path


def pods_node_topology(tmp_path: Path) -> Path:
    """The sample MIG node again, as another node with another GPU."""
    text = (SAMPLES / "topology" / "a100-40gb-active.yaml").read_text()
    path = tmp_path / "pods-node.yaml"
    path.write_text(text.replace(MIG_NODE, PODS_NODE).replace("GPU-e7275015", "GPU-0badcafe"))
    return path


def static_topology(tmp_path: Path) -> Path:
    static = SAMPLES / "static"
    rendered = run_cli("status_updater", "render", "--nodes", str(static / "nodes" / "a100-40gb-mixed.yaml"),
                       "--pods", str(static / "pods"))  # fmt: skip
    assert rendered.returncode == 0, rendered.stderr
    path = tmp_path / "static.yaml"
    path.write_text(rendered.stdout)
    return path


def prometheus_binary() -> str:
    binary = shutil.which("prometheus")
    assert binary, (
        "prometheus is required: run ./scripts/install-test-tools (Debian package prometheus)"
    )
    return binary


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=out)


def start_prometheus(
    work: Path, rules: object, targets: list[dict[str, Any]], honor_labels: bool = False
) -> tuple[subprocess.Popen[bytes], str]:
    """Prometheus scraping `targets` (static_configs) every second as job nvidia-dcgm-exporter,
    evaluating the rule groups `rules` every second: its process and URL (not yet answering)."""
    (work / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(work / "rules.yaml")],
        "scrape_configs": [{"job_name": "nvidia-dcgm-exporter", "honor_labels": honor_labels,
                            "static_configs": targets}],
    }  # fmt: skip
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    web = free_port()
    proc = start([prometheus_binary(), f"--config.file={work / 'prometheus.yml'}",
                  f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
                 work / "prometheus.log")  # fmt: skip
    return proc, f"http://127.0.0.1:{web}"


def rules_evaluated(url: str, groups: dict[str, Any]) -> dict[str, str]:
    """Each rule of `groups` (a rule file's) that Prometheus loaded, by name (`record` or
    `alert`), and the error of its first evaluation after this call, empty for none: the
    series there now are what it evaluates. A rule that parses can still fail every evaluation
    (many-to-many matching, two series of one label set once relabelled), and an alert that
    does never fires: promtool and the parsers see none of that."""
    names = {r.get("record") or r["alert"] for g in groups["groups"] for r in g["rules"]}
    since = time.time()

    def evaluated() -> dict[str, str] | None:
        with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        loaded = [rule for g in body["data"]["groups"] for rule in g["rules"]]
        if any(evaluated_at(rule["lastEvaluation"]) < since for rule in loaded):
            return None
        return {
            rule["name"]: rule.get("lastError", "") or ("" if rule["health"] == "ok" else "err")
            for rule in loaded
        }

    errors = eventually(evaluated, timeout=30, interval=0.2)
    assert set(errors) == names, f"rules loaded {sorted(errors)} != the file's {sorted(names)}"
    return errors


def evaluated_at(rfc3339: str) -> float:
    """Prometheus' time of a rule's last evaluation (nanoseconds, `Z`) as Unix seconds."""
    trimmed = re.sub(r"(\.\d{6})\d*", r"\1", rfc3339).replace("Z", "+00:00")
    return datetime.fromisoformat(trimmed).timestamp()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two exporters and one Prometheus scraping them every second, shared by this module's tests."""
    tmp_path = tmp_path_factory.mktemp("prometheus")
    binary = prometheus_binary()
    procs = []
    targets = []
    exporters = (("mig", MIG_NODE, SAMPLES / "topology" / "a100-40gb-active.yaml", []),
                 ("whole", WHOLE_NODE, whole_gpu_topology(tmp_path), []),
                 ("migpods", PODS_NODE, pods_node_topology(tmp_path), ["--mig-pod-labels"]),
                 ("static", STATIC_NODE, static_topology(tmp_path), []),
                 ("shared", SHARED_NODE, shared_gpu_topology(tmp_path),
                  ["--kubernetes-virtual-gpus"]))  # fmt: skip
    for name, node, topology, flags in exporters:
        port = free_port()
        procs.append(start([sys.executable, "-m", "exporter", "--topology-file", str(topology), "--node-name", node,
                            "--address", "127.0.0.1", "--port", str(port), "--hostname", f"nvidia-dcgm-exporter-{name}",
                            *flags], tmp_path / f"exporter-{name}.log"))  # fmt: skip
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
        eventually(lambda: len(query(url, "up == 1")) == len(exporters), timeout=30)
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
            prometheus,
            'count(count by (UUID,GPU_I_ID) (DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}))',
        ),
        timeout=20,
    )
    # two run:ai nodes of three instances, and the static node's all-balanced on two GPUs
    assert float(count[0]["value"][1]) == 2 * 3 + 2 * 4
    sums = query(
        prometheus,
        'sum by (GPU_I_ID) (DCGM_FI_DEV_FB_USED{Hostname="nvidia-dcgm-exporter-mig"}'
        " + DCGM_FI_DEV_FB_FREE)",
    )
    assert values(sums, "GPU_I_ID") == {"7": 4864, "9": 4864, "5": 9855}
    # No utilization series for MIG instances, as real dcgm-exporter.
    assert query(prometheus, 'DCGM_FI_DEV_GPU_UTIL{GPU_I_ID!=""}') == []
    assert query(prometheus, 'DCGM_FI_DEV_MEM_COPY_UTIL{GPU_I_ID!=""}') == []
    # Empty pod labels are absent in Prometheus: no exported_* on run:ai's MIG series ...
    mig = query(prometheus, 'DCGM_FI_DEV_FB_USED{Hostname="nvidia-dcgm-exporter-mig"}')
    assert len(mig) == 3
    assert all(not k.startswith("exported_") for r in mig for k in r["metric"])
    # ... and with --mig-pod-labels the console's per-pod activity query names each holder.
    per_pod = query(
        prometheus,
        'sum (DCGM_FI_PROF_GR_ENGINE_ACTIVE{exported_pod=~".+",GPU_I_ID!=""})'
        " by (exported_namespace, exported_pod, UUID)",
    )
    busy = values(per_pod, "exported_pod")
    run_ai = {"job-2g-idle-0-0", "job-1g-idle-0-0", "job-gpu-burn-0-0"}
    assert busy.keys() == run_ai | {"trainer-0", "notebook"}  # the static node's, unasked
    assert busy["job-gpu-burn-0-0"] == 1 and busy["job-2g-idle-0-0"] == 0


def test_static_mig_instances_name_their_pods(prometheus: str) -> None:
    """On a GPU operator node, dcgm-exporter names each instance's pod (pod-resources API):
    per-pod frame buffer sums over the pod's instances; free ones have no pod label."""
    host = 'Hostname="nvidia-dcgm-exporter-static"'
    held = eventually(
        lambda: query(prometheus, f"sum by (exported_namespace, exported_pod, exported_container)"
                                  f" (DCGM_FI_DEV_FB_USED{{{host},exported_pod!=\"\"}})"),
        timeout=20,
    )  # fmt: skip
    assert {(r["metric"]["exported_namespace"], r["metric"]["exported_pod"],
             r["metric"]["exported_container"]) for r in held} == {
        ("team-a", "trainer-0", "trainer"), ("team-b", "notebook", "jupyter")}  # fmt: skip
    # The notebook asked for 50% of its 3g.20gb (19968 MiB); the trainer's two 1g.5gb use the
    # default 90% of 4864 each.
    fb = values(held, "exported_pod")
    assert fb["notebook"] == 19968 // 2
    assert fb["trainer-0"] == 2 * int(4864 * 0.9)
    free = query(prometheus, f'count(DCGM_FI_DEV_FB_USED{{{host},exported_pod=""}})')
    assert float(free[0]["value"][1]) == 8 - 3  # 8 instances, 3 held


def test_kruize_whole_gpu_query_finds_the_pod(prometheus: str) -> None:
    promql = ('avg by (Hostname,device,modelName,UUID,exported_container,exported_namespace) '
              '(avg_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace="team",exported_container="train"}[1m]))')  # fmt: skip
    (result,) = eventually(lambda: query(prometheus, promql), timeout=20)
    assert 60 <= float(result["value"][1]) <= 70
    assert result["metric"]["modelName"] == "NVIDIA A100-SXM4-40GB"
    (fb,) = query(prometheus, 'DCGM_FI_DEV_FB_USED{exported_pod="train-0"}')
    assert float(fb["value"][1]) == 20000
    assert fb["metric"]["pod"] == "nvidia-dcgm-exporter-whole"  # the scrape target's own label


def test_kruize_detects_the_whole_gpu_through_memory_copy_utilization(prometheus: str) -> None:
    """Kruize's accelerator detection: the MEM_COPY_UTIL max query finds the pod's GPU, with a
    model name it supports."""
    promql = ('max by (Hostname,device,modelName,UUID,exported_container,exported_namespace) '
              '(max_over_time(DCGM_FI_DEV_MEM_COPY_UTIL{exported_namespace="team",exported_container="train"}[1m]))')  # fmt: skip
    (result,) = eventually(lambda: query(prometheus, promql), timeout=20)
    model = result["metric"]["modelName"].upper()
    assert "A100" in model and "40GB" in model
    # The pod draws 60-70 % of the GPU: the memory interface is busy, less than the SMs.
    utilization = float(
        query(prometheus, promql.replace("MEM_COPY_UTIL", "GPU_UTIL"))[0]["value"][1]
    )
    assert 0 < float(result["value"][1]) < utilization


def test_kruize_finds_each_pod_sharing_a_gpu(prometheus: str) -> None:
    """Virtual-GPU mode: Kruize's per-container query finds both pods on the one GPU, each
    with the GPU's values (its load, capped, and its memory: the pods' sum)."""
    promql = ('avg by (Hostname,device,modelName,UUID,exported_container,exported_namespace) '
              '(avg_over_time(DCGM_FI_DEV_GPU_UTIL{exported_namespace="share"}[1m]))')  # fmt: skip
    results = eventually(lambda: (r := query(prometheus, promql)) and len(r) == 2 and r, timeout=20)
    assert {r["metric"]["exported_container"] for r in results} == {"infer-a", "infer-b"}
    assert len({r["metric"]["UUID"] for r in results}) == 1
    assert {float(r["value"][1]) for r in results} == {60.0}  # 30 % + 30 %
    fb = query(prometheus, 'DCGM_FI_DEV_FB_USED{exported_namespace="share"}')
    assert {(r["metric"]["exported_pod"], r["metric"]["vgpu"], float(r["value"][1])) for r in fb} == {
        ("infer-a", "0", 8000.0), ("infer-b", "1", 8000.0)}  # fmt: skip


def label_values(url: str, selector: str, label: str) -> list[str]:
    """What Grafana's `label_values(selector, label)` lists."""
    params = urllib.parse.urlencode({"match[]": selector})
    with urllib.request.urlopen(f"{url}/api/v1/series?{params}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return sorted({s[label] for s in body["data"] if label in s})


def variable_values(url: str, variable: dict[str, Any], chosen: dict[str, str]) -> list[str]:
    """What Grafana lists for a dashboard's query variable, the variables before it `chosen`:
    `label_values(selector, label)`'s values, or each `query_result(query)` series written as
    Grafana writes it (`{label="value",...} value timestamp`); then, with a regex, its first
    group of each that matches, each value once."""
    text = substitute(variable["query"], chosen)
    if found := re.fullmatch(r"label_values\((.*), (\w+)\)", text):
        texts = label_values(url, *found.groups())
    else:
        found = re.fullmatch(r"query_result\((.*)\)", text)
        assert found, text
        texts = [
            "{" + ",".join(f'{k}="{v}"' for k, v in r["metric"].items()) + "}"
            + f" {r['value'][1]} {int(r['value'][0] * 1000)}"
            for r in query(url, found.group(1))
        ]  # fmt: skip
    if regex := variable.get("regex"):
        pattern = re.compile(regex.removeprefix("/").removesuffix("/"))
        texts = [m.group(1) for t in texts if (m := pattern.search(t))]
    return sorted(set(texts))


def grafana_regex(values: list[str]) -> str:
    """Values chosen in a multi-value variable, as Grafana writes them into a Prometheus regex
    matcher: `(a|b)`, each value's metacharacters escaped (twice the backslash: a PromQL string)."""
    return "(" + "|".join(re.sub(r"([\\^$*+?.()|{}\[\]'])", r"\\\\\1", v) for v in values) + ")"


def substitute(text: str, chosen: dict[str, str]) -> str:
    """Grafana's variable interpolation: `$name` replaced by what is chosen."""
    for name in sorted(chosen, key=len, reverse=True):
        text = text.replace(f"${name}", chosen[name])
    return text


def resolve_variables(
    url: str, dashboard: dict[str, Any], picked: dict[str, list[str]] | None = None
) -> dict[str, list[str]]:
    """The values of every query variable of the dashboard, in order: those `picked`, and for
    the others what Grafana lists with the values of the variables before it chosen (all of a
    variable's values unless picked)."""
    listed: dict[str, list[str]] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        if picked and variable["name"] in picked:
            listed[variable["name"]] = picked[variable["name"]]
            continue
        chosen = {name: grafana_regex(values) for name, values in listed.items()}
        listed[variable["name"]] = variable_values(url, variable, chosen)
    return listed


def test_grafana_12239_variables_and_panels_have_data(prometheus: str) -> None:
    instances = eventually(lambda: label_values(prometheus, "DCGM_FI_DEV_GPU_TEMP", "instance"))
    assert len(instances) == 5  # every exporter, MIG or not
    assert label_values(prometheus, "DCGM_FI_DEV_GPU_TEMP", "gpu") == ["0", "1"]  # static: 2
    chosen = f'instance=~"{"|".join(instances)}", gpu=~"0"'
    panels = {
        "GPU Temperature": f"DCGM_FI_DEV_GPU_TEMP{{{chosen}}}",
        "GPU Avg. Temp": f"avg(DCGM_FI_DEV_GPU_TEMP{{{chosen}}})",
        "GPU Power Usage": f"DCGM_FI_DEV_POWER_USAGE{{{chosen}}}",
        "GPU Power Total": f"sum(DCGM_FI_DEV_POWER_USAGE{{{chosen}}})",
        "GPU SM Clocks": f"DCGM_FI_DEV_SM_CLOCK{{{chosen}}} * 1000000",
        "GPU Utilization": f"DCGM_FI_DEV_GPU_UTIL{{{chosen}}}",
        "GPU Framebuffer Mem Used": f"DCGM_FI_DEV_FB_USED{{{chosen}}}",
        "Tensor Core Utilization": f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{chosen}}}",
    }
    for title, promql in panels.items():
        assert query(prometheus, promql), f"{title}: no data for {promql}"
    (avg,) = query(prometheus, panels["GPU Avg. Temp"])
    assert 20 < float(avg["value"][1]) < 90  # degrees C, not a ratio or a fraction
    clocks = {float(r["value"][1]) for r in query(prometheus, panels["GPU SM Clocks"])}
    assert clocks and all(1e8 < hz < 3e9 for hz in clocks)


def test_every_query_of_the_shipped_dashboard_has_data(prometheus: str) -> None:
    """Variables resolved as Grafana does, in order, each to all its values; then every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    listed = eventually(
        lambda: (r := resolve_variables(prometheus, dashboard)) and all(r.values()) and r
    )
    assert "nvidia-dcgm-exporter-migpods" in listed["Hostname"]
    assert {"1g.5gb", "2g.10gb"} <= set(listed["GPU_I_PROFILE"])
    chosen = {name: grafana_regex(values) for name, values in listed.items()}  # every value
    exprs = queries(dashboard)
    assert len(exprs) >= 6
    for expr in exprs:
        assert "$" not in substitute(expr, chosen).replace('"$1"', ""), expr
        # A rate (the health row's PCIe replays) needs two scrapes of its counter: a second.
        promql = substitute(expr, chosen)
        assert eventually(lambda promql=promql: query(prometheus, promql)), f"no data: {expr}"
    # The holder table lists every pod that holds an instance on the node with pod labels.
    (table,) = [e for e in exprs if "exported_pod" in e]
    holders = {r["metric"]["exported_pod"] for r in query(prometheus, substitute(table, chosen))}
    assert {"job-2g-idle-0-0", "job-1g-idle-0-0", "job-gpu-burn-0-0"} <= holders


def test_energy_counter_rate_is_the_power(prometheus: str) -> None:
    """TOTAL_ENERGY_CONSUMPTION is mJ since boot: its rate is the power draw in mW."""
    energy = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
    power = "DCGM_FI_DEV_POWER_USAGE"
    # Values step every 10 s: wait for a whole minute of samples, six steps.
    eventually(lambda: query(prometheus, f"count_over_time({energy}[1m]) >= 55"), timeout=90)
    rate = values(query(prometheus, f"max by (Hostname) (rate({energy}[1m]))"), "Hostname")
    drawn = values(
        query(prometheus, f"max by (Hostname) (avg_over_time({power}[1m])) * 1000"), "Hostname"
    )
    assert rate.keys() == drawn.keys() and len(rate) == 5
    for host, mw in rate.items():
        assert mw > 0
        assert mw == pytest.approx(drawn[host], rel=0.2), host
    # Exactly: one step's energy is the previous step's power times the step, in mJ.
    step = 10
    at = (time.time() // step) * step - step / 2  # the middle of the last complete step
    exact = query_at(
        prometheus,
        f"max by (Hostname) (({energy} - {energy} offset {step}s)"
        f" / ({power} offset {step}s * {step} * 1000))",
        at,
    )
    assert len(exact) == len(rate)
    for ratio in values(exact, "Hostname").values():
        assert ratio == pytest.approx(1, abs=1e-4)


def query_at(url: str, promql: str, at: float) -> list[dict[str, Any]]:
    params = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])
