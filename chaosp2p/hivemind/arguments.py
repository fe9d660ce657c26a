"""Which hivemind 1.1.12 arguments the drop-in honours, what each becomes, and which it refuses.

Every keyword argument of ``hivemind.DHT`` and ``hivemind.Optimizer`` falls into one of three groups:

* **Mapped**: it has a chaosp2p meaning (``host_maddrs`` -> listen addresses,
  ``averaging_timeout`` -> the round timeout floor, ...). The table is in the package docstring.
* **Accepted at hivemind's default only**: the argument switches on something chaosp2p does not
  have (relays, client mode, auxiliary peers, delayed updates, ...). Left at hivemind's default
  value it asks for nothing, so the call goes through; any other value raises a
  :class:`~chaosp2p.errors.ConfigError` that names every such argument at once.
* **Unknown**: a name hivemind does not take either. Also a :class:`ConfigError` (hivemind forwards
  stray DHT keywords to its P2P daemon, which refuses them).

Nothing is ignored silently. This module is pure: it turns arguments into chaosp2p configuration
objects without starting anything, so the unit tests check the mapping directly.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chaosp2p.errors import ConfigError
from chaosp2p.hivemind.compression import CompressionBase, NoCompression
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.training.config import CollaborationConfig
from chaosp2p.wire.multiaddr import Multiaddr

HIVEMIND_DEFAULT_HOST_MADDRS = ("/ip4/127.0.0.1/tcp/0",)
"""hivemind listens on loopback unless told otherwise (so does the drop-in)."""

# hivemind.DHT forwards its **kwargs to DHTNode.create and P2P.create: these are their defaults.
DHT_DEFAULT_ONLY: dict[str, Any] = {
    "p2p": None,
    "num_workers": 4,
    "record_validators": (),
    "node_id": None,
    "bucket_size": 20,
    "num_replicas": 5,
    "depth_modulo": 5,
    "parallel_rpc": None,
    "wait_timeout": 3,
    "refresh_timeout": None,
    "bootstrap_timeout": None,
    "cache_locally": True,
    "cache_nearest": 1,
    "cache_size": None,
    "cache_refresh_before_expiry": 5,
    "cache_on_store": True,
    "reuse_get_requests": True,
    "chunk_size": 16,
    "blacklist_time": 5.0,
    "backoff_rate": 2.0,
    "client_mode": False,
    "record_validator": None,
    "authorizer": None,
    "ensure_bootstrap_success": True,
    "strict": True,
    "announce_maddrs": None,
    "auto_nat": True,
    "conn_manager": True,
    "dht_mode": "server",
    "force_reachability": None,
    "idle_timeout": 30,
    "nat_port_map": True,
    "relay_hop_limit": 0,
    "startup_timeout": 15,
    "tls": True,
    "use_auto_relay": False,
    "use_ipfs": False,
    "use_relay": True,
    "persistent_conn_max_msg_size": 4 * 1024**2,
    "quic": None,
    "use_relay_hop": None,
    "use_relay_discovery": None,
    "check_if_identity_free": True,
    "no_listen": False,
    "trusted_relays": None,
}

OPTIMIZER_DEFAULT_ONLY: dict[str, Any] = {
    "next_chunk_timeout": None,
    "reuse_grad_buffers": False,
    "delay_optimizer_step": None,
    "delay_grad_averaging": False,
    "average_state_every": 1,
    "client_mode": None,
    "auxiliary": False,
    "grad_averager_factory": None,
    "load_state_compression": NoCompression(),
    "average_opt_statistics": (),
    "extra_tensors": (),
    "averager_opts": None,
    "tracker_opts": None,
    "performance_ema_alpha": 0.1,
}

WHY_UNSUPPORTED: dict[str, str] = {
    "client_mode": "every chaosp2p peer accepts connections (no client mode)",
    "auxiliary": "every member of a run trains (no auxiliary averaging-only peers)",
    "reuse_grad_buffers": "the drop-in accumulates gradients in its own buffers; call zero_grad() as usual",
    "delay_optimizer_step": "chaosp2p steps the optimizer inside step() (no delayed updates)",
    "delay_grad_averaging": "chaosp2p averages inside step() (no delayed gradient averaging)",
    "average_state_every": "with use_local_updates=True parameters are averaged every epoch",
    "load_state_compression": "state transfer is exact (bit-identical joins)",
    "announce_maddrs": "chaosp2p advertises the addresses it listens on",
    "use_ipfs": "chaosp2p does not bootstrap from IPFS",
    "tls": "chaosp2p always encrypts (Noise); it cannot be switched off",
}

_COMPRESSION_WIRE_DTYPES = {"NoCompression": "float32", "Float16Compression": "float16"}


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(default, CompressionBase):
        # by name: hivemind's own compression objects say the same as the drop-in's
        return type(value).__name__ == type(default).__name__
    if isinstance(default, tuple) and not default:
        return value is None or (isinstance(value, Iterable) and not isinstance(value, str) and not list(value))
    if default is None:
        # hivemind reads None as "off" (or "derive it"): False and empty option dicts say the same.
        return value is None or value is False or (isinstance(value, Mapping) and not value)
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    return bool(value == default)


def refuse_unsupported(component: str, given: Mapping[str, Any], defaults: Mapping[str, Any]) -> None:
    """Raise one :class:`ConfigError` naming every argument in ``given`` that cannot be honoured.

    ``given`` holds the keywords that are not mapped; each must be a known hivemind argument left
    at its hivemind default.
    """
    unknown = sorted(name for name in given if name not in defaults)
    refused = sorted(name for name in given if name in defaults and not _is_default(given[name], defaults[name]))
    problems = []
    if unknown:
        problems.append(f"unknown argument(s) {', '.join(unknown)} (not taken by hivemind 1.1.12's {component} either)")
    for name in refused:
        reason = WHY_UNSUPPORTED.get(name, "not supported by chaosp2p's drop-in")
        problems.append(f"{name}={given[name]!r} is not supported: {reason} (hivemind's default {defaults[name]!r} is)")
    if problems:
        raise ConfigError(f"chaosp2p.hivemind.{component}: " + "; ".join(problems))


# ------------------------------------------------------------------------------------------ DHT
def _addresses(name: str, values: Sequence[Any] | None) -> tuple[str, ...]:
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ConfigError(f"{name} must be a list of multiaddrs (got {type(values).__name__})")
    texts = tuple(str(value) for value in values)
    for text in texts:
        try:
            Multiaddr.parse(text)
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    return texts


def is_loopback(text: str) -> bool:
    """Whether a listen multiaddr only accepts connections from this machine."""
    address = Multiaddr.parse(text)
    if address.host_kind in ("dns", "dns4", "dns6"):
        return address.host == "localhost"
    return ipaddress.ip_address(address.host).is_loopback


def dht_peer_config(
    *,
    initial_peers: Sequence[Any] | None,
    host_maddrs: Sequence[Any] | None,
    identity_path: str | None,
    base: PeerConfig | None = None,
) -> PeerConfig:
    """The :class:`PeerConfig` a ``hivemind.DHT(...)`` call stands for.

    The profile follows where the peer listens: loopback only (hivemind's default, and the
    quickstart's two peers on one machine) gets the ``local`` profile, whose timeouts suit a
    machine talking to itself; any other address (``/ip4/0.0.0.0/tcp/0``) means peers on other
    machines, so the ``lan`` profile's longer timeouts. Internet-wide runs should pass a ``wan``
    ``base`` (``peer_config=`` of :class:`chaosp2p.hivemind.DHT`); hivemind has no such knob.
    """
    listen = _addresses("host_maddrs", host_maddrs if host_maddrs is not None else HIVEMIND_DEFAULT_HOST_MADDRS)
    bootstrap = _addresses("initial_peers", initial_peers)
    if base is None:
        profile = "local" if listen and all(is_loopback(text) for text in listen) else "lan"
        base = PeerConfig.profile_named(profile)
    changes: dict[str, Any] = {"listen": listen, "bootstrap": bootstrap}
    if identity_path is not None:
        changes["identity_path"] = str(identity_path)
    return base.replace(**changes)


# ------------------------------------------------------------------------------------ Optimizer
@dataclass(frozen=True, slots=True, kw_only=True)
class OptimizerSettings:
    """What a ``hivemind.Optimizer(...)`` call asks of the collaboration, in chaosp2p terms."""

    mode: str
    """``sync`` (use_local_updates=False) or ``diloco`` (use_local_updates=True)."""
    target_batch_size: int
    batch_size_per_step: int | None
    wire_dtype: str
    round_timeout_min_s: float | None
    retry_wait_s: float | None
    join_timeout_s: float
    leave_timeout_s: float
    verbose: bool
    notes: tuple[str, ...] = ()
    """Arguments accepted but without effect, as hivemind also has them (logged at start)."""

    def collaboration_config(self, profile: str) -> CollaborationConfig:
        """The collaboration configuration on top of the peer's profile."""
        changes: dict[str, Any] = {
            "mode": self.mode,
            "global_batch": self.target_batch_size,
            "wire_dtype": self.wire_dtype,
            "join_timeout_s": self.join_timeout_s,
            # An epoch spans many step() calls, so a newcomer asks for the nearest one's snapshot,
            # and each member reports its throughput every epoch (shares follow it; negotiation only
            # acts on large changes).
            "snapshot_ahead_steps": 1,
            "rebalance_interval_steps": 1,
        }
        if self.mode == "diloco":
            # One outer step per epoch whose pseudo-gradient is the parameter difference: with an
            # outer SGD of lr 1 and no momentum, global - 1 * (global - average) is the average.
            changes.update(local_steps=1, outer_lr=1.0, outer_momentum=0.0)
        if self.round_timeout_min_s is not None:
            changes["round_timeout_min_s"] = self.round_timeout_min_s
        if self.retry_wait_s is not None:
            changes["retry_wait_s"] = self.retry_wait_s
        return CollaborationConfig.profile_named(profile).replace(**changes)


def wire_dtype_of(name: str, compression: Any) -> str:
    """The wire format for a hivemind compression object (``None``: no compression)."""
    if compression is None:
        return "float32"
    kind = type(compression).__name__
    if kind not in _COMPRESSION_WIRE_DTYPES:
        raise ConfigError(
            f"{name}={kind}() is not supported: chaosp2p averages as float32 or float16 "
            f"(use NoCompression() or Float16Compression())"
        )
    return _COMPRESSION_WIRE_DTYPES[kind]


def _seconds(name: str, value: float | None, *, allow_none: bool = True) -> float | None:
    if value is None:
        if not allow_none:
            raise ConfigError(f"{name} must be a number of seconds")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number of seconds (got {value!r})")
    return float(value)


def optimizer_settings(
    *,
    target_batch_size: int,
    batch_size_per_step: int | None,
    use_local_updates: bool,
    matchmaking_time: float | None,
    averaging_timeout: float | None,
    allreduce_timeout: float | None,
    load_state_timeout: float,
    shutdown_timeout: float,
    grad_compression: Any,
    state_averaging_compression: Any,
    delay_state_averaging: bool,
    verbose: bool,
    unsupported: Mapping[str, Any],
) -> OptimizerSettings:
    """Check a ``hivemind.Optimizer`` call's arguments and map them (see the package docstring)."""
    refuse_unsupported("Optimizer", unsupported, OPTIMIZER_DEFAULT_ONLY)
    if isinstance(target_batch_size, bool) or not isinstance(target_batch_size, int) or target_batch_size <= 0:
        raise ConfigError(f"target_batch_size must be a positive int (got {target_batch_size!r})")
    if batch_size_per_step is not None and (
        isinstance(batch_size_per_step, bool) or not isinstance(batch_size_per_step, int) or batch_size_per_step <= 0
    ):
        raise ConfigError(f"batch_size_per_step must be a positive int or None (got {batch_size_per_step!r})")
    if not isinstance(delay_state_averaging, bool):
        raise ConfigError("delay_state_averaging must be a bool")
    notes = []
    if use_local_updates:
        wire = wire_dtype_of("state_averaging_compression", state_averaging_compression)
        if grad_compression is not None and type(grad_compression).__name__ != "NoCompression":
            wire_dtype_of("grad_compression", grad_compression)
            notes.append("grad_compression has no effect with use_local_updates=True (no gradients are averaged)")
    else:
        wire = wire_dtype_of("grad_compression", grad_compression)
        if state_averaging_compression is not None and type(state_averaging_compression).__name__ != "NoCompression":
            wire_dtype_of("state_averaging_compression", state_averaging_compression)
            notes.append(
                "state_averaging_compression has no effect with use_local_updates=False: averaged gradients "
                "keep every member's parameters identical, so there are no parameters to average"
            )
    round_floor = _seconds("allreduce_timeout", allreduce_timeout)
    if round_floor is None:
        round_floor = _seconds("averaging_timeout", averaging_timeout)
    join_timeout = _seconds("load_state_timeout", load_state_timeout, allow_none=False)
    leave_timeout = _seconds("shutdown_timeout", shutdown_timeout, allow_none=False)
    assert join_timeout is not None and leave_timeout is not None
    return OptimizerSettings(
        mode="diloco" if use_local_updates else "sync",
        target_batch_size=target_batch_size,
        batch_size_per_step=batch_size_per_step,
        wire_dtype=wire,
        round_timeout_min_s=round_floor,
        retry_wait_s=_seconds("matchmaking_time", matchmaking_time),
        join_timeout_s=join_timeout,
        leave_timeout_s=leave_timeout,
        verbose=bool(verbose),
        notes=tuple(notes),
    )
