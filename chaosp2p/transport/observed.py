"""The addresses other peers see this host at (the ``observed_addr`` of their hellos).

Every direct connection's remote hello says which address the remote side saw our end come from:
behind a NAT that is the router's public address and the port it mapped, not anything this host
can find on its interfaces. This table keeps, per observed address, which peers reported it, so
that a claim counts only once per observer (one peer cannot make up an address by repeating it),
and bounds itself: a peer's hello is untrusted, and every identity it shows costs an entry.

What it does not do is announce anything: an observed address of a host behind NAT reaches that
host only through the mapping of one outbound connection. Which of them others can really dial is
for a dial-back check (reachability) to say; :meth:`ObservedAddrs.confirmed` gives the candidates:
addresses at least ``min_observers`` distinct peers agree on. :meth:`ObservedAddrs.public_ips`
lists the IPs seen that are not this host's own -- the sign of a NAT in between.
"""

from __future__ import annotations

from collections import OrderedDict

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

MAX_OBSERVED = 32
"""Distinct observed addresses kept (the oldest reported goes first)."""
MAX_OBSERVERS = 8
"""Observers kept per address: enough to confirm, and a bound on what one address costs."""


class ObservedAddrs:
    """Observed addresses of this host and who reported each (bounded; see the module docstring)."""

    def __init__(self, *, max_addrs: int = MAX_OBSERVED, max_observers: int = MAX_OBSERVERS) -> None:
        self._seen: OrderedDict[str, list[PeerID]] = OrderedDict()
        self._max_addrs = max_addrs
        self._max_observers = max_observers

    def add(self, observer: PeerID, text: str) -> Multiaddr | None:
        """Record that ``observer`` saw us at ``text`` (a peer's word: a bad address is ignored)."""
        if not text:
            return None
        try:
            addr = Multiaddr.parse(text).without_peer()
        except ConfigError:
            return None
        key = str(addr)
        observers = self._seen.setdefault(key, [])
        self._seen.move_to_end(key)
        if observer not in observers:
            observers.append(observer)
            del observers[: -self._max_observers]
        while len(self._seen) > self._max_addrs:
            self._seen.popitem(last=False)
        return addr

    def all(self) -> list[Multiaddr]:
        """Every observed address, the most recently reported last."""
        return [Multiaddr.parse(key) for key in self._seen]

    def confirmed(self, min_observers: int = 2) -> list[Multiaddr]:
        """Addresses that at least ``min_observers`` distinct peers reported."""
        return [Multiaddr.parse(key) for key, peers in self._seen.items() if len(peers) >= min_observers]

    def public_ips(self, own: list[Multiaddr]) -> list[str]:
        """IPs others saw us at that none of ``own`` (our listen addresses) has: a NAT's, if any."""
        mine = {addr.host for addr in own}
        ips: list[str] = []
        for addr in self.all():
            if addr.host not in mine and addr.host not in ips:
                ips.append(addr.host)
        return ips
