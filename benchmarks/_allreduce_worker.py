"""One process of the all-reduce benchmark (benchmarks/training.py part a).

    python benchmarks/_allreduce_worker.py chaosp2p --rank R --world N --elements E --rounds K \
        --workdir DIR [--backend trio|asyncio] [--wire float32]
    python benchmarks/_allreduce_worker.py gloo --rank R --world N --elements E --rounds K --port P

chaosp2p: writes DIR/ready-R.json ({peer_id, addrs}), waits for DIR/members.json, connects to the
members after it, then for each round runs a tiny all-reduce as a barrier and times the big one.
gloo: torch.distributed with the gloo backend, dist.barrier() then all_reduce(SUM) and a division.
Either way it prints one JSON line: {"seconds": [...], "stats": [...]} (the first round is warm-up).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

PROFILER: Any = None
"""cProfile.Profile when --profile is given: it profiles only the timed all-reduces."""


class Inputs:
    """Each rank's buffer: a ramp (the same on every rank) plus ``rank + round``; cheap to make and check."""

    def __init__(self, elements: int, world: int, rank: int) -> None:
        self.ramp = np.resize((np.arange(1000, dtype=np.float32) * np.float32(0.001)), elements)
        self.world = world
        self.rank = rank

    def fill(self, buffer: np.ndarray, round_index: int) -> None:
        np.add(self.ramp, np.float32(self.rank + round_index), out=buffer)

    def check(self, buffer: np.ndarray, round_index: int) -> None:
        mean = sum(float(rank + round_index) for rank in range(self.world)) / self.world
        buffer -= self.ramp
        error = max(abs(float(buffer.min()) - mean), abs(float(buffer.max()) - mean))
        if error > 1e-3:
            raise SystemExit(f"wrong average: max error {error}")


# ------------------------------------------------------------------------------------------ chaosp2p
async def run_chaosp2p(args: argparse.Namespace) -> dict[str, Any]:
    import anyio

    from chaosp2p.clock import MonotonicClock
    from chaosp2p.protocols.averaging.messages import RoundTag
    from chaosp2p.training.averager import Averager
    from chaosp2p.training.averager_config import AveragerConfig
    from chaosp2p.transport.config import TransportConfig
    from chaosp2p.transport.host import open_host
    from chaosp2p.wire.identity import Identity, PeerID
    from chaosp2p.wire.multiaddr import Multiaddr

    workdir = Path(args.workdir)
    # A bare host: the encrypted transport and the averager, without the overlay's background
    # protocols (membership, DHT), whose traffic is not what this benchmark measures.
    clock = MonotonicClock()
    transport = TransportConfig.lan()
    if args.record_mib:
        transport = dataclasses.replace(transport, max_record_bytes=args.record_mib << 20)
    async with open_host(Identity.generate(), transport, clock=clock) as host:
        averager = Averager(host, clock, config=AveragerConfig.lan())
        await host.listen("/ip4/127.0.0.1/tcp/0")
        ready = workdir / f"ready-{args.rank}.json"
        announcement = {"peer_id": str(host.peer_id), "addrs": [str(a) for a in host.addrs]}
        ready.with_suffix(".tmp").write_text(json.dumps(announcement))
        ready.with_suffix(".tmp").rename(ready)
        members_file = workdir / "members.json"
        with anyio.fail_after(120):
            while not members_file.exists():  # noqa: ASYNC110 - another process writes the file
                await anyio.sleep(0.02)
        listing = json.loads(members_file.read_text())
        book = {PeerID.parse(m["peer_id"]): [Multiaddr.parse(a).without_peer() for a in m["addrs"]] for m in listing}
        order = [PeerID.parse(m["peer_id"]) for m in listing]
        mine = order.index(host.peer_id)
        members = sorted(order)
        bandwidth, relays = _link_plan(members, args.down, host.peer_id)
        # Before any connection: a member whose connections are up first contributes at once.
        averager.expect_run("bench", frozenset(members).__contains__)
        # A pair whose link is down has no connection: its exchanges go through a relay member
        # linked to both (averaging.md 5.2), which forwards over the connections it holds.
        for peer in order[mine + 1 :]:
            if peer not in relays:
                await host.connection_to(peer, book[peer])
        with anyio.fail_after(120):
            while len(host.connected_peers()) < len(order) - 1 - len(relays):  # noqa: ASYNC110 - the others dial us
                await anyio.sleep(0.02)
        allowances = dict.fromkeys(members, 1.0)
        buffer = np.empty(args.elements, dtype=np.float32)
        inputs = Inputs(args.elements, args.world, args.rank)
        token = np.zeros(64, dtype=np.float32)
        seconds: list[float] = []
        stats: list[dict[str, Any]] = []

        async def barrier(step: int) -> None:
            tag = RoundTag(run="bench", epoch=0, config_digest=b"bench", step=step)
            await averager.all_reduce(
                tag,
                token,
                weight=1.0,
                max_weights=allowances,
                members=members,
                addrs=book.__getitem__,
                timeout_s=120,
                relays=relays,
            )

        for index in range(args.rounds):
            inputs.fill(buffer, index)
            await barrier(2 * index)
            tag = RoundTag(run="bench", epoch=0, config_digest=b"bench", step=2 * index + 1)
            if PROFILER is not None:
                PROFILER.enable()
            started = time.perf_counter()
            cpu = time.process_time()
            result = await averager.all_reduce(
                tag,
                buffer,
                weight=1.0,
                max_weights=allowances,
                members=members,
                addrs=book.__getitem__,
                bandwidth=bandwidth,
                wire_dtype=args.wire,
                timeout_s=300,
                relays=relays,
            )
            seconds.append(time.perf_counter() - started)
            cpu = time.process_time() - cpu
            if PROFILER is not None:
                PROFILER.disable()
            stats.append(
                {
                    "cpu_s": cpu,
                    "reduce_scatter_s": result.reduce_scatter_s,
                    "all_gather_s": result.all_gather_s,
                    "reduce_s": result.reduce_s,
                    "bytes_sent": result.bytes_sent,
                    "bytes_received": result.bytes_received,
                }
            )
            if args.check and args.wire == "float32":
                inputs.check(buffer, index)
        await barrier(2 * args.rounds)  # so that nobody leaves while others still wait for its answers
        connections = host.connections()
        in_place = sum(c.statistics().records_decrypted_in_place for c in connections)
        records = sum(c.statistics().records_received for c in connections)
        # Leave only once every worker is done: closing a socket with unread input resets the
        # connection, which can destroy bytes still in flight to a slower member.
        (workdir / f"done-{args.rank}").write_text("")
        with anyio.fail_after(300):
            while not (workdir / "exit").exists():  # noqa: ASYNC110 - the parent writes the file
                await anyio.sleep(0.05)
        return {"seconds": seconds, "stats": stats, "records_in_place": in_place, "records_received": records}


