"""`python -m status_updater render|run`: flags default to the environment, errors are one line."""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TextIO

import yaml

from mig_exporter.common.files import UnreadableFile, read_text
from mig_exporter.common.podlabels import Allowlist
from mig_exporter.common.process import CLUSTER_ENVIRONMENT, env_switch, not_utf8
from mig_exporter.common.yamlload import SafeDumper
from mig_exporter.kube import names
from mig_exporter.kube.api import BURST, QPS, Pace, port
from mig_exporter.web.server import EVERY_ADDRESS
from status_updater import faults
from status_updater.dra import (
    DISABLED,
    SELECTED,
    DraOptions,
    add_claim_status_argument,
    add_dra_arguments,
    node_slimmer,
    selector_argument,
)
from status_updater.inputs import POLICY_KINDS, InputError, load_objects
from status_updater.leader import CLIENT_GO, Timing
from status_updater.objects import Obj, pod_slimmer
from status_updater.reconcile import document
from status_updater.resourceslices import node_slices
from status_updater.state import ClusterState
from topology import configmap as contract
from topology import migparted, yamltext
from topology.errors import TopologyError
from topology.model import NodeTopology, dump_yaml, parse_time
from topology.settings import add_layout_argument, topology_name, topology_namespace

EXIT_OK, EXIT_USAGE = 0, 2
# Every variable the updater reads: one that is not UTF-8 is refused at the start.
ENVIRONMENT = (*CLUSTER_ENVIRONMENT, "LEASE_NAME", "POD_NAME", "MIG_PARTED_CONFIG",
               "RESYNC_SECONDS", "METRICS_PORT", "METRICS_ADDRESS", "DRA_NODE_SELECTOR",
               "DRA_DYNAMIC_MIG", "DRA_SLICE_LAYOUT", "DRA_LIST_TYPE_ATTRIBUTES", "DRA_CLAIM_STATUS",
               "DRA_CONSUMABLE_SHARES",
               "KUBE_API_QPS", "KUBE_API_BURST", "LEASE_DURATION_SECONDS", "RENEW_DEADLINE_SECONDS",
               "RETRY_PERIOD_SECONDS", "POD_LABELS", "POD_LABEL_ALLOWLIST_REGEX",
               "FAULT_NODE_LABELS", "KAI_NODE_SELECTOR")  # fmt: skip


class _LiteralDumper(SafeDumper):  # type: ignore[valid-type,misc]
    """Prints multi-line strings as `|` blocks so the embedded topology stays readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_LiteralDumper.add_representer(str, _str)


def dump_object(obj: dict[str, Any]) -> str:
    return yaml.dump(obj, Dumper=_LiteralDumper, sort_keys=False, default_flow_style=False)


def configmaps(state: ClusterState, layout: str, namespace: str) -> dict[str, Any]:
    """What the updater would write for this state: one ConfigMap, or a List of per-node ones."""
    if layout == "single":
        return contract.configmap(dump_yaml(state.topology()), topology_name(), namespace)
    items = [
        contract.node_configmap(
            name,
            dump_yaml(document(name, result, state.node_strategy(name))),
            namespace,
            state.node_uid(name),
        )
        for name, result in sorted(state.results.items())
        if isinstance(result, NodeTopology)
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


MAX_MIG_PARTED_CONFIG_BYTES = 16 * 1024 * 1024


def read_layouts(path: str) -> migparted.Layouts:
    """`--mig-parted-config FILE`: the GPU operator's ConfigMap manifest or its `config.yaml`."""
    try:
        return migparted.load(read_text(path, MAX_MIG_PARTED_CONFIG_BYTES), path)
    except UnreadableFile as e:
        raise InputError(f"{path}: {e}") from None
    except TopologyError as e:
        raise InputError(str(e)) from None


def dra_slices(state: ClusterState) -> Iterator[list[dict[str, Any]] | str]:
    """The ResourceSlices the DRA driver would publish on each GPU node the state's DRA options
    selected (its nodes slimmed by `dra.node_slimmer`), a node at a time, with the taints of its
    faults at the state's time; a line instead for a node that has none."""
    for name in sorted(state.nodes):
        slim = state.nodes[name]
        if not slim.get(SELECTED):
            continue
        yield from map(str, state.node_warnings(name))
        devices = state.devices(name)
        if isinstance(devices, TopologyError):
            yield f"{devices}; no ResourceSlices"
            continue
        if devices is None:
            continue
        try:
            taints = () if state.dra_options.get("dynamic") else state.taints(name)
            yield node_slices(slim, devices, **state.dra_options, taints=taints)
        except TopologyError as e:
            yield f"{e}; no ResourceSlices"


