"""Which hivemind 1.1.12 arguments the drop-in honours, what each becomes, and which it refuses.

Every keyword argument of ``hivemind.DHT`` and ``hivemind.Optimizer`` falls into one of four groups:

* **Mapped**: it has a chaosp2p meaning (``host_maddrs`` -> listen addresses,
  ``averaging_timeout`` -> the round timeout floor, ...). The table is in the README's compat table.
* **Accepted without effect** (``IGNORE``): tuning of something chaosp2p does differently (Kademlia
  caches, relays, delayed updates, averager and tracker options, client mode, ...). Any value is
  accepted; values other than hivemind's default are named, each with its reason, in one warning.
* **Refused** (``REFUSE``): accepting would change results or weaken a guarantee (auxiliary peers,
  extra averaged tensors, custom gradient averagers, an authorizer, IPFS discovery); some only
  with ``use_local_updates=True``, where they would change what is averaged. Each refusal says why,
  and all of a call's refusals come in one :class:`~chaosp2p.errors.ConfigError`.
* **Unknown**: a name hivemind does not take either. Also a :class:`ConfigError` (hivemind forwards
  stray DHT keywords to its P2P daemon, which refuses them).

Nothing is ignored silently. This module is pure: it turns arguments into chaosp2p configuration
objects without starting anything, so the unit tests check the mapping directly.
"""

from __future__ import annotations

import dataclasses
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

IGNORE = "ignore"
REFUSE = "refuse"
REFUSE_WITH_LOCAL_UPDATES = "refuse with use_local_updates=True"


@dataclass(frozen=True, slots=True)
class Rule:
    """What the drop-in does with a hivemind argument given a value other than hivemind's default."""

    default: Any
    """hivemind 1.1.12's default (any value meaning the same is accepted silently)."""
    action: str
    """``IGNORE`` (accepted, named in one warning), ``REFUSE`` or ``REFUSE_WITH_LOCAL_UPDATES``."""
    reason: str
    """Why: the warning's or the error's text for this argument."""


_KADEMLIA = "Kademlia tuning: chaosp2p's DHT has its own (DHTConfig in PeerConfig)"
_DAEMON = "libp2p daemon tuning: chaosp2p has no separate daemon"
_RELAY = "NAT traversal through relays is not provided; the peer stays reachable only where it listens"

# hivemind.DHT forwards its **kwargs to DHTNode.create and P2P.create: these are their defaults.
DHT_ARGUMENTS: dict[str, Rule] = {
    "p2p": Rule(None, REFUSE, "a hivemind P2P instance cannot carry a chaosp2p peer (leave it out)"),
    "num_workers": Rule(4, IGNORE, "DHT requests run concurrently on the peer's event loop"),
    "node_id": Rule(None, IGNORE, "the DHT id is derived from the peer's identity"),
    "bucket_size": Rule(20, IGNORE, _KADEMLIA),
    "num_replicas": Rule(5, IGNORE, _KADEMLIA),
    "depth_modulo": Rule(5, IGNORE, _KADEMLIA),
    "parallel_rpc": Rule(None, IGNORE, _KADEMLIA),
    "wait_timeout": Rule(3, IGNORE, _KADEMLIA),
    "refresh_timeout": Rule(None, IGNORE, _KADEMLIA),
    "bootstrap_timeout": Rule(None, IGNORE, _KADEMLIA),
    "cache_locally": Rule(True, IGNORE, _KADEMLIA),
    "cache_nearest": Rule(1, IGNORE, _KADEMLIA),
    "cache_size": Rule(None, IGNORE, _KADEMLIA),
    "cache_refresh_before_expiry": Rule(5, IGNORE, _KADEMLIA),
    "cache_on_store": Rule(True, IGNORE, _KADEMLIA),
    "reuse_get_requests": Rule(True, IGNORE, _KADEMLIA),
    "chunk_size": Rule(16, IGNORE, _KADEMLIA),
    "blacklist_time": Rule(5.0, IGNORE, _KADEMLIA),
    "backoff_rate": Rule(2.0, IGNORE, _KADEMLIA),
    "strict": Rule(True, IGNORE, _KADEMLIA),
    "client_mode": Rule(
        False, IGNORE, "this peer still accepts connections and serves the DHT (chaosp2p has no client mode)"
    ),
    "dht_mode": Rule("server", IGNORE, "every chaosp2p peer serves the DHT (no client mode)"),
    "no_listen": Rule(False, IGNORE, "every chaosp2p peer listens (no client mode)"),
    "record_validator": Rule(None, IGNORE, "pass record_validators= to DHT() instead"),
    "authorizer": Rule(
        None,
        REFUSE,
        "chaosp2p admits peers by swarm key or allowlist (PeerConfig), and ignoring an authorizer would "
        "let in peers it refuses",
    ),
    "announce_maddrs": Rule(
        None, IGNORE, "chaosp2p announces the addresses it listens on (an address behind NAT cannot be announced)"
    ),
    "auto_nat": Rule(True, IGNORE, _RELAY),
    "conn_manager": Rule(True, IGNORE, _DAEMON),
    "force_reachability": Rule(None, IGNORE, _RELAY),
    "idle_timeout": Rule(30, IGNORE, _DAEMON),
    "nat_port_map": Rule(True, IGNORE, _RELAY),
    "relay_hop_limit": Rule(0, IGNORE, _RELAY),
    "tls": Rule(True, IGNORE, "chaosp2p always encrypts (Noise); it cannot be switched off"),
    "use_auto_relay": Rule(False, IGNORE, _RELAY),
    "use_ipfs": Rule(
        False, REFUSE, "chaosp2p cannot find initial peers through IPFS: pass full multiaddrs as initial_peers"
    ),
    "use_relay": Rule(True, IGNORE, _RELAY),
    "persistent_conn_max_msg_size": Rule(4 * 1024**2, IGNORE, _DAEMON),
    "quic": Rule(None, IGNORE, "chaosp2p listens on TCP only"),
    "use_relay_hop": Rule(None, IGNORE, _RELAY),
    "use_relay_discovery": Rule(None, IGNORE, _RELAY),
    "check_if_identity_free": Rule(True, IGNORE, _DAEMON),
    "trusted_relays": Rule(None, IGNORE, _RELAY),
}
"""Every hivemind DHT keyword the drop-in does not map, with what it does with another value."""

