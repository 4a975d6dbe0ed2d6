"""The Helm chart (deploy/helm/mig-exporter/), with real Helm 3 and Helm 4 (scripts/install-helm).

What a user installing with `helm upgrade -i` relies on:
- `helm lint --strict` passes, with both Helm majors, for every values file we ship;
- each layout's values give the objects `kubectl apply -k` gives for it (the two cannot drift);
- every render of every shipped values file is valid for the API (Kubernetes 1.30 and the
  newest; DRA objects 1.34) and its RBAC grants what the daemons ask, under the names and
  namespace it was given (the requests the daemons make in the live tests are checked against
  the chart's layouts too: test_slicewriter.py, test_targets.py);
- a value set to null (as users and other charts' guards do) is refused in Helm's one error
  naming the key, or renders: never a template's nil-pointer failure;
- `helm package` gives the archive a release pushes, rendering as the directory does.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_deploy import (
    CRD_SCHEMAS,
    DRA_MIN_KUBE_VERSION,
    KUBE_VERSION,
    env_of,
    render,
)
from tests.support.base import ROOT
from tests.support.rbac import allowed

CHART = ROOT / "deploy" / "helm" / "mig-exporter"
HELMS = {3: ROOT / ".tools" / "helm3" / "helm", 4: ROOT / ".tools" / "helm4" / "helm"}
LAYOUTS = {"per-node": "per-node", "single": "single-layout", "all-nodes": "all-nodes",
           "dra": "dra"}  # fmt: skip
VALUES = sorted([*CHART.glob("ci/*.yaml"), *(ROOT / "deploy" / "helm" / "examples").glob("*.yaml")])
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def helm(major: int, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    binary = HELMS[major]
    if not binary.exists():
        pytest.fail(
            f"{binary} is missing: run ./scripts/install-helm (make test does)", pytrace=False
        )
    done = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    if check and done.returncode != 0:
        pytest.fail(f"helm {' '.join(args)}: exit {done.returncode}\n{done.stderr}", pytrace=False)
    return done


@cache
def template(major: int, values: Path | None = None, *sets: str) -> tuple[dict[str, Any], ...]:
    args = ["template", "mig-exporter", str(CHART)]
    if values is not None:
        args += ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    return tuple(d for d in yaml.safe_load_all(helm(major, *args).stdout) if d)


def layout_objects(layout: str) -> list[dict[str, Any]]:
    """What the chart installs for a layout of LAYOUTS (its ci/ values), with Helm 4: what the
    tests that record the daemons' requests check the chart's RBAC against too."""
    return list(template(4, CHART / "ci" / f"{layout}-values.yaml"))


def by_key(objs: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name), each container's environment in name order (the order of an
    environment does not matter to the kubelet; kustomize's patches reorder it)."""
    out = {}
    for o in objs:
        o = json.loads(json.dumps(o))
        for c in o.get("spec", {}).get("template", {}).get("spec", {}).get("containers") or ():
            if "env" in c:
                c["env"] = sorted(c["env"], key=lambda e: e["name"])
        out[(o["kind"], o["metadata"]["name"])] = o
    return out


