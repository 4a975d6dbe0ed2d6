"""`python -m exporter`: DCGM-compatible `/metrics` for one node of the topology, for every node
(`--all-nodes`), or for this machine's GPUs read through NVML (`--source nvml`)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from exporter import dcgm, generations, nvml
from exporter.collector import DEFAULT_INTERVAL_MS
from exporter.fields import CountersError, read_counters
from exporter.runtime import Runtime
from exporter.shards import Shard, ordinal
from exporter.wiring import EXIT_USAGE, Autoshard, Settings, _once, serve
from mig_exporter.common.podlabels import Allowlist
from mig_exporter.common.process import CLUSTER_ENVIRONMENT, env_switch, not_utf8
from mig_exporter.kube import names
from mig_exporter.kube.api import port
from mig_exporter.web.config import WebConfigError
from mig_exporter.web.server import EVERY_ADDRESS
from topology import dra
from topology.errors import TopologyError
from topology.settings import add_layout_argument, topology_name, topology_namespace

log = logging.getLogger("exporter")
# Every variable the exporter reads: one that is not UTF-8 is refused at the start.
ENVIRONMENT = (
    *CLUSTER_ENVIRONMENT, "NODE_NAME", "DCGM_EXPORTER_INTERVAL", "DRIVER_VERSION",
    "EXPORTER_HOSTNAME", "DCGM_EXPORTER_COLLECTORS", "MIG_POD_LABELS", "KUBERNETES_VIRTUAL_GPUS",
    "KUBERNETES_ENABLE_POD_UID", "DCGM_EXPORTER_ENABLE_EXPORTER_METRICS",
    "KUBERNETES_ENABLE_POD_LABELS", "KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
    "WEB_CONFIG_FILE", "DCGM_EXPORTER_VERSION", "KUBERNETES_ENABLE_DRA", "TOTAL_SHARDS", "SHARD",
    "POD_NAME", "POD_NAMESPACE", "DRA_CLAIM_STATUS", "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE",
)  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m exporter",
        description="Serve the DCGM metrics of one node of the MIG topology, of every node "
        "(--all-nodes), or of this machine's GPUs through NVML.",
    )
    _topology_arguments(p)
    p.add_argument("--once", action="store_true", help="print the exposition and exit")
    p.add_argument(
        "--address",
        default=EVERY_ADDRESS,
        help="listen address, any form (0.0.0.0, ::, [::1], a host name; default: every "
        "address, IPv6 and IPv4 where the host has IPv6)",
    )
    p.add_argument("--port", type=port, default=9400, help="listen port (default 9400)")
    _series_arguments(p)
    p.add_argument(
        "--web-config-file",
        type=Path,
        metavar="FILE",
        default=os.environ.get("WEB_CONFIG_FILE") or None,
        help="TLS, client certificates and basic auth for /metrics and /health, in Prometheus "
        "exporter-toolkit's web config format (env WEB_CONFIG_FILE; default plain HTTP, open)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig to use (env KUBECONFIG; default: in-cluster config, else ~/.kube/config)",
    )
    return p


def _topology_arguments(p: argparse.ArgumentParser) -> None:
    """Where the GPUs and the topology are read from, and which nodes are served."""
    p.add_argument(
        "--source",
        choices=("topology", "nvml"),
        default="topology",
        help="where the GPUs are read from: the topology (simulated values, the default), or "
        "NVML on this machine's real GPUs",
    )
    p.add_argument(
        "-c",
        "--collect-interval",
        type=milliseconds,
        metavar="MS",
        default=os.environ.get("DCGM_EXPORTER_INTERVAL") or DEFAULT_INTERVAL_MS,
        help="with --source nvml: milliseconds between NVML collections, as dcgm-exporter's "
        "(env DCGM_EXPORTER_INTERVAL, default %(default)s)",
    )
    p.add_argument(
        "--watch-topology",
        action="store_true",
        help="with --source nvml: name the pods holding the GPUs from the node's topology "
        "ConfigMap (see --layout); --topology-file does the same from a file",
    )
    p.add_argument(
        "--topology-file",
        type=Path,
        metavar="FILE",
        help="a topology ConfigMap or bare topology.yml; without it, watch the node's "
        "ConfigMap (see --layout) in TOPOLOGY_CM_NAMESPACE on the cluster",
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="the node whose GPUs to export (env NODE_NAME)",
    )
    add_layout_argument(p)
    p.add_argument(
        "--all-nodes",
        action="store_true",
        help="serve every node's series from this one process, Hostname = the node name "
        "(for nodes without an exporter pod, e.g. KWOK)",
    )
    p.add_argument(
        "--node-selector",
        metavar="LABELSELECTOR",
        help="with --all-nodes: only the nodes whose labels match, e.g. type=kwok",
    )
    p.add_argument(
        "--total-shards",
        type=_count,
        default=os.environ.get("TOTAL_SHARDS") or None,
        metavar="M",
        help="with --all-nodes: the nodes are split into M shards by a hash of their name, "
        "Prometheus's hashmod; this replica serves one (env TOTAL_SHARDS)",
    )
    p.add_argument(
        "--pod",
        help="with --all-nodes, no --total-shards: this StatefulSet pod's name; its replicas "
        "are the shard count, its ordinal the shard, followed as it scales. Without the flag, "
        "env POD_NAME and POD_NAMESPACE (the downward API's) shard only a pod a StatefulSet "
        "owns, found on the cluster; any other pod serves every node",
    )
    p.add_argument(
        "--pod-namespace",
        help="the pod's namespace, for --pod (default env POD_NAMESPACE)",
    )
    p.add_argument(
        "--shard",
        type=_count,
        default=os.environ.get("SHARD") or None,
        metavar="N",
        help="the shard this replica serves, 0 to M-1 (env SHARD; default: the ordinal its pod "
        "name ends with, env POD_NAME or the hostname, as in a StatefulSet)",
    )


def _count(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 6):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(text)


def _autoshard(p: argparse.ArgumentParser, args: argparse.Namespace) -> Autoshard | None:
    """Whether the shard count is the pod's StatefulSet's replicas. A variable the platform sets
    for its own reasons never stops the exporter: only flags can be a usage error."""
    if args.pod is not None or args.pod_namespace is not None:
        return _asked(p, args)
    pod, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if not (args.all_nodes and (pod or namespace) and args.total_shards is None):
        return None
    why = (
        "env POD_NAME and POD_NAMESPACE name no pod together" if not (pod and namespace)
        else "a topology file has no StatefulSet" if args.topology_file is not None
        else f"pod {pod} ends in no StatefulSet ordinal" if ordinal(pod) is None
        else f"env POD_NAME {pod!r} is no pod's name" if names.dns1123_subdomain(pod)
        else f"env POD_NAMESPACE {namespace!r} is no namespace" if names.dns1123_label(namespace)
        else None
    )  # fmt: skip
    if why is not None or not (pod and namespace):
        log.info("not sharding: %s; serving every node", why)
        return None
    return Autoshard(pod, namespace, required=False)


def _asked(p: argparse.ArgumentParser, args: argparse.Namespace) -> Autoshard:
    pod = args.pod or os.environ.get("POD_NAME")
    namespace = args.pod_namespace or os.environ.get("POD_NAMESPACE")
    if not args.all_nodes:
        p.error("--pod and --pod-namespace shard --all-nodes")
    if args.total_shards is not None:
        p.error("--pod shards by the StatefulSet's replicas: not with --total-shards")
    if not pod:
        p.error(
            "--pod-namespace goes with --pod (or env POD_NAME), the StatefulSet pod to shard by"
        )
    if not namespace:
        p.error("--pod goes with --pod-namespace (or env POD_NAMESPACE)")
    if args.topology_file is not None:
        p.error("--pod and --pod-namespace read the StatefulSet: not with --topology-file")
    if ordinal(pod) is None:
        p.error(f"--pod {pod!r} ends in no StatefulSet ordinal")
    return Autoshard(pod, namespace, required=True)


def _shard(p: argparse.ArgumentParser, args: argparse.Namespace) -> Shard | None:
    """--shard and --total-shards, the shard from the pod's name where it is not given."""
    if args.total_shards is None:
        if args.shard is not None:
            p.error("--shard goes with --total-shards")
        return None
    if not args.all_nodes:
        p.error("--total-shards goes with --all-nodes")
    number = args.shard
    if number is None:
        pod = args.pod or os.environ.get("POD_NAME") or socket.gethostname()
        number = ordinal(pod)
        if number is None:
            p.error(f"--shard not given and the pod name {pod!r} ends in no ordinal")
    try:
        return Shard(number, args.total_shards)
    except ValueError as e:
        p.error(str(e))


