"""Model-based: random cluster histories under API faults, against real updater processes.

Each sequence drives one or two updaters (`python -m status_updater run`, per-node layout) on the
strict emulator of tests/support/kubeapi.py. Nodes (whole-GPU Tesla-K80s, static-MIG A100s) are created,
relabelled (re-partitioned: `nvidia.com/mig.config`, or the GPU count), annotated and deleted; pods
asking for GPUs or MIG instances come, go Running, Succeeded or Failed, get usage annotations and
are deleted. In between, the API cuts watches, expires them (410 Gone), forgets its history, fails
lists, watches and writes (500, 409), answers slowly or drops every connection for a while, and the
updater restarts or loses its Lease to a standby. Checked:

- at every checkpoint, once the cluster is quiet, what is written is a fixed point: reading it
  back (`ClusterState.remember`, as a restarted updater does) and reconciling the cluster as it is
  gives exactly what is written. So no allocation is lost (a live pod that fits has its devices),
  none is a phantom (nothing is held for a finished or deleted pod, or on a deleted node), and the
  devices and layouts are the nodes' own. Placement is sticky, so which free device a new pod got
  may depend on what the updater saw on the way: the oracle is not a reconcile from scratch;
- the managed ConfigMaps are exactly those of the GPU nodes;
- all along (the ConfigMaps polled every 0.1 s): a pod never leaves a device that still exists,
  across faults, restarts and leader changes. It may lose one a re-partition removed, or its
  node's (a deleted node's ConfigMap goes; a new Node has a new uid);
- a restart or a takeover with nothing changed rewrites nothing: the ConfigMaps of the nodes
  untouched meanwhile keep their resourceVersion;
- no updater dies, none logs a traceback, each stops with 0 on SIGTERM.

`make test` runs a few short sequences from a fixed, recorded set of seeds (CI_SEEDS), so that CI
never goes red by chance; `make test-slow` explores: many longer sequences from random seeds, with
longer outages and leaders killed outright (the Lease runs out). A failing sequence says its seed
and steps, and how to replay it: `FAULTS_SEED=<seed> pytest tests/live/test_faults.py` runs that one
seed (in each test). A seed exploration found failing joins CI_SEEDS once it is fixed.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import string
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import urllib3

from status_updater.objects import slim_node, slim_pod
from status_updater.reconcile import document
from status_updater.state import ClusterState, Unreadable
from tests.live.test_live import NS, Daemons
from tests.support.kubeapi import KubeAPI, StrictKubernetesEmulator
from topology import configmap as contract
from topology.errors import TopologyError
from topology.model import DeviceStatus, NodeTopology, dump_yaml, load_yaml

Obj = dict[str, Any]
TEAM = "team"
LEASE = "topology-status-updater"
FINISHED = ("Succeeded", "Failed")
MIG_LAYOUT = "nvidia.com/mig.config"
GPU_COUNT = "nvidia.com/gpu.count"
CI_SEQUENCES = 5
# `make test`'s sequences: one for each residue mod CI_SEQUENCES (the faults a sequence is sure to
# get), and every seed that once failed, after its fix: 1041353104 (a new leader wrote a pod cache
# that missed pods created during an outage), 1768839506 (a pod that could not be placed whole
# kept reserving the devices it had kept after a relabel).
CI_SEEDS = (1768839505, 1768839506, 1768839507, 1768839508, 1041353104)
REPLAY = os.environ.get("FAULTS_SEED")
EXPLORE = int(REPLAY or random.SystemRandom().randrange(2**31))  # make test-slow: a random start


def seeds(fixed: Iterable[int]) -> list[int]:
    """`fixed`, or the one seed FAULTS_SEED replays."""
    return [int(REPLAY)] if REPLAY else list(fixed)


@dataclass(frozen=True)
class NodeKind:
    product: str
    count: str  # nvidia.com/gpu.count of a static-MIG node (whole GPUs: the variant is the count)
    variants: tuple[str, ...]  # what a relabel switches between
    static: bool


# Whole GPUs: the updater picks which GPU a pod gets. Static MIG (A100-40GB, mig-parted's
# built-in layouts): which instance. all-balanced keeps the 1g.5gb of GI 13 and 14 of all-1g.5gb.
NODES = {
    "k80-0": NodeKind("Tesla-K80", "", ("4", "3"), static=False),
    "k80-1": NodeKind("Tesla-K80", "", ("6", "4"), static=False),
    "a100-0": NodeKind("NVIDIA-A100-SXM4-40GB", "1", ("all-1g.5gb", "all-balanced"), static=True),
    "a100-1": NodeKind("NVIDIA-A100-SXM4-40GB", "2", ("all-1g.5gb", "all-balanced"), static=True),
}
MIG_ASKS = [("1g.5gb", 1)] * 4 + [("1g.5gb", 2)] * 2 + [("2g.10gb", 1), ("3g.20gb", 1)]


def node_object(name: str, variant: str) -> Obj:
    kind = NODES[name]
    labels = {"nvidia.com/gpu.product": kind.product}
    if kind.static:
        labels |= {GPU_COUNT: kind.count, "nvidia.com/mig.strategy": "mixed", MIG_LAYOUT: variant}
    else:
        labels |= {GPU_COUNT: variant, "nvidia.com/gpu.memory": "11441"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod_object(name: str, node: str, asks: list[tuple[str, str, int]], phase: str) -> Obj:
    """A pod bound to `node` whose containers ask for (container, resource, count)."""
    limits: dict[str, dict[str, str]] = {}
    for container, resource, count in asks:
        limits.setdefault(container, {})[resource] = str(count)
    containers = [
        {"name": c, "image": "cuda", "resources": {"limits": lim}} for c, lim in limits.items()
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TEAM},
        "spec": {"nodeName": node, "containers": containers},
        "status": {"phase": phase},
    }


# --- what the emulator holds --------------------------------------------------------------------


@dataclass(frozen=True)
class Written:
    """One node's entry in its managed ConfigMap."""

    configmap: str
    version: str
    owner: str | None  # uid of the Node in its ownerReferences
    strategy: str
    node: NodeTopology


