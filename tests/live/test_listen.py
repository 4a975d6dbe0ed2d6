"""Both daemons listen where the platform says, in any address form, and by default on every
address, IPv6 and IPv4 where the host has IPv6 (an IPv6-only cluster's pods have no IPv4)."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.pipeline.test_cli import free_port
from tests.support.base import ROOT, SAMPLES
from tests.support.kubeapi import KubeAPI, eventually

TOPOLOGY = SAMPLES / "topology" / "a100-40gb-active.yaml"


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


IPV6 = _has_ipv6()
V4, V6 = "127.0.0.1", "[::1]"
# --address as given (None: the default) -> the loopbacks that reach it, on a host with IPv6.
FORMS = {None: {V4, V6}, "::": {V4, V6}, "[::]": {V4, V6}, "0.0.0.0": {V4}, "::1": {V6},
         "[::1]": {V6}, "127.0.0.1": {V4}, "localhost": {V4}}  # fmt: skip


def _answers(host: str, port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=2) as r:
            return int(r.status)
    except OSError:
        return None


def _reached(port: int, path: str) -> set[str]:
    return {h for h in (V4, V6) if _answers(h, port, path) == 200}


def _expected(form: str | None) -> set[str]:
    return FORMS[form] if IPV6 else {V4} & FORMS[form] or {V4}


@pytest.mark.parametrize("form", list(FORMS), ids=lambda f: f or "default")
def test_the_exporter_listens_on_the_address_in_any_form(tmp_path: Path, form: str | None) -> None:
    if not IPV6 and form in ("::1", "[::1]"):
        form = "127.0.0.1"  # no IPv6 here: the loopback that there is
    port = free_port()
    address = ["--address", form] if form is not None else []
    log = (tmp_path / "exporter.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--topology-file", str(TOPOLOGY), "--all-nodes",
         *address, "--port", str(port)], cwd=ROOT, stdout=log, stderr=log,
    )  # fmt: skip
    try:
        eventually(lambda: _reached(port, "/health"), timeout=15)
        assert _reached(port, "/health") == _expected(form)
    finally:
        proc.terminate()
        proc.wait(10)
    said = (tmp_path / "exporter.log").read_text()
    assert "serving every node on http://" in said and "Traceback" not in said


@pytest.mark.parametrize("form", [None, "::"], ids=lambda f: f or "default")
def test_the_updater_listens_on_every_address(tmp_path: Path, form: str | None) -> None:
    port = free_port()
    with KubeAPI.start() as kube:
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        address = ["--metrics-address", form] if form is not None else []
        log = (tmp_path / "updater.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "status_updater", "run", "--kubeconfig", str(kubeconfig),
             *address, "--metrics-port", str(port)], cwd=ROOT, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            eventually(lambda: _reached(port, "/health") == _expected(form), timeout=20)
        finally:
            proc.terminate()
            proc.wait(10)
