"""Many-nodes mode at cluster size: one `exporter --all-nodes` for every KWOK node, beside the one
before per-node targets, shards and gzip (issue 24), then four shards, then a real Prometheus.

    python -m bench.many [--nodes 5000] [--gpus 8] [--runs 3] [--shards 4] [--pages 1000]
                         [--baseline REF] [--prometheus-targets 2000] [--prometheus-seconds 300]

The cluster is bench/scale.py's: A100-40GB dynamic-MIG nodes of --gpus GPUs, 4 instances each,
every instance held by a Running pod. It is rendered as a user would, `status_updater render`
to one file (a List of per-node ConfigMaps), and every exporter is a process reading it
(`--topology-file`), as `make run-sample` runs one. Each figure is the median of --runs runs:

1. start-up: seconds from exec to `/health` answering 200 with every node served (`ready`);
2. memory: VmRSS when ready and the most over --hold seconds after (sampled every second);
3. CPU per 10-s step: the process's CPU time over the hold, per 10 s, while nobody scrapes;
4. pages: --pages node pages fetched one after another on loopback (p50, p99); the baseline has
   none, so its line is the whole `/metrics` fetched once;
5. gzip: the same pages once each with and without `Accept-Encoding: gzip` (each the first
   scrape of its page since it changed, as every 15-s scrape across a 10-s step is): bytes on
   the wire and the exporter's CPU per scrape, over what its steps took meanwhile.

Then --shards processes of ours (`--total-shards M --shard N`) side by side: each one's start-up,
RSS, CPU per step, and whether their `/health/nodes/<node>` say every node is served by exactly
one. Then a real Prometheus (the tests' Debian package) runs deploy/prometheus/kwok-nodes.yml as
shipped for the first --prometheus-targets nodes (discovery swapped for their static list, as the
promtool test does) against one process of ours, for --prometheus-seconds: every target `up`, the
p99 of `scrape_duration_seconds` over every scrape, missed scrapes, and Prometheus's RSS.

Benchmarks are not timed tests: tests/live/test_bench.py runs this at a tiny size and checks only
that every figure is printed (and that the shards serve every node once, which is no timing).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from bench.scale import cluster, load, machine, pct
from tests.support.scrape import shipped_config

ROOT = Path(__file__).resolve().parent.parent
# The exporter before issue 24 (per-node targets, shards, gzip, cheaper steps): what "today's
# --all-nodes" measured in the issue.
BASELINE = "aa071b8"
CLK = os.sysconf("SC_CLK_TCK")


# --- processes -----------------------------------------------------------------------------------


class Exporter:
    """One exporter process, timed from its exec."""

    def __init__(self, tree: Path, topology: Path, port: int, log: Path, *flags: str) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--all-nodes", "--topology-file", str(topology),
             "--address", "127.0.0.1", "--port", str(port), *flags],
            cwd=tree, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.log = log

    def cpu(self) -> float:
        """User and system CPU seconds so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def ready(self) -> bool:
        """Whether `/health` says 200: every node read and served."""
        if self.proc.poll() is not None:
            raise SystemExit(f"exporter exited {self.proc.returncode}: see {self.log}")
        return fetch(f"{self.url}/health")[0] == 200

    def wait_ready(self, timeout: float) -> float:
        """Seconds from exec until `/health` says 200."""
        return wait_all([self], timeout)[0]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def wait_all(procs: list[Exporter], timeout: float) -> list[float]:
    """Seconds from each one's exec until its `/health` says 200, all looked at in turn."""
    took: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(took) < len(procs):
        for i, p in enumerate(procs):
            if i not in took and p.ready():
                took[i] = time.monotonic() - p.started
        if time.monotonic() > deadline:
            raise SystemExit(f"exporters not ready after {timeout:g} s: see {procs[0].log}")
        time.sleep(0.05)
    return [took[i] for i in range(len(procs))]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))
    return kib / 1024


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=120) as r:  # fmt: skip
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except OSError:
        return 0, b""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def exporters(
    tree: Path, topology: Path, work: Path, name: str, flag_sets: list[list[str]]
) -> Iterator[list[Exporter]]:
    running = [Exporter(tree, topology, free_port(), work / f"{name}-{i}.log", *flags)
               for i, flags in enumerate(flag_sets)]  # fmt: skip
    try:
        yield running
    finally:
        for e in running:
            e.stop()


