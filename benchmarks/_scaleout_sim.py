"""Simulated scale-out for benchmarks/scaleout.py: the negotiation machines plus a transfer-time model.

Nothing here opens a socket or reads a clock: the negotiation runs on
:class:`~chaosp2p.sim.negotiation.NegotiationSwarm` (real machines, virtual time,
the swarm's all-reduce oracle standing in for training), and state transfer times come from the
shard planner's model (:mod:`chaosp2p.scheduling`), which ``benchmarks/state.py`` checks against
real pulls (measured within 1.05-1.2x of ``S / sum(caps)`` on this machine).

The setting, as in the public Chaos experiments: every peer has one link whose rate is drawn
uniformly from 100-1000 Mbit/s (12.5-125 MB/s) with a fixed seed; a source sends to the newcomer
at ``min(its link, the newcomer's link)`` and the newcomer takes in at most its own link in total
(the planner's downlink cap). One-way latencies 0.5-50 ms by distance on a line (as
``benchmarks/negotiation.py`` (b) uses). Training is the swarm's oracle: a step completes for all
members ``step_time_s`` after the last of them entered it.

Methods compared (``MethodResult`` per method, per cluster size):

chaosp2p        the newcomer pulls from every member at once with the optimal plan while they train,
                then asks to join; scale-out delay = transfer + decision + wait for the activation
                step + first step; members' idle time = what the simulated run shows (their steps
                only wait if the decision is late)
single-live     one random member sends everything while the others train (hivemind's
                ``load_state_from_peers`` picks one donor); then the same admission
single-barrier  one random member sends everything after admission while every member waits at
                the all-reduce for the newcomer (a broadcast at a synchronisation point, as the
                "Autoscaling" baseline does); idle time = the simulated wait
restart         checkpoint-restart: every member saves, all processes stop and restart, load the
                checkpoint (the newcomer over its own link from the one peer that holds it); every
                member idles for the whole of it. ``restart_overhead_s`` (process start, model
                build, rendezvous) is taken from the real-process runs of this benchmark.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from chaosp2p.protocols.negotiation import NegotiationConfig, OpKind, RunParams
from chaosp2p.protocols.negotiation.events import Admitted
from chaosp2p.scheduling import Source, plan_chaos_default, plan_shards
from chaosp2p.sim.negotiation import NegotiationSwarm
from chaosp2p.sim.network import LinkProfile
from chaosp2p.wire.identity import PeerID

RUN = "scaleout"
MBIT = 1e6 / 8
LINK_RANGE_BYTES_PER_S = (100 * MBIT, 1000 * MBIT)


def link_rates(count: int, seed: int, *, scale: float = 1.0) -> list[float]:
    """``count`` link rates in bytes/s, uniform over 100-1000 Mbit/s times ``scale``, from ``seed``."""
    rng = random.Random(seed)
    low, high = LINK_RANGE_BYTES_PER_S
    return [scale * rng.uniform(low, high) for _ in range(count)]


def line_latency(seed: int) -> Callable[[PeerID, PeerID], LinkProfile]:
    """One-way latency 0.5-50 ms by distance on a line (peers at seeded random points)."""
    cache: dict[int, LinkProfile] = {}
    where: dict[bytes, float] = {}

    def link(a: PeerID, b: PeerID) -> LinkProfile:
        spots = []
        for peer in (a, b):
            spot = where.get(peer.raw)
            if spot is None:
                spot = where[peer.raw] = random.Random(hash((seed, peer.raw))).random()
            spots.append(spot)
        bucket = int(abs(spots[0] - spots[1]) * 99)
        profile = cache.get(bucket)
        if profile is None:
            profile = cache[bucket] = LinkProfile(latency_s=0.0005 + bucket * 0.0005)
        return profile

    return link


# ---------------------------------------------------------------------------------------- transfer
@dataclass(frozen=True, slots=True)
class Transfer:
    """Predicted transfer times (seconds) of one newcomer's state load."""

    optimal_s: float
    """chaosp2p's plan over every member, capped by the newcomer's downlink."""
    chaos_rule_s: float
    """The public Chaos code's rule (equal pieces to the least-loaded source) on the same links."""
    single_random_s: float
    """Everything from one member drawn at random (hivemind, Autoscaling)."""
    single_best_s: float
    """Everything from the member that would finish first."""
    bound_s: float
    """``S / min(downlink, sum(rates))``: no plan can beat it."""


