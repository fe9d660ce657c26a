"""The server side's admission of dial-back requests (no I/O): who may make us dial, and where.

Cheap checks first: the requester's rate (a token bucket per PeerID) and the number of dial-backs
under way, before a single address is parsed. Then the addresses: only those whose IP is exactly
the requester's observed IP (where its connection to us comes from) are eligible, so a request can
make us dial the requester itself and nobody else; a ``/p2p`` suffix naming another peer, a DNS
name, port 0 or text that does not parse are skipped. What is left, deduplicated and cut to
``max_dials_per_request``, is what the driver dials.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from chaosp2p.errors import ChaosError
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.protocols.reachability.config import ReachabilityConfig
from chaosp2p.protocols.reachability.messages import DialBackCode, DialResponse, answer
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr


@dataclass(frozen=True, slots=True, kw_only=True)
class GateStatistics:
    """What a server's gate did since it started."""

    admitted: int
    refused_rate: int
    refused_busy: int
    refused_address: int
    active: int


class DialBackGate:
    """Admission of dial-back requests: rate per requester, dials at once, addresses at its own IP."""

    def __init__(self, config: ReachabilityConfig) -> None:
        self.config = config
        self._rate = RateLimiter(
            rate_per_s=config.requests_per_peer_per_s,
            burst=config.request_burst,
            max_senders=config.max_tracked_requesters,
        )
        self._active = 0
        self._admitted = 0
        self._refused_rate = 0
        self._refused_busy = 0
        self._refused_address = 0

    def admit(
        self, requester: PeerID, observed_ip: str, addrs: Sequence[str], now: float
    ) -> list[Multiaddr] | DialResponse:
        """The addresses to dial (the caller then owes a :meth:`release`), or the refusal to send."""
        if not self.config.serve:
            return answer(DialBackCode.DISABLED, "this peer does not dial back")
        if self._active >= self.config.max_concurrent_dials:
            self._refused_busy += 1
            return answer(DialBackCode.REFUSED, "too many dial-backs under way: ask later")
        if not self._rate.allow(requester, now):
            self._refused_rate += 1
            return answer(DialBackCode.REFUSED, "rate limit: ask later")
        eligible = eligible_addrs(requester, observed_ip, addrs)[: self.config.max_dials_per_request]
        if not eligible:
            self._refused_address += 1
            return answer(
                DialBackCode.BAD_REQUEST,
                f"no address at your observed IP {observed_ip} (other addresses are never dialed)",
            )
        self._active += 1
        self._admitted += 1
        return eligible

    def release(self) -> None:
        """One admitted dial-back ended."""
        self._active -= 1

    def statistics(self) -> GateStatistics:
        """Counters since start."""
        return GateStatistics(
            admitted=self._admitted,
            refused_rate=self._refused_rate,
            refused_busy=self._refused_busy,
            refused_address=self._refused_address,
            active=self._active,
        )


def eligible_addrs(requester: PeerID, observed_ip: str, addrs: Sequence[str]) -> list[Multiaddr]:
    """The addresses of ``addrs`` at exactly ``observed_ip`` (without ``/p2p``), deduplicated, in order."""
    try:
        observed = ipaddress.ip_address(observed_ip)
    except ValueError:
        return []
    eligible: list[Multiaddr] = []
    for text in addrs:
        try:
            addr = Multiaddr.parse(text)
        except (ChaosError, ValueError):
            continue
        if addr.host_kind not in ("ip4", "ip6") or addr.port == 0:
            continue
        if addr.peer_id is not None and addr.peer_id != requester:
            continue
        try:
            if ipaddress.ip_address(addr.host) != observed:
                continue
        except ValueError:
            continue
        bare = addr.without_peer()
        if bare not in eligible:
            eligible.append(bare)
    return eligible
