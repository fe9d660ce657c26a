"""Negotiation machines on :class:`~chaosp2p.sim.network.SimNetwork` with a fake training loop.

Not used by the runtime: tests and the benchmark use it. Each simulated peer is a
:class:`NegotiationMachine` plus a *trainer* that behaves as the real training layer must:

* before beginning step k it asks ``config_for_step(run, k)``; None means wait (gated / not ours);
  otherwise it reports ``entered=k`` and joins the all-reduce group (configuration digest, k);
* the *all-reduce oracle*: step k under configuration C completes only once every member of C is in
  step k under C, and completes for all of them at once ``step_time_s`` later -- provided every one
  of them is still alive and still finds C governing k (a member that became gated withdrew);
* a member whose configuration for its current step changed aborts the step and redoes it;
  ``ResyncNeeded`` rewinds it; ``Admitted`` starts it at the activation step.

A simulated membership layer feeds ``observe_member``: a crash is reported FAILED to every running
peer after a random detection delay; a partition makes each side see the other FAILED, and healing
makes them ALIVE again at a higher incarnation (a SWIM refutation). Peers removed from the run
(partitioned away, falsely failed) rejoin as newcomers when ``auto_rejoin`` is set.

The swarm records what the invariants need (:meth:`NegotiationSwarm.violations`): every committed
(epoch, digest) pair, each peer's epochs and governing configurations over time, and every step
completion with the configuration it ran under.
"""

from __future__ import annotations

import functools
import heapq
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership.events import MemberState
from chaosp2p.protocols.negotiation.config import NegotiationConfig
from chaosp2p.protocols.negotiation.events import (
    Admitted,
    ConfigurationCommitted,
    JoinRefused,
    NegotiationEvent,
    OperationCommitted,
    RemovedFromRun,
    ResyncNeeded,
)
from chaosp2p.protocols.negotiation.machine import NegotiationMachine
from chaosp2p.protocols.negotiation.messages import codec
from chaosp2p.protocols.negotiation.operations import FAIL_KINDS, PROTOCOL, OpKind, SignatureCache
from chaosp2p.protocols.negotiation.paxos import JoinRecord
from chaosp2p.protocols.negotiation.run_configuration import (
    Configuration,
    RunParams,
    derive_seed,
    genesis_configuration,
    make_configuration,
)
from chaosp2p.protocols.negotiation.transitions import MEMBER_STATES, ProposerPhase, RunState
from chaosp2p.sim.negotiation_links import LinkCuts
from chaosp2p.sim.network import LinkProfile, SimNetwork
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message


def install_configuration(machine: NegotiationMachine, config: Configuration, now: float) -> None:
    """Make ``machine`` a member holding ``config``, as if a COMMIT had just admitted it.

    For benchmarks and large simulations that start from a formed run instead of joining a
    thousand peers one by one; ``machine``'s peer must be a member of ``config``.
    """
    if not config.has_member(machine.local_peer):
        raise ValueError("the machine's peer is not a member of the configuration")
    rec = machine._new_run(config.run)
    rec.state = RunState.JOINING
    rec.join = JoinRecord(incarnation=config.incarnation_of(machine.local_peer) or 0, throughput=1.0, sponsors=[])
    machine._admit(now, rec, config)
    machine.take_events()
    machine.take_outgoing()


def sim_identity(index: int, *, namespace: int = 0) -> Identity:
    """A deterministic identity for simulated peer ``index``."""
    return Identity.from_seed((0x6E65 << 200 | namespace << 64 | (index + 1)).to_bytes(32, "big"))


@dataclass(slots=True)
class Trainer:
    """The fake training loop of one peer."""

    next_step: int = 0
    in_step: tuple[int, bytes] | None = None
    active: bool = False
    """Training (a member that has its state); False while joining or after removal."""


@dataclass(slots=True)
class SwarmPeer:
    """One simulated peer process."""

    index: int
    identity: Identity
    machine: NegotiationMachine
    node: _Node
    trainer: Trainer = field(default_factory=Trainer)
    running: bool = True
    leaving: bool = False
    membership_incarnation: int = 0
    joins: int = 0
    last_epoch: int = -1
    last_in_force: tuple[int, int] = (-1, -1)

    @property
    def peer_id(self) -> PeerID:
        """The peer's id."""
        return self.identity.peer_id


