"""Leader election on a coordination.k8s.io/v1 Lease, so two replicas never both write.

Only create, get and patch are used (no PUT): a patch carrying the Lease's resourceVersion is
refused with 409 when another replica got there first, which is the whole protocol.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from mig_exporter.kube.api import TRANSIENT, Said, describe, failure_kind, usable_version
from mig_exporter.kube.times import parse_time

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """client-go's leader election timing (its defaults): a leader that has not renewed for
    `renew_deadline_s` stops writing, well before another replica may take the Lease
    (`lease_duration_s` after its last renewal); it tries every `retry_period_s`, and a try may
    take all the time left before the renew deadline, however slowly the API answers."""

    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def problem(self) -> str | None:
        """What client-go refuses (`NewLeaderElector`), as one line; None when usable."""
        if not self.lease_duration_s > self.renew_deadline_s:
            return "--lease-duration must be greater than --renew-deadline"
        if not self.renew_deadline_s > 1.2 * self.retry_period_s:  # client-go's JitterFactor
            return "--renew-deadline must be greater than 1.2 x --retry-period"
        if self.retry_period_s <= 0:
            return "--retry-period must be greater than 0"
        return None


CLIENT_GO = Timing()
MIN_CALL_S = 0.5  # a call is given at least this long, even just before the deadline
# Answers to a Lease request that another try will not change by itself: a request the API
# refuses (a bad name: 422), no permission, no such namespace.
REFUSED = frozenset({400, 401, 403, 404, 422})


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _micro_time(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: kubernetes.client.CoordinationV1Api,
        name: str,
        namespace: str,
        identity: str,
        on_change: Callable[[bool], None] = lambda leading: None,
        timing: Timing = CLIENT_GO,
    ) -> None:
        self.api, self.name, self.namespace, self.identity = api, name, namespace, identity
        self.on_change = on_change
        self.timing = timing
        self.duration_s = round(timing.lease_duration_s)
        self._deadline = 0.0  # monotonic: when the try under way must have ended
        self.leading = threading.Event()
        self._lock = threading.Lock()  # one lease call at a time; release waits for a renewal
        self._released = False
        self.turned = time.monotonic()  # when its loop last began a turn
        # The failing tries' last reason, since when, and whether the API refused the Lease.
        self._failing: tuple[str, float, bool] | None = None
        self._said = Said(log)  # each kind of failure said once

    def is_leader(self) -> bool:
        # A leader whose round of tries did not renew by its deadline must assume another
        # replica is about to take over (client-go's renew loop gives up then).
        if self.leading.is_set() and time.monotonic() > self._deadline:
            self._set(False)
        return self.leading.is_set()

    def _set(self, leading: bool) -> None:
        if leading != self.leading.is_set():
            (self.leading.set if leading else self.leading.clear)()
            log.info(
                "%s leadership of lease %s/%s",
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
            )
            self.on_change(leading)

    def _body(self, resource_version: str | None, acquire: bool) -> dict[str, Any]:
        now = _micro_time(_now())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration_s,
            "renewTime": now,
        }
        if acquire:
            spec["acquireTime"] = now
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    def _timeout(self) -> tuple[float, float]:
        """(connect, read) for one call of this try: whatever is left before its deadline."""
        left = max(MIN_CALL_S, self._deadline - time.monotonic())
        return (left, left)

    def try_acquire_or_renew(self) -> bool:
        if self._deadline <= time.monotonic():  # a try not started by `run` (tests)
            self._deadline = time.monotonic() + self.timing.renew_deadline_s
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout()
            )
        except ApiException as e:
            if e.status != 404:
                raise
            try:
                self.api.create_namespaced_lease(
                    self.namespace,
                    cast(Any, self._body(None, True)),
                    _request_timeout=self._timeout(),
                )
            except ApiException as e2:
                if e2.status == 409:
                    return False  # another replica created it first
                raise
            return True
        spec = lease.spec
        holder = spec.holder_identity if spec else None
        renewed = parse_time(spec.renew_time if spec else None)
        duration = (spec.lease_duration_seconds if spec else None) or self.duration_s
        expired = renewed is None or _now() - renewed > dt.timedelta(seconds=duration)
        if holder and holder != self.identity and not expired:
            return False
        version = usable_version(lease.metadata.resource_version if lease.metadata else None)
        try:
            self.api.patch_namespaced_lease(
                self.name,
                self.namespace,
                self._body(version, holder != self.identity),
                _request_timeout=self._timeout(),
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        return True

    def run(self, stop: threading.Event) -> None:
        """client-go's loop: a round of tries, one every retry period, each try given what is
        left of the round's renew deadline (however slowly the API answers), the round over
        when one succeeds; a leader whose round ends without one stops leading."""
        in_round = False
        while not stop.is_set():
            self.turned = time.monotonic()  # alive and turning (daemon._stuck)
            if in_round and not self.leading.is_set() and time.monotonic() > self._deadline:
                in_round = False  # a candidate's round ran out: the next try starts another
            if not in_round:
                self._deadline = time.monotonic() + self.timing.renew_deadline_s
                in_round = True
            try:
                with self._lock:
                    if self._released:
                        return
                    won = self.try_acquire_or_renew()
                in_round = False
                if won:
                    # Leading until the next round's deadline at the latest.
                    self._deadline = time.monotonic() + sum(
                        (self.timing.retry_period_s, self.timing.renew_deadline_s)
                    )
                    self._set(True)
                else:
                    self._set(False)  # another replica holds it
            except Exception as e:  # API trouble, or a malformed Lease: keep trying
                self._failed(e)
                self.is_leader()  # drops leadership once the round's deadline has passed
            else:
                self._failing = None
                self._said.ok()
            stop.wait(self.timing.retry_period_s)

    def _failed(self, e: Exception) -> None:
        """A try failed: said when it is another kind of failure, not at every retry."""
        reason = f"lease {self.namespace}/{self.name}: {describe(e)}"
        since = self._failing[1] if self._failing is not None else time.monotonic()
        self._said.failed(reason, e)
        self._failing = (reason, since, failure_kind(e) in REFUSED)

    def trouble(self) -> str | None:
        """Why this replica cannot take part in the election, for `/health`: the API refuses the
        Lease (a name it will not take, no permission), or every try failed for a whole round.
        A replica that waits while another leads is healthy."""
        failing = self._failing
        if failing is None:
            return None
        reason, since, refused = failing
        if refused or time.monotonic() - since >= self.timing.renew_deadline_s:
            return f"{reason}; not taking part in the election"
        return None

    def release(self) -> None:
        """On shutdown: let a standby replica take over at once instead of after the lease runs out.

        Only this replica's own Lease is cleared (the patch carries its resourceVersion), and no
        renewal runs after it.
        """
        with self._lock:
            self._released = True
            if not self.leading.is_set():
                return
            self._set(False)
            try:
                lease = self.api.read_namespaced_lease(
                    self.name, self.namespace, _request_timeout=(0.5, 0.5)
                )
                if lease.spec is None or lease.spec.holder_identity != self.identity:
                    return
                meta: dict[str, Any] = {}
                version = usable_version(
                    lease.metadata.resource_version if lease.metadata else None
                )
                if version:
                    meta["resourceVersion"] = version
                self.api.patch_namespaced_lease(
                    self.name,
                    self.namespace,
                    {"metadata": meta, "spec": {"holderIdentity": None, "renewTime": None}},
                    _request_timeout=(0.5, 0.5),
                )
            except TRANSIENT as e:
                log.warning("lease %s/%s not released: %s", self.namespace, self.name, describe(e))
