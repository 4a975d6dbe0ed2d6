"""The shipped dashboard and rules give the same answers on every dcgm-exporter generation.

One real Prometheus (Debian's) scrapes the same three nodes served once per generation
(`--dcgm-exporter-version`, exporter/generations.py): the sample run:ai MIG node, a whole GPU
held by a pod, and a static-MIG node of two GPUs with held and free instances. Each exporter is
its own target, labelled `generation`, and has its own host name (`Hostname` or `hostname`),
`nvidia-dcgm-exporter-<node>-gen<version>`, as each dcgm-exporter pod has: a fleet in the
middle of an upgrade. Prometheus also evaluates the shipped PrometheusRule.

At one evaluation time, inside one 10-s collection step that every target was scraped in (the
simulation is deterministic per step), every answer is split by generation (the `generation`
label where a result keeps it, else its host's suffix) and compared to 2022's, to the label
set (target labels aside, the host's suffix taken off) and the value:

- every dashboard query with each variable at "All", the whole fleet at once;
- every dashboard query with the variables resolved as Grafana does for one generation's hosts
  (the hosts, GPUs and profiles it lists must be the same for each);
- every recording rule's expression, what Prometheus recorded, and the alert (pending: one
  instance of the MIG node is kept above 95 %);
- and every rule of the file, whatever it alerts on, evaluates without an error.

2022's answers must be non-empty, so nothing passes by finding nothing.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.generations import DEFAULT, GENERATIONS
from grafana.dashboard import OUTPUT as DASHBOARD
from grafana.dashboard import queries
from tests.live.test_prometheus import (
    MIG_NODE,
    STATIC_NODE,
    WHOLE_NODE,
    grafana_regex,
    prometheus_binary,
    query_at,
    resolve_variables,
    rules_evaluated,
    start,
    start_prometheus,
    static_topology,
    substitute,
    whole_gpu_topology,
)
from tests.pipeline.test_cli import free_port, get
from tests.support.base import ROOT, SAMPLES
from tests.support.kubeapi import eventually

RULE = ROOT / "deploy" / "base" / "prometheus-rule.yaml"
STEP_S = 10  # the simulation's collection step (exporter/readings.py)
NAMES = [g.name for g in GENERATIONS]
BASE = DEFAULT.name  # 2022: what every other generation is compared to
# The labels the scrape adds: none of them the exporter's.
TARGET_LABELS = {"instance", "job", "generation", "namespace", "pod", "container"}
HOST_SUFFIX = re.compile(r"-(gen[0-9]+)$")
FULL_INSTANCE = "9"  # the MIG node's 1g.5gb GPU instance kept above the alert's 95 %


def tag(generation: str) -> str:
    return "gen" + generation.replace(".", "")


GENERATION_OF_TAG = {tag(n): n for n in NAMES}


def near_full_mig_topology(tmp_path: Path) -> Path:
    """The sample run:ai MIG node, its GPU instance 9 using 4700 of 4864 MiB (96.6 %, the
    sample's 4384 is 90 %), so the memory alert has an instance to hold pending."""
    text = (SAMPLES / "topology" / "a100-40gb-active.yaml").read_text()
    assert text.count("fb-used: 4384") == 1
    path = tmp_path / "mig-near-full.yaml"
    path.write_text(text.replace("fb-used: 4384", "fb-used: 4700"))
    return path


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's groups as a rule file, as the Prometheus operator hands them over."""
    spec: dict[str, Any] = yaml.safe_load(RULE.read_text())["spec"]
    return spec


def recording_rules() -> dict[str, str]:
    return {
        r["record"]: r["expr"] for g in rule_groups()["groups"] for r in g["rules"] if "record" in r
    }


@dataclass(frozen=True)
class Fleet:
    url: str
    hosts: dict[str, set[str]]  # generation -> the Hostname/hostname values its exporters serve


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp_path = tmp_path_factory.mktemp("generations")
    prometheus_binary()  # none: fail before any exporter starts
    nodes = (("mig", MIG_NODE, near_full_mig_topology(tmp_path)),
             ("whole", WHOLE_NODE, whole_gpu_topology(tmp_path)),
             ("static", STATIC_NODE, static_topology(tmp_path)))  # fmt: skip
    procs = []
    targets = []
    ports = []
    hosts: dict[str, set[str]] = {n: set() for n in NAMES}
    try:
        for generation in NAMES:
            for kind, node, topology in nodes:
                name = f"nvidia-dcgm-exporter-{kind}-{tag(generation)}"
                port = free_port()
                procs.append(start([sys.executable, "-m", "exporter", "--topology-file", str(topology),
                                    "--node-name", node, "--address", "127.0.0.1", "--port", str(port),
                                    "--hostname", name, "--dcgm-exporter-version", generation],
                                   tmp_path / f"{name}.log"))  # fmt: skip
                targets.append({"targets": [f"127.0.0.1:{port}"],
                                "labels": {"generation": generation, "namespace": "gpu-operator",
                                           "pod": name, "container": "nvidia-dcgm-exporter"}})  # fmt: skip
                hosts[generation].add(name)
                ports.append(port)
        for port in ports:
            eventually(
                lambda port=port: get(f"http://127.0.0.1:{port}/health")[0] == 200, timeout=15
            )
        proc, url = start_prometheus(tmp_path, rule_groups(), targets)
        procs.append(proc)
        eventually(lambda: len(instant(url, "up == 1")) == len(targets), timeout=30)
        yield Fleet(url, hosts)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


def instant(url: str, promql: str) -> list[dict[str, Any]]:
    return query_at(url, promql, time.time())


@pytest.fixture(scope="module")
def at(fleet: Fleet) -> float:
    """An evaluation time in the middle of a collection step that every target was scraped in
    throughout, and the rules evaluated in (their alert pending for each generation)."""
    pending = 'ALERTS{alertname="MigInstanceMemoryNearFull", alertstate="pending"}'
    eventually(
        lambda: {r["metric"]["generation"] for r in instant(fleet.url, pending)} == set(NAMES),
        timeout=30,
    )
    step_start = (time.time() // STEP_S) * STEP_S
    time.sleep(step_start + STEP_S + STEP_S / 2 + 1 - time.time())  # the next step, whole
    when = step_start + STEP_S + STEP_S / 2
    for freshest, what in (("up", "scrape"), ("mig:fb_used_mib:sum", "rule evaluation")):
        stamps = query_at(fleet.url, f"timestamp({freshest})", when)
        assert stamps and all(float(s["value"][1]) >= step_start + STEP_S + 2 for s in stamps), (
            f"a {what} missed the step: {stamps}"
        )
    return when


Answer = dict[frozenset[tuple[str, str]], float]


def by_generation(result: list[dict[str, Any]]) -> dict[str, Answer]:
    """A result's series by the generation that served them: labels less the target's, the
    host's generation suffix taken off."""
    answers: dict[str, Answer] = {n: {} for n in NAMES}
    for series in result:
        labels = dict(series["metric"])
        assert "hostname" not in labels, (
            f"4.8.3's hostname label in a 2022-labelled answer: {labels}"
        )
        host = labels.get("Hostname", "")
        suffix = HOST_SUFFIX.search(host)
        served_by = GENERATION_OF_TAG[suffix.group(1)] if suffix else None
        generation = labels.get("generation", served_by)
        assert generation in answers, f"a series of no one generation: {labels}"
        if suffix:
            assert served_by == generation, labels
            labels["Hostname"] = host[: suffix.start()]
        key = frozenset((k, v) for k, v in labels.items() if k not in TARGET_LABELS)
        assert key not in answers[generation], (
            f"two series alike once the target is aside: {labels}"
        )
        answers[generation][key] = float(series["value"][1])
    return answers


def assert_same_as_2022(what: str, answers: dict[str, Answer]) -> None:
    base = answers[BASE]
    assert base, f"{what}: no answer on {BASE}"
    for generation, answer in answers.items():
        assert answer.keys() == base.keys(), (
            f"{what}: {generation}'s series differ from {BASE}'s:\n"
            f" only {generation}: {sorted(map(sorted, answer.keys() - base.keys()))}\n"
            f" only {BASE}: {sorted(map(sorted, base.keys() - answer.keys()))}"
        )
        for key, value in base.items():
            assert answer[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (
                f"{what}: {generation} {sorted(key)}: {answer[key]} != {value}"
            )


def dashboard() -> dict[str, Any]:
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return model


def test_each_exporter_serves_its_generation(fleet: Fleet, at: float) -> None:
    """The exporters differ as their generations' rows say (else the comparisons below would
    prove nothing): GI 7's frame buffer on the MIG node, by its name, its hostname label and
    its profile's name."""
    seen: dict[str, set[tuple[str, str, str]]] = {n: set() for n in NAMES}
    gi7 = '{__name__=~"DCGM_FI_DEV_FB_USED(_BYTES)?", GPU_I_ID="7", pod=~".*-mig-gen.*"}'
    for series in query_at(fleet.url, gi7, at):
        labels = series["metric"]
        host_label = "Hostname" if "Hostname" in labels else "hostname"
        seen[labels["generation"]].add((labels["__name__"], host_label, labels["GPU_I_PROFILE"]))
    for generation in GENERATIONS:
        in_bytes = "DCGM_FI_DEV_FB_USED_BYTES" in generation.counters_file.read_text()
        name = "DCGM_FI_DEV_FB_USED_BYTES" if in_bytes else "DCGM_FI_DEV_FB_USED"
        profile = "MIG 1g.5gb" if generation.profile_names == "nvml" else "1g.5gb"
        assert seen[generation.name] == {(name, generation.hostname_label, profile)}
    assert len(set().union(*seen.values())) == 4  # 2022, 4.8.3, 4.8.4 and 4.9.0 all differ


def test_dashboard_queries_over_the_whole_fleet(fleet: Fleet, at: float) -> None:
    """Every variable at "All": one query answers for every generation at once, each the same."""
    everything = {"Hostname": ".*", "gpu": ".*", "GPU_I_PROFILE": ".*"}
    exprs = queries(dashboard())
    assert len(exprs) >= 6
    for expr in exprs:
        result = query_at(fleet.url, substitute(expr, everything), at)
        assert_same_as_2022(expr, by_generation(result))


def test_dashboard_queries_for_each_generations_hosts(fleet: Fleet, at: float) -> None:
    """The variables resolved as Grafana does with one generation's hosts picked: the same GPUs
    and profiles listed (2022's names), and every panel the same answer, of those hosts only."""
    model = dashboard()
    everyone = resolve_variables(fleet.url, model)
    assert set(everyone["Hostname"]) == set().union(*fleet.hosts.values())  # both labels read
    exprs = queries(model)
    answers: dict[str, dict[str, Answer]] = {expr: {} for expr in exprs}
    for generation in NAMES:
        listed = resolve_variables(fleet.url, model, {"Hostname": sorted(fleet.hosts[generation])})
        assert listed["gpu"] == ["0", "1"], (generation, listed)
        assert listed["GPU_I_PROFILE"] == ["1g.5gb", "2g.10gb", "3g.20gb"], (generation, listed)
        chosen = {name: grafana_regex(values) for name, values in listed.items()}
        for expr in exprs:
            result = by_generation(query_at(fleet.url, substitute(expr, chosen), at))
            assert {g for g, answer in result.items() if answer} == {generation}, expr
            answers[expr][generation] = result[generation]
    for expr, answer in answers.items():
        assert_same_as_2022(expr, answer)


def test_recording_rules_and_their_recordings(fleet: Fleet, at: float) -> None:
    """Each recording rule's expression, and the series Prometheus recorded with it."""
    rules = recording_rules()
    assert set(rules) == {"mig:fb_used_mib:sum", "mig:fb_free_mib:sum", "mig:fb_used:ratio"}
    for record, expr in rules.items():
        assert_same_as_2022(f"{record}: {expr}", by_generation(query_at(fleet.url, expr, at)))
        assert_same_as_2022(record, by_generation(query_at(fleet.url, record, at)))
    # The MIG node's, in MiB: GI 7 and 9 (98 + 4700) and GI 5.
    on_mig = 'mig:fb_used_mib:sum{Hostname=~"nvidia-dcgm-exporter-mig-.*"}'
    for answer in by_generation(query_at(fleet.url, on_mig, at)).values():
        assert {dict(k)["GPU_I_PROFILE"]: v for k, v in answer.items()} == {
            "1g.5gb": 4798,
            "2g.10gb": 153,
        }


def test_every_rule_evaluates_without_error(fleet: Fleet) -> None:
    """Every rule of the PrometheusRule, alerts that have nothing to fire on here included,
    is evaluated by Prometheus on every generation's series at once without an error."""
    errors = rules_evaluated(fleet.url, rule_groups())
    assert not {name: e for name, e in errors.items() if e}, errors


def test_the_memory_alert(fleet: Fleet, at: float) -> None:
    """The alert's expression, and the alert Prometheus holds pending: the same instance, with
    the same labels, on every generation."""
    (alert,) = [
        r
        for g in rule_groups()["groups"]
        for r in g["rules"]
        if r.get("alert") == "MigInstanceMemoryNearFull"
    ]
    answers = by_generation(query_at(fleet.url, alert["expr"], at))
    assert_same_as_2022(alert["expr"], answers)
    assert [dict(k)["GPU_I_ID"] for k in answers[BASE]] == [FULL_INSTANCE]
    pending = 'ALERTS{alertname="MigInstanceMemoryNearFull"}'
    assert_same_as_2022(pending, by_generation(query_at(fleet.url, pending, at)))
