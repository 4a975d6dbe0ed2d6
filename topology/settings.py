"""Where the topology lives: the settings both daemons read (environment and the --layout flag),
beside the ConfigMap contract they point into."""

from __future__ import annotations

import argparse
import os

from topology import configmap as contract


def topology_namespace() -> str:
    return os.environ.get("TOPOLOGY_CM_NAMESPACE") or contract.DEFAULT_NAMESPACE


def topology_name() -> str:
    """The single layout's ConfigMap."""
    return os.environ.get("TOPOLOGY_CM_NAME") or contract.DEFAULT_NAME


def _layout(text: str) -> str:
    if text not in contract.LAYOUTS:
        raise argparse.ArgumentTypeError(
            f"expected {' or '.join(contract.LAYOUTS)}, got {text!r} (flag or TOPOLOGY_LAYOUT)"
        )
    return text


def add_layout_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--layout",
        type=_layout,  # argparse converts a string default too: a bad environment is an error
        default=os.environ.get("TOPOLOGY_LAYOUT") or contract.DEFAULT_LAYOUT,
        help="per-node: a ConfigMap topology-<node> per GPU node; single: one ConfigMap "
        "TOPOLOGY_CM_NAME with every node (env TOPOLOGY_LAYOUT, default %(default)s)",
    )
