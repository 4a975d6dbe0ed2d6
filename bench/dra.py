"""The updater publishing DRA ResourceSlices for a cluster of H100 nodes, against an API that
takes every write at once (bench/fakeapi.py), so that what is measured is the updater's own cost.

    .venv/bin/python -m bench.dra [--nodes 5000] [--gpus 8] [--runs 3] [--claims 20]
                                  [--baseline REF | --no-baseline] [--baseline-nodes 300]
                                  [--render-nodes 1000] [--consumable-shares MODE]
                                  [-- extra updater flags, e.g. --kube-api-qps 100000]

The cluster: --nodes KWOK-like Nodes labelled `type=kwok`, each with --gpus H100-80GB GPUs as GPU
Feature Discovery labels them, MIG on (`all-enabled`, mixed strategy). With `--dra-dynamic-mig`
every GPU offers every profile at every placement: the updater publishes one counter-set slice
and one slice per GPU on each node (counted from `status_updater render` of one node, not
assumed, with the bytes of its slices as JSON). `--consumable-shares MODE` runs ours (`run` and
`render`) with `--dra-consumable-shares MODE`, the driver's ConsumableShares. Each run starts a
fresh fake API holding the Nodes and prints, per figure, the median of --runs:

a) publish: `status_updater run` started; wall seconds from its exec until every slice is in the
   API, and at that moment its CPU seconds (user + system) and VmRSS / VmHWM;
b) restart: the updater stopped (SIGTERM) and started again on what it published. The writes it
   makes to ResourceSlices and ConfigMaps until it is quiet again, and the seconds from its exec
   until it serves events: one ResourceClaim allocated on a node's device, created just after
   the exec, seen in that node's topology ConfigMap;
c) claim latency (last run): --claims Pods and allocated ResourceClaims created one at a time on
   the settled updater; each timed from the claim's write to the write of its node's ConfigMap
   that names it (both times taken by the fake API). p50, p99, max;
d) render: `status_updater render --resource-slices --dra-dynamic-mig` of --render-nodes nodes to
   a file, YAML and (where the tree's render offers `-o json`) JSON: wall seconds and the child's
   peak RSS.

Then (a) and (d) for --baseline (the updater before this work, from `git archive`), (a) at
--baseline-nodes, without the extra flags (it has none of them), unless --no-baseline; a phase
that runs out of its time limit prints "did not finish" instead of its figure.

Benchmarks are not timed tests: tests/live/test_bench_dra.py runs a tiny size and checks only
that every figure is printed. The targets printed beside the figures are the issue's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.many import baseline_tree, free_port
from bench.scale import load, machine, pct

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "0b45923"  # the updater as it landed, before publishing at cluster size was worked on
NAMESPACE = "gpu-operator"  # TOPOLOGY_CM_NAMESPACE: the ConfigMaps and the Lease
CLAIMS_NAMESPACE = "bench"
SELECTOR = "type=kwok"
CLK = os.sysconf("SC_CLK_TCK")
# The targets, printed beside the figures (not checked: a benchmark is no test).
TARGET_RSS_MIB = 1024
TARGET_CPU_S = 120
TARGET_RESTART_S = 60
TARGET_CLAIM_S = 1.0
TARGET_RENDER_S = 60
TARGET_RENDER_MIB = 1536
# Quiet: the updater spends under this share of a core over QUIET_S, and nothing is written.
QUIET_SHARE, QUIET_S = 0.05, 2.0
POLL_S = 0.1
Obj = dict[str, Any]


class DidNotFinish(Exception):
    """A phase ran out of its time limit: its figure is printed as such, the rest go on."""


# --- the cluster -----------------------------------------------------------------------------


def node_obj(n: int, gpus: int) -> Obj:
    """A KWOK node with the labels GPU Feature Discovery gives an H100 node with MIG enabled."""
    name = f"kwok-gpu-{n:05d}"
    labels = {
        "type": "kwok", "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.config": "all-enabled", "nvidia.com/mig.strategy": "mixed",
    }  # fmt: skip
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}}  # fmt: skip


def nodes_file(path: Path, nodes: int, gpus: int) -> list[str]:
    items = [node_obj(n, gpus) for n in range(nodes)]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return [str(i["metadata"]["name"]) for i in items]


@dataclass(frozen=True)
class Layout:
    """What one node publishes, from `render` of one node: its slice count, per GPU a MIG device
    a claim may be given, and its slices' bytes as compact JSON (as the updater sends them)."""

    slices: int
    devices: list[str]
    bytes: int = 0


