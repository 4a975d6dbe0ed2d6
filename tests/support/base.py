"""What every test folder uses: where the repository and its samples are, how many examples a
generated test draws, and a way to run the CLIs as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import freezegun
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "samples" / "mig"
# freezegun scans every module; the kubernetes client imports pydantic models lazily on attribute
# access, and those cannot be built around a fake datetime.
freezegun.configure(extend_ignore_list=["pydantic", "kmock", "kubernetes"])

# `make mutation` reruns the generated tests for each of ~10,000 mutants. There they draw a fixed
# sixth of their usual examples: each mutant's verdict is reproducible and the run takes hours, not
# days. A score measured so is a lower bound of the full suite's.
# `make test` is deterministic: each generated test draws the same examples on every run, so CI
# never goes red by chance. `make test-slow` explores (HYPOTHESIS_PROFILE=explore): new random
# examples each run, ten times as many; a failure it finds is kept as an @example once fixed.
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
MUTATION = PROFILE == "mutation"
EXPLORE = PROFILE == "explore"
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("mutation", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(PROFILE)


def examples(usual: int) -> int:
    """How many examples a generated test draws: `usual`, a sixth of it under mutation, ten
    times it when exploring."""
    if MUTATION:
        return max(8, usual // 6)
    return usual * 10 if EXPLORE else usual


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` in a fresh process, from the repository root.

    Under mutation, in this process instead: mutmut picks the tests that run a mutant by the
    calls it saw in the test process, and would never pick a test whose work is a child's.
    """
    if MUTATION and args[0] in ("exporter", "status_updater", "topology"):
        return _in_process(list(args), env or {})
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    import contextlib
    import importlib
    import io
    import logging

    module = {"exporter": "exporter.cli", "status_updater": "status_updater.cli",
              "topology": "topology.__main__"}[args[0]]  # fmt: skip
    main = importlib.import_module(module).main
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.StringIO()
    handler = logging.StreamHandler(err)  # main's basicConfig is a no-op under pytest
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    saved_env, saved_level = dict(os.environ), root.level
    os.environ.update(env)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(args[1:])
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 1
    finally:
        root.removeHandler(handler)
        root.setLevel(saved_level)
        os.environ.clear()
        os.environ.update(saved_env)
    stdout = out.buffer.getvalue().decode()  # type: ignore[attr-defined]
    return subprocess.CompletedProcess(["python", "-m", *args], code, stdout, err.getvalue())
