"""Justified ballots: an acceptor accepts a value at a ballot above round 0 only with proof of phase 1.

Theory of operation (``protocols/negotiation.md`` sections 4b and 9)
--------------------------------------------------------------------
Certificates (``certificates.py``) stop a COMMIT that no quorum accepted. They do not stop a
dishonest proposer that gets a value v accepted by a quorum, hands the certified COMMIT to a few
members only, and then sends ACCEPT(w) at a higher ballot, without phase 1, to the others: Paxos
lets a higher ballot replace an accepted value, so they accept w and sign, and w gets certified
too. Here an ACCEPT at a ballot b > 0 must carry a quorum of *signed PROMISEs* for b, and its value
must be the one those promises force:

* each promise names its sender's highest accepted (ballot, digest of the configuration it makes)
  and its completed step, signed (:func:`promise_statement`);
* an accepted claim counts only if *another* member signed that the value was proposed or accepted
  at that ballot (the ballot's proposer's signature over :func:`propose_statement`, which every
  ACCEPT carries; or, when the claimant is that proposer, another acceptor's acceptance). A liar's
  claim therefore names a value that an honest member proposed or accepted at that ballot, i.e.
  a value that was justified there -- it cannot make up a value and force it;
* the forced value is the highest-ballot claim (:func:`forced`); with none, any value is free. If
  the highest ballot carries two digests, its proposer signed two values: it is the liar, and
  the promises of k = 2(n - q) + 1 other members settle which one may have been chosen
  (:func:`settling_promises`; :data:`WAIT` until then). If a quorum Q chose w there, at most
  n - q members other than the liar are outside Q, so at least k - (n - q) of the k are honest
  members of Q and report w; the other value was accepted only by honest members outside Q, at
  most n - q < k - (n - q). So the most reported value is the only one that may have been
  chosen. A promise with an unbacked claim is not one of the k: its signer accepted something
  nobody else vouches for (an honest proposer's own value that no acceptor answered yet), so it
  may be a member of Q whose report of w is hidden. For odd n >= 5 (q = n//2 + 2) k is n - 2:
  one more member may crash after the equivocation; for even n it is n - 1, every other member;
* a forced value may be skipped only if it is *dead* (``paxos`` module docstring) with one
  refusal more than without liars (:func:`dead`): the liar may claim to refuse it.

Round 0 is the coordinator's and needs no promises: no lower ballot exists, nothing can have been
accepted before it, so any value is safe there. A coordinator that equivocates at round 0 is the
equivocation case above.

Cost: an ACCEPT above round 0 grows by a quorum of promises (~200 bytes each) and an acceptor
verifies up to two signatures per promise (the cache verifies each once: the backings repeat).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from chaosp2p.protocols.negotiation.certificates import statement
from chaosp2p.protocols.negotiation.messages import Ballot, SignedPromise, Value
from chaosp2p.protocols.negotiation.operations import FAIL_KINDS, SignatureCache
from chaosp2p.protocols.negotiation.run_configuration import Configuration, liar_tolerant, quorum, quorum_of
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID

_PROPOSE_DOMAIN = "chaosp2p/negotiation/propose/1"
_PROMISE_DOMAIN = "chaosp2p/negotiation/promise/1"

WAIT: Final = "wait"
""":func:`forced` cannot tell yet: the highest ballot is equivocated, and promises are missing."""


def propose_statement(run: str, epoch: int, ballot: Ballot, digest: bytes) -> bytes:
    """What a proposer signs in its ACCEPT: it proposes, in instance ``epoch`` at ``ballot``, the
    value that makes the configuration ``digest`` (not an acceptance: it is no share of a certificate)."""
    return pack([_PROPOSE_DOMAIN, run, epoch, ballot.round, ballot.proposer.raw, digest])


def promise_statement(
    run: str, epoch: int, ballot: Ballot, accepted: Ballot | None, digest: bytes, completed: int
) -> bytes:
    """What an acceptor signs in its PROMISE for ``ballot``: its accepted (ballot, digest), if any,
    and its completed step."""
    claim: list[object] = [] if accepted is None else [accepted.round, accepted.proposer.raw, digest]
    return pack([_PROMISE_DOMAIN, run, epoch, ballot.round, ballot.proposer.raw, claim, completed])


def sign_promise(
    identity: Identity, run: str, epoch: int, ballot: Ballot, accepted: Ballot | None, digest: bytes, completed: int
) -> bytes:
    """This acceptor's signature over its promise."""
    return identity.sign(promise_statement(run, epoch, ballot, accepted, digest, completed))


def backing_valid(
    cache: SignatureCache,
    config: Configuration,
    epoch: int,
    claimant: PeerID,
    accepted: Ballot,
    digest: bytes,
    backer: PeerID | None,
    backing: bytes,
) -> bool:
    """Did a member other than ``claimant`` sign that the value ``digest`` was proposed (the
    ballot's proposer) or accepted (anyone else) at ``accepted``?"""
    if backer is None or not backing or backer == claimant or not config.has_member(backer):
        return False
    if backer == accepted.proposer:
        body = propose_statement(config.run, epoch, accepted, digest)
    else:
        body = statement(config.run, epoch, accepted, digest)
    return cache.verify(backer, backing, body)


