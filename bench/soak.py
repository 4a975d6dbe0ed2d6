"""A soak: both daemons as real processes under minutes of cluster churn; memory must not grow.

    .venv/bin/python -m bench.soak [--minutes 10] [--nodes 20] [--gpus 8] [--max-pods 40]
                                   [--rate 5] [--warmup 60]

The API is tests/support/kubeapi.py's strict emulator, in this process. On it run the status updater
(`python -m status_updater run`, per-node layout), one `--all-nodes` exporter and one exporter of
a single node, as tests/live/test_live.py starts them. The cluster: --nodes A100-40GB dynamic-MIG nodes
of --gpus GPUs, as tests/live/test_live_scale.py makes them. Then, for --minutes, at --rate operations a
second, one of:

- a pod created that holds a free MIG instance (run:ai's `runai-mig-device` annotation), while
  fewer than --max-pods pods exist; a pod deleted; a pod's phase set to Succeeded (its instance is
  released); a pod's `run.ai/simulated-fb-used` changed;
- a node relabelled (a label reconcile does not read); a node re-partitioned (its `run.ai/mig.config`
  and `run.ai/mig-mapping` switched between two layouts, its pods deleted first, as a drain would);
- now and then a node deleted (its pods first), and created again 10 s later.

The number of live objects stays bounded (a steady state: at most --max-pods pods, --nodes nodes),
so growth means a leak, not more data; pod names are never reused, so a cache keyed by a pod that
is never pruned would show. Every --scrape-every seconds both exporters' /metrics are fetched and
must answer 200. Every --sample-every seconds VmRSS (/proc/<pid>/status) of each daemon is read.

"start" is the first sample after --warmup seconds of churn (imports, first lists, the first
renders and the allocator's arenas settle in that time); "end" is the sample at the end of the churn.
The verdict compares the median of the last third of the samples after the warm-up with the median
of the first third: a daemon whose RSS grew by more than --max-growth-pct percent and
--max-growth-mib MiB fails the soak. So do a daemon that exits, a failed scrape, a traceback in a
daemon's log, and exporters that do not serve the final cluster within 60 s once the churn stops.
Exit status 1 on FAIL.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.kubeapi import KubeAPI

ROOT = Path(__file__).resolve().parent.parent

NS = "gpu-operator"  # where the updater writes and the exporters read the ConfigMaps
POD_NS = "soak"
MIB = 2**20
# Two partitions of an A100-40GB GPU a node is switched between: position -> (profile, GI id).
LAYOUTS: dict[str, dict[int, tuple[str, int]]] = {
    "four": {0: ("2g.10gb", 5), 4: ("1g.5gb", 7), 5: ("1g.5gb", 8), 6: ("1g.5gb", 9)},
    "two": {0: ("3g.20gb", 2), 4: ("3g.20gb", 1)},
}
OPS = (
    "pods created", "pods deleted", "pods succeeded", "pod usages changed", "nodes relabelled",
    "nodes re-partitioned", "nodes deleted", "nodes re-created",
)  # fmt: skip
NODE_GONE_S = 10.0  # a deleted node comes back after this long
FB_LINE = re.compile(r"^DCGM_FI_DEV_FB_USED\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


# --- the cluster the soak drives ------------------------------------------------------------------


@dataclass
class Pod:
    name: str
    node: str
    gpu: int
    position: int
    fb: int  # MiB, run.ai/simulated-fb-used
    running: bool = True  # False once Succeeded: it no longer holds its instance


@dataclass
class World:
    """What the soak has made of the cluster: the exporters must serve exactly this at the end."""

    gpus: int
    layouts: dict[str, str]  # live node -> name in LAYOUTS
    gone: dict[str, float] = field(default_factory=dict)  # deleted node -> when it comes back
    pods: dict[str, Pod] = field(default_factory=dict)
    created: int = 0  # pods ever created: names are never reused
    generation: int = 0  # the value of the label that relabelling moves

    def held(self) -> set[tuple[str, int, int]]:
        return {(p.node, p.gpu, p.position) for p in self.pods.values() if p.running}


def node_name(n: int) -> str:
    return f"soak-node-{n:02d}"


def node_annotations(layout: str, node: str, gpus: int) -> dict[str, str]:
    positions = LAYOUTS[layout]
    config = {"version": "v1", "mig-configs": {"selected": [{
        "devices": "all", "mig-enabled": True,
        "mig-devices": {p: profile for p, (profile, _gi) in positions.items()}}]}}  # fmt: skip
    mapping = {str(g): [{"position": p, "device_uuid": f"MIG-{node}-{g}-{p}", "gpu_instance_id": gi}
                        for p, (_profile, gi) in positions.items()] for g in range(gpus)}  # fmt: skip
    return {
        "run.ai/mig.config": yaml.safe_dump(config),
        "run.ai/mig-mapping": base64.b64encode(json.dumps(mapping).encode()).decode(),
    }


def node_obj(name: str, layout: str, gpus: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": str(gpus),
              "nvidia.com/mig.strategy": "mixed", "node-role.kubernetes.io/runai-dynamic-mig": "true",
              "node-role.kubernetes.io/runai-mig-enabled": "true"}  # fmt: skip
    meta = {"name": name, "labels": labels, "annotations": node_annotations(layout, name, gpus)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta}


def pod_obj(pod: Pod, profile: str) -> dict[str, Any]:
    device = {"name": f"nvidia.com/mig-{profile}", "position": pod.position, "gpuindex": pod.gpu}
    annotations = {"runai-mig-device": json.dumps(device), "run.ai/simulated-fb-used": str(pod.fb)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": POD_NS, "annotations": annotations},
            "spec": {"nodeName": pod.node, "containers": [{"name": "main", "image": "burn"}]},
            "status": {"phase": "Running"}}  # fmt: skip


# --- churn ---------------------------------------------------------------------------------------


def delete_pods_of(kube: KubeAPI, world: World, node: str, done: Counter[str]) -> None:
    """As a drain or the pod garbage collector would, before a node changes or goes."""
    for pod in [p for p in world.pods.values() if p.node == node]:
        kube.delete("pods", pod.name, POD_NS)
        del world.pods[pod.name]
        done["pods deleted"] += 1


def create_pod(kube: KubeAPI, world: World, rng: random.Random, done: Counter[str]) -> None:
    held = world.held()
    for _ in range(20):  # a few tries at a free instance; the cluster is mostly free
        node = rng.choice(sorted(world.layouts))
        gpu = rng.randrange(world.gpus)
        position = rng.choice(sorted(LAYOUTS[world.layouts[node]]))
        if (node, gpu, position) not in held:
            break
    else:
        return
    world.created += 1
    pod = Pod(f"job-{world.created:06d}", node, gpu, position, rng.randint(100, 4000))
    kube.create("pods", pod_obj(pod, LAYOUTS[world.layouts[node]][position][0]), POD_NS)
    world.pods[pod.name] = pod
    done["pods created"] += 1


def churn(
    kube: KubeAPI, world: World, rng: random.Random, max_pods: int, done: Counter[str]
) -> None:
    """One operation on the cluster (a node's drain adds its pods' deletions)."""
    now = time.monotonic()
    due = [n for n, at in world.gone.items() if at <= now]
    if due:
        node = due[0]
        kube.create("nodes", node_obj(node, world.layouts[node], world.gpus))
        del world.gone[node]
        done["nodes re-created"] += 1
        return
    live = sorted(n for n in world.layouts if n not in world.gone)
    running = sorted(p.name for p in world.pods.values() if p.running)
    finished = sorted(p.name for p in world.pods.values() if not p.running)
    weights = {
        "create": 4.0 if len(world.pods) < max_pods else 0.0,
        "delete": 3.0 if world.pods else 0.0,
        "succeed": 1.0 if running else 0.0,
        "usage": 2.0 if running else 0.0,
        "relabel": 0.4,
        "repartition": 0.4,
        "delete node": 0.1 if not world.gone and len(live) > 1 else 0.0,
    }
    op = rng.choices(list(weights), list(weights.values()))[0]
    if op == "create":
        create_pod(kube, world, rng, done)
    elif op == "delete":  # finished pods first, as a job controller cleans up
        name = rng.choice(finished or running)
        kube.delete("pods", name, POD_NS)
        del world.pods[name]
        done["pods deleted"] += 1
    elif op == "succeed":
        name = rng.choice(running)
        kube.patch("pods", name, {"status": {"phase": "Succeeded"}}, POD_NS)
        world.pods[name].running = False
        done["pods succeeded"] += 1
    elif op == "usage":
        pod = world.pods[rng.choice(running)]
        before = pod.fb
        while pod.fb == before:
            pod.fb = rng.randint(100, 4000)
        annotations = {"run.ai/simulated-fb-used": str(pod.fb)}
        kube.patch("pods", pod.name, {"metadata": {"annotations": annotations}}, POD_NS)
        done["pod usages changed"] += 1
    elif op == "relabel":
        world.generation += 1
        labels = {"soak.example.com/generation": str(world.generation)}
        kube.patch("nodes", rng.choice(live), {"metadata": {"labels": labels}})
        done["nodes relabelled"] += 1
    elif op == "repartition":
        node = rng.choice(live)
        delete_pods_of(kube, world, node, done)
        world.layouts[node] = "two" if world.layouts[node] == "four" else "four"
        annotations = node_annotations(world.layouts[node], node, world.gpus)
        kube.patch("nodes", node, {"metadata": {"annotations": annotations}})
        done["nodes re-partitioned"] += 1
    else:
        node = rng.choice(live)
        delete_pods_of(kube, world, node, done)
        kube.delete("nodes", node)
        world.gone[node] = now + NODE_GONE_S
        done["nodes deleted"] += 1


# --- the daemons ---------------------------------------------------------------------------------


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    url: str = ""  # an exporter's, "" for the updater
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the churn, bytes)
    scrapes: int = 0
    failures: list[str] = field(default_factory=list)
    scraped_bytes: int = 0

    def status(self) -> dict[str, int]:
        """VmRSS, VmHWM, ... in bytes, from /proc/<pid>/status."""
        out = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if value.strip().endswith(" kB"):
                out[key] = int(value.split()[0]) * 1024
        return out

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def daemons(kube: KubeAPI, logs: Path, single_node: str) -> Iterator[list[Daemon]]:
    """The updater, the --all-nodes exporter and one node's exporter, stopped at the end."""
    kubeconfig = kube.write_kubeconfig(logs / "kubeconfig")
    started: list[Daemon] = []

    def start(name: str, *args: str, url: str = "") -> None:
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "TOPOLOGY_CM_NAMESPACE": NS,
               "POD_NAME": name, "PYTHONUNBUFFERED": "1", "TOPOLOGY_LAYOUT": "per-node"}  # fmt: skip
        env.pop("KUBERNETES_SERVICE_HOST", None)
        log = logs / f"{name}.log"
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", *args], cwd=ROOT, env=env, stdout=out,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        started.append(Daemon(name, proc, log, url))

    def exporter(name: str, *args: str) -> None:
        port = free_port()
        where = ("--address", "127.0.0.1", "--port", str(port))
        start(name, "exporter", *args, *where, url=f"http://127.0.0.1:{port}")

    try:
        start("updater", "status_updater", "run")
        exporter("exporter-all", "--all-nodes")
        exporter("exporter-node", "--node-name", single_node, "--hostname", single_node)
        yield started
    finally:
        for d in started:
            d.proc.terminate()
        for d in started:
            try:
                d.proc.wait(10)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()