@dataclass(frozen=True)
class Snapshot:
    """Every object of interest, read at one instant on the emulator's loop (not over HTTP: the
    faults are for the updaters, and a snapshot must not take one of them)."""

    nodes: list[Obj]
    pods: list[Obj]
    configmaps: list[Obj]
    leases: list[Obj]

    @classmethod
    def take(cls, kube: KubeAPI) -> Snapshot:
        def read(emulator: Any) -> dict[str, list[Obj]]:
            found: dict[str, list[Obj]] = {"nodes": [], "pods": [], "configmaps": [], "leases": []}
            for (resource, _namespace, _name), obj in emulator.objects.items():
                if not obj.deleted and resource.plural in found:
                    found[resource.plural].append(copy.deepcopy(obj.raw))
            return found

        return cls(**kube.call(read))

    def written(self) -> tuple[dict[str, Written], list[str]]:
        """Each node's written entry, and what is wrong with the managed ConfigMaps as such."""
        found: dict[str, Written] = {}
        problems: list[str] = []
        for cm in self.configmaps:
            meta = cm["metadata"]
            if not contract.is_managed(meta.get("labels")):
                continue
            owners = [o["uid"] for o in meta.get("ownerReferences") or [] if o["kind"] == "Node"]
            try:
                topology = load_yaml((cm.get("data") or {}).get(contract.DATA_KEY, ""), "cm")
            except TopologyError as e:
                problems.append(f"ConfigMap {meta['name']}: {e}")
                continue
            if len(topology.nodes) != 1:
                problems.append(f"ConfigMap {meta['name']}: nodes {sorted(topology.nodes)}")
            for node, entry in topology.nodes.items():
                if contract.node_configmap_name(node) != meta["name"]:
                    problems.append(f"ConfigMap {meta['name']} holds node {node}")
                owner = owners[0] if owners else None
                found[node] = Written(
                    meta["name"], meta["resourceVersion"], owner, topology.mig_strategy, entry
                )
        return found, problems

    def pod_names(self) -> dict[str, str]:
        return {p["metadata"]["uid"]: p["metadata"]["name"] for p in self.pods}

    def live_pods(self) -> set[str]:
        """uids of the pods that may hold a device."""
        return {p["metadata"]["uid"] for p in self.pods if p["status"]["phase"] not in FINISHED}

    def lease_holder(self) -> str | None:
        for lease in self.leases:
            if lease["metadata"]["name"] == LEASE:
                holder = (lease.get("spec") or {}).get("holderIdentity")
                return str(holder) if holder else None
        return None


def _holder(status: DeviceStatus | None) -> str:
    if status is None:
        return "free"
    by = status.allocated_by
    who = f"{by.pod}/{by.container}" if by else "?"
    return f"{who} {sorted(status.pod_gpu_usage_status.items())}"


def device_lines(node: NodeTopology) -> list[str]:
    lines = []
    for g, gpu in enumerate(node.gpus):
        if gpu.mig_devices is None:
            lines.append(f"GPU {g}: {_holder(gpu.status)}")
        for d in gpu.mig_devices or ():
            lines.append(f"GPU {g} {d.name} GI {d.gpu_instance_id}: {_holder(d.status)}")
    return lines


def fixed_point_problems(snap: Snapshot) -> list[str]:
    """Why what is written is not what an updater reading it back would write for this cluster."""
    written, problems = snap.written()
    state = ClusterState()
    state.remember({name: w.node for name, w in written.items()})
    state.reset_nodes(map(slim_node, snap.nodes))
    state.reset_pods(map(slim_pod, snap.pods))
    state.settle()
    if set(written) != set(state.results):
        problems.append(f"ConfigMaps for {sorted(written)}, GPU nodes {sorted(state.results)}")
    for name in sorted(set(written) & set(state.results)):
        want, have = state.results[name], written[name]
        if isinstance(want, Unreadable):
            problems.append(f"node {name}: unreadable: {want.reason}")
            continue
        if have.owner != state.node_uid(name):
            problems.append(f"node {name}: owner {have.owner}, Node uid {state.node_uid(name)}")
        if have.strategy != (state.node_strategy(name) or "none"):
            problems.append(f"node {name}: mig-strategy {have.strategy}")
        if have.node != want:
            lines, expected = device_lines(have.node), device_lines(want)
            diff = [f"  written:  {x}" for x in lines if x not in expected]
            diff += [f"  expected: {x}" for x in expected if x not in lines]
            problems.append(f"node {name}: written is not the fixed point\n" + "\n".join(diff))
    return problems


