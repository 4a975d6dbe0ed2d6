"""How the kubelet's device manager hands a pod's devices to its containers
(kubernetes/kubernetes `pkg/kubelet/cm/devicemanager/manager.go`, `Allocate` and
`devicesToAllocate`), for the policies that place device-plugin requests.

Containers go in the kubelet's order, the init containers first (`objects.containers`). Each gets
its count of each resource: first the devices the regular init containers before it were given
(they have ended by the time it starts, so theirs are reusable), then new ones. A regular init
container's devices stay reusable; a sidecar's (an init container with `restartPolicy: Always`:
it runs beside the app containers) and an app container's are its own, taken out of the reusable
ones. A pod thus holds, of each resource, the most any regular init container needs beside the
sidecars started before it, or its app containers' and sidecars' together if more (Kubernetes'
effective request), and each device is held by the last container given it: a device only a
regular init container had stays the pod's, held by it.

What a pod's containers held before comes back to them (`kept`), so that nothing moves while the
pod lives: a container takes its own first; a regular init container takes first the devices the
containers after it held, in their order, as those will reuse them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from typing import TypeVar

from status_updater.objects import INIT, Ask

T = TypeVar("T", bound=Hashable)
Rank = Callable[[T], int]  # a device's preference for one container: lower first
NOT_KEPT = 1 << 30  # the rank of a device no container of the pod held that this one would reuse
# (the container's ask, how many new devices, those the pod has already, its preference) ->
# that many new devices (raises TopologyError where there are not enough)
Take = Callable[[Ask, int, Collection[T], Rank[T]], list[T]]


def allocate(asks: Sequence[Ask], kept: Mapping[T, str], take: Take[T]) -> dict[T, Ask]:
    """Each device the pod's `asks` are given, and the container (its ask) that holds it. `kept`:
    the devices the pod held before, and which container held each."""
    order: dict[str, int] = {}
    for ask in asks:
        order.setdefault(ask.container, len(order))

    def rank_for(ask: Ask) -> Rank[T]:
        at = order[ask.container]

        def rank(device: T) -> int:
            held = kept.get(device)
            if held == ask.container:
                return 0
            if ask.kind == INIT and held is not None and order.get(held, -1) > at:
                return 1 + order[held]  # a later container's: it reuses what this one gets
            return NOT_KEPT

        return rank

    reusable: dict[str, dict[T, None]] = {}  # resource -> devices, in the order given
    holders: dict[T, Ask] = {}
    for ask in asks:
        rank = rank_for(ask)
        pool = reusable.setdefault(ask.resource, {})
        got = sorted(pool, key=rank)[: ask.count]
        if len(got) < ask.count:
            got += take(ask, ask.count - len(got), holders.keys(), rank)
        for device in got:
            holders[device] = ask
            if ask.kind == INIT:
                pool[device] = None
            else:
                pool.pop(device, None)
    return holders


def demand(asks: Sequence[Ask]) -> int:
    """How many devices `asks` (of one resource) take together: the pod's effective request."""
    made: list[int] = []

    def new(_ask: Ask, count: int, _have: Collection[int], _rank: Rank[int]) -> list[int]:
        made.extend(range(len(made), len(made) + count))
        return made[-count:]

    return len(allocate(asks, {}, new))
