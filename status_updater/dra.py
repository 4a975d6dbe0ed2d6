"""DRA's settings: which nodes the updater publishes ResourceSlices for, and in which mode."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mig_exporter.common.process import env_switch
from mig_exporter.kube import names, selectors
from status_updater.objects import Obj, metadata, slim_node, strings

SPLIT, COMBINED = "split", "combined"  # the driver's layouts from Kubernetes 1.35, and on 1.34
# The driver's `--consumable-shares` (its ConsumableShares gate): every device allows several
# claims; `memory` and `unlimited` name how a claim without a request consumes its memory, a
# number N adds a `shares` capacity of N.
DISABLED, MEMORY, UNLIMITED = "disabled", "memory", "unlimited"
MAX_SHARES = 1_000_000


def _consumable_shares(text: str) -> str:
    """`disabled`, `memory`, `unlimited` or a count of shares N, as the driver's flag takes them;
    N is at least 2: with 1 the API refuses every slice (a range's min plus its step, 1 + 1,
    may not pass the capacity's value)."""
    word = text.strip()
    if word in (DISABLED, MEMORY, UNLIMITED):
        return word
    if word.isascii() and word.isdigit() and 2 <= int(word) <= MAX_SHARES:
        return str(int(word))
    raise argparse.ArgumentTypeError(
        f"expected disabled, memory, unlimited or a number of shares from 2 to {MAX_SHARES}, "
        f"got {text!r} (flag or DRA_CONSUMABLE_SHARES; 1 share is a slice the API refuses)"
    )


def shares_count(mode: str) -> int | None:
    """N of `--dra-consumable-shares N`; None for the other modes."""
    return int(mode) if mode.isdigit() else None


def selector_argument(env: str) -> Callable[[str], str]:
    """argparse's type of a label selector flag whose environment variable is `env`: the text,
    checked as the API checks one (its syntax, its keys' and values' lengths)."""

    def parse(text: str) -> str:
        if (why := names.label_selector(text)) is not None:
            raise argparse.ArgumentTypeError(f"{why} (flag or {env})")
        return text

    return parse


def add_dra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dra-node-selector",
        type=selector_argument("DRA_NODE_SELECTOR"),
        default=os.environ.get("DRA_NODE_SELECTOR") or None,  # empty is unset, as elsewhere
        metavar="SELECTOR",
        help="publish the NVIDIA DRA driver's ResourceSlices for the GPU nodes whose labels "
        "match, e.g. type=kwok, '' for every GPU node (env DRA_NODE_SELECTOR; unset: DRA off)",
    )
    parser.add_argument(
        "--dra-dynamic-mig",
        action="store_true",
        default=env_switch("DRA_DYNAMIC_MIG"),
        help="as the driver's DynamicMIG gate: a MIG-capable GPU offers every profile at every "
        "placement, and the instances of the nodes' layouts are destroyed (env "
        "DRA_DYNAMIC_MIG=true)",
    )
    parser.add_argument(
        "--dra-slice-layout",
        choices=(SPLIT, COMBINED),
        default=os.environ.get("DRA_SLICE_LAYOUT") or SPLIT,
        help="DynamicMIG's slices as the driver lays them out on Kubernetes 1.35 and later "
        "(split: the counter sets in slices of their own) or on 1.34 (combined: each GPU's "
        "slice holds its counter set) (env DRA_SLICE_LAYOUT, default %(default)s)",
    )
    parser.add_argument(
        "--dra-list-type-attributes",
        action="store_true",
        default=env_switch("DRA_LIST_TYPE_ATTRIBUTES"),
        help="as the driver's DRAListTypeAttributes gate: numaNode as a one-element list "
        "(env DRA_LIST_TYPE_ATTRIBUTES=true)",
    )
    parser.add_argument(
        "--dra-consumable-shares",
        type=_consumable_shares,
        default=os.environ.get("DRA_CONSUMABLE_SHARES") or DISABLED,  # a string: parsed as given
        metavar="MODE",
        help="as the driver's --consumable-shares (its ConsumableShares gate): every device may "
        "be allocated to several claims, each consuming some of its memory; a claim without a "
        "request takes all of it (memory), none of it (unlimited), or none of it and 1 of N "
        "shares (a number N from 2) (env DRA_CONSUMABLE_SHARES, default %(default)s)",
    )


def add_claim_status_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dra-claim-status",
        action="store_true",
        default=env_switch("DRA_CLAIM_STATUS"),
        help="write each claim's devices with their uuids into its status.devices, as the "
        "driver's issue #1456 designs it, for an exporter to attribute DynamicMIG instances "
        "by (env DRA_CLAIM_STATUS=true)",
    )


@dataclass(frozen=True)
class DraOptions:
    selector_text: str  # "" selects every GPU node
    dynamic_mig: bool = False
    slice_layout: str = SPLIT
    list_attributes: bool = False
    claim_status: bool = False
    consumable_shares: str = DISABLED  # the driver's --consumable-shares

    @classmethod
    def of(cls, args: argparse.Namespace) -> DraOptions:
        return cls(
            selector_text=args.dra_node_selector or "",
            dynamic_mig=args.dra_dynamic_mig,
            slice_layout=args.dra_slice_layout,
            list_attributes=args.dra_list_type_attributes,
            claim_status=getattr(args, "dra_claim_status", False),  # `run`'s alone
            consumable_shares=args.dra_consumable_shares,
        )

    def slices(self) -> dict[str, Any]:
        """`resourceslices.node_slices`' keywords for these options (`shares` only where on:
        the slices and their templates' shapes are as before where it is off)."""
        found: dict[str, Any] = {"dynamic": self.dynamic_mig, "layout": self.slice_layout,
                                 "list_attributes": self.list_attributes}  # fmt: skip
        if self.consumable_shares != DISABLED:
            found["shares"] = self.consumable_shares
        return found

    def selector(self) -> selectors.Selector:
        """Whether a node's labels are selected (parsed once: the flag was checked already)."""
        return selectors.parse(self.selector_text)


SELECTED = "dra-selected"  # in a slim node: the DRA selector picks it (its ResourceSlices)
# In a slim node: its DRA driver runs DynamicMIG, which destroys the MIG devices it did not make
# at start (`DestroyUnknownMIGDevices`) and makes an instance for each partition a claim is given.
DYNAMIC = "dra-dynamic-mig"
# In a slim node: its DRA driver's --consumable-shares, where not disabled (placement reads N).
SHARES = "dra-consumable-shares"


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
            if options.dynamic_mig:
                found[DYNAMIC] = True
            if options.consumable_shares != DISABLED:
                found[SHARES] = options.consumable_shares
        return found

    return slim