# A device a pod holds: (node, its Node's uid, GPU index, GI id or None for the whole GPU, profile)
Device = tuple[str, str | None, int, int | None, str]


def holdings(written: dict[str, Written]) -> dict[str, frozenset[Device]]:
    held: dict[str, set[Device]] = {}
    for name, w in written.items():
        for g, gpu in enumerate(w.node.gpus):
            for uid in gpu.status.pod_gpu_usage_status if gpu.status else ():
                held.setdefault(uid, set()).add((name, w.owner, g, None, ""))
            for d in gpu.mig_devices or ():
                for uid in d.status.pod_gpu_usage_status if d.status else ():
                    held.setdefault(uid, set()).add((name, w.owner, g, d.gpu_instance_id, d.name))
    return {uid: frozenset(devices) for uid, devices in held.items()}


def still_there(device: Device, written: dict[str, Written]) -> bool:
    """Whether the node written now still has this device (the same Node, GPU, GI and profile)."""
    name, owner, g, gi, profile = device
    w = written.get(name)
    if w is None or w.owner != owner or g >= len(w.node.gpus):
        return False
    gpu = w.node.gpus[g]
    if gi is None:
        return gpu.mig_devices is None
    return any(d.gpu_instance_id == gi and d.name == profile for d in gpu.mig_devices or ())


def excused(before: frozenset[Device], now: frozenset[Device], written: dict[str, Written]) -> bool:
    """Whether a live pod's devices may have changed from `before` to `now`: only if one of them
    went (a re-partition, its Node deleted or replaced). It keeps those that remain, with others
    to make up its request, or, if it no longer fits, holds nothing."""
    remain = frozenset(d for d in before if still_there(d, written))
    return remain != before and (not now or remain <= now)


class Observer:
    """Fed what is written, again and again: says when a pod left a device that still exists."""

    def __init__(self) -> None:
        self.held: dict[str, frozenset[Device]] = {}  # pod uid -> what it was last seen holding
        self.violations: list[str] = []
        self._lock = threading.Lock()  # fed by the polling thread and by checkpoints

    def observe(self, snap: Snapshot) -> None:
        written, _ = snap.written()
        now = holdings(written)
        live, names = snap.live_pods(), snap.pod_names()
        with self._lock:
            for uid, held in now.items():
                before = self.held.get(uid)
                if before is not None and before != held and uid in live:
                    self._judge(uid, names.get(uid, uid), before, held, written)
                self.held[uid] = held
            for uid in set(self.held) - set(now):
                if uid in live:  # alive, and holds nothing now: only if its devices went
                    self._judge(uid, names.get(uid, uid), self.held[uid], frozenset(), written)
                del self.held[uid]

    def _judge(self, uid: str, name: str, before: frozenset[Device], now: frozenset[Device],
               written: dict[str, Written]) -> None:  # fmt: skip
        if not excused(before, now, written):
            remain = [d for d in before if still_there(d, written)]
            self.violations.append(
                f"pod {name} ({uid}) moved from {sorted(before, key=str)} to {sorted(now, key=str)}"
                f", though {sorted(remain, key=str)} still exist"
            )

    def note(self, violation: str) -> None:
        with self._lock:
            self.violations.append(violation)

    def take_violations(self) -> list[str]:
        with self._lock:
            found, self.violations = self.violations, []
            return found


# --- a sequence ---------------------------------------------------------------------------------


# Every kind of fault. Each sequence is sure to get every CI_SEQUENCES-th of them (by its seed), so
# that CI_SEQUENCES consecutive seeds cover them all, and a restart or a leader change; and more at
# random, the cheap ones often, those that take seconds (the profile's `rare`) seldom.
FAULTS = ("cut", "expire", "compact", "fail-list", "fail-watch", "conflict", "conflict-create",
          "fail-write", "slow", "unreachable", "restart", "leader-change")  # fmt: skip
CHEAP_FAULTS = FAULTS[:9]


@dataclass(frozen=True)
class Profile:
    steps: int  # cluster events, each maybe followed by a fault and a checkpoint
    fault_rate: float
    checkpoint_rate: float
    rare: tuple[str, ...]
    rare_rate: float  # of the faults, how many are rare
    unreachable_s: tuple[float, float]  # an outage of T s can cost up to 2T s of backoff after it
    slow_delay_s: tuple[float, float]  # over 3 s: the Lease's own read timeout runs out
    kill_leader: float  # chance a leader change is SIGKILL (the Lease runs out: 15 s)
    settle_s: float  # how long a checkpoint waits for the fixed point
    max_live_pods: int = 12


