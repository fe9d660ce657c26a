"""A swarm of DHT machines on :class:`chaosp2p.sim.SimNetwork`, for simulation tests and benchmarks.

Everything is derived from one seed (identities, per-peer randomness, link jitter), so a run
replays exactly. The cluster plays the runtime's part: it calls ``start_*`` on a machine, lets the
network carry the messages, and collects :class:`DHTOperationDone` events by ``(peer, op_id)``.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.events import DHTOperationDone, GetResult, OperationResult, StoreResult
from chaosp2p.dht.keys import signed_key
from chaosp2p.dht.machine import DHTMachine
from chaosp2p.dht.messages import DHT_CODEC, PROTOCOL
from chaosp2p.sim.network import LinkProfile, SimNetwork
from chaosp2p.wire.identity import Identity, PeerID


class DHTSimCluster:
    """Build, bootstrap, churn and query a simulated DHT swarm."""

    def __init__(
        self,
        *,
        seed: int,
        config: DHTConfig | None = None,
        link: LinkProfile | None = None,
        count_bytes: bool = False,
    ) -> None:
        self.seed = seed
        self.config = config or DHTConfig.local()
        self.sim = SimNetwork(
            seed=seed,
            default_link=link,
            codecs={PROTOCOL: DHT_CODEC} if count_bytes else None,
        )
        self.rng = random.Random(seed * 7919 + 17)
        self.machines: dict[PeerID, DHTMachine] = {}
        self.crashed: set[PeerID] = set()
        self._alive: dict[PeerID, None] = {}  # insertion-ordered set
        self._created = 0
        self._results: dict[tuple[PeerID, int], OperationResult] = {}
        self._events_seen = 0

    # ------------------------------------------------------------------ peers
    def new_peer(self) -> DHTMachine:
        """Create a peer (deterministic identity and address) and attach it to the network."""
        index = self._created
        self._created += 1
        seed_bytes = hashlib.sha256(f"chaosp2p-dht-sim/{self.seed}/{index}".encode()).digest()
        identity = Identity.from_seed(seed_bytes)
        addr = f"/ip4/10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}/tcp/4001"
        machine = DHTMachine(
            identity,
            rng=random.Random(int.from_bytes(seed_bytes[:8], "big")),
            config=self.config,
            listen_addrs=(addr,),
            now=self.sim.now,
        )
        self.machines[identity.peer_id] = machine
        self._alive[identity.peer_id] = None
        self.sim.add(identity.peer_id, machine)
        return machine

    def alive(self) -> list[PeerID]:
        """Peers currently on the network, in creation order."""
        return list(self._alive)

    def crash(self, peer: PeerID) -> None:
        """Kill ``peer`` abruptly."""
        self.sim.crash(peer)
        self.crashed.add(peer)
        self._alive.pop(peer, None)

    def join(self, *, via: Iterable[PeerID] | None = None) -> tuple[DHTMachine, int]:
        """Add a peer and start its bootstrap through ``via`` (default: 3 random live peers)."""
        candidates = self.alive()
        machine = self.new_peer()
        seeds = list(via) if via is not None else self.rng.sample(candidates, min(3, len(candidates)))
        peers = [(p, self.machines[p].listen_addrs[0]) for p in seeds]
        op = self.call(machine.peer_id, lambda now: machine.start_bootstrap(now, peers))
        return machine, op

    def build(self, count: int, *, join_gap_s: float = 0.01, settle_s: float = 5.0, refresh: bool = True) -> None:
        """Grow the swarm to ``count`` peers, one join every ``join_gap_s``, then let it settle.

        With ``refresh`` every peer refreshes its buckets once after the joins (what the periodic
        refresh would do a little later), so lookups see a mature table from the start.
        """
        if not self.machines:
            self.new_peer()
        while len(self._alive) < count:
            self.join()
            self.sim.run_for(join_gap_s)
        self.sim.run_for(settle_s)
        if refresh:
            for peer in self.alive():
                machine = self.machines[peer]
                self.call(peer, machine.refresh)
            self.sim.run_for(settle_s)

    # ------------------------------------------------------------------ operations
    def call(self, peer: PeerID, action: Callable[[float], int | None]) -> int:
        """Run ``action(now)`` on ``peer``'s machine and hand its output to the network."""
        result = action(self.sim.now)
        # SimNetwork has no public "the driver called the machine" hook yet; _after_call is exactly
        # what the runtime driver's flush() does (drain outgoing/events, re-arm the timer).
        self.sim._after_call(peer)
        return result if result is not None else 0

    def result(self, peer: PeerID, op_id: int) -> OperationResult | None:
        """The result of ``op_id`` on ``peer`` if it finished."""
        self._collect()
        return self._results.get((peer, op_id))

    def wait(self, peer: PeerID, op_id: int, *, timeout_s: float = 60.0) -> OperationResult | None:
        """Run the network until ``op_id`` on ``peer`` finished (or ``timeout_s`` of virtual time)."""
        key = (peer, op_id)
        self.sim.run_until_true(lambda: self._collect() or key in self._results, timeout_s=timeout_s, step_s=0.005)
        return self._results.get(key)

    def wait_all(self, ops: list[tuple[PeerID, int]], *, timeout_s: float = 60.0) -> list[OperationResult | None]:
        """Run until every ``(peer, op_id)`` finished, or the timeout; results in the same order."""
        pending = set(ops)

        def done() -> bool:
            self._collect()
            pending.difference_update([k for k in list(pending) if k in self._results])
            return not pending

        self.sim.run_until_true(done, timeout_s=timeout_s, step_s=0.005)
        return [self._results.get(k) for k in ops]

    def _collect(self) -> bool:
        events = self.sim.events
        for index in range(self._events_seen, len(events)):
            _, peer, event = events[index]
            if isinstance(event, DHTOperationDone):
                self._results[(peer, event.op_id)] = event.result
        self._events_seen = len(events)
        # Keep the simulator's event log from growing without bound in long runs.
        if self._events_seen > 100_000:
            del events[: self._events_seen]
            self._events_seen = 0
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class ChurnReport:
    """Outcome of :func:`run_churn_scenario`."""

    peers: int
    crashed: int
    joined: int
    gets: int
    successes: int
    wrong_values: int
    """Gets that returned a value other than the one stored (must be 0: a miss is allowed, a lie is not)."""
    incomplete: int
    """Gets that did not finish within the wait (must be 0)."""
    mean_hops: float
    messages: int
    virtual_s: float

    @property
    def success_rate(self) -> float:
        """Fraction of gets that returned the stored value."""
        return self.successes / self.gets if self.gets else 0.0


