"""Signed promises on both sides of phase 1 (the rules are in ``justification.py``).

An acceptor signs each PROMISE with its accepted (ballot, digest) and the backing that proves the
claim; a proposer keeps the signed promises it received, counts an accepted claim only when it is
backed and its value makes the claimed digest, and carries the promises in its ACCEPT; an acceptor
checks them before accepting above round 0.
"""

from __future__ import annotations

from collections.abc import Callable

from chaosp2p.protocols.negotiation.justification import (
    backing_valid,
    check_justification,
    promise_statement,
    propose_statement,
    sign_promise,
)
from chaosp2p.protocols.negotiation.messages import Accept, Ballot, Promise, SignedPromise, Value
from chaosp2p.protocols.negotiation.operations import SignatureCache
from chaosp2p.protocols.negotiation.paxos import BackedClaim, PromiseInfo, RunRecord
from chaosp2p.wire.identity import Identity, PeerID

DigestOf = Callable[[RunRecord, Value], bytes | None]
"""The digest of the configuration a value makes from the run's C_e (None: the value is invalid)."""


def back_acceptance(rec: RunRecord, backer: PeerID, backing: bytes) -> None:
    """Another member backs our accepted value (the proposer's signature on its ACCEPT, or, as the
    proposer, an acceptor's share): from now on our promises claim it."""
    rec.accepted_backer, rec.accepted_backing = backer, backing
    if rec.accepted_ballot is not None and rec.accepted_value is not None and rec.accepted_outcome is not None:
        digest = rec.accepted_outcome[0].digest
        rec.backed = BackedClaim(rec.accepted_ballot, rec.accepted_value, digest, backer, backing)


def claimed_value(rec: RunRecord) -> tuple[Ballot | None, Value | None]:
    """The accepted (ballot, value) our promises claim: the current acceptance, unless it is our
    own proposal nobody has answered yet and an earlier one is backed. That one is reported then:
    the unbacked claim would count as nothing and hide it (a liar used this to have another value
    forced at a higher ballot), while the unbacked ballot can never be certified (we abandon it
    once we promise a higher one, and nobody else collects its acceptances)."""
    if rec.accepted_backer is None and rec.backed is not None:
        return rec.backed.ballot, rec.backed.value
    return rec.accepted_ballot, rec.accepted_value


def signed_promise(identity: Identity, rec: RunRecord, ballot: Ballot) -> SignedPromise:
    """Our promise for ``ballot``, signed: the accepted (ballot, digest) with its backing, if any
    (:func:`claimed_value` says which acceptance)."""
    fallback = rec.backed if rec.accepted_backer is None else None
    if fallback is not None:
        accepted: Ballot | None = fallback.ballot
        digest = fallback.digest
        backer: PeerID | None = fallback.backer
        backing = fallback.backing
    else:
        accepted = rec.accepted_ballot
        digest = b"" if accepted is None or rec.accepted_outcome is None else rec.accepted_outcome[0].digest
        backer, backing = rec.accepted_backer, rec.accepted_backing
    if not digest:
        accepted = None
    signature = sign_promise(identity, rec.run, rec.epoch + 1, ballot, accepted, digest, rec.completed)
    return SignedPromise(
        signer=identity.peer_id,
        accepted_ballot=accepted,
        accepted_digest=digest,
        backer=backer if accepted is not None else None,
        backing=backing if accepted is not None else b"",
        completed=rec.completed,
        signature=signature,
    )


def proof_of(sender: PeerID, msg: Promise) -> SignedPromise:
    """``msg`` (from ``sender``) as an ACCEPT carries it: the signed fields only."""
    accepted = msg.accepted_ballot if msg.accepted_digest else None
    return SignedPromise(
        signer=sender,
        accepted_ballot=accepted,
        accepted_digest=msg.accepted_digest if accepted is not None else b"",
        backer=msg.backer,
        backing=msg.backing,
        completed=msg.completed,
        signature=msg.signature,
    )


def promise_info(
    sigs: SignatureCache, rec: RunRecord, sender: PeerID, msg: Promise, digest_of: DigestOf
) -> PromiseInfo | None:
    """What ``msg`` counts for at its proposer, or None if its signature is missing or bad, it
    claims a ballot not below its own (it could not justify our ACCEPT), or it claims a backed
    value whose content does not make the digest claimed. An accepted claim without another
    member's backing counts as no claim."""
    config = rec.config
    assert config is not None
    accepted = msg.accepted_ballot if msg.accepted_digest else None
    digest = msg.accepted_digest if accepted is not None else b""
    if accepted is not None and accepted.key() >= msg.ballot.key():
        return None  # nobody accepts at a ballot before promising it: acceptors would refuse the ACCEPT
    body = promise_statement(rec.run, msg.epoch, msg.ballot, accepted, digest, msg.completed)
    if not msg.signature or not sigs.verify(sender, msg.signature, body):
        return None
    proof = proof_of(sender, msg)
    value = msg.accepted_value
    if accepted is None or not backing_valid(
        sigs, config, msg.epoch, sender, accepted, digest, msg.backer, msg.backing
    ):
        accepted, digest, value = None, b"", None
    elif value is None or digest_of(rec, value) != digest:
        # A backed claim whose content is missing or makes another configuration: only a liar
        # sends one. Not counted at all, so that it cannot leave us unable to propose the value
        # it claims (any quorum of promises justifies a ballot; we wait for another).
        return None
    return PromiseInfo(
        accepted_ballot=accepted,
        accepted_value=value,
        entered=msg.entered,
        completed=msg.completed,
        step_time_s=msg.step_time_s,
        accepted_digest=digest,
        proof=proof,
    )


def justified(
    sigs: SignatureCache, rec: RunRecord, msg: Accept, digest: bytes, digest_of: DigestOf
) -> tuple[str | None, bool]:
    """(why ``msg`` may not be accepted, or None; whether its value is adopted). The proposer signs
    what it proposes (our later promises show it); above round 0 the value must be the one the
    quorum of signed promises it carries forces (``justification.py``). ``adopted`` is decided
    here, not taken from the proposer's word."""
    config = rec.config
    assert config is not None
    ballot = msg.ballot
    body = propose_statement(rec.run, msg.epoch, ballot, digest)
    if not msg.proposer_signature or not sigs.verify(ballot.proposer, msg.proposer_signature, body):
        return "unjustified", False
    if ballot.round == 0:
        return None, False  # the coordinator's fast path: nothing can have been accepted below it
    skipped: tuple[Value, bytes] | None = None
    if msg.skipped is not None:
        skipped_digest = digest_of(rec, msg.skipped)
        if skipped_digest is not None:
            skipped = (msg.skipped, skipped_digest)
    return check_justification(sigs, config, msg.epoch, ballot, msg.justification, digest, skipped)


__all__ = ["DigestOf", "justified", "promise_info", "proof_of", "signed_promise"]