def one_node_layout(gpus: int, work: Path, flags: Sequence[str] = ()) -> Layout:
    path = work / "one-node.json"
    nodes_file(path, 1, gpus)
    out = subprocess.run(
        [sys.executable, "-m", "status_updater", "render", "--resource-slices",
         "--dra-dynamic-mig", "--dra-node-selector", SELECTOR, "--nodes", str(path), *flags],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    import yaml  # only here: the rest reads JSON

    slices = yaml.safe_load(out)["items"]
    size = sum(len(json.dumps(s, separators=(",", ":"))) for s in slices)
    devices = []
    for g in range(gpus):
        names = [d["name"] for s in slices for d in s["spec"].get("devices", [])
                 if d["name"].startswith(f"gpu-{g}-")]  # fmt: skip
        mig = [n for n in names if "-mig-" in n]
        devices.append((mig or names)[0])
    return Layout(len(slices), devices, size)


# --- the fake API ----------------------------------------------------------------------------


class FakeApi:
    """bench/fakeapi.py in its own process, holding the Nodes from the start."""

    def __init__(self, work: Path, nodes: Path, delay_ms: float) -> None:
        self.log = work / "fakeapi.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.fakeapi", "--port", "0", "--load", str(nodes),
             "--delay-ms", str(delay_ms)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.log.open("wb"),
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 300)
        line = self.proc.stdout.readline() if ready else b""
        if not line.strip().isdigit():
            self.proc.kill()
            raise SystemExit(f"the fake API did not start: see {self.log}\n{tail(self.log)}")
        self.url = f"http://127.0.0.1:{int(line)}"
        self.kubeconfig = work / "kubeconfig"
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": self.url}}],
            "users": [{"name": "bench", "user": {}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
        }))  # fmt: skip

    def call(self, method: str, path: str, body: Obj | None = None,
             timeout: float = 60) -> tuple[Obj, float | None]:  # fmt: skip
        """The answer's JSON, and the fake API's clock at the write (X-Bench-At)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                at = r.headers.get("X-Bench-At")
                return json.loads(r.read()), float(at) if at else None
        except urllib.error.HTTPError as e:
            raise SystemExit(f"fake API: {method} {path}: {e.code} {e.read()[:300]!r}") from None

    def stats(self) -> Obj:
        return self.call("GET", "/_bench/stats")[0]

    def count(self, resource: str) -> int:
        return int(self.stats()["objects"].get(resource, 0))

    def wait_for(self, resource: str, namespace: str, name: str, text: str,
                 timeout: float) -> float:  # fmt: skip
        """The fake API's clock at the write that made the object hold `text`."""
        query = urllib.parse.urlencode({"resource": resource, "namespace": namespace,
                                        "name": name, "contains": text, "timeout": timeout})  # fmt: skip
        try:
            return float(self.call("GET", f"/_bench/wait?{query}", timeout=timeout + 30)[0]["at"])
        except SystemExit:
            raise DidNotFinish(f"{name} did not show {text} in {timeout:g} s") from None

    def stop(self) -> None:
        stop(self.proc)


def writes_to(stats: Obj, resource: str) -> int:
    return sum(n for key, n in stats["writes"].items() if key.split()[1] == resource)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# --- the updater -------------------------------------------------------------------------------


