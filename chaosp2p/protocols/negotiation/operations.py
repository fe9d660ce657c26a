"""Operations: the signed events (join, leave, fail, link up/down, throughput) members agree on.

An :class:`Operation` is raised by one peer (its *origin*), signed by it with Ed25519 over a canonical
msgpack encoding, and identified by the SHA-256 of that encoding (its *op id*; Ed25519 signatures are
deterministic, so one content has one valid signature and one id). Which peer may raise which
operation is a pure rule over the configuration it applies to (``configuration_change.check_operation``):
join, leave and throughput are signed by their subject, a failure by another member, a link change
by one of its two endpoints, an eviction by another member -- and an eviction takes effect only
when a quorum of distinct members signed one for the same subject and incarnation.

A batch of operations committed together is applied in one deterministic order everywhere
(:func:`apply_order`): conflicting operations on one subject are first resolved by incarnation
precedence -- the highest incarnation wins, and at equal incarnation a removal (LEAVE/FAIL) beats a
JOIN or THROUGHPUT -- and the survivors are sorted by (kind order FAIL, EVICT, LEAVE, LINK_DOWN,
LINK_UP, JOIN, THROUGHPUT; subject; op id). Evictions are settled before that, by
``configuration_change.next_configuration`` (it needs the configuration to count signers).

Verifying a signature costs ~60-100 us, so :class:`SignatureCache` remembers verified operations by
signature and keeps each origin's decoded public key.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.negotiation.config import MAX_STEP
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID

PROTOCOL = "negotiation"
"""The protocol name machines register under (``/chaos/negotiation/1`` on a stream)."""

# Hard caps, whatever the configuration, so that a decoded message is never absurd.
WIRE_MAX_RUN_CHARS = 256
WIRE_MAX_MEMBERS = 1 << 16
WIRE_MAX_LINKS = 1 << 20
WIRE_MAX_OPS = 1 << 12
WIRE_MAX_HISTORY = 1 << 12
WIRE_MAX_RATE = 1e12
"""Samples per second, bytes per second."""
WIRE_MAX_RTT_S = 3600.0
WIRE_MAX_REASON_CHARS = 128
SIGNATURE_BYTES = 64
OP_ID_BYTES = 32
DIGEST_BYTES = 32

_OP_DOMAIN = "chaosp2p/negotiation/op/1"


class OpKind(enum.IntEnum):
    """What an operation does. ONLY APPEND TO THIS LIST: never renumber or reuse."""

    JOIN = 0
    LEAVE = 1
    FAIL = 2
    LINK_UP = 3
    LINK_DOWN = 4
    THROUGHPUT = 5
    EVICT = 6
    """A member that kept sending invalid contributions: takes effect only when a quorum of distinct
    members of the configuration signed one for the same subject and incarnation (see
    ``configuration_change.evictions``)."""
    STALL = 7
    """A member that contributed nothing to the signer's round for the round's whole (bounded) wait:
    counted with the subject's FAILs, it removes the subject only with FAIL_SIGNERS distinct
    signers, and -- unlike a FAIL -- it does not lapse when the subject is heard from (an idle
    member is alive). The subject rejoins as a newcomer when it steps again."""


MEMBER_KINDS = frozenset((OpKind.JOIN, OpKind.LEAVE, OpKind.FAIL, OpKind.THROUGHPUT, OpKind.EVICT, OpKind.STALL))
"""Kinds whose subject is one member (link kinds name two endpoints)."""
REMOVAL_KINDS = frozenset((OpKind.LEAVE, OpKind.FAIL, OpKind.STALL))
FAIL_KINDS = frozenset((OpKind.FAIL, OpKind.STALL))
"""Kinds that say "this member does not take part": one per signer and subject is kept, and they
remove their subject only with FAIL_SIGNERS distinct signers (of either kind) between them."""
LINK_KINDS = frozenset((OpKind.LINK_UP, OpKind.LINK_DOWN))

KIND_ORDER: dict[OpKind, int] = {
    OpKind.FAIL: 0,
    OpKind.STALL: 1,
    OpKind.EVICT: 2,
    OpKind.LEAVE: 3,
    OpKind.LINK_DOWN: 4,
    OpKind.LINK_UP: 5,
    OpKind.JOIN: 6,
    OpKind.THROUGHPUT: 7,
}
"""Position of each kind in the deterministic apply order."""


def reject(message: str) -> RemoteProtocolError:
    """The error for a malformed negotiation message or record."""
    return RemoteProtocolError(f"{PROTOCOL}: {message}")


def check_count(value: int, cap: int, what: str) -> None:
    """Raise unless ``value`` <= ``cap``."""
    if value > cap:
        raise reject(f"{what}: {value} exceeds {cap}")


def check_number(value: float, cap: float, what: str) -> None:
    """Raise unless ``value`` is finite and within [0, cap]."""
    if not (math.isfinite(value) and 0.0 <= value <= cap):
        raise reject(f"{what} out of range: {value!r}")


def check_uint(value: int, what: str) -> None:
    """Raise unless 0 <= ``value`` <= MAX_STEP."""
    if not 0 <= value <= MAX_STEP:
        raise reject(f"{what} out of range: {value}")


def check_run(run: str) -> None:
    """Raise unless ``run`` is a non-empty id of bounded length."""
    if not 0 < len(run) <= WIRE_MAX_RUN_CHARS:
        raise reject(f"run id length {len(run)} outside 1..{WIRE_MAX_RUN_CHARS}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Operation:
    """One signed event about a run's configuration (a wire record; see ``protocols/negotiation.md``)."""

    kind: OpKind
    run: str
    epoch: int
    """The epoch of the configuration the origin held when it raised the operation."""
    subject: PeerID
    """The member concerned; for link kinds the endpoint with the smaller PeerID (``a``)."""
    incarnation: int
    """The subject's incarnation (link kinds: the origin's incarnation in the configuration)."""
    origin: PeerID
    """Who raised and signed it."""
    detected_at: float
    """The origin's clock when the event was detected (observability only)."""
    signature: bytes
    other: PeerID | None = None
    """Link kinds: the endpoint with the larger PeerID (``b``); None otherwise."""
    throughput_samples_per_s: float = 0.0
    """JOIN, THROUGHPUT: the subject's training rate (> 0)."""
    bandwidth_bytes_per_s: float = 0.0
    """LINK_UP: measured bandwidth (0 = unknown)."""
    rtt_s: float = 0.0
    """LINK_UP: measured round-trip time (0 = unknown)."""
    observed_incarnation: int = 0
    """FAIL: the membership incarnation at which the origin saw the subject fail (a member that
    knows the subject alive at a higher one refuses to propose it)."""

    def validate(self) -> None:
        """Hard limits and shape; who may raise it is checked against the configuration."""
        check_run(self.run)
        check_uint(self.epoch, "op epoch")
        check_uint(self.incarnation, "op incarnation")
        check_uint(self.observed_incarnation, "op observed incarnation")
        if len(self.signature) != SIGNATURE_BYTES:
            raise reject("op signature must be 64 bytes")
        if not math.isfinite(self.detected_at):
            raise reject("op detected_at must be finite")
        check_number(self.throughput_samples_per_s, WIRE_MAX_RATE, "throughput")
        check_number(self.bandwidth_bytes_per_s, WIRE_MAX_RATE, "bandwidth")
        check_number(self.rtt_s, WIRE_MAX_RTT_S, "rtt")
        if self.kind in LINK_KINDS:
            if self.other is None or not self.subject.raw < self.other.raw:
                raise reject("a link op names two endpoints with subject < other")
        elif self.other is not None:
            raise reject("only link ops name another peer")
        if self.kind in (OpKind.JOIN, OpKind.THROUGHPUT) and not self.throughput_samples_per_s > 0.0:
            raise reject("join/throughput ops need a positive throughput")


