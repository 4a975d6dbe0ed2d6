"""A serving certificate for 127.0.0.1 from a throwaway CA, and the web config that uses it."""

from __future__ import annotations

import ssl
from pathlib import Path

import trustme


def serving_tls(directory: Path) -> tuple[Path, ssl.SSLContext]:
    """`web.yml` turning TLS on with a fresh certificate (files in `directory`), and a client
    context that trusts it."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    cert.private_key_pem.write_to_path(str(directory / "server.key"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    config = directory / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n")
    return config, ssl.create_default_context(cafile=str(directory / "ca.pem"))