def fetch(url: str, timeout: float = 10) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(d: Daemon) -> None:
    d.scrapes += 1
    try:
        status, body = fetch(f"{d.url}/metrics")
    except OSError as e:
        d.failures.append(repr(e))
        return
    if status != 200:
        d.failures.append(f"HTTP {status}: {body[:200]}")
    d.scraped_bytes += len(body.encode())


def sample(ds: list[Daemon], t: float) -> None:
    for d in ds:
        if d.proc.poll() is None:
            d.rss.append((t, d.status()["VmRSS"]))


# --- checking what the exporters serve --------------------------------------------------------------

Instance = tuple[str, str, str]  # Hostname, gpu, GPU_I_ID
Wanted = dict[Instance, tuple[str, int | None]]  # -> profile, FB_USED of the pod holding it
Served = dict[Instance, tuple[str, float]]  # -> GPU_I_PROFILE, DCGM_FI_DEV_FB_USED


def expected(world: World, nodes: set[str] | None = None) -> Wanted:
    """Every MIG instance of the live nodes: its profile, and the FB_USED of the pod holding it."""
    held = {(p.node, p.gpu, p.position): p.fb for p in world.pods.values() if p.running}
    out: Wanted = {}
    for node, layout in world.layouts.items():
        if node in world.gone or (nodes is not None and node not in nodes):
            continue
        for g in range(world.gpus):
            for position, (profile, gi) in LAYOUTS[layout].items():
                out[(node, str(g), str(gi))] = (profile, held.get((node, g, position)))
    return out