def write_list(found: Iterable[list[dict[str, Any]] | str], output: str, out: TextIO) -> None:
    """A List of the items `found` holds, written as they come (a node's slices are the most that
    is held at once: 1,000 nodes' are 300 MB of text); each line of `found` a warning."""
    first = True
    for items in found:
        if isinstance(items, str):
            print(f"warning: {items}", file=sys.stderr)
            continue
        for item in items:
            if output == "json":
                out.write('{"apiVersion":"v1","kind":"List","items":[\n' if first else ",\n")
                out.write(json.dumps(item, separators=(",", ":")))
            else:
                out.write("apiVersion: v1\nkind: List\nitems:\n" if first else "")
                out.write(yamltext.list_item(item))
            first = False
    if output == "json":
        out.write('{"apiVersion":"v1","kind":"List","items":[]}\n' if first else "\n]}\n")
    else:
        out.write("apiVersion: v1\nkind: List\nitems: []\n" if first else "")


def render(
    nodes: list[str],
    pods: list[str],
    layout: str,
    mig_parted_config: str | None = None,
    dra: DraOptions | None = None,
    claims: list[str] | None = None,
    output: str = "yaml",
    slim: Callable[[Obj], dict[str, Any]] | None = None,
    pod_labels: Allowlist | None = None,
    fault_policies: list[str] | None = None,
    now: float | None = None,
) -> int:
    try:
        layouts = read_layouts(mig_parted_config) if mig_parted_config else None
        skipped: list[str] = []
        objects = [
            *load_objects(nodes, "Node", skipped),
            *load_objects(pods, "Pod", skipped),
            *load_objects(claims or [], "ResourceClaim", skipped),
            *load_objects(fault_policies or [], "ConfigMap", skipped, POLICY_KINDS),
        ]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    for line in skipped:
        print(f"warning: {line}", file=sys.stderr)
    at = time.time() if now is None else now
    policies = []
    for cm in objects:
        if cm.get("kind") != "ConfigMap":
            continue
        try:
            policies.append(faults.read_policy(cm, at))
        except TopologyError as e:
            print(f"warning: {e}; left out", file=sys.stderr)
    node_objects = [o for o in objects if o.get("kind") == "Node"]
    if dra is not None:  # --resource-slices: the nodes' devices only, no pods placed
        state = ClusterState.of(node_objects, [], layouts, slim=node_slimmer(dra), policies=policies,
                                now=at)  # fmt: skip
        state.dra_options = dra.slices()
        write_list(dra_slices(state), output, sys.stdout)
        _said_policies(state)
        return EXIT_OK
    state = ClusterState.of(
        node_objects,
        (o for o in objects if o.get("kind") == "Pod"),
        layouts,
        (o for o in objects if o.get("kind") == "ResourceClaim"),
        slim or node_slimmer(None),
        pod_slimmer(pod_labels),
        policies=policies,
        now=at,
    )
    for w in state.all_warnings():
        print(f"warning: {w}", file=sys.stderr)
    _said_policies(state)
    sys.stdout.write(dump_object(configmaps(state, layout, topology_namespace())))
    return EXIT_OK


def _said_policies(state: ClusterState) -> None:
    """What each fault policy hit, one line each on stderr (its status annotation in a cluster)."""
    for name in sorted(state.policies):
        hit = state.hits.get(name, {})
        gpus = sum(len(entries) for entries in hit.values())
        print(f"fault policy {name}: hits {gpus} GPUs on {len(hit)} nodes", file=sys.stderr)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m status_updater",
        description="Turns GPU Nodes and their Pods (run:ai dynamic MIG, static MIG, whole GPUs, "
        "sharing) into topology ConfigMaps.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "render",
        help="print the topology ConfigMaps for Node/Pod manifests",
        description="Print the topology ConfigMaps (in TOPOLOGY_CM_NAMESPACE) for Nodes and Pods "
        "read from YAML/JSON files or directories: a List of topology-<node> ConfigMaps, or with "
        "--layout single the one ConfigMap TOPOLOGY_CM_NAME.",
    )
    _render_arguments(r)
    live = sub.add_parser(
        "run",
        help="keep the topology ConfigMaps up to date from the cluster",
        description="Watch Nodes and Pods and keep the topology ConfigMaps in "
        "TOPOLOGY_CM_NAMESPACE up to date. Replicas elect one writer with a Lease.",
    )
    _run_arguments(live)
    return p


