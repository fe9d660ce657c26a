"""A swarm of membership machines on :class:`~chaosp2p.sim.network.SimNetwork`, for tests and benchmarks.

Not used by the runtime. It builds peers with deterministic identities and addresses, joins them
through random earlier peers, injects the faults the real acceptance test uses (crash = kill -9,
stall = SIGSTOP, restart = same PeerID in a new process, partitions) and one more: a *hostile*
member (:class:`ForgingMachine`) that runs the real protocol and gossips forgeries at the others.
It answers the questions simulations ask: has every live peer converged on the same membership
view, how long did failure detection take, how many suspicions hit peers that were in fact fine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from chaosp2p.protocols.base import Outgoing
from chaosp2p.protocols.membership import (
    PROTOCOL,
    MembershipConfig,
    MembershipEvent,
    MembershipMachine,
    MemberState,
    PeerFailed,
    PeerSuspected,
    UpdateKind,
    codec,
)
from chaosp2p.protocols.membership.config import MAX_INCARNATION
from chaosp2p.protocols.membership.messages import Gossip, MemberUpdate, PushPull
from chaosp2p.protocols.membership.signing import MemoVerifier, alive_payload
from chaosp2p.sim.network import LinkProfile, SimNetwork
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message

_GONE = (MemberState.FAILED, MemberState.LEFT, None)


def sim_identity(index: int, *, namespace: int = 0) -> Identity:
    """A deterministic identity (key pair) for simulated peer ``index``."""
    seed = (namespace << 32 | (index + 1)).to_bytes(32, "big")
    return Identity.from_seed(seed)


def sim_peer_id(index: int, *, namespace: int = 0) -> PeerID:
    """A deterministic PeerID for simulated peer ``index``."""
    return sim_identity(index, namespace=namespace).peer_id


def sim_addr(index: int) -> str:
    """A deterministic, valid listen multiaddr for simulated peer ``index``."""
    return f"/ip4/10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}/tcp/4001"


class ForgingMachine:
    """A hostile member: the real machine, plus forgeries sent at the swarm every ``interval_s``.

    Each round it picks an honest target and a victim among the members it sees and sends the
    target one GOSSIP with everything gossip used to be able to do by itself: an unsigned LEFT and
    one signed with the wrong key, DEAD with an origin of its choosing, SUSPECT at an incarnation
    near the largest (the pinning attack), an unsigned ALIVE moving the victim to an address of a
    third party, a verdict on the target itself, and ``fakes_per_round`` signed ALIVE records of
    made-up identities at made-up addresses (to fill tables). Every ``push_every`` rounds a PUSH_PULL
    carries ``push_fakes`` more made-up members. It answers probes like any member, so it stays a
    member: what it sends counts as a member's word.
    """

    def __init__(
        self,
        inner: MembershipMachine,
        *,
        rng: random.Random,
        now: float,
        interval_s: float,
        fakes_per_round: int = 2,
        push_every: int = 10,
        push_fakes: int = 64,
    ) -> None:
        self.inner = inner
        self.protocols = inner.protocols
        self._rng = rng
        self._interval = interval_s
        self._next = now + interval_s
        self._fakes_per_round = fakes_per_round
        self._push_every = push_every
        self._push_fakes = push_fakes
        self._rounds = 0
        self._out: list[Outgoing] = []
        self.fakes_made = 0
        """Made-up identities introduced so far."""

    # ------------------------------------------------------------------ MessageMachine, delegated
    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        """Handled by the real machine."""
        self.inner.receive(now, sender, protocol, message)

    def handle_timeout(self, now: float) -> None:
        """The real machine's timers, and a round of forgeries when one is due."""
        self.inner.handle_timeout(now)
        if now >= self._next:
            self._next = now + self._interval
            self._forge(now)

    def next_deadline(self) -> float | None:
        """The earlier of the real machine's next timer and the next round."""
        deadline = self.inner.next_deadline()
        return self._next if deadline is None else min(deadline, self._next)

    def take_outgoing(self) -> list[Outgoing]:
        """The real machine's messages, then the forgeries."""
        out, self._out = [*self.inner.take_outgoing(), *self._out], []
        return out

    def take_events(self) -> list[MembershipEvent]:
        """The real machine's events."""
        return self.inner.take_events()

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        """Handled by the real machine."""
        self.inner.peer_unreachable(now, peer)

    # ------------------------------------------------------------------ forgeries
    def _fake(self) -> MemberUpdate:
        identity = Identity.from_seed(self._rng.randbytes(32))
        self.fakes_made += 1
        addrs = (f"/ip4/198.18.{(self.fakes_made >> 8) & 255}.{self.fakes_made & 255}/tcp/4001",)
        fake = identity.peer_id
        signature = identity.sign(alive_payload(fake, 0, addrs))
        return MemberUpdate(kind=UpdateKind.ALIVE, peer=fake, incarnation=0, addrs=addrs, signature=signature)

    def _forge(self, now: float) -> None:
        alive = [m for m in self.inner.members() if not m.is_local and m.state is MemberState.ALIVE]
        if len(alive) < 2:
            return
        self._rounds += 1
        target, victim = self._rng.sample(alive, 2)
        subject, inc = victim.peer_id, victim.incarnation
        wrong_key = self._rng.randbytes(64)
        third_party = ("/ip4/203.0.113.7/tcp/80",)
        updates = [
            MemberUpdate(kind=UpdateKind.LEFT, peer=subject, incarnation=inc),
            MemberUpdate(kind=UpdateKind.LEFT, peer=subject, incarnation=inc, signature=wrong_key),
            MemberUpdate(kind=UpdateKind.DEAD, peer=subject, incarnation=inc, origin=target.peer_id),
            MemberUpdate(kind=UpdateKind.SUSPECT, peer=subject, incarnation=MAX_INCARNATION - 2),
            MemberUpdate(kind=UpdateKind.DEAD, peer=subject, incarnation=MAX_INCARNATION - 3, origin=subject),
            MemberUpdate(kind=UpdateKind.ALIVE, peer=subject, incarnation=inc + 1, addrs=third_party),
            MemberUpdate(kind=UpdateKind.SUSPECT, peer=target.peer_id, incarnation=MAX_INCARNATION - 2),
            MemberUpdate(kind=UpdateKind.DEAD, peer=target.peer_id, incarnation=target.incarnation),
            *(self._fake() for _ in range(self._fakes_per_round)),
        ]
        self._out.append(Outgoing(to=target.peer_id, protocol=PROTOCOL, message=Gossip(updates=tuple(updates))))
        if self._rounds % self._push_every == 0:
            fakes = tuple(self._fake() for _ in range(self._push_fakes))
            push = PushPull(seq=self._rng.getrandbits(32), join=False, members=fakes)
            self._out.append(Outgoing(to=target.peer_id, protocol=PROTOCOL, message=push))


