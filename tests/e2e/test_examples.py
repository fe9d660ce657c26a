"""The example training script works as documented: a second peer catches up from the first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .processes import ROOT, wait_until

pytest.importorskip("torch")
EXAMPLE = ROOT / "examples" / "elastic_training.py"
LOCAL_EXAMPLE = (sys.executable, str(EXAMPLE), "--profile", "local")  # the example's default (lan) is for real hosts


def test_a_joining_peer_catches_up_and_continues(tmp_path: Path) -> None:
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            [*LOCAL_EXAMPLE, "--steps", "60", "--publish-every", "20", "--linger", "60"],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_until(
            lambda: "step 60" in log.read_text() or first.poll() is not None,
            timeout_s=90,
            what="the first peer to train 60 steps",
        )
        address = re.search(r"listening on (\S+)", log.read_text())
        assert address, log.read_text()
        joined = subprocess.run(
            [*LOCAL_EXAMPLE, "--join", address.group(1), "--steps", "80", "--seed", "1"],
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        assert joined.returncode == 0, joined.stderr
        assert "caught up: loaded step 60" in joined.stdout
        assert "step 80:" in joined.stdout
        assert "step 20:" not in joined.stdout  # it continued from 60, not from scratch
    finally:
        first.terminate()
        first.wait(10)