def _series_arguments(p: argparse.ArgumentParser) -> None:
    """What the series say beyond the GPUs: labels, fields, pods."""
    p.add_argument(
        "--driver-version",
        default=os.environ.get("DRIVER_VERSION") or None,
        help="DCGM_FI_DRIVER_VERSION label, and the driver whose MIG profile memory the series "
        f"show (env DRIVER_VERSION, default {dcgm.DEFAULT_DRIVER_VERSION}, the real dumps'; "
        f"with --kubernetes-enable-dra {dra.DRA_DRIVER}, as the updater's ResourceSlices say "
        "of a node without driver labels)",
    )
    p.add_argument(
        "--hostname",
        default=os.environ.get("EXPORTER_HOSTNAME") or socket.gethostname(),
        help="Hostname label (env EXPORTER_HOSTNAME, default this host's name)",
    )
    p.add_argument(
        "-f",
        "--collectors",
        type=Path,
        metavar="FILE",
        default=os.environ.get("DCGM_EXPORTER_COLLECTORS") or None,
        help="counters CSV in dcgm-exporter's format: the fields to serve, their order and help "
        "(env DCGM_EXPORTER_COLLECTORS; default: the fields of the real dumps)",
    )
    p.add_argument(
        "--dcgm-exporter-version",
        type=_generation,
        default=os.environ.get("DCGM_EXPORTER_VERSION") or None,
        metavar="VERSION",
        help="which dcgm-exporter to be: its default fields, names, units, labels, order and "
        f"value format (env DCGM_EXPORTER_VERSION): {_generations_help()}; default "
        f"{generations.DEFAULT.name}, or {generations.FIRST_WITH_DRA.name} with "
        "--kubernetes-enable-dra (docs/upgrade.md)",
    )
    p.add_argument(
        "--kubernetes-enable-dra",
        action="store_true",
        default=env_switch("KUBERNETES_ENABLE_DRA"),
        help="a device DRA claims hold, once per pod container holding it, with the claim's "
        f"dra_* labels, as its flag (from dcgm-exporter {generations.FIRST_WITH_DRA.name}; env "
        "KUBERNETES_ENABLE_DRA=true)",
    )
    p.add_argument(
        "--dra-claim-status",
        action="store_true",
        default=env_switch("DRA_CLAIM_STATUS"),
        help="with --kubernetes-enable-dra: attribute a DynamicMIG instance too, by the uuid "
        "its claim's status names (the updater's --dra-claim-status, as the DRA driver's issue "
        "#1456 designs it); off, it is served without pod or dra_* labels, as dcgm-exporter 4.8 "
        "serves it (env DRA_CLAIM_STATUS=true)",
    )
    p.add_argument(
        "--mig-pod-labels",
        action="store_true",
        default=env_switch("MIG_POD_LABELS"),
        help="name the pod holding each MIG instance in container/namespace/pod (env "
        "MIG_POD_LABELS=true); off by default, as run:ai dynamic MIG leaves them empty",
    )
    p.add_argument(
        "--kubernetes-virtual-gpus",
        action="store_true",
        default=env_switch("KUBERNETES_VIRTUAL_GPUS"),
        help="a shared GPU's (time-slicing, MPS, KAI fractions) series once per pod sharing it, "
        "with a vgpu label where it holds a replica, and from 4.8.3 each pod's own FB_USED and "
        "GPU_UTIL, as dcgm-exporter's flag (env KUBERNETES_VIRTUAL_GPUS=true)",
    )
    p.add_argument(
        "--enable-exporter-metrics",
        action="store_true",
        default=env_switch("DCGM_EXPORTER_ENABLE_EXPORTER_METRICS"),
        help="the exporter process's own go_*, process_* and promhttp_* series after the others, "
        "as dcgm-exporter's flag from 4.8.4 (env DCGM_EXPORTER_ENABLE_EXPORTER_METRICS=true)",
    )
    p.add_argument(
        "--kubernetes-enable-pod-labels",
        action="store_true",
        default=env_switch("KUBERNETES_ENABLE_POD_LABELS"),
        help="the holding pod's labels on its series, sanitised, after the label fields, as "
        "dcgm-exporter's flag from 4.8.3: the labels the updater copies into the topology (its "
        "--pod-labels) (env KUBERNETES_ENABLE_POD_LABELS=true)",
    )
    p.add_argument(
        "--kubernetes-pod-label-allowlist-regex",
        action="append",
        default=[os.environ["KUBERNETES_POD_LABEL_ALLOWLIST_REGEX"]]
        if os.environ.get("KUBERNETES_POD_LABEL_ALLOWLIST_REGEX")
        else [],
        metavar="REGEX[,REGEX...]",
        help="with --kubernetes-enable-pod-labels: only the labels whose key one of these "
        "matches, anywhere in it; none: every label (env KUBERNETES_POD_LABEL_ALLOWLIST_REGEX)",
    )
    p.add_argument(
        "-x",
        "--xid-count-window-size",
        type=_window_ms,
        default=_window_ms(os.environ.get("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE") or "300000"),
        metavar="MS",
        help="the window DCGM_EXP_XID_ERRORS_COUNT counts Xids over, in ms, where the counters "
        "file names it (default 300000; env DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE)",
    )
    p.add_argument(
        "--kubernetes-enable-pod-uid",
        action="store_true",
        default=env_switch("KUBERNETES_ENABLE_POD_UID"),
        help="the holding pod's uid in a pod_uid label, as dcgm-exporter's flag: on a device "
        "plugin's pods and replicas from 4.8.3, on DRA copies from 4.8.4 (env "
        "KUBERNETES_ENABLE_POD_UID=true)",
    )


