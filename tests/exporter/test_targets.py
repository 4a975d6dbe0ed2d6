"""`--all-nodes` at cluster size: one page per node (`/metrics/nodes/<node>`), shards that split
the nodes by Prometheus's hashmod, and gzip compressed once per change. (A real Prometheus
scraping them is in tests/live/test_many_targets.py.)"""

from __future__ import annotations

import gc
import gzip
import http.client
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from freezegun import freeze_time
from prometheus_client.parser import text_string_to_metric_families

from exporter import cli, dcgm
from exporter.generations import G483
from exporter.many import NodesExporter
from exporter.shards import Shard, ordinal, shard_of
from exporter.sources import watch_own_statefulset
from mig_exporter.web.server import Gzipped, MetricsServer, Published, Snapshot, accepts_gzip
from status_updater.state import ClusterState
from tests.deploy.test_deploy import bound_rules, render
from tests.deploy.test_helm import layout_objects
from tests.exporter.test_exporter import MIG, whole_gpu
from tests.exporter.test_many import doc
from tests.support.base import SAMPLES, run_cli
from tests.support.kubeapi import KubeAPI, eventually
from tests.support.promtext import parse
from tests.support.rbac import allowed, request_of
from topology.configmap import node_configmap
from topology.model import NodeTopology, Topology, dump_yaml

NAMES = [f"kwok-node-{i}" for i in range(24)]
STS = "nvidia-dcgm-exporter-all-nodes"
OPTIONS = dcgm.Options("ignored", "535.104.05")


def serving(shard: Shard | None = None, names: list[str] = NAMES) -> NodesExporter:
    many = NodesExporter(OPTIONS, Published(), shard=shard)
    for i, name in enumerate(names):
        topology = MIG if i % 2 else whole_gpu(50, 50)
        many.update_source(f"topology-{name}", doc(name, topology), f"ConfigMap {name}")
    return many


def hostnames(body: bytes) -> set[str]:
    return {s.label("Hostname") for s in parse(body.decode())}


@freeze_time("2026-11-22 10:00:00")
def test_each_node_s_page_is_what_its_own_exporter_serves() -> None:
    snap = serving().snapshot()
    assert set(snap.pages) == set(NAMES)
    for i, name in enumerate(NAMES[:4]):
        topology = MIG if i % 2 else whole_gpu(50, 50)
        (node,) = topology.nodes.values()
        own = dcgm.render(node, dcgm.Options(name, "535.104.05"), time.time())
        assert b"".join(snap.pages[name].page()) == own
        assert hostnames(b"".join(snap.pages[name].page())) == {name}


@freeze_time("2026-11-22 10:00:00")
@pytest.mark.parametrize("total", [1, 2, 3, 7])
def test_shards_serve_every_node_exactly_once(total: int) -> None:
    served = [hostnames(serving(Shard(n, total)).snapshot().body) for n in range(total)]
    assert sorted(name for names in served for name in names) == sorted(NAMES)
    for n, names in enumerate(served):
        assert names == {name for name in NAMES if shard_of(name, total) == n}
    if total > 1:
        assert all(served)  # 24 names spread: no shard is empty


@freeze_time("2026-11-22 10:00:00")
def test_a_sharded_replica_says_its_shard_and_the_count() -> None:
    own = serving(Shard(1, 3)).snapshot().own.decode()
    assert "mig_exporter_shard_ordinal 1.0\n" in own and "mig_exporter_total_shards 3.0\n" in own
    assert "mig_exporter_shard_ordinal" not in serving().snapshot().own.decode()


def test_the_shard_is_prometheus_s_hashmod_of_the_name() -> None:
    """Prometheus: md5 of the value, its last 8 bytes big-endian, modulo. Known values, worked out
    by hand from the md5 digests (`printf %s a | md5sum`); tests/live/test_many_targets.py
    checks them against a real Prometheus's relabelling."""
    # md5("a") = 0cc175b9c0f1b6a8 31c399e269772661
    assert shard_of("a", 2**64 - 1) == 0x31C399E269772661 % (2**64 - 1)
    assert shard_of("a", 7) == 0x31C399E269772661 % 7
    assert [ordinal(p) for p in ("x-all-nodes-0", "x-all-nodes-12", "x", "x-", "x-1a")] == [
        0, 12, None, None, None]  # fmt: skip
    with pytest.raises(ValueError, match="shard 3 is not one of 3"):
        Shard(3, 3)


