"""Training runs of real peer processes (the digits task) through joins, a SIGKILL and SIGTERM.

Each peer is ``python -m chaosp2p.trainers.digits`` on 127.0.0.1 with the ``local`` profile; the
metrics files they write (one JSON line per step, with the configuration digest, epoch, members
and a hash of the parameters) are what the assertions read. Every process is stopped at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .processes import wait_until

pytest.importorskip("torch")
pytest.importorskip("sklearn")


class Trainer:
    def __init__(self, name: str, workdir: Path, join: list[str], steps: int, pace: float) -> None:
        self.name = name
        self.ready = workdir / f"{name}.ready"
        self.metrics = workdir / f"{name}.jsonl"
        self.log = workdir / f"{name}.log"
        command = [sys.executable, "-m", "chaosp2p.trainers.digits", "--steps", str(steps), "--batch", "48"]
        command += ["--pace", str(pace), "--ready-file", str(self.ready), "--metrics-file", str(self.metrics)]
        for addr in join:
            command += ["--join", addr]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(lambda: self.ready.exists() or self.process.poll() is not None, timeout_s=120, what=f"{name} ready")
        assert self.process.poll() is None, self.log.read_text()
        info = json.loads(self.ready.read_text())
        self.peer_id: str = info["peer_id"]
        self.addr: str = info["addrs"][0]

    def records(self) -> list[dict[str, Any]]:
        if not self.metrics.exists():
            return []
        out = []
        for line in self.metrics.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return out

    def steps(self) -> dict[int, dict[str, Any]]:
        return {r["step"]: r for r in self.records() if "param_digest" in r and "step" in r}

    def members(self) -> int:
        steps = self.steps()
        return int(steps[max(steps)]["members"]) if steps else 0


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[list[Trainer]]:
    started: list[Trainer] = []
    yield started
    for trainer in started:
        if trainer.process.poll() is None:
            trainer.process.kill()
    for trainer in started:
        trainer.process.wait(10)


def _agree(survivors: list[Trainer], since: int) -> int:
    """Assert every survivor has the same config digest, epoch and parameters at common steps."""
    tables = [t.steps() for t in survivors]
    common = set.intersection(*(set(s for s in table if s >= since) for table in tables))
    assert common, "the survivors share no step"
    for step in sorted(common):
        rows = [table[step] for table in tables]
        assert len({r["param_digest"] for r in rows}) == 1, f"parameters differ at step {step}: {rows}"
        assert len({r["config_digest"] for r in rows}) == 1, f"configurations differ at step {step}"
        assert len({r["epoch"] for r in rows}) == 1
    return len(common)


@pytest.mark.timeout(900)
def test_a_join_completes_while_a_member_is_killed_and_survivors_agree(tmp_path: Path, trainers: list[Trainer]) -> None:
    steps = 2000
    first = Trainer("a", tmp_path, [], steps, pace=0.05)
    trainers.append(first)
    for name in ("b", "c", "d"):
        trainers.append(Trainer(name, tmp_path, [first.addr], steps, pace=0.05))
    wait_until(lambda: first.members() == 4, timeout_s=300, what="a 4-member run")
    newcomer = Trainer("e", tmp_path, [first.addr], steps, pace=0.05)
    trainers.append(newcomer)
    # Kill a member while the newcomer is still joining (it has not trained a step yet).
    victim = trainers[2]
    wait_until(lambda: newcomer.log.exists(), timeout_s=10, what="the newcomer to start")
    victim.process.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert not newcomer.steps(), "the newcomer was admitted before the kill; the test did not overlap them"
    survivors = [t for t in trainers if t is not victim]
    wait_until(
        lambda: (
            all(t.members() == 4 and any(r["members"] == 4 for r in t.steps().values()) for t in survivors)
            and newcomer.steps()
        ),
        timeout_s=180,
        what="the newcomer admitted and the killed member removed",
    )
    since = min(newcomer.steps())
    wait_until(lambda: all(max(t.steps(), default=0) > since + 20 for t in survivors), timeout_s=60, what="progress")
    assert _agree(survivors, since) >= 10
    operations = [r for r in first.records() if r.get("event") == "operation" and r["subject"] == victim.peer_id]
    removal = [r for r in operations if r["kind"] == "fail"]
    assert removal, operations
    assert removal[0]["committed_at"] - killed_at < 30
    for trainer in survivors:
        trainer.process.send_signal(signal.SIGTERM)
    for trainer in survivors:
        assert trainer.process.wait(30) == 0, trainer.log.read_text()[-2000:]
