"""The claims' status writer works in passes of bounded time, as the other writers: a leader with
thousands of claims to write looks at the Lease between passes."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from status_updater import claimstatus
from status_updater.claimstatus import ClaimStatusWriter


@dataclass
class Response:
    data: bytes


@dataclass
class SlowResource:
    """ResourceClaims in memory, each write answered after `delay` seconds."""

    delay: float = 0.02
    statuses: dict[tuple[str, str], list[Any]] = field(default_factory=dict)
    writes: int = 0

    def read_namespaced_resource_claim(self, name: str, namespace: str, **kw: Any) -> Response:
        status = {"devices": self.statuses.get((namespace, name), [])}
        return Response(json.dumps({"metadata": {"name": name}, "status": status}).encode())

    def patch_namespaced_resource_claim_status(
        self, name: str, namespace: str, body: Any, **kw: Any
    ) -> None:
        threading.Event().wait(self.delay)
        self.writes += 1
        self.statuses[(namespace, name)] = body["status"]["devices"]


@dataclass
class State:
    """What the writer reads of the cluster's state: the nodes and what claims' status says."""

    results: dict[str, Any]
    claims_status: dict[tuple[str, str], frozenset[tuple[str, str, str, str]]] = field(
        default_factory=dict
    )


@pytest.mark.parametrize("claims", [1, 5, 30])
def test_a_pass_of_many_claims_ends_in_time_and_the_rest_follows(
    monkeypatch: pytest.MonkeyPatch, claims: int
) -> None:
    wanted = {("ns", f"c{i:02d}"): {("pool", f"gpu-{i}", f"GPU-{i}", "")} for i in range(claims)}
    monkeypatch.setattr(claimstatus, "held", lambda state, node: wanted)
    api = SlowResource()
    writer = ClaimStatusWriter(api)  # type: ignore[arg-type]
    writer.pass_s = 0.05
    state = State({"node": object()})
    passes = 0
    while True:
        before = api.writes
        writer.sync(state, {"node"}, full=passes == 0)  # type: ignore[arg-type]
        assert 1 <= api.writes - before <= 0.05 / api.delay + 1
        for key, devices in api.statuses.items():  # what the claims' watch shows
            state.claims_status[key] = frozenset(
                (d["pool"], d["device"], d["data"]["uuid"], d.get("shareID", "")) for d in devices)  # fmt: skip
        if not writer.left:
            break
        passes += 1
        assert passes < 100
    assert api.writes == claims and set(api.statuses) == set(wanted)
    assert (passes > 0) == (claims * api.delay > 0.05 + api.delay)
