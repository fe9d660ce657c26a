"""The coordination of one hole punch (no I/O): who says what when, and who dials the handshake.

Theory of operation
-------------------
Two peers A and B with a relayed connection (``protocols/relay.md``) want a direct one; each is
perhaps behind a NAT that drops unsolicited inbound packets. A TCP connection gets through two such
NATs when both ends send their SYN to the other's public address at about the same time, each from
the port the other expects (its listen port): each SYN opens its own NAT for the other's, and the
kernel joins the two into one connection (TCP simultaneous open), or a listener accepts the SYN
that arrives first. Over a stream on the relayed connection (``/chaos/holepunch/1``):

1. the initiator sends CONNECT (its candidate addresses) and notes the time;
2. the responder answers CONNECT (its own), or RESULT(REFUSED);
3. the initiator measures the round trip, sends SYNC and connects half a round trip later; the
   responder connects when SYNC arrives, so both SYNs leave at about the same moment;
4. each sends RESULT with its :class:`~.messages.Outcome` and receives the other's;
5. both derive the same :class:`Role` from the two outcomes (:func:`decide`): after a simultaneous
   open both hold the same connection and the peer with the smaller PeerID runs the handshake as
   the dialer; when one side's SYN reached the other's *listener*, the other's connect finds the
   connection taken (``TAKEN``), its host is already answering the handshake as for any inbound
   connection, and the side whose socket connected dials.

States as data: :data:`TRANSITIONS` is the single table of legal moves per role; an illegal event
raises :class:`LocalProtocolError`. A wait that passes its deadline ends the punch as FAILED. The
machine reads no clock: times are passed in.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from chaosp2p.errors import LocalProtocolError, RemoteProtocolError
from chaosp2p.protocols.holepunch.config import HolePunchConfig
from chaosp2p.protocols.holepunch.messages import Connect, Outcome, Refusal, Result, Sync, refusal
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.messages import Message


class PunchState(enum.Enum):
    """Where a punch is."""

    IDLE = "idle"
    AWAIT_CONNECT = "await-connect"
    AWAIT_SYNC = "await-sync"
    WAIT_TO_DIAL = "wait-to-dial"
    DIALING = "dialing"
    AWAIT_RESULT = "await-result"
    DONE = "done"
    FAILED = "failed"


class PunchEvent(enum.Enum):
    """What moves a punch on."""

    START = "start"
    CONNECT = "connect"
    REFUSED = "refused"
    SYNC = "sync"
    DIAL_DUE = "dial-due"
    DIALED = "dialed"
    RESULT = "result"
    TIMEOUT = "timeout"


class Role(enum.Enum):
    """What this side does with the outcome."""

    INITIATE = "initiate"
    """Run the connection handshake as the dialer over our socket."""
    RESPOND = "respond"
    """Run it as the answerer over our socket."""
    AWAIT_INBOUND = "await-inbound"
    """Our listener accepted the connection: our host answers its handshake; wait for it."""
    FAIL = "fail"
    """No direct connection: keep the relayed one."""


S, E = PunchState, PunchEvent
_WAITS = (S.AWAIT_CONNECT, S.AWAIT_SYNC, S.WAIT_TO_DIAL, S.DIALING, S.AWAIT_RESULT)
TRANSITIONS: dict[tuple[bool, PunchState, PunchEvent], PunchState] = {
    # (initiator?, state, event) -> next state
    (True, S.IDLE, E.START): S.AWAIT_CONNECT,
    (True, S.AWAIT_CONNECT, E.CONNECT): S.WAIT_TO_DIAL,
    (True, S.AWAIT_CONNECT, E.REFUSED): S.FAILED,
    (False, S.AWAIT_CONNECT, E.CONNECT): S.AWAIT_SYNC,
    (False, S.AWAIT_SYNC, E.SYNC): S.WAIT_TO_DIAL,
    **{(i, S.WAIT_TO_DIAL, E.DIAL_DUE): S.DIALING for i in (True, False)},
    **{(i, S.DIALING, E.DIALED): S.AWAIT_RESULT for i in (True, False)},
    # The other side may finish its attempt first: its RESULT is kept until ours is known.
    **{(i, s, E.RESULT): s for i in (True, False) for s in (S.WAIT_TO_DIAL, S.DIALING)},
    **{(i, S.AWAIT_RESULT, E.RESULT): S.DONE for i in (True, False)},
    **{(i, s, E.TIMEOUT): S.FAILED for i in (True, False) for s in _WAITS},
}


_REFUSALS = {
    Refusal.UNSPECIFIED: "the peer refused to punch now",
    Refusal.PORTS_CHANGED: "the peer's NAT changes source ports (symmetric): a punch cannot work",
}


def decide(local: Outcome, remote: Outcome, local_peer: PeerID, remote_peer: PeerID) -> Role:
    """The role of the side whose attempt ended ``local`` when the other's ended ``remote``.

    Symmetric: the two sides, each passing its own view, get complementary roles.
    """
    if local is Outcome.CONNECTED and remote is Outcome.CONNECTED:  # a simultaneous open
        return Role.INITIATE if local_peer.raw < remote_peer.raw else Role.RESPOND
    if local is Outcome.CONNECTED and remote is Outcome.TAKEN:
        return Role.INITIATE  # our SYN reached their listener: their host answers
    if local is Outcome.TAKEN and remote is Outcome.CONNECTED:
        return Role.AWAIT_INBOUND
    return Role.FAIL


class PunchMachine:
    """One side of one punch (see the module docstring)."""

    def __init__(
        self,
        *,
        initiator: bool,
        local_peer: PeerID,
        remote_peer: PeerID,
        local_addrs: Sequence[str],
        config: HolePunchConfig,
        now: float,
    ) -> None:
        self.initiator = initiator
        self.local_peer = local_peer
        self.remote_peer = remote_peer
        self.local_addrs = tuple(local_addrs)
        self.config = config
        self.state = PunchState.IDLE if initiator else PunchState.AWAIT_CONNECT
        self._entered = now
        self._sent_connect_at: float | None = None
        self.rtt_s: float | None = None
        """The initiator's CONNECT round trip over the relayed connection."""
        self.remote_addrs: tuple[str, ...] = ()
        """The other side's candidate addresses."""
        self.dial_at: float | None = None
        """When to connect (set on entering WAIT_TO_DIAL)."""
        self.local_outcome: Outcome | None = None
        self.remote_outcome: Outcome | None = None
        self.failure = ""
        """Why the punch failed, for the log line."""
        self.refusal: Refusal | None = None
        """Why the responder refused (initiator; None unless it did)."""

    def _move(self, event: PunchEvent, now: float) -> None:
        target = TRANSITIONS.get((self.initiator, self.state, event))
        if target is None:
            role = "initiator" if self.initiator else "responder"
            raise LocalProtocolError(f"holepunch {role}: {event.value} is illegal in state {self.state.value}")
        if target is not self.state:
            self._entered = now
        self.state = target

    def start(self, now: float) -> Connect:
        """Initiator: the CONNECT to send first."""
        self._move(PunchEvent.START, now)
        self._sent_connect_at = now
        return Connect(addrs=self.local_addrs)

    def receive(self, message: Message, now: float) -> list[Message]:
        """A message from the other side; the messages to send in return."""
        if isinstance(message, Connect):
            self._move(PunchEvent.CONNECT, now)
            self.remote_addrs = message.addrs
            if not self.initiator:
                return [Connect(addrs=self.local_addrs)]
            assert self._sent_connect_at is not None  # START came first (the table says so)
            self.rtt_s = now - self._sent_connect_at
            self.dial_at = now + self.rtt_s / 2  # the SYNC reaches the responder about then
            return [Sync()]
        if isinstance(message, Sync):
            self._move(PunchEvent.SYNC, now)
            self.dial_at = now
            return []
        if isinstance(message, Result):
            outcome = Outcome(message.outcome)
            if outcome is Outcome.REFUSED:
                if self.state is not PunchState.AWAIT_CONNECT or not self.initiator:
                    raise RemoteProtocolError("holepunch: REFUSED is only an answer to CONNECT")
                self._move(PunchEvent.REFUSED, now)
                self.refusal = refusal(message.reason)
                self.failure = _REFUSALS[self.refusal]
                return []
            self._move(PunchEvent.RESULT, now)
            self.remote_outcome = outcome
            return []
        raise RemoteProtocolError(f"holepunch: unexpected {type(message).__name__}")

    def dial_due(self, now: float) -> bool:
        """Whether to connect now (then the machine is DIALING until :meth:`dialed`)."""
        if self.state is PunchState.WAIT_TO_DIAL and self.dial_at is not None and now >= self.dial_at:
            self._move(PunchEvent.DIAL_DUE, now)
            return True
        return False

    def dialed(self, outcome: Outcome, now: float) -> Result:
        """Our attempt ended ``outcome``: the RESULT to send."""
        if outcome is Outcome.REFUSED:
            raise LocalProtocolError("REFUSED is not an outcome of an attempt")
        self._move(PunchEvent.DIALED, now)
        self.local_outcome = outcome
        if self.remote_outcome is not None:  # theirs came first
            self._move(PunchEvent.RESULT, now)
        return Result(outcome=int(outcome))

    def next_deadline(self) -> float | None:
        """When the current wait ends (the dial time while waiting to dial); None when finished."""
        if self.state is PunchState.WAIT_TO_DIAL:
            return self.dial_at
        if self.state is PunchState.DIALING:
            return self._entered + self.config.connect_timeout_s + self.config.answer_timeout_s
        if self.state in (PunchState.AWAIT_CONNECT, PunchState.AWAIT_SYNC, PunchState.AWAIT_RESULT):
            return self._entered + self.config.answer_timeout_s
        return None

    def handle_timeout(self, now: float) -> None:
        """Fail a wait whose deadline passed (waiting to dial is :meth:`dial_due`'s business)."""
        deadline = self.next_deadline()
        if self.state is PunchState.WAIT_TO_DIAL or deadline is None or now < deadline:
            return
        self.failure = f"no answer in {self.state.value}"
        self._move(PunchEvent.TIMEOUT, now)

    @property
    def role(self) -> Role | None:
        """The agreed role once DONE (FAIL once FAILED; None before)."""
        if self.state is PunchState.FAILED:
            return Role.FAIL
        if self.state is not PunchState.DONE:
            return None
        assert self.local_outcome is not None and self.remote_outcome is not None
        return decide(self.local_outcome, self.remote_outcome, self.local_peer, self.remote_peer)