def hold(procs: list[Exporter], seconds: float) -> tuple[list[float], list[float]]:
    """Each process's CPU per 10 s and most RSS over `seconds` of nobody scraping."""
    cpu0, t0 = [p.cpu() for p in procs], time.monotonic()
    most = [p.rss() for p in procs]
    while time.monotonic() - t0 < seconds:
        time.sleep(1)
        most = [max(m, p.rss()) for m, p in zip(most, procs, strict=True)]
    elapsed = time.monotonic() - t0
    per_step = [(p.cpu() - c) / elapsed * 10 for p, c in zip(procs, cpu0, strict=True)]
    return per_step, most


# --- the cluster ---------------------------------------------------------------------------------


def render_cluster(nodes: int, gpus: int, work: Path) -> tuple[Path, list[str]]:
    """The cluster's Nodes and Pods in files, and `status_updater render` of them to one file."""
    node_objs, pods = cluster(nodes, gpus)
    for kind, items in (("nodes", node_objs), ("pods", pods)):
        (work / f"{kind}.json").write_text(json.dumps({"kind": "List", "items": items}))
    out = work / "topology.yaml"
    started = time.monotonic()
    with out.open("w") as f:
        subprocess.run([sys.executable, "-m", "status_updater", "render", "--nodes",
                        str(work / "nodes.json"), "--pods", str(work / "pods.json")],
                       cwd=ROOT, stdout=f, check=True)  # fmt: skip
    size = out.stat().st_size / 2**20
    print(f"cluster: {nodes} nodes x {gpus} GPUs x 4 instances, {len(pods)} pods, rendered "
          f"by status_updater render in {time.monotonic() - started:.1f} s to {size:.1f} MiB "
          "(not a figure)")  # fmt: skip
    return out, [str(n["metadata"]["name"]) for n in node_objs]


def baseline_tree(ref: str, work: Path) -> Path:
    """The exporter's code at `ref`, as `git archive` gives it (no worktree is touched)."""
    tree = work / f"baseline-{ref}"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=ROOT,
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


# --- one process ---------------------------------------------------------------------------------


def med(values: list[float]) -> float:
    return statistics.median(values)


def page_times(url: str, names: list[str], count: int) -> list[float]:
    times = []
    for name in random.Random(7).choices(names, k=count):
        t = time.perf_counter()
        status, _ = fetch(f"{url}/metrics/nodes/{urllib.parse.quote(name)}")
        times.append(time.perf_counter() - t)
        if status != 200:
            raise SystemExit(f"{url}: node {name}'s page answered {status}")
    return times


def scrape_cost(
    proc: Exporter, names: list[str], idle_per_s: float, gz: bool
) -> tuple[float, float]:
    """(bytes on the wire, exporter CPU ms) per scrape of each page once, less what its steps
    took meanwhile (`idle_per_s`, CPU seconds a second while nobody scrapes)."""
    headers = {"Accept-Encoding": "gzip"} if gz else {}
    cpu0, t0, sent = proc.cpu(), time.monotonic(), 0
    for name in names:
        status, body = fetch(f"{proc.url}/metrics/nodes/{urllib.parse.quote(name)}", headers)
        if status != 200 or (gz and gzip.decompress(body)[:6] != b"# HELP"):
            raise SystemExit(f"{proc.url}: node {name}'s page answered {status}")
        sent += len(body)
    spent = proc.cpu() - cpu0 - idle_per_s * (time.monotonic() - t0)
    return sent / len(names), max(spent, 0.0) / len(names) * 1e3