def canonical_bytes(op: Operation) -> bytes:
    """The bytes an operation's signature covers and its id hashes (everything but the signature)."""
    return pack(
        [
            _OP_DOMAIN,
            int(op.kind),
            op.run,
            op.epoch,
            op.subject.raw,
            op.incarnation,
            op.origin.raw,
            float(op.detected_at),
            None if op.other is None else op.other.raw,
            float(op.throughput_samples_per_s),
            float(op.bandwidth_bytes_per_s),
            float(op.rtt_s),
            op.observed_incarnation,
        ]
    )


def op_id(op: Operation) -> bytes:
    """The operation's id: SHA-256 of its canonical bytes."""
    return hashlib.sha256(canonical_bytes(op)).digest()


def sign_operation(
    identity: Identity,
    *,
    kind: OpKind,
    run: str,
    epoch: int,
    subject: PeerID,
    incarnation: int,
    detected_at: float,
    other: PeerID | None = None,
    throughput_samples_per_s: float = 0.0,
    bandwidth_bytes_per_s: float = 0.0,
    rtt_s: float = 0.0,
    observed_incarnation: int = 0,
) -> Operation:
    """A new operation raised and signed by ``identity``."""
    unsigned = Operation(
        kind=kind,
        run=run,
        epoch=epoch,
        subject=subject,
        incarnation=incarnation,
        origin=identity.peer_id,
        detected_at=float(detected_at),
        signature=bytes(SIGNATURE_BYTES),
        other=other,
        throughput_samples_per_s=float(throughput_samples_per_s),
        bandwidth_bytes_per_s=float(bandwidth_bytes_per_s),
        rtt_s=float(rtt_s),
        observed_incarnation=observed_incarnation,
    )
    unsigned.validate()
    signature = identity.sign(canonical_bytes(unsigned))
    return Operation(
        kind=kind,
        run=run,
        epoch=epoch,
        subject=subject,
        incarnation=incarnation,
        origin=identity.peer_id,
        detected_at=float(detected_at),
        signature=signature,
        other=other,
        throughput_samples_per_s=float(throughput_samples_per_s),
        bandwidth_bytes_per_s=float(bandwidth_bytes_per_s),
        rtt_s=float(rtt_s),
        observed_incarnation=observed_incarnation,
    )


