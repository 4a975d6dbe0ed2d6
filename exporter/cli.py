"""`python -m exporter`: DCGM-compatible `/metrics` for one node of the topology."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from exporter import dcgm
from exporter.server import MetricsServer, Published
from exporter.service import Exporter, follow_file, read_topology_file
from exporter.source import missing_node, node_of
from topology.errors import TopologyError

EXIT_OK, EXIT_USAGE = 0, 2
log = logging.getLogger("exporter")


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port 0-65535, got {text!r}")
    return int(text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m exporter",
        description="Serve the DCGM metrics of one node of the MIG topology.",
    )
    p.add_argument(
        "--topology-file",
        type=Path,
        metavar="FILE",
        help="the topology ConfigMap or bare topology.yml; without it, watch the "
        "ConfigMap TOPOLOGY_CM_NAME in TOPOLOGY_CM_NAMESPACE on the cluster",
    )
    p.add_argument(
        "--node-name",
        default=os.environ.get("NODE_NAME"),
        help="the node whose GPUs to export (env NODE_NAME)",
    )
    p.add_argument("--once", action="store_true", help="print the exposition and exit")
    p.add_argument("--address", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=_port, default=9400, help="listen port (default 9400)")
    p.add_argument(
        "--driver-version",
        default=os.environ.get("DRIVER_VERSION") or dcgm.DEFAULT_DRIVER_VERSION,
        help="DCGM_FI_DRIVER_VERSION label (env DRIVER_VERSION, default %(default)s)",
    )
    p.add_argument(
        "--hostname",
        default=os.environ.get("EXPORTER_HOSTNAME") or socket.gethostname(),
        help="Hostname label (env EXPORTER_HOSTNAME, default this host's name)",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig when not in a cluster (env KUBECONFIG)",
    )
    return p


def _once(path: Path, node_name: str, options: dcgm.Options) -> int:
    obj = f"topology file {path}"
    topology = read_topology_file(path)
    node = node_of(topology, node_name, obj)
    if node is None:
        raise missing_node(topology, node_name, obj)
    sys.stdout.buffer.write(dcgm.render(node, options, time.time()))
    return EXIT_OK


def serve(args: argparse.Namespace, options: dcgm.Options) -> int:
    stop = threading.Event()
    published = Published()
    exporter = Exporter(args.node_name, options, published)

    def shutdown(*_: object) -> None:
        stop.set()
        exporter.wake.set()  # the render loop sleeps on it between utilization steps

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, shutdown)
    if args.topology_file is not None:
        # A first read that fails is unusable input; later failures keep the last good state.
        exporter.update(
            read_topology_file(args.topology_file), f"topology file {args.topology_file}"
        )
        source = threading.Thread(
            target=follow_file, args=(args.topology_file, exporter, stop), daemon=True
        )
    else:
        from exporter.watch import watch_configmap
        from status_updater.kube import ConfigError, api_client

        try:
            client = api_client(args.kubeconfig)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        source = threading.Thread(
            target=watch_configmap, args=(exporter, stop, client), daemon=True
        )
    try:
        server = MetricsServer(published, args.address, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.address}:{args.port}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    server.start()
    source.start()
    log.info("serving node %s on http://%s:%d/metrics", args.node_name, args.address, server.port)
    exporter.run(stop)
    server.stop()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    p = parser()
    args = p.parse_args(argv)
    if not args.node_name:
        p.error("--node-name (or env NODE_NAME) is required")
    if args.once and args.topology_file is None:
        p.error("--once needs --topology-file")
    options = dcgm.Options(hostname=args.hostname, driver_version=args.driver_version)
    try:
        if args.once:
            return _once(args.topology_file, args.node_name, options)
        return serve(args, options)
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last guard: one line, never a traceback
        print(f"error: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