@dataclass(slots=True)
class _Fault:
    start: float
    end: float | None = None


@dataclass(slots=True)
class SwarmPeer:
    """One simulated peer (its current incarnation of the process)."""

    index: int
    peer_id: PeerID
    addr: str
    machine: MembershipMachine
    faults: list[_Fault] = field(default_factory=list)
    hostile: ForgingMachine | None = None
    """Set for a hostile member: the wrapper that sends its forgeries (``machine`` is the real one)."""


class MembershipSwarm:
    """Many :class:`MembershipMachine` s on one :class:`SimNetwork`, with fault injection."""

    def __init__(
        self,
        *,
        config: MembershipConfig,
        seed: int,
        default_link: LinkProfile | None = None,
        count_bytes: bool = False,
        record: bool = False,
    ) -> None:
        self.config = config
        self.random = random.Random(seed)
        self.net = SimNetwork(
            seed=seed, default_link=default_link, codecs={PROTOCOL: codec} if count_bytes else None, record=record
        )
        self.peers: dict[PeerID, SwarmPeer] = {}
        self.verifier = MemoVerifier()
        """Signature checks shared by every machine of the swarm (a signature's validity does not
        depend on who checks it; hundreds of peers would otherwise spend the run in Ed25519)."""
        self._down: set[PeerID] = set()
        self._next_index = 0
        self._seed = seed

    # ------------------------------------------------------------------ building
    def spawn(
        self, *, contact: PeerID | None = None, peer_id: PeerID | None = None, hostile_interval_s: float | None = None
    ) -> SwarmPeer:
        """Start a new peer (or restart ``peer_id`` as a new process) and join it via ``contact``.

        With ``hostile_interval_s`` the peer is a :class:`ForgingMachine` that sends a round of
        forgeries that often.
        """
        if peer_id is not None and peer_id in self.peers:
            index = self.peers[peer_id].index
        else:
            index = self._next_index
            self._next_index += 1
        identity = sim_identity(index, namespace=self._seed & 0xFFFF)
        peer_id = identity.peer_id
        machine = MembershipMachine(
            identity=identity,
            addrs=(sim_addr(index),),
            config=self.config,
            rng=random.Random(self.random.getrandbits(64)),
            now=self.net.now,
            verify=self.verifier,
        )
        peer = SwarmPeer(index=index, peer_id=peer_id, addr=sim_addr(index), machine=machine)
        if hostile_interval_s is not None:
            peer.hostile = ForgingMachine(
                machine, rng=random.Random(self.random.getrandbits(64)), now=self.net.now, interval_s=hostile_interval_s
            )
        old = self.peers.get(peer_id)
        if old is not None:
            peer.faults = old.faults
        self.peers[peer_id] = peer
        self._down.discard(peer_id)
        if contact is not None:
            # Before ``add``: the network collects the machine's first output when it attaches it.
            machine.add_contact(self.net.now, contact, (self.peers[contact].addr,))
        self.net.add(peer_id, peer.hostile or machine)
        return peer

    def grow(self, count: int, *, spacing_s: float = 0.02) -> list[SwarmPeer]:
        """Add ``count`` peers, each joining through a random peer already running."""
        added = []
        for _ in range(count):
            running = self.running()
            contact = self.random.choice(running) if running else None
            added.append(self.spawn(contact=contact))
            self.net.run_for(spacing_s)
        return added

    # ------------------------------------------------------------------ faults
    def crash(self, peer: PeerID, *, closes: Iterable[PeerID] = ()) -> None:
        """kill -9: the process vanishes (its connections are refused from now on).

        ``closes``: running peers that held a connection to it. Its kernel closes those at once
        (FIN or RST), so each of them learns ``connection_lost`` -- one link latency later in the
        real world, at once here. Without them nobody is told (a host that lost power, a cable cut).
        """
        self.net.crash(peer)
        self.peers[peer].faults.append(_Fault(self.net.now))
        self._down.add(peer)
        for observer in closes:
            if observer != peer and observer not in self._down:
                self.lose_connection(observer, peer)

    def lose_connection(self, observer: PeerID, peer: PeerID) -> None:
        """``observer``'s last connection to ``peer`` closes without a goodbye (as the runtime reports
        an EOF or reset): whether ``peer``'s process died or only that connection did."""
        self.call(observer, lambda now: self.peers[observer].machine.connection_lost(now, peer))

    def stall(self, peer: PeerID) -> None:
        """SIGSTOP: the process stops running but its connections stay open."""
        self.net.stall(peer)
        self.peers[peer].faults.append(_Fault(self.net.now))
        self._down.add(peer)

    def resume(self, peer: PeerID) -> None:
        """SIGCONT after :meth:`stall`."""
        self.net.resume(peer)
        self.peers[peer].faults[-1].end = self.net.now
        self._down.discard(peer)

    def restart(self, peer: PeerID, *, contact: PeerID) -> SwarmPeer:
        """Start a crashed peer again: same PeerID and address, fresh process state."""
        fault = self.peers[peer].faults[-1]
        fault.end = self.net.now
        return self.spawn(contact=contact, peer_id=peer)

    def leave(self, peer: PeerID) -> None:
        """Graceful leave, then the process exits."""
        self.call(peer, self.peers[peer].machine.leave)
        self.net.crash(peer)
        self.peers[peer].faults.append(_Fault(self.net.now))
        self._down.add(peer)

    def call(self, peer: PeerID, action: Callable[[float], object]) -> None:
        """Run ``action(now)`` on ``peer``'s machine and send what it queued, as a driver would."""
        machine = self.peers[peer].machine
        action(self.net.now)
        for out in machine.take_outgoing():
            self.net.inject(peer, out.to, out.protocol, out.message)
        for event in machine.take_events():
            self.net.events.append((self.net.now, peer, event))

    def partition(self, groups: Iterable[Iterable[PeerID]]) -> None:
        """Split the network; messages across groups are lost silently."""
        self.net.partition(groups)

    def heal(self) -> None:
        """End the partition."""
        self.net.heal()

    # ------------------------------------------------------------------ questions
    def running(self) -> list[PeerID]:
        """Peers whose process is running and not stalled."""
        return [p for p in self.peers if p not in self._down]

    def healthy_at(self, peer: PeerID, when: float) -> bool:
        """Was ``peer`` running (not crashed, stalled, left) at ``when``?"""
        for fault in self.peers[peer].faults:
            if fault.start <= when and (fault.end is None or when < fault.end):
                return False
        return peer in self.peers

    def converged(self) -> bool:
        """Every running peer sees exactly the running peers alive and every other peer gone."""
        running = self.running()
        live = set(running)
        others = [p for p in self.peers if p not in live]
        for p in running:
            machine = self.peers[p].machine
            state_of = machine.state_of
            if any(state_of(q) is not MemberState.ALIVE for q in running):
                return False
            if any(state_of(q) not in _GONE for q in others):
                return False
        return True

    def all_see(self, subject: PeerID, states: tuple[MemberState | None, ...]) -> bool:
        """Every running peer other than ``subject`` holds ``subject`` in one of ``states``."""
        return all(self.peers[p].machine.state_of(subject) in states for p in self.running() if p != subject)

    def run_until(self, condition: Callable[[], bool], *, timeout_s: float, step_s: float = 0.05) -> float | None:
        """Run until ``condition()`` holds; the virtual seconds it took, or ``None`` on timeout."""
        start = self.net.now
        ok = self.net.run_until_true(condition, timeout_s=timeout_s, step_s=step_s)
        return self.net.now - start if ok else None

    def false_suspicions(self, since: float = 0.0) -> int:
        """PeerSuspected/PeerFailed events, raised by running peers, about peers that were healthy."""
        count = 0
        for at, observer, event in self.net.events:
            if at < since or not isinstance(event, (PeerSuspected, PeerFailed)):
                continue
            if self.healthy_at(observer, at) and self.healthy_at(event.peer, at):
                count += 1
        return count

    def detection_times(self, subject: PeerID, since: float) -> list[float]:
        """For each observer, seconds from ``since`` to its first PeerFailed about ``subject``."""
        first: dict[PeerID, float] = {}
        for at, observer, event in self.net.events:
            if at >= since and isinstance(event, PeerFailed) and event.peer == subject and observer not in first:
                first[observer] = at - since
        return sorted(first.values())