def _render_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("--nodes", nargs="+", required=True, metavar="PATH", help="Node manifests")
    r.add_argument("--pods", nargs="+", default=[], metavar="PATH", help="Pod manifests")
    r.add_argument(
        "--claims",
        nargs="+",
        default=[],
        metavar="PATH",
        help="allocated DRA ResourceClaims: the devices they hold go to the pods reserving them",
    )
    r.add_argument(
        "--mig-parted-config",
        metavar="FILE",
        help="the layouts static-MIG nodes' nvidia.com/mig.config names: the GPU operator's "
        "mig-parted ConfigMap manifest or its config.yaml (default: NVIDIA's built-in layouts)",
    )
    add_layout_argument(r)
    r.add_argument(
        "--resource-slices",
        action="store_true",
        help="print the ResourceSlices the NVIDIA DRA driver would publish on the nodes instead",
    )
    r.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default="yaml",
        help="the List's format (default %(default)s)",
    )
    add_dra_arguments(r)
    _pod_label_arguments(r)
    r.add_argument(
        "--fault-policies",
        nargs="+",
        default=[],
        metavar="PATH",
        help="fault policy ConfigMaps (docs/faults.md): their faults on the GPUs they hit, as "
        "the updater puts them in a cluster",
    )
    r.add_argument(
        "--now",
        type=_rfc3339,
        metavar="TIME",
        help="the time faults are judged at, RFC 3339 (default: the current time): a fault "
        "entry's start where it names none, a policy's start without a creationTimestamp, the "
        "taints in effect",
    )


def _rfc3339(text: str) -> float:
    try:
        return float(parse_time(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _pod_label_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pod-labels",
        action="store_true",
        default=env_switch("POD_LABELS"),
        help="copy each holding pod's labels into the topology, for the exporter's "
        "--kubernetes-enable-pod-labels (env POD_LABELS=true)",
    )
    p.add_argument(
        "--pod-label-allowlist-regex",
        action="append",
        default=[os.environ["POD_LABEL_ALLOWLIST_REGEX"]]
        if os.environ.get("POD_LABEL_ALLOWLIST_REGEX")
        else [],
        metavar="REGEX[,REGEX...]",
        help="with --pod-labels: copy only the labels whose key one of these matches, as "
        "dcgm-exporter's --kubernetes-pod-label-allowlist-regex (env POD_LABEL_ALLOWLIST_REGEX)",
    )


def _copied_labels(args: argparse.Namespace) -> Allowlist | None:
    return Allowlist.parse(args.pod_label_allowlist_regex) if args.pod_labels else None


def _run_arguments(live: argparse.ArgumentParser) -> None:
    add_layout_argument(live)
    live.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig outside a cluster (env KUBECONFIG; in a pod: the service account)",
    )
    live.add_argument(
        "--lease-name",
        default=os.environ.get("LEASE_NAME") or "topology-status-updater",
        help="Lease for leader election, in TOPOLOGY_CM_NAMESPACE (env LEASE_NAME)",
    )
    live.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}",
        help="this replica's name in the Lease (env POD_NAME, default host-pid)",
    )
    live.add_argument(
        "--mig-parted-config",
        type=_configmap_ref,
        default=os.environ.get("MIG_PARTED_CONFIG") or migparted.DEFAULT_CONFIGMAP,
        metavar="NAMESPACE/NAME",
        help="the ConfigMap (key config.yaml) with the layouts static-MIG nodes' "
        "nvidia.com/mig.config names; while it is absent, NVIDIA's built-in layouts "
        "(env MIG_PARTED_CONFIG, default %(default)s)",
    )
    live.add_argument(
        "--resync",
        type=_seconds,
        default=os.environ.get("RESYNC_SECONDS") or "30",  # a string: parsed (and checked) as given
        help="seconds between checks that the ConfigMaps still hold what was written "
        "(env RESYNC_SECONDS, default %(default)s)",
    )
    live.add_argument(
        "--metrics-port",
        type=port,
        default=os.environ.get("METRICS_PORT") or "9401",
        help="serve /health and the updater's own /metrics on this port, 0 for none "
        "(env METRICS_PORT, default %(default)s)",
    )
    live.add_argument(
        "--metrics-address",
        default=os.environ.get("METRICS_ADDRESS") or EVERY_ADDRESS,
        help="listen address for --metrics-port, any form (0.0.0.0, ::, [::1], a host name; "
        "env METRICS_ADDRESS; default: every address, IPv6 and IPv4 where the host has IPv6)",
    )
    live.add_argument(
        "--kube-api-qps",
        type=_positive(float),
        default=os.environ.get("KUBE_API_QPS") or str(QPS),
        help="requests a second to the API, as client-go's rate limiter paces them "
        "(env KUBE_API_QPS, default %(default)s)",
    )
    live.add_argument(
        "--kube-api-burst",
        type=_positive(int),
        default=os.environ.get("KUBE_API_BURST") or str(BURST),
        help="requests above --kube-api-qps allowed at once (env KUBE_API_BURST, "
        "default %(default)s)",
    )
    timing = CLIENT_GO
    live.add_argument(
        "--lease-duration",
        type=_seconds,
        default=os.environ.get("LEASE_DURATION_SECONDS") or f"{timing.lease_duration_s:g}",
        help="seconds a standby waits after the leader's last renewal before it takes the Lease "
        "(env LEASE_DURATION_SECONDS, default %(default)s, as client-go)",
    )
    live.add_argument(
        "--renew-deadline",
        type=_seconds,
        default=os.environ.get("RENEW_DEADLINE_SECONDS") or f"{timing.renew_deadline_s:g}",
        help="seconds the leader keeps trying to renew the Lease before it stops writing "
        "(env RENEW_DEADLINE_SECONDS, default %(default)s)",
    )
    live.add_argument(
        "--retry-period",
        type=_seconds,
        default=os.environ.get("RETRY_PERIOD_SECONDS") or f"{timing.retry_period_s:g}",
        help="seconds between tries to take or renew the Lease "
        "(env RETRY_PERIOD_SECONDS, default %(default)s)",
    )
    add_dra_arguments(live)
    _pod_label_arguments(live)
    add_claim_status_argument(live)
    live.add_argument(
        "--fault-node-labels",
        action="store_true",
        default=env_switch("FAULT_NODE_LABELS"),
        help="label each GPU node mig-exporter/unhealthy-gpus=<n> while n of its GPUs have a "
        "fault a device plugin would mark unhealthy (a fatal Xid, a lost GPU); needs patch on "
        "nodes (env FAULT_NODE_LABELS=true)",
    )
    live.add_argument(
        "--kai-node-selector",
        type=selector_argument("KAI_NODE_SELECTOR"),
        default=os.environ.get("KAI_NODE_SELECTOR") or None,
        metavar="SELECTOR",
        help="on the KWOK nodes (annotation kwok.x-k8s.io/node: fake) this label selector picks "
        '("" for every one), write what KAI\'s node-side parts would: the node conditions '
        "gpu-fractioning.nvidia.com/Ready and gpu-sharing.nvidia.com/Ready (NvFractions places "
        "nothing without them), and each reservation pod's run.ai/reserve_for_gpu_index (its "
        "GPU's uuid; KAI's binder waits for it); needs patch on nodes/status and pods "
        "(env KAI_NODE_SELECTOR)",
    )


