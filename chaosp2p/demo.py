"""``chaosp2p demo``: a local swarm that joins, loses a peer, heals, and hands its state to a newcomer.

Everything runs on 127.0.0.1 with the built-in ``local`` profile. Four peers are real processes
(``chaosp2p state serve``) holding the same generated model + Adam state; the demo's own peer is the
newcomer. The demo narrates what it observes through the public API -- nothing is staged:

1. the four peers start and find each other (membership join events);
2. one of them is killed with SIGKILL; the others detect it SWIM-style and the view heals;
3. the newcomer loads the state from the survivors in parallel and checks it bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from chaosp2p.api import AsyncPeer, open_peer
from chaosp2p.errors import ChaosError
from chaosp2p.protocols.membership import MemberState, PeerFailed, PeerJoined
from chaosp2p.protocols.transfer import TransferProgress
from chaosp2p.runtime.config import PeerConfig

RUN = "demo-run"
STEP = 100
STATE_MIB = 96


def demo_state(seed: int = 0) -> dict[str, np.ndarray]:
    """A model's weights and its Adam moments (~96 MiB), generated, identical for every seed."""
    rng = np.random.default_rng(seed)
    rows = STATE_MIB * 2**20 // 3 // (1024 * 4)
    weight = rng.standard_normal((rows, 1024), dtype=np.float32)
    return {
        "model.weight": weight,
        "optimizer.exp_avg": (weight * 0.1).astype(np.float32),
        "optimizer.exp_avg_sq": (weight * weight * 0.01).astype(np.float32),
        "optimizer.step": np.array(STEP, dtype=np.int64),
    }


