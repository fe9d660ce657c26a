"""Multiaddrs, the libp2p text form of a peer's address.

Only the subset chaosp2p dials is accepted: ``/ip4|ip6|dns|dns4|dns6/<host>/tcp/<port>`` optionally
followed by ``/p2p/<peer-id>``. Anything else is refused with a :class:`ConfigError` that names the
offending part, rather than half-parsed.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.wire.identity import PeerID

_HOST_KINDS = ("ip4", "ip6", "dns", "dns4", "dns6")
_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
MAX_MULTIADDR_CHARS = 512


@dataclass(frozen=True, slots=True)
class Multiaddr:
    """A parsed TCP multiaddr, optionally naming the peer expected at that address."""

    host_kind: str
    host: str
    port: int
    peer_id: PeerID | None = None

    def __post_init__(self) -> None:
        if self.host_kind not in _HOST_KINDS:
            raise ConfigError(f"unsupported address kind /{self.host_kind} (use one of {_HOST_KINDS})")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"TCP port {self.port} out of range")
        _check_host(self.host_kind, self.host)

    @classmethod
    def parse(cls, text: str) -> Multiaddr:
        """Parse ``/ip4/127.0.0.1/tcp/4001[/p2p/<id>]`` and friends."""
        if len(text) > MAX_MULTIADDR_CHARS:
            raise ConfigError("multiaddr too long")
        parts = text.split("/")
        if len(parts) < 5 or parts[0] != "":
            raise ConfigError(f"invalid multiaddr {text!r}: expected /<ip4|ip6|dns>/<host>/tcp/<port>")
        _, kind, host, proto, port_text, *rest = parts
        if proto != "tcp":
            raise ConfigError(f"invalid multiaddr {text!r}: only /tcp transports are supported")
        if not port_text.isdigit():
            raise ConfigError(f"invalid multiaddr {text!r}: port {port_text!r} is not a number")
        peer_id: PeerID | None = None
        if rest:
            if len(rest) != 2 or rest[0] not in ("p2p", "ipfs"):
                raise ConfigError(f"invalid multiaddr {text!r}: only /p2p/<peer-id> may follow the port")
            peer_id = PeerID.parse(rest[1])
        return cls(kind, host, int(port_text), peer_id)

    def with_peer(self, peer_id: PeerID) -> Multiaddr:
        """The same address with ``/p2p/<peer_id>`` appended (or replaced)."""
        return Multiaddr(self.host_kind, self.host, self.port, peer_id)

    def without_peer(self) -> Multiaddr:
        """The same address without the ``/p2p`` part."""
        return Multiaddr(self.host_kind, self.host, self.port, None)

    def __str__(self) -> str:
        text = f"/{self.host_kind}/{self.host}/tcp/{self.port}"
        if self.peer_id is not None:
            text += f"/p2p/{self.peer_id}"
        return text

    @classmethod
    def from_socket_address(cls, host: str, port: int, peer_id: PeerID | None = None) -> Multiaddr:
        """Build a multiaddr from a numeric socket address."""
        kind = "ip6" if ":" in host else "ip4"
        return cls(kind, host, port, peer_id)


def _check_host(kind: str, host: str) -> None:
    if kind == "ip4":
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(f"{host!r} is not an IPv4 address") from None
    elif kind == "ip6":
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(f"{host!r} is not an IPv6 address") from None
    else:
        labels = host.rstrip(".").split(".")
        if not host or len(host) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
            raise ConfigError(f"{host!r} is not a valid DNS name")


def check_addr_texts(addrs: Sequence[str], *, max_count: int, max_chars: int, what: str) -> None:
    """Bound a list of address texts a peer sent (before any is parsed): at most ``max_count``,
    each at most ``max_chars`` characters; :class:`RemoteProtocolError` naming ``what`` otherwise."""
    if len(addrs) > max_count:
        raise RemoteProtocolError(f"{what}: more than {max_count} addresses")
    if any(len(a) > max_chars for a in addrs):
        raise RemoteProtocolError(f"{what}: an address longer than {max_chars} characters")
