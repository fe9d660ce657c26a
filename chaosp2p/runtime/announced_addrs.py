"""Announcing the addresses others can dial: listen addresses plus the ones dial-back proved.

A peer behind a NAT that forwards its port (or a host whose public address is not on any of its
interfaces) listens on an address nobody outside can use, while another address -- the NAT's, seen
by the peers it talks to -- does reach it. Dial-back checks (``protocols/reachability.md``) find
which; this puts those addresses, once ``min_confirmations`` distinct servers reached us there, in
front of the listen addresses in the peer's membership record and its DHT contact. Diallers try
addresses in order, so the one that works from outside is tried first; the listen addresses stay
for peers on the same network.

Only addresses confirmed by dial-back are announced, never a merely observed one: an observed
address of a host behind a masquerading NAT reaches it only through one outbound connection's
mapping, and announcing it would send others to a port nobody listens on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

log = logging.getLogger("chaosp2p.runtime")

MAX_EXTERNAL_ADDRS = 2
"""Proven addresses announced at most (the record's address cap holds the listen addresses too)."""


class AnnouncedAddrs:
    """Keeps the announced address list in step with the proven external addresses.

    ``announce(addrs)`` publishes a new list (membership and DHT); it is called only on a change.
    """

    def __init__(
        self,
        listen: Callable[[], Sequence[str]],
        working: Callable[[], Sequence[str]],
        announce: Callable[[list[str]], None],
        *,
        max_addrs: int,
    ) -> None:
        self._listen = listen
        self._working = working
        self._announce = announce
        self._max_addrs = max_addrs
        self.external: list[str] = []
        """The proven addresses announced now (not among the listen addresses)."""

    def refresh(self) -> bool:
        """Announce again if the proven addresses changed (after each reachability check)."""
        external, listen = self._split()
        if external == self.external:
            return False
        addrs = [*external, *listen][: self._max_addrs]
        log.info("announcing %s", ", ".join(addrs) if external else "listen addresses only (none proven from outside)")
        self.external = external
        self._announce(addrs)
        return True

    def _split(self) -> tuple[list[str], list[str]]:
        """(proven addresses that are not listen addresses, capped; the listen addresses)."""
        listen = list(self._listen())
        external = [a for a in dict.fromkeys(self._working()) if a not in listen][:MAX_EXTERNAL_ADDRS]
        return external, listen