class _Node:
    """What the simulator runs for one peer: the machine, plus the trainer's reactions."""

    protocols: Sequence[str] = (PROTOCOL,)

    def __init__(self, swarm: NegotiationSwarm, peer: PeerID, machine: NegotiationMachine) -> None:
        self._swarm = swarm
        self._peer = peer
        self.machine = machine
        self._events: list[NegotiationEvent] = []

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        self.machine.receive(now, sender, protocol, message)

    def handle_timeout(self, now: float) -> None:
        self.machine.handle_timeout(now)

    def next_deadline(self) -> float | None:
        return self.machine.next_deadline()

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        self.machine.peer_unreachable(now, peer)

    def take_outgoing(self) -> list[Outgoing]:
        # Events first: the trainer's reactions may queue messages of their own.
        events = self.machine.take_events()
        if events:
            self._events.extend(events)
            self._swarm._react(self._peer, events)
        out = self.machine.take_outgoing()
        dup = self._swarm.duplicate
        if dup > 0.0:
            rng = self._swarm.random
            out = out + [o for o in out if rng.random() < dup]
        return out

    def take_events(self) -> list[NegotiationEvent]:
        events, self._events = self._events, []
        return events


class _Oracle:
    """A pseudo-peer whose timers drive scheduled actions (completions, membership reports)."""

    protocols: Sequence[str] = ()

    def __init__(self) -> None:
        self.actions: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = 0

    def at(self, when: float, action: Callable[[float], None]) -> None:
        self._seq += 1
        heapq.heappush(self.actions, (when, self._seq, action))

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        return None

    def handle_timeout(self, now: float) -> None:
        while self.actions and self.actions[0][0] <= now:
            _, _, action = heapq.heappop(self.actions)
            action(now)

    def next_deadline(self) -> float | None:
        return self.actions[0][0] if self.actions else None

    def take_outgoing(self) -> list[Outgoing]:
        return []

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        return None


