"""Identities and signed self-claims for the membership tests (peer ``i`` has the seed byte ``i + 1``).

A member's ALIVE, LEFT and info records carry its own signature (``protocols/membership.md`` §2);
tests that play other peers sign them as those peers would, and forge them where a test is about
forgery.
"""

from __future__ import annotations

import functools

from chaosp2p.protocols.membership.messages import InfoUpdate, LinkSummary, MemberUpdate, Resources, UpdateKind
from chaosp2p.protocols.membership.signing import alive_payload, info_payload, left_payload, relay_payload
from chaosp2p.wire.identity import Identity, PeerID


@functools.cache
def identity(index: int) -> Identity:
    """Peer ``index``'s key pair (seed: the byte ``index + 1`` repeated, or the number for ``index >= 255``)."""
    return Identity.from_seed(bytes([index + 1]) * 32 if index < 255 else (index + 1).to_bytes(32, "big"))


def peer(index: int) -> PeerID:
    """Peer ``index``'s PeerID."""
    return identity(index).peer_id


def addr(index: int) -> str:
    """Peer ``index``'s listen address."""
    return f"/ip4/10.0.0.{index % 250 + 1}/tcp/{4001 + index // 250}"


@functools.cache
def alive(index: int, incarnation: int = 0, addrs: tuple[str, ...] | None = None) -> MemberUpdate:
    """Peer ``index``'s own ALIVE record, signed by it."""
    subject = peer(index)
    addrs = (addr(index),) if addrs is None else addrs
    signature = identity(index).sign(alive_payload(subject, incarnation, addrs))
    return MemberUpdate(kind=UpdateKind.ALIVE, peer=subject, incarnation=incarnation, addrs=addrs, signature=signature)


def forged_alive(index: int, incarnation: int = 0, addrs: tuple[str, ...] | None = None) -> MemberUpdate:
    """An ALIVE record about peer ``index`` that it never signed (unsigned, as before signatures)."""
    addrs = (addr(index),) if addrs is None else addrs
    return MemberUpdate(kind=UpdateKind.ALIVE, peer=peer(index), incarnation=incarnation, addrs=addrs)


def left(index: int, incarnation: int = 0) -> MemberUpdate:
    """Peer ``index``'s own LEFT record, signed by it."""
    subject = peer(index)
    signature = identity(index).sign(left_payload(subject, incarnation))
    return MemberUpdate(kind=UpdateKind.LEFT, peer=subject, incarnation=incarnation, signature=signature)


def info(
    index: int,
    version: int,
    resources: Resources | None = None,
    links: tuple[LinkSummary, ...] = (),
    relay_addrs: tuple[str, ...] = (),
) -> InfoUpdate:
    """Peer ``index``'s own info record, signed by it (with its relay addresses, if any)."""
    unsigned = InfoUpdate(peer=peer(index), version=version, resources=resources or Resources(), links=links)
    signature = identity(index).sign(info_payload(unsigned))
    relay_signature = identity(index).sign(relay_payload(unsigned.peer, version, relay_addrs)) if relay_addrs else b""
    return InfoUpdate(
        peer=unsigned.peer,
        version=version,
        resources=unsigned.resources,
        links=links,
        signature=signature,
        relay_addrs=relay_addrs,
        relay_signature=relay_signature,
    )