@pytest.mark.parametrize("major", [3, 4])
@pytest.mark.parametrize("values", [None, *VALUES], ids=lambda v: v.name if v else "defaults")
def test_lint_strict(major: int, values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    done = helm(major, *args, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout and "[ERROR]" not in done.stdout


@pytest.mark.parametrize("major", [3, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_layout_installs_what_kustomize_installs(major: int, layout: str) -> None:
    chart = by_key(template(major, CHART / "ci" / f"{layout}-values.yaml"))
    kustomize = by_key(render(LAYOUTS[layout]))
    assert sorted(chart) == sorted(kustomize)
    # The rules as their source file says them: Debian's kubectl 1.20 folds one block of
    # deploy/base/prometheus-rule.yaml with an extra line break (its go-yaml), Helm as YAML does.
    source = yaml.safe_load((ROOT / "deploy" / "base" / "prometheus-rule.yaml").read_text())
    rule = ("PrometheusRule", "mig-exporter")
    assert chart[rule].pop("spec") == source["spec"]
    kustomize[rule].pop("spec")
    for key in chart:
        assert chart[key] == kustomize[key], key


CHART_KUBE_VERSION = "1.30"  # Chart.yaml's kubeVersion: the oldest the chart installs on


def _validate(doc: dict[str, Any]) -> None:
    """Valid for the API of the oldest Kubernetes the chart takes (DRA objects: the first with
    resource.k8s.io/v1) and of the newest kubernetes-validate knows; a CRD's body against the
    operator's schema (test_deploy.CRD_SCHEMAS)."""
    oldest = CHART_KUBE_VERSION
    if doc["apiVersion"].startswith("resource.k8s.io/"):
        oldest = DRA_MIN_KUBE_VERSION
    schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    for version in (oldest, KUBE_VERSION):
        if schema is None:
            kubernetes_validate.validate(doc, version, strict=True)
            continue
        jsonschema.Draft202012Validator(schema).validate(doc)
        carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}
        kubernetes_validate.validate(carrier, version, strict=True)


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name)
def test_every_shipped_values_file_renders_objects_the_api_takes(values: Path) -> None:
    for doc in template(4, values):
        try:
            _validate(doc)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
            pytest.fail(f"{values.name}: {doc['kind']} {doc['metadata']['name']}: "
                        f"{'.'.join(map(str, e.path))}: {e.message}", pytrace=False)  # fmt: skip


def _namespace(objs: Any) -> str:
    return next(o["metadata"]["namespace"] for o in objs if "namespace" in o["metadata"])


@pytest.mark.parametrize("values", VALUES, ids=lambda v: v.name)
def test_every_render_grants_what_its_daemons_ask_under_its_names(values: Path) -> None:
    """Whatever the names and namespace: each pod's service account exists and is bound; the
    exporters read the topology ConfigMaps, the updater writes them and holds its Lease (the
    name it is given); the all-nodes exporter reads its own StatefulSet; with DRA, the updater
    publishes slices and reads claims; the ScrapeConfig targets the StatefulSet's pods."""
    objs = list(template(4, values))
    ns = _namespace(objs)
    found = by_key(objs)
    accounts = {n for (k, n) in found if k == "ServiceAccount"}
    settings = {**DEFAULTS, **yaml.safe_load(values.read_text())}
    names = {**DEFAULTS["names"], **(settings.get("names") or {})}
    for o in objs:
        if o["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            spec = o["spec"]["template"]["spec"]
            assert spec["serviceAccountName"] in accounts, o["metadata"]["name"]
            assert o["metadata"]["namespace"] == ns
        if o["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            (subject,) = o["subjects"]
            assert (subject["name"], subject["namespace"]) in {(a, ns) for a in accounts}
            role = found[(o["roleRef"]["kind"], o["roleRef"]["name"])]
            assert role is not None

    def rules(account: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        bound = [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
                 and o["subjects"][0]["name"] == account]  # fmt: skip
        cluster = [r for b in bound if b["kind"] == "ClusterRoleBinding"
                   for r in found[("ClusterRole", b["roleRef"]["name"])]["rules"]]  # fmt: skip
        local = [r for b in bound if b["kind"] == "RoleBinding"
                 for r in found[("Role", b["roleRef"]["name"])]["rules"]]  # fmt: skip
        return cluster, local

    single = settings.get("layout") == "single"
    topology = settings.get("topologyConfigMap", "topology") if single else "topology-n1"
    if (updater := found.get(("Deployment", names["updater"]))) is not None:
        cluster, local = rules(names["updater"])
        (container,) = updater["spec"]["template"]["spec"]["containers"]
        lease = env_of(container).get("LEASE_NAME", {}).get("value", "topology-status-updater")
        assert lease == names["updater"]
        assert allowed(local, "get", "leases", "coordination.k8s.io", lease)
        assert allowed(local, "patch", "leases", "coordination.k8s.io", lease)
        assert allowed(local, "patch", "configmaps", name=topology)
        for verb in ("list", "watch"):
            assert allowed(cluster, verb, "nodes") and allowed(cluster, verb, "pods")
        if settings.get("dra", {}).get("enabled"):
            for verb in ("create", "update", "delete", "list", "watch"):
                assert allowed(cluster, verb, "resourceslices", "resource.k8s.io", "s")
            assert allowed(cluster, "watch", "resourceclaims", "resource.k8s.io", "c")
    if ("DaemonSet", names["exporter"]) in found:
        _, local = rules(names["exporter"])
        assert allowed(local, "watch", "configmaps", name=topology)
    if ("StatefulSet", names["allNodes"]) in found:
        cluster, local = rules(names["allNodes"])
        assert allowed(local, "get", "statefulsets", "apps", names["allNodes"])
        assert allowed(local, "watch", "configmaps", name=topology)
        assert allowed(cluster, "watch", "nodes")
        scrape = next((o for o in objs if o["kind"] == "ScrapeConfig"), None)
        if scrape is not None:
            address = scrape["spec"]["relabelings"][-1]["replacement"]
            assert address.startswith(f"{names['allNodes']}-$1.{names['allNodes']}.{ns}.svc:")
            shards = found[("StatefulSet", names["allNodes"])]["spec"]["replicas"]
            assert scrape["spec"]["relabelings"][-2]["modulus"] == shards


def test_beside_the_gpu_operator_nothing_takes_its_names() -> None:
    """The documented mixed set-up: no object is named as the GPU operator's exporter objects
    (nvidia-dcgm-exporter, its DRA mode's nvidia-dcgm-exporter-dra), and all live in our own
    namespace; nothing creates the DRA driver's DeviceClasses."""
    objs = template(4, ROOT / "deploy" / "helm" / "examples" / "beside-gpu-operator.yaml")
    taken = {"nvidia-dcgm-exporter", "nvidia-dcgm-exporter-dra", "gpu-operator"}
    assert not {o["metadata"]["name"] for o in objs} & taken
    assert {o["metadata"].get("namespace", "mig-sim") for o in objs} == {"mig-sim"}
    assert not [o for o in objs if o["kind"] == "DeviceClass"]


@pytest.mark.parametrize("major", [3, 4])
def test_a_null_value_is_refused_by_name_or_renders(major: int) -> None:
    """Each top-level value set to null: Helm's schema error naming it, or a render the API
    takes; never a template failing on the missing value."""
    for key in DEFAULTS:
        done = helm(major, "template", "x", str(CHART), "--set", f"{key}=null", check=False)
        if done.returncode == 0:
            for doc in yaml.safe_load_all(done.stdout):
                if doc:
                    _validate(doc)
            continue
        assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
        assert key in done.stderr and "nil pointer" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("setting", "said"),
    [("layout=sideways", "layout"), ("service.port=0", "port"), ("allNodes.shards=0", "shards"),
     ("dra.consumableShares=1", "consumableShares"), ("names.exporter=Bad_Name", "exporter"),
     ("dcgmExporterVersion=5.0", "dcgmExporterVersion"), ("tlsServerConfig.enabled=true", "secretName"),
     ("nodeSelecter.a=b", "nodeSelecter")],
)  # fmt: skip
def test_what_would_render_a_broken_install_is_refused_naming_it(setting: str, said: str) -> None:
    for major in (3, 4):
        done = helm(major, "template", "x", str(CHART), "--set", setting, check=False)
        assert done.returncode != 0 and said in done.stderr, (major, done.stderr)
        assert "values don't meet the specifications of the schema" in done.stderr


def test_the_package_is_the_chart_a_release_pushes(tmp_path: Path) -> None:
    helm(4, "package", str(CHART), "--destination", str(tmp_path))
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    archive = tmp_path / f"mig-exporter-{version}.tgz"
    with tarfile.open(archive) as t:
        names = set(t.getnames())
    assert {"mig-exporter/Chart.yaml", "mig-exporter/values.yaml", "mig-exporter/values.schema.json",
            "mig-exporter/files/prometheus-rule.yaml", "mig-exporter/files/mig-dashboard.json",
            "mig-exporter/templates/exporter.yaml"} <= names  # fmt: skip
    assert not any("/ci/" in n for n in names)
    packed = helm(4, "template", "mig-exporter", str(archive)).stdout
    assert packed == helm(4, "template", "mig-exporter", str(CHART)).stdout


def test_the_chart_ships_the_rules_and_dashboard_the_repository_has() -> None:
    """The chart's copies (Helm reads no file outside the chart) are the sources' bytes."""
    assert (CHART / "files" / "prometheus-rule.yaml").read_bytes() == (
        ROOT / "deploy" / "base" / "prometheus-rule.yaml").read_bytes()  # fmt: skip
    assert (CHART / "files" / "mig-dashboard.json").read_bytes() == (
        ROOT / "grafana" / "mig-dashboard.json").read_bytes()  # fmt: skip
    (cm,) = [o for o in template(4, None, "dashboard.enabled=true") if o["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["mig-dashboard.json"])
    assert dashboard == json.loads((ROOT / "grafana" / "mig-dashboard.json").read_text())


def test_the_chart_installs_the_release_s_image() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in project
    images = {c["image"] for o in template(4) if o["kind"] in ("DaemonSet", "Deployment")
              for c in o["spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert images == {f"mig-exporter:{chart['appVersion']}"}
