"""State benchmark: how fast a newcomer loads model + Adam state, against the limits and the alternatives.

    python benchmarks/state.py [--gib 1] [--repeats 3]
                               [--scenarios single,capped,cli,kill,clikill,dhtkill,static,hivemind]
                               [--cap-sets 3,4] [--json out.json] [--hivemind-python PATH]

Sources are separate processes on 127.0.0.1 serving byte-identical state; every figure is a ratio to
a baseline measured in the same run, medians over --repeats (raw runs in the JSON). Every pull is
checked bit-exact (its arrays hashed against the state the sources were built from).

  single    one uncapped source, fresh sources each repeat: the first pull after the source started
            and a second one, next to plain unencrypted TCP moving the same bytes between two
            processes (interleaved with the pulls); also 2 and 4 uncapped sources
            (``--multi-sources``)
  capped    3 sources capped at 20/40/80 MB/s and 4 at 25/50/100/200 MB/s, through the API: the
            newcomer knowing nothing (it measures the links) and being told the caps, next to the
            lower bound S / sum(caps)
  cli       the same capped sets as ``chaosp2p state serve`` processes, pulled with
            ``chaosp2p state pull --bootstrap`` (DHT discovery included): the command's own
            timing (peer start + discovery + pull), its split (discovery, data phase, chunk
            verification), the process wall time, and each pull's plans and measured source rates
            (every run's ratio is printed: the slow ones are the point)
  kill      4 sources capped at 25/50/100/200 MB/s, the 100 MB/s one SIGKILLed at 40 %, next to the
            bound 0.4 S / sum(all caps) + 0.6 S / sum(remaining caps)
  clikill   3 ``chaosp2p state serve`` sources capped at 20/40/80 MB/s (fresh each repeat) and
            ``chaosp2p state pull --json``; the 80 MB/s source is SIGKILLed once its connections
            have sent its share of 40 % of the state (0.4 S x 80/140, ``ss``'s bytes_sent: the
            pull process shows no progress from outside), next to 0.4 S / sum(all caps) + 0.6 S /
            sum(remaining caps)
  dhtkill   the same, with a fresh newcomer peer in this process (it too knows only a bootstrap
            address and finds the sources in the DHT), killed by its progress callback once
            40 % is verified (exact, where ``clikill``'s trigger is a proxy)
  static    the 4 capped sources with static plans (no stealing, no re-planning): the optimal greedy
            plan, equal split, bandwidth-proportional split and the single fastest source
  hivemind  hivemind 1.1.12 ``load_state_from_peers`` on the same state, one donor (needs an
            interpreter with hivemind: --hivemind-python)
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import xxhash
from _common import median, print_table, write_json
from _state_data import model_and_adam_state
from _tcp_baseline import receive as tcp_receive

from chaosp2p import PeerConfig, open_peer
from chaosp2p.api.async_peer import AsyncPeer
from chaosp2p.errors import ChaosError
from chaosp2p.protocols.transfer import SourceEstimate, TransferProgress
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.scheduling import (
    ShardPlan,
    Source,
    plan_equal_split,
    plan_proportional_split,
    plan_shards,
    plan_single_source,
)
from chaosp2p.state.download import SourceAddress
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

HERE = Path(__file__).resolve().parent
RUN = "bench"
CAP_SETS: dict[str, tuple[float, ...]] = {
    "3 x 20/40/80 MB/s": (20e6, 40e6, 80e6),
    "4 x 25/50/100/200 MB/s": (25e6, 50e6, 100e6, 200e6),
}
CAP_SET_KEYS = {"3": "3 x 20/40/80 MB/s", "4": "4 x 25/50/100/200 MB/s"}
ACTIVE_CAP_SETS = dict(CAP_SETS)
MULTI_SOURCE_COUNTS = [2, 4]
"""How many uncapped sources ``single`` also pulls from after its one-source runs (``--multi-sources``)."""
"""The cap sets the ``capped`` and ``cli`` scenarios run (``--cap-sets``)."""
CLI_KILL_CAPS = (20e6, 40e6, 80e6)
CLI_KILL_INDEX = 2  # the fastest source (index 0, the bootstrap peer, must survive)
KILL_CAPS = (25e6, 50e6, 100e6, 200e6)
KILL_INDEX = 2  # the 100 MB/s source
KILL_AT = 0.4


def state_hash(arrays: Mapping[str, np.ndarray]) -> str:
    """xxh3-128 over every array's bytes, in name order (what "bit-exact" is checked with)."""
    hasher = xxhash.xxh3_128()
    for name in sorted(arrays):
        hasher.update(name.encode())
        hasher.update(np.ascontiguousarray(arrays[name]).view(np.uint8).data)
    return hasher.hexdigest()


# ---------------------------------------------------------------------------------------- sources
@dataclass
class SourceProcess:
    process: subprocess.Popen[bytes]
    peer: PeerID
    addr: Multiaddr
    cap: float | None

    def address(self, *, known: bool) -> SourceAddress:
        """The source as the newcomer sees it: the cap as a known estimate, or nothing (it measures)."""
        rate = self.cap if known and self.cap else None
        return SourceAddress(peer=self.peer, addrs=(self.addr.without_peer(),), bytes_per_s=rate, latency_s=0.0001)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)


