"""`python -m status_updater render|run`: flags default to the environment, errors are one line."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

from status_updater.configmap import (
    configmap_name,
    configmap_namespace,
    dump_object,
    topology_configmap,
)
from status_updater.objects import InputError, load_objects
from status_updater.reconcile import reconcile

EXIT_OK, EXIT_USAGE = 0, 2


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def render(nodes: list[str], pods: list[str]) -> int:
    try:
        objects = [*load_objects(nodes, "Node"), *load_objects(pods, "Pod")]
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    node_objs = [o for o in objects if o.get("kind") == "Node"]
    pod_objs = [o for o in objects if o.get("kind") == "Pod"]
    topology, warnings = reconcile(node_objs, pod_objs)
    for w in warnings:
        _warn(str(w))
    cm = topology_configmap(topology, configmap_name(), configmap_namespace())
    sys.stdout.write(dump_object(cm))
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m status_updater",
        description="Turns run:ai dynamic-MIG Nodes and Pods into the topology ConfigMap.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "render",
        help="print the topology ConfigMap for Node/Pod manifests",
        description="Print the topology ConfigMap (name from TOPOLOGY_CM_NAME, namespace from "
        "TOPOLOGY_CM_NAMESPACE) for Nodes and Pods read from YAML/JSON files or directories.",
    )
    r.add_argument("--nodes", nargs="+", required=True, metavar="PATH", help="Node manifests")
    r.add_argument("--pods", nargs="+", default=[], metavar="PATH", help="Pod manifests")
    live = sub.add_parser(
        "run",
        help="keep the topology ConfigMap up to date from the cluster",
        description="Watch Nodes and Pods and keep the topology ConfigMap (TOPOLOGY_CM_NAME in "
        "TOPOLOGY_CM_NAMESPACE) up to date. Replicas elect one writer with a Lease.",
    )
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
        "--resync",
        type=float,
        default=float(os.environ.get("RESYNC_SECONDS") or 30),
        help="seconds between checks that the ConfigMap still holds what was written "
        "(env RESYNC_SECONDS, default %(default)s)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "render":
            return render(args.nodes, args.pods)
        from status_updater.daemon import run

        return run(args.kubeconfig, args.lease_name, args.identity, args.resync)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last guard: a user sees one line, never a traceback
        print(f"error: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