class SignatureCache:
    """Verifies signatures (operations, and the acceptances certificates are made of), remembering
    the verified ones, the ones that failed (a forged message sent again costs a lookup, not a
    verification) and each signer's decoded public key."""

    __slots__ = ("_bad", "_keys", "_max", "_shares", "_verified", "hits", "rejected_cached", "verifications")

    def __init__(self, max_entries: int) -> None:
        self._max = max_entries
        self._verified: dict[bytes, tuple[Operation, bytes]] = {}
        self._shares: dict[bytes, bytes] = {}
        """Signature -> SHA-256 of (signer, body) of a verified acceptance signature."""
        self._bad: dict[bytes, bytes] = {}
        """Signature -> SHA-256 of (signer, body) it failed to verify for (the negative cache)."""
        self._keys: dict[bytes, Ed25519PublicKey] = {}
        self.hits = 0
        self.verifications = 0
        self.rejected_cached = 0

    def remember(self, op: Operation) -> bytes:
        """Record an operation we signed ourselves (no need to verify it); returns its id."""
        ident = op_id(op)
        _bounded_put(self._verified, self._max, op.signature, (op, ident))
        return ident

    def _key(self, signer: PeerID) -> Ed25519PublicKey:
        key = self._keys.get(signer.raw)
        if key is None:
            key = signer.public_key()
            _bounded_put(self._keys, self._max, signer.raw, key)
        return key

    def check(self, op: Operation) -> bytes | None:
        """The op id if ``op`` carries its origin's valid signature, else ``None``."""
        cached = self._verified.get(op.signature)
        if cached is not None and (cached[0] is op or cached[0] == op):
            self.hits += 1
            return cached[1]
        body = canonical_bytes(op)
        ident = hashlib.sha256(body).digest()
        if not self._verify_once(op.origin, op.signature, body, ident):
            return None
        _bounded_put(self._verified, self._max, op.signature, (op, ident))
        return ident

    def verify(self, signer: PeerID, signature: bytes, body: bytes) -> bool:
        """Does ``signature`` by ``signer`` cover ``body``? (Acceptances; cached both ways.)"""
        tag = hashlib.sha256(signer.raw + body).digest()
        if self._shares.get(signature) == tag:
            self.hits += 1
            return True
        if not self._verify_once(signer, signature, body, tag):
            return False
        _bounded_put(self._shares, self._max, signature, tag)
        return True

    def _verify_once(self, signer: PeerID, signature: bytes, body: bytes, tag: bytes) -> bool:
        """Verify, unless this signature already failed for this content (``tag``): then refuse at
        once. A failure is remembered."""
        if self._bad.get(signature) == tag:
            self.rejected_cached += 1
            return False
        self.verifications += 1
        try:
            self._key(signer).verify(signature, body)
        except (InvalidSignature, ValueError):
            _bounded_put(self._bad, self._max, signature, tag)
            return False
        return True

    def remember_share(self, signer: PeerID, signature: bytes, body: bytes) -> None:
        """Record an acceptance we signed ourselves (no need to verify it)."""
        _bounded_put(self._shares, self._max, signature, hashlib.sha256(signer.raw + body).digest())