@contextmanager
def source_processes(
    count: int, checkpoint: Path, workdir: Path
) -> Iterator[list[tuple[subprocess.Popen[bytes], str]]]:
    """Start ``count`` ``chaosp2p state serve`` processes (the first bootstraps the others)."""
    started: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        bootstrap: list[str] = []
        for index in range(count):
            ready = workdir / f"peer{index}.json"
            command = [
                sys.executable,
                "-m",
                "chaosp2p",
                "state",
                "serve",
                str(checkpoint),
                "--run",
                RUN,
                "--step",
                str(STEP),
                "--profile",
                "local",  # one machine; the CLI's default (lan) is for real hosts
                "--ready-file",
                str(ready),
                *bootstrap,
            ]
            log = (workdir / f"peer{index}.log").open("wb")
            process = subprocess.Popen(command, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
            log.close()
            deadline = time.monotonic() + 30
            while not ready.exists():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise ChaosError(f"demo peer {index + 1} did not start; see {workdir / f'peer{index}.log'}")
                time.sleep(0.05)
            addr = json.loads(ready.read_text())["addrs"][0]
            started.append((process, addr))
            bootstrap = bootstrap or ["--bootstrap", addr]
        yield started
    finally:
        for process, _ in started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, _ in started:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()


def members_table(peer: AsyncPeer, names: dict[str, str]) -> Table:
    table = Table(title="membership view of the newcomer", title_justify="left")
    for column in ("peer", "state", "incarnation", "cpu cores"):
        table.add_column(column)
    for member in peer.members():
        name = names.get(str(member.peer_id), "newcomer (this process)" if member.is_local else "?")
        cores = "-" if member.resources is None else str(member.resources.cpu_cores)
        style = {"alive": "green", "failed": "red", "suspect": "yellow"}.get(member.state.value, "")
        table.add_row(name, f"[{style}]{member.state.value}[/]", str(member.incarnation), cores)
    return table


async def run_demo(peer_count: int, console: Console) -> None:
    """Run the demo with ``peer_count`` source peers plus the newcomer."""
    console.rule("[bold]chaosp2p demo: a local swarm on 127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="chaosp2p-demo-") as tmp:
        workdir = Path(tmp)
        state = demo_state()
        checkpoint = workdir / "state.npz"
        arrays: dict[str, Any] = dict(state)
        np.savez(checkpoint, **arrays)
        total = sum(a.nbytes for a in state.values())
        console.print(f"generated a model + Adam state of {total / 2**20:.0f} MiB ({len(state)} tensors)")
        with source_processes(peer_count, checkpoint, workdir) as sources:
            names = {}
            for index, (process, addr) in enumerate(sources, 1):
                names[addr.rsplit("/p2p/", 1)[1]] = f"peer {index} (pid {process.pid})"
                console.print(f"[green]joined[/] peer {index}: {addr}")
            config = PeerConfig.local(bootstrap=(sources[0][1],))
            async with open_peer(config) as newcomer:
                await show_join(newcomer, names, peer_count, console)
                await show_failure(newcomer, sources, names, console)
                await show_state_download(newcomer, state, peer_count - 1, console)
    console.rule("[bold]done: every peer process was stopped")


async def show_join(newcomer: AsyncPeer, names: dict[str, str], peer_count: int, console: Console) -> None:
    console.rule("1. the newcomer joins through peer 1 and learns the swarm by gossip")
    started = time.monotonic()
    with anyio.fail_after(20):
        async for event in newcomer.events():
            if isinstance(event, PeerJoined):
                console.print(f"  membership: {names.get(str(event.peer), event.peer.short())} is a member")
            alive = [m for m in newcomer.members() if m.state is MemberState.ALIVE]
            if len(alive) == peer_count + 1:
                break
    console.print(f"  all {peer_count + 1} peers alive in every view after {time.monotonic() - started:.2f} s")
    console.print(members_table(newcomer, names))


async def show_failure(
    newcomer: AsyncPeer, sources: list[tuple[subprocess.Popen[bytes], str]], names: dict[str, str], console: Console
) -> None:
    console.rule("2. a peer crashes (SIGKILL), the swarm notices and heals")
    victim, victim_addr = sources[-1]
    victim_id = victim_addr.rsplit("/p2p/", 1)[1]
    events = newcomer.events()
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    console.print(f"  killed {names[victim_id]}")
    with anyio.fail_after(30):
        async for event in events:
            if isinstance(event, PeerFailed) and str(event.peer) == victim_id:
                break
    console.print(
        f"  membership: {names[victim_id]} [red]failed[/], detected after "
        f"{time.monotonic() - killed_at:.2f} s without any coordinator"
    )
    console.print(members_table(newcomer, names))


async def show_state_download(
    newcomer: AsyncPeer, state: dict[str, np.ndarray], survivors: int, console: Console
) -> None:
    console.rule("3. the newcomer loads the training state from the survivors in parallel")
    with anyio.fail_after(30):  # the survivors announce themselves in the DHT as they come up
        while len(await newcomer.state.find_sources(RUN, limit=16)) < survivors:  # noqa: ASYNC110 - a DHT lookup
            await anyio.sleep(0.2)
    progress = Progress(
        TextColumn("  {task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=console
    )
    task = progress.add_task(f"{RUN} step {STEP}", total=sum(a.nbytes for a in state.values()))

    def update(report: TransferProgress) -> None:
        progress.update(task, total=report.bytes_total, completed=report.bytes_done)

    with progress:
        loaded = await newcomer.load_state(RUN, progress=update, max_sources=survivors)
        progress.update(task, completed=loaded.completed.manifest.total_bytes)
    exact = all(np.array_equal(loaded.arrays[name], array) for name, array in state.items())
    console.print(
        f"  loaded step {loaded.step} in {loaded.completed.elapsed_s:.2f} s from "
        f"{len(loaded.completed.bytes_by_source)} sources, every chunk hash-verified; "
        f"bit-exact: {'[green]yes[/]' if exact else '[red]NO[/]'}"
    )
    for peer, count in loaded.completed.bytes_by_source:
        console.print(f"    {peer.short()}: {count / 2**20:6.1f} MiB")
    if not exact:
        raise ChaosError("the loaded state differs from the original")
