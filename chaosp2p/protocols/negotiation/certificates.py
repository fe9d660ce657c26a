"""Quorum certificates: the proof that a quorum of C_e accepted the value that made C_{e+1}.

Theory of operation
-------------------
An acceptor of instance e+1 (a member of C_e) that accepts a value at ballot b computes C_{e+1}
itself and signs the *acceptance statement* ``["chaosp2p/negotiation/accepted/1", run, e+1,
b.round, b.proposer, digest(C_{e+1})]``; the signature travels in its ACCEPTED. Once a quorum of
C_e accepted, the proposer puts their signatures into the COMMIT as a :class:`Certificate`: the
ballot, a bitmap of the signers over C_e's sorted member list, and the signatures in member order.
Every receiver -- a member applying the COMMIT, a member catching up through SYNC_REPLY, a
newcomer checking the configuration that admits it -- installs C_{e+1} only if the certificate
holds at least quorum(C_e) valid signatures of distinct members of C_e over that statement (the
ballot binds the signatures to one Paxos round: acceptances of one value at different ballots do
not make it chosen). One member, or any minority, cannot make one: a configuration that no quorum
accepted is never installed, whoever sends it.

Cost: a certificate of a run of n members holds n // 2 + 1 signatures (64 bytes each, plus n / 8
bytes of bitmap); checking one costs that many Ed25519 verifications, done once per signature
(:class:`~.operations.SignatureCache` remembers the verified and the failed ones), and a member
skips its own signature.
"""

from __future__ import annotations

import bisect

from chaosp2p.protocols.negotiation.messages import Ballot, Certificate
from chaosp2p.protocols.negotiation.operations import SignatureCache
from chaosp2p.protocols.negotiation.run_configuration import Configuration, quorum
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity, PeerID

_DOMAIN = "chaosp2p/negotiation/accepted/1"


def statement(run: str, epoch: int, ballot: Ballot, digest: bytes) -> bytes:
    """The bytes an acceptor signs: it accepted, in instance ``epoch``, at ``ballot``, the value
    that turns C_(epoch-1) into the configuration with ``digest``."""
    return pack([_DOMAIN, run, epoch, ballot.round, ballot.proposer.raw, digest])


def sign_acceptance(identity: Identity, run: str, epoch: int, ballot: Ballot, digest: bytes) -> bytes:
    """This acceptor's signature over the acceptance statement."""
    return identity.sign(statement(run, epoch, ballot, digest))


def make_certificate(prev: Configuration, ballot: Ballot, shares: dict[bytes, bytes]) -> Certificate:
    """The certificate of ``shares`` (signer raw id -> signature; all members of ``prev``)."""
    raws = prev.ids()
    bitmap = bytearray((len(raws) + 7) // 8)
    signed: list[tuple[int, bytes]] = []
    for raw, signature in shares.items():
        i = bisect.bisect_left(raws, raw)
        if i >= len(raws) or raws[i] != raw:
            continue
        bitmap[i >> 3] |= 1 << (i & 7)
        signed.append((i, signature))
    signed.sort()
    return Certificate(ballot=ballot, signers=bytes(bitmap), signatures=tuple(s for _, s in signed))


def signer_indices(prev: Configuration, cert: Certificate) -> list[int] | None:
    """The member indices the bitmap names, or None if it does not fit ``prev``."""
    n = len(prev.peers)
    bitmap = cert.signers
    if len(bitmap) != (n + 7) // 8:
        return None
    out = [i for i in range(n) if bitmap[i >> 3] >> (i & 7) & 1]
    if n % 8 and bitmap and bitmap[-1] >> (n % 8):
        return None  # bits past the last member
    return out


def check_certificate(
    cache: SignatureCache,
    prev: Configuration,
    epoch: int,
    digest: bytes,
    cert: Certificate | None,
    *,
    me: PeerID | None = None,
    own_signature: bytes | None = None,
) -> str | None:
    """Why ``cert`` does not prove that a quorum of ``prev`` accepted the value making the
    configuration ``digest`` of ``epoch`` (a rejection reason), or None if it does.

    Cheap checks first (shape, count, the proposer a member); then one verification per signature
    not seen before. ``own_signature``: what this peer signed itself at that ballot, if anything
    (its own entry is compared, not verified).
    """
    if cert is None:
        return "uncertified"
    if epoch != prev.epoch + 1:
        return "bad_certificate"
    indices = signer_indices(prev, cert)
    if indices is None or len(indices) != len(cert.signatures) or len(indices) < quorum(prev):
        return "bad_certificate"
    if prev.index_of(cert.ballot.proposer) < 0:
        return "bad_certificate"
    body = statement(prev.run, epoch, cert.ballot, digest)
    peers = prev.peers
    for i, signature in zip(indices, cert.signatures, strict=True):
        signer = peers[i]
        if me is not None and signer == me:
            if own_signature is not None and own_signature == signature:
                continue
            if not cache.verify(signer, signature, body):
                return "bad_certificate"
            continue
        if not cache.verify(signer, signature, body):
            return "bad_certificate"
    return None


def certified_forward(
    cache: SignatureCache,
    anchor: Configuration,
    config: Configuration,
    cert: Certificate | None,
    previous: Configuration | None,
    *,
    me: PeerID | None = None,
) -> str | None:
    """Is ``config`` proven to follow ``anchor`` (a configuration the caller trusts)? None if so.

    * the same configuration;
    * the next one: its certificate holds a quorum of ``anchor``;
    * a later one (a catch-up beyond the history, or a newcomer handed a newer configuration): its
      certificate -- whose bitmap ``previous``, the configuration before it, resolves to peers --
      holds valid signatures of at least quorum(anchor) members *of anchor*. If fewer than a quorum
      of ``anchor`` lie, one of them is honest, and an honest member signs an acceptance in
      instance x only for the value it computed from the real C_(x-1): the digest is the real one.
      ``previous`` itself needs no trust (it only says who signed; each signature is checked).
    """
    if config.run != anchor.run:
        return "bad_configuration"
    if config.digest == anchor.digest:
        return None
    if config.epoch <= anchor.epoch:
        return "old_epoch"
    if config.epoch == anchor.epoch + 1:
        return check_certificate(cache, anchor, config.epoch, config.digest, cert, me=me)
    if cert is None or previous is None:
        return "uncertified"
    if previous.run != anchor.run or previous.epoch != config.epoch - 1:
        return "bad_certificate"
    indices = signer_indices(previous, cert)
    if indices is None or len(indices) != len(cert.signatures):
        return "bad_certificate"
    need = quorum(anchor)
    signers = [(previous.peers[i], s) for i, s in zip(indices, cert.signatures, strict=True)]
    ours = [(p, s) for p, s in signers if anchor.has_member(p)]
    if len(ours) < need:
        return "unverifiable"  # cheap count first: too few of anchor's members even claim to have signed
    body = statement(anchor.run, config.epoch, cert.ballot, config.digest)
    valid = 0
    for peer, signature in ours:
        if cache.verify(peer, signature, body):
            valid += 1
            if valid >= need:
                return None
    return "bad_certificate"


__all__ = [
    "Certificate",
    "certified_forward",
    "check_certificate",
    "make_certificate",
    "sign_acceptance",
    "signer_indices",
    "statement",
]
