"""Checks on the Kubernetes manifests in deploy/ and on the Dockerfile.

(a) every object in deploy/*.yaml validates against the Kubernetes OpenAPI schemas that
    kubernetes-validate ships (strict: unknown fields are errors); the ServiceMonitor, a
    Prometheus-operator CRD those schemas do not cover, is checked against a strict subset
    of its CRD schema written out below;
(b) `kubectl kustomize deploy/` renders all of it into the gpu-operator namespace;
(c) what a reviewer would check by hand: names, labels, ports, probes, pod security,
    resources and least-privilege RBAC.

kubectl is required (install it with ./scripts/install-test-tools); these tests fail, they do
not skip, when it is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from status_updater.cli import parser as updater_parser
from tests.support.base import ROOT
from tests.support.rbac import allowed
from topology.migparted import DEFAULT_CONFIGMAP

REPO = ROOT
DEPLOY = REPO / "deploy"
BASE = DEPLOY / "base"
# The default install in one file, rendered from the kustomizations (scripts/render-install): an
# output, not a source, so left out of the sources below and compared with a fresh rendering.
ONE_FILE = DEPLOY / "daemonset.yaml"
# The installs a user applies: `kubectl apply -k <directory>`.
INSTALLS = {
    "per-node": DEPLOY,
    "single-layout": DEPLOY / "single-layout",
    "all-nodes": DEPLOY / "all-nodes",
    "dra": DEPLOY / "dra",
}

# Newest Kubernetes release kubernetes-validate 1.37 ships schemas for, and the oldest
# release these manifests are meant to work on; every object is validated against both.
KUBE_VERSION = "1.37"
MIN_KUBE_VERSION = "1.28"
DRA_MIN_KUBE_VERSION = "1.34"  # resource.k8s.io/v1: what deploy/dra/ needs

NAMESPACE = "gpu-operator"
IMAGE = "mig-exporter:0.1.0"
EXPORTER = "nvidia-dcgm-exporter"
UPDATER = "topology-status-updater"
ALL_NODES = "nvidia-dcgm-exporter-all-nodes"
TOPOLOGY_CM = "topology"
LEASE = "topology-status-updater"
# The updater's default --mig-parted-config: the RBAC must let it read exactly that one.
MIG_PARTED_NAMESPACE, MIG_PARTED_CM = DEFAULT_CONFIGMAP.split("/")
PORT_NAME = "gpu-metrics"
PORT = 9400
NONROOT_UID = 65532

CLUSTER_SCOPED_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass"}
BASE_OBJECTS = {
    ("Namespace", NAMESPACE),
    ("ServiceAccount", EXPORTER),
    ("ServiceAccount", UPDATER),
    ("Role", EXPORTER),
    ("RoleBinding", EXPORTER),
    ("Role", UPDATER),
    ("RoleBinding", UPDATER),
    ("ClusterRole", UPDATER),
    ("ClusterRoleBinding", UPDATER),
    ("DaemonSet", EXPORTER),
    ("Deployment", UPDATER),
    ("Service", EXPORTER),
    ("ServiceMonitor", EXPORTER),
    ("PrometheusRule", "mig-exporter"),
}
ALL_NODES_OBJECTS = BASE_OBJECTS | {(kind, ALL_NODES) for kind in (
    "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
    "StatefulSet", "Service", "ServiceMonitor")} | {("ScrapeConfig", "kwok-gpu-nodes")}  # fmt: skip
UPDATER_DRA = "topology-status-updater-dra"
EXPECTED_OBJECTS = {
    "per-node": BASE_OBJECTS,
    "single-layout": BASE_OBJECTS | {("ConfigMap", TOPOLOGY_CM)},
    "all-nodes": ALL_NODES_OBJECTS,
    "dra": ALL_NODES_OBJECTS | {("ClusterRole", UPDATER_DRA), ("ClusterRoleBinding", UPDATER_DRA),
                                ("DeviceClass", "gpu.nvidia.com"),
                                ("DeviceClass", "mig.nvidia.com")},
}  # fmt: skip
READ_VERBS = {"get", "list", "watch"}

# --------------------------------------------------------------------------------------
# ServiceMonitor (monitoring.coreos.com/v1) is a CRD: kubernetes-validate has no schema
# for it. This is the subset of the CRD's openAPIV3Schema (prometheus-operator,
# monitoring.coreos.com_servicemonitors.yaml) that deploy/ uses, with every object closed
# (additionalProperties: false) so that a misspelt or misplaced field fails like it does
# in strict mode above. `metadata` is checked separately against the real ObjectMeta.
_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": _STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}


def _crd_object(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus-operator object's schema: its kind, any metadata (checked on its own), and
    `spec` as given."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {"type": "object"},
            "spec": spec,
        },
    }


_ACTIONS = [a for name in ("replace", "keep", "drop", "hashmod", "labelmap", "labeldrop",
                           "labelkeep", "lowercase", "uppercase", "keepequal", "dropequal")
            for a in (name, {"hashmod": "HashMod", "labelmap": "LabelMap", "labeldrop": "LabelDrop",
                             "labelkeep": "LabelKeep", "keepequal": "KeepEqual",
                             "dropequal": "DropEqual"}.get(name, name.capitalize()))]  # fmt: skip
# A relabeling as the operator's CRDs take it (ScrapeConfig, ServiceMonitor).
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"enum": _ACTIONS},
        "modulus": {"type": "integer", "minimum": 0},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
    },
}
SERVICEMONITOR_SCHEMA: dict[str, Any] = _crd_object(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "jobLabel": {"type": "string"},
            "selector": _LABEL_SELECTOR,
            "namespaceSelector": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
            },
            "endpoints": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["port"],
                    "properties": {
                        "port": {"type": "string"},
                        "path": {"type": "string", "pattern": "^/"},
                        "scheme": {"enum": ["http", "https"]},
                        "interval": {"type": "string", "pattern": _DURATION},
                        "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                        "honorLabels": {"type": "boolean"},
                        "honorTimestamps": {"type": "boolean"},
                        "relabelings": {"type": "array", "items": _RELABEL},
                        "metricRelabelings": {"type": "array", "items": _RELABEL},
                        "tlsConfig": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "insecureSkipVerify": {"type": "boolean"},
                                "serverName": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
)
# The same for PrometheusRule (monitoring.coreos.com_prometheusrules.yaml): a rule records or
# alerts, never both; the PromQL itself is checked by promtool in tests/deploy/test_rules.py.
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "properties": {
        "record": {"type": "string"},
        "alert": {"type": "string"},
        "expr": {"type": ["string", "integer"]},
        "for": {"type": "string", "pattern": _DURATION},
        "keep_firing_for": {"type": "string", "pattern": _DURATION},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "oneOf": [{"required": ["record"]}, {"required": ["alert"]}],
}
PROMETHEUSRULE_SCHEMA: dict[str, Any] = _crd_object(
    "monitoring.coreos.com/v1",
    "PrometheusRule",
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "groups": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string", "minLength": 1},
                        "interval": {"type": "string", "pattern": _DURATION},
                        "rules": {"type": "array", "items": _RULE},
                    },
                },
            },
        },
    },
)
# ScrapeConfig (monitoring.coreos.com_scrapeconfigs.yaml, v1alpha1): the fields
# deploy/all-nodes/scrapeconfig.yaml uses, as the CRD declares them.
_ROLES = ["Pod", "Endpoints", "Ingress", "Service", "Node", "EndpointSlice"]
SCRAPECONFIG_SCHEMA: dict[str, Any] = _crd_object(
    "monitoring.coreos.com/v1alpha1",
    "ScrapeConfig",
    {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "jobName": {"type": "string", "minLength": 1},
            "scrapeInterval": {"type": "string", "pattern": _DURATION},
            "kubernetesSDConfigs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["role"],
                    "properties": {
                        "role": {"enum": _ROLES},
                        "selectors": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["role"],
                                "properties": {
                                    "role": {"enum": _ROLES},
                                    "label": {"type": "string", "minLength": 1},
                                    "field": {"type": "string", "minLength": 1},
                                },
                            },
                        },
                    },
                },
            },
            "relabelings": {"type": "array", "items": _RELABEL},
        },
    },
)
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1alpha1", "ScrapeConfig"): SCRAPECONFIG_SCHEMA,
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICEMONITOR_SCHEMA,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUSRULE_SCHEMA,
}


# ----------------------------------------------------------------------------- loading


def kustomization(directory: Path) -> dict[str, Any]:
    return yaml.safe_load((directory / "kustomization.yaml").read_text())  # type: ignore[no-any-return]


def manifest_files() -> list[Path]:
    """Every whole API object under deploy/: not kustomization.yaml (kustomize's input), not
    the overlays' patches (parts of objects), not the Helm chart (templates: test_helm.py)."""
    patches = {
        d / p for d in INSTALLS.values() for p in kustomization(d).get("patchesStrategicMerge", [])
    }
    return sorted(
        p
        for p in DEPLOY.rglob("*.yaml")
        if p.name != "kustomization.yaml"
        and p not in patches
        and p != ONE_FILE
        and DEPLOY / "helm" not in p.parents
    )


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def source_docs(paths: list[Path] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    for path in manifest_files() if paths is None else paths:
        for doc in load_docs(path):
            where = path.relative_to(DEPLOY)
            yield f"{where}:{doc['kind']}/{doc['metadata']['name']}", doc


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH; it is needed to render deploy/ with `kubectl kustomize`. "
            "Install it with ./scripts/install-test-tools",
            pytrace=False,
        )
    return path


def kustomize(directory: Path) -> list[dict[str, Any]]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        version = subprocess.run(
            [kubectl(), "version", "--client"], capture_output=True, text=True, check=False
        )
        pytest.fail(
            f"`kubectl kustomize {directory}` failed (exit {proc.returncode}):\n{proc.stderr}\n"
            f"kubectl version --client:\n{version.stdout}{version.stderr}",
            pytrace=False,
        )
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc is not None]


