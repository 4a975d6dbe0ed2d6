"""`--web-config-file`: TLS, client certificates, basic auth and response headers, in the format
of Prometheus exporter-toolkit's `--web.config.file`
(https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md), so the file
a cluster already has for its node-exporter serves this exporter as it is.

As exporter-toolkit: unknown fields are errors (it reads the file strictly), relative paths are
relative to the file's directory, and basic auth covers every path. What it offers and we cannot
honour (inline keys, cipher and curve lists, SAN allow-lists, rate limits, client certificates
nobody verifies) is refused in one line rather than silently ignored: a file that asks for a
protection must get it or fail.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import bcrypt
import yaml

from mig_exporter.common.files import UnreadableFile, read_text
from mig_exporter.common.text import one_line, printable
from mig_exporter.common.yamlload import load_document

# A web config is a few lines; a certificate chain or CA bundle a few KiB (Mozilla's whole bundle
# is about 220 KiB). Bounds on what a wrong path (a log, a device) can make the exporter read.
MAX_WEB_CONFIG_BYTES = 1 << 20
MAX_PEM_BYTES = 1 << 20

TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# Deprecated by RFC 8996 and off in OpenSSL 3's default security level: refused, not half-served.
OLD_TLS_VERSIONS = ("TLS10", "TLS11")
CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
# Go accepts any certificate with these, verified by nothing; Python's ssl cannot, and a
# certificate nobody checks authenticates nobody.
UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")
# exporter-toolkit's list, and the values it allows where they are an enumeration.
HEADERS: dict[str, tuple[str, ...]] = {
    "Content-Security-Policy": (),
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
}
# `$2a$`, `$2b$`, `$2y$` (htpasswd -B) and a cost bcrypt accepts; checked when the file is read,
# not on the first scrape.
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

TOP_LEVEL = ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit")
TLS_FIELDS = (
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
    "cert",
    "key",
    "client_ca",
    "cipher_suites",
    "curve_preferences",
    "client_allowed_sans",
)
HTTP_FIELDS = ("http2", "headers")


class WebConfigError(ValueError):
    """Why the web config cannot be used, in one line: the file, the field, what is wrong."""

    def __init__(self, path: str | os.PathLike[str], field: str, message: str) -> None:
        where = f"web config {printable(os.fspath(path))}"
        text = f"{field}: {message}" if field else message
        super().__init__(f"{where}: {printable(text)}")


@dataclass(frozen=True)
class TLSServerConfig:
    cert_file: str  # paths as resolved against the config file's directory
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True)
class WebConfig:
    path: str
    tls: TLSServerConfig | None = None
    http2: bool = True  # accepted for compatibility: the server speaks HTTP/1.x only
    headers: tuple[tuple[str, str], ...] = ()
    users: tuple[tuple[str, str], ...] = ()  # user name, bcrypt hash


def load(path: str | os.PathLike[str]) -> WebConfig:
    """The web config in `path`, every field checked and its certificates loaded once, so a
    problem is found before the exporter listens."""
    try:
        text = read_text(path, MAX_WEB_CONFIG_BYTES)
    except UnreadableFile as e:
        raise WebConfigError(path, "", str(e)) from None
    try:
        doc = load_document(text)
    except yaml.YAMLError as e:
        raise WebConfigError(path, "", f"is not valid YAML: {one_line(e)}") from None
    p = _Parser(os.fspath(path))
    top = p.mapping(doc, "")
    p.known(top, TOP_LEVEL, "")
    p.unsupported(top, "rate_limit", "rate limiting")
    http = p.mapping(top.get("http_server_config"), "http_server_config")
    p.known(http, HTTP_FIELDS, "http_server_config.")
    config = WebConfig(
        path=p.path,
        tls=p.tls(p.mapping(top.get("tls_server_config"), "tls_server_config")),
        http2=p.boolean(http.get("http2"), "http_server_config.http2", True),
        headers=p.headers(http.get("headers")),
        users=p.users(top.get("basic_auth_users")),
    )
    server_context(config)
    return config


def _kind(value: object) -> str:
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
        type(None): "nothing",
    }.get(type(value), "a value")


class _Parser:
    """Field by field, each problem named by its dotted path in the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def fail(self, field: str, message: str) -> NoReturn:
        raise WebConfigError(self.path, field, message)

    def mapping(self, value: object, field: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(field or "document", f"expected a mapping, got {_kind(value)}")
        for key in value:
            if not isinstance(key, str):
                self.fail(f"{field}[{key!r}]" if field else repr(key), "keys must be strings")
        return value

    def known(self, doc: Mapping[str, Any], fields: tuple[str, ...], prefix: str) -> None:
        for key in doc:
            if key not in fields:
                self.fail(f"{prefix}{key}", f"unknown field (known: {', '.join(fields)})")

    def unsupported(self, doc: Mapping[str, Any], key: str, what: str) -> None:
        if doc.get(key) not in (None, "", [], {}):  # an empty value asks for nothing
            self.fail(key, f"{what} is not supported by this exporter")

    def string(self, value: object, field: str) -> str:
        if value is None:
            return ""
        if not isinstance(value, str):
            self.fail(field, f"expected a string, got {_kind(value)}")
        return value

    def boolean(self, value: object, field: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(field, f"expected true or false, got {_kind(value)}")
        return value

    def file(self, value: object, field: str) -> str:
        """A path as exporter-toolkit resolves it: relative to the config file's directory."""
        text = self.string(value, field)
        if not text or os.path.isabs(text):
            return text
        return os.path.join(os.path.dirname(self.path), text)

    def tls_version(self, value: object, field: str, default: ssl.TLSVersion) -> ssl.TLSVersion:
        text = self.string(value, field)
        if not text:
            return default
        if text in OLD_TLS_VERSIONS:
            self.fail(field, f"{text} is not supported: use TLS12 or TLS13")
        if text not in TLS_VERSIONS:
            self.fail(field, f"expected TLS12 or TLS13, got {text!r}")
        return TLS_VERSIONS[text]

    def tls(self, doc: Mapping[str, Any]) -> TLSServerConfig | None:
        f = "tls_server_config."
        self.known(doc, TLS_FIELDS, f)
        for key in ("cert", "key", "client_ca"):
            if doc.get(key):
                self.fail(f"{f}{key}", f"inline PEM is not supported: give {key}_file")
        for key in ("cipher_suites", "curve_preferences", "client_allowed_sans"):
            if doc.get(key):
                self.fail(f"{f}{key}", "is not supported by this exporter")
        cert_file = self.file(doc.get("cert_file"), f"{f}cert_file")
        key_file = self.file(doc.get("key_file"), f"{f}key_file")
        client_ca_file = self.file(doc.get("client_ca_file"), f"{f}client_ca_file")
        client_auth = self.string(doc.get("client_auth_type"), f"{f}client_auth_type")
        min_version = self.tls_version(
            doc.get("min_version"), f"{f}min_version", ssl.TLSVersion.TLSv1_2
        )
        max_version = self.tls_version(
            doc.get("max_version"), f"{f}max_version", ssl.TLSVersion.TLSv1_3
        )
        prefer = self.boolean(
            doc.get("prefer_server_cipher_suites"), f"{f}prefer_server_cipher_suites", True
        )
        if not (cert_file or key_file or client_ca_file or client_auth):
            return None  # as exporter-toolkit: no TLS field set, plain HTTP
        if not cert_file:
            self.fail(f"{f}cert_file", "missing: TLS needs cert_file and key_file")
        if not key_file:
            self.fail(f"{f}key_file", "missing: TLS needs cert_file and key_file")
        client_auth = client_auth or "NoClientCert"
        if client_auth in UNVERIFIED_CLIENT_AUTH:
            self.fail(
                f"{f}client_auth_type",
                f"{client_auth} accepts certificates nobody "
                "verifies and is not supported: use RequireAndVerifyClientCert",
            )
        if client_auth not in CLIENT_AUTH:
            self.fail(
                f"{f}client_auth_type",
                f"expected one of {', '.join(CLIENT_AUTH)}, got {client_auth!r}",
            )
        if client_auth == "NoClientCert" and client_ca_file:
            self.fail(
                f"{f}client_ca_file",
                "set, but client_auth_type is NoClientCert: "
                "say RequireAndVerifyClientCert to check client certificates",
            )
        if client_auth != "NoClientCert" and not client_ca_file:
            self.fail(
                f"{f}client_ca_file",
                f"missing: {client_auth} verifies client certificates against it",
            )
        if min_version > max_version:
            self.fail(f"{f}min_version", "is above max_version")
        return TLSServerConfig(
            cert_file, key_file, client_auth, client_ca_file, min_version, max_version, prefer
        )

    def headers(self, value: object) -> tuple[tuple[str, str], ...]:
        f = "http_server_config.headers"
        out = []
        for name, raw in self.mapping(value, f).items():
            field = f"{f}.{name}"
            if name not in HEADERS:
                self.fail(field, f"cannot be configured (known: {', '.join(HEADERS)})")
            text = self.string(raw, field)
            if not text:
                continue  # "unset if blank"
            allowed = HEADERS[name]
            if allowed and text not in allowed:
                self.fail(field, f"expected one of {', '.join(allowed)}, got {text!r}")
            if _CONTROL.search(text) or not text.isascii():
                self.fail(field, "must be printable ASCII on one line")
            out.append((name, text))
        return tuple(out)

    def users(self, value: object) -> tuple[tuple[str, str], ...]:
        f = "basic_auth_users"
        out = []
        for user, raw in self.mapping(value, f).items():
            field = f"{f}.{user}"
            if ":" in user or _CONTROL.search(user):
                self.fail(field, "a user name cannot hold ':' or control characters")
            hashed = self.string(raw, field)
            if not BCRYPT_HASH.fullmatch(hashed):
                # Never the value: it may be a password pasted where its hash belongs.
                self.fail(
                    field,
                    "expected a bcrypt hash ($2y$10$ and 53 characters, "
                    "as `htpasswd -nBC 10 \"\" | tr -d ':\\n'` prints)",
                )
            out.append((user, hashed))
        return tuple(out)


def _read_pem(config: WebConfig, field: str, path: str) -> str:
    try:
        return read_text(path, MAX_PEM_BYTES)
    except UnreadableFile as e:
        raise WebConfigError(config.path, field, f"{path}: {e}") from None


def _reason(e: ssl.SSLError) -> str:
    return str(e.reason or one_line(e))


class _EncryptedKey(Exception):
    """OpenSSL asked for a passphrase: the key is encrypted in a form the text check missed."""


def _no_passphrase() -> NoReturn:
    # Without a callback OpenSSL would prompt on the terminal for one and block startup.
    raise _EncryptedKey()


def _encrypted(config: WebConfig, key_file: str) -> WebConfigError:
    return WebConfigError(
        config.path,
        "tls_server_config.key_file",
        f"{key_file}: is encrypted: give the key unencrypted",
    )


def server_context(config: WebConfig) -> ssl.SSLContext | None:
    """The TLS context the config asks for, its files read again (bounded, regular files only);
    None for plain HTTP."""
    tls = config.tls
    if tls is None:
        return None
    f = "tls_server_config."
    cert = _read_pem(config, f"{f}cert_file", tls.cert_file)
    key = _read_pem(config, f"{f}key_file", tls.key_file)
    if "-----BEGIN CERTIFICATE-----" not in cert:
        raise WebConfigError(
            config.path, f"{f}cert_file", f"{tls.cert_file}: no PEM certificate in it"
        )
    if not re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", key):
        raise WebConfigError(
            config.path, f"{f}key_file", f"{tls.key_file}: no PEM private key in it"
        )
    if re.search(r"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: 4,ENCRYPTED", key):
        raise _encrypted(config, tls.key_file)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = tls.min_version
    context.maximum_version = tls.max_version
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        # The files as checked above; OpenSSL reads them by path.
        context.load_cert_chain(tls.cert_file, tls.key_file, password=_no_passphrase)
    except _EncryptedKey:
        raise _encrypted(config, tls.key_file) from None
    except ssl.SSLError as e:
        if e.reason == "KEY_VALUES_MISMATCH":
            raise WebConfigError(
                config.path,
                f"{f}key_file",
                f"{tls.key_file}: does not match the certificate in {tls.cert_file}",
            ) from None
        raise WebConfigError(
            config.path,
            f"{f}cert_file",
            f"{tls.cert_file} with {tls.key_file}: cannot be loaded: {_reason(e)}",
        ) from None
    except OSError as e:  # replaced between the check and the load
        raise WebConfigError(
            config.path, f"{f}cert_file", f"cannot be read: {e.strerror or e}"
        ) from None
    context.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file:
        field = f"{f}client_ca_file"
        ca = _read_pem(config, field, tls.client_ca_file)
        try:
            context.load_verify_locations(cadata=ca)
        except (ssl.SSLError, ValueError) as e:
            reason = _reason(e) if isinstance(e, ssl.SSLError) else str(e)
            raise WebConfigError(
                config.path,
                field,
                f"{tls.client_ca_file}: no usable CA certificate in it: {reason}",
            ) from None
    context.set_alpn_protocols(["http/1.1"])
    return context


# Checked in place of a missing user's hash, so an unknown name costs the same time as a known one
# and response times do not say which names exist. Its password is no one's.
_DECOY_HASH = b"$2b$10$6HyWfD6abKPed9VhqndMuuA4FIk5iwJ9iVCZOF2uZlObOsU5XPwZ6"
# Right credentials remembered so scrapes skip bcrypt (~100 ms at cost 10, by design): each entry
# is a pair that checked, so only someone who knows a password could fill it; still bounded.
MAX_CACHED_CREDENTIALS = 256


def _credentials(header: str | None) -> tuple[bytes, bytes] | None:
    """User and password from `Authorization: Basic <base64(user:password)>`."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = raw.partition(b":")
    return (user, password) if colon else None


class BasicAuth:
    """`basic_auth_users`, checked as exporter-toolkit checks them."""

    def __init__(self, users: tuple[tuple[str, str], ...]) -> None:
        self._users = [(name.encode(), hashed.encode()) for name, hashed in users]
        self._ok: set[bytes] = set()
        # bcrypt is meant to be slow; one check at a time keeps a flood of wrong passwords on
        # one core, while scrapes with cached right ones never wait for it.
        self._bcrypt = threading.Lock()

    def allows(self, header: str | None) -> bool:
        credentials = _credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed, known = _DECOY_HASH, False
        for name, candidate in self._users:  # every name compared, in constant time each
            if hmac.compare_digest(name, user):
                hashed, known = candidate, True
        key = hashlib.sha256(b":".join(x.hex().encode() for x in (user, hashed, password)))
        digest = key.digest()
        if known and digest in self._ok:
            return True
        with self._bcrypt:
            try:
                ok = bcrypt.checkpw(password, hashed)
            except ValueError:  # over bcrypt's 72 bytes
                ok = False
        if not (ok and known):
            return False
        if len(self._ok) >= MAX_CACHED_CREDENTIALS:
            self._ok.clear()
        self._ok.add(digest)
        return True
