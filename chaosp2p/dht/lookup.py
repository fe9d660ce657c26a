"""Iterative Kademlia lookups: the pure state, and a thin async driver with an injected rpc.

Theory of operation: a lookup keeps the candidates it has heard of, sorted by XOR distance to the
target. It keeps up to ``alpha`` requests in flight, always to the closest candidates not yet
asked. Each answer adds the contacts it names; a failure (timeout, unreachable, garbage) just marks
the candidate failed. The lookup is done when the ``k`` closest candidates that have not failed
have all answered -- nothing closer can still be learned.

As in the Kademlia paper, once a whole round (``alpha`` answers in a row) brings nothing closer than
the closest candidate already known, the lookup is in its end game: it widens its window to ``k``
and asks all of the k closest not yet asked at once, instead of trickling through them ``alpha`` at
a time (which would cost ``k / alpha`` more round trips on every store).

:class:`LookupState` makes no I/O decisions: :class:`chaosp2p.dht.DHTMachine` sends its queries as
datagrams over the simulated or real network, and :func:`lookup` below sends them through an
``async`` rpc function (DESIGN.md: "iterative lookup, network passed in as a function").

Hop accounting: seeds are at depth 0, a contact first learned from a depth-``d`` peer is at depth
``d + 1``; a lookup's hop count is ``1 + depth`` of the peer that ended it (the closest peer that
answered, or the one that returned the value), i.e. the number of sequential round trips needed.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.contacts import AddressValidator, filter_contacts
from chaosp2p.dht.keys import id_to_bytes, key_id, node_id
from chaosp2p.dht.messages import Contact, FindNode, FindValue, Nodes, Record, StoreStatus, Value
from chaosp2p.dht.records import check_record
from chaosp2p.errors import ChaosError, LocalProtocolError, RemoteProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message

if TYPE_CHECKING:
    import anyio.abc


class CandidateState(enum.Enum):
    """Where a lookup candidate stands."""

    NEW = "new"
    IN_FLIGHT = "in_flight"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


# The one transition table of a candidate; anything else is a bug in the caller.
_TRANSITIONS: dict[tuple[CandidateState, str], CandidateState] = {
    (CandidateState.NEW, "query"): CandidateState.IN_FLIGHT,
    (CandidateState.IN_FLIGHT, "answer"): CandidateState.SUCCEEDED,
    (CandidateState.IN_FLIGHT, "fail"): CandidateState.FAILED,
    (CandidateState.NEW, "fail"): CandidateState.FAILED,
}


@dataclass(slots=True)
class Candidate:
    """A peer a lookup knows about."""

    contact: Contact
    distance: int
    depth: int
    state: CandidateState = CandidateState.NEW

    def step(self, event: str) -> None:
        """Apply ``event`` via the transition table."""
        try:
            self.state = _TRANSITIONS[(self.state, event)]
        except KeyError:
            raise LocalProtocolError(f"lookup candidate: {event!r} is illegal in state {self.state.value}") from None


class LookupState:
    """The pure state of one iterative lookup towards ``target``."""

    def __init__(
        self,
        target: int,
        seeds: Iterable[Contact],
        *,
        k: int,
        alpha: int,
        own: PeerID | None = None,
        max_candidates: int | None = None,
    ) -> None:
        self.target = target
        self.k = k
        self.alpha = alpha
        self.own = own
        self.max_candidates = max_candidates or 8 * k
        self._sorted: list[Candidate] = []
        self._distances: list[int] = []
        # Keyed by raw id bytes: their hash is cached, the PeerID dataclass's is not.
        self._by_peer: dict[bytes, Candidate] = {}
        self._own_raw = own.raw if own is not None else b""
        self.in_flight = 0
        self.window = alpha
        """Requests allowed in flight: ``alpha``, widened to ``k`` once a round made no progress."""
        self._fruitless = 0
        self.messages = 0
        """Queries handed out so far."""
        self.failures = 0
        for seed in seeds:
            self.add(seed, depth=0)

    def add(self, contact: Contact, *, depth: int) -> bool:
        """Learn of ``contact``; True if it is new to this lookup."""
        peer = contact.peer_id.raw
        if peer == self._own_raw:
            return False
        known = self._by_peer.get(peer)
        if known is not None:
            if depth < known.depth and known.state is CandidateState.NEW:
                known.depth = depth
            return False
        distance = node_id(contact.peer_id) ^ self.target
        if len(self._sorted) >= self.max_candidates:
            # Full: a newcomer only gets in by displacing the farthest candidate not yet asked.
            if distance >= self._distances[-1] or self._sorted[-1].state is not CandidateState.NEW:
                return False
            dropped = self._sorted.pop()
            self._distances.pop()
            del self._by_peer[dropped.contact.peer_id.raw]
        candidate = Candidate(contact=contact, distance=distance, depth=depth)
        index = bisect.bisect_left(self._distances, distance)
        self._distances.insert(index, distance)
        self._sorted.insert(index, candidate)
        self._by_peer[peer] = candidate
        return True

    def next_queries(self) -> list[Contact]:
        """Contacts to ask now (marked in flight); empty when the window is full or nothing is left."""
        out: list[Contact] = []
        if self.in_flight >= self.window:
            return out
        considered = 0
        for candidate in self._sorted:
            if candidate.state is CandidateState.FAILED:
                continue
            considered += 1
            if candidate.state is CandidateState.NEW:
                candidate.step("query")
                self.in_flight += 1
                self.messages += 1
                out.append(candidate.contact)
                if self.in_flight >= self.window:
                    break
            if considered >= self.k:
                break
        return out

    def answered(self, peer: PeerID, closer: Sequence[Contact]) -> None:
        """``peer`` answered and named ``closer`` (already validated)."""
        candidate = self._by_peer.get(peer.raw)
        if candidate is None or candidate.state is not CandidateState.IN_FLIGHT:
            return
        candidate.step("answer")
        self.in_flight -= 1
        best_before = self._distances[0]
        for contact in closer:
            self.add(contact, depth=candidate.depth + 1)
        if self._distances[0] < best_before:
            self._fruitless = 0
        else:
            self._fruitless += 1
            if self._fruitless >= self.alpha:
                self.window = max(self.window, self.k)

    def failed(self, peer: PeerID) -> None:
        """``peer`` did not answer usefully."""
        candidate = self._by_peer.get(peer.raw)
        if candidate is None or candidate.state in (CandidateState.SUCCEEDED, CandidateState.FAILED):
            return
        if candidate.state is CandidateState.IN_FLIGHT:
            self.in_flight -= 1
        candidate.step("fail")
        self.failures += 1

    @property
    def done(self) -> bool:
        """True when the k closest live candidates have all answered (or none are left)."""
        considered = 0
        for candidate in self._sorted:
            if candidate.state is CandidateState.FAILED:
                continue
            if candidate.state is not CandidateState.SUCCEEDED:
                return False
            considered += 1
            if considered >= self.k:
                break
        return True

    def closest(self, count: int | None = None) -> list[Contact]:
        """The closest candidates that answered, closest first."""
        limit = self.k if count is None else count
        out = [c.contact for c in self._sorted if c.state is CandidateState.SUCCEEDED]
        return out[:limit]

    def depth_of(self, peer: PeerID) -> int:
        """Depth of a candidate (0 for seeds)."""
        candidate = self._by_peer.get(peer.raw)
        return candidate.depth if candidate is not None else 0

    def hops(self) -> int:
        """``1 + depth`` of the closest peer that answered; 0 if nobody did."""
        for candidate in self._sorted:
            if candidate.state is CandidateState.SUCCEEDED:
                return candidate.depth + 1
        return 0

    def state_of(self, peer: PeerID) -> CandidateState | None:
        """A candidate's state, or None if unknown."""
        candidate = self._by_peer.get(peer.raw)
        return candidate.state if candidate is not None else None


