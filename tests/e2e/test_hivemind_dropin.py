"""hivemind's quickstart runs through ``chaosp2p.hivemind``: two real peer processes train together.

The script is ``examples/hivemind_quickstart.py`` (hivemind's quickstart with only the import line and
the data set changed), shrunk to small epochs with its flags. The second peer joins with
``initial_peers`` while the first trains; both must then finish epochs together, holding identical
parameters after each, and leave gracefully on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .processes import ROOT, wait_until

pytest.importorskip("torch")
EXAMPLE = ROOT / "examples" / "hivemind_quickstart.py"


class QuickstartPeer:
    """One quickstart process with its ready file, metrics and log."""

    def __init__(self, workdir: Path, *, join: list[str], mode_flags: list[str]) -> None:
        workdir.mkdir()
        self.ready = workdir / "ready.json"
        self.metrics = workdir / "metrics.jsonl"
        self.log_path = workdir / "out.log"
        command = [sys.executable, str(EXAMPLE), "--steps", "1000", "--target-batch-size", "256"]
        command += ["--dataset-size", "1024", "--ready-file", str(self.ready), "--metrics-file", str(self.metrics)]
        command += mode_flags
        for addr in join:
            command += ["--join", addr]
        with self.log_path.open("w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def epochs(self) -> list[dict[str, Any]]:
        """One record per finished epoch."""
        if not self.metrics.exists():
            return []
        lines = [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]
        return [line for line in lines if "step" in line]

    def addr(self) -> str:
        wait_until(
            lambda: self.ready.exists() or self.process.poll() is not None, timeout_s=90, what="the first peer to start"
        )
        assert self.process.poll() is None, self.log()
        return str(json.loads(self.ready.read_text())["addrs"][0])

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return -9


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode_flags", [[], ["--no-local-updates"]], ids=["local-updates", "gradient-averaging"])
def test_two_quickstart_peers_finish_epochs_together_with_identical_parameters(
    tmp_path: Path, mode_flags: list[str]
) -> None:
    founder = QuickstartPeer(tmp_path / "founder", join=[], mode_flags=mode_flags)
    joiner: QuickstartPeer | None = None
    try:
        joiner = QuickstartPeer(tmp_path / "joiner", join=[founder.addr()], mode_flags=mode_flags)

        def joiner_trained_two_epochs_as_a_member() -> bool:
            assert joiner is not None
            assert joiner.process.poll() is None, joiner.log()
            assert founder.process.poll() is None, founder.log()
            return len([e for e in joiner.epochs() if e["members"] == 2]) >= 2

        wait_until(joiner_trained_two_epochs_as_a_member, timeout_s=180, what="the joiner to train 2 epochs")
        assert "Joined run 'my_cifar_run' at epoch" in joiner.log()
        theirs = {e["step"]: e for e in founder.epochs()}
        shared = [e for e in joiner.epochs() if e["step"] in theirs]
        assert len(shared) >= 2
        assert min(e["step"] for e in joiner.epochs()) >= 1, "the joiner started from epoch 0, not the run's state"
        for epoch in shared:
            mine = theirs[epoch["step"]]
            assert epoch["members"] == mine["members"] == 2
            assert epoch["config_digest"] == mine["config_digest"]
            assert epoch["param_digest"] == mine["param_digest"], f"parameters differ after epoch {epoch['step']}"
            assert epoch["samples"] + mine["samples"] >= 256  # an epoch: the target batch, all peers together
        assert max(e["step"] for e in shared) + 1 >= 2  # local_epoch >= 2 on both

        # SIGTERM is a graceful leave: the joiner goes, the founder trains on alone, then goes too.
        assert joiner.stop() == 0, joiner.log()
        assert "SIGTERM: leaving the run" in joiner.log()
        # (the leave takes effect a step or two after SIGTERM; the leaver serves those with zero weight)
        wait_until(lambda: founder.epochs()[-1]["members"] == 1, timeout_s=60, what="the founder to train on alone")
        assert founder.stop() == 0, founder.log()
        assert "SIGTERM: leaving the run" in founder.log()
    finally:
        founder.stop()
        if joiner is not None:
            joiner.stop()