def transfer_times(total_bytes: int, member_links: list[float], newcomer_link: float | None, seed: int) -> Transfer:
    """The model's transfer times for ``total_bytes`` from members with ``member_links`` (bytes/s);
    ``newcomer_link`` caps what the newcomer takes in (None: only the senders' uplinks count)."""
    rng = random.Random(seed)
    sources = [Source(peer_id=i, bytes_per_s=rate, latency_s=0.0) for i, rate in enumerate(member_links)]
    optimal = plan_shards(total_bytes, sources, downlink_bytes_per_s=newcomer_link).makespan_s
    rule = plan_chaos_default(total_bytes, sources, downlink_bytes_per_s=newcomer_link).makespan_s
    down = newcomer_link if newcomer_link is not None else float("inf")
    singles = [total_bytes / min(rate, down) for rate in member_links]
    bound = total_bytes / min(down, sum(member_links))
    return Transfer(optimal, rule, rng.choice(singles), min(singles), bound)


# ---------------------------------------------------------------------------------------- negotiation
@dataclass(frozen=True, slots=True)
class JoinSim:
    """What the simulated run showed for one newcomer."""

    decision_s: float
    """From the join request until the newcomer was admitted (Admitted event)."""
    first_step_s: float
    """From the join request until the newcomer's first completed step."""
    members_idle_s: float
    """Mean over existing members of their extra waiting (step periods beyond ``step_time_s``)."""
    members_idle_max_s: float


def simulate_join(members: int, seed: int, *, step_time_s: float, download_s: float = 0.0) -> JoinSim:
    """``members`` peers train; one newcomer asks a random member to join. With ``download_s`` > 0
    the newcomer loads its state after admission (the others wait for it at the all-reduce)."""
    swarm = NegotiationSwarm(
        config=NegotiationConfig.wan(),
        seed=seed,
        run=RUN,
        params=RunParams(global_batch=max(4 * (members + 1), 1024)),
        link_fn=line_latency(seed),
        step_time_s=step_time_s,
        detect_delay_s=(0.0, 0.0),
        check_invariants=False,
    )
    swarm.preform(members)
    old = set(swarm.members())
    swarm.run_for(10 * step_time_s)
    asked = swarm.net.now
    newcomer = swarm.spawn()
    record = swarm.peers[newcomer]
    admitted: list[float] = []
    react = swarm._react

    def watch(peer_id: PeerID, events: list[Any]) -> None:
        react(peer_id, events)
        if peer_id == newcomer and any(isinstance(e, Admitted) for e in events):
            admitted.append(swarm.net.now)
            if download_s > 0:
                # The swarm's own ``download_s`` re-activates the trainer without starting its step
                # (nothing calls ``_train`` when no event follows), so the barrier is done here.
                record.trainer.active = False
                record.trainer.in_step = None

                def loaded(now: float) -> None:
                    record.trainer.active = True
                    swarm._train(record)
                    swarm.net.poke(newcomer)

                swarm._oracle.at(swarm.net.now + download_s, loaded)
                swarm.net.poke(swarm._oracle_id)

    swarm._react = watch  # type: ignore[method-assign]

    def contributed() -> bool:
        return any(p == newcomer for p, _, _, _ in swarm.completions[-members - 2 :])

    took = swarm.run_until(contributed, timeout_s=600.0 + 4 * download_s, step_s=step_time_s / 4)
    if took is None or not admitted:
        raise RuntimeError(f"simulated newcomer never contributed ({members} members, seed {seed})")
    first = swarm.net.now
    swarm.run_for(3 * step_time_s)
    assert record.running
    idle: dict[PeerID, float] = dict.fromkeys(old, 0.0)
    last: dict[PeerID, float] = {}
    for peer, _step, _digest, at in swarm.completions:
        if peer not in old:
            continue
        previous = last.get(peer)
        last[peer] = at
        if previous is not None and at > asked and previous < first + step_time_s:
            idle[peer] += max(0.0, (at - previous) - step_time_s)
    values = list(idle.values())
    return JoinSim(admitted[0] - asked, first - asked, statistics.fmean(values), max(values))


