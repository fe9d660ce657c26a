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

It also keeps, per observer, whether a connection *we dialled* reached it from the same port our
socket had (:meth:`ObservedAddrs.port_mapping`). A NAT that keeps source ports (Linux's plain
masquerade) maps our listen port to itself, which is what hole punching relies on
(``protocols/holepunch.md``); one that changes them (a symmetric, port-randomising NAT) defeats
it, and a peer that knows so declines punches at once instead of waiting out their timeout. The
verdict needs ``min_observers`` distinct observers and a majority, so one peer's false report
changes nothing.
"""

from __future__ import annotations

import enum
from collections import OrderedDict

from chaosp2p.errors import ConfigError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

MAX_OBSERVED = 32
"""Distinct observed addresses kept (the oldest reported goes first)."""
MAX_OBSERVERS = 8
"""Observers kept per address: enough to confirm, and a bound on what one address costs."""
MAX_MAPPING_OBSERVERS = 64
"""Observers whose port verdict is kept (the least recent report goes first)."""


class PortMapping(enum.Enum):
    """What this host's outbound connections show about its NAT's source ports."""

    UNKNOWN = "unknown"
    """Too few observers, or no majority."""
    KEPT = "kept"
    """Observers saw our connections come from the port our socket had (no NAT, or one that keeps
    ports): our listen port maps to itself, as hole punching needs."""
    CHANGED = "changed"
    """Observers saw other ports than our sockets had (a symmetric, port-randomising NAT): the other
    side of a punch would dial a port nothing maps, so a punch cannot work."""


class ObservedAddrs:
    """Observed addresses of this host and who reported each (bounded; see the module docstring)."""

    def __init__(self, *, max_addrs: int = MAX_OBSERVED, max_observers: int = MAX_OBSERVERS) -> None:
        self._seen: OrderedDict[str, list[PeerID]] = OrderedDict()
        self._max_addrs = max_addrs
        self._max_observers = max_observers
        self._ports_kept: OrderedDict[PeerID, bool] = OrderedDict()

    def add(self, observer: PeerID, text: str, *, local_port: int | None = None) -> Multiaddr | None:
        """Record that ``observer`` saw us at ``text`` (a peer's word: a bad address is ignored);
        ``local_port``: our socket's port, for a connection we dialled (its verdict on port mapping)."""
        if not text:
            return None
        try:
            addr = Multiaddr.parse(text).without_peer()
        except ConfigError:
            return None
        if local_port is not None:
            self._ports_kept[observer] = addr.port == local_port
            self._ports_kept.move_to_end(observer)
            while len(self._ports_kept) > MAX_MAPPING_OBSERVERS:
                self._ports_kept.popitem(last=False)
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

    def port_mapping(self, min_observers: int = 2) -> PortMapping:
        """What our NAT does to source ports, by the latest report of each observer of a connection
        we dialled: a verdict needs at least ``min_observers`` of them and a majority."""
        kept = sum(self._ports_kept.values())
        changed = len(self._ports_kept) - kept
        if changed >= min_observers and changed > kept:
            return PortMapping.CHANGED
        if kept >= min_observers and kept > changed:
            return PortMapping.KEPT
        return PortMapping.UNKNOWN