def served(url: str) -> Served:
    """The MIG instances an exporter serves; none while it does not answer (yet)."""
    try:
        status, body = fetch(f"{url}/metrics")
    except OSError:
        return {}
    if status != 200:
        return {}
    out = {}
    for m in FB_LINE.finditer(body):
        labels = dict(LABEL.findall(m["labels"]))
        key = (labels["Hostname"], labels["gpu"], labels["GPU_I_ID"])
        out[key] = (labels["GPU_I_PROFILE"], float(m["value"]))
    return out


def difference(want: Wanted, got: Served) -> str:
    """The first few differences; empty when the exporter serves what the cluster holds.

    An instance no pod holds reports the exporter's idle usage, whatever it is: only its profile
    is compared."""
    wrong = [f"{k} missing" for k in want.keys() - got.keys()]
    wrong += [f"{k} not in the cluster" for k in got.keys() - want.keys()]
    for k in want.keys() & got.keys():
        (profile, fb), (served_profile, value) = want[k], got[k]
        if profile != served_profile or (fb is not None and value != fb):
            wrong.append(f"{k} wants {profile} {fb}, serves {served_profile} {value:g}")
    return "; ".join(sorted(wrong)[:5]) + (f" (+{len(wrong) - 5})" if len(wrong) > 5 else "")


