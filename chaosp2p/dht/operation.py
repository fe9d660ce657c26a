"""What the DHT machine keeps about its work, as data: operations, requests in flight, bootstrap.

Theory of operation
-------------------
Everything the machine does on the network is an *operation*: one iterative lookup
(:class:`~chaosp2p.dht.lookup.LookupState`) towards a 256-bit target -- ``sha256(key)`` or a peer's
node id -- optionally followed by a PUT phase that sends STORE or ADD_PROVIDER to the k closest
peers the lookup found:

    LOOKUP --lookup done, nothing to put--> DONE
    LOOKUP --lookup done, put to k closest--> PUT --all acks or timeouts--> DONE

:class:`LookupKind` says what an operation is for (the driver's store, get, find-peer, add-provider
and get-providers; the machine's own bootstrap, refresh and republish lookups); it decides when the
lookup may stop early and what follows it. :class:`LookupQuery` is the request the lookup sends
each peer, and :data:`OP_MOVES` the one table of phase changes. Each request we send is a
:class:`PendingRequest` until its answer, its deadline or the driver's ``peer_unreachable``
settles it; its :class:`RequestKind` decides what the answer or failure means.

Bootstrapping repeats a BOOTSTRAP operation (a self-lookup through the bootstrap peers) with
backoff until one attempt reaches somebody: :class:`BootstrapProgress` and
:data:`BOOTSTRAP_MOVES`. Every change of phase or state goes through :func:`move` with its table;
a move the table does not list is a bug in the machine and raises ``LocalProtocolError``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from chaosp2p.dht.lookup import LookupState
from chaosp2p.dht.messages import Contact, Nodes, ProviderRecord, Providers, Record, Value
from chaosp2p.errors import LocalProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message

S = TypeVar("S", bound=enum.Enum)


def move(table: Mapping[S, frozenset[S]], state: S, to: S, what: str) -> S:
    """``to`` if ``table`` allows the move from ``state``; :class:`LocalProtocolError` otherwise."""
    if to not in table.get(state, ()):
        raise LocalProtocolError(f"{what}: {state.value} -> {to.value} is illegal")
    return to


class LookupKind(enum.Enum):
    """What an operation's lookup is for: decides when it may stop and what follows it."""

    STORE = "store"
    GET = "get"
    FIND_PEER = "find_peer"
    ADD_PROVIDER = "add_provider"
    GET_PROVIDERS = "get_providers"
    BOOTSTRAP = "bootstrap"
    REFRESH = "refresh"
    REPUBLISH = "republish"
    REPUBLISH_PROVIDER = "republish_provider"


class LookupQuery(enum.Enum):
    """The request a lookup sends to each peer it queries."""

    FIND_NODE = "find_node"
    FIND_VALUE = "find_value"
    GET_PROVIDERS = "get_providers"


ANSWER_TYPE: dict[LookupQuery, type[Message]] = {
    LookupQuery.FIND_NODE: Nodes,
    LookupQuery.FIND_VALUE: Value,
    LookupQuery.GET_PROVIDERS: Providers,
}
"""The only answer a lookup accepts to each query; any other counts as malformed."""


class OpPhase(enum.Enum):
    """Phase of an operation."""

    LOOKUP = "lookup"
    PUT = "put"
    DONE = "done"


OP_MOVES: dict[OpPhase, frozenset[OpPhase]] = {
    OpPhase.LOOKUP: frozenset({OpPhase.PUT, OpPhase.DONE}),
    OpPhase.PUT: frozenset({OpPhase.DONE}),
}
"""The operation's lifecycle (the diagram in the module docstring)."""


class RequestKind(enum.Enum):
    """Why we sent a request: decides what its answer or its failure means."""

    LOOKUP = "lookup"
    PUT = "put"
    EVICTION_CHECK = "eviction_check"
    PING = "ping"


@dataclass(slots=True, eq=False)
class Operation:
    """One operation in flight (see the module docstring)."""

    op_id: int
    kind: LookupKind
    query: LookupQuery
    started_at: float
    target: int
    lookup: LookupState
    report: bool
    """Emit a :class:`~chaosp2p.dht.events.DHTOperationDone` when it ends (False: the machine's own)."""
    key: bytes = b""
    phase: OpPhase = OpPhase.LOOKUP
    # STORE: what to put (record None until the version is decided after the lookup).
    record: Record | None = None
    value: bytes = b""
    ttl_ms: int = 0
    expires_at: float = 0.0
    provider: ProviderRecord | None = None
    found: dict[PeerID, tuple[Record, int]] = field(default_factory=dict)
    providers: dict[PeerID, tuple[ProviderRecord, int]] = field(default_factory=dict)
    found_peer: Contact | None = None
    found_depth: int = 0
    outstanding: int = 0
    accepted: int = 0
    rejected: int = 0
    put_messages: int = 0
    put_failures: int = 0
    stored_locally: bool = False

    def move(self, to: OpPhase) -> None:
        """Enter phase ``to`` (:data:`OP_MOVES`)."""
        self.phase = move(OP_MOVES, self.phase, to, f"DHT operation {self.op_id}")


@dataclass(slots=True)
class PendingRequest:
    """A request we sent that is still waiting for its answer."""

    peer: PeerID
    kind: RequestKind
    op: Operation | None
    contact: Contact
    """Where we sent it: the addresses (and relay addresses) that reached ``peer`` if it answers."""


class BootstrapState(enum.Enum):
    """Where bootstrapping stands."""

    IDLE = "idle"
    RUNNING = "running"
    BACKOFF = "backoff"
    DONE = "done"


BOOTSTRAP_MOVES: dict[BootstrapState, frozenset[BootstrapState]] = {
    BootstrapState.IDLE: frozenset({BootstrapState.RUNNING}),  # start
    BootstrapState.RUNNING: frozenset({BootstrapState.DONE, BootstrapState.BACKOFF}),  # success, failure
    BootstrapState.BACKOFF: frozenset({BootstrapState.RUNNING}),  # retry
    BootstrapState.DONE: frozenset({BootstrapState.RUNNING}),  # start again
}
"""Bootstrapping's lifecycle: attempts until one succeeds, a backoff after each failed one."""


@dataclass(slots=True, eq=False)
class BootstrapProgress:
    """The bootstrap in progress (or the last one): its peers, attempts and the attempt running."""

    state: BootstrapState = BootstrapState.IDLE
    peers: list[tuple[PeerID | None, str]] = field(default_factory=list)
    """The addresses given to ``start_bootstrap``; None: the driver must dial to learn the PeerID."""
    extra: dict[PeerID, Contact] = field(default_factory=dict)
    """Peers the driver resolved (``add_contact``) during this bootstrap; every attempt asks them."""
    op_id: int = 0
    op: Operation | None = None
    attempts: int = 0
    started_at: float = 0.0

    @property
    def active(self) -> bool:
        """True from ``start_bootstrap`` until an attempt succeeds."""
        return self.state in (BootstrapState.RUNNING, BootstrapState.BACKOFF)

    def move(self, to: BootstrapState) -> None:
        """Enter state ``to`` (:data:`BOOTSTRAP_MOVES`)."""
        self.state = move(BOOTSTRAP_MOVES, self.state, to, "bootstrap")
