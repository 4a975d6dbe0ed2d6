"""The test harness itself: the official client over HTTP against the emulated API."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3.exceptions
import yaml
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from status_updater.devices import build_node
from status_updater.objects import slim_node
from status_updater.resourceslices import node_slices
from tests.support.base import SAMPLES
from tests.support.kubeapi import KubeAPI, eventually

NS = "mig-system"


@pytest.fixture
def kube() -> Iterator[KubeAPI]:
    with KubeAPI.start() as api:
        yield api


@pytest.fixture
def api(kube: KubeAPI) -> Iterator[client.ApiClient]:
    with kube.api_client() as api_client:
        yield api_client


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def pod(name: str, node_name: str) -> dict[str, Any]:
    # The client is pydantic-based: what the emulator serves must pass the schema (containers).
    containers = [{"name": "main", "image": "busybox"}]
    spec = {"nodeName": node_name, "containers": containers}
    return {"metadata": {"name": name, "labels": {"app": "gpu"}}, "spec": spec}


def collect(stream: Iterator[dict[str, Any]], count: int) -> list[tuple[str, str]]:
    """(type, name) of the first ``count`` events; stops reading after them."""
    events = []
    for event in stream:
        events.append((event["type"], event["raw_object"]["metadata"]["name"]))
        if len(events) == count:
            break
    return events


def after_first_event(action: Callable[[], None]) -> Callable[[dict[str, Any]], None]:
    """Run ``action`` in a thread once, when the first event proves the watch is open."""
    started = threading.Event()

    def on_event(_: dict[str, Any]) -> None:
        if not started.is_set():
            started.set()
            threading.Thread(target=action, daemon=True).start()

    return on_event


# ---- list + watch ------------------------------------------------------------------------------


def test_list_has_kind_and_resource_version(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("n1"))
    nodes = core.list_node()
    assert nodes.metadata.resource_version == "1"
    assert [n.metadata.name for n in nodes.items] == ["n1"]
    raw = kube.request("GET", "/api/v1/nodes")
    assert (raw["kind"], raw["apiVersion"]) == ("NodeList", "v1")


def test_watch_streams_added_modified_deleted(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("n1"))

    def writes() -> None:
        kube.create("nodes", node("n2"))
        kube.patch("nodes", "n1", {"metadata": {"labels": {"gpu": "yes"}}})
        kube.delete("nodes", "n2")

    notify = after_first_event(writes)
    w = watch.Watch()
    events = []
    for event in w.stream(core.list_node, timeout_seconds=5, _request_timeout=5):
        notify(event)
        events.append((event["type"], event["object"].metadata.name))
        if len(events) == 4:
            w.stop()
    assert events == [("ADDED", "n1"), ("ADDED", "n2"), ("MODIFIED", "n1"), ("DELETED", "n2")]


def test_watch_from_resource_version_replays_only_later_events(
    kube: KubeAPI, core: client.CoreV1Api
) -> None:
    kube.create("nodes", node("n1"))
    rv = core.list_node().metadata.resource_version
    kube.create("nodes", node("n2"))
    kube.patch("nodes", "n1", {"metadata": {"labels": {"gpu": "yes"}}})
    stream = watch.Watch().stream(
        core.list_node, resource_version=rv, timeout_seconds=5, _request_timeout=5
    )
    assert collect(stream, 2) == [("ADDED", "n2"), ("MODIFIED", "n1")]


def test_watch_ends_after_timeout_seconds(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("n1"))
    started = time.monotonic()
    events = list(watch.Watch().stream(core.list_node, timeout_seconds=1, _request_timeout=5))
    assert [e["type"] for e in events] == ["ADDED"]
    assert 0.9 < time.monotonic() - started < 3


def test_watch_pods_in_all_namespaces_with_selectors(kube: KubeAPI, core: client.CoreV1Api) -> None:
    for ns, name, node_name in [("a", "p1", "n1"), ("b", "p2", "n1"), ("b", "p3", "n2")]:
        kube.create("pods", pod(name, node_name), namespace=ns)
    pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    assert sorted((p.metadata.namespace, p.metadata.name) for p in pods.items) == [
        ("a", "p1"),
        ("b", "p2"),
    ]
    assert len(core.list_pod_for_all_namespaces(label_selector="app in (gpu,cpu)").items) == 3
    assert core.list_pod_for_all_namespaces(label_selector="app!=gpu").items == []

    # Moving p3 onto n1 enters the selector's view: the watcher sees it as ADDED.
    stream = watch.Watch().stream(
        core.list_pod_for_all_namespaces,
        field_selector="spec.nodeName=n1",
        resource_version=pods.metadata.resource_version,
        timeout_seconds=5,
        _request_timeout=5,
    )
    kube.patch("pods", "p3", {"spec": {"nodeName": "n1"}}, namespace="b")
    kube.delete("pods", "p1", namespace="a")
    assert collect(stream, 2) == [("ADDED", "p3"), ("DELETED", "p1")]


def test_watch_namespaced_configmaps(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("configmaps", {"metadata": {"name": "other"}}, namespace="elsewhere")
    kube.create("configmaps", {"metadata": {"name": "mine"}}, namespace=NS)
    stream = watch.Watch().stream(
        core.list_namespaced_config_map, NS, timeout_seconds=5, _request_timeout=5
    )
    assert collect(stream, 1) == [("ADDED", "mine")]


def test_bookmarks_advance_the_resource_version(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("n1"))

    def unrelated_write_then_bookmark() -> None:
        kube.create("configmaps", {"metadata": {"name": "cm"}}, namespace=NS)  # rv 2, not a node
        kube.send_bookmarks()

    notify = after_first_event(unrelated_write_then_bookmark)
    w = watch.Watch()
    types = []
    for event in w.stream(
        core.list_node, allow_watch_bookmarks=True, timeout_seconds=5, _request_timeout=5
    ):
        notify(event)
        types.append(event["type"])
        if event["type"] == "BOOKMARK":
            w.stop()
    assert types == ["ADDED", "BOOKMARK"]
    assert w.resource_version == "2"  # a re-watch would resume after the unrelated write


# ---- failures ----------------------------------------------------------------------------------


def test_forced_410_raises_api_exception(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.expire_watches()
    with pytest.raises(ApiException) as err:
        # With timeout_seconds the client does not retry after a 410, it raises at once.
        list(watch.Watch().stream(core.list_node, resource_version="0", timeout_seconds=5))
    assert err.value.status == 410


def test_watch_from_compacted_resource_version_is_gone(
    kube: KubeAPI, core: client.CoreV1Api
) -> None:
    kube.create("nodes", node("n1"))
    rv = core.list_node().metadata.resource_version
    kube.patch("nodes", "n1", {"metadata": {"labels": {"a": "b"}}})
    kube.compact()
    # Without timeout_seconds, the client retries once from the same (too old) version, then raises.
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_node, resource_version=rv, _request_timeout=5))
    assert err.value.status == 410
    assert [e.params.get("watch") for e in kube.journal()].count("true") == 2


def test_cut_ends_the_watch(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("n1"))
    notify = after_first_event(kube.cut_watches)
    started = time.monotonic()
    events = []
    for event in watch.Watch().stream(core.list_node, timeout_seconds=30, _request_timeout=30):
        notify(event)
        events.append(event["type"])
    assert events == ["ADDED"]
    assert time.monotonic() - started < 3


def test_aborted_watch_breaks_the_connection(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("nodes", node("n1"))
    notify = after_first_event(lambda: kube.cut_watches(abort=True))
    with pytest.raises(urllib3.exceptions.ProtocolError):
        for event in watch.Watch().stream(core.list_node, timeout_seconds=30, _request_timeout=30):
            notify(event)


def test_injected_500s_then_recovery(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.fail_next(2, action="list", plural="nodes")
    for _ in range(2):
        with pytest.raises(ApiException) as err:
            core.list_node()
        assert err.value.status == 500
    assert core.list_node().items == []
    assert [e.fault for e in kube.journal()] == [500, 500, None]


def test_injected_http_410_on_watch(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.fail_next(status=410, action="watch")
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_node, resource_version="5", timeout_seconds=5))
    assert err.value.status == 410


# ---- writes ------------------------------------------------------------------------------------


def test_configmap_create_then_patch(kube: KubeAPI, core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map(
        NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="status"), data={"a": "1"})
    )
    assert created.metadata.namespace == NS and created.metadata.uid
    core.patch_namespaced_config_map("status", NS, {"data": {"b": "2"}})  # strategic merge
    core.patch_namespaced_config_map(
        "status", NS, {"data": {"a": None}}, _content_type="application/merge-patch+json"
    )
    core.patch_namespaced_config_map("status", NS, [{"op": "add", "path": "/data/c", "value": "3"}])
    stored = kube.get("configmaps", "status", namespace=NS)
    assert stored["data"] == {"b": "2", "c": "3"}
    assert stored["metadata"]["resourceVersion"] == "4"
    assert (stored["kind"], stored["apiVersion"]) == ("ConfigMap", "v1")


def test_stale_resource_version_conflicts(kube: KubeAPI, core: client.CoreV1Api) -> None:
    kube.create("configmaps", {"metadata": {"name": "status"}}, namespace=NS)
    current = core.read_namespaced_config_map("status", NS)
    stale = current.metadata.resource_version
    kube.patch("configmaps", "status", {"data": {"by": "someone else"}}, namespace=NS)

    body = {"metadata": {"resourceVersion": stale}, "data": {"by": "us"}}
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("status", NS, body)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "status"}})
    assert err.value.status == 409

    fresh = core.read_namespaced_config_map("status", NS).metadata.resource_version
    body["metadata"]["resourceVersion"] = fresh
    assert core.patch_namespaced_config_map("status", NS, body).data == {"by": "us"}


def test_lease_create_read_replace(kube: KubeAPI, api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    now = datetime.datetime.now(datetime.UTC)
    spec = client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=15, renew_time=now)
    leases.create_namespaced_lease(
        NS, client.V1Lease(metadata=client.V1ObjectMeta(name="leader"), spec=spec)
    )
    lease = leases.read_namespaced_lease("leader", NS)
    stale = lease.metadata.resource_version
    lease.spec.holder_identity = "b"
    replaced = leases.replace_namespaced_lease("leader", NS, lease)
    assert replaced.spec.holder_identity == "b"
    assert replaced.spec.renew_time == lease.spec.renew_time
    assert int(replaced.metadata.resource_version) > int(stale)

    lease.spec.holder_identity = "c"  # still carries the stale resourceVersion
    with pytest.raises(ApiException) as err:
        leases.replace_namespaced_lease("leader", NS, lease)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        leases.replace_namespaced_lease("missing", NS, lease)
    assert err.value.status == 404


def test_finalizers_delay_deletion(kube: KubeAPI) -> None:
    kube.create("configmaps", {"metadata": {"name": "cm", "finalizers": ["x"]}}, namespace=NS)
    kube.delete("configmaps", "cm", namespace=NS)
    assert kube.get("configmaps", "cm", namespace=NS)["metadata"]["deletionTimestamp"]
    kube.patch("configmaps", "cm", {"metadata": {"finalizers": None}}, namespace=NS)
    assert kube.find("configmaps", "cm", namespace=NS) is None


# ---- the harness -------------------------------------------------------------------------------


def test_kubeconfig_works_with_the_official_loader(kube: KubeAPI, tmp_path: Path) -> None:
    path = kube.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    _, active = config.list_kube_config_contexts(config_file=str(path))
    assert active["context"]["namespace"] == NS
    with config.new_client_from_config(config_file=str(path)) as api_client:
        assert client.CoreV1Api(api_client).list_namespaced_config_map(NS).items == []
        assert client.VersionApi(api_client).get_code().major == "1"


def test_another_process_reaches_it_through_kubeconfig(kube: KubeAPI, tmp_path: Path) -> None:
    """As the daemons will: KUBECONFIG in the environment, the official loader, real HTTP."""
    script = (
        "from kubernetes import client, config\n"
        "config.load_kube_config()\n"
        "ns = config.list_kube_config_contexts()[1]['context']['namespace']\n"
        "body = {'metadata': {'name': 'from-daemon'}, 'data': {'ok': 'yes'}}\n"
        "client.CoreV1Api().create_namespaced_config_map(ns, body)\n"
    )
    env = {**os.environ, "KUBECONFIG": str(kube.write_kubeconfig(tmp_path / "kc", namespace=NS))}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=30)
    assert kube.get("configmaps", "from-daemon", namespace=NS)["data"] == {"ok": "yes"}


def test_eventually(kube: KubeAPI) -> None:
    threading.Timer(0.1, kube.create, ["nodes", node("late")]).start()
    assert eventually(lambda: kube.get("nodes", "late"), timeout=3)["metadata"]["name"] == "late"
    with pytest.raises(AssertionError):
        eventually(lambda: kube.get("nodes", "never"), timeout=0.1)


def test_plain_kmock_is_usable_and_lenient() -> None:
    """What plain kmock 0.8 does: the product must cope with it (see the report in kubeapi.py)."""
    with KubeAPI.start(strict=False) as kube, kube.api_client() as api_client:
        core = client.CoreV1Api(api_client)
        kube.create("nodes", node("n1"))
        nodes = core.list_node()
        assert nodes.metadata.resource_version == "..."  # a placeholder, never a real version
        assert nodes.items[0].metadata.resource_version is None

        stale = {"metadata": {"resourceVersion": "1"}, "data": {"x": "1"}}
        kube.create("configmaps", {"metadata": {"name": "cm"}}, namespace=NS)
        assert kube.patch("configmaps", "cm", stale, namespace=NS)["data"] == {"x": "1"}  # no 409
        with pytest.raises(ApiException) as err:
            kube.replace("configmaps", "cm", {"metadata": {"name": "cm"}}, namespace=NS)
        assert err.value.status == 404  # PUT is unknown to kmock

        # The watch ignores resourceVersion (replays everything) and selectors.
        stream = watch.Watch().stream(
            core.list_node, resource_version="999", label_selector="x=y", _request_timeout=5
        )
        assert collect(stream, 1) == [("ADDED", "n1")]


def test_lists_come_in_pages_and_the_daemons_read_them_all(
    kube: KubeAPI, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mig_exporter.kube import api as kube_api

    for i in range(7):
        kube.create("nodes", node(f"n{i}"))
    first = core.list_node(limit=3)
    assert len(first.items) == 3 and first.metadata._continue
    monkeypatch.setattr(kube_api, "LIST_PAGE", 3)
    names, version = kube_api.list_all(core.list_node, {}, lambda n: n["metadata"]["name"])
    assert names == [f"n{i}" for i in range(7)]
    assert version == first.metadata.resource_version
    requests = [e for e in kube.journal() if e.path == "/api/v1/nodes"]
    assert [e.params.get("limit") for e in requests[-3:]] == ["3", "3", "3"]
    # A token from before a compaction has expired: the daemons list again on 410.
    kube.create("nodes", node("n7"))
    kube.compact()
    with pytest.raises(ApiException) as e:
        core.list_node(limit=3, _continue=first.metadata._continue)
    assert e.value.status == 410


def test_plain_kmocks_placeholder_is_no_resource_version() -> None:
    """Plain kmock answers every object with resourceVersion "...": sent back as a precondition
    or a watch's starting point it means nothing, so the daemons send none (one place decides)."""
    from mig_exporter.kube.api import usable_version

    assert usable_version("...") is None
    assert usable_version("") is None
    assert usable_version(None) is None
    assert usable_version(42) is None  # not a string: not from an API server
    assert usable_version("1234") == "1234"


