"""``hivemind.utils.multiaddr.Multiaddr``: a multiaddr as hivemind scripts handle it.

hivemind hands out objects of the ``multiaddr`` package: ``addr["p2p"]`` is the peer id,
``"ip4" in addr`` asks for a protocol, ``addr.values()`` lists the values, ``str(addr)`` gives
the text. This class offers that interface over the text form; chaosp2p itself dials only
``/ip4|ip6|dns*/<host>/tcp/<port>[/p2p/<id>]`` (:class:`chaosp2p.wire.multiaddr.Multiaddr`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chaosp2p.errors import ConfigError

# protocol name -> whether a value follows it (the protocols hivemind scripts meet)
_PROTOCOLS: dict[str, bool] = {
    "ip4": True,
    "ip6": True,
    "dns": True,
    "dns4": True,
    "dns6": True,
    "tcp": True,
    "udp": True,
    "quic": False,
    "quic-v1": False,
    "p2p": True,
    "ipfs": True,
    "p2p-circuit": False,
    "ws": False,
    "wss": False,
    "tls": False,
}


def _parse(text: str) -> tuple[tuple[str, str | None], ...]:
    parts = text.split("/")
    if len(parts) < 2 or parts[0] != "":
        raise ConfigError(f"invalid multiaddr {text!r}: it must start with '/'")
    items: list[tuple[str, str | None]] = []
    rest = parts[1:]
    while rest:
        name, *rest = rest
        if name not in _PROTOCOLS:
            raise ConfigError(f"invalid multiaddr {text!r}: unknown protocol {name!r}")
        value = None
        if _PROTOCOLS[name]:
            if not rest or not rest[0]:
                raise ConfigError(f"invalid multiaddr {text!r}: /{name} needs a value")
            value, *rest = rest
        items.append(("p2p" if name == "ipfs" else name, value))
    return tuple(items)


class Multiaddr:
    """A multiaddr with the ``multiaddr`` package's interface (see the module docstring)."""

    __slots__ = ("_items",)

    def __init__(self, addr: str | bytes | Any) -> None:
        if isinstance(addr, bytes):
            addr = addr.decode()
        self._items = _parse(str(addr))

    def protocols(self) -> list[str]:
        """The protocol names, in order (``["ip4", "tcp", "p2p"]``)."""
        return [name for name, _ in self._items]

    keys = protocols

    def values(self) -> list[str]:
        """The values, in order (``["127.0.0.1", "4001", "12D3KooW..."]``)."""
        return [value for _, value in self._items if value is not None]

    def items(self) -> list[tuple[str, str | None]]:
        """``(protocol, value)`` pairs, in order."""
        return list(self._items)

    def value_for_protocol(self, proto: str) -> str | None:
        """The value after ``proto``; ``KeyError`` (hivemind: ProtocolLookupError) if absent."""
        for name, value in self._items:
            if name == proto:
                return value
        raise KeyError(f"multiaddr {self} has no /{proto}")

    def __getitem__(self, proto: str) -> str | None:
        return self.value_for_protocol(proto)

    def __contains__(self, proto: object) -> bool:
        return any(name == proto for name, _ in self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self.protocols())

    def __len__(self) -> int:
        return len(self._items)

    def decapsulate(self, other: str | Multiaddr) -> Multiaddr:
        """This address without the last occurrence of ``other`` and what follows it."""
        text, tail = str(self), str(other)
        index = text.rfind(tail)
        return Multiaddr(text if index < 0 else text[:index])

    def encapsulate(self, other: str | Multiaddr) -> Multiaddr:
        """This address followed by ``other``."""
        return Multiaddr(str(self) + str(other))

    def to_bytes(self) -> bytes:
        """The text form as bytes (hivemind's is the binary multiaddr; only equality relies on it)."""
        return str(self).encode()

    def __str__(self) -> str:
        return "".join(f"/{name}" + (f"/{value}" if value is not None else "") for name, value in self._items)

    def __repr__(self) -> str:
        return f"<Multiaddr {self}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Multiaddr) and self._items == other._items

    def __hash__(self) -> int:
        return hash(self._items)


__all__ = ["Multiaddr"]