def _link_plan(members: list[Any], down: str, me: Any) -> tuple[dict[Any, float] | None, dict[Any, Any]]:
    """--down "0-1,0-2": the plan on an agreed link graph where those pairs (indices into the sorted
    members) are down (``protocols/averaging.md`` section 5.1; None: every member owns, without),
    and this member's relays to the members it has no link with (section 5.2)."""
    if not down:
        return None, {}
    from chaosp2p.protocols.averaging.link_plan import link_bandwidths, relay_routes
    from chaosp2p.protocols.negotiation.run_configuration import LinkEntry

    links = []
    for pair in down.split(","):
        i, j = sorted(int(x) for x in pair.split("-"))
        links.append(LinkEntry(a=members[i], b=members[j], up=False))
    return link_bandwidths(members, links), relay_routes(members, links, me)


# ------------------------------------------------------------------------------------------ gloo
def run_gloo(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank, world_size=args.world)
    buffer = np.empty(args.elements, dtype=np.float32)
    inputs = Inputs(args.elements, args.world, args.rank)
    tensor = torch.from_numpy(buffer)
    seconds: list[float] = []
    cpu_s: list[float] = []
    for index in range(args.rounds):
        inputs.fill(buffer, index)
        dist.barrier()
        started = time.perf_counter()
        cpu = time.process_time()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        tensor.div_(args.world)
        seconds.append(time.perf_counter() - started)
        cpu_s.append(time.process_time() - cpu)
        if args.check:
            inputs.check(buffer, index)
    dist.barrier()
    dist.destroy_process_group()
    return {"seconds": seconds, "cpu_s": cpu_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("impl", choices=["chaosp2p", "gloo"])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--workdir", default=".")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"])
    parser.add_argument("--wire", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--check", action="store_true", help="verify every average")
    parser.add_argument("--down", default="", help="agreed-down links for the plan, e.g. 0-1,0-2 (chaosp2p only)")
    parser.add_argument("--record-mib", type=int, default=0, help="transport record size (default: the profile's)")
    parser.add_argument("--trace", action="store_true", help="log the averager's steps with timestamps")
    parser.add_argument("--profile", default=None, help="write a cProfile dump here (chaosp2p only)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.trace:
        logging.getLogger("chaosp2p.training").setLevel(logging.DEBUG)
    if args.impl == "gloo":
        report = run_gloo(args)
    else:
        import anyio

        if args.profile:
            import cProfile

            global PROFILER
            PROFILER = cProfile.Profile(time.process_time)
            report = anyio.run(run_chaosp2p, args, backend=args.backend)
            PROFILER.dump_stats(args.profile)
        else:
            report = anyio.run(run_chaosp2p, args, backend=args.backend)
    report["pid"] = os.getpid()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
