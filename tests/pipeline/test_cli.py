"""The two commands as a user runs them: exit codes, one-line errors, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter import dcgm
from tests.pipeline.test_golden import MOVING, masked
from tests.support.base import ROOT, SAMPLES, examples, run_cli
from tests.support.promtext import Series, by_name, parse

NODE = "qa-mig-worker-gpu-a100"
TOPOLOGY = SAMPLES / "topology" / "a100-40gb-active.yaml"


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert any(text in line for line in lines), lines


def test_render_names_the_configmap_from_the_environment() -> None:
    result = run_cli("status_updater", "render", "--nodes", str(SAMPLES / "nodes"), "--layout", "single",
                     env={"TOPOLOGY_CM_NAME": "mig-topo", "TOPOLOGY_CM_NAMESPACE": "sim"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    cm = yaml.safe_load(result.stdout)
    assert (cm["apiVersion"], cm["kind"]) == ("v1", "ConfigMap")
    assert cm["metadata"] == {"name": "mig-topo", "namespace": "sim"}
    topology = yaml.safe_load(cm["data"]["topology.yml"])
    assert sorted(topology["nodes"]) == ["a100-80gb-single", "h100-node-1", "h200-node-1", NODE]


def test_render_reads_json_lists_and_multi_document_yaml(tmp_path: Path) -> None:
    node = yaml.safe_load((SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text())
    (tmp_path / "nodes.json").write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [node]})
    )
    pods = yaml.safe_load(
        (SAMPLES / "pods" / "a100-40gb-active-2x1g.5gb-1x2g.10gb.yaml").read_text()
    )["items"]
    for pod in pods:  # as a hand-written manifest may be: `--pods` says what they are
        del pod["kind"]
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump_all(pods))
    result = run_cli(
        "status_updater",
        "render",
        "--nodes",
        str(tmp_path / "nodes.json"),
        "--pods",
        str(tmp_path / "pods.yaml"),
        env={"TOPOLOGY_LAYOUT": "single"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == TOPOLOGY.read_text()


def test_render_bad_node_among_many_warns_in_one_line(tmp_path: Path) -> None:
    bad = {"kind": "Node", "metadata": {"name": "gpu-bad", "labels": {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.count": "two"}}}  # fmt: skip
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    for layout in ("single", "per-node"):
        result = run_cli("status_updater", "render", "--nodes", str(tmp_path / "bad.yaml"),
                         str(SAMPLES / "nodes"), "--layout", layout)  # fmt: skip
        assert result.returncode == 0
        assert result.stderr.strip() == (
            "warning: node gpu-bad: metadata.labels[nvidia.com/gpu.count]: expected an integer, got 'two'"
        )
        out = yaml.safe_load(result.stdout)
        docs = [cm["data"]["topology.yml"] for cm in out.get("items", [out])]
        assert NODE in {n for d in docs for n in yaml.safe_load(d)["nodes"]}
        assert "gpu-bad" not in result.stdout


def test_render_per_node_prints_one_configmap_per_gpu_node() -> None:
    nodes, pods = str(SAMPLES / "nodes"), str(SAMPLES / "pods")
    single = run_cli(
        "status_updater", "render", "--nodes", nodes, "--pods", pods, "--layout", "single"
    )
    per_node = run_cli("status_updater", "render", "--nodes", nodes, "--pods", pods,
                       env={"TOPOLOGY_CM_NAMESPACE": "sim"})  # fmt: skip
    assert single.returncode == per_node.returncode == 0, per_node.stderr
    whole = yaml.safe_load(yaml.safe_load(single.stdout)["data"]["topology.yml"])
    listed = yaml.safe_load(per_node.stdout)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "List")
    seen = {}
    for cm in listed["items"]:
        meta = cm["metadata"]
        doc = yaml.safe_load(cm["data"]["topology.yml"])
        (name,) = doc["nodes"]  # exactly one node, in the cluster schema
        assert meta["name"] == f"topology-{name}" and meta["namespace"] == "sim"
        assert meta["labels"] == {"node-topology": "true", "node-name": name,
                                  "app.kubernetes.io/managed-by": "topology-status-updater"}  # fmt: skip
        seen[name] = doc["nodes"][name]
        assert doc["mig-strategy"] in ("mixed", "single")
    assert seen == whole["nodes"]
    # The real node manifest carries its uid: its ConfigMap is owned by it.
    real = next(cm for cm in listed["items"] if cm["metadata"]["name"] == f"topology-{NODE}")
    node = yaml.safe_load((SAMPLES / "nodes" / "a100-40gb-3-instances.yaml").read_text())
    assert real["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}
    ]


def test_a_bad_layout_is_a_usage_error() -> None:
    for args, env in (((), {"TOPOLOGY_LAYOUT": "sharded"}), (("--layout", "both"), {})):
        result = run_cli(
            "status_updater", "render", "--nodes", str(SAMPLES / "nodes"), *args, env=env
        )
        assert_one_line_error(result, 2, "expected per-node or single, got")


def test_exporter_all_nodes_once_serves_every_node_as_its_hostname(tmp_path: Path) -> None:
    rendered = run_cli(
        "status_updater", "render", "--nodes", str(SAMPLES / "nodes"), "--layout", "single"
    )
    (tmp_path / "cm.yaml").write_text(rendered.stdout)
    nodes = sorted(yaml.safe_load(yaml.safe_load(rendered.stdout)["data"]["topology.yml"])["nodes"])

    step = time.time() // dcgm.UTILIZATION_STEP_S
    result = run_cli(
        "exporter", "--topology-file", str(tmp_path / "cm.yaml"), "--all-nodes", "--once"
    )
    assert result.returncode == 0, result.stderr
    alone = {node: parse(run_cli("exporter", "--topology-file", str(tmp_path / "cm.yaml"),
                                 "--node-name", node, "--hostname", node, "--once").stdout)
             for node in nodes}  # fmt: skip
    # Values move every step: runs that straddled a boundary (a slow machine) are compared with
    # the moving values left out.
    same_step = time.time() // dcgm.UTILIZATION_STEP_S == step

    def comparable(series: list[Series]) -> list[Series]:
        return series if same_step else [replace(s, value=0.0) if s.name in MOVING else s for s in series]  # fmt: skip

    body = result.stdout
    series = parse(body)
    assert sorted({s.label("Hostname") for s in series}) == nodes
    # Each node's series are those its own exporter serves, with its name as Hostname.
    for node in nodes:
        mine = [s for s in series if s.label("Hostname") == node]
        assert comparable(mine) == comparable(alone[node])
    # Every family once, each with its HELP and TYPE: the text Prometheus accepts.
    names = [line.split()[2] for line in body.splitlines() if line.startswith("# TYPE")]
    assert len(names) == len(set(names)) == len({s.name for s in series})


def test_exporter_all_nodes_once_warns_of_a_bad_node_and_prints_the_others(tmp_path: Path) -> None:
    document = yaml.safe_load(yaml.safe_load(TOPOLOGY.read_text())["data"]["topology.yml"])
    bad = json.loads(json.dumps(document["nodes"][NODE]))
    bad["gpus"][0]["mig-devices"][0]["name"] = "9g.99gb"
    document["nodes"]["bad"] = bad
    path = tmp_path / "topology.yml"
    path.write_text(yaml.safe_dump(document))
    result = run_cli("exporter", "--topology-file", str(path), "--all-nodes", "--once")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"warning: topology file {path}: nodes.bad.gpus[0].mig-devices[0].name: unknown profile "
        "'9g.99gb' for A100-40GB (1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)"
    ]
    assert {s.label("Hostname") for s in parse(result.stdout)} == {NODE}


def test_render_unusable_input_exits_2(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("status_updater", "render", "--nodes", str(tmp_path / "nope.yaml")), 2,
                          "nope.yaml: no such file or directory")  # fmt: skip
    (tmp_path / "broken.yaml").write_text("kind: Node\nmetadata: [\n")
    assert_one_line_error(run_cli("status_updater", "render", "--nodes", str(tmp_path / "broken.yaml")), 2,
                          "broken.yaml: not valid YAML")  # fmt: skip
    assert_one_line_error(run_cli("status_updater", "render"), 2, "--nodes")


def test_exporter_once_accepts_the_bare_topology(tmp_path: Path) -> None:
    bare = tmp_path / "topology.yml"
    bare.write_text(yaml.safe_load(TOPOLOGY.read_text())["data"]["topology.yml"])
    from_cm = run_cli(
        "exporter",
        "--topology-file",
        str(TOPOLOGY),
        "--node-name",
        NODE,
        "--once",
        "--hostname",
        "h",
    )
    from_bare = run_cli("exporter", "--topology-file", str(bare), "--once", "--hostname", "h",
                        env={"NODE_NAME": NODE, "DRIVER_VERSION": "535.104.05"})  # fmt: skip
    assert from_cm.returncode == from_bare.returncode == 0
    # Two processes may straddle a 10-s step: what moves in time is compared by its format.
    assert masked(from_cm.stdout) == masked(from_bare.stdout.replace("535.104.05", "520.56.06"))
    assert {s.label("DCGM_FI_DRIVER_VERSION") for s in parse(from_bare.stdout)} == {"535.104.05"}


def test_exporter_errors_are_one_line(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("exporter", "--topology-file", str(TOPOLOGY), "--node-name", "other", "--once"), 2,
                          f"nodes.other: is not in the topology (nodes: {NODE})")  # fmt: skip
    assert_one_line_error(run_cli("exporter", "--topology-file", str(tmp_path / "x.yaml"), "--node-name", "n", "--once"),
                          2, "cannot be read")  # fmt: skip
    (tmp_path / "bad.yaml").write_text("nodes: {n: {gpu-count: 1, gpu-memory: 1, gpu-product: NVIDIA-H200, "
                                       "is-dynamic-mig-enabled: true, gpus: [{id: GPU-1, mig-devices: "
                                       "[{name: 1g.5gb, position: 0, gpu-instance-id: 7}]}]}}")  # fmt: skip
    assert_one_line_error(run_cli("exporter", "--topology-file", str(tmp_path / "bad.yaml"), "--node-name", "n", "--once"),
                          2, "bad.yaml: nodes.n.gpus[0].mig-devices[0].name: unknown profile '1g.5gb' for H200-141GB")  # fmt: skip
    os.mkfifo(tmp_path / "fifo.yaml")  # a wrong path must not hang the exporter
    assert_one_line_error(run_cli("exporter", "--topology-file", str(tmp_path / "fifo.yaml"), "--node-name", "n", "--once", timeout=10),
                          2, "topology: not a regular file")  # fmt: skip
    # Nesting that would overflow libyaml's recursion (a crash, not an error) is refused first,
    # in the file and in the topology.yml a ConfigMap carries.
    (tmp_path / "deep.yaml").write_text("nodes: " + "[" * 60_000 + "]" * 60_000)
    assert_one_line_error(run_cli("exporter", "--topology-file", str(tmp_path / "deep.yaml"), "--node-name", "n", "--once"),
                          2, f"topology file {tmp_path / 'deep.yaml'}: topology: is not valid YAML: nests more than 1000 levels deep")  # fmt: skip
    deep = {
        "kind": "ConfigMap",
        "data": {"topology.yml": "nodes: " + "{a: " * 60_000 + "1" + "}" * 60_000},
    }
    (tmp_path / "deep-cm.json").write_text(json.dumps(deep))
    assert_one_line_error(run_cli("exporter", "--topology-file", str(tmp_path / "deep-cm.json"), "--node-name", "n", "--once"),
                          2, "is not valid YAML: nests more than 1000 levels deep")  # fmt: skip
    assert_one_line_error(run_cli("exporter", "--topology-file", str(TOPOLOGY), "--once", env={"NODE_NAME": ""}), 2,
                          "--node-name (or env NODE_NAME) is required, or --all-nodes")  # fmt: skip
    assert_one_line_error(run_cli("exporter", "--node-name", NODE, "--node-selector", "type=kwok"), 2,
                          "--node-selector goes with --all-nodes")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_for(predicate, timeout: float = 10):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def test_exporter_serves_follows_the_file_and_stops_on_sigterm(tmp_path: Path) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(TOPOLOGY.read_text())
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "exporter", "--topology-file", str(topo), "--node-name", NODE,
                             "--address", "127.0.0.1", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: get(f"{base}/health") == (200, "ok\n"))
        series = parse(get(f"{base}/metrics")[1])
        assert len(by_name(series, "DCGM_FI_DEV_FB_USED")) == 3
        # Re-partition: one 7g.40gb replaces the three instances.
        doc = yaml.safe_load(TOPOLOGY.read_text())
        inner = yaml.safe_load(doc["data"]["topology.yml"])
        inner["nodes"][NODE]["gpus"][0]["mig-devices"] = [
            {"name": "7g.40gb", "position": 0, "gpu-instance-id": 0}
        ]
        doc["data"]["topology.yml"] = yaml.safe_dump(inner)
        topo.write_text(yaml.safe_dump(doc))
        wait_for(
            lambda: (
                [
                    s.label("GPU_I_PROFILE")
                    for s in by_name(parse(get(f"{base}/metrics")[1]), "DCGM_FI_DEV_FB_USED")
                ]
                == ["7g.40gb"]
            )
        )
        # A broken file keeps the last good series and turns health to 503 with the reason.
        topo.write_text("nodes: [")
        _status, reason = wait_for(lambda: (s := get(f"{base}/health"))[0] == 503 and s)
        assert "not valid YAML" in reason and len(reason.strip().splitlines()) == 1
        assert [
            s.label("GPU_I_PROFILE")
            for s in by_name(parse(get(f"{base}/metrics")[1]), "DCGM_FI_DEV_FB_USED")
        ] == ["7g.40gb"]
        assert get(f"{base}/other")[0] == 404
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
        assert time.monotonic() - started < 2
        assert "Traceback" not in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        proc.kill()
        proc.wait()


# --- arguments and variables that are not UTF-8 --------------------------------------------------

COMMANDS = {"exporter": "exporter.cli", "status_updater": "status_updater.cli",
            "topology": "topology.__main__"}  # fmt: skip


def cli_module(command: str) -> Any:
    return importlib.import_module(COMMANDS[command])


def arguments(p: argparse.ArgumentParser, before: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every argument that takes a value, as the command line before it: (subcommand..., flag)
    for a flag, (subcommand..., "") for a positional argument."""
    out: list[tuple[str, ...]] = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += arguments(sub, (*before, name))
        elif action.nargs != 0 and action.dest != "command":
            out.append((*before, action.option_strings[-1] if action.option_strings else ""))
    return out


