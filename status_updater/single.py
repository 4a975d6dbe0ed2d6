"""The single layout: one `topology` ConfigMap with every node (the original design).

Fine for small clusters: a ConfigMap holds 1 MiB, about 74 fully allocated 8-GPU nodes. Every
change rewrites the whole document, which each exporter then reads whole.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

import kubernetes
from kubernetes.client.exceptions import ApiException

from mig_exporter.kube.api import REQUEST_TIMEOUT, usable_version
from mig_exporter.kube.configmaps import Seen, create_or_patch
from status_updater.state import ClusterState
from topology import configmap as contract
from topology.errors import TopologyError
from topology.model import NodeTopology, Topology, dump_yaml, load_yaml

log = logging.getLogger(__name__)
ATTEMPTS = 5  # conflicts on one write before it fails (the next change or resync tries again)
CONFIGMAP_LIMIT = 1024 * 1024  # bytes of data a ConfigMap may hold
Read = tuple[bool, Topology | None, str | None]  # exists, its topology (None: invalid), version


class TooLarge(Exception):
    """The topology does not fit one ConfigMap."""


class SingleWriter:
    def __init__(self, core: kubernetes.client.CoreV1Api, name: str, namespace: str) -> None:
        self.core, self.name, self.namespace = core, name, namespace
        self.what = f"ConfigMap {namespace}/{name}"
        self.written: Topology | None = None  # what the ConfigMap holds, as far as we know

    def informers(self, stop: threading.Event, wake: Callable[[], None]) -> list[threading.Thread]:
        return []

    def ready(self) -> bool:
        return True

    def has_work(self) -> bool:
        return False  # it does not watch its ConfigMap: the resync compares it

    def leading(self, leading: bool) -> None:
        self.written = None  # the old leader may have written since: re-read before trusting

    def sync(self, state: ClusterState, changed: set[str], full: bool) -> None:
        try:
            read = None
            if self.written is None:
                # What the ConfigMap holds: a node that cannot be read keeps its entry from it.
                read = self.read_current()
                self.written = read[1] or Topology()
            topology = state.topology(previous=self.written)
            if topology != self.written or full:
                # Compares with the ConfigMap first (reusing that read), writes only if it differs.
                self.write(topology, read)
        except TooLarge as e:
            log.error("%s", e)  # retried when the next change comes, not in a loop
        except Exception:
            self.written = None
            raise

    def remembered(self) -> Mapping[str, NodeTopology]:
        return dict((self.read_current()[1] or Topology()).nodes)

    def read_current(self) -> Read:
        try:
            cm = self.core.read_namespaced_config_map(
                self.name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status == 404:
                return False, None, None
            raise
        version = usable_version(cm.metadata.resource_version if cm.metadata else None)
        text = (cm.data or {}).get(contract.DATA_KEY)
        try:
            return True, (load_yaml(text) if text else None), version
        except TopologyError as e:
            log.warning("%s holds an invalid topology, replacing it: %s", self.what, e)
            return True, None, version

    def write(self, topology: Topology, read: Read | None = None) -> None:
        """Create or merge-patch (never PUT) the ConfigMap at the version read (mig_exporter.kube.configmaps);
        a 409 or 404 reads it again and applies again.

        `read` is a `read_current()` the caller has just made, used for the first attempt.
        """
        text = dump_yaml(topology)
        size = len(text.encode())
        if size > CONFIGMAP_LIMIT:
            # The API server would refuse it (and keep refusing): say why, keep the last write.
            raise TooLarge(
                f"{self.what}: topology.yml for {len(topology.nodes)} nodes is "
                f"{size / 2**20:.1f} MiB, over the 1 MiB a ConfigMap holds; not written; "
                "use --layout per-node"
            )

        def seen(read: Read) -> Seen:
            exists, current, version = read
            return Seen(exists, version, done=current == topology)

        create = contract.configmap(text, self.name, self.namespace)
        patch = {"data": {contract.DATA_KEY: text}}
        if create_or_patch(
            self.core, self.namespace, self.name, create, patch,
            seen(read or self.read_current()), lambda: seen(self.read_current()), ATTEMPTS,
        ) is not None:  # fmt: skip
            log.info("wrote %s (%d nodes)", self.what, len(topology.nodes))
        self.written = topology
