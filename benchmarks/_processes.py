"""Child processes for the real-process benchmarks (dht.py, membership.py).

A :class:`PeerProcess` is one child that announces itself with a ready file; a :class:`ProcessGroup`
starts them in their own directories under a root and makes sure they are all gone at the end.
:func:`profile_argument` is what the children get as ``--profile``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from chaosp2p.dht import DHTConfig
from chaosp2p.protocols.membership import MembershipConfig


@dataclasses.dataclass
class PeerProcess:
    """One running child (stdout/stderr go to files in its own directory) that writes a ready file."""

    process: subprocess.Popen[bytes]
    workdir: Path
    peer_id: str = ""
    addrs: list[str] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def addr(self) -> str:
        return self.addrs[0]

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_share(self) -> float | None:
        """CPU seconds (user + system) this process used so far / its age (start-up included)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") / (time.monotonic() - self.started)

    def check_ready(self) -> bool:
        """True once the ready file is there; raises if the process exited before listening."""
        if self.peer_id:
            return True
        ready = self.workdir / "ready.json"
        if ready.exists():
            info = json.loads(ready.read_text())  # written by rename: never half a file
            self.peer_id, self.addrs = info["peer_id"], info["addrs"]
            return True
        if self.process.poll() is not None:
            tail = (self.workdir / "stderr.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"process exited with {self.process.returncode} before listening:\n{tail}")
        return False

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def kill9(self) -> None:
        """SIGKILL and wait for the exit."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def terminate(self) -> None:
        """Ask for a clean shutdown (SIGCONT first in case it is stopped). Send it once: trio re-raises a
        second SIGTERM that is still pending when the peer closes its signal receiver, which kills it."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.send_signal(signal.SIGCONT)
                self.process.terminate()

    def reap(self, timeout_s: float = 10.0) -> None:
        """Wait for the exit after :meth:`terminate`; SIGKILL if it does not come in time."""
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


async def poll(condition: Callable[[], bool], interval_s: float = 0.05) -> None:
    """Return once ``condition()`` holds (ready files and other processes' views have no event to await)."""
    while True:
        if condition():
            return
        await anyio.sleep(interval_s)


class ProcessGroup:
    """Starts child processes in their own directories under ``root``; :meth:`stop_all` makes sure
    they are all gone."""

    def __init__(self, root: Path, ready_timeout_s: float) -> None:
        self.root = root
        self.ready_timeout_s = ready_timeout_s
        self.procs: list[PeerProcess] = []

    def launch(
        self, args: Sequence[str], workdir_name: str, preexec_fn: Callable[[], None] | None = None
    ) -> PeerProcess:
        """Start ``args`` in the new directory ``root/workdir_name``; ``{ready}`` in an argument becomes
        the path of the ready file the child is to write there."""
        workdir = self.root / workdir_name
        workdir.mkdir()
        argv = [a.replace("{ready}", str(workdir / "ready.json")) for a in args]
        with (workdir / "stdout.log").open("wb") as out, (workdir / "stderr.log").open("wb") as err:
            process = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)
        peer = PeerProcess(process, workdir)
        self.procs.append(peer)
        return peer

    async def wait_ready(self, peers: Sequence[PeerProcess]) -> None:
        with anyio.fail_after(self.ready_timeout_s):
            await poll(lambda: all(p.check_ready() for p in peers))

    def stop_all(self) -> None:
        """SIGTERM every process first (they shut down in parallel), then wait for each."""
        for peer in self.procs:
            peer.terminate()
        for peer in self.procs:
            peer.reap()

    def exit_summary(self, is_error_line: Callable[[str], bool]) -> dict[str, Any]:
        """Exit codes of the processes shut down with SIGTERM (not the SIGKILLed ones), and the lines of
        their stderr that ``is_error_line`` picks, with how often each was printed."""
        codes: dict[str, int] = {}
        errors: dict[str, int] = {}
        for peer in self.procs:
            code = peer.process.returncode
            if code == -signal.SIGKILL:
                continue
            codes[str(code)] = codes.get(str(code), 0) + 1
            for line in (peer.workdir / "stderr.log").read_text(errors="replace").splitlines():
                if is_error_line(line):
                    text = line.strip()[:160]
                    errors[text] = errors.get(text, 0) + 1
        return {"exit_codes": codes, "error_lines": errors}


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    raise TypeError(f"no TOML form for {value!r}")


def profile_argument(profile: str, root: Path) -> str:
    """What to pass to ``--profile``: ``local``/``wan`` as shipped; ``lan`` as a generated profile file.

    The file sets every field of ``DHTConfig.lan()`` and ``MembershipConfig.lan()`` -- the same timing
    ``PeerConfig.lan()`` (so ``--profile lan``) gives -- and the in-process peers read it too, so both
    sides of a run use exactly the values written down in it.
    """
    if profile != "lan":
        return profile
    lines = ['profile = "lan"']
    for section, config in (("dht", DHTConfig.lan()), ("membership", MembershipConfig.lan())):
        lines.append(f"[{section}]")
        lines += [
            f"{f.name} = {toml_value(getattr(config, f.name))}"
            for f in dataclasses.fields(config)
            if getattr(config, f.name) is not None
        ]
    path = root / "lan-intended.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)
