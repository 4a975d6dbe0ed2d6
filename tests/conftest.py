"""Shared fixtures: the repository's samples and a way to run the CLIs as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import freezegun
import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "mig"
sys.path.insert(0, str(Path(__file__).resolve().parent))
# freezegun scans every module; the kubernetes client imports pydantic models lazily on attribute
# access, and those cannot be built around a fake datetime.
freezegun.configure(extend_ignore_list=["pydantic", "kmock", "kubernetes"])

# `make mutation` reruns the generated tests for each of ~10,000 mutants. There they draw a fixed
# sixth of their usual examples: each mutant's verdict is reproducible and the run takes hours, not
# days. A score measured so is a lower bound of the full suite's.
MUTATION = os.environ.get("HYPOTHESIS_PROFILE") == "mutation"
settings.register_profile("mutation", derandomize=True, database=None)
settings.load_profile("mutation" if MUTATION else "default")


def examples(usual: int) -> int:
    """How many examples a generated test draws: `usual`, or a sixth of it under mutation."""
    return max(8, usual // 6) if MUTATION else usual


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m <args>` in a fresh process, from the repository root."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def samples() -> Path:
    return SAMPLES
