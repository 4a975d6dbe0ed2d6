"""DRA's settings: which nodes the updater publishes ResourceSlices for, and in which mode."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from common.process import env_switch
from kube import selectors


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
        default=os.environ.get("DRA_NODE_SELECTOR"),
        metavar="SELECTOR",
        help="publish the NVIDIA DRA driver's ResourceSlices for the GPU nodes whose labels "
        "match, e.g. type=kwok (env DRA_NODE_SELECTOR; unset: DRA off)",
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