OPTIMIZER_ARGUMENTS: dict[str, Rule] = {
    "next_chunk_timeout": Rule(None, IGNORE, "a round is bounded by averaging_timeout as a whole"),
    "delay_optimizer_step": Rule(
        None, IGNORE, "the optimizer steps inside step(), never later than hivemind's delayed step would"
    ),
    "delay_grad_averaging": Rule(False, IGNORE, "gradients are averaged inside step(), not in the background"),
    "average_state_every": Rule(
        1,
        REFUSE_WITH_LOCAL_UPDATES,
        "averaged gradients keep every member's parameters identical, so averaging them is a no-op; with "
        "use_local_updates=True parameters are averaged every epoch here, and fewer averages change results",
    ),
    "client_mode": Rule(None, IGNORE, "this peer accepts connections and is a full member of the run"),
    "auxiliary": Rule(
        False,
        REFUSE,
        "every member of a run trains here; an averaging-only peer has no counterpart (a DHT-only peer can "
        "watch the run)",
    ),
    "grad_averager_factory": Rule(
        None,
        REFUSE,
        "a custom gradient averager (e.g. PowerSGD) changes what is averaged; chaosp2p averages "
        "exact (or float16) gradients",
    ),
    "load_state_compression": Rule(NoCompression(), IGNORE, "state downloads are exact (bit-identical joins)"),
    "average_opt_statistics": Rule(
        (),
        REFUSE_WITH_LOCAL_UPDATES,
        "with averaged gradients every member holds the same optimizer state; with use_local_updates=True each "
        "member keeps its own, and averaging statistics would change results",
    ),
    "extra_tensors": Rule(
        (),
        REFUSE,
        "extra tensors would be averaged with the parameters; chaosp2p averages the optimizer's parameters only",
    ),
    "averager_opts": Rule(
        None, IGNORE, "group sizes, bandwidth and matchmaking are decided by the run's agreed configuration"
    ),
    "tracker_opts": Rule(None, IGNORE, "every member learns the epoch from the run's agreed configuration"),
    "performance_ema_alpha": Rule(0.1, IGNORE, "throughput is measured over each epoch"),
}
"""Every hivemind Optimizer keyword the drop-in does not map, with what it does with another value."""

_COMPRESSION_WIRE_DTYPES = {"NoCompression": "float32", "Float16Compression": "float16"}