def one_process(name: str, tree: Path, topology: Path, names: list[str], args: argparse.Namespace,
                work: Path) -> None:  # fmt: skip
    figures: dict[str, list[float]] = {}

    def put(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    ours = (
        ["--dcgm-exporter-version", args.generation] if args.generation and name == "ours" else []
    )
    for _ in range(args.runs):
        with exporters(tree, topology, work, name, [ours]) as (proc,):
            put("start", proc.wait_ready(args.timeout))
            put("rss ready", proc.rss())
            (step,), (most,) = hold([proc], args.hold)
            put("step", step)
            put("rss most", most)
            if name == "ours":
                times = page_times(proc.url, names, args.pages)
                put("page p50", pct(times, 50) * 1e3)
                put("page p99", pct(times, 99) * 1e3)
                sample = random.Random(9).sample(names, min(args.pages, len(names)))
                for gz in (True, False):
                    size, cpu = scrape_cost(proc, sample, step / 10, gz)
                    put(f"{'gzip' if gz else 'identity'} bytes", size)
                    put(f"{'gzip' if gz else 'identity'} cpu", cpu)
            t = time.perf_counter()
            status, body = fetch(f"{proc.url}/metrics")
            put("whole", time.perf_counter() - t)
            put("whole MiB", len(body) / 2**20)
            if status != 200:
                raise SystemExit(f"{name}: /metrics answered {status}")
    m = {k: med(v) for k, v in figures.items()}
    print(f"{name} start-up, exec to serving every node: {m['start']:.1f} s "
          f"(runs: {', '.join(f'{v:.1f}' for v in figures['start'])})")  # fmt: skip
    print(f"{name} RSS: {m['rss ready']:.0f} MiB when ready, {m['rss most']:.0f} MiB at most "
          f"over {args.hold:g} s")  # fmt: skip
    print(f"{name} CPU per 10-s step, nobody scraping: {m['step']:.2f} s "
          f"(runs: {', '.join(f'{v:.2f}' for v in figures['step'])})")  # fmt: skip
    print(f"{name} whole /metrics, one scrape: {m['whole']:.2f} s, {m['whole MiB']:.1f} MiB")
    if name == "ours":
        print(f"{name} node page, {args.pages} fetched in turn: p50 {m['page p50']:.2f} ms, "
              f"p99 {m['page p99']:.2f} ms")  # fmt: skip
        for enc in ("gzip", "identity"):
            print(f"{name} node page {enc}, first scrape since its change: "
                  f"{m[f'{enc} bytes'] / 1024:.1f} KiB on the wire, "
                  f"{m[f'{enc} cpu']:.2f} ms exporter CPU per scrape")  # fmt: skip


# --- shards --------------------------------------------------------------------------------------


def shards(topology: Path, names: list[str], args: argparse.Namespace, work: Path) -> None:
    total = args.shards
    flag_sets = [["--total-shards", str(total), "--shard", str(n)] for n in range(total)]
    with exporters(ROOT, topology, work, "shard", flag_sets) as procs:
        starts = wait_all(procs, args.timeout)
        rss = [p.rss() for p in procs]
        steps, most = hold(procs, args.hold)
        served = {name: 0 for name in names}
        for p in procs:
            for name in names:
                status, _ = fetch(f"{p.url}/health/nodes/{urllib.parse.quote(name)}")
                if status == 200:
                    served[name] += 1
                elif status != 404:
                    raise SystemExit(f"shard {p.url}: node {name}'s health answered {status}")
    counts = sorted({n for n in served.values()})
    print(f"{total} shards start-up, all at once: "
          f"{', '.join(f'{s:.1f}' for s in starts)} s")  # fmt: skip
    print(f"{total} shards RSS: {', '.join(f'{r:.0f}' for r in rss)} MiB when ready, "
          f"{', '.join(f'{r:.0f}' for r in most)} MiB at most")  # fmt: skip
    print(f"{total} shards CPU per 10-s step: {', '.join(f'{s:.2f}' for s in steps)} s")
    print(f"{total} shards serve every node exactly once: "
          f"{'yes' if counts == [1] else f'no, counts {counts}'}")  # fmt: skip


# --- a real Prometheus ---------------------------------------------------------------------------


def query(url: str, promql: str) -> list[dict[str, Any]]:
    status, body = fetch(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    if status != 200:
        raise SystemExit(f"Prometheus answered {status} to {promql}")
    return list(json.loads(body)["data"]["result"])


def prometheus(topology: Path, names: list[str], args: argparse.Namespace, work: Path) -> None:
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("prometheus is required: run ./scripts/install-test-tools")
    targets = names[: args.prometheus_targets]
    config = shipped_config("kwok-nodes.yml", tuple(targets))
    (job,) = config["scrape_configs"]
    job["scrape_interval"] = args.scrape_interval
    with exporters(ROOT, topology, work, "scraped", [[]]) as (proc,):
        proc.wait_ready(args.timeout)
        job["relabel_configs"][-1]["replacement"] = f"127.0.0.1:{proc.port}"
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = free_port()
        log = (work / "prometheus.log").open("wb")
        prom = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{web}"],
                                stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        url = f"http://127.0.0.1:{web}"
        try:
            until(lambda: fetch(f"{url}/-/ready")[0] == 200, 60, "Prometheus ready")
            # Counted from when every target has been scraped once: discovery takes a moment.
            until(lambda: len(query(url, "up")) == len(targets), 120, "every target scraped")
            cpu0, t0, most = proc.cpu(), time.monotonic(), 0.0
            while (elapsed := time.monotonic() - t0) < args.prometheus_seconds:
                time.sleep(1)
                most = max(most, rss_mib(prom.pid))
            exporter_cpu = (proc.cpu() - cpu0) / elapsed * 10
            window = f"{int(elapsed)}s"
            up = query(url, "up")
            ups = sum(1 for r in up if r["value"][1] == "1")
            durations = [float(v) for r in query(url, f"scrape_duration_seconds[{window}]")
                         for _, v in r["values"]]  # fmt: skip
            downs = query(url, f"sum(count_over_time((up == 0)[{window}:]))")
            counts = [float(r["value"][1]) for r in query(url, f"count_over_time(up[{window}])")]
        finally:
            prom.terminate()
            prom.wait(30)
    interval = parse_seconds(args.scrape_interval)
    expected = int(elapsed // interval) - 1  # the first may come up to one interval late
    missed = sum(max(expected - c, 0) for c in counts) + sum(
        float(r["value"][1]) for r in downs
    )  # fmt: skip
    print(f"prometheus {len(targets)} node targets every {args.scrape_interval} for "
          f"{elapsed:.0f} s: {ups} of {len(targets)} up, {len(durations)} scrapes, "
          f"{missed:.0f} missed or failed")  # fmt: skip
    print(f"prometheus scrape_duration_seconds: p50 {pct(durations, 50) * 1e3:.1f} ms, "
          f"p99 {pct(durations, 99) * 1e3:.1f} ms, max {max(durations) * 1e3:.1f} ms")  # fmt: skip
    print(f"prometheus RSS at most: {most:.0f} MiB; the exporter's CPU per 10 s meanwhile: "
          f"{exporter_cpu:.2f} s")  # fmt: skip


def parse_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60}
    for unit in ("ms", "s", "m"):
        if text.endswith(unit):
            return float(text.removesuffix(unit)) * units[unit]
    return float(text)


def until(ok: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:g} s")
        time.sleep(0.2)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.many", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--hold", type=float, default=35.0, help="seconds of steps measured")
    p.add_argument("--pages", type=int, default=1000)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--baseline", default=BASELINE, help="git ref of the exporter to compare")
    p.add_argument("--prometheus-targets", type=int, default=2000)
    p.add_argument("--prometheus-seconds", type=float, default=300)
    p.add_argument("--scrape-interval", default="15s")
    p.add_argument("--timeout", type=float, default=600, help="seconds a start-up may take")
    p.add_argument("--generation", help="ours as this dcgm-exporter generation (the baseline "
                   "may have none: it serves its default)")  # fmt: skip
    args = p.parse_args()
    print(f"machine: {machine()}, load {load()}")
    with tempfile.TemporaryDirectory(prefix="bench-many-") as tmp:
        work = Path(tmp)
        topology, names = render_cluster(args.nodes, args.gpus, work)
        baseline = baseline_tree(args.baseline, work)
        for name, tree in ((f"baseline {args.baseline}", baseline), ("ours", ROOT)):
            one_process(name, tree, topology, names, args, work)
        shards(topology, names, args, work)
        prometheus(topology, names, args, work)


if __name__ == "__main__":
    main()
