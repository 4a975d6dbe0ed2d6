"""Each prepared claim's devices as the driver would say them (`--dra-claim-status`).

The NVIDIA DRA driver is to write, after it prepares a claim, each device's concrete identity into
the claim's `status.devices` (its issue #1456, after dra-example-driver #128; not in the driver's
code yet), which is how dcgm-exporter is to attribute a DynamicMIG instance: the slice's device
has no uuid. With `--dra-claim-status` the updater writes it as that design has it: for every
device a claim holds on a node DRA selects, `{driver, pool, device, conditions: [Ready],
data: {uuid}}`, the uuid the GPU's or its MIG instance's (for a partition, the instance made for
the claim). Entries of other drivers are kept. When the claim holds the device no more (released,
deallocated) its entry goes, as the driver clears it when it unprepares.

Written by a merge patch of the status subresource at the version just read, so another writer's
change is never lost (409: judged again at the next pass). What a claim's status says comes from
the claims informer (`ClusterState.claims_status`): a restart writes only what differs.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from mig_exporter.common.text import some_of
from mig_exporter.kube.api import PASS_S, REQUEST_TIMEOUT, describe, usable_version
from status_updater.claims import ClaimKey, DeviceSaid
from status_updater.dra import SELECTED
from status_updater.state import ClusterState
from topology import dra
from topology.model import DeviceStatus, NodeTopology

log = logging.getLogger(__name__)
Said = frozenset[DeviceSaid]  # (pool, device, uuid, shareID or "")


def held(state: ClusterState, node: str) -> dict[ClaimKey, set[DeviceSaid]]:
    """Per claim, the devices it holds on `node` if DRA selects it, with their uuids (and the
    share of each, where it is one of several claims sharing it)."""
    out: dict[ClaimKey, set[DeviceSaid]] = {}
    result, slim = state.results.get(node), state.nodes.get(node)
    if not isinstance(result, NodeTopology) or slim is None or not slim.get(SELECTED):
        return out
    for gpu in result.gpus:
        devices: list[tuple[DeviceStatus | None, str | None]] = [(gpu.status, gpu.id)]
        devices += [(m.status, m.id) for m in gpu.mig_devices or ()]
        for status, uuid in devices:
            for c in status.dra_claims if status and uuid else ():
                out.setdefault((c.claim_namespace, c.claim), set()).add(
                    (c.pool, c.device, str(uuid), c.share_id)
                )
    return out


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _entry(
    pool: str, device: str, uuid: str, share: str, before: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A device's status entry; its Ready condition keeps the time it became so. A shared
    device's names its share: the API requires the allocation's shareID on it."""
    since = None
    for c in (before or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True":
            since = c.get("lastTransitionTime")
    ready = {"type": "Ready", "status": "True", "reason": "Prepared",
             "message": "prepared by the simulated driver", "lastTransitionTime": since or _now()}  # fmt: skip
    return {"driver": dra.DRIVER, "pool": pool, "device": device,
            **({"shareID": share} if share else {}), "conditions": [ready],
            "data": {"uuid": uuid}}  # fmt: skip


class ClaimStatusWriter:
    """Keeps the claims' `status.devices` as `held` says; only the leader writes (the writers'
    `sync`)."""

    what = "ResourceClaim status"

    def __init__(self, api: kubernetes.client.ResourceV1Api) -> None:
        self.api = api
        self._written: dict[ClaimKey, Said] = {}  # what each claim was last written, until a resync
        # The claims each node's devices hold (nodes holding none left out): made again for the
        # nodes whose placement changed, not for every node at every pass.
        self._by_node: dict[str, dict[ClaimKey, set[DeviceSaid]]] = {}
        self._said: dict[ClaimKey, str] = {}  # the problem last said about a claim
        self._wrote: list[str] = []
        # A pass writes for at most `pass_s` (at least one claim), as the other writers: the
        # controller looks at the Lease between passes. Whether the last pass left claims.
        self.pass_s = PASS_S
        self.left = False

    def sync(self, state: ClusterState, changed: Iterable[str], full: bool) -> None:
        if full:
            self._written = {}  # someone may have changed one since: compare everything
            self._by_node = {}
        for node in state.results if full else changed:
            if found := held(state, node):
                self._by_node[node] = found
            else:
                self._by_node.pop(node, None)
        gathered: dict[ClaimKey, set[DeviceSaid]] = {}
        for found in self._by_node.values():
            for key, devices in found.items():
                gathered.setdefault(key, set()).update(devices)
        wanted = {key: frozenset(devices) for key, devices in gathered.items()}
        deadline = time.monotonic() + self.pass_s
        self.left = False
        try:
            for key in sorted(set(wanted) | set(state.claims_status)):
                want = wanted.get(key, frozenset())
                if want == state.claims_status.get(key, frozenset()):
                    self._written.pop(key, None)
                    continue
                if self._written.get(key) == want:
                    continue  # written: the watch has not shown it yet
                if time.monotonic() > deadline:
                    self.left = True  # the rest at the next pass, after the Lease is looked at
                    return
                self._write(key, want)
        finally:
            if self._wrote:
                log.info("wrote the status of ResourceClaim%s %s",
                         "s" if len(self._wrote) > 1 else "", some_of(self._wrote))  # fmt: skip
                self._wrote.clear()

    def _write(self, key: ClaimKey, want: Said) -> None:
        namespace, name = key
        try:
            response = self.api.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
            claim = json.loads(cast(Any, response).data)
            status = claim.get("status") if isinstance(claim.get("status"), Mapping) else {}
            current = [d for d in status.get("devices") or () if isinstance(d, Mapping)]
            ours = {(d.get("pool"), d.get("device"), d.get("shareID") or ""): d for d in current
                    if d.get("driver") == dra.DRIVER}  # fmt: skip
            devices = [d for d in current if d.get("driver") != dra.DRIVER]
            devices += [_entry(p, d, u, s, ours.get((p, d, s))) for p, d, u, s in sorted(want)]
            version = usable_version((claim.get("metadata") or {}).get("resourceVersion"))
            meta = {"resourceVersion": version} if version else {}
            self.api.patch_namespaced_resource_claim_status(
                name,
                namespace,
                cast(Any, {"metadata": meta, "status": {"devices": devices}}),
                _content_type="application/merge-patch+json",
                _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as e:
            if e.status in (404, 409):
                return  # gone, or changed since it was read: judged again at the next pass
            if e.status is None or not 400 <= e.status < 500 or e.status == 429:
                raise
            why = describe(e)  # refused (invalid, forbidden): its problem, not the others'
            if self._said.get(key) != why:
                log.warning("ResourceClaim %s/%s: status not written: %s", namespace, name, why)
                self._said[key] = why
            self._written[key] = want  # not again until a resync
            return
        self._said.pop(key, None)
        self._written[key] = want
        self._wrote.append(f"{namespace}/{name}")
