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

    def __init__(self, workdir: Path, *, join: list[str], mode_flags: list[str], steps: int = 1000) -> None:
        workdir.mkdir()
        self.ready = workdir / "ready.json"
        self.metrics = workdir / "metrics.jsonl"
        self.log_path = workdir / "out.log"
        command = [sys.executable, str(EXAMPLE), "--steps", str(steps), "--target-batch-size", "256"]
        command += ["--dataset-size", "1024", "--ready-file", str(self.ready), "--metrics-file", str(self.metrics)]
        command += mode_flags
        for addr in join:
            command += ["--join", addr]
        with self.log_path.open("w") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """Every metrics record so far."""
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def epochs(self) -> list[dict[str, Any]]:
        """One record per finished epoch."""
        return [line for line in self.records() if "step" in line]

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

        def both_recorded_two_epochs_together() -> bool:
            # Each peer writes its record when its own step returns: the founder's record of an
            # epoch may come a moment after the joiner's, so wait for both sides.
            assert joiner is not None
            assert joiner.process.poll() is None, joiner.log()
            assert founder.process.poll() is None, founder.log()
            together = {e["step"] for e in founder.epochs() if e["members"] == 2}
            return len([e for e in joiner.epochs() if e["members"] == 2 and e["step"] in together]) >= 2

        wait_until(both_recorded_two_epochs_together, timeout_s=180, what="both peers to record 2 epochs together")
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


@pytest.mark.timeout(120)
def test_a_quickstart_peer_idle_after_its_epochs_does_not_hold_the_other_and_rejoins_when_it_trains_again(
    tmp_path: Path,
) -> None:
    # hivemind's quickstart semantics: a peer that finished its epochs stays up (--linger) without
    # calling step(). In a two-member run nobody can sign it out (two signers are needed), so it
    # steps aside itself; the other trains on alone, and when the idle peer trains again
    # (--resume-epochs) it rejoins with the run's parameters. It used to hold the other forever.
    # The busy peer founds the run (the idle one must be a member before it goes idle: peer start-up
    # takes seconds here); the idle one joins, finishes its epoch (--steps 1), lingers, resumes.
    busy = QuickstartPeer(tmp_path / "busy", join=[], mode_flags=[])
    idle: QuickstartPeer | None = None
    try:
        idle_flags = ["--linger", "6", "--resume-epochs", "3"]
        idle = QuickstartPeer(tmp_path / "idle", join=[busy.addr()], mode_flags=idle_flags, steps=1)

        def went_idle() -> bool:
            assert idle is not None and busy.process.poll() is None, busy.log()
            return any(r.get("event") == "idle" for r in idle.records())

        wait_until(went_idle, timeout_s=60, what="the first peer to finish its epochs and go idle")
        idle_since = next(r["time"] for r in idle.records() if r.get("event") == "idle")

        def busy_trains_on_alone() -> bool:
            assert busy.process.poll() is None, busy.log()
            return len([e for e in busy.epochs() if e["time"] > idle_since and e["members"] == 1]) >= 3

        wait_until(busy_trains_on_alone, timeout_s=20, what="the busy peer to train on without the idle one")
        assert idle.process.wait(60) == 0, idle.log()
        assert "steps aside" in idle.log() and "rejoining as a newcomer" in idle.log()
        resumed = next(r["time"] for r in idle.records() if r.get("event") == "resumed")
        after = [e for e in idle.epochs() if e["time"] > resumed]
        assert len(after) >= 3
        theirs = {e["step"]: e for e in busy.epochs()}
        shared = [e for e in after if e["step"] in theirs and e["members"] == 2]
        assert shared, "the idle peer never trained with the other again"
        for epoch in shared:
            assert theirs[epoch["step"]]["members"] == 2
            assert epoch["param_digest"] == theirs[epoch["step"]]["param_digest"], f"differ after {epoch['step']}"
    finally:
        busy.stop()
        if idle is not None:
            idle.stop()