class NegotiationSwarm:
    """Many negotiation machines training one run on a simulated network, with fault injection."""

    def __init__(
        self,
        *,
        config: NegotiationConfig,
        seed: int,
        run: str = "run",
        params: RunParams | None = None,
        link: LinkProfile | None = None,
        link_fn: Callable[[PeerID, PeerID], LinkProfile] | None = None,
        step_time_s: float = 0.05,
        detect_delay_s: tuple[float, float] = (0.05, 0.2),
        download_s: float = 0.0,
        duplicate: float = 0.0,
        auto_rejoin: bool = True,
        count_bytes: bool = False,
        check_invariants: bool = True,
    ) -> None:
        self.config = config
        self.run = run
        self.params = params or RunParams(global_batch=1024)
        self.random = random.Random(seed)
        self.net = SimNetwork(
            seed=seed,
            default_link=link or LinkProfile(latency_s=0.001),
            link_fn=link_fn,
            codecs={PROTOCOL: codec} if count_bytes else None,
        )
        self.step_time_s = step_time_s
        self.detect_delay_s = detect_delay_s
        self.download_s = download_s
        self.duplicate = duplicate
        self.auto_rejoin = auto_rejoin
        self.check_invariants = check_invariants
        self.peers: dict[PeerID, SwarmPeer] = {}
        # All simulated peers are honest and verify the same signatures: one cache saves the CPU
        # of verifying every operation once per peer (a real peer verifies each once itself).
        self._signatures = SignatureCache(config.verified_cache_size)
        self._oracle = _Oracle()
        self._oracle_id = sim_identity(0xFFFFFF, namespace=seed & 0xFFFF).peer_id
        self.net.add(self._oracle_id, self._oracle)
        self._namespace = seed & 0xFFFF
        self._groups: list[set[PeerID]] | None = None
        self._groups_scheduled: dict[tuple[frozenset[PeerID], ...], float] = {}
        self._pending_groups: set[tuple[int, bytes]] = set()
        self._groups_in_step: dict[tuple[int, bytes], set[PeerID]] = {}
        # invariant records
        self.committed: dict[int, bytes] = {}
        """epoch -> digest of the first commit seen anywhere."""
        self.configs: dict[int, Configuration] = {}
        self.completions: list[tuple[PeerID, int, bytes, float]] = []
        self.resyncs: list[tuple[float, PeerID, ResyncNeeded]] = []
        self.removals: list[tuple[float, PeerID, RemovedFromRun]] = []
        self.op_events: list[tuple[float, PeerID, OperationCommitted]] = []
        self.problems: list[str] = []
        self.links = LinkCuts(self)
        """Cut links: rounds that need one fail, and their ends declare it down (issue 19)."""

    # ------------------------------------------------------------------ building
    def _make(self) -> SwarmPeer:
        index = len(self.peers)
        identity = sim_identity(index, namespace=self._namespace)
        machine = NegotiationMachine(
            identity=identity,
            config=self.config,
            rng=random.Random(self.random.getrandbits(64)),
            now=self.net.now,
            signature_cache=self._signatures,
        )
        node = _Node(self, identity.peer_id, machine)
        peer = SwarmPeer(index=index, identity=identity, machine=machine, node=node)
        self.peers[identity.peer_id] = peer
        self.net.add(identity.peer_id, node)
        return peer

    def found(self, *, throughput: float = 1.0) -> PeerID:
        """Start the founder: it creates the run alone (C_0) and starts training at step 0."""
        peer = self._make()
        self.call(peer.peer_id, lambda m, now: m.create_run(now, self.run, params=self.params, throughput=throughput))
        peer.trainer.active = True
        self._train(peer)
        return peer.peer_id

    def preform(self, count: int, *, train: bool = True) -> Configuration:
        """Start ``count`` peers that already form the run (one configuration, epoch 1, all taking
        part from step 0) instead of joining them one by one."""
        new = [self._make() for _ in range(count)]
        founder = new[0]
        genesis = genesis_configuration(self.run, founder.peer_id, incarnation=0, throughput=1.0, params=self.params)
        peers = sorted((p.peer_id for p in new), key=lambda p: p.raw)
        config = make_configuration(
            run=self.run,
            epoch=1,
            activation_step=0,
            peers=peers,
            incarnations=[0] * count,
            throughputs=[1.0] * count,
            links=(),
            params=self.params,
            seed=derive_seed(genesis.seed, 1, genesis.digest),
            since_steps=[0] * count,
        )
        for peer in new:
            install_configuration(peer.machine, config, self.net.now)
            peer.trainer.active = train
            self.net.poke(peer.peer_id)
        self.committed.setdefault(config.epoch, config.digest)
        self.configs.setdefault(config.epoch, config)
        for peer in new:
            peer.last_epoch = config.epoch
            self._train(peer)
        return config

    def spawn(self, *, sponsor: PeerID | None = None, throughput: float = 1.0) -> PeerID:
        """Start a newcomer that asks ``sponsor`` (default: a random running member) to admit it."""
        peer = self._make()
        self._join(peer, sponsor, throughput)
        return peer.peer_id

    def _join(self, peer: SwarmPeer, sponsor: PeerID | None, throughput: float = 1.0) -> None:
        if sponsor is None:
            members = self.members()
            if not members:
                return
            sponsor = self.random.choice(members)
        peer.joins += 1
        incarnation = peer.joins
        self.call(
            peer.peer_id,
            lambda m, now: m.request_join(now, self.run, sponsor, incarnation=incarnation, throughput=throughput),
        )

    def grow(self, count: int, *, spacing_s: float = 0.0) -> list[PeerID]:
        """Add ``count`` newcomers through random members, ``spacing_s`` apart."""
        added = []
        for _ in range(count):
            added.append(self.spawn())
            if spacing_s:
                self.net.run_for(spacing_s)
        return added

    def call(self, peer: PeerID, action: Callable[[NegotiationMachine, float], Any]) -> Any:
        """Run ``action(machine, now)`` on a running peer as a driver would, then carry out its output."""
        node = self.peers[peer].node
        return self.net.call(peer, lambda _machine, now: action(node.machine, now))

    # ------------------------------------------------------------------ faults
    def crash(self, peer: PeerID) -> None:
        """kill -9; every running peer's membership reports it FAILED after a detection delay."""
        record = self.peers[peer]
        if not record.running:
            return
        record.running = False
        self._leave_group(record)
        self.net.crash(peer)
        inc = record.membership_incarnation
        for other in self.running():
            self._schedule_observe(other, peer, MemberState.FAILED, inc)

    def leave(self, peer: PeerID) -> None:
        """Graceful leave: the process exits once its LEAVE is committed (RemovedFromRun)."""
        record = self.peers[peer]
        record.leaving = True
        self.call(peer, lambda m, now: m.leave(now, self.run))

    def partition(self, groups: Iterable[Iterable[PeerID]]) -> None:
        """Split the network; each side's membership reports the other side FAILED."""
        sets = [set(g) for g in groups]
        self._groups = sets
        self.net.partition(sets)
        side = {p: i for i, g in enumerate(sets) for p in g}
        for a in self.running():
            for b in self.running():
                if a != b and side.get(a, -1) != side.get(b, -2):
                    self._schedule_observe(a, b, MemberState.FAILED, self.peers[b].membership_incarnation)

    def heal(self) -> None:
        """End the partition; the peers the other side saw fail refute (ALIVE, higher incarnation)."""
        groups = self._groups
        self._groups = None
        self.net.heal()
        if groups is None:
            return
        side = {p: i for i, g in enumerate(groups) for p in g}
        running = self.running()
        for p in running:
            self.peers[p].membership_incarnation += 1
        for a in running:
            for b in running:
                if a != b and side.get(a, -1) != side.get(b, -2):
                    self._schedule_observe(a, b, MemberState.ALIVE, self.peers[b].membership_incarnation)

    def set_loss(self, loss: float) -> None:
        """Drop this fraction of messages on every link (keeps the default latency and jitter)."""
        link = self.net.default_link
        self.net.default_link = LinkProfile(latency_s=link.latency_s, jitter_s=link.jitter_s, loss=loss)

    def _schedule_observe(self, observer: PeerID, subject: PeerID, state: MemberState, incarnation: int) -> None:
        low, high = self.detect_delay_s
        when = self.net.now + self.random.uniform(low, high)

        def report(now: float) -> None:
            record = self.peers[observer]
            if record.running:
                self.call(observer, lambda m, t: m.observe_member(t, subject, state, incarnation))

        self._oracle.at(when, report)
        self.net.poke(self._oracle_id)

    # ------------------------------------------------------------------ running
    def run_for(self, seconds: float) -> None:
        """Advance virtual time."""
        self.net.run_for(seconds)

    def run_until(self, condition: Callable[[], bool], *, timeout_s: float, step_s: float = 0.05) -> float | None:
        """Run until ``condition()``; the virtual seconds it took, or None on timeout."""
        start = self.net.now
        ok = self.net.run_until_true(condition, timeout_s=timeout_s, step_s=step_s)
        return self.net.now - start if ok else None

    # ------------------------------------------------------------------ the trainer
    def _react(self, peer_id: PeerID, events: list[NegotiationEvent]) -> None:
        peer = self.peers[peer_id]
        if not peer.running:
            return
        for event in events:
            if isinstance(event, ConfigurationCommitted):
                self._record_commit(peer, event)
            elif isinstance(event, Admitted):
                trainer = peer.trainer
                trainer.next_step = event.activation_step
                trainer.in_step = None
                if self.download_s > 0:
                    trainer.active = False  # downloading the members' state

                    def ready(now: float, peer: SwarmPeer = peer) -> None:
                        if peer.running:
                            peer.trainer.active = True
                            # Begin training now: a poke alone reaches the machine, and only
                            # its events (there may be none) would have started the trainer.
                            self._train(peer)
                            self.net.poke(peer.peer_id)

                    self._oracle.at(self.net.now + self.download_s, ready)
                    self.net.poke(self._oracle_id)
                else:
                    trainer.active = True
            elif isinstance(event, ResyncNeeded):
                self.resyncs.append((self.net.now, peer_id, event))
                peer.trainer.next_step = min(peer.trainer.next_step, event.step)
                self._leave_group(peer)
            elif isinstance(event, RemovedFromRun):
                # The peer still trains the steps before the activation step; then _train makes a
                # leaver exit and anyone else rejoin as a newcomer -- but an evicted one, which
                # stops as the training layer does (its contributions kept failing the others' checks).
                self.removals.append((self.net.now, peer_id, event))
                if event.reason == "evicted":
                    peer.leaving = True
            elif isinstance(event, OperationCommitted):
                self.op_events.append((self.net.now, peer_id, event))
            elif isinstance(event, JoinRefused):
                # As a training layer would: ask another member it knows of.
                self._oracle.at(self.net.now + 0.01, functools.partial(self._retry_join, peer))
                self.net.poke(self._oracle_id)
        self._train(peer)

    def _exit(self, peer: PeerID, now: float) -> None:
        self.net.crash(peer)
        inc = self.peers[peer].membership_incarnation
        for other in self.running():
            self._schedule_observe(other, peer, MemberState.LEFT, inc)

    def _retry_join(self, peer: SwarmPeer, now: float) -> None:
        if not peer.running or peer.machine.state_of(self.run) is not RunState.JOINING:
            return
        members = self.members()
        if members:
            sponsor = self.random.choice(members)
            throughput = 1.0
            self.call(
                peer.peer_id,
                lambda m, t: m.request_join(t, self.run, sponsor, incarnation=peer.joins, throughput=throughput),
            )

    def _rejoin(self, peer: SwarmPeer, now: float) -> None:
        if peer.running and peer.machine.state_of(self.run) is RunState.REMOVED:
            self._join(peer, None)

    def _record_commit(self, peer: SwarmPeer, event: ConfigurationCommitted) -> None:
        config = event.configuration
        if not self.check_invariants:
            return
        seen = self.committed.get(config.epoch)
        if seen is None:
            self.committed[config.epoch] = config.digest
            self.configs[config.epoch] = config
        elif seen != config.digest:
            self.problems.append(
                f"epoch {config.epoch}: two configurations ({seen.hex()[:8]}, {config.digest.hex()[:8]})"
            )
        if config.epoch <= peer.last_epoch:
            self.problems.append(f"{peer.index}: epoch went from {peer.last_epoch} to {config.epoch}")
        peer.last_epoch = config.epoch

    def _train(self, peer: SwarmPeer) -> None:
        """Begin the next step if allowed; abort the current one if its configuration changed."""
        trainer = peer.trainer
        if not peer.running or not trainer.active:
            return
        machine = peer.machine
        run = self.run
        if trainer.in_step is not None:
            k, digest = trainer.in_step
            current = machine.config_for_step(run, k)
            if current is not None and current.digest == digest:
                return
            self._leave_group(peer)  # withdrawn: gated, or a new configuration governs k
        k = trainer.next_step
        config = machine.config_for_step(run, k)
        if config is None:
            if machine.state_of(run) is RunState.REMOVED:
                trainer.active = False
                if peer.leaving:
                    peer.running = False
                    self._oracle.at(self.net.now, functools.partial(self._exit, peer.peer_id))
                    self.net.poke(self._oracle_id)
                elif self.auto_rejoin:
                    self._oracle.at(self.net.now + 0.01, functools.partial(self._rejoin, peer))
                    self.net.poke(self._oracle_id)
            return
        if self.check_invariants:
            in_force = (config.epoch, config.activation_step)
            if in_force < peer.last_in_force:
                self.problems.append(
                    f"{peer.index}: configuration in force went back {peer.last_in_force} -> {in_force}"
                )
            peer.last_in_force = max(peer.last_in_force, in_force)
        machine.report_step(self.net.now, run, entered=k)
        key = (k, config.digest)
        trainer.in_step = key
        group = self._groups_in_step.setdefault(key, set())
        group.add(peer.peer_id)
        if len(group) == len(config.participants(k)) and key not in self._pending_groups:
            self._maybe_complete(config, k)

    def _leave_group(self, peer: SwarmPeer) -> None:
        key = peer.trainer.in_step
        peer.trainer.in_step = None
        if key is not None:
            group = self._groups_in_step.get(key)
            if group is not None:
                group.discard(peer.peer_id)
                if not group:
                    del self._groups_in_step[key]

    def _maybe_complete(self, config: Configuration, k: int) -> None:
        key = (k, config.digest)
        for p in config.participants(k):
            record = self.peers.get(p)
            if record is None or not record.running or record.trainer.in_step != key:
                return
        if self.links.blocks(config, k):
            return
        self._pending_groups.add(key)
        self._oracle.at(self.net.now + self.step_time_s, lambda now: self._complete(config, k))
        self.net.poke(self._oracle_id)

    def _complete(self, config: Configuration, k: int) -> None:
        key = (k, config.digest)
        self._pending_groups.discard(key)
        records = [self.peers.get(p) for p in config.participants(k)]
        for record in records:
            if record is None or not record.running or record.trainer.in_step != key:
                return
            current = record.machine.config_for_step(self.run, k)
            if current is None or current.digest != config.digest:
                return
        now = self.net.now
        for record in records:
            assert record is not None
            record.machine.report_step(now, self.run, completed=k)
            self._leave_group(record)
            record.trainer.next_step = k + 1
            self.completions.append((record.peer_id, k, config.digest, now))
        for record in records:
            assert record is not None
            self._train(record)
            self.net.poke(record.peer_id)

    # ------------------------------------------------------------------ questions
    def running(self) -> list[PeerID]:
        """Peers whose process runs."""
        return [p for p, r in self.peers.items() if r.running]

    def members(self) -> list[PeerID]:
        """Running peers that consider themselves members of the run."""
        out = []
        for p, r in self.peers.items():
            if r.running and r.machine.state_of(self.run) in MEMBER_STATES:
                out.append(p)
        return out

    def views(self) -> dict[PeerID, tuple[int, bytes]]:
        """(epoch, digest) of every running member."""
        out = {}
        for p in self.members():
            config = self.peers[p].machine.configuration(self.run)
            assert config is not None
            out[p] = (config.epoch, config.digest)
        return out

    def agreed(self) -> Configuration | None:
        """The configuration every running member holds, if they all hold the same one."""
        views = self.views()
        if not views or len(set(views.values())) != 1:
            return None
        return self.peers[next(iter(views))].machine.configuration(self.run)

    def converged(self) -> bool:
        """Every running peer is a member of one agreed configuration made of exactly the running
        peers, and nothing is pending (but EVICTs short of a quorum of signers and FAILs short of a
        second signer, which wait for corroboration and change nothing), gated or being proposed
        anywhere."""
        config = self.agreed()
        if config is None:
            return False
        running = {p for p in self.running() if not self.peers[p].leaving}
        if set(config.peers) != running or set(self.members()) != running:
            return False
        for p in running:
            status = self.peers[p].machine.run_status(self.run)
            fail_signers: dict[PeerID, set[PeerID]] = {}
            for op in status.pending:
                if op.kind in FAIL_KINDS:
                    fail_signers.setdefault(op.subject, set()).add(op.origin)
            # EVICTs short of a quorum and FAILs short of a second signer wait for corroboration.
            waiting = any(
                op.kind is not OpKind.EVICT and (op.kind not in FAIL_KINDS or len(fail_signers[op.subject]) >= 2)
                for op in status.pending
            )
            if waiting or status.gate_step is not None or status.proposer is not ProposerPhase.IDLE:
                return False
        return True

    def governing(self, step: int) -> Configuration | None:
        """From the global commit record: the newest configuration activating at or before ``step``."""
        for epoch in sorted(self.configs, reverse=True):
            config = self.configs[epoch]
            if config.activation_step <= step:
                return config
        return None

    def violations(self) -> list[str]:
        """Every broken invariant seen so far (empty if all hold).

        Besides what was recorded as it happened (two configurations for one epoch, an epoch or the
        configuration in force going back at a peer): every step a peer completed was completed
        under the configuration the final chain says governs it -- unless a decision that came too
        late was reported to that peer (ResyncNeeded after the completion), or the peer was removed
        or crashed afterwards (its work is not part of the run any more).
        """
        problems = list(self.problems)
        governing: dict[int, Configuration | None] = {}
        for peer, k, digest, at in self.completions:
            if k not in governing:
                governing[k] = self.governing(k)
            config = governing[k]
            if config is not None and config.digest == digest:
                continue
            if any(p == peer and t >= at and e.step <= k for t, p, e in self.resyncs):
                continue
            if any(p == peer and t >= at for t, p, _ in self.removals) or not self.peers[peer].running:
                continue
            problems.append(f"{self.peers[peer].index}: completed step {k} under a configuration not governing it")
        return problems

    def resync_count(self) -> int:
        """How many ResyncNeeded events the peers received (late decisions reported, not hidden)."""
        return len(self.resyncs)

    def decision_latencies(self, kind: Any, since: float = 0.0) -> list[float]:
        """For each committed operation of ``kind``: seconds from detection to the last member committing it."""
        last: dict[tuple[int, PeerID, float], float] = {}
        detected: dict[tuple[int, PeerID, float], float] = {}
        for at, _, event in self.op_events:
            if event.kind is not kind or at < since:
                continue
            key = (event.epoch, event.subject, event.detected_at)
            last[key] = max(last.get(key, 0.0), at)
            detected[key] = event.detected_at
        return sorted(last[k] - detected[k] for k in last)