def wait_ready(process: subprocess.Popen[bytes], ready: Path, timeout_s: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"a state source failed to start (exit {process.poll()})")
        time.sleep(0.05)
    time.sleep(0.05)  # the file is written in one call; give it a moment to be complete
    return json.loads(ready.read_text())  # type: ignore[no-any-return]


def start_sources(total: int, caps: Sequence[float | None], workdir: Path) -> list[SourceProcess]:
    """Source processes that know each other (the later ones bootstrap from the first), as a run's
    holders do; the newcomer then arrives in a swarm that has settled (its links probed)."""
    sources: list[SourceProcess] = []
    pending = []
    for index, cap in enumerate(caps):
        ready = workdir / f"source-{index}-{time.monotonic_ns()}.json"
        args = [sys.executable, str(HERE / "_state_source.py"), "--bytes", str(total), "--ready-file", str(ready)]
        if cap:
            args += ["--cap", str(cap)]
        if sources:
            args += ["--bootstrap", str(sources[0].addr)]
        args += ["--profile", PROFILE]
        with (workdir / f"source-{index}.log").open("ab") as log:
            process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        if not sources:  # the others need the first one's address
            sources.append(_ready_source(process, ready, cap))
        else:
            pending.append((process, ready, cap))
    sources += [_ready_source(process, ready, cap) for process, ready, cap in pending]
    time.sleep(SETTLE_S if len(sources) > 1 else 0)
    return sources


SETTLE_S = 3.0
"""Let the sources' membership finish probing the links between them before a pull is timed."""


def _ready_source(process: subprocess.Popen[bytes], ready: Path, cap: float | None) -> SourceProcess:
    info = wait_ready(process, ready)
    addr = Multiaddr.parse(info["addrs"][0])
    assert addr.peer_id is not None
    return SourceProcess(process, addr.peer_id, addr, cap)


