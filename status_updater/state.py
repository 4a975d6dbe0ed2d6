"""The cluster as reconcile sees it, kept incrementally: an event costs O(its node), not O(cluster).

Objects go in as they come (informer events, or every object of `render`'s files); `settle()`
recomputes only the nodes they touched and says which nodes' results changed. A node's result is
a pure function of its Node, its Pods, the mig-parted layouts and its last result
(`reconcile.reconcile_node`), plus one cluster-wide rule kept in an index: a GPU or MIG id belongs to one node. Where two nodes claim
one id, the oldest Node (then the name that sorts first) keeps it and the other is a bad node, so
the outcome does not depend on the order events arrived in. Where a pod's annotation gave the id,
only that device loses it.

It holds slim objects only (`objects.slim_node`, `objects.slim_pod`): the informers slim each
object as it arrives, and `ClusterState.of` slims what `render` read.

Pure: no I/O, no threads. The controller calls it from one thread.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from status_updater import claims as dra_claims
from status_updater import faults
from status_updater.devices import build_node
from status_updater.ids import claim_ignored, device_ids, id_set, without_id
from status_updater.objects import (
    DRA_REFS,
    Obj,
    is_gpu_node,
    may_hold_gpu,
    node_created,
    node_labels,
    node_name,
    node_strategy,
    node_uid,
    pod_key,
    pod_node,
    pod_uid,
    slim_node,
    slim_pod,
    static_layout,
)
from status_updater.reconcile import reconcile_node
from topology import migparted
from topology.errors import TopologyError
from topology.faults import NO_SCHEDULE, Taint
from topology.model import NodeTopology, Topology


@dataclass(frozen=True)
class Unreadable:
    """A GPU node whose objects cannot be turned into a topology: it keeps what it had."""

    reason: TopologyError


NodeResult = NodeTopology | Unreadable


class ClusterState:
    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}  # GPU nodes, slimmed
        # devices before pods, with the node's warnings; or why the node is unusable
        self._built: dict[str, tuple[NodeTopology, list[TopologyError]] | TopologyError] = {}
        self.layouts: migparted.Layouts = migparted.builtin()  # what static-MIG labels name
        self.pods: dict[str, dict[str, Obj]] = {}  # node name -> pod key -> slimmed pod
        self._pod_node: dict[str, str] = {}  # pod key -> node name
        self._computed: dict[str, NodeResult] = {}  # before the cluster-wide id rule
        # Each node's last placement: its pods keep what they hold there (placement.kept).
        # From the updater's own results, or, after a restart, from what it wrote (`remember`).
        self._placed: dict[str, NodeTopology] = {}
        self.results: dict[str, NodeResult] = {}  # what each GPU node's entry should be
        self.warnings: dict[str, list[TopologyError]] = {}  # per node, from its last compute
        # The nodes the last settle() computed again: those it returns, and those whose result
        # stayed the same.
        self.reconsidered: set[str] = set()
        # id -> the node whose devices carry it, or the nodes (a set) where several do. A set
        # only where it is needed: a big cluster has hundreds of thousands of ids.
        self._claims: dict[str, str | set[str]] = {}
        self._node_ids: dict[str, frozenset[str]] = {}
        self._id_warnings: dict[str, list[TopologyError]] = {}  # ids a pod claimed wrongly
        # The ids each node's own objects give (`_own_ids`), computed once per build: the id rule
        # asks for them for every claimant of every id claimed twice.
        self._own: dict[str, frozenset[str]] = {}
        self.claims: dict[dra_claims.ClaimKey, dra_claims.Claim] = {}  # allocated DRA claims
        # What claims' `status.devices` say of the driver's devices (`Claim.devices_status`).
        self.claims_status: dict[dra_claims.ClaimKey, frozenset[dra_claims.DeviceSaid]] = {}
        self._claim_users: dict[dra_claims.ClaimKey, set[str]] = {}  # -> keys of pods using it
        self._strategies: Counter[str | None] = Counter()
        self._rebuild: set[str] = set()  # Node changed: devices and allocations
        self._stale: set[str] = set()  # Pods changed: allocations
        # The time faults are judged at (a fault's start without one, a cleared fault's counts,
        # the taints): the controller's clock at each settle, `render`'s --now.
        self.now = 0.0
        self.policies: dict[str, faults.Policy] = {}  # fleet fault policies, by name
        self._policies_changed: set[str] = set()  # to be evaluated again at the next settle
        self.hits: dict[str, dict[str, list[faults.Entry]]] = {}  # policy -> node -> its GPUs hit
        self._node_hits: dict[str, list[faults.Entry]] = {}  # node -> every policy's hits
        self.hits_changed: set[str] = set()  # policies whose hits the last settles changed
        self._changes: list[tuple[int, str]] = []  # (when a node's faults begin or end, node)
        self._next_change: dict[str, int] = {}  # each node's in _changes: one entry a node
        self.dra_options: dict[str, Any] = {}  # render --resource-slices: node_slices' options

    # --- objects in ----------------------------------------------------------------------------

    def set_node(self, node: Obj) -> None:
        """A slim Node (`objects.slim_node`), kept as it is."""
        name = node_name(node)
        if not is_gpu_node(node):
            # Its GPU labels went (GPU feature discovery restarting takes them off and puts them
            # back): no GPU node now, but the Node is there, and its pods keep their devices
            # (its last placement) for when the labels return.
            self._drop_node(name)
            return
        old = self.nodes.get(name)
        if old == node:
            return  # a heartbeat or status update: nothing reconcile reads
        if old is not None:
            self._strategies[node_strategy(old)] -= 1
        self._strategies[node_strategy(node)] += 1
        self.nodes[name] = node
        self._rebuild.add(name)

    def set_layouts(self, layouts: migparted.Layouts) -> None:
        """The mig-parted layouts changed (the GPU operator's ConfigMap): every static-MIG node
        is rebuilt at the next settle."""
        if layouts == self.layouts:
            return
        self.layouts = layouts
        self._rebuild.update(n for n, node in self.nodes.items() if static_layout(node))

    def set_policy(self, policy: faults.Policy) -> None:
        """A fault policy, new or changed: its hits are worked out at the next settle."""
        if self.policies.get(policy.name) != policy:
            self.policies[policy.name] = policy
            self._policies_changed.add(policy.name)

    def delete_policy(self, name: str) -> None:
        if self.policies.pop(name, None) is not None:
            self._policies_changed.add(name)

    def _evaluate_policies(self, rebuilt: set[str]) -> None:
        """Each changed policy's hits again, and every policy's on nodes built again (a
        `count` policy's over all nodes: a node that comes or goes changes its ranking)."""
        if not (self._policies_changed or (rebuilt and self.policies)):
            return
        every: faults.Nodes | None = None  # every GPU node's, made only where a policy needs it
        touched: set[str] = set()
        for name in sorted(self._policies_changed | set(self.policies)):
            policy = self.policies.get(name)
            old = self.hits.get(name, {})
            if policy is None:
                new: dict[str, list[faults.Entry]] = {}
            elif name in self._policies_changed or policy.count is not None:
                every = self._gpu_nodes(self.nodes) if every is None else every
                new = faults.hits(policy, every)
            else:  # a fraction: each node's GPUs are drawn on their own
                new = {n: e for n, e in old.items() if n not in rebuilt}
                new.update(faults.hits(policy, self._gpu_nodes(rebuilt)))
            if name in self._policies_changed and policy is not None:
                self.hits_changed.add(name)  # its status says so even where it hits nothing
            if new == old:
                continue
            self.hits_changed.add(name)
            touched |= {n for n in new.keys() | old.keys() if new.get(n) != old.get(n)}
            if new:
                self.hits[name] = new
            else:
                self.hits.pop(name, None)
        self._policies_changed.clear()
        for node in touched:
            found = [e for p in sorted(self.hits) for e in self.hits[p].get(node, ())]
            if found:
                self._node_hits[node] = found
            else:
                self._node_hits.pop(node, None)
        self._stale |= touched

    def _gpu_nodes(self, names: Iterable[str]) -> faults.Nodes:
        """What a policy picks these GPU nodes by: their labels and GPU count."""
        return {
            name: (node_labels(self.nodes[name]), len(built[0].gpus))
            for name in names
            if isinstance(built := self._built.get(name), tuple) and name in self.nodes
        }

    def due(self, now: float) -> set[str]:
        """The nodes a fault of which began or ended by `now` (their taints change), now
        judged at `now`."""
        self.now = now
        found: set[str] = set()
        while self._changes and self._changes[0][0] <= now:
            at, name = heapq.heappop(self._changes)
            if self._next_change.get(name) == at:  # not one a later change replaced
                del self._next_change[name]
                found.add(name)
        for name in found:
            self._watch_changes(name)
        return found

    def _watch_changes(self, name: str) -> None:
        """Wake for the node's next fault boundary (one entry a node: a busy node's settles
        never pile them up)."""
        result = self.results.get(name)
        at = faults.next_change(result, self.now) if isinstance(result, NodeTopology) else None
        if at is None:
            self._next_change.pop(name, None)
        elif self._next_change.get(name) != at:
            self._next_change[name] = at
            heapq.heappush(self._changes, (at, name))

    def taints(self, name: str) -> tuple[tuple[Taint, ...], ...]:
        """Each GPU's device taints (as the DRA driver's health check sets them) at `now`."""
        result = self.results.get(name)
        if not isinstance(result, NodeTopology):
            return ()
        return faults.node_taints(result, self.now)

    def unhealthy(self, name: str) -> int:
        """How many of the node's GPUs a device plugin would mark unhealthy at `now`: those the
        DRA driver keeps claims off (a NoSchedule taint: an Xid it does not skip, a lost GPU),
        as NVIDIA's device plugin skips the same Xids."""
        return sum(any(t.effect == NO_SCHEDULE for t in gpu) for gpu in self.taints(name))

    def remember(self, placed: Mapping[str, NodeTopology]) -> None:
        """What the updater wrote for these nodes (read back after a restart, or from another
        leader): their pods keep those devices. Applied at the next settle."""
        for name, node in placed.items():
            if self._placed.get(name) != node:
                self._placed[name] = node
                self._stale.add(name)

    def delete_node(self, name: str) -> None:
        """The Node is gone: with it, what its pods held."""
        self._placed.pop(name, None)
        self._drop_node(name)

    def _drop_node(self, name: str) -> None:
        old = self.nodes.pop(name, None)
        if old is not None:
            self._strategies[node_strategy(old)] -= 1
            self._built.pop(name, None)
            self._own.pop(name, None)
            self._rebuild.add(name)

    def set_pod(self, pod: Obj) -> None:
        """A slim Pod (`objects.slim_pod`), kept as it is."""
        key = pod_key(pod)
        if not may_hold_gpu(pod):
            self.delete_pod(key)
            return
        target = str(pod_node(pod))
        before = self._pod_node.get(key)
        if before == target and self.pods[target].get(key) == pod:
            return
        if before is not None and before != target:
            self.delete_pod(key)
        elif before is not None:
            self._use_claims(key, self.pods[target][key], -1)
        self.pods.setdefault(target, {})[key] = pod
        self._pod_node[key] = target
        self._use_claims(key, pod, +1)
        self._stale.add(target)

    def delete_pod(self, key: str) -> None:
        node = self._pod_node.pop(key, None)
        if node is None:
            return
        on_node = self.pods[node]
        self._use_claims(key, on_node.pop(key), -1)
        if not on_node:
            del self.pods[node]
        self._stale.add(node)

    def _use_claims(self, key: str, pod: Obj, change: int) -> None:
        """Index which pods use which claim: a claim's change re-places their nodes only."""
        if DRA_REFS not in pod:
            return
        for claim in dra_claims.used(pod):
            users = self._claim_users.setdefault(claim, set())
            if change > 0:
                users.add(key)
            else:
                users.discard(key)
                if not users:
                    del self._claim_users[claim]

    def set_claim(self, claim: dra_claims.Claim) -> None:
        """A ResourceClaim as `claims.read_claim` reads it; one holding no device of the driver
        (not allocated yet, or released) is as if it were not there."""
        if not claim.allocations:
            self.delete_claim(claim.key)
        elif self.claims.get(claim.key) != claim:
            self.claims[claim.key] = claim
            self._claim_changed(claim.key)
        if claim.devices_status:  # kept while it says something, allocated or not
            self.claims_status[claim.key] = claim.devices_status

    def delete_claim(self, key: dra_claims.ClaimKey) -> None:
        self.claims_status.pop(key, None)
        if self.claims.pop(key, None) is not None:
            self._claim_changed(key)

    def _claim_changed(self, key: dra_claims.ClaimKey) -> None:
        for pod in self._claim_users.get(key, ()):
            self._stale.add(self._pod_node[pod])

    def reset_claims(self, claims: Iterable[dra_claims.Claim]) -> None:
        seen = set()
        for claim in claims:
            seen.add(claim.key)
            self.set_claim(claim)
        for key in set(self.claims) - seen:
            self.delete_claim(key)

    def reset_nodes(self, nodes: Iterable[Obj]) -> None:
        """The full list (first sync, or after 410 Gone): only real differences cost anything."""
        seen = set()
        for node in nodes:
            seen.add(node_name(node))
            self.set_node(node)
        # A Node missing from the list is gone, also one whose GPU labels had gone before.
        for name in (self.nodes.keys() | self._placed.keys()) - seen:
            self.delete_node(name)

    def reset_pods(self, pods: Iterable[Obj]) -> None:
        seen = set()
        for pod in pods:
            seen.add(pod_key(pod))
            self.set_pod(pod)
        for key in set(self._pod_node) - seen:
            self.delete_pod(key)

    # --- results out ---------------------------------------------------------------------------

    def settle(self) -> set[str]:
        """Recompute what changed since the last call; the names of nodes whose result changed
        (a node that is gone, or is no GPU node any more, is among them and has no result)."""
        recheck: set[str] = set()
        rebuilt = set(self._rebuild)  # a Node change counts even if its devices stay the same
        touched = rebuilt | self._stale
        for name in rebuilt:
            self._own.pop(name, None)
            if name in self.nodes:
                found: list[TopologyError] = []
                try:
                    topo = build_node(self.nodes[name], self.layouts, found)
                    self._built[name] = (topo, found)
                except TopologyError as e:
                    self._built[name] = e
                except Exception as e:  # the last guard: one odd object never stops the rest
                    self._built[name] = TopologyError(
                        f"node {name}", "?", f"cannot be read: {type(e).__name__}: {e}"
                    )
        self._evaluate_policies(rebuilt)
        touched = rebuilt | self._stale
        for name in touched:
            recheck |= self._compute(name)
        self._rebuild.clear()
        self._stale.clear()
        # Their warnings may have changed with the same result: a pod that cannot be placed.
        self.reconsidered = touched | recheck
        changed = {name for name in rebuilt if name in self.nodes}  # never O(cluster)
        for name in self.reconsidered:
            result = self._judge(name)
            if self.results.get(name) != result:
                changed.add(name)
                if result is None:
                    del self.results[name]
                else:
                    self.results[name] = result
                    self._watch_changes(name)
        return changed

    def _compute(self, name: str) -> set[str]:
        """Recompute one node; returns the other nodes whose id claims it may have changed."""
        built = self._built.get(name)
        warnings: list[TopologyError] = []
        result: NodeResult | None
        if built is None:
            result = None  # no such GPU node (yet): its pods wait for it
        elif isinstance(built, TopologyError):
            result = Unreadable(built)
            warnings.append(built)
        else:
            pods = list(self.pods.get(name, {}).values())
            previous = self._placed.get(name)
            result, warnings = reconcile_node(
                self.nodes[name], pods, previous=previous, built=built, holds=self._holds(pods)
            )
            entries = faults.node_entries(self.nodes[name], result.gpus, warnings)
            entries += self._node_hits.get(name, ())
            result = faults.apply(result, entries, previous, self.now)
            self._placed[name] = result
        self.warnings[name] = warnings
        if result is None:
            self._computed.pop(name, None)
            self.warnings.pop(name)
        else:
            self._computed[name] = result
        ids = id_set(result) if isinstance(result, NodeTopology) else frozenset()
        old = self._node_ids.get(name, frozenset())
        if ids == old:
            return set()
        if ids:
            self._node_ids[name] = ids
        else:
            self._node_ids.pop(name, None)
        affected: set[str] = set()
        for uid in old - ids:
            claimants = self._claimants(uid) - {name}
            affected |= claimants
            self._set_claimants(uid, claimants)
        for uid in ids - old:
            claimants = self._claimants(uid)
            affected |= claimants
            self._set_claimants(uid, claimants | {name})
        return affected

    def _holds(self, pods: Iterable[Obj]) -> dra_claims.PodHolds:
        """The devices the pods' DRA claims hold, by pod uid (for the `dra` placement policy):
        joined here, before placement, from the claims the state keeps."""
        found = {}
        for pod in pods:
            if DRA_REFS in pod and (held := dra_claims.holds(pod, self.claims)):
                found[pod_uid(pod)] = held
        return found

    def _claimants(self, uid: str) -> set[str]:
        found = self._claims.get(uid)
        return set() if found is None else {found} if isinstance(found, str) else set(found)

    def _set_claimants(self, uid: str, nodes: set[str]) -> None:
        if not nodes:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = next(iter(nodes)) if len(nodes) == 1 else nodes

    def _judge(self, name: str) -> NodeResult | None:
        self._id_warnings.pop(name, None)
        computed = self._computed.get(name)
        if not isinstance(computed, NodeTopology):
            return computed
        if not any(isinstance(self._claims.get(uid), set) for uid in self._node_ids.get(name, ())):
            return computed  # no id of this node is claimed twice: the common case, O(ids)
        own = self._own_ids(name)
        result = computed
        for field, uid in device_ids(computed):
            owner = self._owner(uid)
            if owner == name:
                continue
            if uid not in own:
                # A pod's annotation named it (the mapping had not): the pod's claim is wrong,
                # not the node; the device stays, without that id.
                self._id_warnings.setdefault(name, []).append(claim_ignored(result, uid, owner))
                result = without_id(result, uid)
                continue
            return Unreadable(
                TopologyError(f"node {name}", field, f"duplicate id {uid} (also node {owner})")
            )
        return result

    def _own_ids(self, name: str) -> frozenset[str]:
        """The ids a node's own objects give its devices (before any pod's annotation)."""
        own = self._own.get(name)
        if own is None:
            built = self._built.get(name)
            own = self._own[name] = id_set(built[0]) if isinstance(built, tuple) else frozenset()
        return own

    def _owner(self, uid: str) -> str:
        """Of the nodes claiming an id, the one that keeps it: one whose own objects give it
        (a pod's annotation never takes an id from the node it belongs to), then the oldest
        Node, then the first name. A Node created to claim another's ids is newer, so it never
        takes them; and the outcome is the same in whatever order the events came."""
        claimants = self._claimants(uid)
        by_node = {n for n in claimants if uid in self._own_ids(n)}
        return min(by_node or claimants, key=lambda n: (node_created(self.nodes[n]), n))

    def strategy(self) -> str:
        """The MIG strategy the GPU nodes are labelled with (the most common; `none` unlabelled)."""
        counts = [(n, s) for s, n in self._strategies.items() if s is not None and n > 0]
        if not counts:
            return "none"
        return min(counts, key=lambda ns: (-ns[0], ns[1]))[1] or "none"

    def node_strategy(self, name: str) -> str | None:
        node = self.nodes.get(name)
        return node_strategy(node) if node is not None else None

    def devices(self, name: str) -> NodeTopology | TopologyError | None:
        """A GPU node's devices before its pods are placed (what it offers: its DRA slices), why
        they cannot be read, or None for no such GPU node. As of the last settle."""
        built = self._built.get(name)
        return built[0] if isinstance(built, tuple) else built

    def node_uid(self, name: str) -> str | None:
        node = self.nodes.get(name)
        return node_uid(node) if node is not None else None

    def node_warnings(self, name: str) -> list[TopologyError]:
        """The node's own problems and its pods', then the cluster-wide id rule's verdict."""
        # Once each: a pod's bad annotation is met again for each device it holds.
        found = list(
            dict.fromkeys([*self.warnings.get(name, ()), *self._id_warnings.get(name, ())])
        )
        result = self.results.get(name)
        if isinstance(result, Unreadable) and result.reason not in found:
            found.append(result.reason)
        return found

    def topology(self, previous: Topology | None = None) -> Topology:
        """The whole cluster as one document (the single layout).

        An unreadable node keeps its entry from `previous` (the last written topology) or is left
        out (offline render), never taking other nodes with it.
        """
        nodes: dict[str, NodeTopology] = {}
        for name in sorted(self.results):
            result = self.results[name]
            if isinstance(result, NodeTopology):
                nodes[name] = result
            elif previous is not None and name in previous.nodes:
                nodes[name] = previous.nodes[name]
        return Topology(mig_strategy=self.strategy(), nodes=nodes)

    def all_warnings(self) -> list[TopologyError]:
        return [w for name in sorted(self.results) for w in self.node_warnings(name)]

    @classmethod
    def of(
        cls,
        nodes: Iterable[Obj],
        pods: Iterable[Obj],
        layouts: migparted.Layouts | None = None,
        claims: Iterable[Obj] = (),
        slim: Callable[[Obj], dict[str, Any]] = slim_node,
        slim_pods: Callable[[Obj], dict[str, Any]] = slim_pod,
        *,
        policies: Iterable[faults.Policy] = (),
        now: float = 0.0,
    ) -> ClusterState:
        """The settled state of these objects as the API or a file shows them (what `render`
        and the tests start from); `claims`, the DRA ResourceClaims the pods may use; `slim`,
        what the Node informer keeps of a Node (`dra.node_slimmer`); `slim_pods`, of a Pod
        (`objects.pod_slimmer`)."""
        state = cls()
        state.now = now
        for policy in policies:
            state.set_policy(policy)
        if layouts is not None:
            state.layouts = layouts
        state.reset_claims(map(dra_claims.read_claim, claims))
        state.reset_nodes(map(slim, nodes))
        state.reset_pods(map(slim_pods, pods))
        state.settle()
        return state


def reconcile(
    nodes: Iterable[Obj], pods: Iterable[Obj], previous: Topology | None = None
) -> tuple[Topology, list[TopologyError]]:
    """The whole cluster's topology for these objects, and the problems found on the way."""
    state = ClusterState.of(nodes, pods)
    return state.topology(previous), state.all_warnings()