def _window_ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= 30 * 86_400_000:
        raise argparse.ArgumentTypeError(f"expected milliseconds above 0, got {text!r}")
    return value


def _generations_help() -> str:
    return ", ".join(
        g.name + (f" (or {', '.join(g.aliases)})" if g.aliases else "")
        for g in generations.GENERATIONS
    )


def _generation(text: str) -> generations.Generation:
    try:
        return generations.generation(text)
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"expected one of {_generations_help()}, got {text!r} (flag or DCGM_EXPORTER_VERSION)"
        ) from None


def milliseconds(text: str) -> int:
    """An interval in milliseconds: a whole number from 100 (argparse type)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of ms") from None
    if value < 100:
        raise argparse.ArgumentTypeError(f"{value} ms is too short: at least 100")
    return value


def _names(args: argparse.Namespace) -> list[tuple[str, str | None, names.Check]]:
    """Every name and selector the exporter asks the API by (what says it, its value, the
    API's rule): none with a topology file."""
    if args.topology_file is not None or (args.source == "nvml" and not args.watch_topology):
        return []
    found: list[tuple[str, str | None, names.Check]] = [
        ("env TOPOLOGY_CM_NAMESPACE", topology_namespace(), names.dns1123_label),
        ("--node-selector", args.node_selector, names.label_selector),
    ]
    if args.layout == "single" or args.all_nodes:
        found.append(("env TOPOLOGY_CM_NAME", topology_name(), names.dns1123_subdomain))
    if not args.all_nodes:  # a name no Node can have: its topology never comes
        found.append(("--node-name", args.node_name, names.dns1123_subdomain))
    if args.autoshard is not None and args.autoshard.required:
        pod = args.autoshard
        found += [("--pod", pod.pod, names.dns1123_subdomain),
                  ("--pod-namespace", pod.namespace, names.dns1123_label)]  # fmt: skip
    return found


@dataclass(frozen=True)
class Rule:
    """A combination of flags the exporter refuses: when `broken`, it stops with `says`."""

    broken: Callable[[argparse.Namespace], bool]
    says: str


def _attributed(a: argparse.Namespace) -> bool:
    return a.topology_file is not None or a.watch_topology


RULES = (
    Rule(lambda a: a.source == "nvml" and a.all_nodes,
         "--source nvml reads this machine's GPUs: not with --all-nodes"),
    Rule(lambda a: a.source == "nvml" and a.watch_topology and a.topology_file is not None,
         "--watch-topology and --topology-file: one topology, not both"),
    Rule(lambda a: a.source != "nvml" and a.watch_topology,
         "--watch-topology goes with --source nvml (the topology source watches anyway)"),
    Rule(lambda a: not a.node_name and not a.all_nodes and (_attributed(a) or a.source != "nvml"),
         "--node-name (or env NODE_NAME) is required, or --all-nodes"),
    Rule(lambda a: a.once and a.topology_file is None and a.source != "nvml",
         "--once needs --topology-file"),
    Rule(lambda a: a.once and a.watch_topology, "--once reads a --topology-file, it does not watch"),
    Rule(lambda a: a.node_selector and not a.all_nodes, "--node-selector goes with --all-nodes"),
    Rule(lambda a: a.node_selector and a.topology_file is not None,
         "--node-selector reads Node labels from the cluster: not with --topology-file"),
)  # fmt: skip


@dataclass(frozen=True)
class Feature:
    """A dcgm-exporter option that only some generations have: its flag (as an argparse
    destination), the generation table's column that says which, and what the message calls it."""

    flag: str
    column: str
    what: str


FEATURES = (
    Feature("kubernetes_enable_dra", "dra", "DRA mode"),
    Feature("kubernetes_enable_pod_uid", "pod_uid", "pod_uid"),
    Feature("kubernetes_enable_pod_labels", "pod_labels", "pod labels"),
    Feature("enable_exporter_metrics", "exporter_metrics", "exporter metrics"),
)


def _options(args: argparse.Namespace, generation: generations.Generation) -> dcgm.Options:
    """The series' settings; CountersError when the counters file cannot be used."""
    counters = (
        read_counters(args.collectors) if args.collectors else dcgm.default_counters(generation)
    )
    return dcgm.Options(
        hostname=args.hostname,
        driver_version=args.driver_version
        or (dra.DRA_DRIVER if args.kubernetes_enable_dra else dcgm.DEFAULT_DRIVER_VERSION),
        counters=counters,
        mig_pod_labels=args.mig_pod_labels,
        virtual_gpus=args.kubernetes_virtual_gpus,
        generation=generation,
        dra=args.kubernetes_enable_dra,
        pod_uid=args.kubernetes_enable_pod_uid,
        pod_labels=Allowlist.parse(args.kubernetes_pod_label_allowlist_regex)
        if args.kubernetes_enable_pod_labels else None,
        dra_claim_status=args.dra_claim_status,
        xid_count_window_ms=args.xid_count_window_size,
    )  # fmt: skip


def settings(args: argparse.Namespace, options: dcgm.Options, shard: Shard | None) -> Settings:
    mode: Literal["node", "all-nodes", "nvml"] = (
        "nvml" if args.source == "nvml" else "all-nodes" if args.all_nodes else "node"
    )
    return Settings(
        mode=mode, options=options, node_name=args.node_name or "", topology_file=args.topology_file,
        watch_topology=args.watch_topology, once=args.once, kubeconfig=args.kubeconfig,
        layout=args.layout, node_selector=args.node_selector, shard=shard,
        autoshard=args.autoshard, address=args.address, port=args.port,
        web_config_file=args.web_config_file, collect_interval_s=args.collect_interval / 1000,
        runtime=Runtime(options.generation.go) if args.enable_exporter_metrics else None,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Not UTF-8, a flag or variable would fail where it is written out (a label, a request).
    if (bad := not_utf8(sys.argv[1:] if argv is None else argv, ENVIRONMENT)) is not None:
        print(f"error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    p = parser()
    args = p.parse_args(argv)
    for rule in RULES:
        if rule.broken(args):
            p.error(rule.says)
    shard = _shard(p, args)
    args.autoshard = _autoshard(p, args)
    if (problem := names.problem(_names(args))) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    generation = args.dcgm_exporter_version or (
        generations.FIRST_WITH_DRA if args.kubernetes_enable_dra else generations.DEFAULT
    )
    for feature in FEATURES:
        if getattr(args, feature.flag) and not getattr(generation, feature.column):
            first = next(g.name for g in generations.GENERATIONS if getattr(g, feature.column))
            p.error(f"--{feature.flag.replace('_', '-')}: dcgm-exporter {generation.name} has no "
                    f"{feature.what} (from {first})")  # fmt: skip
    try:
        options = _options(args, generation)
    except CountersError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    run = settings(args, options, shard)
    try:
        if run.once:
            return _once(run)
        # The first read builds what the daemon then keeps (5,000 nodes: millions of objects):
        # the cyclic collector walked all of it again and again as it grew, 4 of 13 s of
        # start-up. It waits until the render loop settles (loop.settle), or the return.
        gc.disable()
        return serve(run)
    except (TopologyError, WebConfigError, nvml.NvmlUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last guard: one line, never a traceback
        print(f"error: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        gc.enable()