@cache
def _rendered(install: str = "per-node") -> tuple[dict[str, Any], ...]:
    return tuple(kustomize(INSTALLS[install]))


def render(install: str) -> list[dict[str, Any]]:
    return list(_rendered(install))


@pytest.fixture
def rendered() -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/`: the default install, per-node."""
    return render("per-node")


def find(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected exactly one {kind}/{name}, found {len(matches)}"
    return matches[0]


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objs:
        if obj["kind"] in {"DaemonSet", "Deployment", "StatefulSet", "Job"}:
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def quantity(value: str | int) -> float:
    """Parse a Kubernetes resource quantity (the forms used here) into base units."""
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|k|M|G)?", str(value))
    assert m, f"unparsable quantity {value!r}"
    factor = {
        None: 1,
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
    }[m.group(2)]
    return float(m.group(1)) * factor


# -------------------------------------------------------------------------------- RBAC


def bound_rules(
    objs: list[dict[str, Any]], service_account: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(cluster-wide rules, rules in NAMESPACE) granted to a ServiceAccount in NAMESPACE."""
    cluster: list[dict[str, Any]] = []
    namespaced: list[dict[str, Any]] = []
    for binding in objs:
        if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == service_account
            and s.get("namespace") == NAMESPACE
            for s in binding.get("subjects", [])
        ):
            continue
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        role = find(objs, ref["kind"], ref["name"])
        if binding["kind"] == "ClusterRoleBinding":
            cluster += role["rules"]
        else:
            assert binding["metadata"]["namespace"] == NAMESPACE
            namespaced += role["rules"]
    return cluster, namespaced


# ------------------------------------------------------------------- (a) schema checks


@pytest.mark.parametrize("version", [MIN_KUBE_VERSION, KUBE_VERSION])
@pytest.mark.parametrize(("where", "doc"), list(source_docs()), ids=lambda v: v)
def test_manifest_validates_against_kubernetes_schema(
    where: str, doc: dict[str, Any], version: str
) -> None:
    del where  # only for the test id
    if doc["apiVersion"].startswith("resource.k8s.io/") and version == MIN_KUBE_VERSION:
        version = DRA_MIN_KUBE_VERSION  # deploy/dra/ needs the GA DRA API
    crd_schema = CRD_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if crd_schema is None:
        try:
            validated = kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{'.'.join(map(str, e.path))}: {e.message}", pytrace=False)
        assert validated == version
        return

    # A CRD: make sure kubernetes-validate really cannot check it (if a future release
    # can, this fails and the hand-written schema should make way for it) ...
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(doc, version, strict=True)
    # ... check its body against the strict CRD subset above ...
    jsonschema.Draft202012Validator(crd_schema).validate(doc)
    # ... and its metadata against the real ObjectMeta schema, via a carrier object.
    carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}
    kubernetes_validate.validate(carrier, version, strict=True)


def test_servicemonitor_schema_rejects_unknown_fields() -> None:
    """The hand-written CRD schema is strict, like kubernetes-validate's strict mode."""
    doc = find(load_docs(BASE / "servicemonitor.yaml"), "ServiceMonitor", EXPORTER)
    jsonschema.Draft202012Validator(SERVICEMONITOR_SCHEMA).validate(doc)
    for broken in (
        {**doc, "spec": {**doc["spec"], "endpoint": doc["spec"]["endpoints"]}},
        {
            **doc,
            "spec": {
                **doc["spec"],
                "endpoints": [{**doc["spec"]["endpoints"][0], "honor_labels": False}],
            },
        },
        {
            **doc,
            "spec": {
                **doc["spec"],
                "endpoints": [{**doc["spec"]["endpoints"][0], "interval": "15 seconds"}],
            },
        },
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(SERVICEMONITOR_SCHEMA).validate(broken)


def test_kubernetes_validate_ships_the_stated_versions() -> None:
    assert kubernetes_validate.latest_version().startswith(KUBE_VERSION)
    for version in (MIN_KUBE_VERSION, KUBE_VERSION):
        # validate() silently falls back to an older schema set; make sure it does not here.
        doc = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
        assert kubernetes_validate.validate(doc, version, strict=True) == version


# ---------------------------------------------------------------------- (b) kustomize


def test_kustomizations_list_every_manifest() -> None:
    base = kustomization(BASE)
    assert base["namespace"] == NAMESPACE
    assert sorted(base["resources"]) == sorted(
        p.name for p in BASE.glob("*.yaml") if p.name != "kustomization.yaml"
    )
    # Image override point, for every install: `kustomize edit set image mig-exporter=REGISTRY/...`.
    assert [i["name"] for i in base["images"]] == ["mig-exporter"]
    # Every install builds on base/ (with the field old kustomize knows), directly or through
    # another install, and adds its own files.
    for name, directory in INSTALLS.items():
        k = kustomization(directory)
        if name == "dra":  # kustomize would namespace the DeviceClasses: see its kustomization
            assert "namespace" not in k
        else:
            assert k["namespace"] == NAMESPACE, name
        chain = [(directory / b).resolve() for b in k["bases"]]
        while chain[-1] != BASE and chain[-1] in INSTALLS.values():
            chain += [(chain[-1] / b).resolve() for b in kustomization(chain[-1])["bases"]]
        assert chain[-1] == BASE and len(chain) <= 2, name
        own = {p.name for p in directory.glob("*.yaml")
               if p.name != "kustomization.yaml" and p != ONE_FILE}  # fmt: skip
        assert own == set(k.get("resources", [])) | set(k.get("patchesStrategicMerge", [])), name
        # Selectors must stay on `app` only: no label transformer that could reach them.
        assert "commonLabels" not in k and "commonLabels" not in base, name


def test_the_one_file_install_is_what_kustomize_renders() -> None:
    """`kubectl apply -f deploy/daemonset.yaml` installs what `kubectl apply -k deploy/` does,
    the Namespace first; run scripts/render-install when this fails."""
    one_file = load_docs(ONE_FILE)
    assert one_file[0]["kind"] == "Namespace"

    def by_key(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
        return {(d["kind"], d["metadata"]["name"]): d for d in docs}

    assert by_key(one_file) == by_key(render("per-node")), "run scripts/render-install"
    assert len(one_file) == len(by_key(one_file))
    assert ONE_FILE.read_text().startswith("# The default install (per-node layout) in one file")


@pytest.mark.parametrize("install", INSTALLS)
def test_kustomize_renders_expected_objects(install: str) -> None:
    objs = render(install)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objs]
    assert len(keys) == len(set(keys)), f"duplicate objects: {keys}"
    assert set(keys) == EXPECTED_OBJECTS[install]
    # The rendered set is exactly what base/, the install it builds on and its own files hold.
    built_on = [INSTALLS["all-nodes"]] if install == "dra" else []
    files = [*BASE.glob("*.yaml"), *(p for d in [*built_on, INSTALLS[install]]
                                     for p in d.glob("*.yaml"))]  # fmt: skip
    files = [p for p in files if p in manifest_files()]
    assert set(keys) == {(d["kind"], d["metadata"]["name"]) for _, d in source_docs(files)}


@pytest.mark.parametrize("install", INSTALLS)
def test_rendered_objects_live_in_gpu_operator(install: str) -> None:
    rendered = render(install)
    for obj in rendered:
        meta = obj["metadata"]
        if obj["kind"] in CLUSTER_SCOPED_KINDS:
            assert "namespace" not in meta, f"{obj['kind']}/{meta['name']} is cluster-scoped"
        else:
            assert meta.get("namespace") == NAMESPACE, f"{obj['kind']}/{meta['name']}"
        for subject in obj.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                assert subject["namespace"] == NAMESPACE


@pytest.mark.parametrize("install", INSTALLS)
def test_rendered_objects_are_labelled_part_of(install: str) -> None:
    rendered = render(install)
    for obj in rendered:
        if obj["kind"] == "Namespace":
            continue  # owned by the GPU operator in real clusters; left alone
        labels = obj["metadata"].get("labels", {})
        assert labels.get("app.kubernetes.io/part-of") == "mig-exporter", obj["metadata"]
    for where, _pod in pod_specs(rendered):
        kind, name = where.split("/")
        template = find(rendered, kind, name)["spec"]["template"]
        assert template["metadata"]["labels"]["app.kubernetes.io/part-of"] == "mig-exporter"


def test_image_can_be_overridden(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # A relative path (kustomize refuses absolute ones) under `bases`, which
                # old kustomize (kubectl < 1.21) needs for directories and new accepts.
                "bases": [os.path.relpath(DEPLOY, tmp_path)],
                "images": [
                    {
                        "name": "mig-exporter",
                        "newName": "registry.example.com/gpu/mig-exporter",
                        "newTag": "9.9.9",
                    }
                ],
            }
        )
    )
    objs = kustomize(tmp_path)
    images = {c["image"] for _, pod in pod_specs(objs) for c in containers(pod)}
    assert images == {"registry.example.com/gpu/mig-exporter:9.9.9"}


# --------------------------------------------------------------- (c) reviewer checks


@pytest.mark.parametrize("install", INSTALLS)
def test_every_container_uses_the_project_image(install: str) -> None:
    images = {c["image"] for _, pod in pod_specs(render(install)) for c in containers(pod)}
    assert images == {IMAGE}


def test_exporter_daemonset(rendered: list[dict[str, Any]]) -> None:
    ds = find(rendered, "DaemonSet", EXPORTER)
    assert ds["metadata"]["labels"]["app"] == EXPORTER
    assert ds["spec"]["selector"] == {"matchLabels": {"app": EXPORTER}}
    template = ds["spec"]["template"]
    assert template["metadata"]["labels"]["app"] == EXPORTER
    pod = template["spec"]

    assert pod["serviceAccountName"] == EXPORTER
    assert pod["automountServiceAccountToken"] is True
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dcgm-exporter": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]

    [container] = pod["containers"]
    assert container["ports"] == [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}]
    args = container["args"]
    assert args[0] == "exporter"  # ENTRYPOINT is `python -m`
    assert args[args.index("--port") + 1] == str(PORT)

    env = env_of(container)
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["TOPOLOGY_LAYOUT"]["value"] == "per-node"
    assert env["TOPOLOGY_CM_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }

    # Ready once it serves /metrics. Not /health: a stale topology would take the pod out of
    # the Service, and Prometheus would lose the series the exporter still serves. Liveness
    # must not depend on the topology either (a restart cannot fix stale data).
    readiness = container["readinessProbe"]
    assert readiness["httpGet"] == {"path": "/metrics", "port": PORT_NAME}
    liveness = container["livenessProbe"]
    assert "httpGet" not in liveness and "exec" not in liveness
    assert liveness["tcpSocket"] == {"port": PORT_NAME}


def test_status_updater_deployment(rendered: list[dict[str, Any]]) -> None:
    deploy = find(rendered, "Deployment", UPDATER)
    assert deploy["spec"]["selector"] == {"matchLabels": {"app": UPDATER}}
    assert deploy["spec"]["replicas"] in (1, 2)
    template = deploy["spec"]["template"]
    assert template["metadata"]["labels"]["app"] == UPDATER
    pod = template["spec"]
    assert pod["serviceAccountName"] == UPDATER
    assert pod["automountServiceAccountToken"] is True
    [container] = pod["containers"]
    assert container["args"] == ["status_updater", "run"]
    env = env_of(container)
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["TOPOLOGY_LAYOUT"]["value"] == "per-node"
    assert env["TOPOLOGY_CM_NAMESPACE"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }
    # Ready once it follows the cluster: the probe asks the port the updater listens on.
    [port] = container["ports"]
    default = updater_parser().parse_args(["run"]).metrics_port
    assert port == {"name": "metrics", "containerPort": default}
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}


def test_service_selects_exporter_pods(rendered: list[dict[str, Any]]) -> None:
    svc = find(rendered, "Service", EXPORTER)
    assert svc["metadata"]["labels"]["app"] == EXPORTER
    assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert svc["spec"]["ports"] == [
        {"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
    ]
    selector = svc["spec"]["selector"]
    assert selector == {"app": EXPORTER}
    pod_labels = find(rendered, "DaemonSet", EXPORTER)["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    # ... and no other pods.
    for obj in rendered:
        if obj["kind"] in {"Deployment", "StatefulSet", "Job"}:
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert not selector.items() <= labels.items(), obj["metadata"]["name"]


def test_servicemonitor_scrapes_the_service(rendered: list[dict[str, Any]]) -> None:
    sm = find(rendered, "ServiceMonitor", EXPORTER)
    svc = find(rendered, "Service", EXPORTER)
    spec = sm["spec"]
    assert spec["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert "matchExpressions" not in spec["selector"]
    # Without a namespaceSelector a ServiceMonitor only looks in its own namespace.
    assert sm["metadata"]["namespace"] == svc["metadata"]["namespace"]
    assert spec.get("namespaceSelector", {}).get("matchNames", [NAMESPACE]) == [NAMESPACE]
    # job="nvidia-dcgm-exporter", taken from the Service's `app` label.
    assert spec["jobLabel"] == "app"
    assert svc["metadata"]["labels"]["app"] == EXPORTER
    [endpoint] = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert endpoint["port"] == PORT_NAME
    assert endpoint["path"] == "/metrics"
    # Explicitly false: the exporter's namespace/pod/container labels must become
    # exported_namespace/exported_pod/exported_container, as DCGM consumers expect.
    assert endpoint["honorLabels"] is False


def test_single_layout_install() -> None:
    rendered = render("single-layout")
    # Both daemons on the one ConfigMap, the rest as in deploy/.
    for kind, name in (("DaemonSet", EXPORTER), ("Deployment", UPDATER)):
        [container] = find(rendered, kind, name)["spec"]["template"]["spec"]["containers"]
        env = env_of(container)
        assert env["TOPOLOGY_LAYOUT"]["value"] == "single", name
        assert env["TOPOLOGY_CM_NAME"]["value"] == TOPOLOGY_CM, name
        assert env["TOPOLOGY_CM_NAMESPACE"]["valueFrom"] == {
            "fieldRef": {"fieldPath": "metadata.namespace"}
        }
        assert env["PYTHONDONTWRITEBYTECODE"]["value"] == "1", "the patch adds, not replaces"
    # The seed, so exporters have a valid document before the updater has run.
    cm = find(rendered, "ConfigMap", TOPOLOGY_CM)
    assert set(cm["data"]) == {"topology.yml"}
    assert cm["data"]["topology.yml"] == "mig-strategy: mixed\nnodes: {}\n"
    assert yaml.safe_load(cm["data"]["topology.yml"]) == {"mig-strategy": "mixed", "nodes": {}}


@pytest.mark.parametrize("install", INSTALLS)
def test_pods_are_locked_down(install: str) -> None:
    specs = dict(pod_specs(render(install)))
    expected = {f"DaemonSet/{EXPORTER}", f"Deployment/{UPDATER}"}
    if install in ("all-nodes", "dra"):
        expected.add(f"StatefulSet/{ALL_NODES}")
    assert set(specs) == expected
    for where, pod in specs.items():
        pod_sc = pod.get("securityContext", {})
        assert pod_sc.get("runAsNonRoot") is True, where
        assert pod_sc.get("runAsUser") == NONROOT_UID, where
        assert pod_sc.get("seccompProfile") == {"type": "RuntimeDefault"}, where
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.get(flag), f"{where}: {flag}"
        # Only volume types the "restricted" Pod Security Standard allows (no hostPath).
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for volume in volumes.values():
            assert set(volume) - {"name"} <= {
                "emptyDir",
                "configMap",
                "secret",
                "projected",
                "downwardAPI",
            }, f"{where}: volume {volume}"

        for c in containers(pod):
            what = f"{where} container {c['name']}"
            sc = c.get("securityContext", {})
            assert sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, what
            assert sc.get("runAsUser", pod_sc.get("runAsUser")) == NONROOT_UID, what
            assert sc.get("readOnlyRootFilesystem") is True, what
            assert sc.get("allowPrivilegeEscalation") is False, what
            assert sc.get("privileged", False) is False, what
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], what
            assert not sc.get("capabilities", {}).get("add"), what
            assert sc.get("seccompProfile", pod_sc.get("seccompProfile")) == {
                "type": "RuntimeDefault"
            }, what

            res = c.get("resources", {})
            requests, limits = res.get("requests", {}), res.get("limits", {})
            assert {"cpu", "memory"} <= set(requests), what
            assert "memory" in limits, what
            for key, limit in limits.items():
                assert quantity(limit) >= quantity(requests.get(key, 0)), f"{what}: {key}"

            # Python on a read-only root filesystem: no .pyc writes, a writable /tmp.
            assert env_of(c)["PYTHONDONTWRITEBYTECODE"]["value"] == "1", what
            tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            assert len(tmp) == 1, what
            assert "emptyDir" in volumes[tmp[0]["name"]], what


@pytest.mark.parametrize("install", INSTALLS)
def test_service_accounts_do_not_automount_by_default(install: str) -> None:
    rendered = render(install)
    for account in (o for o in rendered if o["kind"] == "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False, account["metadata"]["name"]
    for where, pod in pod_specs(rendered):
        assert find(rendered, "ServiceAccount", pod["serviceAccountName"]), where


def test_exporter_rbac_reads_configmaps_in_its_namespace_only(
    rendered: list[dict[str, Any]],
) -> None:
    cluster, namespaced = bound_rules(rendered, EXPORTER)
    assert cluster == [], "the exporter needs no cluster-wide access"
    assert namespaced, "the exporter must be bound to a Role"
    for rule in namespaced:
        assert rule["apiGroups"] == [""]
        assert rule["resources"] == ["configmaps"]
        assert set(rule["verbs"]) <= READ_VERBS
    # Per-node names (topology-<node>) are not known to a Role: any ConfigMap here, read only.
    for verb in READ_VERBS:
        assert allowed(namespaced, verb, "configmaps", name="topology-gpu-node-1")
    for verb in ("create", "update", "patch", "delete"):
        assert not allowed(namespaced, verb, "configmaps", name="topology-gpu-node-1"), verb
    assert not allowed(namespaced, "get", "secrets", name="topology-gpu-node-1")


def test_single_layout_rbac_is_pinned_to_the_topology_configmap() -> None:
    rendered = render("single-layout")
    cluster, namespaced = bound_rules(rendered, EXPORTER)
    assert cluster == []
    for rule in namespaced:
        assert rule["resourceNames"] == [TOPOLOGY_CM]
        assert set(rule["verbs"]) <= READ_VERBS
    for verb in READ_VERBS:
        assert allowed(namespaced, verb, "configmaps", name=TOPOLOGY_CM)
    # Listing/watching all configmaps (no fieldSelector on the name) is refused.
    assert not allowed(namespaced, "list", "configmaps")
    assert not allowed(namespaced, "get", "configmaps", name="something-else")

    _, updater = bound_rules(rendered, UPDATER)
    for verb in ("get", "create", "patch"):
        assert allowed(updater, verb, "configmaps", name=None if verb == "create" else TOPOLOGY_CM)
    for verb in ("list", "watch", "update", "delete"):
        assert not allowed(updater, verb, "configmaps", name=TOPOLOGY_CM), verb
    assert not allowed(updater, "patch", "configmaps", name="someone-elses")
    # The GPU operator's layouts: read, by name (the updater watches it with a field selector).
    for verb in READ_VERBS:
        assert allowed(updater, verb, "configmaps", name=MIG_PARTED_CM), verb
    for verb in ("update", "patch", "delete"):  # (create cannot be pinned, and it exists)
        assert not allowed(updater, verb, "configmaps", name=MIG_PARTED_CM), verb
    # The name in RBAC is the one the workloads use and the seed has.
    container = find(rendered, "DaemonSet", EXPORTER)["spec"]["template"]["spec"]["containers"][0]
    assert env_of(container)["TOPOLOGY_CM_NAME"]["value"] == TOPOLOGY_CM
    assert find(rendered, "ConfigMap", TOPOLOGY_CM)


def test_status_updater_rbac(rendered: list[dict[str, Any]]) -> None:
    cluster, namespaced = bound_rules(rendered, UPDATER)

    # Cluster-wide: nodes and pods read; nodes patched (its --fault-node-labels, the
    # unhealthy-GPU label: docs/faults.md), simulated nodes' status and KAI's reservation pods
    # patched (its --kai-node-selector: docs/sharing.md); nothing else written.
    for rule in cluster:
        assert set(rule["verbs"]) <= READ_VERBS | {"patch"}, rule
        assert "patch" not in rule["verbs"] or set(rule["resources"]) <= {
            "nodes", "nodes/status", "pods"}, rule  # fmt: skip
        assert "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
    assert {r for rule in cluster for r in rule["resources"]} == {"nodes", "nodes/status", "pods"}
    assert allowed(cluster, "patch", "nodes") and allowed(cluster, "patch", "nodes/status")
    assert allowed(cluster, "patch", "pods")
    assert not allowed(cluster, "update", "nodes") and not allowed(cluster, "update", "pods")
    assert not allowed(cluster, "delete", "pods") and not allowed(cluster, "create", "pods")
    for resource in ("nodes", "pods"):
        for verb in READ_VERBS:
            assert allowed(cluster, verb, resource), (verb, resource)
    assert not allowed(cluster, "list", "secrets")
    assert not allowed(cluster, "create", "configmaps")

    # In its namespace: what it does to the per-node ConfigMaps (watch its own, create, patch,
    # read back, delete those of gone nodes: never PUT) and to its Lease ...
    for verb in ("get", "list", "watch", "create", "patch", "delete"):
        assert allowed(namespaced, verb, "configmaps", name="topology-gpu-node-1"), verb
    assert MIG_PARTED_NAMESPACE == NAMESPACE  # else the updater needs a Role there
    for verb in READ_VERBS:  # the GPU operator's layouts
        assert allowed(namespaced, verb, "configmaps", name=MIG_PARTED_CM), verb
    assert not allowed(namespaced, "update", "configmaps", name="topology-gpu-node-1")
    for verb in ("get", "create", "patch"):
        name = None if verb == "create" else LEASE
        assert allowed(namespaced, verb, "leases", group="coordination.k8s.io", name=name), verb
    # ... and nothing more.
    for rule in namespaced:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule
    assert not allowed(namespaced, "update", "leases", group="coordination.k8s.io", name="x")
    assert not allowed(namespaced, "patch", "leases", group="coordination.k8s.io", name="x")
    assert not allowed(namespaced, "get", "secrets", name=TOPOLOGY_CM)
    granted = {(g, r) for rule in namespaced for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {("", "configmaps"), ("coordination.k8s.io", "leases")}


def test_all_nodes_install() -> None:
    rendered = render("all-nodes")
    sts = find(rendered, "StatefulSet", ALL_NODES)
    assert sts["spec"]["replicas"] == 1 and sts["spec"]["podManagementPolicy"] == "Parallel"
    pod = sts["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == ALL_NODES
    [container] = pod["containers"]
    args = container["args"]
    assert args[0] == "exporter" and "--all-nodes" in args
    assert args[args.index("--port") + 1] == str(PORT)
    assert container["ports"] == [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}]
    env = env_of(container)
    assert env["TOPOLOGY_LAYOUT"]["value"] == "per-node"
    assert "NODE_NAME" not in env
    # Ready as /metrics is, without joining every node's series each time it is asked.
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics/self", "port": PORT_NAME}
    # Autosharding: the exporter reads its pod and namespace, and shards by the replicas (no
    # fixed count that scaling would leave behind).
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "TOTAL_SHARDS" not in env and "--total-shards" not in args

    # Its own Service (headless: each pod's DNS name, for its shard's targets) and
    # ServiceMonitor: they select its pods and not the DaemonSet's, and the DaemonSet's selector
    # does not reach its pods.
    labels = sts["spec"]["template"]["metadata"]["labels"]
    ds = find(rendered, "DaemonSet", EXPORTER)
    svc = find(rendered, "Service", ALL_NODES)
    assert sts["spec"]["serviceName"] == ALL_NODES and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= labels.items()
    assert (
        not svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert not ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert not find(rendered, "Service", EXPORTER)["spec"]["selector"].items() <= labels.items()
    sm = find(rendered, "ServiceMonitor", ALL_NODES)
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert [e["honorLabels"] for e in sm["spec"]["endpoints"]] == [False]
    # The replicas are scraped for their own series (the shard alerts read them), the nodes'
    # series a target per node at this Service's DNS name: never the whole body.
    assert [e["path"] for e in sm["spec"]["endpoints"]] == ["/metrics/self"]
    assert svc["metadata"]["annotations"]["prometheus.io/path"] == "/metrics/self"
    job = find(rendered, "ScrapeConfig", "kwok-gpu-nodes")["spec"]
    # The nodes it finds are the nodes the exporter serves: no node served and never scraped.
    [sd] = job["kubernetesSDConfigs"]
    # ... those with a GPU model, which the updater writes a topology for: a node without is
    # no target (it would answer 404 forever).
    selector = args[args.index("--node-selector") + 1]
    assert [s["label"] for s in sd["selectors"]] == [f"{selector},nvidia.com/gpu.product"]
    keep = [r for r in job["relabelings"] if r.get("action") == "Keep"]
    assert keep == [{"sourceLabels": ["__meta_kubernetes_node_label_nvidia_com_gpu_product"],
                     "regex": ".+", "action": "Keep"}]  # fmt: skip
    to = {r.get("targetLabel"): r for r in job["relabelings"]}
    assert to["__metrics_path__"]["replacement"] == "/metrics/nodes/$1"
    # Each node to the replica of its hashmod, among as many as the StatefulSet has.
    assert to["__tmp_shard"]["modulus"] == sts["spec"]["replicas"]
    assert to["__address__"]["replacement"] == f"{ALL_NODES}-$1.{ALL_NODES}.{NAMESPACE}.svc:{PORT}"

    # RBAC: read the ConfigMaps here, list/watch Nodes (for --node-selector), read its own pod
    # and its StatefulSet (by name), nothing else.
    cluster, namespaced = bound_rules(rendered, ALL_NODES)
    for verb in READ_VERBS:
        assert allowed(namespaced, verb, "configmaps", name="topology-n")
        assert allowed(namespaced, verb, "statefulsets", "apps", ALL_NODES)
        assert not allowed(namespaced, verb, "statefulsets", "apps", "someone-elses")
    assert allowed(namespaced, "get", "pods", name=f"{ALL_NODES}-0")
    assert not allowed(namespaced, "patch", "configmaps", name="topology-n")
    assert allowed(cluster, "list", "nodes") and allowed(cluster, "watch", "nodes")
    granted = {
        (r, v) for rule in cluster + namespaced for r in rule["resources"] for v in rule["verbs"]
    }
    assert granted == {("configmaps", v) for v in READ_VERBS} | {
        ("statefulsets", v) for v in READ_VERBS} | {
        ("nodes", "list"), ("nodes", "watch"), ("pods", "get")}  # fmt: skip


# ---------------------------------------------------------------------------- image


def test_dockerfile_matches_manifests() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    froms = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    assert len(froms) >= 2, "multi-stage build expected"
    assert "ARG PYTHON_IMAGE=python:3.12-slim" in dockerfile
    assert re.search(rf"^USER\s+{NONROOT_UID}(:{NONROOT_UID})?\s*$", dockerfile, re.M)
    assert re.search(rf"^EXPOSE\s+{PORT}\s*$", dockerfile, re.M)
    assert 'ENTRYPOINT ["python", "-m"]' in dockerfile
    assert 'CMD ["exporter"]' in dockerfile
    assert "pip install --no-cache-dir ." in dockerfile

    # Every package the project ships is copied into the build context ...
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    included = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [name for name in included if "." not in name]  # the top-level folders
    needed = ["pyproject.toml", pyproject["project"]["readme"], *packages]
    copied = " ".join(re.findall(r"^COPY\s+(?!--from)(.+)$", dockerfile, re.M))
    for item in needed:
        assert re.search(rf"(^|\s){re.escape(item)}/?(\s|$)", copied), f"{item} not copied"
    # ... and not excluded by .dockerignore.
    ignored = {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert not ignored & set(needed)
    assert {".venv", ".git", "tests"} <= ignored


@pytest.mark.parametrize("install", INSTALLS)
def test_rbac_is_least_privilege_in_every_install(install: str) -> None:
    rendered = render(install)
    roles = [o for o in rendered if o["kind"] in ("Role", "ClusterRole")]
    assert roles
    for role in roles:
        for rule in role.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (role["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule, role["metadata"]["name"]
    # The exporters only read: no verb that changes anything, on anything.
    accounts = {p["serviceAccountName"] for _, p in pod_specs(rendered)} - {UPDATER}
    assert accounts
    for account in accounts:
        for rules in bound_rules(rendered, account):
            for rule in rules:
                assert set(rule["verbs"]) <= READ_VERBS, (account, rule)
                assert not {"secrets", "leases"} & set(rule["resources"]), (account, rule)


def test_dra_install() -> None:
    """deploy/dra/: the driver's DeviceClasses, the updater publishing for the nodes the
    all-nodes exporter serves with DRA labels, and RBAC for what DRA adds, nothing more."""
    rendered = render("dra")
    for name, device_type in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig")):
        spec = find(rendered, "DeviceClass", name)["spec"]
        assert spec["selectors"] == [{"cel": {"expression": (
            f"device.driver == 'gpu.nvidia.com' && "
            f"device.attributes['gpu.nvidia.com'].type == '{device_type}'")}}]  # fmt: skip
    assert find(rendered, "DeviceClass", "gpu.nvidia.com")["spec"]["extendedResourceName"] == (
        "nvidia.com/gpu"
    )
    assert "extendedResourceName" not in find(rendered, "DeviceClass", "mig.nvidia.com")["spec"]

    # The updater's selector is valid and the one the all-nodes exporter serves; dynamic MIG off.
    [updater] = find(rendered, "Deployment", UPDATER)["spec"]["template"]["spec"]["containers"]
    env = {k: v["value"] for k, v in env_of(updater).items() if "value" in v}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        args = updater_parser().parse_args(updater["args"][1:])  # after `python -m status_updater`
    assert (args.dra_node_selector, args.dra_dynamic_mig) == ("type=kwok", False)
    assert not args.dra_claim_status
    [exporter] = find(rendered, "StatefulSet", ALL_NODES)["spec"]["template"]["spec"]["containers"]
    selector = exporter["args"][exporter["args"].index("--node-selector") + 1]
    assert selector == args.dra_node_selector
    assert env_of(exporter)["KUBERNETES_ENABLE_DRA"]["value"] == "true"
    # The DaemonSet (real nodes) keeps the run:ai label set.
    [daemon] = find(rendered, "DaemonSet", EXPORTER)["spec"]["template"]["spec"]["containers"]
    assert "KUBERNETES_ENABLE_DRA" not in env_of(daemon)

    cluster, _ = bound_rules(rendered, UPDATER)
    for verb in ("create", "get", "list", "watch", "update", "delete"):
        assert allowed(cluster, verb, "resourceslices", "resource.k8s.io", "s"), verb
    for verb in READ_VERBS:
        assert allowed(cluster, verb, "resourceclaims", "resource.k8s.io", "c"), verb
    for verb in ("create", "update", "patch", "delete"):
        assert not allowed(cluster, verb, "resourceclaims", "resource.k8s.io", "c"), verb
    # --dra-claim-status (DRA_CLAIM_STATUS, off as installed): a patch of a claim's status only.
    assert allowed(cluster, "patch", "resourceclaims/status", "resource.k8s.io", "c")
    for verb in ("create", "update", "delete"):
        assert not allowed(cluster, verb, "resourceclaims/status", "resource.k8s.io", "c"), verb
    assert not allowed(cluster, "create", "deviceclasses", "resource.k8s.io")
    granted = {(g, r) for rule in cluster for g in rule["apiGroups"] for r in rule["resources"]}
    assert granted == {("", "nodes"), ("", "nodes/status"), ("", "pods"),
                       ("resource.k8s.io", "resourceslices"),
                       ("resource.k8s.io", "resourceclaims"),
                       ("resource.k8s.io", "resourceclaims/status")}  # fmt: skip
    # The exporters get nothing of DRA: they read ConfigMaps.
    for account in (EXPORTER, ALL_NODES):
        rules = [r for found in bound_rules(rendered, account) for r in found]
        assert all("resource.k8s.io" not in r["apiGroups"] for r in rules)


@pytest.mark.parametrize("install", INSTALLS)
def test_no_daemon_is_told_to_listen_on_ipv4_only(install: str) -> None:
    """An IPv6-only cluster's pods have no IPv4 address: every daemon listens on its default,
    every address (dual-stack where the pod has IPv6), never pinned to 0.0.0.0."""
    listened = 0
    for obj in render(install):
        spec = obj.get("spec", {}).get("template", {}).get("spec")
        for c in containers(spec) if spec else []:
            args = [str(a) for a in c.get("args", [])]
            if args[:1] in (["exporter"], ["status_updater"]):
                listened += 1
            for flag in ("--address", "--metrics-address"):
                assert flag not in args, (obj["metadata"]["name"], args)
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert "METRICS_ADDRESS" not in env, obj["metadata"]["name"]
    assert listened >= 1
