"""Negotiation benchmark: CPU per operation at one acceptor and at the proposer, and simulated
decision latency.

    python benchmarks/negotiation.py [--sizes 8,64,256,1024] [--trials 20] [--latency-trials 5]
        [--latency-sizes 8,64,256,1024] [--json out.json] [--quick]

(a) Local handling. For each operation kind and run size n, a formed run of n members (one
    configuration) handles one operation end to end, with real machines for the three peers
    involved -- the origin that raises it, the epoch's coordinator that proposes it (fast path),
    and one acceptor -- and the other members' ACCEPTED replies synthesised. Every machine call is
    timed in thread CPU time (``time.thread_time_ns``): the origin raising and announcing it; the
    proposer receiving the announcement (validation, signature check, proposal, ACCEPT to n - 1
    members); the proposer receiving each ACCEPTED; the ACCEPTED that completes the quorum (decision:
    C_{e+1}, COMMIT to n - 1 members); the acceptor receiving ACCEPT (validation, signature check,
    gate) and COMMIT (checks, C_{e+1}, digest). Fresh machines per trial, so every signature is
    verified once where a real peer would verify it. Percentiles are over trials.

(b) Decision latency, simulated (virtual time, exact for a seed, no CPU cost modelled): n members
    with one-way link latencies between 0.5 and 50 ms (RTT 1-100 ms; each peer sits at a random
    point on a line, latency grows with distance), every member's training at the same step.
    FAIL: a member crashes and every running member's membership reports it at once; JOIN: a
    newcomer asks a random member; LEAVE: a member leaves. Latency = from detection (the
    operation's detected_at) until the last running member has committed it.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _common import percentile, print_table, write_json

from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation import NegotiationConfig, NegotiationMachine, OpKind, RunParams
from chaosp2p.protocols.negotiation.configuration import make_configuration
from chaosp2p.protocols.negotiation.messages import Accept, Accepted, Commit, JoinRequest, OpsAnnounce
from chaosp2p.protocols.negotiation.operations import PROTOCOL
from chaosp2p.protocols.negotiation.paxos import coordinator
from chaosp2p.protocols.negotiation.simswarm import NegotiationSwarm, install_configuration
from chaosp2p.sim.network import LinkProfile
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

RUN = "bench"
KINDS = (OpKind.JOIN, OpKind.LEAVE, OpKind.FAIL, OpKind.LINK_UP, OpKind.LINK_DOWN, OpKind.THROUGHPUT)
STEP = 100


# ------------------------------------------------------------------------------------------ (a)
class LocalBench:
    """A formed run of ``n`` members; real machines are made on demand for the peers involved."""

    def __init__(self, n: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.settings = NegotiationConfig.lan()
        self.identities = {
            i.peer_id: i for i in (Identity.from_seed((seed << 40 | k + 1).to_bytes(32, "big")) for k in range(n + 64))
        }
        ids = list(self.identities)
        self.members = sorted(ids[:n], key=lambda p: p.raw)
        self.outsiders = ids[n:]
        self.config = make_configuration(
            run=RUN,
            epoch=1,
            activation_step=0,
            peers=self.members,
            incarnations=[0] * n,
            throughputs=[1.0] * n,
            links=(),
            params=RunParams(global_batch=max(4 * n, 1024)),
            seed=seed,
            since_steps=[0] * n,
        )
        self.now = 10.0

    def machine(self, peer: PeerID) -> NegotiationMachine:
        machine = NegotiationMachine(
            identity=self.identities[peer], config=self.settings, rng=random.Random(self.rng.random()), now=self.now
        )
        if self.config.has_member(peer):
            install_configuration(machine, self.config, self.now)
            # Training is at a step every member takes part in (a formed, running run).
            step = max(STEP, self.config.activation_step, max(self.config.since_steps))
            machine.report_step(self.now, RUN, entered=step, completed=step - 1)
        return machine

    def trial(self, kind: OpKind) -> dict[str, Any]:
        config = self.config
        proposer_id = coordinator(config)
        assert proposer_id is not None
        others = [p for p in config.peers if p != proposer_id]
        self.rng.shuffle(others)
        origin_id, subject_id = others[0], others[2 % len(others)]
        proposer = self.machine(proposer_id)
        times: dict[str, Any] = {}
        self.now += 1.0

        def timed(name: str, call: Callable[[], object]) -> None:
            start = time.thread_time_ns()
            call()
            times[name] = (time.thread_time_ns() - start) / 1000.0

        if kind is OpKind.JOIN:
            newcomer_id = self.outsiders.pop()
            newcomer = self.machine(newcomer_id)
            newcomer.request_join(self.now, RUN, proposer_id, incarnation=1, throughput=1.0)
            request = _only(newcomer.take_outgoing(), proposer_id)
            proposer.receive(self.now, newcomer_id, PROTOCOL, request)
            reply = _only(proposer.take_outgoing(), newcomer_id)
            timed("origin", lambda: newcomer.receive(self.now, proposer_id, PROTOCOL, reply))
            join = _only(newcomer.take_outgoing(), proposer_id)
            assert isinstance(join, JoinRequest)
            timed("proposer_op", lambda: proposer.receive(self.now, newcomer_id, PROTOCOL, join))
        else:
            origin = self.machine(origin_id)
            if kind is OpKind.LEAVE:
                timed("origin", lambda: origin.leave(self.now, RUN))
            elif kind is OpKind.FAIL:
                timed("origin", lambda: origin.observe_member(self.now, subject_id, MemberState.FAILED, 0))
            elif kind is OpKind.THROUGHPUT:
                rate = 1.0 if config.throughputs[config.index_of(origin_id)] > 2.0 else 3.0
                timed("origin", lambda: origin.set_throughput(self.now, RUN, rate))
            else:
                up = kind is OpKind.LINK_UP
                # A partner whose agreed link is not already in the state we report.
                other = next(p for p in others[1:] if (link := config.link(origin_id, p)) is None or link.up is not up)
                timed(
                    "origin",
                    lambda: origin.link_changed(
                        self.now, origin_id, other, up=up, bandwidth_bytes_per_s=1e9, rtt_s=0.001
                    ),
                )
            announce = _only(origin.take_outgoing(), proposer_id)
            assert isinstance(announce, OpsAnnounce)
            timed("proposer_op", lambda: proposer.receive(self.now, origin_id, PROTOCOL, announce))
        sent = proposer.take_outgoing()
        # The acceptor measured is one the proposer sent the ACCEPT to: in a large run that is a
        # relay, which also forwards it to its group (the busiest acceptor role).
        accepts = [o for o in sent if isinstance(o.message, Accept)]
        assert accepts, "the proposer did not take the fast path"
        named = {op.subject for op in accepts[0].message.value.ops}  # type: ignore[attr-defined]
        chosen = next(o for o in accepts if o.to not in named and o.to != origin_id)
        accept, acceptor_id = chosen.message, chosen.to
        assert isinstance(accept, Accept)
        acceptor = self.machine(acceptor_id)
        times["relayed_to"] = len(accept.relay_to)
        times["accepts_sent"] = sum(1 for o in sent if isinstance(o.message, Accept))
        timed("acceptor_accept", lambda: acceptor.receive(self.now, proposer_id, PROTOCOL, accept))
        reply = _only(acceptor.take_outgoing(), proposer_id)
        assert isinstance(reply, Accepted), reply
        quorum = len(config) // 2 + 1
        voters = [acceptor_id, *[p for p in others if p not in (acceptor_id, subject_id)][: quorum - 2]]
        replies: list[float] = []
        for voter in voters:
            message = reply if voter == acceptor_id else dataclasses.replace(reply)
            start = time.thread_time_ns()
            proposer.receive(self.now, voter, PROTOCOL, message)
            replies.append((time.thread_time_ns() - start) / 1000.0)
        times["proposer_decide"] = replies.pop()  # the reply that completed the quorum
        times["proposer_accepted"] = replies
        out = proposer.take_outgoing()
        commit = next(o.message for o in out if o.to == acceptor_id and isinstance(o.message, Commit))
        assert isinstance(commit, Commit)
        timed("acceptor_commit", lambda: acceptor.receive(self.now, proposer_id, PROTOCOL, commit))
        new = proposer.configuration(RUN)
        assert new is not None and new.epoch == config.epoch + 1
        assert acceptor.configuration(RUN) == new
        # Every trial starts from the same formed run (fresh machines), so removals do not shrink it.
        return times


def _only(outgoing: list[Any], to: PeerID) -> Message:
    for out in outgoing:
        if out.to == to:
            message: Message = out.message
            return message
    raise AssertionError(f"nothing was sent to {to.short()}")


def local_handling(sizes: list[int], trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        for kind in KINDS:
            bench = LocalBench(n, seed)
            samples = [bench.trial(kind) for _ in range(trials)]

            def stat(key: str, samples: list[dict[str, Any]] = samples) -> dict[str, float]:
                values = [s[key] for s in samples]
                return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}

            accepted = [v for s in samples for v in s["proposer_accepted"]]
            acceptor_total = [s["acceptor_accept"] + s["acceptor_commit"] for s in samples]
            rows.append(
                {
                    "members": n,
                    "kind": kind.name,
                    "trials": trials,
                    "origin_us": stat("origin"),
                    "proposer_op_us": stat("proposer_op"),
                    "proposer_accepted_us": {
                        "p50": percentile(accepted, 0.5) if accepted else 0.0,
                        "p99": percentile(accepted, 0.99) if accepted else 0.0,
                    },
                    "proposer_decide_us": stat("proposer_decide"),
                    "acceptor_accept_us": stat("acceptor_accept"),
                    "acceptor_commit_us": stat("acceptor_commit"),
                    "acceptor_total_us": {
                        "p50": percentile(acceptor_total, 0.5),
                        "p99": percentile(acceptor_total, 0.99),
                    },
                    "max_call_us": max(
                        max(
                            s["origin"],
                            s["proposer_op"],
                            s["proposer_decide"],
                            s["acceptor_accept"],
                            s["acceptor_commit"],
                        )
                        for s in samples
                    ),
                }
            )
            print(f"  local n={n} {kind.name}: done", flush=True)
    return rows


# ------------------------------------------------------------------------------------------ (b)
def _line_latency(seed: int) -> Callable[[PeerID, PeerID], LinkProfile]:
    """One-way latency 0.5-50 ms by distance on a line; profiles cached per 0.5 ms bucket."""
    cache: dict[int, LinkProfile] = {}
    where: dict[bytes, float] = {}

    def position(peer: PeerID) -> float:
        x = where.get(peer.raw)
        if x is None:
            x = random.Random(hash((seed, peer.raw))).random()
            where[peer.raw] = x
        return x

    def link(a: PeerID, b: PeerID) -> LinkProfile:
        bucket = int(abs(position(a) - position(b)) * 99)
        profile = cache.get(bucket)
        if profile is None:
            profile = LinkProfile(latency_s=0.0005 + bucket * 0.0005)
            cache[bucket] = profile
        return profile

    return link


def decision_latency(sizes: list[int], trials: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        results: dict[str, list[float]] = {"FAIL": [], "JOIN": [], "LEAVE": []}
        for trial in range(trials):
            swarm = NegotiationSwarm(
                config=NegotiationConfig.lan(),
                seed=seed * 1000 + trial,
                run=RUN,
                params=RunParams(global_batch=max(4 * n, 1024)),
                link_fn=_line_latency(seed + trial),
                detect_delay_s=(0.0, 0.0),
                check_invariants=False,
            )
            swarm.preform(n, train=False)
            for p in swarm.running():
                swarm.call(p, lambda m, now: m.report_step(now, RUN, entered=STEP, completed=STEP - 1))
            swarm.run_for(1.0)
            for kind, act in (
                ("FAIL", lambda s: s.crash(s.random.choice(s.members()))),
                ("JOIN", lambda s: s.spawn(sponsor=s.random.choice(s.members()))),
                ("LEAVE", lambda s: s.leave(s.random.choice(s.members()))),
            ):
                start = swarm.net.now
                act(swarm)
                swarm.run_for(3.0)
                latencies = swarm.decision_latencies(OpKind[kind], since=start)
                if latencies:
                    results[kind].append(latencies[0])
        for kind, values in results.items():
            rows.append(
                {
                    "members": n,
                    "kind": kind,
                    "trials": len(values),
                    "p50_ms": 1000 * statistics.median(values) if values else float("nan"),
                    "p99_ms": 1000 * percentile(values, 0.99) if values else float("nan"),
                    "max_ms": 1000 * max(values) if values else float("nan"),
                }
            )
        print(f"  latency n={n}: done", flush=True)
    return rows


# ------------------------------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8,64,256,1024")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--latency-sizes", default="8,64,256,1024")
    parser.add_argument("--latency-trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes and few trials (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.trials, args.latency_sizes, args.latency_trials = "8,64", 5, "8,64", 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    latency_sizes = [int(s) for s in args.latency_sizes.split(",") if s]

    local = local_handling(sizes, args.trials, args.seed)
    print_table(
        "(a) CPU per call handling one operation, microseconds (p50 / p99 over trials; thread CPU time)",
        [
            "n",
            "op",
            "origin",
            "proposer: op in",
            "proposer: ACCEPTED",
            "proposer: decide",
            "acceptor: ACCEPT",
            "acceptor: COMMIT",
            "acceptor total",
            "max call",
        ],
        [
            [
                r["members"],
                r["kind"],
                _pp(r["origin_us"]),
                _pp(r["proposer_op_us"]),
                _pp(r["proposer_accepted_us"]),
                _pp(r["proposer_decide_us"]),
                _pp(r["acceptor_accept_us"]),
                _pp(r["acceptor_commit_us"]),
                _pp(r["acceptor_total_us"]),
                f"{r['max_call_us']:.0f}",
            ]
            for r in local
        ],
    )
    latency = decision_latency(latency_sizes, args.latency_trials, args.seed)
    print_table(
        "(b) Decision latency, simulated: detection -> last running member committed (RTT 1-100 ms), ms",
        ["n", "op", "trials", "p50", "p99", "max"],
        [[r["members"], r["kind"], r["trials"], r["p50_ms"], r["p99_ms"], r["max_ms"]] for r in latency],
    )
    write_json(args.json, {"local_handling": local, "decision_latency": latency, "args": vars(args)})


def _pp(stat: dict[str, float]) -> str:
    return f"{stat['p50']:.0f} / {stat['p99']:.0f}"


if __name__ == "__main__":
    main()