# CI: answers late by less than the 0.5 s a leader gives its Lease release on SIGTERM (or the
# standby waits the Lease out, 15 s).
CI = Profile(steps=20, fault_rate=0.3, checkpoint_rate=0.2, rare=("restart", "leader-change"),
             rare_rate=0.1, unreachable_s=(1.5, 2.5), slow_delay_s=(0.1, 0.4), kill_leader=0.0,
             settle_s=45)  # fmt: skip
SLOW = Profile(steps=30, fault_rate=0.3, checkpoint_rate=0.2, rare=FAULTS[9:], rare_rate=0.25,
               unreachable_s=(2, 14), slow_delay_s=(0.2, 4.0), kill_leader=0.3,
               settle_s=90)  # fmt: skip


class Failed(Exception):
    pass


class Sequence:
    def __init__(self, seed: int, profile: Profile, daemons: Daemons, test: str) -> None:
        self.seed, self.profile, self.test = seed, profile, test
        self.rnd = random.Random(seed)
        self.daemons = daemons
        self.kube = daemons.kube
        self.steps: list[str] = []
        self.nodes: dict[str, str] = {}  # name -> variant, of the nodes that exist
        self.pods: dict[str, tuple[str, str]] = {}  # name -> (node, phase)
        self.updaters: dict[str, subprocess.Popen[str]] = {}
        self.started = 0
        self.reshaped: set[str] = set()  # nodes created, relabelled or deleted since a checkpoint
        self.touched: set[str] = set()  # nodes an event may have changed, during a handover
        self.observer = Observer()
        self.began = time.monotonic()
        self._polling = threading.Event()

    # --- the plan -------------------------------------------------------------------------

    def run(self) -> None:
        required = [f for i, f in enumerate(FAULTS) if i % CI_SEQUENCES == self.seed % CI_SEQUENCES]
        if not {"restart", "leader-change"} & set(required):  # once pods have devices to keep
            required.append(self.rnd.choice(["restart", "leader-change"]))
        later = range(self.profile.steps // 3, self.profile.steps)
        at = dict(zip(self.rnd.sample(later, len(required)), required, strict=True))
        replicas = 2 if "leader-change" in required or self.rnd.random() < 0.3 else 1
        self.start_updaters(*(self.new_name() for _ in range(replicas)))
        poller = threading.Thread(target=self.poll, name="observer", daemon=True)
        self._polling.set()
        poller.start()
        try:
            whole = [n for n in NODES if not NODES[n].static]
            static = [n for n in NODES if NODES[n].static]
            for name in [self.rnd.choice(whole), self.rnd.choice(static)]:
                self.create_node(name)
            for i in range(self.profile.steps):
                self.event()
                if i in at:
                    self.fault(at[i])
                elif self.rnd.random() < self.profile.fault_rate:
                    rare = self.rnd.random() < self.profile.rare_rate
                    self.fault(self.rnd.choice(self.profile.rare if rare else CHEAP_FAULTS))
                if self.rnd.random() < self.profile.checkpoint_rate:
                    self.checkpoint("at random")
            self.checkpoint("the end")
            self.stop_updaters(*self.updaters)
            self.check_logs()
        finally:
            self._polling.clear()
            poller.join(5)

    def poll(self) -> None:
        """What is written, every 0.1 s, to the observer."""
        while self._polling.is_set():
            try:
                self.observer.observe(Snapshot.take(self.kube))
            except Exception as e:
                self.observer.note(f"observing: {type(e).__name__}: {e}")
            time.sleep(0.1)

    def say(self, step: str) -> None:
        self.steps.append(f"{time.monotonic() - self.began:5.1f}s {step}")
        print(f"  {len(self.steps):3} {self.steps[-1]}", flush=True)

    def fail(self, message: str) -> None:
        logs = []
        for path in sorted(self.daemons.logs.glob("updater-*.log")):
            tail = path.read_text().splitlines()[-25:]
            logs.append(f"--- {path.name} (last lines)\n" + "\n".join(tail))
        steps = "\n".join(f"  {i:3} {s}" for i, s in enumerate(self.steps, 1))
        raise Failed(
            f"seed {self.seed}: {message}\n"
            f"replay: FAULTS_SEED={self.seed} .venv/bin/python -m pytest -m '' "
            f"'tests/live/test_faults.py::{self.test}'\nsteps:\n{steps}\n" + "\n".join(logs)
        )

    # --- cluster events ---------------------------------------------------------------------

    def event(self, *, quiet_updater: bool = False) -> None:
        """One random change to the cluster. `quiet_updater`: no updater runs (a checkpoint
        would wait in vain), so a node reshaped since the last checkpoint is left alone."""
        rnd = self.rnd
        live = [p for p, (_, phase) in self.pods.items() if phase not in FINISHED]

        def reshapable(names: Iterable[str]) -> list[str]:
            return [n for n in names if not (quiet_updater and n in self.reshaped)]

        choices: list[tuple[int, Callable[[], None]]] = []
        if absent := reshapable(n for n in NODES if n not in self.nodes):
            choices.append((1, lambda: self.create_node(rnd.choice(absent))))
        if present := reshapable(self.nodes):
            choices += [(1, lambda: self.delete_node(rnd.choice(present))),
                        (2, lambda: self.relabel_node(rnd.choice(present)))]  # fmt: skip
        if self.nodes:
            choices.append((1, lambda: self.annotate_node(rnd.choice(sorted(self.nodes)))))
        if len(live) < self.profile.max_live_pods:
            choices.append((10, self.create_pod))
        if live:
            choices += [(2, lambda: self.advance_pod(rnd.choice(live))),
                        (1, lambda: self.annotate_pod(rnd.choice(live))),
                        (1, lambda: self.delete_pod(rnd.choice(live)))]  # fmt: skip
        on_node = Counter(self.pods[p][0] for p in live)
        if elders := [p for p in live if on_node[self.pods[p][0]] > 1]:
            # The oldest pod of a node with younger ones ends (or goes): they keep their devices.
            choices += [(2, lambda: self.advance_pod(elders[0], end=True)),
                        (1, lambda: self.delete_pod(elders[0]))]  # fmt: skip
        if finished := sorted(set(self.pods) - set(live)):
            choices.append((1, lambda: self.delete_pod(rnd.choice(finished))))
        (chosen,) = rnd.choices([c for _, c in choices], weights=[w for w, _ in choices])
        chosen()

    def reshape(self, node: str) -> None:
        if node in self.reshaped:  # twice between checkpoints could hide a legitimate move
            self.checkpoint(f"before reshaping {node} again")
        self.reshaped.add(node)
        self.touched.add(node)

    def create_node(self, name: str) -> None:
        self.reshape(name)
        variant = self.rnd.choice(NODES[name].variants)
        self.say(f"create node {name} ({variant})")
        self.kube.create("nodes", node_object(name, variant))
        self.nodes[name] = variant

    def delete_node(self, name: str) -> None:
        self.reshape(name)
        self.say(f"delete node {name}")
        self.kube.delete("nodes", name)
        del self.nodes[name]

    def relabel_node(self, name: str) -> None:
        self.reshape(name)
        kind = NODES[name]
        variant = next(v for v in kind.variants if v != self.nodes[name])
        label = MIG_LAYOUT if kind.static else GPU_COUNT
        self.say(f"relabel node {name}: {label}={variant}")
        self.kube.patch("nodes", name, {"metadata": {"labels": {label: variant}}})
        self.nodes[name] = variant

    def annotate_node(self, name: str) -> None:
        """Something reconcile does not read: nothing is written."""
        value = str(self.rnd.randrange(1000))
        self.say(f"annotate node {name}: example.com/note={value}, label example.com/rack={value}")
        meta = {"annotations": {"example.com/note": value}, "labels": {"example.com/rack": value}}
        self.kube.patch("nodes", name, {"metadata": meta})

    def create_pod(self) -> None:
        rnd = self.rnd
        # Names sort as the pods were created, so that "older" is the same for the updater (the
        # emulator's timestamps have whole seconds, then names decide) and for the generator.
        name = f"p{len(self.steps):03}-" + "".join(rnd.choices(string.ascii_lowercase, k=3))
        node = rnd.choice([*self.nodes] * 4 + [*NODES])  # mostly on a node that exists
        if NODES[node].static:
            profile, count = rnd.choice(MIG_ASKS)
            asks = [("main", f"nvidia.com/mig-{profile}", count)]
            if rnd.random() < 0.2:
                asks.append(("side", "nvidia.com/mig-1g.5gb", 1))
        else:
            asks = [("main", "nvidia.com/gpu", rnd.choice([1, 1, 1, 1, 2]))]
        phase = rnd.choice(["Pending", "Running", "Running"])
        shown = ", ".join(f"{c}: {n} {r}" for c, r, n in asks)
        self.say(f"create pod {name} on {node} ({shown}), {phase}")
        self.kube.create("pods", pod_object(name, node, asks, phase), namespace=TEAM)
        self.pods[name] = (node, phase)
        self.touched.add(node)

    def advance_pod(self, name: str, *, end: bool = False) -> None:
        node, phase = self.pods[name]
        if phase == "Pending" and not end:
            phase = self.rnd.choice(["Running", "Running", "Failed"])
        else:
            phase = self.rnd.choice(FINISHED)
        self.say(f"pod {name}: {phase}")
        self.kube.patch("pods", name, {"status": {"phase": phase}}, namespace=TEAM)
        self.pods[name] = (node, phase)
        self.touched.add(node)

    def annotate_pod(self, name: str) -> None:
        """Its usage changes (what is written), its devices do not."""
        value = f"{self.rnd.randint(1, 100)}%"
        self.say(f"annotate pod {name}: run.ai/simulated-fb-used={value}")
        body = {"metadata": {"annotations": {"run.ai/simulated-fb-used": value}}}
        self.kube.patch("pods", name, body, namespace=TEAM)
        self.touched.add(self.pods[name][0])

    def delete_pod(self, name: str) -> None:
        self.say(f"delete pod {name}")
        self.kube.delete("pods", name, namespace=TEAM)
        self.touched.add(self.pods.pop(name)[0])

    # --- faults ---------------------------------------------------------------------------

    def fault(self, kind: str) -> None:
        kube, rnd = self.kube, self.rnd
        n = rnd.randint(1, 3)
        if kind == "cut":
            abort = rnd.random() < 0.5
            self.say(f"fault: cut every watch{' (connection dropped)' if abort else ''}")
            kube.cut_watches(abort=abort)
        elif kind == "expire":
            self.say(f"fault: the next {n} watches get 410 Gone; cut every watch")
            kube.expire_watches(n)
            kube.cut_watches()
        elif kind == "compact":
            self.say("fault: history compacted (watches resume into 410 Gone); cut every watch")
            kube.compact()
            kube.cut_watches(abort=rnd.random() < 0.5)
        elif kind == "fail-list":
            plural = rnd.choice([None, "nodes", "pods", "configmaps"])
            self.say(f"fault: the next {n} lists of {plural or 'anything'} fail with 500; "
                     "every watch expires (410) and is cut")  # fmt: skip
            kube.fail_next(n, status=500, action="list", plural=plural)
            kube.expire_watches(4)
            kube.cut_watches()
        elif kind == "fail-watch":
            self.say(f"fault: the next {n} watches fail with 500; cut every watch")
            kube.fail_next(n, status=500, action="watch")
            kube.cut_watches(abort=rnd.random() < 0.5)
        elif kind == "conflict":
            count = rnd.randint(1, 6)  # over 5: the writer gives up, backs off and comes back
            self.say(f"fault: the next {count} ConfigMap patches get 409")
            kube.fail_next(count, status=409, method="PATCH", plural="configmaps")
            if rnd.random() < 0.5:
                self.say("fault: the next ConfigMap read fails with 500")
                kube.fail_next(1, status=500, action="fetch", plural="configmaps")
        elif kind == "conflict-create":
            self.say(f"fault: the next {n} ConfigMap creates get 409 (AlreadyExists)")
            kube.fail_next(n, status=409, action="create", plural="configmaps")
        elif kind == "fail-write":
            method = rnd.choice(["PATCH", "POST", "DELETE"])
            self.say(f"fault: the next {n} ConfigMap {method}s fail with 500")
            kube.fail_next(n, status=500, method=method, plural="configmaps")
        elif kind == "slow":
            seconds = round(rnd.uniform(1.5, 4), 1)
            delay = round(rnd.uniform(*self.profile.slow_delay_s), 1)
            self.say(f"fault: for {seconds} s every answer is {delay} s late")
            kube.slow(seconds, delay)
        elif kind == "unreachable":
            seconds = round(rnd.uniform(*self.profile.unreachable_s), 1)
            self.say(f"fault: the API unreachable for {seconds} s (every connection dropped)")
            kube.unreachable(seconds)
            for _ in range(rnd.randint(0, 2)):
                self.event()
        elif kind == "restart":
            self.restart()
        elif kind == "leader-change":
            self.leader_change()
        else:
            raise AssertionError(kind)

    # --- updaters ---------------------------------------------------------------------------

    def new_name(self) -> str:
        self.started += 1
        return f"updater-{self.started}"

    def start_updaters(self, *names: str) -> None:
        for name in names:
            log = self.daemons.logs / f"{name}.log"
            if log.exists():  # a restart: keep the log of the run before
                log.rename(log.with_suffix(f".{time.monotonic_ns()}.log"))
            self.updaters[name] = self.daemons.updater(name, "--resync", "1")
        # Up (their SIGTERM handler set) before anything can stop them.
        deadline = time.monotonic() + 30
        while not all("running as" in self.daemons.log(name) for name in names):
            self.check_alive()
            if time.monotonic() > deadline:
                self.fail(f"{', '.join(names)} not all started in 30 s")
            time.sleep(0.05)

    def stop_updaters(self, *names: str, sig: signal.Signals = signal.SIGTERM) -> None:
        procs = {name: self.updaters.pop(name) for name in names}
        for proc in procs.values():
            proc.send_signal(sig)
        for name, proc in procs.items():
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.fail(f"{name} still running 10 s after {sig.name}")
            if sig == signal.SIGTERM and code != 0:
                self.fail(f"{name} exited {code} on SIGTERM")

    def check_alive(self) -> None:
        for name, proc in self.updaters.items():
            if proc.poll() is not None:
                self.fail(f"{name} exited {proc.returncode}")

    def check_logs(self) -> None:
        for path in sorted(self.daemons.logs.glob("updater-*.log")):
            if "Traceback" in path.read_text():
                self.fail(f"a traceback in {path.name}")

    def versions(self) -> dict[str, str]:
        """node -> resourceVersion of its ConfigMap."""
        written, _ = Snapshot.take(self.kube).written()
        return {name: w.version for name, w in written.items()}

    def led_by_one_of(self, names: set[str], since: float) -> str:
        """Wait for one of these updaters to hold the Lease; its name."""
        deadline = time.monotonic() + self.profile.settle_s
        while time.monotonic() < deadline:
            self.check_alive()
            holder = Snapshot.take(self.kube).lease_holder()
            if holder in names and "acquired leadership" in self.daemons.log(holder):
                return holder
            time.sleep(0.1)
        self.fail(f"none of {sorted(names)} took the Lease in {time.monotonic() - since:.0f} s")
        raise AssertionError  # not reached

    def handover(self, what: str, stop: Callable[[], None], start: Callable[[], set[str]]) -> None:
        """Quiet cluster, then `stop` and `start` updaters (maybe with events in between):
        whoever leads then rewrites no ConfigMap of a node nothing happened to."""
        self.checkpoint(f"before {what}")
        before = self.versions()
        self.touched = set()
        stop()
        for _ in range(self.rnd.choice([0, 0, 1, 2])):
            self.event(quiet_updater=True)
        since = time.monotonic()
        candidates = start()
        leader = self.led_by_one_of(candidates, since)
        time.sleep(1.0)  # its first sync, right after it read them back, compares them all
        self.checkpoint(f"after {what}")
        after = self.versions()
        rewritten = sorted(
            n for n, v in before.items() if n not in self.touched and after.get(n) != v
        )
        if rewritten:
            self.fail(f"after {what}, {leader} rewrote the ConfigMaps of unchanged {rewritten}")

    def restart(self) -> None:
        names = sorted(self.updaters)
        self.say(f"restart {', '.join(names)} (SIGTERM, then started again)")

        def stop() -> None:
            self.stop_updaters(*names)

        def start() -> set[str]:
            self.start_updaters(*names)
            return set(names)

        self.handover("the restart", stop, start)

    def leader_change(self) -> None:
        if len(self.updaters) < 2:
            standby = self.new_name()
            self.say(f"start standby {standby}")
            self.start_updaters(standby)
            time.sleep(1.0)  # it lists the cluster and waits on the Lease
        kill = self.rnd.random() < self.profile.kill_leader
        sig = signal.SIGKILL if kill else signal.SIGTERM

        def stop() -> None:
            leader = self.led_by_one_of(set(self.updaters), time.monotonic())
            self.say(f"leader change: the leader, {leader}, gets {sig.name}; a standby takes over")
            self.stop_updaters(leader, sig=sig)

        def start() -> set[str]:
            return set(self.updaters)

        self.handover("the leader change", stop, start)
        replacement = self.new_name()
        self.say(f"start standby {replacement}")
        self.start_updaters(replacement)

    # --- checks ---------------------------------------------------------------------------

    def checkpoint(self, why: str) -> None:
        """Wait for what is written to be the fixed point of the cluster as it is now."""
        started = time.monotonic()
        problems: list[str] = []
        while True:
            self.check_alive()
            snap = Snapshot.take(self.kube)
            problems = fixed_point_problems(snap)
            if not problems:
                break
            if time.monotonic() - started > self.profile.settle_s:
                self.fail(f"checkpoint ({why}): no fixed point within {self.profile.settle_s} s:\n"
                          + "\n".join(problems))  # fmt: skip
            time.sleep(0.05)
        self.observer.observe(snap)
        if violations := self.observer.take_violations():
            self.fail("\n".join(violations))
        self.say(f"checkpoint ({why}): quiet after {time.monotonic() - started:.1f} s")
        self.reshaped = set()


def run_sequence(seed: int, profile: Profile, tmp_path: Path, test: str) -> None:
    print(f"seed {seed}")
    with KubeAPI.start(strict=True) as kube:
        assert isinstance(kube.emulator, StrictKubernetesEmulator)
        daemons = Daemons(kube, tmp_path, "per-node")
        try:
            Sequence(seed, profile, daemons, test).run()
        except Failed as e:
            pytest.fail(str(e), pytrace=False)
        finally:
            daemons.stop()


def test_the_fixed_seeds_cover_every_fault() -> None:
    assert {seed % CI_SEQUENCES for seed in CI_SEEDS} == set(range(CI_SEQUENCES))


@pytest.mark.parametrize("seed", seeds(CI_SEEDS))
def test_topology_stays_true_under_api_faults(seed: int, tmp_path: Path) -> None:
    run_sequence(seed, CI, tmp_path, "test_topology_stays_true_under_api_faults")


@pytest.mark.slow
@pytest.mark.parametrize("seed", seeds(EXPLORE + i for i in range(50)))
def test_topology_stays_true_under_long_api_faults(seed: int, tmp_path: Path) -> None:
    run_sequence(seed, SLOW, tmp_path, "test_topology_stays_true_under_long_api_faults")


def written_snapshot(node: Obj, pods: list[Obj], entry: NodeTopology) -> Snapshot:
    """The cluster with this entry written for its one node, as the updater writes it."""
    name = node["metadata"]["name"]
    text = dump_yaml(document(name, entry, None))
    cm = contract.node_configmap(name, text, NS, node["metadata"]["uid"])
    cm["metadata"]["resourceVersion"] = "1"
    return Snapshot([node], pods, [cm], [])


def test_the_checks_see_a_phantom_a_lost_allocation_and_a_move() -> None:
    """The oracle itself, without processes: a fixed point passes; an allocation left to an
    ended pod, a live pod left without its device, or a pod moved off a device that still
    exists do not."""
    node = node_object("k80-0", "4")
    node["metadata"] |= {"uid": "node-uid", "creationTimestamp": "2026-01-01T00:00:00Z"}
    pods = []
    for i, name in enumerate(["old", "young"]):
        pod = pod_object(name, "k80-0", [("main", "nvidia.com/gpu", 1)], "Running")
        pod["metadata"] |= {"uid": f"uid-{name}", "creationTimestamp": f"2026-01-01T00:0{i}:00Z"}
        pods.append(pod)
    state = ClusterState.of([node], pods)
    both = state.results["k80-0"]
    state.reset_pods(map(slim_pod, pods[1:]))  # "old" ends: "young" keeps GPU 1, GPU 0 is free
    state.settle()
    kept = state.results["k80-0"]
    moved = ClusterState.of([node], pods[1:]).results["k80-0"]  # from scratch: GPU 0
    assert isinstance(both, NodeTopology) and isinstance(kept, NodeTopology)
    assert isinstance(moved, NodeTopology)
    assert device_lines(kept)[0] == "GPU 0: free"
    assert device_lines(kept)[1].startswith("GPU 1: young/main [('uid-young', PodUsage(")

    assert fixed_point_problems(written_snapshot(node, pods, both)) == []
    assert fixed_point_problems(written_snapshot(node, pods[1:], kept)) == []
    (phantom,) = fixed_point_problems(written_snapshot(node, pods[1:], both))
    assert "written:  GPU 0: old/main" in phantom
    empty = ClusterState.of([node], []).results["k80-0"]
    assert isinstance(empty, NodeTopology)
    (lost,) = fixed_point_problems(written_snapshot(node, pods[1:], empty))
    assert "expected: GPU 0: young/main" in lost

    observer = Observer()
    observer.observe(written_snapshot(node, pods[1:], kept))
    observer.observe(written_snapshot(node, pods[1:], moved))
    (violation,) = observer.take_violations()
    assert violation.startswith("pod young (uid-young) moved from [('k80-0', 'node-uid', 1,")
    # Its GPU gone (the node relabelled to one GPU), a pod may get another one.
    one_gpu = node_object("k80-0", "1")
    one_gpu["metadata"] |= {"uid": "node-uid", "creationTimestamp": "2026-01-01T00:00:00Z"}
    fewer = ClusterState.of([one_gpu], pods[1:]).results["k80-0"]
    assert isinstance(fewer, NodeTopology)
    observer = Observer()
    observer.observe(written_snapshot(node, pods[1:], kept))
    observer.observe(written_snapshot(one_gpu, pods[1:], fewer))
    assert observer.take_violations() == []
    assert observer.held == {"uid-young": {("k80-0", "node-uid", 0, None, "")}}


def test_a_pod_whose_device_went_may_change_the_rest_only_as_sticky_placement_does() -> None:
    node = node_object("k80-1", "4")  # shrunk from 6: GPUs 4 and 5 went
    node["metadata"] |= {"uid": "node-uid", "creationTimestamp": "2026-01-01T00:00:00Z"}
    entry = ClusterState.of([node], []).results["k80-1"]
    assert isinstance(entry, NodeTopology)
    written = written_snapshot(node, [], entry).written()[0]

    def gpus(*indices: int, owner: str = "node-uid") -> frozenset[Device]:
        return frozenset(("k80-1", owner, g, None, "") for g in indices)

    assert excused(gpus(3, 4), gpus(), written)  # no longer fits
    assert excused(gpus(3, 4), gpus(3, 0), written)  # keeps GPU 3, one more for the one gone
    assert not excused(gpus(3, 4), gpus(0, 1), written)  # GPU 3 is still there
    assert not excused(gpus(1), gpus(0), written)  # nothing went: no move
    assert not excused(gpus(1), gpus(), written)  # nor a loss
    assert excused(gpus(1, owner="old-uid"), gpus(0), written)  # a new Node of that name


def test_an_unreachable_or_slow_api_spares_the_harness() -> None:
    """The two faults tests/support/kubeapi.py adds for this file: the daemons' requests (the official
    client) are dropped or answered late; the test's own go through at once."""
    with KubeAPI.start(strict=True) as kube:
        config = kubernetes.client.Configuration(host=kube.url)
        config.retries = 0  # as the daemons' client (mig_exporter.kube.api.api_client)
        core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
        kube.unreachable(1.0)
        with pytest.raises(urllib3.exceptions.MaxRetryError) as dropped:
            core.list_node(_request_timeout=(2, 2))
        assert isinstance(dropped.value.reason, urllib3.exceptions.ProtocolError)  # reset
        kube.create("nodes", node_object("k80-0", "4"))
        time.sleep(1.0)
        assert len(core.list_node().items) == 1
        kube.slow(1.0, 0.5)
        started = time.monotonic()
        kube.list_objects("nodes")
        assert time.monotonic() - started < 0.4
        core.list_node()
        assert time.monotonic() - started >= 0.5
        assert [e.fault for e in kube.journal()].count(0) == 1