class Updater:
    """`status_updater run` from `tree`, timed from its exec."""

    def __init__(self, tree: Path, api: FakeApi, log: Path, extra: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree), "TOPOLOGY_CM_NAMESPACE": NAMESPACE,
               "KUBECONFIG": str(api.kubeconfig)}  # fmt: skip
        env.pop("KUBERNETES_SERVICE_HOST", None)
        self.log = log
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "status_updater", "run", "--kubeconfig", str(api.kubeconfig),
             "--dra-node-selector", SELECTOR, "--dra-dynamic-mig",
             "--metrics-address", "127.0.0.1", "--metrics-port", str(free_port()),
             "--lease-name", "bench", "--resync", "3600", *extra],
            cwd=tree, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise SystemExit(f"the updater exited {self.proc.returncode}:\n{tail(self.log)}")

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def memory(self) -> tuple[float, float]:
        """VmRSS and VmHWM (its peak so far), MiB."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            found = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)
                     if k in ("VmRSS", "VmHWM")}  # fmt: skip
        return found["VmRSS"] / 1024, found["VmHWM"] / 1024

    def stop(self) -> None:
        stop(self.proc)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds so far, every thread's."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, and SIGKILL if it has not exited within 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def until(ok: Callable[[], bool], timeout: float, what: str, updater: Updater | None) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if updater is not None:
            updater.alive()
        if time.monotonic() > deadline:
            raise DidNotFinish(f"{what}: not within {timeout:g} s")
        time.sleep(POLL_S)


def quiet(updater: Updater, api: FakeApi, timeout: float) -> None:
    """Wait until the updater has been idle for QUIET_S: it has done with what it was given."""
    deadline = time.monotonic() + timeout
    samples: list[tuple[float, float, int]] = []
    while True:
        updater.alive()
        now = time.monotonic()
        # Lease renewals (every 2 s) are no work of its own: not counted.
        writes = sum(n for key, n in api.stats()["writes"].items() if not key.endswith(" leases"))
        samples.append((now, updater.cpu(), writes))
        old = [s for s in samples if now - s[0] >= QUIET_S]
        if old:
            t0, cpu0, writes0 = old[-1]
            if (samples[-1][1] - cpu0) / (now - t0) < QUIET_SHARE and writes == writes0:
                return
        if now > deadline:
            raise DidNotFinish(f"the updater was not quiet within {timeout:g} s")
        time.sleep(0.5)


@contextmanager
def running(tree: Path, api: FakeApi, log: Path, extra: list[str]) -> Iterator[Updater]:
    updater = Updater(tree, api, log, extra)
    try:
        yield updater
    finally:
        updater.stop()


# --- pods and claims ---------------------------------------------------------------------------


def claim_on(api: FakeApi, name: str, node: str, device: str) -> float:
    """A Running pod on `node` and its ResourceClaim, allocated `device` of the node's pool and
    reserved for the pod, as the scheduler leaves them; the fake API's clock at the claim's
    write."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": CLAIMS_NAMESPACE},
        "spec": {"nodeName": node,
                 "containers": [{"name": "main", "image": "ubuntu:24.04",
                                 "resources": {"claims": [{"name": "gpu"}]}}],
                 "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    made, _ = api.call("POST", f"/api/v1/namespaces/{CLAIMS_NAMESPACE}/pods", pod)
    result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": device}
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": CLAIMS_NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu",
                                           "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
        "status": {
            "allocation": {"devices": {"results": [result]}, "nodeSelector": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": made["metadata"]["uid"]}],
        },
    }  # fmt: skip
    _, at = api.call("POST", f"/apis/resource.k8s.io/v1/namespaces/{CLAIMS_NAMESPACE}/resourceclaims",
                     claim)  # fmt: skip
    assert at is not None
    return at


class Claims:
    """Claims on distinct devices: node after node, then the next GPU of each."""

    def __init__(self, names: list[str], layout: Layout) -> None:
        self.names, self.layout, self.made = names, layout, 0

    def next(self, api: FakeApi) -> tuple[str, str, float]:
        """(claim name, node, the fake API's clock at the claim's write)."""
        k = self.made
        self.made += 1
        node = self.names[k % len(self.names)]
        device = self.layout.devices[(k // len(self.names)) % len(self.layout.devices)]
        # Fixed width: no claim's name is the start of another's (the ConfigMap is searched).
        name = f"bench-claim-{k:06d}"
        return name, node, claim_on(api, name, node, device)


def served(api: FakeApi, name: str, node: str, timeout: float) -> float:
    """The fake API's clock at the write of `node`'s topology ConfigMap naming claim `name`."""
    return api.wait_for("configmaps", NAMESPACE, f"topology-{node}", name, timeout)


# --- one tree's runs ---------------------------------------------------------------------------


@dataclass
class Figures:
    values: dict[str, list[float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # figure -> why it has no value

    def put(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)

    def med(self, key: str) -> float:
        return statistics.median(self.values[key])

    def runs(self, key: str, fmt: str) -> str:
        return ", ".join(format(v, fmt) for v in self.values[key])


def one_run(tree: Path, nodes: Path, names: list[str], layout: Layout, args: argparse.Namespace,
            extra: list[str], figures: Figures, work: Path, full: bool) -> None:  # fmt: skip
    """One fresh API: publish, and for `full` (ours) the restart and, on the last run, claims."""
    expected = layout.slices * len(names)
    api = FakeApi(work, nodes, args.api_delay_ms)
    log = work / "updater.log"
    api_cpu = cpu_seconds(api.proc.pid)  # loading the Nodes: not the updater's doing
    try:
        with running(tree, api, log, extra) as updater:
            try:
                until(lambda: api.count("resourceslices") >= expected, args.timeout,
                      "every ResourceSlice published", updater)  # fmt: skip
            except DidNotFinish as e:
                figures.failed["publish"] = (f"did not finish in {args.timeout:g} s "
                                             f"({api.count('resourceslices')} of {expected} "
                                             f"slices; {e})")  # fmt: skip
                return
            figures.put("publish", time.monotonic() - updater.started)
            figures.put("cpu", updater.cpu())
            figures.put("api cpu", cpu_seconds(api.proc.pid) - api_cpu)
            rss, hwm = updater.memory()
            figures.put("rss", rss)
            figures.put("hwm", hwm)
            if not full:
                return
            quiet(updater, api, args.timeout)
            figures.put("settled cpu", updater.cpu())
            figures.put("settled hwm", updater.memory()[1])
        claims = Claims(names, layout)
        before = api.stats()
        with running(tree, api, log, extra) as updater:
            name, node, _ = claims.next(api)  # just after the exec: it is listed or watched
            try:
                at = served(api, name, node, args.timeout)
                figures.put("restart served", at - updater.started)
                quiet(updater, api, args.timeout)
            except DidNotFinish as e:
                figures.failed["restart"] = str(e)
                return
            after = api.stats()
            figures.put("restart slices", writes_to(after, "resourceslices")
                        - writes_to(before, "resourceslices"))  # fmt: skip
            figures.put("restart configmaps", writes_to(after, "configmaps")
                        - writes_to(before, "configmaps"))  # fmt: skip
            if len(figures.values["publish"]) < args.runs:
                return
            for _ in range(args.claims):
                name, node, written = claims.next(api)
                try:
                    figures.put("claim", served(api, name, node, args.claim_timeout) - written)
                except DidNotFinish as e:
                    figures.failed["claim"] = str(e)
                    return
    except SystemExit as e:
        print(f"{e}\nupdater log: {tail(log)}", file=sys.stderr)
        raise
    finally:
        api.stop()


def publish_lines(who: str, nodes: int, layout: Layout, figures: Figures) -> None:
    if "publish" in figures.failed:
        reason = figures.failed["publish"]
        for what in ("", " CPU", " memory"):
            print(f"{who} publish{what} {nodes} nodes: {reason}")
        return
    settled = ""
    if "settled cpu" in figures.values:
        settled = (f"; {figures.med('settled cpu'):.1f} s, VmHWM {figures.med('settled hwm'):.0f} "
                   "MiB once quiet (not a figure)")  # fmt: skip
    print(f"{who} publish {nodes} nodes: {figures.med('publish'):.1f} s from exec to all "
          f"{nodes * layout.slices} ResourceSlices in the API "
          f"(runs: {figures.runs('publish', '.1f')}; the fake API's CPU meanwhile "
          f"{figures.med('api cpu'):.1f} s, not a figure)")  # fmt: skip
    print(f"{who} publish CPU {nodes} nodes: {figures.med('cpu'):.1f} s user+system when every "
          f"slice is in (runs: {figures.runs('cpu', '.1f')}; target <= {TARGET_CPU_S} s)"
          f"{settled}")  # fmt: skip
    print(
        f"{who} publish memory {nodes} nodes: VmRSS {figures.med('rss'):.0f} MiB, VmHWM "
        f"{figures.med('hwm'):.0f} MiB when every slice is in (target <= {TARGET_RSS_MIB} MiB)"
    )


def restart_lines(who: str, figures: Figures) -> None:
    if "publish" in figures.failed:
        print(f"{who} restart writes: skipped, the publish did not finish")
        print(f"{who} restart to serving events: skipped, the publish did not finish")
    elif "restart" in figures.failed:
        print(f"{who} restart writes: {figures.failed['restart']}")
        print(f"{who} restart to serving events: {figures.failed['restart']}")
    else:
        print(f"{who} restart writes: {figures.med('restart slices'):.0f} to ResourceSlices, "
              f"{figures.med('restart configmaps'):.0f} to ConfigMaps (1 expected: the claim's "
              f"node) until quiet (runs: {figures.runs('restart slices', '.0f')} slice writes; "
              "target 0 slice writes)")  # fmt: skip
        print(
            f"{who} restart to serving events: {figures.med('restart served'):.1f} s from exec "
            "to a claim created then in its node's ConfigMap "
            f"(runs: {figures.runs('restart served', '.1f')}; target <= {TARGET_RESTART_S} s)"
        )
    if "claim" in figures.values and "claim" not in figures.failed:
        times = figures.values["claim"]
        print(f"{who} claim to ConfigMap, {len(times)} claims one at a time: p50 "
              f"{pct(times, 50):.3f} s, p99 {pct(times, 99):.3f} s, max {max(times):.3f} s "
              f"(target <= {TARGET_CLAIM_S:g} s)")  # fmt: skip
    else:
        why = figures.failed.get("claim", "skipped: the restart did not finish")
        print(f"{who} claim to ConfigMap: {why}")


def publish(who: str, tree: Path, count: int, layout: Layout, args: argparse.Namespace,
            extra: list[str], work: Path, full: bool) -> None:  # fmt: skip
    run_dir = work / f"runs-{who.replace(' ', '-')}"
    run_dir.mkdir()
    nodes = run_dir / "nodes.json"
    names = nodes_file(nodes, count, args.gpus)
    figures = Figures()
    for _ in range(args.runs):
        one_run(tree, nodes, names, layout, args, extra, figures, run_dir, full)
        if figures.failed:
            break  # a run that did not finish would not the next time either
    publish_lines(who, count, layout, figures)
    if full:
        restart_lines(who, figures)


# --- render ------------------------------------------------------------------------------------


def render(who: str, tree: Path, count: int, args: argparse.Namespace, work: Path,
           extra: Sequence[str] = ()) -> None:  # fmt: skip
    """`render --resource-slices` of `count` nodes to a file, YAML and JSON where offered;
    `extra`, render's flags beside those."""
    nodes = work / f"render-{count}.json"
    nodes_file(nodes, count, args.gpus)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "status_updater", "render"]
    helptext = subprocess.run([*command, "--help"], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=60).stdout  # fmt: skip
    offers_json = "--output" in helptext or "-o " in helptext
    for form in ("YAML", "JSON"):
        what = f"{who} render {count} nodes {form}"
        if form == "JSON" and not offers_json:
            print(f"{what}: not offered (this tree's render has no -o flag)")
            continue
        flags = ["-o", "json"] if form == "JSON" else []
        out = work / f"render-{who.replace(' ', '-')}.{form.lower()}"
        argv = [*command, "--resource-slices", "--dra-dynamic-mig", "--nodes", str(nodes), *flags,
                *extra]  # fmt: skip
        took = child_rusage(argv, tree, env, out, args.render_timeout, args.render_limit_mib)
        if took is None:
            print(f"{what}: did not finish in {args.render_timeout:g} s")
            continue
        wall, peak_mib, code, error = took
        if code != 0:
            print(f"{what}: exited {code} after {wall:.1f} s, peak RSS {peak_mib:.0f} MiB "
                  f"(address space limited to {args.render_limit_mib} MiB): {error}")  # fmt: skip
            continue
        print(f"{what}: {wall:.1f} s, peak RSS {peak_mib:.0f} MiB, "
              f"{out.stat().st_size / 2**20:.1f} MiB written (target <= {TARGET_RENDER_S} s, "
              f"<= {TARGET_RENDER_MIB} MiB)")  # fmt: skip
        out.unlink()


def child_rusage(argv: list[str], cwd: Path, env: dict[str, str], out: Path, timeout: float,
                 limit_mib: int) -> tuple[float, float, int, str] | None:  # fmt: skip
    """(wall seconds, peak RSS MiB, exit code, last line of stderr) of one child; None if it ran
    out of `timeout`. Its address space is limited to `limit_mib`: a render that would take more
    than the machine has fails with a MemoryError instead of bringing the OOM killer.

    Its own rusage (wait4): RUSAGE_CHILDREN would be the largest of every child so far, the
    updaters included."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_mib * 2**20, limit_mib * 2**20))

    started = time.monotonic()
    errors = out.with_suffix(".stderr")
    with out.open("wb") as f, errors.open("wb") as e:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=f, stderr=e, preexec_fn=limit)
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if proc.returncode == -signal.SIGKILL and wall >= timeout:
        return None
    return wall, usage.ru_maxrss / 1024, proc.returncode, tail(errors, 1)


def memory_limit_mib() -> int:
    """Most of what the machine has free: what a render may take before it is stopped."""
    with open("/proc/meminfo") as f:
        free = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable"))
    return int(free / 1024 * 0.8)


# --- main --------------------------------------------------------------------------------------


def commit() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True).stdout

    dirty = (
        " with uncommitted changes"
        if git("status", "--porcelain", "--untracked-files=no").strip()
        else ""
    )
    return f"{git('rev-parse', '--short', 'HEAD').strip()}{dirty}"


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.dra", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--claims", type=int, default=20, help="claims timed one at a time")
    p.add_argument("--baseline", default=BASELINE, help="git ref of the updater to compare")
    p.add_argument("--no-baseline", action="store_true", help="measure ours only")
    p.add_argument("--consumable-shares", metavar="MODE",
                   help="ours with --dra-consumable-shares MODE (publish and render)")  # fmt: skip
    p.add_argument("--baseline-nodes", type=int, default=300)
    p.add_argument("--render-nodes", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds a publish, a restart or a settling may take")  # fmt: skip
    p.add_argument("--claim-timeout", type=float, default=60, help="seconds one claim may take")
    p.add_argument("--render-timeout", type=float, default=600)
    p.add_argument("--render-limit-mib", type=int, default=memory_limit_mib(),
                   help="address space a render may take (default: 80%% of what is free)")  # fmt: skip
    p.add_argument("--api-delay-ms", type=float, default=0.0,
                   help="the fake API answers every request this late (a slow API)")  # fmt: skip
    args = p.parse_args(argv)
    shares = ["--dra-consumable-shares", args.consumable_shares] if args.consumable_shares else []
    extra = [*extra, *shares]
    print(f"machine: {machine()}, load {load()}")
    print(f"commit: {commit()}; updater flags added: {' '.join(extra) or 'none'}")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # one socket per watch and request
    with tempfile.TemporaryDirectory(prefix="bench-dra-") as tmp:
        work = Path(tmp)
        layout = one_node_layout(args.gpus, work, shares)
        print(f"cluster: {args.nodes} nodes x {args.gpus} H100-80GB, MIG dynamic: "
              f"{layout.slices} ResourceSlices a node (not a figure)")  # fmt: skip
        print(f"slice bytes: {layout.bytes / 1024:.1f} KiB of JSON a node, "
              f"{layout.bytes * args.nodes / 2**20:.1f} MiB for {args.nodes} nodes")  # fmt: skip
        publish("ours", ROOT, args.nodes, layout, args, extra, work, full=True)
        render("ours", ROOT, args.render_nodes, args, work, shares)
        if args.no_baseline:
            return
        baseline = baseline_tree(args.baseline, work)
        who = f"baseline {args.baseline}"
        publish(who, baseline, args.baseline_nodes, layout, args, [], work, full=False)
        render(who, baseline, args.render_nodes, args, work)


if __name__ == "__main__":
    main()
