"""Signed self-claims: what a member says about itself, and checking it once (part of the machine).

Theory of operation
-------------------
Gossip relays what members say, and a relay can lie. So every claim a member makes about *its own*
state -- ALIVE at an incarnation with its listen addresses, LEFT at an incarnation, and its info
record (resources and link summaries) at a version -- carries the member's Ed25519 signature, and
its PeerID is its public key: any peer checks the claim without asking anyone. The signed bytes are
a msgpack array that starts with a domain string (``chaos/membership/alive/1``, ``.../left/1``,
``.../info/1``), so a signature made for one purpose is never valid for another (nor for the
handshake, the DHT or negotiation, which use their own domains). A member signs each of its
records once, when its incarnation or info version changes, never per message.

A receiver verifies a claim only when it is news -- a higher incarnation or version than the one
it holds; the record it holds *is* the positive cache, so each (member, incarnation) costs one
check. Two bounded caches cover the rest: records that verified but were not kept (a full table)
and records that failed (a forger repeating itself costs one check, then a dictionary lookup).
Checks that do cost CPU are paid from a per-sender budget (``core.py``), so no sender can make
this peer verify more than its share.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from chaosp2p.protocols.membership.messages import InfoUpdate, MemberUpdate, UpdateKind
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import PeerID

SIGNATURE_BYTES = 64
"""An Ed25519 signature."""

ALIVE_DOMAIN = "chaos/membership/alive/1"
LEFT_DOMAIN = "chaos/membership/left/1"
INFO_DOMAIN = "chaos/membership/info/1"
RELAY_DOMAIN = "chaos/membership/relay/1"

Verifier = Callable[[PeerID, bytes, bytes], bool]
"""``verify(peer, signature, data)``: is ``signature`` ``peer``'s over ``data``? (``PeerID.verify``)."""


def alive_payload(peer: PeerID, incarnation: int, addrs: tuple[str, ...]) -> bytes:
    """The bytes a member signs to say it is alive at ``incarnation``, listening on ``addrs``."""
    return pack([ALIVE_DOMAIN, peer.raw, incarnation, list(addrs)])


def left_payload(peer: PeerID, incarnation: int) -> bytes:
    """The bytes a member signs to say it left at ``incarnation``."""
    return pack([LEFT_DOMAIN, peer.raw, incarnation])


def relay_payload(peer: PeerID, version: int, relay_addrs: tuple[str, ...]) -> bytes:
    """The bytes a member signs to say it is reached at ``relay_addrs`` (in its info record ``version``)."""
    return pack([RELAY_DOMAIN, peer.raw, version, list(relay_addrs)])


def info_payload(info: InfoUpdate) -> bytes:
    """The bytes a member signs for its info record (every field but the signature, in wire order)."""
    r = info.resources
    links = [[s.peer.raw, s.rtt_s, s.bandwidth_bytes_per_s, s.up] for s in info.links]
    resources = [r.cpu_cores, r.memory_bytes, r.gpus, r.gpu_memory_bytes, float(r.train_samples_per_s)]
    return pack([INFO_DOMAIN, info.peer.raw, info.version, resources, links])


def update_payload(update: MemberUpdate) -> bytes | None:
    """What ``update``'s signature covers, or ``None`` for kinds that are not self-claims."""
    if update.kind is UpdateKind.ALIVE:
        return alive_payload(update.peer, update.incarnation, update.addrs)
    if update.kind is UpdateKind.LEFT:
        return left_payload(update.peer, update.incarnation)
    return None


def verify_signature(peer: PeerID, signature: bytes, data: bytes) -> bool:
    """The default :data:`Verifier`: an Ed25519 check against the key inside ``peer``."""
    return len(signature) == SIGNATURE_BYTES and peer.verify(signature, data)


class SignatureCache:
    """Outcomes of signature checks already made, bounded (the oldest entries go first).

    Keys name the claim and carry its signature (``(peer, kind, incarnation, signature)``), so a
    hit means "these exact bytes were checked": a different signature is a different key.
    """

    __slots__ = ("_bad", "_good", "_max")

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._good: dict[Hashable, None] = {}
        self._bad: dict[Hashable, None] = {}

    def lookup(self, key: Hashable) -> bool | None:
        """True (verified before), False (failed before) or None (never checked)."""
        if key in self._bad:
            return False
        if key in self._good:
            return True
        return None

    def remember(self, key: Hashable, ok: bool) -> None:
        """Record the outcome of one check."""
        table = self._good if ok else self._bad
        table[key] = None
        if len(table) > self._max:
            del table[next(iter(table))]

    def __len__(self) -> int:
        return len(self._good) + len(self._bad)


class MemoVerifier:
    """A :data:`Verifier` that remembers outcomes, shared by the many machines of one simulation.

    A signature's validity does not depend on who checks it, so machines in one process may share
    the work; simulations of hundreds of peers would otherwise spend their time in Ed25519. Real
    peers use :func:`verify_signature` and their own per-machine caches. Bounded: cleared when full.
    """

    __slots__ = ("_max", "_seen", "checks")

    def __init__(self, max_entries: int = 1 << 18) -> None:
        self._max = max_entries
        self._seen: dict[tuple[bytes, bytes, bytes], bool] = {}
        self.checks = 0
        """Ed25519 checks actually made (cache misses)."""

    def __call__(self, peer: PeerID, signature: bytes, data: bytes) -> bool:
        key = (peer.raw, signature, data)
        ok = self._seen.get(key)
        if ok is None:
            if len(self._seen) >= self._max:
                self._seen.clear()
            self.checks += 1
            ok = self._seen[key] = verify_signature(peer, signature, data)
        return ok
