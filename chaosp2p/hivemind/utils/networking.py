"""``hivemind.utils.networking``: ``choose_ip_address`` and ``log_visible_maddrs`` (hivemind's logic)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from ipaddress import ip_address
from typing import Any

from chaosp2p.hivemind.utils.logging import get_logger
from chaosp2p.hivemind.utils.multiaddr import Multiaddr

LOCALHOST = "127.0.0.1"

logger = get_logger(__name__)


def choose_ip_address(
    maddrs: Sequence[Any], prefer_global: bool = True, protocol_priority: Sequence[str] = ("ip4", "ip6")
) -> str:
    """The best IP among ``maddrs``: global before private (``prefer_global``), then IPv4 before IPv6."""
    parsed = [Multiaddr(addr) for addr in maddrs]
    for need_global in (prefer_global, not prefer_global):
        for protocol in protocol_priority:
            for addr in parsed:
                if protocol in addr:
                    value = addr[protocol]
                    if value is not None and ip_address(value).is_global == need_global:
                        return value
    raise ValueError(f"No IP address found among given multiaddrs: {list(maddrs)}")


def log_visible_maddrs(visible_maddrs: Iterable[Any], only_p2p: bool) -> None:
    """Log the ``--initial_peers`` others should pass to reach this peer, as hivemind does."""
    addrs = [Multiaddr(addr) for addr in visible_maddrs]
    if only_p2p:
        unique = {addr["p2p"] for addr in addrs if "p2p" in addr}
        initial_peers = " ".join(f"/p2p/{peer}" for peer in sorted(str(p) for p in unique))
    else:
        with_ip = [addr for addr in addrs if "ip4" in addr or "ip6" in addr]
        selected = addrs
        if with_ip:
            preferred = choose_ip_address(with_ip)
            selected = [addr for addr in addrs if preferred in str(addr)]
        initial_peers = " ".join(str(addr) for addr in selected)
    logger.info(f"Running a DHT instance. To connect other peers to this one, use --initial_peers {initial_peers}")
    logger.info(f"Full list of visible multiaddresses: {' '.join(str(addr) for addr in addrs)}")


__all__ = ["LOCALHOST", "choose_ip_address", "log_visible_maddrs"]