def decision_latencies(members: int, seed: int, kinds: tuple[str, ...], *, wan: bool) -> dict[str, float]:
    """Virtual seconds from detection until the last member committed, per operation kind, in a
    formed run of ``members`` (not training, every member at the same step): ``wan`` with 1-100 ms
    RTTs and the wan profile, else 0.5 ms RTTs (one data centre) and the lan profile."""
    swarm = NegotiationSwarm(
        config=NegotiationConfig.wan() if wan else NegotiationConfig.lan(),
        seed=seed,
        run=RUN,
        params=RunParams(global_batch=max(4 * members, 1024)),
        link=LinkProfile(latency_s=0.00025),
        link_fn=line_latency(seed) if wan else None,
        detect_delay_s=(0.0, 0.0),
        check_invariants=False,
    )
    swarm.preform(members, train=False)
    for peer in swarm.running():
        swarm.call(peer, lambda m, now: m.report_step(now, RUN, entered=100, completed=99))
    swarm.run_for(1.0)
    rng = random.Random(seed)
    out: dict[str, float] = {}
    for kind in kinds:
        pool = swarm.members()
        start = swarm.net.now
        if kind == "LEAVE":
            swarm.leave(rng.choice(pool))
        elif kind == "FAIL":
            swarm.crash(rng.choice(pool))
        elif kind == "JOIN":
            swarm.spawn(sponsor=rng.choice(pool))
        elif kind in ("LINK_DOWN", "LINK_UP"):
            a, b = rng.sample(pool, 2)
            if kind == "LINK_UP":  # a fresh measurement of a link the configuration does not hold yet
                swarm.call(a, lambda m, now, a=a, b=b: m.link_changed(now, a, b, up=True, bandwidth_bytes_per_s=5e7))
            else:
                swarm.call(a, lambda m, now, a=a, b=b: m.link_changed(now, a, b, up=False))
        else:
            raise ValueError(kind)
        swarm.run_for(3.0)
        latencies = swarm.decision_latencies(OpKind[kind], since=start)
        if latencies:
            out[kind] = latencies[0]
    return out


# ---------------------------------------------------------------------------------------- methods
@dataclass(frozen=True, slots=True)
class MethodResult:
    """One method's scale-out delay and existing members' idle time for one newcomer."""

    delay_s: float
    idle_per_member_s: float
    idle_total_s: float


def compare(
    members: int,
    total_bytes: int,
    seed: int,
    *,
    step_time_s: float,
    restart_overhead_s: float,
    disk_bytes_per_s: float,
    symmetric: bool,
) -> dict[str, Any]:
    """Every method for one newcomer joining ``members`` members, state of ``total_bytes``.

    ``symmetric``: each peer's link caps both directions (the newcomer's own link bounds its
    download); otherwise only uploads are capped (egress shaping, as the real-process runs do)."""
    links = link_rates(members + 1, seed)
    transfer = transfer_times(total_bytes, links[:-1], links[-1] if symmetric else None, seed)
    live = simulate_join(members, seed, step_time_s=step_time_s)
    barrier = simulate_join(members, seed, step_time_s=step_time_s, download_s=transfer.single_random_s)
    admit = live.first_step_s  # decision + activation wait + first step, with the state already there
    save = total_bytes / disk_bytes_per_s
    restart = save + restart_overhead_s + transfer.single_random_s + total_bytes / disk_bytes_per_s

    def result(delay: float, idle: float) -> dict[str, float]:
        return asdict(MethodResult(delay, idle, idle * members))

    return {
        "members": members,
        "seed": seed,
        "links": "symmetric" if symmetric else "upload",
        "transfer": asdict(transfer),
        "decision_s": live.decision_s,
        "admission_s": admit,
        "methods": {
            "chaosp2p": result(transfer.optimal_s + admit, live.members_idle_s),
            "chaos_rule": result(transfer.chaos_rule_s + admit, live.members_idle_s),
            "single_live": result(transfer.single_random_s + admit, live.members_idle_s),
            "single_barrier": result(barrier.first_step_s, barrier.members_idle_s),
            "restart": result(restart, restart),
        },
    }