@pytest.mark.parametrize(
    ("header", "takes"),
    [("gzip", True), ("gzip, deflate", True), ("deflate, GZIP;q=0.5", True), ("x-gzip", True),
     ("gzip;q=0", False), ("gzip; q=0.000", False), ("identity", False), (None, False),
     ("gzipped", False), ("gzip;q=nope", False), ("gzip;q=inf", False), ("gzip;q=1e3", False),
     ("gzip;q=2", False), ("gzip;q=1.000", True), ("gzip;q=0.001", True), ("identity,gzip", True)],
)  # fmt: skip
def test_accept_encoding_is_read_as_http_says(header: str | None, takes: bool) -> None:
    assert accepts_gzip(header) is takes


def test_parts_are_compressed_once_and_forgotten_when_gone() -> None:
    snap = serving().snapshot()
    cache = Gzipped()
    first = cache.of(snap.body_parts)
    assert gzip.decompress(b"".join(first)) == snap.body  # the parts joined: one gzip stream
    again = cache.of(snap.body_parts)
    assert all(a is b for a, b in zip(first, again, strict=True))  # not compressed again
    cache.keep(Published().snapshot)  # a snapshot without those parts
    assert all(a is not b for a, b in zip(first, cache.of(snap.body_parts), strict=True))


@contextmanager
def server(many: NodesExporter) -> Iterator[int]:
    published = many.published
    published.publish(many.snapshot())
    metrics = MetricsServer(published, "127.0.0.1", 0)
    metrics.start()
    try:
        yield metrics.port
    finally:
        metrics.stop()


