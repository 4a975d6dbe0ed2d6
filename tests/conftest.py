"""Shared fixtures: the repository's samples and a way to run the CLIs as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import freezegun
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples" / "mig"
sys.path.insert(0, str(Path(__file__).resolve().parent))
# freezegun scans every module; the kubernetes client imports pydantic models lazily on attribute
# access, and those cannot be built around a fake datetime.
freezegun.configure(extend_ignore_list=["pydantic", "kmock", "kubernetes"])


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
