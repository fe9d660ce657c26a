"""``PeerConfig``: everything one peer needs, composed from the per-component configs.

Profiles: :meth:`PeerConfig.local` (one machine), :meth:`PeerConfig.lan`, :meth:`PeerConfig.wan`.
A TOML file (``peers/*.toml``) names a base profile and overrides any field of any section::

    profile = "lan"
    [peer]
    listen = ["/ip4/0.0.0.0/tcp/4001"]
    [transport]
    request_timeout_s = 20
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosp2p.configbase import from_table, require, require_positive
from chaosp2p.dht.config import DHTConfig
from chaosp2p.errors import ConfigError
from chaosp2p.protocols.holepunch.config import HolePunchConfig
from chaosp2p.protocols.membership.config import MembershipConfig
from chaosp2p.protocols.negotiation.config import NegotiationConfig
from chaosp2p.protocols.reachability.config import ReachabilityConfig
from chaosp2p.protocols.relay.config import RelayConfig
from chaosp2p.protocols.relay.holding import ReservationConfig
from chaosp2p.protocols.transfer.config import TransferConfig
from chaosp2p.runtime.status import StatusConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.wire.multiaddr import Multiaddr

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

PROFILES = ("local", "lan", "wan")


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerConfig:
    """Configuration of one peer."""

    profile: str = "local"
    listen: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/0",)
    bootstrap: tuple[str, ...] = ()
    identity_path: str | None = None
    """Key file to load (or create with mode 0600); ``None`` makes a fresh identity per run."""
    swarm_key_path: str | None = None
    """Pre-shared swarm key: peers without the same key cannot complete a handshake."""
    bootstrap_retry_min_s: float = 0.5
    bootstrap_retry_max_s: float = 30.0
    mmap_threshold_bytes: int = 8 << 20
    """Buffers at least this large get their own mapping, returned to the OS when freed (glibc's
    ``mallopt``; :mod:`chaosp2p.runtime.allocator`): without it a long-lived peer's RSS grew at every
    snapshot it served. 0 leaves the process's allocator alone."""
    transport: TransportConfig = field(default_factory=TransportConfig.local)
    dht: DHTConfig = field(default_factory=DHTConfig.local)
    membership: MembershipConfig = field(default_factory=MembershipConfig.local)
    negotiation: NegotiationConfig = field(default_factory=NegotiationConfig.local)
    transfer: TransferConfig = field(default_factory=TransferConfig.local)
    status: StatusConfig = field(default_factory=StatusConfig)
    """Who sees what in this peer's status report (runs: their members, by default)."""
    relay: RelayConfig = field(default_factory=RelayConfig.local)
    """Relaying for others and accepting relayed connections (``[relay]``: ``enabled = false`` turns relaying off)."""
    reachability: ReachabilityConfig = field(default_factory=ReachabilityConfig.local)
    """Dial-back checks of this peer's reachability and dialing others back (``[reachability]``)."""
    holepunch: HolePunchConfig = field(default_factory=HolePunchConfig.local)
    """Upgrading relayed connections to direct ones (``[holepunch]``: ``enabled = false`` refuses)."""
    reservations: ReservationConfig = field(default_factory=ReservationConfig.local)
    """Relay slots this peer reserves while private, for the relay addresses it announces (``[reservations]``)."""

    def __post_init__(self) -> None:
        require(self.profile in PROFILES, f"profile must be one of {PROFILES} (got {self.profile!r})")
        require_positive(self, "bootstrap_retry_min_s", "bootstrap_retry_max_s")
        require(self.bootstrap_retry_min_s <= self.bootstrap_retry_max_s, "bootstrap_retry_min_s > _max_s")
        require(self.mmap_threshold_bytes >= 0, "mmap_threshold_bytes must be >= 0 (0: leave the allocator alone)")
        require(bool(self.listen) or bool(self.bootstrap), "a peer needs a listen address or a bootstrap peer")
        for text in (*self.listen, *self.bootstrap):
            Multiaddr.parse(text)

    def listen_addrs(self) -> list[Multiaddr]:
        """Parsed listen addresses."""
        return [Multiaddr.parse(text) for text in self.listen]

    def bootstrap_addrs(self) -> list[Multiaddr]:
        """Parsed bootstrap addresses."""
        return [Multiaddr.parse(text) for text in self.bootstrap]

    def replace(self, **changes: Any) -> PeerConfig:
        """A copy with fields replaced (lists become tuples)."""
        for key in ("listen", "bootstrap"):
            if key in changes and not isinstance(changes[key], tuple):
                changes[key] = tuple(changes[key])
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ profiles
    @classmethod
    def profile_named(cls, name: str, **changes: Any) -> PeerConfig:
        """The built-in profile ``name`` with ``changes`` applied."""
        if name == "local":
            return cls.local(**changes)
        if name == "lan":
            return cls.lan(**changes)
        if name == "wan":
            return cls.wan(**changes)
        raise ConfigError(f"unknown profile {name!r} (use one of {PROFILES} or a .toml file)")

    @classmethod
    def local(cls, **changes: Any) -> PeerConfig:
        """Everything on one machine: loopback, short timeouts, fast failure detection."""
        return cls(
            profile="local",
            transport=TransportConfig.local(),
            dht=DHTConfig.local(),
            membership=MembershipConfig.local(),
            negotiation=NegotiationConfig.local(),
            transfer=TransferConfig.local(),
            relay=RelayConfig.local(),
            reachability=ReachabilityConfig.local(),
            holepunch=HolePunchConfig.local(),
            reservations=ReservationConfig.local(),
        ).replace(**changes)

    @classmethod
    def lan(cls, **changes: Any) -> PeerConfig:
        """A data-center or campus network."""
        return cls(
            profile="lan",
            listen=("/ip4/0.0.0.0/tcp/4001",),
            transport=TransportConfig.lan(),
            dht=DHTConfig.lan(),
            membership=MembershipConfig.lan(),
            negotiation=NegotiationConfig.lan(),
            transfer=TransferConfig.lan(),
            relay=RelayConfig.lan(),
            reachability=ReachabilityConfig.lan(),
            holepunch=HolePunchConfig.lan(),
            reservations=ReservationConfig.lan(),
        ).replace(**changes)

    @classmethod
    def wan(cls, **changes: Any) -> PeerConfig:
        """Institutions across the internet: long timeouts, big windows."""
        return cls(
            profile="wan",
            listen=("/ip4/0.0.0.0/tcp/4001",),
            bootstrap_retry_max_s=120.0,
            transport=TransportConfig.wan(),
            dht=DHTConfig.wan(),
            membership=MembershipConfig.wan(),
            negotiation=NegotiationConfig.wan(),
            transfer=TransferConfig.wan(),
            relay=RelayConfig.wan(),
            reachability=ReachabilityConfig.wan(),
            holepunch=HolePunchConfig.wan(),
            reservations=ReservationConfig.wan(),
        ).replace(**changes)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str], **changes: Any) -> PeerConfig:
        """Load a profile file; ``changes`` (e.g. from the command line) win over the file."""
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read profile {file}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"profile {file} is not valid TOML: {exc}") from None
        return cls.from_mapping(data, source=str(file), **changes)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "<config>", **changes: Any) -> PeerConfig:
        """Build from a parsed TOML document (see the module docstring for its shape)."""
        data = dict(data)
        base_name = data.pop("profile", "local")
        if not isinstance(base_name, str):
            raise ConfigError(f"{source}: profile must be a string")
        base = cls.profile_named(base_name)
        sections = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if _is_component(f)}
        peer_table = data.pop("peer", {})
        if not isinstance(peer_table, Mapping):
            raise ConfigError(f"{source}: [peer] must be a table")
        updates: dict[str, Any] = {}
        for name, value in data.items():
            if name not in sections:
                raise ConfigError(f"{source}: unknown section [{name}] (known: peer, {', '.join(sections)})")
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: [{name}] must be a table")
            updates[name] = from_table(sections[name], value, section=f"{source} {name}")
        plain = {f.name for f in dataclasses.fields(base) if not _is_component(f)} - {"profile"}
        for key in peer_table:
            if key not in plain:
                raise ConfigError(f"{source}: [peer] has no setting {key!r} (known: {', '.join(sorted(plain))})")
        scalar = from_table(_PeerScalars.of(base), peer_table, section=f"{source} peer")
        updates.update({k: getattr(scalar, k) for k in plain})
        return base.replace(**updates).replace(**changes)


def _is_component(f: dataclasses.Field[Any]) -> bool:
    return f.name in (
        "transport",
        "dht",
        "membership",
        "negotiation",
        "transfer",
        "status",
        "relay",
        "reachability",
        "holepunch",
        "reservations",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class _PeerScalars:
    """The non-component fields of PeerConfig, so ``from_table`` can type-check a [peer] table."""

    listen: tuple[str, ...]
    bootstrap: tuple[str, ...]
    identity_path: str | None
    swarm_key_path: str | None
    bootstrap_retry_min_s: float
    bootstrap_retry_max_s: float
    mmap_threshold_bytes: int

    @classmethod
    def of(cls, config: PeerConfig) -> _PeerScalars:
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})