def fetch(port: int, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


@freeze_time("2026-11-22 10:00:00")
def test_a_node_s_page_and_health_over_http_with_and_without_gzip() -> None:
    many = serving(Shard(0, 2))
    mine = next(n for n in NAMES if shard_of(n, 2) == 0)
    other = next(n for n in NAMES if shard_of(n, 2) == 1)
    with server(many) as port:
        status, headers, page = fetch(port, f"/metrics/nodes/{mine}")
        assert status == 200 and hostnames(page) == {mine}
        assert "content-encoding" not in headers and headers["vary"] == "Accept-Encoding"
        status, headers, zipped = fetch(
            port, f"/metrics/nodes/{mine}", **{"Accept-Encoding": "gzip"}
        )
        assert (status, headers["content-encoding"]) == (200, "gzip")
        assert gzip.decompress(zipped) == page and int(headers["content-length"]) == len(zipped)
        status, _, whole = fetch(port, "/metrics", **{"Accept-Encoding": "gzip"})
        assert gzip.decompress(whole) == b"".join((*many.published.snapshot.body_parts,
                                                   many.published.snapshot.own))  # fmt: skip
        assert fetch(port, f"/health/nodes/{mine}")[:3:2] == (200, b"ok\n")
        status, headers, one = fetch(port, f"/metrics/nodes/{mine}", **{"Accept-Encoding": "gzip"})
        assert (
            gzip.decompress(one) == page and len(one) < len(page) / 5
        )  # one stream, compressed once
        for path in (f"/metrics/nodes/{other}", f"/health/nodes/{other}", "/metrics/nodes/x%0A"):
            status, _, body = fetch(port, path)
            assert status == 404 and body.endswith(b"is not served here\n"), (path, body)
            assert b"\n" not in body[:-1]  # a name from the request stays one line


@freeze_time("2026-11-22 10:00:00")
def test_a_replica_s_own_series_alone_for_its_shard_alerts_and_readiness() -> None:
    """`/metrics/self`: what the install's ServiceMonitor scrapes from each replica (the shard
    alerts read it) and its readiness probe asks, without the thousands of nodes' series."""
    many = NodesExporter(OPTIONS, Published(), shard=Shard(1, 2))
    with server(many) as port:
        assert fetch(port, "/metrics/self")[0] == 503  # not ready: as /metrics
        for name in NAMES:
            many.update_source(f"topology-{name}", doc(name, MIG), f"ConfigMap {name}")
        many.published.publish(many.snapshot())
        status, headers, own = fetch(port, "/metrics/self")
        assert status == 200 and "content-encoding" not in headers
        values = {s.name: s.value for f in text_string_to_metric_families(own.decode())
                  for s in f.samples}  # fmt: skip
        assert (values["mig_exporter_shard_ordinal"], values["mig_exporter_total_shards"]) == (1, 2)
        assert not any(name.startswith("DCGM_") for name in values)
        whole = fetch(port, "/metrics")[2]
        assert whole.endswith(own) and len(whole) > 20 * len(own)
        status, headers, zipped = fetch(port, "/metrics/self", **{"Accept-Encoding": "gzip"})
        assert headers["content-encoding"] == "gzip" and gzip.decompress(zipped) == own
        # Two Accept-Encoding lines are one list: the second one's gzip counts.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.putrequest("GET", "/metrics/self", skip_accept_encoding=True)
        conn.putheader("Accept-Encoding", "identity")
        conn.putheader("Accept-Encoding", "gzip")
        conn.endheaders()
        response = conn.getresponse()
        assert response.getheader("Content-Encoding") == "gzip"
        assert gzip.decompress(response.read()) == own
        conn.close()


@freeze_time("2026-11-22 10:00:00")
def test_while_the_first_list_is_read_a_node_not_read_yet_may_still_come() -> None:
    """Its page and health answer 503 with the progress (Prometheus: up 0, as for a node whose
    exporter starts), not 404; once the list is read, a node not in it is not served here."""
    many = NodesExporter(OPTIONS, Published())
    many.reading(2)
    many.update_source("topology-a", doc("a", MIG), "ConfigMap a")
    with server(many) as port:
        assert fetch(port, "/metrics/nodes/a")[0] == 200
        for path in ("/metrics/nodes/b", "/health/nodes/b"):
            status, _, body = fetch(port, path)
            assert (status, body) == (
                503, b"read 1 of 2 topology ConfigMaps; serving the nodes read so far\n")  # fmt: skip
        many.problem(None)
        many.published.publish(many.snapshot())
        assert fetch(port, "/metrics/nodes/b")[0] == 404
        assert fetch(port, "/health/nodes/a")[:3:2] == (200, b"ok\n")


def test_shard_flags_are_checked_and_the_ordinal_read_from_the_pod_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("POD_NAME", "POD_NAMESPACE", "TOTAL_SHARDS", "SHARD"):
        monkeypatch.delenv(name, raising=False)
    base = ["--topology-file", "x.yaml", "--once"]
    for argv, message in (
        (["--all-nodes", "--shard", "1"], "--shard goes with --total-shards"),
        (["--node-name", "n", "--total-shards", "2"], "--total-shards goes with --all-nodes"),
        (["--all-nodes", "--total-shards", "2", "--shard", "2"], "shard 2 is not one of 2"),
        (["--all-nodes", "--total-shards", "-1"], "expected a whole number, got '-1'"),
        (
            ["--all-nodes", "--pod-namespace", "ns"],
            "--pod-namespace goes with --pod (or env POD_NAME)",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            cli.main([*base, *argv])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    given: list[Shard | None] = []
    monkeypatch.setattr(cli, "_once", lambda settings: given.append(settings.shard) or 0)
    monkeypatch.setenv("POD_NAME", "nvidia-dcgm-exporter-all-nodes-3")
    assert cli.main([*base, "--all-nodes", "--total-shards", "4"]) == 0
    monkeypatch.setenv("TOTAL_SHARDS", "5")
    monkeypatch.setenv("SHARD", "2")
    assert cli.main([*base, "--all-nodes"]) == 0
    monkeypatch.setenv("POD_NAME", "no-ordinal")
    monkeypatch.delenv("SHARD")
    with pytest.raises(SystemExit):
        cli.main([*base, "--all-nodes"])
    assert "the pod name 'no-ordinal' ends in no ordinal" in capsys.readouterr().err
    assert given == [Shard(3, 4), Shard(2, 5)]


def test_a_statefulset_pod_serves_its_ordinal_s_shard_of_the_replicas_as_they_scale() -> None:
    """Autosharding, as kube-state-metrics': `--pod`/`--pod-namespace` name a StatefulSet's pod;
    its replicas are the shard count, followed as it is scaled. Nothing is served before they
    are read, nor by a pod whose ordinal is past them (it is going away)."""
    with KubeAPI.start() as kube:
        kube.create("statefulsets", {"metadata": {"name": STS}, "spec": {"replicas": 2}}, "ops")
        owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": STS, "uid": "u",
                 "controller": True}  # fmt: skip
        kube.create("pods", {"metadata": {"name": f"{STS}-1", "ownerReferences": [owner]}}, "ops")
        many = NodesExporter(OPTIONS, Published(), autoshard=f"StatefulSet of pod ops/{STS}-1")
        for name in NAMES:
            many.update_source(f"topology-{name}", doc(name, MIG), f"ConfigMap {name}")
        before = many.snapshot()
        assert not before.ready and before.pages == {}
        stop = threading.Event()
        watch = threading.Thread(target=watch_own_statefulset,
                                 args=(many, stop, kube.api_client(), f"{STS}-1", "ops"))  # fmt: skip
        watch.start()
        try:
            for total in (2, 3):
                if total == 3:
                    kube.patch("statefulsets", STS, {"spec": {"replicas": 3}}, "ops")
                mine = {n for n in NAMES if shard_of(n, total) == 1}
                eventually(lambda m=mine: set(many.snapshot().pages) == m, timeout=10)
                assert f"mig_exporter_total_shards {total}.0\n" in many.snapshot().own.decode()
            kube.patch("statefulsets", STS, {"spec": {"replicas": 1}}, "ops")
            eventually(lambda: not many.snapshot().pages, timeout=10)
            assert many.snapshot().reason == (
                f"StatefulSet ops/{STS} has 1 replicas, this pod is ordinal 1: serving no node"
            )
        finally:
            stop.set()
            kube.cut_watches()
            watch.join(5)
        # Every request it made is one deploy/all-nodes/'s Role and ClusterRole grant it, and
        # the chart's all-nodes install's.
        asked = {r for e in kube.journal() if not e.harness and (r := request_of(e))}
        assert {(r.verb, r.resource) for r in asked} >= {("get", "pods"), ("watch", "statefulsets")}
        for install in (render("all-nodes"), layout_objects("all-nodes")):
            cluster, namespaced = bound_rules(install, STS)
            for r in asked:
                rules = namespaced if r.namespace is not None else cluster
                assert allowed(rules, r.verb, r.resource, r.group, r.name), r


def _docs(*paths: Path) -> list[dict[str, Any]]:
    found = []
    for path in paths:
        for obj in yaml.safe_load_all(path.read_text()):
            found += obj.get("items", [obj]) if obj else []
    return found


def step_cases() -> list[Any]:
    """Every node of the samples (dynamic and static MIG with their pods, whole GPUs, DRA holders
    and a made dynamic instance) under every option that changes the series."""
    static = ClusterState.of(
        _docs(*sorted((SAMPLES / "static" / "nodes").glob("*.yaml"))),
        _docs(SAMPLES / "static" / "pods" / "a100-40gb-static-pods.yaml"),
    )
    dra = ClusterState.of(_docs(SAMPLES / "dra" / "nodes.yaml"), _docs(SAMPLES / "dra" / "pods.yaml"),
                          claims=_docs(SAMPLES / "dra" / "claims.yaml"))  # fmt: skip
    nodes = [*MIG.nodes.values(), *whole_gpu(50, 70).nodes.values()]
    nodes += [r for s in (static, dra) for r in s.results.values() if isinstance(r, NodeTopology)]
    options = [OPTIONS, dcgm.Options("h", "535.104.05", mig_pod_labels=True, virtual_gpus=True),
               dcgm.Options("h", "580.65.06", generation=G483, dra=True)]  # fmt: skip
    return [pytest.param(n, o, id=f"{i}-{j}") for i, n in enumerate(nodes)
            for j, o in enumerate(options)]  # fmt: skip


@pytest.mark.parametrize(("node", "options"), step_cases())
def test_a_step_keeps_the_labels_and_still_families_and_is_a_whole_render(
    node: NodeTopology, options: dcgm.Options
) -> None:
    """A collection step reads the GPUs again and keeps the label text, and gives what
    rendering all of it at that time gives, series for series, also after many steps."""
    start = 1_795_000_000.0
    series = dcgm.NodeSeries(node, options, start)
    for k in range(1, 4):
        now = start + 10 * k
        stepped = series.at(now)
        assert stepped.page() == dcgm.NodeSeries(node, options, now).page()
        assert b"".join(stepped.page()) == dcgm.render(node, options, now)
        assert stepped.texts is series.texts  # kept
        series = stepped


def test_a_page_is_one_member_made_once_and_publishing_never_races_the_scrapes() -> None:
    snap = serving().snapshot()
    cache = Gzipped()
    page = snap.pages[NAMES[0]]
    (member,) = cache.page(page)
    assert gzip.decompress(member) == b"".join(page.page()) and cache.page(page) == (member,)
    assert cache.page(page)[0] is member
    # Scrapes add members while each publish drops the stale ones: neither breaks the other.
    # (A big table, so that dropping takes long enough for a scrape to add meanwhile; parts big
    # enough that compressing lets the other thread run.)
    live = Snapshot(parts=tuple(f"{i}\n".encode() for i in range(100_000)))
    cache.of(live.parts)
    failures: list[BaseException] = []
    done = threading.Event()
    blob = os.urandom(1 << 15)

    def scrape() -> None:
        for i in range(12):
            if done.is_set():
                return
            try:
                cache.of([blob + i.to_bytes(4) + bytes(k) for k in range(4)])
            except BaseException as e:  # what a race would raise in an HTTP thread
                failures.append(e)
                return

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        while scraper.is_alive():
            cache.keep(live)
    except RuntimeError as e:  # the publisher's side of the same race
        failures.append(e)
    finally:
        done.set()
        scraper.join(5)
    assert failures == []


def test_pages_hold_no_text_and_values_are_not_followed_by_the_collector() -> None:
    """5,000 nodes' text is 575 MiB: a page is written when asked and not kept; the body is
    joined when `/metrics` is asked for and then kept for the scrapes of that snapshot. And the
    values of every series, 200,000 tuples a step at that size, are plain tuples the garbage
    collector stops following (a named tuple it follows forever: a second every other step)."""
    snap = serving().snapshot()
    for page in snap.pages.values():
        assert page.page()
        assert isinstance(page, dcgm.NodeSeries) and page._parts is None  # not kept
    assert snap.held() == () and snap.size == len(snap.own)
    whole = snap.body_parts
    assert snap.held() == whole and snap.size == sum(map(len, whole)) + len(snap.own)
    gc.collect()
    series = next(iter(snap.pages.values()))
    assert isinstance(series, dcgm.NodeSeries)
    assert not any(gc.is_tracked(v) for v in series._values)


@freeze_time("2026-11-22 10:00:00")
def test_a_shard_leaves_other_shards_nodes_unread_and_reads_them_when_they_become_its_own() -> None:
    many = NodesExporter(OPTIONS, Published(), shard=Shard(0, 2))
    mine, other = (next(n for n in NAMES if shard_of(n, 2) == k) for k in (0, 1))
    reads: list[int] = []

    def read(event: int) -> None:
        reads.append(event)
        many.update_source(f"topology-{other}", doc(other, MIG), other, event)

    assert many.owns(mine) and not many.owns(other)
    many.update_source(f"topology-{mine}", doc(mine, MIG), mine)
    many.unread(f"topology-{other}", other, read)
    assert set(many.snapshot().pages) == {mine} and reads == []
    many.reshard(Shard(0, 1))  # one shard now: every node is this one's
    assert reads == [1] and set(many.snapshot().pages) == {mine, other}


@freeze_time("2026-11-22 10:00:00")
def test_a_late_read_of_an_unread_source_never_overtakes_a_newer_one() -> None:
    """A new shard count reads what was left unread while the watch goes on: the watch's newer
    version of the same ConfigMap wins, whichever comes first."""
    many = NodesExporter(OPTIONS, Published(), shard=Shard(0, 2))
    other = next(n for n in NAMES if shard_of(n, 2) == 1)
    source = f"topology-{other}"
    many.unread(source, other, lambda event: None)  # event 1
    many.reshard(Shard(0, 1))
    newer = doc(other, whole_gpu(50, 50))
    many.update_source(source, newer, other)  # the watch's, event 2
    many.update_source(source, doc(other, MIG), other, after=1)  # the late read of event 1
    many.source_problem(source, "stale", after=1)
    snap = many.snapshot()
    assert snap.healthy and b"GPU_I_PROFILE" not in b"".join(snap.pages[other].page())
    many.remove_source(source)
    many.update_source(source, newer, other, after=2)  # gone since: not brought back
    assert other not in many.snapshot().pages


def test_a_sharded_exporter_never_reads_other_shards_nodes_from_a_file(tmp_path: Path) -> None:
    """Their ConfigMaps in the file are left unread: broken ones are the other shard's to say."""
    mine, other = (next(n for n in NAMES if shard_of(n, 2) == k) for k in (0, 1))
    (node,) = MIG.nodes.values()
    items = [node_configmap(mine, dump_yaml(Topology("mixed", {mine: node})), "ns", None),
             node_configmap(other, f"mig-strategy: mixed\nnodes:\n  {other}:\n    gpus: [\n",
                            "ns", None)]  # fmt: skip
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    for shard, expected in ((["--shard", "0"], 0), (["--shard", "1"], 2)):
        done = run_cli("exporter", "--all-nodes", "--topology-file", str(path), "--once",
                       "--total-shards", "2", *shard)  # fmt: skip
        assert done.returncode == expected, done.stderr
        if expected == 0:
            assert hostnames(done.stdout.encode()) == {mine}
