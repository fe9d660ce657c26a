"""Static checks are part of the suite: ruff on everything, mypy --strict on the package."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the test extra")
def test_ruff_is_clean() -> None:
    folders = [name for name in ("chaosp2p", "tests", "benchmarks", "examples") if (ROOT / name).is_dir()]
    result = run("ruff", "check", *folders)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    result = run(sys.executable, "-m", "mypy", "chaosp2p")
    assert result.returncode == 0, result.stdout + result.stderr