def test_dra_resources_are_served_to_the_official_client(
    kube: KubeAPI, api: client.ApiClient
) -> None:
    """resource.k8s.io/v1: the sample's slices, claims and the driver's DeviceClasses, listed and
    watched as the DRA mode will, with field selectors on the slices' node."""
    resource = client.ResourceV1Api(api)
    assert resource.list_resource_slice().items == []  # declared: an empty list, not a 404
    nodes = list(yaml.safe_load_all((SAMPLES / "dra" / "nodes.yaml").read_text()))
    for node in nodes:
        slim = slim_node(node)
        for s in node_slices(slim, build_node(slim), dynamic=True):
            resource.create_resource_slice(s)
    for claim in yaml.safe_load_all((SAMPLES / "dra" / "claims.yaml").read_text()):
        resource.create_namespaced_resource_claim("gpu-test", claim)
    resource.create_device_class(
        {"metadata": {"name": "mig.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression":
         "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]}}
    )  # fmt: skip
    on_h100 = resource.list_resource_slice(field_selector="spec.nodeName=dra-h100").items
    assert {s.spec.node_name for s in on_h100} == {"dra-h100"} and len(on_h100) == 2
    assert on_h100[0].spec.shared_counters[0].name == "gpu-0-counter-set"
    claims = resource.list_namespaced_resource_claim("gpu-test").items
    results = {r.device for c in claims for r in c.status.allocation.devices.results}
    assert "gpu-0-mig-3g40gb-9-4" in results
    assert resource.read_device_class("mig.nvidia.com").metadata.name == "mig.nvidia.com"
    stream = watch.Watch().stream(resource.list_resource_slice, timeout_seconds=1)
    assert len({e["object"].metadata.name for e in stream}) == len(
        resource.list_resource_slice().items
    )