def _undecodable(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return True
    return False


# Bytes no UTF-8 decoder takes, anywhere in a value (a Latin-1 name, a cut sequence, a surrogate's
# encoding), never NUL (no argument or variable can hold one) nor a leading `-` (a flag then).
NOT_UTF8 = (
    st.tuples(st.binary(max_size=6), st.sampled_from([b"\xff", b"\x80", b"\xc3", b"\xe9t\xe9",
              b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf"]), st.binary(max_size=6))
    .map(lambda parts: b"".join(parts).replace(b"\x00", b"").lstrip(b"-"))
    .filter(_undecodable)
)  # fmt: skip
TARGETS = [
    (command, kind, name)
    for command in COMMANDS
    for kind, name in [
        *(("flag", args) for args in arguments(cli_module(command).parser())),
        *(("env", (var,)) for var in cli_module(command).ENVIRONMENT),
    ]
]


def command_line(
    kind: str, name: tuple[str, ...], value: str, joined: bool
) -> tuple[list[str], str]:
    """The arguments that give `value` to `name`, and how the error must name it."""
    if kind == "env":
        return [], f"environment variable {name[0]}: not UTF-8 text: "
    *before, flag = name
    if not flag:  # a positional argument
        return [*before, value], f"argument {len(before) + 1}: not UTF-8 text: "
    given = [f"{flag}={value}"] if joined and flag.startswith("--") else [flag, value]
    return [*before, *given], f"argument {flag}: not UTF-8 text: "


def refused_in_process(target: tuple[str, str, tuple[str, ...]], raw: bytes, joined: bool) -> None:
    """`target` given `raw` in this process, as Python hands undecodable bytes over (lone
    surrogates): exit 2 and one line naming it."""
    command, kind, name = target
    value = os.fsdecode(raw)
    argv, says = command_line(kind, name, value, joined)
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")  # never a cluster, whatever runs
        patch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        if kind == "env":
            patch.setenv(name[0], value)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = cli_module(command).main(argv)
            except SystemExit as e:  # argparse
                code = e.code
    lines = err.getvalue().splitlines()
    assert (code, len(lines)) == (2, 1), (argv, lines)
    assert says + repr(raw[:60]) in lines[0]


@pytest.mark.parametrize(
    "target", TARGETS, ids=lambda t: " ".join((t[0], *(a or "FILE" for a in t[2])))
)
def test_each_argument_and_variable_a_command_reads_must_be_utf8(
    target: tuple[str, str, tuple[str, ...]],
) -> None:
    refused_in_process(target, b"caf\xe9", joined=False)


@settings(derandomize=True, max_examples=examples(300), deadline=None)
@given(st.sampled_from(TARGETS), NOT_UTF8, st.booleans())
def test_any_bytes_that_are_not_utf8_are_one_line_and_exit_2(
    target: tuple[str, str, tuple[str, ...]], raw: bytes, joined: bool
) -> None:
    """Never an internal error (exit 1) where the value is written out later, whatever the bytes
    and however the flag is given (`--flag VALUE`, `--flag=VALUE`)."""
    refused_in_process(target, raw, joined)


def test_every_variable_a_command_reads_is_one_it_checks() -> None:
    """The environment each command's code reads (its own modules and those it imports) is in
    the list its start checks: a new variable cannot be forgotten there."""
    read = re.compile(r'(?:environ\.get|environ\[|getenv|_env_flag)\(?\s*"([A-Z][A-Z0-9_]*)"')
    for command, module in COMMANDS.items():
        listed = subprocess.run(
            [sys.executable, "-c", f"import sys, {module}; print(*sorted(sys.modules))"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        ours = [m for m in listed if m.split(".")[0] in ("exporter", "mig_exporter",
                                                         "status_updater", "topology")]  # fmt: skip
        sources = "".join(Path(importlib.import_module(m).__file__ or "").read_text() for m in ours)
        # Under mutmut the sources also hold its mutants, whose strings it wraps in XX...XX.
        found = {v for v in read.findall(sources) if not (v.startswith("XX") and v.endswith("XX"))}
        assert found <= set(cli_module(command).ENVIRONMENT), command


@settings(derandomize=True, max_examples=examples(12), deadline=None)
@given(st.sampled_from([t for t in TARGETS if t[1] == "env" or t[2][-1] in ("", "--hostname",
       "--driver-version", "--identity", "--node", "--node-name")]), NOT_UTF8)  # fmt: skip
def test_a_command_run_with_bytes_that_are_not_utf8_says_so_in_one_line(
    target: tuple[str, str, tuple[str, ...]], raw: bytes
) -> None:
    """As a user runs it: a process whose environment or command line holds those bytes."""
    command, kind, name = target
    env = {k: v for k, v in os.environb.items() if k != b"KUBERNETES_SERVICE_HOST"}
    env[b"KUBECONFIG"] = b"/nonexistent/kubeconfig"
    argv: list[bytes] = []
    if kind == "env":
        env[name[0].encode()] = raw
    else:
        argv = [os.fsencode(a) for a in name if a] + [raw]
    done = subprocess.run([os.fsencode(sys.executable), b"-m", command.encode(), *argv], env=env,
                          cwd=ROOT, capture_output=True, timeout=60, check=False)  # fmt: skip
    lines = done.stderr.decode(errors="replace").splitlines()
    assert (done.returncode, len(lines)) == (2, 1), lines
    what = f"environment variable {name[0]}" if kind == "env" else (
        f"argument {name[-1]}" if name[-1] else f"argument {len(name)}")  # fmt: skip
    assert f"{what}: not UTF-8 text: {raw[:60]!r}" in lines[0]
