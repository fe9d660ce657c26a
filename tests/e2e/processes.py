"""Real ``chaosp2p peer`` processes on 127.0.0.1 for end-to-end tests, always cleaned up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

READY_TIMEOUT_S = 20.0
ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, timeout_s: float = 30.0, check: bool = False) -> subprocess.CompletedProcess[str]:
    """Run one ``chaosp2p`` command to completion."""
    return subprocess.run(
        [sys.executable, "-m", "chaosp2p", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
        stdin=subprocess.DEVNULL,
    )


def status(addr: str, *extra: str) -> dict[str, Any]:
    """``chaosp2p status ADDR --json`` parsed."""
    result = cli("status", addr, "--json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def wait_until(condition: Any, *, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll ``condition()`` until true; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


@dataclass
class PeerProcess:
    """One running ``chaosp2p peer``."""

    process: subprocess.Popen[str]
    workdir: Path
    peer_id: str = ""
    addrs: list[str] = field(default_factory=list)

    @property
    def addr(self) -> str:
        return self.addrs[0]

    @property
    def log_path(self) -> Path:
        return self.workdir / "stderr.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class Swarm:
    """Starts peers and guarantees they are gone when the test ends."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.peers: list[PeerProcess] = []

    def start(
        self,
        *,
        bootstrap: Sequence[str] = (),
        extra: Sequence[str] = (),
        wait_ready: bool = True,
        identity: Path | None = None,
        command: Sequence[str] = ("peer", "--listen", "/ip4/127.0.0.1/tcp/0", "--profile", "local"),
        module: str = "chaosp2p",
    ) -> PeerProcess:
        """Start ``python -m MODULE COMMAND ... --ready-file F`` and wait until it listens."""
        workdir = self.root / f"peer{len(self.peers)}"
        workdir.mkdir()
        ready = workdir / "ready.json"
        args = [sys.executable, "-m", module, *command, "--ready-file", str(ready)]
        for addr in bootstrap:
            args += ["--bootstrap", addr]
        if identity is not None:
            args += ["--identity", str(identity)]
        args += list(extra)
        with (workdir / "stdout.log").open("w") as stdout, (workdir / "stderr.log").open("w") as stderr:
            # The child keeps its own copies of the descriptors; ours close right away.
            process = subprocess.Popen(
                args, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, text=True, cwd=ROOT
            )
        peer = PeerProcess(process, workdir)
        self.peers.append(peer)
        if wait_ready:
            wait_until(
                lambda: ready.exists() or process.poll() is not None,
                timeout_s=READY_TIMEOUT_S,
                what=f"process {len(self.peers)} to listen",
            )
            if process.poll() is not None:
                pytest.fail(f"process exited with {process.returncode}: {peer.log()}")
            info = json.loads(ready.read_text())
            peer.peer_id, peer.addrs = info["peer_id"], info["addrs"]
        return peer

    def stop_all(self) -> None:
        for peer in self.peers:
            peer.stop()


@pytest.fixture
def swarm(tmp_path: Path) -> Iterator[Swarm]:
    """A factory for real peer processes, all stopped (SIGKILL if need be) after the test."""
    group = Swarm(tmp_path)
    try:
        yield group
    finally:
        group.stop_all()