class ManualNet:
    """Machines wired by hand, for unit tests: nothing moves until the test says so.

    ``deliver()`` hands every queued message to its receiver (optionally dropping some), ``advance``
    moves the shared clock and fires due timers; events are collected per peer.
    """

    def __init__(self, machines: Iterable[NegotiationMachine], *, now: float = 0.0) -> None:
        self.now = now
        self.machines: dict[PeerID, NegotiationMachine] = {m.local_peer: m for m in machines}
        self.crashed: set[PeerID] = set()
        self.queue: list[tuple[PeerID, Outgoing]] = []
        self.events: dict[PeerID, list[NegotiationEvent]] = {p: [] for p in self.machines}
        self.delivered: list[tuple[PeerID, PeerID, Message]] = []

    def collect(self) -> None:
        """Move every machine's output into the queue and its events into ``events``."""
        for peer, machine in self.machines.items():
            for out in machine.take_outgoing():
                self.queue.append((peer, out))
            self.events[peer].extend(machine.take_events())

    def call(self, peer: PeerID, action: Callable[[NegotiationMachine, float], Any]) -> Any:
        """Run ``action(machine, now)`` and collect the output."""
        result = action(self.machines[peer], self.now)
        self.collect()
        return result

    def deliver(self, drop: Callable[[PeerID, PeerID, Message], bool] | None = None, *, rounds: int = 1000) -> int:
        """Deliver queued messages (and what they cause) until none are left; returns how many."""
        count = 0
        for _ in range(rounds):
            self.collect()
            if not self.queue:
                break
            batch, self.queue = self.queue, []
            for sender, out in batch:
                if out.to in self.crashed or sender in self.crashed or out.to not in self.machines:
                    continue
                if drop is not None and drop(sender, out.to, out.message):
                    continue
                self.machines[out.to].receive(self.now, sender, out.protocol, out.message)
                self.delivered.append((sender, out.to, out.message))
                count += 1
        self.collect()
        return count

    def advance(self, seconds: float, drop: Callable[[PeerID, PeerID, Message], bool] | None = None) -> None:
        """Move the clock forward in small steps, firing timers and delivering messages."""
        end = self.now + seconds
        while True:
            due = [
                d for p, m in self.machines.items() if p not in self.crashed and (d := m.next_deadline()) is not None
            ]
            nxt = min(due, default=end)
            if nxt > end:
                break
            self.now = max(self.now, nxt)
            for peer, machine in self.machines.items():
                deadline = machine.next_deadline()
                if peer not in self.crashed and deadline is not None and deadline <= self.now:
                    machine.handle_timeout(self.now)
            self.deliver(drop)
            if nxt >= end:
                break
        self.now = end
        self.deliver(drop)

    def take(self, peer: PeerID) -> list[NegotiationEvent]:
        """Remove and return the events collected for ``peer``."""
        events, self.events[peer] = self.events[peer], []
        return events
