"""``hivemind.p2p``: hivemind's ``PeerID`` over chaosp2p's.

A chaosp2p PeerID is already a libp2p peer id (an Ed25519 identity multihash, ``12D3KooW...``);
this subclass adds the method names hivemind scripts call (``to_base58()``, ``to_bytes()``,
``PeerID.from_base58(...)``) and compares equal to the same id given as text or bytes, as
hivemind's does. ``P2P`` and the daemon are not provided: chaosp2p has no separate daemon.
"""

from __future__ import annotations

from chaosp2p.wire.identity import PeerID as WirePeerID


class PeerID(WirePeerID):
    """A peer id with hivemind's interface (and chaosp2p's: ``.raw``, ``verify``, ``short()``)."""

    __slots__ = ()

    @classmethod
    def from_base58(cls, base58_id: str) -> PeerID:
        """Parse the ``12D3KooW...`` form."""
        return cls(WirePeerID.parse(base58_id).raw)

    @classmethod
    def of(cls, peer: WirePeerID | str) -> PeerID:
        """The hivemind-style id of a chaosp2p PeerID (or its text)."""
        return cls.from_base58(peer) if isinstance(peer, str) else cls(peer.raw)

    def to_bytes(self) -> bytes:
        """The id's bytes (the identity multihash)."""
        return self.raw

    def to_base58(self) -> str:
        """The ``12D3KooW...`` form."""
        return str(self)

    def to_string(self) -> str:
        """The ``12D3KooW...`` form."""
        return str(self)

    def pretty(self) -> str:
        """The ``12D3KooW...`` form."""
        return str(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WirePeerID):
            return self.raw == other.raw
        if isinstance(other, str):
            return str(self) == other
        if isinstance(other, bytes):
            return self.raw == other
        return False

    def __hash__(self) -> int:
        return hash(self.raw)

    def __repr__(self) -> str:
        return f"<libp2p.peer.id.ID ({self})>"


__all__ = ["PeerID"]
