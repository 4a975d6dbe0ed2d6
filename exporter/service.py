"""The node's own exporter: the many-nodes exporter with its selection fixed to one node.

It serves the node's last good entry, rendered as `ServedNodes` renders any node (again only on a
change, or on a new step when its values move in time), with `Hostname` the exporter's own
(`--hostname`), as dcgm-exporter's. A bad update never replaces the last good node: it only turns
`/health` to 503 with the reason, one problem at a time (`OneNode`, its sink).
"""

from __future__ import annotations

from collections.abc import Callable

from exporter import dcgm
from exporter.health import Health
from exporter.many import ServedNodes
from exporter.node import KEY, OneNode
from mig_exporter.web.server import Published
from topology.model import NodeTopology


class Exporter(ServedNodes):
    """Feeds topology updates in (`sink`), publishes rendered `/metrics` bytes out."""

    def __init__(
        self,
        node_name: str,
        options: dcgm.Options,
        published: Published,
        clock: Callable[[], float] | None = None,
    ) -> None:
        health = Health({KEY: "no topology yet"})
        # The node's GPUs are few and stay while the pod runs: one missing from an update for a
        # while (a document short of it) counts on from where it was when it is back. Its
        # `Hostname` is the exporter's own. One problem at a time, the latest: a source that
        # ended says so until the node is good.
        super().__init__(options, published, health, clock, {node_name},
                         forgets_gone_gpus=False, own_hostname=True, stopped_key=KEY)  # fmt: skip
        self.node_name = node_name
        self.sink = OneNode(node_name, health, self.wake, self.take,
                            keeps="serving the last good topology",
                            good_again=f"topology for node {node_name} is good")  # fmt: skip

    def take(self, node: NodeTopology) -> None:
        with self._lock:
            self._put(self.node_name, node)

    def _ready(self) -> bool:
        return bool(self._nodes)  # never served a node: nothing true to say yet
