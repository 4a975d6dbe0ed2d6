"""`--enable-exporter-metrics`: the exporter process's own series, as dcgm-exporter 4.8.4 adds them
(client_golang's Go and process collectors and promhttp's handler instrumentation), off by default
and refused by a generation without it."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client.parser import text_string_to_metric_families

from tests.pipeline.test_cli import get
from tests.support.base import ROOT, run_cli
from tests.support.kubeapi import eventually

TOPOLOGY = ("--topology-file", "samples/mig/topology/a100-40gb-active.yaml",
            "--node-name", "qa-mig-worker-gpu-a100")  # fmt: skip
RUNTIME = ("go_", "process_", "promhttp_")


@contextmanager
def serving(*flags: str) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", *TOPOLOGY, "--port", "0", "--address", "127.0.0.1",
         *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        found = None
        while found is None:  # the log line that says where it listens
            line = proc.stderr.readline()
            assert line, "the exporter stopped before it listened"
            found = re.search(r":(\d+)/metrics", line)
        port = int(found[1])
        url = f"http://127.0.0.1:{port}/metrics"
        eventually(lambda: get(url)[0] == 200, timeout=10)
        yield url
    finally:
        proc.kill()
        proc.wait()


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}  # fmt: skip


def test_off_by_default_as_before_4_8_4() -> None:
    with serving("--dcgm-exporter-version", "4.8.4") as url:
        names = families(get(url)[1])
    assert names and not [n for n in names if n.startswith(RUNTIME)]


def test_the_runtime_series_follow_everything_else_and_count_the_scrapes() -> None:
    with serving("--dcgm-exporter-version", "4.8.4", "--enable-exporter-metrics") as url:
        first, second = get(url)[1], get(url)[1]
    got = families(second)
    assert got["go_info"] == [({"version": "go1.27.1"}, 1)]  # 4.8.4's Go (its PR #745)
    for name in ("go_goroutines", "go_threads", "process_cpu_seconds", "process_open_fds",
                 "process_max_fds", "process_resident_memory_bytes",
                 "process_virtual_memory_bytes", "process_start_time_seconds"):  # fmt: skip
        assert name in got, name
    # The scrape being served is in flight; only finished ones are counted, by status code.
    assert got["promhttp_metric_handler_requests_in_flight"] == [({}, 1)]
    before = dict((s["code"], v) for s, v in families(first)["promhttp_metric_handler_requests"])
    after = dict((s["code"], v) for s, v in got["promhttp_metric_handler_requests"])
    assert set(after) == {"200", "500", "503"} and after["200"] == before["200"] + 1
    # After the DCGM families and the exporter's own, as dcgm-exporter appends them.
    order = re.findall(r"^# TYPE (\S+)", second, re.M)
    first_runtime = next(i for i, n in enumerate(order) if n.startswith(RUNTIME))
    assert all(n.startswith(RUNTIME) for n in order[first_runtime:])
    assert any(n.startswith("DCGM_") for n in order[:first_runtime])


def test_a_generation_without_it_refuses_the_flag_in_one_line() -> None:
    done = run_cli("exporter", *TOPOLOGY, "--once", "--dcgm-exporter-version", "4.8.3",
                   "--enable-exporter-metrics")  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith("has no exporter metrics (from 4.8.4)")