# --------------------------------------------------------------------------- async driver
Rpc = Callable[[Contact, Message], Awaitable[Message]]
"""``await rpc(peer, request) -> response``: send one DHT request to a peer, return its answer.

It should raise a :class:`chaosp2p.errors.ChaosError` (``PeerUnreachable``, ``RequestTimeout``,
``RemoteProtocolError``...) when there is no usable answer; the lookup then treats the peer as failed.
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class LookupResult:
    """Outcome of :func:`lookup`."""

    closest: tuple[Contact, ...]
    """The closest peers that answered, closest first (at most k)."""
    records: tuple[Record, ...]
    """Valid records found (value lookups only), in arrival order."""
    hops: int
    messages: int
    failures: int
    garbage_contacts: int
    """Contacts dropped because they were malformed; also counted as failures of nothing."""

    @property
    def best(self) -> Record | None:
        """The record with the highest ``(version, value)``, if any."""
        if not self.records:
            return None
        return max(self.records, key=lambda r: (r.version, r.value))


async def lookup(
    target: bytes,
    rpc: Rpc,
    *,
    seeds: Sequence[Contact],
    config: DHTConfig | None = None,
    value_key: bytes | None = None,
    own: PeerID | None = None,
    own_addrs: tuple[str, ...] = (),
) -> LookupResult:
    """Run one iterative lookup over an injected async ``rpc``.

    ``target`` is a 32-byte id (use :func:`chaosp2p.dht.keys.key_id` / ``node_id``). With
    ``value_key`` set the lookup sends FIND_VALUE for that key (its target must be
    ``sha256(value_key)``) and stops once ``config.get_quorum`` valid records arrived; otherwise it
    sends FIND_NODE. Runs on any anyio backend (trio or asyncio).
    """
    import anyio  # local import: the sans-I/O machine never needs an event loop

    cfg = config or DHTConfig()
    target_id = int.from_bytes(target, "big")
    if value_key is not None and key_id(value_key) != target_id:
        raise LocalProtocolError("value_key does not hash to target")
    state = LookupState(target_id, seeds, k=cfg.k, alpha=cfg.alpha, own=own)
    validator = AddressValidator(max_addrs=cfg.max_addrs_per_peer)
    records: list[Record] = []
    garbage = 0
    value_hops: int | None = None
    request_ids = itertools.count(1)
    send, receive = anyio.create_memory_object_stream[tuple[Contact, Message | None]](cfg.alpha * 2 + 8)

    def build(request_id: int) -> Message:
        if value_key is not None:
            return FindValue(request_id=request_id, sender_addrs=own_addrs, key=value_key)
        return FindNode(request_id=request_id, sender_addrs=own_addrs, target=id_to_bytes(target_id))

    async def query(contact: Contact, stream: anyio.abc.ObjectSendStream[tuple[Contact, Message | None]]) -> None:
        async with stream:  # closed even when the lookup cancels this task
            response: Message | None
            try:
                with anyio.fail_after(cfg.request_timeout_s):
                    response = await rpc(contact, build(next(request_ids)))
            except (ChaosError, TimeoutError):
                response = None
            await stream.send((contact, response))

    async with anyio.create_task_group() as group, send, receive:
        while True:
            for contact in state.next_queries():
                group.start_soon(query, contact, send.clone())
            if state.done or (value_key is not None and len(records) >= cfg.get_quorum):
                group.cancel_scope.cancel()
                break
            if state.in_flight == 0:
                break
            contact, response = await receive.receive()
            peer = contact.peer_id
            closer = _closer_of(response, value_lookup=value_key is not None, max_contacts=cfg.max_peers_per_response)
            if closer is None:
                state.failed(peer)
                continue
            if isinstance(response, Value) and response.record is not None:
                record = response.record
                if record.key != value_key or check_record(
                    record, max_key_bytes=cfg.max_key_bytes, max_value_bytes=cfg.max_value_bytes
                ) is not StoreStatus.OK:
                    state.failed(peer)
                    continue
                records.append(record)
                if value_hops is None:
                    value_hops = state.depth_of(peer) + 1
            good, bad, _ = filter_contacts(closer, validator=validator, own=own)
            garbage += bad
            state.answered(peer, good)
    return LookupResult(
        closest=tuple(state.closest()),
        records=tuple(records),
        hops=state.hops() if value_hops is None else value_hops,
        messages=state.messages,
        failures=state.failures,
        garbage_contacts=garbage,
    )


def _closer_of(response: Message | None, *, value_lookup: bool, max_contacts: int) -> tuple[Contact, ...] | None:
    """The contacts of a well-formed answer of the expected kind, or None (a failure)."""
    if not isinstance(response, (Nodes, Value)) or type(response) is not (Value if value_lookup else Nodes):
        return None
    closer = response.closer
    try:
        response.validate()
    except RemoteProtocolError:
        return None
    if len(closer) > max_contacts:
        return None
    return closer