def _bounded_put(table: dict[Any, Any], cap: int, key: Any, value: Any) -> None:
    """Insert, forgetting the oldest entry first when full (dicts keep insertion order)."""
    if key not in table and len(table) >= cap:
        table.pop(next(iter(table)))
    table[key] = value


def apply_key(ident: bytes, op: Operation) -> tuple[int, bytes, bytes, bytes]:
    """Sort key of the deterministic apply order."""
    return (KIND_ORDER[op.kind], op.subject.raw, b"" if op.other is None else op.other.raw, ident)


def apply_order(entries: Iterable[tuple[bytes, Operation]]) -> tuple[list[tuple[bytes, Operation]], set[bytes]]:
    """Resolve conflicts by incarnation precedence, then sort: (ops to apply in order, ids dropped).

    Per member subject: only operations at the highest incarnation seen survive; if one of them is
    a removal, only the removals survive; of several THROUGHPUT ops the latest (detected_at, id)
    survives. Link operations are not in conflict with anything here: the ones whose endpoints are
    gone by the time they apply are skipped by the caller.
    """
    by_subject: dict[bytes, list[tuple[bytes, Operation]]] = {}
    keep: list[tuple[bytes, Operation]] = []
    dropped: set[bytes] = set()
    for ident, op in entries:
        if op.kind in MEMBER_KINDS:
            by_subject.setdefault(op.subject.raw, []).append((ident, op))
        else:
            keep.append((ident, op))
    for group in by_subject.values():
        if len(group) == 1:
            keep.extend(group)
            continue
        top = max(op.incarnation for _, op in group)
        winners = [(i, op) for i, op in group if op.incarnation == top]
        removals = [(i, op) for i, op in winners if op.kind in REMOVAL_KINDS]
        if removals:
            winners = removals
        else:
            throughputs = [(i, op) for i, op in winners if op.kind is OpKind.THROUGHPUT]
            if len(throughputs) > 1:
                latest = max(throughputs, key=lambda entry: (entry[1].detected_at, entry[0]))
                winners = [(i, op) for i, op in winners if op.kind is not OpKind.THROUGHPUT or i == latest[0]]
        kept_ids = {i for i, _ in winners}
        dropped.update(i for i, _ in group if i not in kept_ids)
        keep.extend(winners)
    keep.sort(key=lambda entry: apply_key(entry[0], entry[1]))
    return keep, dropped