@dataclass(frozen=True, slots=True)
class Claim:
    """What one promise counts for: its signer, its backed accepted (ballot, digest) if any, its progress."""

    signer: bytes
    ballot: Ballot | None
    digest: bytes
    completed: int
    said: bytes = b""
    """The digest it claims, backed or not: an unbacked claim forces nothing, but it still says the
    signer accepted that value (so it does not count as refusing it, see :func:`dead`)."""


def settling_promises(n: int) -> int:
    """Promises of members other than an equivocating proposer (each with a backed claim or none)
    that settle which of its two values may have been chosen: 2(n - q) + 1 (module docstring), at
    most every other member (a run of three or fewer, which no quorum defends against a liar)."""
    return min(n - 1, 2 * (n - quorum_of(n)) + 1)


def forced(claims: Sequence[Claim], config: Configuration) -> tuple[Ballot, bytes] | Literal["wait"] | None:
    """The (ballot, digest) the claims force a proposer to propose, None if any value is free, or
    :data:`WAIT` if the highest ballot is equivocated and fewer than :func:`settling_promises`
    other members' promises settle it."""
    top: Ballot | None = None
    for c in claims:
        if c.ballot is not None and (top is None or c.ballot.key() > top.key()):
            top = c.ballot
    if top is None:
        return None
    at_top = Counter(c.digest for c in claims if c.ballot is not None and c.ballot.key() == top.key())
    if len(at_top) == 1:
        return top, next(iter(at_top))
    liar = top.proposer.raw  # it signed two values at its ballot
    # Each settling promise shows its signer's backed claim, or that it accepted nothing at all.
    settling = [c for c in claims if c.signer != liar and (c.ballot is not None or not c.said)]
    if len(settling) < settling_promises(len(config.peers)):
        return WAIT
    counts = Counter(c.digest for c in settling if c.ballot is not None and c.ballot.key() == top.key())
    best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # most reported; ties: lowest digest
    return top, best[0]


def refuses(value: Value, acceptor: bytes, completed: int) -> bool:
    """Would this acceptor refuse ``value`` (forever)? Yes if it completed the activation step, or
    if the value fails the acceptor itself (it knows it is alive: a stale or false failure)."""
    if completed >= value.activation_step:
        return True
    return any(op.kind in FAIL_KINDS and op.subject.raw == acceptor for op in value.ops)


def dead(value: Value, digest: bytes, claims: Iterable[Claim], config: Configuration) -> bool:
    """May the forced ``value`` be skipped? If enough promises come from acceptors that would refuse
    it and did not report it: n - q + 1, one more where one liar is tolerated (its claim may be false)."""
    n = len(config.peers)
    need = n - quorum(config) + 1 + (1 if liar_tolerant(n) else 0)
    refusing = sum(1 for c in claims if refuses(value, c.signer, c.completed) and c.said != digest)
    return refusing >= need


def claims_of(
    cache: SignatureCache, config: Configuration, epoch: int, ballot: Ballot, promises: Iterable[SignedPromise]
) -> list[Claim] | None:
    """The claims of ``promises`` for ``ballot`` (unbacked accepted claims count as none), or None
    if any promise is not validly signed, comes from a non-member or twice from one, or claims a
    ballot not below ``ballot``."""
    out: list[Claim] = []
    seen: set[bytes] = set()
    for p in promises:
        signer = p.signer
        if signer.raw in seen or not config.has_member(signer):
            return None
        seen.add(signer.raw)
        accepted = p.accepted_ballot
        if accepted is not None and accepted.key() >= ballot.key():
            return None
        body = promise_statement(config.run, epoch, ballot, accepted, p.accepted_digest, p.completed)
        if not cache.verify(signer, p.signature, body):
            return None
        if accepted is not None and backing_valid(
            cache, config, epoch, signer, accepted, p.accepted_digest, p.backer, p.backing
        ):
            out.append(Claim(signer.raw, accepted, p.accepted_digest, p.completed, p.accepted_digest))
        else:
            out.append(Claim(signer.raw, None, b"", p.completed, p.accepted_digest))
    return out


def check_justification(
    cache: SignatureCache,
    config: Configuration,
    epoch: int,
    ballot: Ballot,
    promises: Sequence[SignedPromise],
    digest: bytes,
    skipped: tuple[Value, bytes] | None,
) -> tuple[str | None, bool]:
    """(why the ACCEPT of the value making ``digest`` at ``ballot`` is not justified by
    ``promises``, or None; whether the value is the forced one, i.e. *adopted*).

    ``skipped``: the forced value the proposer found dead, with the digest it makes (computed by
    the caller from C_e). Cheap count first, then the signatures.
    """
    if len(promises) < quorum(config):
        return "unjustified", False
    claims = claims_of(cache, config, epoch, ballot, promises)
    if claims is None:
        return "unjustified", False
    verdict = forced(claims, config)
    if verdict is None:
        return None, False
    if verdict == WAIT:
        return "unjustified", False
    _, must = verdict
    if digest == must:
        return None, True
    if skipped is not None and skipped[1] == must and dead(skipped[0], must, claims, config):
        return None, False
    return "unjustified", False


__all__ = [
    "WAIT",
    "Claim",
    "backing_valid",
    "check_justification",
    "claims_of",
    "dead",
    "forced",
    "promise_statement",
    "propose_statement",
    "refuses",
    "settling_promises",
    "sign_promise",
]