def _positive(kind: Callable[[str], float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value <= 1_000_000:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 86400, got {text!r}")
    return value


def _configmap_ref(text: str) -> str:
    namespace, _, name = text.partition("/")
    if not namespace or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"expected NAMESPACE/NAME, got {text!r}")
    return text


def _names(args: argparse.Namespace) -> list[tuple[str, str | None, names.Check]]:
    """Every name the updater writes or reads by (what says it, its value, the API's rule)."""
    found: list[tuple[str, str | None, names.Check]] = [
        ("env TOPOLOGY_CM_NAMESPACE", topology_namespace(), names.dns1123_label),
        ("env TOPOLOGY_CM_NAME", topology_name(), names.dns1123_subdomain),
    ]
    if args.command == "run":
        namespace, _, name = args.mig_parted_config.partition("/")
        found += [
            ("--lease-name", args.lease_name, names.dns1123_subdomain),
            ("--mig-parted-config namespace", namespace, names.dns1123_label),
            ("--mig-parted-config name", name, names.dns1123_subdomain),
        ]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    # Not UTF-8, a flag or variable would fail where it is written out (a ConfigMap, a request).
    if (bad := not_utf8(sys.argv[1:] if argv is None else argv, ENVIRONMENT)) is not None:
        print(f"error: {bad}", file=sys.stderr)
        return EXIT_USAGE
    args = parser().parse_args(argv)
    if (problem := names.problem(_names(args))) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "render":
            dra = DraOptions.of(args) if args.resource_slices else None
            # Claims on the nodes DRA selects are placed as its driver would, with DynamicMIG
            # and consumable shares where asked.
            dra_nodes = (args.dra_node_selector is not None or args.dra_dynamic_mig
                         or args.dra_consumable_shares != DISABLED)  # fmt: skip
            slim = node_slimmer(DraOptions.of(args) if dra_nodes else None)
            return render(
                args.nodes, args.pods, args.layout, args.mig_parted_config, dra, args.claims,
                args.output, slim, _copied_labels(args), args.fault_policies, args.now,
            )  # fmt: skip
        from status_updater.daemon import run

        timing = Timing(args.lease_duration, args.renew_deadline, args.retry_period)
        if (problem := timing.problem()) is not None:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_USAGE
        return run(
            args.kubeconfig,
            args.layout,
            args.lease_name,
            args.identity,
            args.resync,
            args.mig_parted_config,
            (args.metrics_address, args.metrics_port) if args.metrics_port else None,
            DraOptions.of(args) if args.dra_node_selector is not None else None,
            Pace(args.kube_api_qps, int(args.kube_api_burst)),
            timing,
            _copied_labels(args),
            args.fault_node_labels,
            args.kai_node_selector,
        )
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last guard: a user sees one line, never a traceback
        print(f"error: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
