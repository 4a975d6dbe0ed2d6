"""DRA's settings: which nodes the updater publishes ResourceSlices for, and in which mode."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.process import env_switch
from kube import selectors
from status_updater.objects import Obj, metadata, slim_node, strings


def _selector(text: str) -> str:
    try:
        selectors.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (flag or DRA_NODE_SELECTOR)") from None
    return text


def add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dra-node-selector",
        type=_selector,
        default=os.environ.get("DRA_NODE_SELECTOR") or None,  # empty is unset, as elsewhere
        metavar="SELECTOR",
        help="publish the NVIDIA DRA driver's ResourceSlices for the GPU nodes whose labels "
        "match, e.g. type=kwok, '' for every GPU node (env DRA_NODE_SELECTOR; unset: DRA off)",
    )
    parser.add_argument(
        "--dra-dynamic-mig",
        action="store_true",
        default=env_switch("DRA_DYNAMIC_MIG"),
        help="as the driver's DynamicMIG gate: a MIG-enabled GPU offers every profile at every "
        "placement (env DRA_DYNAMIC_MIG=true)",
    )


@dataclass(frozen=True)
class DraOptions:
    selector_text: str  # "" selects every GPU node
    dynamic_mig: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace) -> DraOptions:
        return cls(args.dra_node_selector or "", args.dra_dynamic_mig)

    def selector(self) -> selectors.Selector:
        """Whether a node's labels are selected (parsed once: the flag was checked already)."""
        return selectors.parse(self.selector_text)


SELECTED = "dra-selected"  # in a slim node: the DRA selector picks it (its ResourceSlices)


def node_slimmer(options: DraOptions | None) -> Callable[[Obj], dict[str, Any]]:
    """What the Node informer keeps of a Node: `objects.slim_node`, and with DRA on whether the
    selector picks it, judged on all its labels (the slim node keeps only those reconcile
    reads)."""
    if options is None:
        return slim_node
    selects = options.selector()

    def slim(node: Obj) -> dict[str, Any]:
        found = slim_node(node)
        if selects(strings(metadata(node).get("labels"))):
            found[SELECTED] = True
        return found

    return slim