def _store(machine: DHTMachine, key: bytes, value: bytes, now: float) -> int:
    return machine.start_store(now, key, value)


def store_random_keys(cluster: DHTSimCluster, count: int, rng: random.Random) -> dict[bytes, bytes]:
    """Store ``count`` keys from random peers -- odd ones signed by their writer, even ones unsigned.

    Returns key -> value. Stores run concurrently; raises ``AssertionError`` if one fails.
    """
    ops: list[tuple[PeerID, int]] = []
    expected: dict[bytes, bytes] = {}
    peers = cluster.alive()
    for i in range(count):
        writer = rng.choice(peers)
        machine = cluster.machines[writer]
        key = signed_key(writer, f"k{i}") if i % 2 else b"plain/%d" % i
        value = b"value-%d-" % i + rng.randbytes(32)
        expected[key] = value
        ops.append((writer, cluster.call(writer, functools.partial(_store, machine, key, value))))
    for result in cluster.wait_all(ops):
        if not isinstance(result, StoreResult) or not result.ok:
            raise AssertionError(f"store failed: {result}")
    return expected


def run_churn_scenario(
    *,
    seed: int,
    size: int,
    churn_fraction: float,
    stored: int,
    duration_s: float,
    config: DHTConfig | None = None,
    gets_per_step: int = 4,
) -> ChurnReport:
    """Build ``size`` peers, store ``stored`` keys, then replace ``churn_fraction`` of the peers.

    During the churn, one random peer crashes and one newcomer joins per step (spread evenly over
    ``duration_s`` of virtual time), with ``gets_per_step`` gets of random keys from random live
    peers in between; afterwards every key is read once more from a random survivor.
    """
    rng = random.Random(seed)
    cluster = DHTSimCluster(seed=seed, config=config)
    cluster.build(size, refresh=False)
    started = cluster.sim.now
    expected = store_random_keys(cluster, stored, rng)
    keys = sorted(expected)
    churn_events = max(1, round(size * churn_fraction))
    step_s = duration_s / churn_events
    gets: list[tuple[PeerID, int, bytes]] = []

    def start_get(key: bytes) -> None:
        reader = rng.choice(cluster.alive())
        machine = cluster.machines[reader]
        gets.append((reader, cluster.call(reader, lambda now: machine.start_get(now, key)), key))

    for _ in range(churn_events):
        cluster.crash(rng.choice(cluster.alive()))
        cluster.join()
        for _ in range(gets_per_step):
            start_get(rng.choice(keys))
            cluster.sim.run_for(step_s / gets_per_step)
    for key in keys:
        start_get(key)
    results = cluster.wait_all([(peer, op) for peer, op, _ in gets], timeout_s=60.0)
    successes = wrong = incomplete = 0
    hops: list[int] = []
    for (_, _, key), result in zip(gets, results, strict=True):
        if not isinstance(result, GetResult):
            incomplete += 1
        elif result.value == expected[key]:
            successes += 1
            hops.append(result.stats.hops)
        elif result.value is not None:
            wrong += 1
    return ChurnReport(
        peers=len(cluster.alive()),
        crashed=len(cluster.crashed),
        joined=churn_events,
        gets=len(gets),
        successes=successes,
        wrong_values=wrong,
        incomplete=incomplete,
        mean_hops=sum(hops) / len(hops) if hops else 0.0,
        messages=cluster.sim.stats.sent,
        virtual_s=cluster.sim.now - started,
    )
