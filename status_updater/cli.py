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


def run(kubeconfig: str | None, lease_name: str, identity: str) -> int:
    import logging
    import signal
    import threading

    import kubernetes

    from status_updater.controller import Controller
    from status_updater.kube import ConfigError, api_client
    from status_updater.leader import LeaderElector

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        client = api_client(kubeconfig)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    name, namespace = configmap_name(), configmap_namespace()
    stop = threading.Event()
    controller = Controller(kubernetes.client.CoreV1Api(client), name, namespace)
    elector = LeaderElector(
        kubernetes.client.CoordinationV1Api(client),
        lease_name,
        namespace,
        identity,
        controller.became_leader,
    )
    controller.is_leader = elector.is_leader

    def shutdown(*_: object) -> None:
        stop.set()
        controller.dirty.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, shutdown)
    threads = [
        *controller.informers(stop),
        threading.Thread(target=elector.run, args=(stop,), daemon=True),
    ]
    for t in threads:
        t.start()
    logging.getLogger("status_updater").info(
        "running as %s: ConfigMap %s/%s, lease %s", identity, namespace, name, lease_name
    )
    controller.run_writer(stop)
    # SIGTERM: the writer finished (or never started) its write; watches are daemon threads.
    elector.release()
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
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "render":
            return render(args.nodes, args.pods)
        return run(args.kubeconfig, args.lease_name, args.identity)
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last guard: a user sees one line, never a traceback
        print(f"error: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