def start_tcp_sender(total: int, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    ready = workdir / "tcp.json"
    args = [sys.executable, str(HERE / "_tcp_baseline.py"), "serve", "--bytes", str(total), "--ready-file", str(ready)]
    process = subprocess.Popen(args)
    return process, int(wait_ready(process, ready)["port"])


def start_cli_source(
    checkpoint: Path, cap: float, index: int, bootstrap: str, workdir: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """``chaosp2p state serve CHECKPOINT`` with an upload cap in its profile; returns it and its address."""
    profile = workdir / f"cap-{index}.toml"
    lines = [f'profile = "{PROFILE}"', "[peer]", 'listen = ["/ip4/127.0.0.1/tcp/0"]', "[transport]"]
    profile.write_text("\n".join([*lines, f"max_upload_bytes_per_s = {cap}", ""]))
    ready = workdir / f"cli-source-{index}-{time.monotonic_ns()}.json"
    args = ["state", "serve", str(checkpoint), "--run", RUN, "--step", "1000", "--profile", str(profile)]
    args += ["--ready-file", str(ready)] + (["--bootstrap", bootstrap] if bootstrap else [])
    with (workdir / f"cli-source-{index}.log").open("ab") as log:
        process = subprocess.Popen([sys.executable, "-m", "chaosp2p", *args], stdout=subprocess.DEVNULL, stderr=log)
    return process, str(wait_ready(process, ready)["addrs"][0])


def stop(sources: Sequence[SourceProcess | subprocess.Popen[bytes]]) -> None:
    processes = [s.process if isinstance(s, SourceProcess) else s for s in sources]
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


# ---------------------------------------------------------------------------------------- plans
class StaticPlanner:
    """A :class:`ShardPlanner` from one of the scheduling module's plan functions, cut on chunk bounds."""

    def __init__(self, plan: Callable[[int, list[Source]], ShardPlan]) -> None:
        self._plan = plan

    def plan(
        self,
        ranges: Sequence[tuple[int, int]],
        sources: Sequence[SourceEstimate],
        *,
        total_bytes: int,
        align_bytes: int,
    ) -> list[tuple[PeerID, int, int]]:
        sched = [Source(peer_id=s.peer, bytes_per_s=s.bytes_per_s or 1.0, latency_s=s.latency_s) for s in sources]
        out: list[tuple[PeerID, int, int]] = []
        for start, length in ranges:
            cursor = start
            for peer, offset, size in self._plan(length, sched).assignments:
                end = start + offset + size
                aligned = end if end == start + length else min(start + length, round(end / align_bytes) * align_bytes)
                if aligned > cursor:
                    out.append((peer, cursor, aligned - cursor))  # type: ignore[arg-type]
                    cursor = aligned
            if cursor < start + length and out:
                peer, offset, size = out[-1]
                out[-1] = (peer, offset, size + start + length - cursor)
        return out


def greedy(total: int, sources: list[Source]) -> ShardPlan:
    return plan_shards(total, sources, max_shards=4096)


STATIC_PLANS: dict[str, Callable[[int, list[Source]], ShardPlan]] = {
    "greedy (optimal)": greedy,
    "equal split": plan_equal_split,
    "bandwidth-proportional": plan_proportional_split,
    "single fastest source": plan_single_source,
}


# ---------------------------------------------------------------------------------------- pulls
@dataclass
class Pull:
    seconds: float
    bytes: int
    dropped: list[str]
    exact: bool
    shares: list[float]
    pull_s: float
    """From the first data request to the last chunk verified (``seconds`` adds the version vote,
    the leases and the manifest)."""


async def pull(
    newcomer: AsyncPeer,
    sources: Sequence[SourceProcess],
    expected: str,
    *,
    known: bool,
    config: TransferConfig,
    planner: Any = None,
    work_stealing: bool = True,
    progress: Callable[[TransferProgress], None] | None = None,
) -> Pull:
    started = time.perf_counter()
    loaded = await newcomer.state.load(
        RUN,
        sources=[s.address(known=known) for s in sources],
        config=config,
        planner=planner,
        work_stealing=work_stealing,
        progress=progress,
    )
    elapsed = time.perf_counter() - started
    total = loaded.completed.manifest.total_bytes
    exact = await anyio.to_thread.run_sync(state_hash, loaded.state.arrays) == expected
    by_source = dict(loaded.completed.bytes_by_source)
    loaded.result.staging.close()
    dropped = [f"{d.reason.value}: {d.detail}" for d in loaded.result.dropped]
    shares = [by_source.get(s.peer, 0) / total for s in sources]
    return Pull(elapsed, total, dropped, exact, shares, loaded.completed.elapsed_s)


PROFILE = "lan"
"""Timing of every peer here (sources and newcomers, API and CLI): the CLI's default. The ``local``
profile's fast membership timers cost each idle peer about 10 % of a core once four of them know
each other -- on two shared cores, that is CPU the transfer needs (a real swarm has a machine per
peer)."""


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def system_busy_s() -> float:
    """CPU seconds all processes of this machine have used so far (busy jiffies of /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class ForeignCpu:
    """CPU seconds used during a pull by processes that are not part of it (the other jobs on a
    shared machine): all busy time minus the sources', the newcomer's and this process's own.
    A pull that is slow while others took the CPU is told apart from one the planner made slow."""

    def __init__(self, sources: Sequence[subprocess.Popen[bytes]]) -> None:
        self._pids = [p.pid for p in sources]
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float, float]:
        ours = 0.0
        for pid in self._pids:
            try:
                ours += process_cpu_s(pid)
            except OSError:  # killed on purpose: what it used until then is already counted
                pass
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return system_busy_s(), ours, children.ru_utime + children.ru_stime, time.process_time()

    def stop(self) -> float:
        """Foreign CPU seconds since this object was made (not below 0: the counters tick coarsely)."""
        end = self._sample()
        busy, sources, children, own = (b - a for a, b in zip(self._start, end, strict=True))
        return max(0.0, busy - sources - children - own)


def new_peer() -> PeerConfig:
    return PeerConfig.profile_named(PROFILE, listen=("/ip4/127.0.0.1/tcp/0",))


def transfer_config() -> TransferConfig:
    return new_peer().transfer


async def scenario_single(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """One uncapped source (fresh each repeat): first and second pull, interleaved with plain TCP."""
    report: dict[str, Any] = {"first": [], "second": [], "tcp": [], "exact": [], "sources": {}}
    tcp, port = start_tcp_sender(total, workdir)
    try:
        config = transfer_config()
        for _ in range(repeats):
            sources = start_sources(total, [None], workdir)
            try:
                async with open_peer(new_peer()) as newcomer:
                    report["tcp"].append(await anyio.to_thread.run_sync(tcp_receive, port, total))
                    for key in ("first", "second"):
                        cpu_newcomer, cpu_source = time.process_time(), process_cpu_s(sources[0].process.pid)
                        result = await pull(newcomer, sources, expected, known=False, config=config)
                        report.setdefault(f"{key}_cpu_newcomer_s", []).append(time.process_time() - cpu_newcomer)
                        report.setdefault(f"{key}_cpu_source_s", []).append(
                            process_cpu_s(sources[0].process.pid) - cpu_source
                        )
                        report[key].append(result.seconds)
                        report.setdefault(f"{key}_pull_s", []).append(result.pull_s)
                        report["exact"].append(result.exact)
                    report["tcp"].append(await anyio.to_thread.run_sync(tcp_receive, port, total))
            finally:
                stop(sources)
        for count in MULTI_SOURCE_COUNTS:
            sources = start_sources(total, [None] * count, workdir)
            try:
                async with open_peer(new_peer()) as newcomer:
                    runs = [await pull(newcomer, sources, expected, known=False, config=config) for _ in range(repeats)]
                report["sources"][count] = [r.seconds for r in runs]
                report["exact"] += [r.exact for r in runs]
            finally:
                stop(sources)
    finally:
        stop([tcp])
    return report


async def scenario_capped(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    config = transfer_config()
    for name, caps in ACTIVE_CAP_SETS.items():
        sources = start_sources(total, caps, workdir)
        entry: dict[str, Any] = {
            "bound_s": total / sum(caps),
            "measured": [],
            "known": [],
            "measured_pull_s": [],
            "known_pull_s": [],
            "shares": [],
            "exact": [],
        }
        try:
            async with open_peer(new_peer()) as newcomer:
                for _ in range(repeats):
                    for known in (False, True):
                        result = await pull(newcomer, sources, expected, known=known, config=config)
                        entry["known" if known else "measured"].append(result.seconds)
                        entry["known_pull_s" if known else "measured_pull_s"].append(result.pull_s)
                        entry["exact"].append(result.exact)
                        if not known:
                            entry["shares"].append(result.shares)
        finally:
            stop(sources)
        report[name] = entry
    return report


async def scenario_static(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    caps = CAP_SETS["4 x 25/50/100/200 MB/s"]
    static = replace(transfer_config(), max_replans=0)
    report: dict[str, Any] = {"bound_s": total / sum(caps)}
    sources = start_sources(total, caps, workdir)
    try:
        async with open_peer(new_peer()) as newcomer:
            for name, plan in STATIC_PLANS.items():
                runs = [
                    await pull(
                        newcomer,
                        sources,
                        expected,
                        known=True,
                        config=static,
                        planner=StaticPlanner(plan),
                        work_stealing=False,
                    )
                    for _ in range(repeats)
                ]
                predicted = plan(total, [Source(s.peer, s.cap or 1e9, 0.0) for s in sources]).makespan_s
                report[name] = {
                    "seconds": [r.seconds for r in runs],
                    "predicted_s": predicted,
                    "exact": [r.exact for r in runs],
                }
    finally:
        stop(sources)
    return report


async def scenario_kill(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    caps = KILL_CAPS
    rest = sum(c for i, c in enumerate(caps) if i != KILL_INDEX)
    bound = KILL_AT * total / sum(caps) + (1 - KILL_AT) * total / rest
    report: dict[str, Any] = {"bound_s": bound, "no_kill_bound_s": total / sum(caps), "seconds": [], "exact": []}
    for _ in range(repeats):
        sources = start_sources(total, caps, workdir)
        killed: list[float] = []

        def kill(
            progress: TransferProgress, sources: list[SourceProcess] = sources, killed: list[float] = killed
        ) -> None:
            if not killed and progress.fraction >= KILL_AT:
                sources[KILL_INDEX].kill()
                killed.append(progress.fraction)

        try:
            async with open_peer(new_peer()) as newcomer:
                result = await pull(newcomer, sources, expected, known=False, config=transfer_config(), progress=kill)
        finally:
            stop(sources)
        assert killed, "the pull ended before the kill"
        report["seconds"].append(result.seconds)
        report.setdefault("pull_s", []).append(result.pull_s)
        report["exact"].append(result.exact)
        report.setdefault("killed_at", []).append(killed[0])
        report.setdefault("dropped", []).append(result.dropped)
    return report


# ---------------------------------------------------------------------------------------- CLI
def cli(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "chaosp2p", *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def start_cli_sources(
    checkpoint: Path, caps: Sequence[float], workdir: Path, addrs: list[str] | None = None
) -> tuple[list[subprocess.Popen[bytes]], str]:
    """``state serve`` processes with the given upload caps; the later ones bootstrap from the first.
    Returns them and the first one's address (``addrs`` receives every one's)."""
    processes: list[subprocess.Popen[bytes]] = []
    first_addr = ""
    try:
        for index, cap in enumerate(caps):
            process, addr = start_cli_source(checkpoint, cap, index, first_addr, workdir)
            processes.append(process)
            first_addr = first_addr or addr
            if addrs is not None:
                addrs.append(addr)
    except BaseException:
        stop(processes)
        raise
    return processes, first_addr


def _run_record(summary: Mapping[str, Any], bound: float) -> dict[str, Any]:
    """What one ``state pull --json`` says about where its time went, how each source did and
    how it planned (a slow run is compared with a fast one by these)."""
    keys = ("seconds", "peer_start_s", "discovery_s", "setup_s", "data_s", "verify_s", "commit_s")
    record = {k: summary.get(k) for k in keys}
    record["ratio"] = summary["seconds"] / bound  # (the split is missing when run against older code)
    record["data_ratio"] = summary["data_s"] / bound if summary.get("data_s") else None
    record["source_bytes"] = summary["sources"]
    record["source_rates"] = summary.get("source_rates", {})
    record["plans"] = summary.get("plans", [])
    record["load_avg"] = os.getloadavg()
    return record


async def scenario_cli(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """``chaosp2p state serve`` sources with capped profiles, ``chaosp2p state pull`` through the DHT."""
    from chaosp2p.state.checkpoint_file import read_checkpoint

    checkpoint = workdir / "checkpoint.npz"
    np.savez(checkpoint, **model_and_adam_state(total, 0))
    report: dict[str, Any] = {}
    for name, caps in ACTIVE_CAP_SETS.items():
        bound = total / sum(caps)
        entry: dict[str, Any] = {
            "bound_s": bound,
            "caps": list(caps),
            "seconds": [],
            "wall_s": [],
            "exact": [],
            "sources": [],
            "discovery_s": [],
            "runs": [],
        }
        processes, first_addr = start_cli_sources(checkpoint, caps, workdir)
        try:
            await wait_for_providers(first_addr, len(caps))
            await anyio.sleep(SETTLE_S)
            out = workdir / "pulled.npz"
            command = ("state", "pull", "--run", RUN, "--out", str(out), "--bootstrap", first_addr, "--json")
            for index in range(repeats):
                foreign = ForeignCpu(processes)
                started = time.perf_counter()
                result = await anyio.to_thread.run_sync(functools.partial(cli, *command))
                wall = time.perf_counter() - started
                foreign_s = foreign.stop()
                if result.returncode != 0:
                    raise SystemExit(f"state pull failed: {result.stderr[-2000:]}")
                summary = json.loads(result.stdout)
                entry["seconds"].append(summary["seconds"])
                entry["wall_s"].append(wall)
                entry["sources"].append(len([p for p, n in summary["sources"].items() if n]))
                record = _run_record(summary, bound)
                record["wall_s"] = wall
                record["foreign_cpu_s"] = foreign_s
                entry["runs"].append(record)
                pulled = await anyio.to_thread.run_sync(read_checkpoint, out)
                entry["exact"].append(await anyio.to_thread.run_sync(state_hash, pulled.arrays) == expected)
                out.unlink()
                data_s = summary.get("data_s") or float("nan")
                print(
                    f"  cli {name} #{index + 1}: {summary['seconds']:.2f} s = {record['ratio']:.3f}x "
                    f"(data phase {data_s:.2f} s = {data_s / bound:.3f}x), "
                    f"other processes' CPU {foreign_s:.2f} s in {wall:.1f} s, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            # After the pulls: the members probe a newcomer's links with bulk uploads, which must not
            # overlap a timed pull.
            for _ in range(min(repeats, 3)):
                found_s, estimates = await time_discovery(first_addr, len(caps))
                entry["discovery_s"].append(found_s)
                entry.setdefault("estimates_at_discovery", []).append(estimates)
        finally:
            stop(processes)
        report[name] = entry
    return report


def sent_bytes(port: int) -> int:
    """Bytes the TCP connections from local port ``port`` (a source's listener) have sent so far
    (``ss``'s ``bytes_sent``; /proc/PID/io does not count socket sends)."""
    out = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return sum(int(field.split(":", 1)[1]) for field in out.split() if field.startswith("bytes_sent:"))


def pull_and_kill(
    command: Sequence[str], victim: subprocess.Popen[bytes], port: int, kill_after_bytes: int, cap: float
) -> tuple[subprocess.CompletedProcess[str], int | None]:
    """Run ``chaosp2p *command``; SIGKILL ``victim`` (listening on ``port``) once its connections
    have sent ``kill_after_bytes`` more. Returns the pull's result and what they had sent by the
    kill (None: never)."""
    base = sent_bytes(port)
    pull = subprocess.Popen(
        [sys.executable, "-m", "chaosp2p", *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killed: int | None = None
    while pull.poll() is None:
        wait_s = 0.05
        if killed is None:
            sent = sent_bytes(port) - base  # connections that closed meanwhile drop out: small ones
            if sent >= kill_after_bytes:
                victim.send_signal(signal.SIGKILL)
                killed = sent
            else:  # each look starts a process: look rarely while far from the mark (the CPU is shared)
                wait_s = min(0.5, max(0.01, (kill_after_bytes - sent) / (2 * cap)))
        time.sleep(wait_s)
    stdout, stderr = pull.communicate()
    return subprocess.CompletedProcess(pull.args, pull.returncode, stdout, stderr), killed


def _kill_setup(total: int, workdir: Path) -> tuple[Path, tuple[float, ...], float]:
    """The kill scenarios' checkpoint (written once), caps and bound: 0.4 S / sum(all caps) +
    0.6 S / sum(the caps of the sources left)."""
    checkpoint = workdir / "checkpoint.npz"
    if not checkpoint.exists():
        np.savez(checkpoint, **model_and_adam_state(total, 0))
    caps = CLI_KILL_CAPS
    rest = sum(c for i, c in enumerate(caps) if i != CLI_KILL_INDEX)
    return checkpoint, caps, KILL_AT * total / sum(caps) + (1 - KILL_AT) * total / rest


async def scenario_clikill(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """3 capped ``state serve`` sources (fresh each repeat), ``state pull`` through the DHT; the
    fastest source SIGKILLed once it has sent its share of 40 % of the state."""
    from chaosp2p.state.checkpoint_file import read_checkpoint

    checkpoint, caps, bound = _kill_setup(total, workdir)
    kill_after = int(KILL_AT * total * caps[CLI_KILL_INDEX] / sum(caps))
    report: dict[str, Any] = {"bound_s": bound, "caps": list(caps), "seconds": [], "exact": [], "runs": []}
    for index in range(repeats):
        addrs: list[str] = []
        processes, first_addr = start_cli_sources(checkpoint, caps, workdir, addrs)
        port = Multiaddr.parse(addrs[CLI_KILL_INDEX]).port
        out = workdir / "pulled.npz"
        command = ("state", "pull", "--run", RUN, "--out", str(out), "--bootstrap", first_addr, "--json")
        try:
            await wait_for_providers(first_addr, len(caps))
            await anyio.sleep(SETTLE_S)
            foreign = ForeignCpu(processes)
            result, killed = await anyio.to_thread.run_sync(
                pull_and_kill, command, processes[CLI_KILL_INDEX], port, kill_after, caps[CLI_KILL_INDEX]
            )
            foreign_s = foreign.stop()
        finally:
            stop(processes)
        if result.returncode != 0:
            raise SystemExit(f"state pull failed: {result.stderr[-2000:]}")
        assert killed is not None, "the pull ended before the kill"
        summary = json.loads(result.stdout)
        pulled = await anyio.to_thread.run_sync(read_checkpoint, out)
        exact = await anyio.to_thread.run_sync(state_hash, pulled.arrays) == expected
        out.unlink()
        record = _run_record(summary, bound)
        record["foreign_cpu_s"] = foreign_s
        record["victim_sent_at_kill"] = killed
        record["dropped"] = summary.get("dropped", [])
        report["runs"].append(record)
        report["seconds"].append(summary["seconds"])
        report["exact"].append(exact)
        print(
            f"  clikill #{index + 1}: {summary['seconds']:.2f} s = {record['ratio']:.3f}x "
            f"(data phase {summary['data_s']:.2f} s), the victim sent {killed / 2**20:.0f} MiB, "
            f"other processes' CPU {foreign_s:.2f} s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return report


async def scenario_dhtkill(total: int, expected: str, repeats: int, workdir: Path) -> dict[str, Any]:
    """3 capped ``state serve`` sources (fresh each repeat), a fresh newcomer finding them in the DHT;
    the fastest source SIGKILLed once 40 % of the state is verified."""
    checkpoint, caps, bound = _kill_setup(total, workdir)
    report: dict[str, Any] = {"bound_s": bound, "caps": list(caps), "seconds": [], "exact": [], "runs": []}
    for index in range(repeats):
        processes, first_addr = start_cli_sources(checkpoint, caps, workdir)
        killed: list[float] = []

        def kill(
            progress: TransferProgress,
            victim: subprocess.Popen[bytes] = processes[CLI_KILL_INDEX],
            killed: list[float] = killed,
        ) -> None:
            if not killed and progress.fraction >= KILL_AT:
                victim.send_signal(signal.SIGKILL)
                killed.append(progress.fraction)

        try:
            await wait_for_providers(first_addr, len(caps))
            await anyio.sleep(SETTLE_S)
            foreign = ForeignCpu(processes)
            started = time.perf_counter()
            async with open_peer(new_peer().replace(bootstrap=(first_addr,))) as newcomer:
                peer_started = time.perf_counter() - started
                loaded = await newcomer.state.load(RUN, progress=kill)
                seconds = time.perf_counter() - started
                foreign_s = foreign.stop()
                exact = await anyio.to_thread.run_sync(state_hash, loaded.state.arrays) == expected
                loaded.result.staging.close()
        finally:
            stop(processes)
        assert killed, "the pull ended before the kill"
        at = killed[0]
        rest = sum(c for i, c in enumerate(caps) if i != CLI_KILL_INDEX)
        bound_at = at * total / sum(caps) + (1 - at) * total / rest  # the bound at the actual kill point
        timings = loaded.timings
        record = {
            "seconds": seconds,
            "ratio": seconds / bound,
            "ratio_at_kill_point": seconds / bound_at,
            "peer_start_s": peer_started,
            "discovery_s": timings.discovery_s,
            "setup_s": timings.setup_s,
            "data_s": timings.data_s,
            "verify_s": timings.verify_s,
            "killed_at": at,
            "foreign_cpu_s": foreign_s,
            "source_bytes": {str(p): n for p, n in loaded.completed.bytes_by_source},
            "source_rates": {str(p): r for p, r in loaded.result.source_rates},
            "plans": [
                {"at_s": p.at_s, "reason": p.reason, "chunks": p.chunks, "rates": [r for _, r in p.rates]}
                for p in loaded.result.plans
            ],
            "dropped": [f"{d.reason.value}: {d.detail}" for d in loaded.result.dropped],
            "load_avg": os.getloadavg(),
        }
        report["runs"].append(record)
        report["seconds"].append(seconds)
        report["exact"].append(exact)
        print(
            f"  dhtkill #{index + 1}: {seconds:.2f} s = {record['ratio']:.3f}x "
            f"({record['ratio_at_kill_point']:.3f}x at the kill point {at:.2f}), "
            f"other processes' CPU {foreign_s:.2f} s, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return report


async def time_discovery(bootstrap: str, count: int) -> tuple[float, list[float | None]]:
    """What ``state pull`` spends before its pull: a fresh peer joins through ``bootstrap`` and
    looks the run's providers up in the DHT (until it sees ``count`` of them). Also returns the
    link estimates (bytes/s) the DHT answer carried -- what a pull starting then would be told."""
    started = time.perf_counter()
    async with open_peer(new_peer().replace(bootstrap=(bootstrap,))) as peer:
        for _ in range(200):
            found = await peer.state.discover_sources(RUN, limit=64)
            if len(found) >= count:
                return time.perf_counter() - started, [s.bytes_per_s for s in found]
            await anyio.sleep(0.05)
    raise SystemExit(f"a fresh peer never found {count} providers of {RUN!r}")


async def wait_for_providers(bootstrap: str, count: int, timeout_s: float = 60) -> None:
    """Until the DHT lists ``count`` providers of the run (they announce in the background)."""
    async with open_peer(new_peer().replace(bootstrap=(bootstrap,))) as observer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if len(await observer.state.find_sources(RUN, limit=64)) >= count:
                return
            await anyio.sleep(0.2)
        raise SystemExit(f"the DHT never listed {count} providers of {RUN!r}")


# ---------------------------------------------------------------------------------------- hivemind
def run_hivemind(args: argparse.Namespace, total: int) -> dict[str, Any]:
    python = args.hivemind_python or sys.executable
    probe = subprocess.run([python, "-c", "import hivemind"], capture_output=True, check=False)
    if probe.returncode != 0:
        return {"not_run": f"hivemind is not importable by {python}"}
    result = subprocess.run(
        [python, str(HERE / "_hivemind_baseline.py"), "--bytes", str(total), "--repeats", str(args.repeats)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"not_run": f"hivemind baseline failed: {result.stderr[-2000:]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------- main
SCENARIOS = ("single", "capped", "cli", "kill", "clikill", "dhtkill", "static", "hivemind")


async def run_all(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    total = int(args.gib * (1 << 30))
    expected = state_hash(model_and_adam_state(total, 0))
    report: dict[str, Any] = {"bytes": total, "load_avg_start": os.getloadavg()}
    steps: dict[str, Callable[..., Any]] = {
        "single": scenario_single,
        "capped": scenario_capped,
        "cli": scenario_cli,
        "kill": scenario_kill,
        "clikill": scenario_clikill,
        "dhtkill": scenario_dhtkill,
        "static": scenario_static,
    }
    for name in args.scenarios:
        if name in steps:
            began = time.perf_counter()
            try:
                report[name] = await steps[name](total, expected, args.repeats, workdir)
            except ChaosError as exc:  # a failed scenario is a result too (the machine may be overloaded)
                report[name] = {"failed": f"{type(exc).__name__}: {exc}"}
            report[name]["load_avg"] = os.getloadavg()
            print(f"[{name} done in {time.perf_counter() - began:.0f} s, load {os.getloadavg()[0]:.1f}]", flush=True)
    if "hivemind" in args.scenarios:
        report["hivemind"] = await anyio.to_thread.run_sync(run_hivemind, args, total)
    report["load_avg_end"] = os.getloadavg()
    return report


def main() -> None:
    # Sources come and go between scenarios (and one is killed on purpose): the newcomer's
    # membership reports them, which is right but is not what this benchmark shows.
    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated, of {SCENARIOS}")
    parser.add_argument("--hivemind-python", default=None, help="interpreter that has hivemind (default: this one)")
    parser.add_argument("--cap-sets", default="3,4", help="cap sets of capped/cli: 3 (20/40/80), 4 (25/.../200)")
    parser.add_argument(
        "--multi-sources", default="2,4", help="single: also pull from this many uncapped sources ('' for none)"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    MULTI_SOURCE_COUNTS[:] = [int(k) for k in args.multi_sources.split(",") if k.strip()]
    chosen = [k.strip() for k in args.cap_sets.split(",") if k.strip()]
    if not chosen or set(chosen) - set(CAP_SET_KEYS):
        parser.error(f"--cap-sets takes a comma-separated subset of {sorted(CAP_SET_KEYS)}")
    ACTIVE_CAP_SETS.clear()
    ACTIVE_CAP_SETS.update({CAP_SET_KEYS[k]: CAP_SETS[CAP_SET_KEYS[k]] for k in chosen})
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}")
    with tempfile.TemporaryDirectory() as tmp:
        report = anyio.run(run_all, args, Path(tmp), backend="trio")
    show(report, args)
    write_json(
        args.json,
        {"benchmark": "state", "gib": args.gib, "repeats": args.repeats, "cap_sets": chosen, **report},
    )


def show(report: dict[str, Any], args: argparse.Namespace) -> None:
    mib = report["bytes"] / 2**20
    hivemind = report.get("hivemind") or {}
    hm = median(hivemind["seconds"]) if "seconds" in hivemind else None
    for name, entry in report.items():
        if isinstance(entry, dict) and "failed" in entry:
            print(f"{name}: FAILED ({entry['failed']})")
    if "single" in report and "failed" not in report["single"]:
        s = report["single"]
        tcp = median(s["tcp"])
        rows = [["plain TCP, unencrypted, same bytes", tcp, 1.0]]
        rows.append(["chaosp2p, 1 source, first pull after it started", median(s["first"]), median(s["first"]) / tcp])
        rows.append(["chaosp2p, 1 source, second pull", median(s["second"]), median(s["second"]) / tcp])
        for count, runs in s["sources"].items():
            rows.append([f"chaosp2p, {count} uncapped sources", median(runs), median(runs) / tcp])
        if hm is not None:
            rows.append(["hivemind load_state_from_peers, 1 donor", hm, hm / tcp])
        print_table(
            f"single: {mib:.0f} MiB on loopback, median of {args.repeats}; all exact: {all(s['exact'])}",
            ["transfer", "seconds", "vs plain TCP"],
            rows,
        )
    elif hm is not None or "hivemind" in report:
        print("hivemind:", json.dumps(hivemind))
    for key, title in (("capped", "API"), ("cli", "CLI (chaosp2p state pull, DHT discovery)")):
        if key not in report or "failed" in report[key]:
            continue
        rows = []
        for name, entry in report[key].items():
            if not isinstance(entry, dict):
                continue
            bound = entry["bound_s"]
            if key == "capped":
                rows.append(
                    [
                        name,
                        "no estimates (measured)",
                        median(entry["measured"]),
                        bound,
                        median(entry["measured"]) / bound,
                    ]
                )
                rows.append(
                    [name, "caps given as estimates", median(entry["known"]), bound, median(entry["known"]) / bound]
                )
                if entry.get("measured_pull_s"):
                    pull_only = median(entry["measured_pull_s"])
                    rows.append([name, "no estimates, data phase only", pull_only, bound, pull_only / bound])
            else:
                rows.append(
                    [name, "command's own timing", median(entry["seconds"]), bound, median(entry["seconds"]) / bound]
                )
                rows.append(
                    [name, "process wall time", median(entry["wall_s"]), bound, median(entry["wall_s"]) / bound]
                )
                if entry.get("discovery_s"):
                    found = median(entry["discovery_s"])
                    rows.append([name, "of which peer start + DHT lookup (separate peer)", found, bound, found / bound])
            for row in rows:
                if len(row) == 5:
                    row.append(all(entry["exact"]))
        print_table(
            f"{key}: capped sources, {title}",
            ["sources", "newcomer", "seconds", "S/sum(caps) s", "ratio", "exact"],
            rows,
        )
    if "cli" in report and "failed" not in report["cli"]:
        for name, entry in report["cli"].items():
            if isinstance(entry, dict) and entry.get("runs"):
                ratios = [r["ratio"] for r in entry["runs"]]
                data = [r["data_ratio"] or float("nan") for r in entry["runs"]]
                print(f"cli {name}, every pull (x of S/sum(caps) = {entry['bound_s']:.2f} s):")
                print("  command's timing: " + " ".join(f"{r:.3f}" for r in ratios))
                print(f"    median {median(ratios):.3f}, max {max(ratios):.3f}")
                print("  data phase:       " + " ".join(f"{r:.3f}" for r in data))
                print(f"    median {median(data):.3f}, max {max(data):.3f}; all exact: {all(entry['exact'])}")
    for key in ("clikill", "dhtkill"):
        if key not in report or "failed" in report[key]:
            continue
        k = report[key]
        ratios = [r["ratio"] for r in k["runs"]]
        print(f"{key}, every pull (x of the bound {k['bound_s']:.2f} s):")
        print("  " + " ".join(f"{r:.3f}" for r in ratios))
        print(f"  median {median(ratios):.3f}, max {max(ratios):.3f}; all exact: {all(k['exact'])}")
        at_kill = [r["ratio_at_kill_point"] for r in k["runs"] if "ratio_at_kill_point" in r]
        if at_kill:
            print("  against the bound at the actual kill point: " + " ".join(f"{r:.3f}" for r in at_kill))
    if "kill" in report and "failed" not in report["kill"]:
        k = report["kill"]
        print_table(
            "kill: 4 x 25/50/100/200 MB/s, the 100 MB/s source SIGKILLed at 40 %",
            ["pull", "seconds", "ratio to bound", "exact"],
            [
                ["bound 0.4 S/sum(all) + 0.6 S/sum(rest)", k["bound_s"], 1.0, ""],
                ["chaosp2p", median(k["seconds"]), median(k["seconds"]) / k["bound_s"], all(k["exact"])],
            ],
        )
    if "static" in report and "failed" not in report["static"]:
        st = report["static"]
        rows = [
            [name, median(v["seconds"]), v["predicted_s"], median(v["seconds"]) / st["bound_s"], all(v["exact"])]
            for name, v in st.items()
            if isinstance(v, dict) and "seconds" in v
        ]
        print_table("static plans, 4 capped sources", ["plan", "seconds", "predicted s", "vs bound", "exact"], rows)


if __name__ == "__main__":
    main()
