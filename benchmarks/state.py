"""State benchmark: how fast a newcomer loads model + Adam state, against the alternatives.

    python benchmarks/state.py [--gib 1] [--repeats 3] [--json out.json] [--hivemind-python PATH]

Sources are separate processes on 127.0.0.1 serving byte-identical state; the newcomer is this
process. Scenarios (each a median over --repeats, with the raw runs kept in the JSON):

  a  loopback, no caps: 1, 2 and 4 sources (1 source = the single-source download baseline)
  b  per-source upload caps 25/50/100/200 MB/s: chaosp2p's default adaptive pull, next to the
     lower bound S / sum(caps)
  c  the same caps with static plans (no work stealing, no re-planning): the optimal greedy plan,
     equal split, bandwidth-proportional split and the single fastest source
  d  hivemind 1.1.12 ``load_state_from_peers`` on the same state (needs an interpreter with
     hivemind; see --hivemind-python), one donor, as hivemind does it
  e  4 sources capped at 100 MB/s, one killed (SIGKILL) at 50 %: time next to the same pull
     without the kill
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
from _common import median, print_table, write_json

from chaosp2p import PeerConfig, open_peer
from chaosp2p.api import AsyncPeer
from chaosp2p.protocols.transfer import SourceEstimate, TransferProgress
from chaosp2p.protocols.transfer_config import TransferConfig
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
CAPS = (25e6, 50e6, 100e6, 200e6)


# ---------------------------------------------------------------------------------------- sources
@dataclass
class SourceProcess:
    process: subprocess.Popen[bytes]
    peer: PeerID
    addr: Multiaddr
    cap: float | None

    def address(self) -> SourceAddress:
        """The source as the newcomer sees it; a capped link's estimate is its cap (the cluster
        monitor would have measured it), an uncapped loopback link gets a flat guess."""
        return SourceAddress(
            peer=self.peer, addrs=(self.addr.without_peer(),), bytes_per_s=self.cap or 1e9, latency_s=0.0001
        )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)


def start_sources(total: int, caps: Sequence[float | None], workdir: Path) -> list[SourceProcess]:
    processes = []
    for index, cap in enumerate(caps):
        ready = workdir / f"source-{index}-{time.monotonic_ns()}.json"
        args = [sys.executable, str(HERE / "_state_source.py"), "--bytes", str(total), "--ready-file", str(ready)]
        if cap:
            args += ["--cap", str(cap)]
        with (workdir / f"source-{index}.log").open("ab") as log:
            process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log)
        processes.append((process, ready, cap))
    sources = []
    for process, ready, cap in processes:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"a state source failed to start (exit {process.poll()})")
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        addr = Multiaddr.parse(info["addrs"][0])
        assert addr.peer_id is not None
        sources.append(SourceProcess(process, addr.peer_id, addr, cap))
    return sources


def stop(sources: Sequence[SourceProcess]) -> None:
    for source in sources:
        if source.process.poll() is None:
            source.process.terminate()
    for source in sources:
        try:
            source.process.wait(10)
        except subprocess.TimeoutExpired:
            source.kill()


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
        sched = [Source(peer_id=s.peer, bytes_per_s=s.bytes_per_s, latency_s=s.latency_s) for s in sources]
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
    dropped: int


async def pull(
    newcomer: AsyncPeer,
    sources: Sequence[SourceProcess],
    *,
    config: TransferConfig,
    planner: Any = None,
    work_stealing: bool = True,
    progress: Callable[[TransferProgress], None] | None = None,
) -> Pull:
    started = time.perf_counter()
    loaded = await newcomer.state.load(
        RUN,
        sources=[s.address() for s in sources],
        config=config,
        planner=planner,
        work_stealing=work_stealing,
        progress=progress,
    )
    elapsed = time.perf_counter() - started
    total = loaded.completed.manifest.total_bytes
    loaded.result.staging.close()
    return Pull(elapsed, total, len(loaded.result.dropped))


async def run_chaos(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    total = int(args.gib * (1 << 30))
    report: dict[str, Any] = {"bytes": total}
    base = TransferConfig.local()
    static = replace(base, behind_plan_factor=1e9)  # never re-plan: the plan alone decides the makespan
    async with open_peer(PeerConfig.local(listen=("/ip4/127.0.0.1/tcp/0",))) as newcomer:
        if "a" in args.scenarios:
            sources = start_sources(total, [None] * 4, workdir)
            try:
                report["a"] = {}
                for count in (1, 2, 4):
                    runs = [await pull(newcomer, sources[:count], config=base) for _ in range(args.repeats)]
                    report["a"][count] = [r.seconds for r in runs]
            finally:
                stop(sources)
        if "b" in args.scenarios or "c" in args.scenarios:
            sources = start_sources(total, CAPS, workdir)
            try:
                if "b" in args.scenarios:
                    runs = [await pull(newcomer, sources, config=base) for _ in range(args.repeats)]
                    report["b"] = {"seconds": [r.seconds for r in runs], "lower_bound_s": total / sum(CAPS)}
                if "c" in args.scenarios:
                    report["c"] = {}
                    for name, plan in STATIC_PLANS.items():
                        runs = [
                            await pull(
                                newcomer, sources, config=static, planner=StaticPlanner(plan), work_stealing=False
                            )
                            for _ in range(args.repeats)
                        ]
                        predicted = plan(total, [Source(s.peer, s.cap or 1e9, 0.0) for s in sources]).makespan_s
                        report["c"][name] = {"seconds": [r.seconds for r in runs], "predicted_s": predicted}
            finally:
                stop(sources)
        if "e" in args.scenarios:
            report["e"] = {"baseline": [], "killed": []}
            for _ in range(args.repeats):
                for kill in (False, True):
                    sources = start_sources(total, [100e6] * 4, workdir)
                    killed: list[SourceProcess] = []

                    def kill_at_half(
                        progress: TransferProgress,
                        kill: bool = kill,
                        sources: list[SourceProcess] = sources,
                        killed: list[SourceProcess] = killed,
                    ) -> None:
                        if kill and not killed and progress.fraction >= 0.5:
                            sources[0].kill()
                            killed.append(sources[0])

                    try:
                        result = await pull(newcomer, sources, config=base, progress=kill_at_half)
                    finally:
                        stop(sources)
                    report["e"]["killed" if kill else "baseline"].append(result.seconds)
    return report


def run_hivemind(args: argparse.Namespace) -> dict[str, Any] | None:
    python = args.hivemind_python or sys.executable
    probe = subprocess.run([python, "-c", "import hivemind"], capture_output=True)
    if probe.returncode != 0:
        return {"not_run": f"hivemind is not importable by {python}"}
    total = int(args.gib * (1 << 30))
    result = subprocess.run(
        [python, str(HERE / "_hivemind_baseline.py"), "--bytes", str(total), "--repeats", str(args.repeats)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"not_run": f"hivemind baseline failed: {result.stderr[-2000:]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main() -> None:
    # The sources come and go between scenarios (and one is killed on purpose): the newcomer's
    # membership reports them, which is right but is not what this benchmark shows.
    logging.basicConfig(level=logging.ERROR)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scenarios", default="abcde", help="which scenarios to run (letters, default all)")
    parser.add_argument("--hivemind-python", default=None, help="interpreter that has hivemind (default: this one)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = anyio.run(run_chaos, args, Path(tmp), backend="trio")
    if "d" in args.scenarios:
        report["d"] = run_hivemind(args)
    show(report, args)
    write_json(args.json, {"benchmark": "state", "gib": args.gib, "repeats": args.repeats, **report})


def show(report: dict[str, Any], args: argparse.Namespace) -> None:
    total = report["bytes"]
    mib = total / 2**20
    hivemind = report.get("d") or {}
    hm = median(hivemind["seconds"]) if "seconds" in hivemind else None
    if "a" in report:
        single = median(report["a"][1])
        rows = []
        for count, runs in report["a"].items():
            seconds = median(runs)
            rows.append(
                [
                    f"chaosp2p, {count} source(s)",
                    seconds,
                    mib / seconds,
                    single / seconds,
                    "-" if hm is None else hm / seconds,
                ]
            )
        if hm is not None:
            rows.append(["hivemind load_state_from_peers, 1 donor", hm, mib / hm, single / hm, 1.0])
        print_table(
            f"(a, d) load {mib:.0f} MiB on loopback, median of {args.repeats}",
            ["transfer", "seconds", "MiB/s", "speed-up vs 1 source", "speed-up vs hivemind"],
            rows,
        )
    elif "d" in report:
        print("(d) hivemind:", json.dumps(hivemind))
    if "b" in report:
        bound = report["b"]["lower_bound_s"]
        seconds = median(report["b"]["seconds"])
        print_table(
            f"(b) caps {[int(c / 1e6) for c in CAPS]} MB/s, 4 sources",
            ["transfer", "seconds", "lower bound S/sum(caps) s", "ratio"],
            [["chaosp2p adaptive pull", seconds, bound, seconds / bound]],
        )
    if "c" in report:
        greedy_s = median(report["c"]["greedy (optimal)"]["seconds"])
        rows = [
            [name, median(v["seconds"]), v["predicted_s"], median(v["seconds"]) / greedy_s]
            for name, v in report["c"].items()
        ]
        print_table("(c) static plans on the same capped links", ["plan", "seconds", "predicted s", "vs greedy"], rows)
    if "e" in report:
        base, killed = median(report["e"]["baseline"]), median(report["e"]["killed"])
        print_table(
            "(e) 4 x 100 MB/s, one source killed at 50 %",
            ["pull", "seconds", "ratio"],
            [["no failure", base, 1.0], ["one source SIGKILLed halfway", killed, killed / base]],
        )


if __name__ == "__main__":
    main()
