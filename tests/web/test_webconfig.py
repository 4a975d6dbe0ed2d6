"""The exporter's HTTP server as clients meet it: TLS, client certificates and basic auth from an
exporter-toolkit web config, the config's one-line errors, and the bounds that keep slow or greedy
clients from starving scrapes. Real servers on port 0, real TLS clients, certificates from trustme."""

from __future__ import annotations

import base64
import http.client
import logging
import os
import select
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import trustme

from mig_exporter.web import config as webconfig
from mig_exporter.web.config import BasicAuth, WebConfig, WebConfigError, load
from mig_exporter.web.server import (
    CONTENT_TYPE,
    MAX_HEAD_BYTES,
    TLS_CHUNK_BYTES,
    Limits,
    MetricsServer,
    Published,
    Snapshot,
)
from tests.support.base import ROOT, SAMPLES
from tests.support.kubeapi import eventually

NODE = "qa-mig-worker-gpu-a100"
TOPOLOGY = SAMPLES / "topology" / "a100-40gb-active.yaml"
SNAPSHOT = Snapshot((b"metric_a 1\n", b"metric_b 2\n"), True, "ok", b"own_total 3\n")
BODY = b"metric_a 1\nmetric_b 2\nown_total 3\n"
# Cost 4, bcrypt's least: the check is what is tested, not its slowness.
HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: trustme.CA
    client: trustme.LeafCert  # issued by `ca`, for mutual TLS


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA, a certificate for 127.0.0.1 under certs/ (the config names it relatively), and a
    client certificate from the same CA."""
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    certs = tmp_path / "certs"
    certs.mkdir()
    server.cert_chain_pems[0].write_to_path(str(certs / "server.pem"))
    server.private_key_pem.write_to_path(str(certs / "server.key"))
    ca.cert_pem.write_to_path(str(certs / "ca.pem"))
    return Pki(tmp_path, ca, ca.issue_cert("scraper@example.org"))


def write_config(directory: Path, text: str, name: str = "web.yml") -> Path:
    path = directory / name
    path.write_text(text)
    return path


TLS = "tls_server_config:\n  cert_file: certs/server.pem\n  key_file: certs/server.key\n"


@contextmanager
def serving(
    web: WebConfig | None = None, limits: Limits | None = None, snapshot: Snapshot = SNAPSHOT
) -> Iterator[MetricsServer]:
    published = Published()
    published.publish(snapshot)
    server = MetricsServer(published, "127.0.0.1", 0, web, limits)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass(frozen=True)
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


def request(
    server: MetricsServer,
    path: str = "/metrics",
    context: ssl.SSLContext | None = None,
    auth: tuple[str, str] | None = None,
    method: str = "GET",
) -> Response:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=5, context=context)
    headers = {}
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        return Response(r.status, r.headers, r.read())
    finally:
        conn.close()


def client_context(pki: Pki, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.dir / "certs" / "ca.pem"))
    if cert is not None:
        cert.configure_cert(context)
    return context


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """How long until the server closes `sock` (None if it is still open after `seconds`)."""
    start = time.monotonic()
    ready, _, _ = select.select([sock], [], [], seconds)
    if not ready:
        return None
    try:
        data = sock.recv(1024)
    except ConnectionResetError:
        data = b""
    assert data == b"", data  # closed, not answered
    return time.monotonic() - start


def slow_clients(server: MetricsServer, n: int) -> list[socket.socket]:
    """`n` connections that send half a request line and hang."""
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        s.sendall(b"GET /metr")
        socks.append(s)
    return socks


# TLS and client certificates


def test_tls_serves_the_snapshot_and_only_over_tls(pki: Pki) -> None:
    path = write_config(pki.dir, TLS + "  min_version: TLS13\n")
    web = load(path)
    assert web.tls is not None and web.tls.cert_file == str(pki.dir / "certs/server.pem")
    with serving(web) as server:
        assert server.tls
        r = request(server, context=client_context(pki))
        assert (r.status, r.body) == (200, BODY)
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        health = request(server, "/health", context=client_context(pki))
        assert (health.status, health.body) == (200, b"ok\n")
        with pytest.raises((OSError, http.client.HTTPException)):
            request(server)  # plain HTTP to the TLS port
        old = client_context(pki)
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError):
            request(server, context=old)  # below min_version
        # A client that trusts another CA does not trust this server.
        stranger = ssl.create_default_context(cafile=str(trustme_ca_file(pki.dir)))
        with pytest.raises(ssl.SSLCertVerificationError):
            request(server, context=stranger)


def trustme_ca_file(directory: Path) -> Path:
    path = directory / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


def test_a_body_of_many_parts_arrives_whole_over_tls(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TLS has no sendmsg: small parts are joined into records, big ones sent as they are."""
    parts = tuple(f"part {i} ".encode() * (i % 50) for i in range(3000))
    parts = (*parts[:1000], b"big " * (TLS_CHUNK_BYTES // 2), *parts[1000:])
    snapshot = Snapshot(parts, True, "ok", b"own_total 3\n")
    sends: list[int] = []
    real = ssl.SSLSocket.sendall

    def sendall(self: ssl.SSLSocket, data: bytes, flags: int = 0) -> None:
        sends.append(memoryview(data).nbytes)
        real(self, data, flags)

    monkeypatch.setattr(ssl.SSLSocket, "sendall", sendall)
    with serving(load(write_config(pki.dir, TLS)), snapshot=snapshot) as server:
        r = request(server, context=client_context(pki))
        assert r.body == snapshot.body + snapshot.own
    # Each write within TLS_CHUNK_BYTES: each gets its own stall timeout, and the response's
    # deadline is checked between them.
    assert sum(sends) > len(r.body) > 3 * TLS_CHUNK_BYTES
    assert max(sends) <= TLS_CHUNK_BYTES


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca(pki: Pki) -> None:
    path = write_config(pki.dir, TLS + "  client_auth_type: RequireAndVerifyClientCert\n"
                        "  client_ca_file: certs/ca.pem\n")  # fmt: skip
    with serving(load(path)) as server:
        r = request(server, context=client_context(pki, pki.client))
        assert (r.status, r.body) == (200, BODY)
        with pytest.raises((OSError, http.client.HTTPException)):
            request(server, context=client_context(pki))  # no certificate
        outsider = trustme.CA().issue_cert("intruder@example.org")
        with pytest.raises((OSError, http.client.HTTPException)):
            request(server, context=client_context(pki, outsider))


def test_a_stalled_tls_handshake_is_dropped_while_scrapes_go_on(pki: Pki) -> None:
    limits = Limits(head_timeout_s=1.0)
    with serving(load(write_config(pki.dir, TLS)), limits) as server:
        stalled = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
        try:
            start = time.monotonic()
            assert request(server, context=client_context(pki)).body == BODY
            assert time.monotonic() - start < 1.0  # not behind the stalled handshakes
            for s in stalled:
                assert closed_within(s, 4) is not None  # dropped at the deadline, not kept
        finally:
            for s in stalled:  # else a server stuck on them could not stop, and the test hang
                s.close()


# Basic auth


def test_basic_auth_protects_every_path(tmp_path: Path) -> None:
    path = write_config(tmp_path, f"basic_auth_users:\n  alice: {HASH}\n  bob: {HASH}\n")
    with serving(load(path)) as server:
        ok = request(server, auth=("alice", "s3cret"))
        assert (ok.status, ok.body) == (200, BODY)
        assert request(server, auth=("alice", "s3cret")).status == 200  # cached, same answer
        assert request(server, "/health", auth=("bob", "s3cret")).status == 200
        for auth, path_ in (
            (("alice", "wrong"), "/metrics"),
            (None, "/metrics"),
            (None, "/health"),
            (None, "/other"),  # not even whether a path exists
            (("mallory", "s3cret"), "/metrics"),
            (("alice", "s3cret" + "x" * 80), "/metrics"),  # beyond bcrypt's 72 bytes
            (("alice", ""), "/metrics"),
        ):
            r = request(server, path_, auth=auth)
            assert r.status == 401, (auth, path_)
            assert r.headers["WWW-Authenticate"] == "Basic"
            assert r.headers["Content-Type"] == "text/plain; charset=utf-8"
            assert r.body == b"Unauthorized\n"
            assert r.headers["Server"] == "mig-exporter"  # not the Python version
        head = raw(server, b"HEAD /metrics HTTP/1.1\r\n\r\n")  # all the server sends
        status, headers_end, after = head.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.0 401 ") and b"Content-Length: 13" in status
        assert (headers_end, after) == (b"\r\n\r\n", b"")  # the headers, and no body
        assert request(server, method="POST").status == 401  # auth before anything else
        assert request(server, method="POST", auth=("alice", "s3cret")).status == 405


def test_basic_auth_header_forms(tmp_path: Path) -> None:
    auth = BasicAuth((("alice", HASH),))
    good = base64.b64encode(b"alice:s3cret").decode()
    assert auth.allows(f"Basic {good}")
    assert auth.allows(f"basic  {good} ")  # the scheme is case-insensitive
    for header in (None, "", f"Bearer {good}", "Basic !!!", "Basic " + base64.b64encode(b"alice").decode(),
                   "Basic " + base64.b64encode(b"alice:s3cret\n").decode(), "Basic"):  # fmt: skip
        assert not auth.allows(header), header
    # No colon is no credentials, even for a user whose password is empty.
    empty = BasicAuth((("alice", bcrypt.hashpw(b"", bcrypt.gensalt(4)).decode()),))
    assert empty.allows("Basic " + base64.b64encode(b"alice:").decode())
    assert not empty.allows("Basic " + base64.b64encode(b"alice").decode())


def test_right_credentials_are_checked_by_bcrypt_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(webconfig.bcrypt, "checkpw", counting)
    auth = BasicAuth((("alice", HASH),))

    def header(user: str, password: str) -> str:
        return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    for _ in range(3):
        assert auth.allows(header("alice", "s3cret"))
    assert len(calls) == 1  # a scrape every few seconds costs no bcrypt
    for _ in range(2):
        assert not auth.allows(header("alice", "guess"))
    assert len(calls) == 3  # wrong ones are not remembered
    assert not auth.allows(header("eve", "s3cret"))
    # An unknown user costs a bcrypt check too (against a decoy): timing does not tell names.
    assert len(calls) == 4 and calls[-1] != HASH.encode()


def test_configured_headers_are_on_every_response(pki: Pki) -> None:
    path = write_config(pki.dir, TLS + "http_server_config:\n  http2: false\n  headers:\n"
                        "    X-Frame-Options: deny\n    Content-Security-Policy: default-src 'none'\n"
                        "    X-XSS-Protection: ''\n"
                        f"basic_auth_users:\n  alice: {HASH}\n")  # fmt: skip
    web = load(path)
    assert not web.http2
    with serving(web) as server:
        context = client_context(pki)
        for r in (request(server, auth=("alice", "s3cret"), context=context),
                  request(server, "/nope", auth=("alice", "s3cret"), context=context),
                  request(server, context=context)):  # fmt: skip
            assert r.headers["X-Frame-Options"] == "deny", r.status
            assert r.headers["Content-Security-Policy"] == "default-src 'none'"
            assert "X-XSS-Protection" not in r.headers  # blank: unset
        assert [r.status for r in (request(server, auth=("alice", "s3cret"), context=context),
                                   request(server, "/nope", auth=("alice", "s3cret"), context=context))] == [200, 404]  # fmt: skip


# The config file's errors: one line, the file and the field


def assert_one_line(e: pytest.ExceptionInfo[WebConfigError], path: Path, text: str) -> None:
    """The whole message; `text` ending in … is a beginning (what follows is the ssl module's
    or the YAML parser's own words)."""
    message = str(e.value)
    assert "\n" not in message
    if text.endswith(" …"):
        assert message.startswith(f"web config {path}: {text[:-2]}"), message
    else:
        assert message == f"web config {path}: {text}"


CONFIG_ERRORS = [
    (
        "tls_config:\n  cert_file: x\n",
        "tls_config: unknown field (known: tls_server_config, http_server_config, basic_auth_users, rate_limit)",
    ),
    (
        "tls_server_config:\n  cert_fil: x\n",
        "tls_server_config.cert_fil: unknown field (known: cert_file, key_file, client_auth_type, "
        "client_ca_file, min_version, max_version, prefer_server_cipher_suites, cert, key, client_ca, "
        "cipher_suites, curve_preferences, client_allowed_sans)",
    ),
    (
        "tls_server_config:\n  cert_file: nope.pem\n  key_file: nope.key\n",
        "tls_server_config.cert_file: {dir}/nope.pem: cannot be read: No such file or directory",
    ),
    (
        "tls_server_config:\n  cert_file: certs/server.pem\n",
        "tls_server_config.key_file: missing: TLS needs cert_file and key_file",
    ),
    (
        TLS + "  min_version: TLS11\n",
        "tls_server_config.min_version: TLS11 is not supported: use TLS12 or TLS13",
    ),
    (
        TLS + "  max_version: TLS14\n",
        "tls_server_config.max_version: expected TLS12 or TLS13, got 'TLS14'",
    ),
    (
        TLS + "  min_version: TLS13\n  max_version: TLS12\n",
        "tls_server_config.min_version: is above max_version",
    ),
    (
        TLS + "  client_auth_type: RequireAndVerifyClientCert\n",
        "tls_server_config.client_ca_file: missing: RequireAndVerifyClientCert verifies client "
        "certificates against it",
    ),
    (
        TLS + "  client_ca_file: certs/ca.pem\n",
        "tls_server_config.client_ca_file: set, but client_auth_type is NoClientCert: say "
        "RequireAndVerifyClientCert to check client certificates",
    ),
    (
        TLS + "  client_auth_type: RequireAnyClientCert\n  client_ca_file: certs/ca.pem\n",
        "tls_server_config.client_auth_type: RequireAnyClientCert accepts certificates nobody "
        "verifies and is not supported: use RequireAndVerifyClientCert",
    ),
    (
        TLS + "  client_auth_type: Sometimes\n",
        "tls_server_config.client_auth_type: expected one of NoClientCert, VerifyClientCertIfGiven, "
        "RequireAndVerifyClientCert, got 'Sometimes'",
    ),
    (
        TLS
        + "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: certs/server.key\n",
        "tls_server_config.client_ca_file: {dir}/certs/server.key: no usable CA certificate in it: …",
    ),
    (
        TLS + "  client_allowed_sans: [a.example]\n",
        "tls_server_config.client_allowed_sans: is not supported by this exporter",
    ),
    (
        "tls_server_config:\n  cert: '-----BEGIN CERTIFICATE-----'\n",
        "tls_server_config.cert: inline PEM is not supported: give cert_file",
    ),
    (
        "tls_server_config:\n  cert_file: certs/server.key\n  key_file: certs/server.key\n",
        "tls_server_config.cert_file: {dir}/certs/server.key: no PEM certificate in it",
    ),
    (
        "tls_server_config:\n  cert_file: certs/server.pem\n  key_file: certs/other.key\n",
        "tls_server_config.key_file: {dir}/certs/other.key: does not match the certificate in "
        "{dir}/certs/server.pem",
    ),
    (
        "tls_server_config:\n  cert_file: certs/garbled.pem\n  key_file: certs/server.key\n",
        "tls_server_config.cert_file: {dir}/certs/garbled.pem with {dir}/certs/server.key: "
        "cannot be loaded: [SSL] PEM lib …",
    ),
    (
        "basic_auth_users:\n  alice: hunter2\n",
        "basic_auth_users.alice: expected a bcrypt hash ($2y$10$ and 53 characters, as "
        "`htpasswd -nBC 10 \"\" | tr -d ':\\n'` prints)",
    ),
    (
        f"basic_auth_users:\n  'a:b': {HASH}\n",
        "basic_auth_users.a:b: a user name cannot hold ':' or control characters",
    ),
    ("basic_auth_users: [alice]\n", "basic_auth_users: expected a mapping, got a list"),
    (
        "http_server_config:\n  headers:\n    X-Powered-By: python\n",
        "http_server_config.headers.X-Powered-By: cannot be configured (known: "
        "Content-Security-Policy, Strict-Transport-Security, X-Content-Type-Options, "
        "X-Frame-Options, X-XSS-Protection)",
    ),
    (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
        "http_server_config.headers.X-Frame-Options: expected one of deny, sameorigin, got 'allow'",
    ),
    (
        'http_server_config:\n  headers:\n    Content-Security-Policy: "a\\r\\nSet-Cookie: x"\n',
        "http_server_config.headers.Content-Security-Policy: must be printable ASCII on one line",
    ),
    (
        "http_server_config:\n  http2: maybe\n",
        "http_server_config.http2: expected true or false, got a string",
    ),
    (
        "rate_limit:\n  interval: 1s\n  burst: 5\n",
        "rate_limit: rate limiting is not supported by this exporter",
    ),
    ("- tls_server_config\n", "document: expected a mapping, got a list"),
    ("tls_server_config: [cert_file]\n", "tls_server_config: expected a mapping, got a list"),
    ("http_server_config: [http2]\n", "http_server_config: expected a mapping, got a list"),
    (
        "http_server_config:\n  http3: true\n",
        "http_server_config.http3: unknown field (known: http2, headers)",
    ),
    ("1: x\n", "1: keys must be strings"),
    (f"basic_auth_users:\n  1: {HASH}\n", "basic_auth_users[1]: keys must be strings"),
    (
        TLS + "  curve_preferences: [X25519]\n",
        "tls_server_config.curve_preferences: is not supported by this exporter",
    ),
    (
        TLS + "  prefer_server_cipher_suites: maybe\n",
        "tls_server_config.prefer_server_cipher_suites: expected true or false, got a string",
    ),
    (
        TLS + "  client_ca_file: [certs/ca.pem]\n",
        "tls_server_config.client_ca_file: expected a string, got a list",
    ),
    (
        "tls_server_config:\n  cert_file: certs/server.pem\n  key_file: certs/server.pem\n",
        "tls_server_config.key_file: {dir}/certs/server.pem: no PEM private key in it",
    ),
    ("basic_auth_users: 5\n", "basic_auth_users: expected a mapping, got a number"),
    ("basic_auth_users: true\n", "basic_auth_users: expected a mapping, got a boolean"),
    ("basic_auth_users: 1.5\n", "basic_auth_users: expected a mapping, got a number"),
    ("basic_auth_users: x\n", "basic_auth_users: expected a mapping, got a string"),
    (
        "tls_server_config:\n  cert_file: {}\n",
        "tls_server_config.cert_file: expected a string, got a mapping",
    ),
    ("tls_server_config: [\n", "is not valid YAML: while parsing a flow node …"),
    (
        "basic_auth_users: " + "[" * 1200 + "]" * 1200,
        "is not valid YAML: nests more than 1000 levels deep",
    ),
]


@pytest.mark.parametrize(
    ("config", "expected"),
    CONFIG_ERRORS,
    ids=[e[:60].encode("ascii", "replace").decode().strip() for _, e in CONFIG_ERRORS],
)
def test_config_errors_are_one_line_naming_file_and_field(
    pki: Pki, config: str, expected: str
) -> None:
    pki.ca.issue_cert("other").private_key_pem.write_to_path(str(pki.dir / "certs/other.key"))
    (pki.dir / "certs/garbled.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
    )
    path = write_config(pki.dir, config)
    with pytest.raises(WebConfigError) as e:
        load(path)
    assert_one_line(e, path, expected.format(dir=pki.dir))
    assert "hunter2" not in str(e.value)  # never a secret in a message


def test_an_encrypted_key_is_one_line_however_its_header_is_spaced(pki: Pki) -> None:
    """As written, or as OpenSSL also reads it (`Proc-Type:4,ENCRYPTED`), which the text check
    misses: then OpenSSL asks for the passphrase (before it decrypts anything), and with no
    callback to refuse it would prompt on the terminal and hold the start-up. The same line
    either way (it was an internal error)."""
    data = base64.b64encode(bytes(range(256)) * 4).decode()
    body = "".join(f"{data[i : i + 64]}\n" for i in range(0, len(data), 64))  # PEM's lines
    for proc_type in ("Proc-Type: 4,ENCRYPTED", "Proc-Type:4,ENCRYPTED"):
        (pki.dir / "certs/locked.key").write_text(
            f"-----BEGIN RSA PRIVATE KEY-----\n{proc_type}\nDEK-Info: AES-256-CBC,{'0' * 32}\n\n"
            f"{body}-----END RSA PRIVATE KEY-----\n"
        )
        path = write_config(pki.dir, "tls_server_config:\n  cert_file: certs/server.pem\n"
                            "  key_file: certs/locked.key\n")  # fmt: skip
        with pytest.raises(WebConfigError) as e:
            load(path)
        assert_one_line(
            e,
            path,
            f"tls_server_config.key_file: {pki.dir}/certs/locked.key: is encrypted: give the key "
            "unencrypted",
        )


def test_a_certificate_removed_between_its_check_and_its_load_is_one_line(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(pki.dir, TLS)

    def removed(self: ssl.SSLContext, *args: object, **kw: object) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(ssl.SSLContext, "load_cert_chain", removed)
    with pytest.raises(WebConfigError) as e:
        load(path)
    assert_one_line(
        e, path, "tls_server_config.cert_file: cannot be read: No such file or directory"
    )


def test_fifos_are_refused_not_waited_on(pki: Pki) -> None:
    os.mkfifo(pki.dir / "fifo.yml")
    os.mkfifo(pki.dir / "certs" / "fifo.pem")
    config = write_config(pki.dir, "tls_server_config:\n  cert_file: certs/fifo.pem\n"
                          "  key_file: certs/server.key\n")  # fmt: skip
    errors: list[str] = []

    def attempt() -> None:
        for path in (pki.dir / "fifo.yml", config):
            try:
                load(path)
            except WebConfigError as e:
                errors.append(str(e))

    reader = threading.Thread(target=attempt, daemon=True)  # a hang fails, not stalls, the test
    reader.start()
    reader.join(5)
    assert errors == [
        f"web config {pki.dir}/fifo.yml: not a regular file",
        f"web config {config}: tls_server_config.cert_file: {pki.dir}/certs/fifo.pem: "
        "not a regular file",
    ]


def test_an_empty_config_is_plain_open_http(tmp_path: Path) -> None:
    web = load(write_config(tmp_path, "# nothing yet\n"))
    assert web == WebConfig(str(tmp_path / "web.yml"))
    with serving(web) as server:
        assert not server.tls
        assert request(server).body == BODY


# The flag


def test_a_bad_web_config_stops_the_exporter_before_it_listens(tmp_path: Path) -> None:
    bad = write_config(tmp_path, "tls_config:\n  cert_file: x\n", "bad.yml")
    for args, env in (
        (["--web-config-file", str(bad)], {}),
        ([], {"WEB_CONFIG_FILE": str(bad)}),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "exporter", *args, "--topology-file", str(TOPOLOGY),
             "--node-name", NODE, "--address", "127.0.0.1", "--port", "0"],
            cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            f"error: web config {bad}: tls_config: unknown field (known: tls_server_config, "
            "http_server_config, basic_auth_users, rate_limit)"
        ]
        assert result.stdout == ""


def test_the_exporter_serves_tls_and_basic_auth_from_the_flag(pki: Pki) -> None:
    config = write_config(pki.dir, TLS + f"basic_auth_users:\n  alice: {HASH}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--topology-file", str(TOPOLOGY),
                             "--node-name", NODE, "--address", "127.0.0.1", "--port", str(port)],
                            cwd=ROOT, env={**os.environ, "WEB_CONFIG_FILE": str(config)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    context = client_context(pki)
    token = base64.b64encode(b"alice:s3cret").decode()
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
                with urllib.request.urlopen(req, context=context, timeout=5) as r:
                    body = r.read().decode()
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, "the exporter did not serve over TLS"
                time.sleep(0.1)
        assert "DCGM_FI_DEV_FB_USED" in body
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, context=context, timeout=5)
        assert e.value.code == 401
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=10)
    assert f"on https://127.0.0.1:{port}/metrics" in stderr
    assert "Traceback" not in stderr


# Bounds: what one client can make the server hold


def test_slow_clients_do_not_starve_a_scrape() -> None:
    with serving(limits=Limits(head_timeout_s=1.5)) as server:
        slow = slow_clients(server, 50)
        start = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert (r.status, r.read()) == (200, BODY)
        assert time.monotonic() - start < 1.0
        # Each is dropped at its deadline, not kept: their threads and slots come back.
        for s in slow:
            assert closed_within(s, 4) is not None
            s.close()


def test_a_trickling_client_is_dropped_at_the_deadline_not_per_byte(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A byte every 0.2 s would satisfy any per-read timeout for ever; the deadline is on the
    whole head."""
    caplog.set_level(logging.DEBUG, logger="exporter")
    with serving(limits=Limits(head_timeout_s=1.0)) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        start = time.monotonic()
        closed = None
        for byte in b"GET /metrics HTTP/1.1\r\n" + b"X-Slow: " + b"a" * 100:
            try:
                s.send(bytes([byte]))
            except OSError:
                closed = time.monotonic() - start
                break
            waited = closed_within(s, 0.2)
            if waited is not None:
                closed = time.monotonic() - start
                break
        s.close()
        assert closed is not None and 0.9 < closed < 2.5, closed
    # Said at debug level, in one line: a dropped client is not news.
    assert ("DEBUG", "connection from 127.0.0.1 dropped: timed out") in [
        (r.levelname, r.getMessage()) for r in caplog.records
    ]


def test_the_connection_cap_holds_and_frees(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter")
    with serving(limits=Limits(max_connections=4, head_timeout_s=1.5)) as server:
        slow = slow_clients(server, 4)
        time.sleep(0.3)  # all four accepted and holding their slots
        extra = socket.create_connection(("127.0.0.1", server.port))
        waited = closed_within(extra, 1.0)
        assert waited is not None and waited < 0.5  # closed at once, not after the deadline
        extra.close()
        # Said at debug level only: a crowd of refused clients must not flood the log.
        (refused,) = [r for r in caplog.records if "refused" in r.getMessage()]
        assert (refused.levelname, refused.getMessage()) == (
            "DEBUG",
            "connection from 127.0.0.1 refused: 4 served already",
        )
        # The slots free when the slow ones hit their deadline; scrapes are served again.
        for s in slow:
            assert closed_within(s, 4) is not None
            s.close()
        for _ in range(6):  # more than the cap, one after another: slots come back each time
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
                assert r.read() == BODY


def raw(server: MetricsServer, data: bytes) -> bytes:
    """Send `data` as it is, and read the whole answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_request_heads_are_bounded() -> None:
    with serving() as server:
        start = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
        filler = MAX_HEAD_BYTES - len(start) - 200
        fits = raw(server, start + b"X-Fill: " + b"a" * filler + b"\r\n\r\n")
        assert fits.startswith(b"HTTP/1.0 200 ") and fits.endswith(BODY)
        too_long = raw(server, start + b"X-Fill: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
        assert too_long.startswith(b"HTTP/1.0 431 ")
        too_long_line = raw(server, b"GET /" + b"a" * MAX_HEAD_BYTES + b" HTTP/1.1\r\n\r\n")
        assert too_long_line.startswith(b"HTTP/1.0 431 ")
        many = raw(server, start + b"".join(b"X-%d: 1\r\n" % i for i in range(150)) + b"\r\n")
        assert many.startswith(b"HTTP/1.0 431 ")  # http.server's 100 headers, still under 8 KiB
        assert many.count(b"HTTP/1.0 ") == 1 and BODY not in many  # refused, and only that


def test_every_answer_says_what_it_is_and_head_sends_no_body() -> None:
    text = "text/plain; charset=utf-8"
    with serving(snapshot=Snapshot(ready=False)) as server:  # before the first topology
        for path in ("/metrics", "/health"):
            r = request(server, path)
            assert (r.status, r.headers["Content-Type"], r.body) == (
                503,
                text,
                b"no topology yet\n",
            )
    with serving(snapshot=Snapshot((b"metric_a 1\n",), False, "the file is bad")) as server:
        r = request(server, "/health")  # unhealthy, still serving the last good series
        assert (r.status, r.headers["Content-Type"], r.body) == (503, text, b"the file is bad\n")
        r = request(server, "/metrics")
        assert (r.status, r.headers["Content-Type"]) == (200, CONTENT_TYPE)
    with serving() as server:
        for path, status, body in (("/health", 200, b"ok\n"), ("/x", 404, b"not found: try /metrics or /health\n")):  # fmt: skip
            r = request(server, path)
            assert (r.status, r.headers["Content-Type"], r.body) == (status, text, body)
            head = request(server, path, method="HEAD")
            assert (head.status, head.headers["Content-Length"], head.body) == (status, str(len(body)), b"")  # fmt: skip


def test_a_client_gone_mid_answer_is_a_debug_line_and_no_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="exporter")
    big = Snapshot((b"x" * (32 << 20),), True, "ok")  # far more than the socket buffers hold
    with serving(snapshot=big) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        s.recv(1024)  # the answer has begun
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # reset: the rest cannot be sent
        said = eventually(
            lambda: [r for r in caplog.records if r.getMessage().startswith("connection from")]
        )
        assert request(server, "/health").status == 200  # and it goes on serving
    assert [(r.levelname, r.getMessage().split(": [Errno")[0]) for r in said] == [
        ("DEBUG", "connection from 127.0.0.1")
    ]
    assert "Traceback" not in capfd.readouterr().err


def test_a_bug_while_answering_is_one_error_line_and_no_traceback(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    def broken(target: str) -> str | None:
        raise RuntimeError("the path broke")

    monkeypatch.setattr("mig_exporter.web.handler.target_path", broken)
    with serving() as server:
        assert raw(server, b"GET /metrics HTTP/1.1\r\n\r\n") == b""  # closed, nothing half-said
        said = eventually(lambda: [r for r in caplog.records if r.levelno >= logging.WARNING])
    assert [(r.levelname, r.getMessage()) for r in said] == [
        ("ERROR", "answering 127.0.0.1: RuntimeError: the path broke")
    ]
    assert "Traceback" not in capfd.readouterr().err


def test_only_two_paths_and_two_methods_are_served() -> None:
    with serving() as server:
        assert request(server, "/other").status == 404
        assert request(server, "/metrics/../etc/passwd").status == 404
        assert request(server, "/metrics?x=1").body == BODY
        head = request(server, method="HEAD")
        assert (head.status, head.body) == (200, b"")
        assert head.headers["Content-Length"] == str(len(BODY))
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            r = request(server, method=method)
            assert (r.status, r.headers["Allow"]) == (405, "GET, HEAD"), method
        assert request(server, method="BREW").status == 501
        # A body is never waited for: a GET announcing a megabyte it never sends is answered.
        answer = raw(server, b"GET /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 200 ") and answer.endswith(BODY)
        assert raw(server, b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").startswith(
            b"HTTP/1.0 405 "
        )
        assert b"Python" not in raw(server, b"GET /health HTTP/1.0\r\n\r\n")  # Server: header


def test_the_documented_example_loads(tmp_path: Path) -> None:
    """The web config docs/install.md shows."""
    doc = (ROOT / "docs" / "install.md").read_text()
    section = doc[doc.index("\n## TLS and basic auth\n") :]
    block = section[section.index("```yaml\n") + len("```yaml\n") : section.index("```\n", 8)]
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "tls.crt"))
    cert.private_key_pem.write_to_path(str(tmp_path / "tls.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.crt"))
    web = load(write_config(tmp_path, block))
    assert web.tls is not None and web.tls.client_auth_type == "RequireAndVerifyClientCert"
    assert [user for user, _ in web.users] == ["prometheus"]
    assert web.headers == (("X-Content-Type-Options", "nosniff"),)
