"""The route table (issue #33): every path it names is answered to GET and HEAD alike, a node's
paths for any node name as it is %-encoded, and a path it does not name, however close, is 404.
Generated over the table, so a route added is tested as it lands."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_exporter.web.handler import ROUTES, Rule
from mig_exporter.web.server import CONTENT_TYPE, MetricsServer, Published, Snapshot
from tests.support.base import examples


@dataclass(frozen=True)
class Written:
    text: bytes

    def page(self) -> tuple[bytes, ...]:
        return (self.text,)


NODES = ("node-a", "a b/c%d", "ünïcode", "")  # the empty name too: /metrics/nodes/
SNAPSHOT = Snapshot(
    (b"metric_a 1\n",),
    True,
    "ok",
    b"own_total 3\n",
    pages={n: Written(b'metric_b{Hostname="%s"} 1\n' % n.encode()) for n in NODES},
)
EXPECTED = {  # the body each route answers with for a node of the snapshot
    "/metrics": b"metric_a 1\nown_total 3\n",
    "/metrics/self": b"own_total 3\n",
    "/metrics/nodes/<node>": b'metric_b{Hostname="%s"} 1\n',
    "/health": b"ok\n",
    "/health/nodes/<node>": b"ok\n",
}


@pytest.fixture(scope="module")
def server() -> Iterator[MetricsServer]:
    published = Published()
    published.publish(SNAPSHOT)
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    yield server
    server.stop()


def ask(server: MetricsServer, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        headers = {k.lower(): v for k, v in r.getheaders() if k.lower() != "date"}
        return r.status, headers, r.read()
    finally:
        conn.close()


def at(rule: Rule, node: str) -> str:
    return rule.path.replace("<node>", quote(node, safe=""))


def test_the_table_routes_exactly_the_paths_tested_here() -> None:
    assert [r.path for r in ROUTES] == list(EXPECTED)


@pytest.mark.parametrize("rule", ROUTES, ids=lambda r: r.path)
@pytest.mark.parametrize("node", NODES)
def test_every_route_answers_get_and_head_alike(
    server: MetricsServer, rule: Rule, node: str
) -> None:
    path = at(rule, node)
    status, headers, body = ask(server, "GET", path)
    expected = EXPECTED[rule.path]
    assert (status, body) == (200, expected % node.encode() if b"%s" in expected else expected)
    metrics = rule.path.startswith("/metrics")
    assert headers["content-type"] == (CONTENT_TYPE if metrics else "text/plain; charset=utf-8")
    assert ask(server, "HEAD", path) == (status, headers, b"")


@settings(max_examples=examples(60), deadline=None)
@given(
    rule=st.sampled_from(ROUTES),
    node=st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    near=st.sampled_from(["{}/", "{}x", "/x{}", "{}/..", "{}%2F"]),
)
def test_a_path_the_table_does_not_name_is_404(
    server: MetricsServer, rule: Rule, node: str, near: str
) -> None:
    """A node not served is 404 naming it; a path next to a fixed route is 404 too."""
    if "<node>" in rule.path:
        if node in NODES:
            return
        status, _, body = ask(server, "GET", at(rule, node))
        assert (status, body.endswith(b" is not served here\n")) == (404, True)
    else:
        status, _, body = ask(server, "GET", near.format(rule.path))
        assert (status, body) == (404, b"not found: try /metrics or /health\n")