def _is_default(value: Any, default: Any) -> bool:
    if isinstance(default, CompressionBase):
        # by name: hivemind's own compression objects say the same as the drop-in's
        return type(value).__name__ == type(default).__name__
    if isinstance(default, tuple) and not default:
        return value is None or (isinstance(value, Iterable) and not isinstance(value, str) and not list(value))
    if default is None:
        # hivemind reads None as "off" (or "derive it"): False and empty lists or dicts say the same.
        return value is None or value is False or (isinstance(value, (Mapping, list, tuple)) and not value)
    if isinstance(default, bool) or isinstance(value, bool):
        return value is default
    return bool(value == default)


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(sorted(str(key) for key in value)) + "}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_arguments(
    component: str, given: Mapping[str, Any], rules: Mapping[str, Rule], *, local_updates: bool = False
) -> tuple[str, ...]:
    """Check the keywords in ``given`` against ``rules``; return one note per argument accepted without effect.

    Unknown names and refused values raise one :class:`ConfigError` naming each, with its reason.
    """
    unknown = sorted(name for name in given if name not in rules)
    problems, ignored = [], []
    if unknown:
        problems.append(f"unknown argument(s) {', '.join(unknown)} (not taken by hivemind 1.1.12's {component} either)")
    for name in sorted(set(given) - set(unknown)):
        rule = rules[name]
        if _is_default(given[name], rule.default):
            continue
        refused = rule.action == REFUSE or (rule.action == REFUSE_WITH_LOCAL_UPDATES and local_updates)
        if refused:
            problems.append(f"{name}={_shown(given[name])} is not supported: {rule.reason}")
        else:
            ignored.append(f"{name}={_shown(given[name])} ({rule.reason})")
    if problems:
        raise ConfigError(f"chaosp2p.hivemind.{component}: " + "; ".join(problems))
    return tuple(ignored)


def ignored_warning(component: str, notes: Sequence[str]) -> str:
    """The one warning naming every argument accepted without effect."""
    return f"chaosp2p.hivemind.{component}: accepted without effect here: " + "; ".join(notes)


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


def udp_listen_addresses(host_maddrs: Sequence[Any] | None) -> tuple[str, ...]:
    """The QUIC (``/udp/...``) listen addresses in ``host_maddrs``: dropped (TCP only), with a warning."""
    if host_maddrs is None or isinstance(host_maddrs, (str, bytes)) or not isinstance(host_maddrs, Sequence):
        return ()
    return tuple(str(text) for text in host_maddrs if "/udp/" in str(text) and "/quic" in str(text))


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
    given = host_maddrs if host_maddrs is not None else HIVEMIND_DEFAULT_HOST_MADDRS
    quic = udp_listen_addresses(given)
    listen = _addresses("host_maddrs", [text for text in given if str(text) not in quic])
    if quic and not listen:
        raise ConfigError(f"host_maddrs: chaosp2p listens on TCP only; add a /tcp/ address beside {', '.join(quic)}")
    bootstrap = _addresses("initial_peers", initial_peers)
    if base is None:
        profile = "local" if listen and all(is_loopback(text) for text in listen) else "lan"
        base = PeerConfig.profile_named(profile)
        # A change (a newcomer's admission above all) takes effect at the epoch under way, as a
        # hivemind peer adds its samples to it: a member enters an epoch's round only when its
        # share is done, seconds after a decision that takes milliseconds. The default margin of
        # two steps suits steps of milliseconds; here it would make a newcomer wait a whole epoch.
        base = base.replace(negotiation=dataclasses.replace(base.negotiation, max_margin_steps=1))
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
    reuse_grad_buffers: bool = False
    """Gradients accumulate in ``.grad`` across calls (the script never calls ``zero_grad()``)."""
    notes: tuple[str, ...] = ()
    """Arguments accepted but without effect, as hivemind also has them (logged at start)."""
    ignored: tuple[str, ...] = ()
    """Tuning arguments accepted without effect here, each with its reason (one warning at start)."""

    def collaboration_config(self, profile: str) -> CollaborationConfig:
        """The collaboration configuration on top of the peer's profile."""
        changes: dict[str, Any] = {
            "mode": self.mode,
            "global_batch": self.target_batch_size,
            "wire_dtype": self.wire_dtype,
            "join_timeout_s": self.join_timeout_s,
            # An epoch spans many step() calls, so members keep a snapshot of every epoch they
            # complete (one copy per epoch) and a newcomer loads the last one at once instead of
            # waiting for the end of the epoch under way; each member reports its throughput every
            # epoch (shares follow it; negotiation only acts on large changes).
            "snapshot_ahead_steps": 0,
            "snapshot_every_step": True,
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
    reuse_grad_buffers: bool = False,
) -> OptimizerSettings:
    """Check a ``hivemind.Optimizer`` call's arguments and map them (see the package docstring)."""
    ignored = check_arguments("Optimizer", unsupported, OPTIMIZER_ARGUMENTS, local_updates=bool(use_local_updates))
    if not isinstance(reuse_grad_buffers, bool):
        raise ConfigError("reuse_grad_buffers must be a bool")
    if reuse_grad_buffers and use_local_updates:
        raise ConfigError("reuse_grad_buffers=True needs use_local_updates=False (no gradients are accumulated)")
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
        reuse_grad_buffers=reuse_grad_buffers,
        notes=tuple(notes),
        ignored=ignored,
    )
