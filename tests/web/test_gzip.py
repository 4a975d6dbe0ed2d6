"""gzip as every client reads it (issue #33): each gzipped answer is one gzip stream, one header
and one trailer over the whole body, which decoders that stop after the first member (curl,
urllib3's, zlib's wbits=31) read whole; and still compressed once per change, not per scrape."""

from __future__ import annotations

import gzip
import http.client
import shutil
import subprocess
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_exporter.web.gzipped import Gzipped
from mig_exporter.web.server import MetricsServer, Published, Snapshot
from mig_exporter.web.snapshot import Page
from tests.support.base import examples


@dataclass(frozen=True)
class Written:
    """A node's page as the many-nodes exporter keeps it: fragments, joined only when sent."""

    fragments: tuple[bytes, ...]

    def page(self) -> tuple[bytes, ...]:
        return self.fragments


def family(name: str, n: int) -> bytes:
    return b"".join(
        b'%s{gpu="%d",UUID="GPU-%04d"} %d\n' % (name.encode(), i, i, i * 7) for i in range(n)
    )


# A body of many parts (headers, families, an empty one), its own series, and two nodes' pages.
PARTS = (b"# HELP a x\n# TYPE a gauge\n", family("a", 40), b"", family("b", 300), family("c", 1))
OWN = b"own_total 3\n"
PAGES: dict[str, Page] = {
    "node-a": Written((b"# TYPE d gauge\n", family("d", 50), b"", family("e", 9))),
    "node-b": Written((family("f", 2),)),
}
SNAPSHOT = Snapshot(PARTS, True, "ok", OWN, pages=PAGES)
PLAIN = {
    "/metrics": b"".join(PARTS) + OWN,
    "/metrics/self": OWN,
    "/metrics/nodes/node-a": b"".join(PAGES["node-a"].page()),
    "/metrics/nodes/node-b": b"".join(PAGES["node-b"].page()),
}


def one_stream(data: bytes) -> bytes:
    """What a decoder that reads one gzip member reads, asserting it is all there is."""
    d = zlib.decompressobj(wbits=31)
    out = d.decompress(data) + d.flush()
    assert d.eof, "the stream never ends"
    assert d.unused_data == b"", f"{len(d.unused_data)} bytes after the first member"
    return out


@contextmanager
def serving(snapshot: Snapshot = SNAPSHOT) -> Iterator[MetricsServer]:
    published = Published()
    published.publish(snapshot)
    server = MetricsServer(published, "127.0.0.1", 0)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def fetch(port: int, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers={"Accept-Encoding": "gzip"})
        response = conn.getresponse()
        headers = {k.lower(): v for k, v in response.getheaders()}
        return response.status, headers, response.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", sorted(PLAIN))
def test_every_gzipped_answer_is_one_stream(path: str) -> None:
    with serving() as server:
        status, headers, body = fetch(server.port, path)
        again = fetch(server.port, path)[2]
        head = fetch(server.port, path, "HEAD")
    assert (status, headers["content-encoding"]) == (200, "gzip")
    assert int(headers["content-length"]) == len(body)
    assert one_stream(body) == gzip.decompress(body) == PLAIN[path]
    assert again == body  # a scrape after the first sends what the first made
    assert (head[1]["content-length"], head[2]) == (headers["content-length"], b"")


@pytest.mark.skipif(
    shutil.which("curl") is None, reason="no curl here: the decoders above stand in for it"
)
@pytest.mark.parametrize("path", sorted(PLAIN))
def test_curl_compressed_reads_the_whole_body(path: str) -> None:
    with serving() as server:
        run = subprocess.run(
            ["curl", "--compressed", "-sS", "--fail", f"http://127.0.0.1:{server.port}{path}"],
            capture_output=True,
            timeout=30,
        )
    assert (run.returncode, run.stderr) == (0, b"")
    assert run.stdout == PLAIN[path]


def test_an_empty_body_is_one_stream_too() -> None:
    with serving(Snapshot((b"", b""), True, "ok", b"")) as server:
        status, headers, body = fetch(server.port, "/metrics")
    assert (status, headers["content-encoding"]) == (200, "gzip")
    assert one_stream(body) == gzip.decompress(body) == b""


# The cache itself: parts compressed once, in any order and any company, make one stream.

part_bytes = st.one_of(
    st.just(b""),
    st.binary(max_size=64),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=40), st.integers(1, 3000)),
)


@settings(max_examples=examples(150), deadline=None)
@given(
    pool=st.lists(part_bytes, min_size=1, max_size=12),
    requests=st.lists(st.lists(st.integers(0, 11), max_size=16), min_size=1, max_size=5),
)
def test_parts_in_any_order_and_company_make_one_stream(
    pool: list[bytes], requests: list[list[int]]
) -> None:
    """Each request is a body of parts drawn from one pool, with repeats, in any order: a part
    compressed for one body is reused in the others, so each must stand alone."""
    cache = Gzipped()
    for request in requests:
        parts = [pool[i % len(pool)] for i in request]
        stream = b"".join(cache.of(parts))
        assert one_stream(stream) == gzip.decompress(stream) == b"".join(parts)


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(part_bytes, max_size=8))
def test_a_page_is_one_stream(fragments: list[bytes]) -> None:
    member = b"".join(Gzipped().page(Written(tuple(fragments))))
    assert one_stream(member) == b"".join(fragments)


def test_a_repeated_body_is_not_compressed_again_and_a_changed_one_only_where_it_changed() -> None:
    cache = Gzipped()
    parts = (b"# TYPE a gauge\n", family("a", 100), family("b", 100), family("c", 100))
    first = cache.of(parts)
    assert cache.of(parts) is first  # the next scrape of the same snapshot: nothing made
    changed = (*parts[:2], family("b", 101), parts[3])  # the next snapshot: one family changed
    second = cache.of(changed)
    assert one_stream(b"".join(second)) == b"".join(changed)
    # Element i holds part i's blocks (the first with the header, the trailer after the last).
    assert [a is b for a, b in zip(first[1:-1], second[1:-1], strict=True)] == [True, False, True]