def converge(ds: dict[str, Daemon], world: World, single: str, timeout: float) -> tuple[float, str]:
    """(seconds until both exporters serve the cluster as it is, "") or (timeout, what differs)."""
    start = time.monotonic()
    while True:
        problem = difference(expected(world), served(ds["exporter-all"].url))
        if not problem:
            problem = difference(expected(world, {single}), served(ds["exporter-node"].url))
        if not problem:
            return time.monotonic() - start, ""
        if time.monotonic() - start > timeout:
            return timeout, problem
        time.sleep(0.2)


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one soak saw."""

    daemons: list[Daemon]
    done: Counter[str] = field(default_factory=Counter)  # operations by kind (OPS)
    errors: list[str] = field(default_factory=list)  # operations the API refused
    churned: float = 0.0  # seconds of churn
    lagged: float = 0.0  # seconds the operations fell behind the rate (the machine was busy)
    cpu: dict[str, float] = field(default_factory=dict)  # daemon -> CPU seconds at the end
    peak: dict[str, int] = field(default_factory=dict)  # daemon -> VmHWM at the end
    dead: list[str] = field(default_factory=list)  # daemons that exited during the churn
    settled_s: float = 0.0  # after the churn, until the exporters served the final cluster
    problem: str = ""  # what they served wrong if they never did
    pods: int = 0  # live at the end
    nodes: int = 0


def churn_for(
    args: argparse.Namespace, kube: KubeAPI, world: World, ds: list[Daemon], run: Run
) -> None:
    """Operations at --rate, scrapes and RSS samples, for --minutes or until a daemon exits."""
    rng = random.Random(args.seed)
    exporters = [d for d in ds if d.url]
    start = time.monotonic()
    end = start + args.minutes * 60
    next_op = next_sample = next_scrape = start
    next_progress = start + 60
    while (now := time.monotonic()) < end:
        if now >= next_sample:
            sample(ds, now - start)
            next_sample += args.sample_every
        if now >= next_scrape:
            for d in exporters:
                scrape(d)
            next_scrape += args.scrape_every
        if now >= next_progress:  # something to watch in a 10-minute run
            rss = ", ".join(f"{d.name} {mib(d.rss[-1][1])}" for d in ds if d.rss)
            print(f"# {now - start:.0f} s: {sum(run.done.values())} operations; RSS {rss}")
            sys.stdout.flush()
            next_progress += 60
        if now >= next_op:
            try:
                churn(kube, world, rng, args.max_pods, run.done)
            except Exception as e:  # the model may be off now: the convergence check will say
                run.errors.append(repr(e))
            next_op += 1 / args.rate
            if now - next_op > 1:  # do not burst to catch up
                run.lagged += now - next_op
                next_op = now
        if any(d.proc.poll() is not None for d in ds):
            break
        time.sleep(max(0.0, min(next_op, next_sample, next_scrape, end) - time.monotonic()))
    run.churned = time.monotonic() - start
    sample(ds, run.churned)  # "end"


def soak(args: argparse.Namespace, logs: Path) -> Run | str:
    """The whole soak; a string says why it could not start."""
    names = [node_name(n) for n in range(args.nodes)]
    world = World(args.gpus, {n: "four" for n in names})
    single = names[0]
    with KubeAPI.start(strict=True) as kube, daemons(kube, logs, single) as ds:
        by_name = {d.name: d for d in ds}
        for n in names:
            kube.create("nodes", node_obj(n, "four", args.gpus))
        ready_s, problem = converge(by_name, world, single, timeout=90)
        if problem:
            return f"the exporters never served the first cluster: {problem}"
        print(f"# both exporters served all {args.nodes} nodes {ready_s:.1f} s after they were created")  # fmt: skip
        sys.stdout.flush()

        run = Run(ds)
        churn_for(args, kube, world, ds, run)
        alive = [d for d in ds if d.proc.poll() is None]
        run.cpu = {d.name: d.cpu_s() for d in alive}
        run.peak = {d.name: d.status()["VmHWM"] for d in alive}
        run.dead = [f"{d.name} exited with {d.proc.returncode}" for d in ds if d not in alive]

        # The churn stops: deleted nodes come back, and the exporters must catch up.
        for node in list(world.gone):
            kube.create("nodes", node_obj(node, world.layouts[node], world.gpus))
            del world.gone[node]
            run.done["nodes re-created"] += 1
        if not run.dead:
            run.settled_s, run.problem = converge(by_name, world, single, timeout=60)
        run.pods, run.nodes = len(world.pods), len(world.layouts)
    return run


# --- the report ------------------------------------------------------------------------------------


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def machine() -> str:
    def first(path: str, key: str) -> str:
        with open(path) as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(key)), "?")

    memory = int(first("/proc/meminfo", "MemTotal").split()[0]) / 2**20
    return (
        f"{first('/proc/cpuinfo', 'model name')}, {os.cpu_count()} cores, {memory:.0f} GiB, "
        f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}"
    )


@dataclass(frozen=True)
class Growth:
    start: int  # bytes: the first sample after the warm-up
    end: int  # the last sample
    max: int  # of the samples after the warm-up
    first: float  # median of the first third of the samples after the warm-up
    last: float  # ... and of the last third

    @property
    def grown(self) -> float:
        return self.last - self.first


def growth(rss: list[tuple[float, int]], warmup: float, end: float) -> Growth:
    after = [(t, v) for t, v in rss if t >= warmup] or rss[-1:]
    third = (end - warmup) / 3
    first = [v for t, v in after if t < warmup + third] or [after[0][1]]
    last = [v for t, v in after if t >= end - third] or [after[-1][1]]
    values = [v for _, v in after]
    return Growth(values[0], values[-1], max(values), statistics.median(first),
                  statistics.median(last))  # fmt: skip


def report(args: argparse.Namespace, run: Run, logs: Path) -> int:
    """Print the figures and the verdict; the exit status."""
    failed = list(run.dead)
    for d in run.daemons:
        if not d.rss:
            continue
        g = growth(d.rss, args.warmup, run.churned)
        pct = 100 * g.grown / g.first
        print(f"rss {d.name}: start {mib(g.start)}, end {mib(g.end)}, max {mib(g.max)}, "
              f"VmHWM {mib(run.peak.get(d.name, 0))}; median of the first third {mib(g.first)}, "
              f"of the last third {mib(g.last)}: {g.grown / MIB:+.1f} MiB ({pct:+.1f} %); "
              f"{len(d.rss)} samples")  # fmt: skip
        if g.grown > args.max_growth_mib * MIB and pct > args.max_growth_pct:
            failed.append(f"{d.name} grew {g.grown / MIB:+.1f} MiB ({pct:+.1f} %)")
    total = sum(run.done.values())
    print(f"ops: {total} in {run.churned:.0f} s ({total / run.churned:.1f}/s, behind the rate by "
          f"{run.lagged:.0f} s in all): " + ", ".join(f"{run.done[k]} {k}" for k in OPS)
          + f"; {len(run.errors)} errors; at the end {run.pods} pods on {run.nodes} nodes")  # fmt: skip
    for e in run.errors[:5]:
        print(f"  operation error: {e}")
    exporters = [d for d in run.daemons if d.url]
    print("scrapes: " + ", ".join(
        f"{d.name} {d.scrapes} ({len(d.failures)} failed, {mib(d.scraped_bytes / max(1, d.scrapes))} each)"
        for d in exporters))  # fmt: skip
    for d in exporters:
        failed += [f"{d.name} /metrics: {f}" for f in d.failures[:3]]
    print("cpu: " + ", ".join(f"{name} {s:.1f} s" for name, s in run.cpu.items())
          + " (each since it started)")  # fmt: skip
    if run.problem:
        failed.append(f"the exporters did not serve the final cluster within 60 s: {run.problem}")
    elif not run.dead:
        print(f"converged: both exporters served the final cluster {run.settled_s:.1f} s after the churn")  # fmt: skip
    for d in run.daemons:
        if count := d.log.read_text().count("Traceback"):
            failed.append(f"{d.name}: {count} tracebacks in {d.log}")
    if failed:
        print("verdict: FAIL: " + "; ".join(failed) + f" (logs in {logs})")
        return 1
    print(f"verdict: PASS: no daemon grew by more than {args.max_growth_pct:g} % and "
          f"{args.max_growth_mib:g} MiB, every scrape answered 200, no daemon exited or logged a "
          f"traceback")  # fmt: skip
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--minutes", type=float, default=10, help="of churn, the warm-up included")
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=8, help="per node")
    ap.add_argument("--max-pods", type=int, default=40, help="live pods at most")
    ap.add_argument("--rate", type=float, default=5, help="operations per second")
    ap.add_argument("--warmup", type=float, default=60, help="seconds of churn before 'start'")
    ap.add_argument("--sample-every", type=float, default=10, help="seconds between RSS samples")
    ap.add_argument("--scrape-every", type=float, default=5, help="seconds between scrapes")
    ap.add_argument("--max-growth-pct", type=float, default=10)
    ap.add_argument("--max-growth-mib", type=float, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--logs", type=Path, help="where the daemons' logs go (default: a temp dir)")
    args = ap.parse_args()
    if args.warmup >= args.minutes * 60:
        ap.error(f"--warmup {args.warmup:g} s leaves nothing of {args.minutes:g} min to measure")
    logs = args.logs or Path(tempfile.mkdtemp(prefix="soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}")
    print(f"# {args.nodes} nodes x {args.gpus} A100-40GB GPUs, at most {args.max_pods} pods, "
          f"{args.rate:g} operations/s for {args.minutes:g} min; RSS every {args.sample_every:g} s, "
          f"'start' after {args.warmup:g} s of churn; logs in {logs}")  # fmt: skip
    sys.stdout.flush()
    run = soak(args, logs)
    if isinstance(run, str):
        print(f"verdict: FAIL: {run} (logs in {logs})")
        return 1
    return report(args, run, logs)


if __name__ == "__main__":
    sys.exit(main())
