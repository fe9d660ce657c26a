"""Protocol ids and version negotiation.

Every protocol spoken on a stream is named ``/chaos/<name>/<major>``. Peers advertise the ids they
speak in their ``Hello``; when opening a stream the opener picks, for the protocol name it wants,
the highest major version both sides speak. A major version bump is an incompatible change; compatible
additions (new trailing message fields, new message types a peer may ignore) keep the major.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from chaosp2p.errors import ProtocolNotSupported, RemoteProtocolError

_PATTERN = re.compile(r"^/chaos/([a-z][a-z0-9-]{0,31})/([1-9][0-9]{0,5})$")
MAX_PROTOCOL_ID_CHARS = 48


@dataclass(frozen=True, slots=True, order=True)
class ProtocolId:
    """A versioned protocol id such as ``/chaos/dht/1``."""

    name: str
    major: int

    @classmethod
    def parse(cls, text: str) -> ProtocolId:
        """Parse ``/chaos/<name>/<major>``; a malformed id is a :class:`RemoteProtocolError`."""
        match = _PATTERN.match(text) if len(text) <= MAX_PROTOCOL_ID_CHARS else None
        if match is None:
            raise RemoteProtocolError(f"malformed protocol id {text[:MAX_PROTOCOL_ID_CHARS]!r}")
        return cls(match.group(1), int(match.group(2)))

    def __str__(self) -> str:
        return f"/chaos/{self.name}/{self.major}"


def choose_version(name: str, ours: Iterable[ProtocolId], theirs: Iterable[ProtocolId]) -> ProtocolId:
    """The highest major version of ``name`` that both sides speak.

    Raises :class:`ProtocolNotSupported` (naming both sides' versions) when there is none.
    """
    our_majors = {p.major for p in ours if p.name == name}
    their_majors = {p.major for p in theirs if p.name == name}
    common = our_majors & their_majors
    if not common:
        raise ProtocolNotSupported(
            f"no common version of /chaos/{name}: we speak {sorted(our_majors) or 'none'}, "
            f"the remote speaks {sorted(their_majors) or 'none'}"
        )
    return ProtocolId(name, max(common))
