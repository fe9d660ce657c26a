"""Transport configuration: limits, timeouts and windows, with local/lan/wan profiles."""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaosp2p.configbase import require, require_positive
from chaosp2p.protocols.channel.mux import MuxLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class TransportConfig:
    """How a peer's connections behave and what they tolerate from remote peers.

    Every ``max_*`` bounds something a remote peer controls; it is checked before memory is taken.
    """

    max_frame_bytes: int = 1 << 20
    """Largest msgpack message (control frames, RPC requests and responses)."""
    max_record_bytes: int = 1 << 20
    """Largest encrypted record payload; bulk data is cut into records of at most this size."""
    initial_window_bytes: int = 256 * 1024
    """Receive window every new stream starts with (bounds memory per idle stream)."""
    max_window_bytes: int = 64 << 20
    """Largest window a stream may raise itself to for bulk transfers."""
    max_streams_per_connection: int = 256
    max_streams_per_peer: int = 512
    """Streams one remote peer may have open towards us over all its connections."""
    max_buffered_bytes_per_peer: int = 64 << 20
    """Receive window (memory it may fill before we read) one remote peer's streams may hold in all."""
    max_buffered_bytes_total: int = 1 << 30
    """Receive window all remote peers' streams may hold together."""
    handler_idle_timeout_s: float = 300.0
    """Cancel a stream handler (and reset its stream) when no byte moved on the stream for this long."""
    max_tracked_peers: int = 4096
    """Per-peer tables (address book, bandwidth estimates) keep this many peers, least recent go first."""
    max_connections: int = 1024
    max_pending_handshakes: int = 64
    """Inbound connections still handshaking; when full, a newcomer evicts the oldest (slowloris guard)."""
    max_pending_handshakes_per_address: int = 16
    """Inbound handshakes from one IP address; a newcomer from that address evicts its oldest one.

    (Values above ``max_pending_handshakes`` act as ``max_pending_handshakes``.)"""
    connect_timeout_s: float = 5.0
    relay_after_s: float = 1.0
    """Head start of a direct dial over a relayed one when reaching a peer that may sit behind NAT
    (:func:`~chaosp2p.transport.reach.reach`): a dial that works completes well within it, and one
    that does not is not waited for until ``connect_timeout_s``."""
    first_message_timeout_s: float = 2.0
    """An inbound connection must deliver its whole first handshake message within this long.

    (Capped by ``handshake_timeout_s``.) A dialer sends that message right after connecting, so
    only a connection that holds a slot while saying nothing waits this long."""
    handshake_timeout_s: float = 5.0
    handshake_max_clock_skew_s: float = 120.0
    """Under a swarm key, answer a handshake only if the time in its first message is within this
    of our wall clock (and its ephemeral key is new): a replayed first message gets no answer."""
    max_handshake_replay_entries: int = 16384
    """Ephemeral keys of recent first handshake messages remembered to refuse replays (swarm key only)."""
    max_connections_per_peer: int = 8
    """Inbound connections one remote identity may hold at once; more are closed right after the
    handshake, before their buffers exist (each connection costs up to two records of memory)."""
    request_timeout_s: float = 10.0
    keepalive_interval_s: float = 5.0
    """Ping an otherwise quiet connection this often."""
    dead_connection_timeout_s: float = 20.0
    """Close a connection that has received nothing (not even a pong) for this long."""
    idle_connection_timeout_s: float = 300.0
    """Close a connection with no streams and no messages in either direction for this long."""
    socket_buffer_bytes: int = 4 << 20
    max_upload_bytes_per_s: float | None = None
    """Cap on this host's total sending rate over all connections (``None``: unlimited)."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "max_frame_bytes",
            "max_record_bytes",
            "initial_window_bytes",
            "max_window_bytes",
            "max_streams_per_connection",
            "max_streams_per_peer",
            "max_buffered_bytes_per_peer",
            "max_buffered_bytes_total",
            "handler_idle_timeout_s",
            "max_tracked_peers",
            "max_connections",
            "max_pending_handshakes",
            "max_pending_handshakes_per_address",
            "connect_timeout_s",
            "first_message_timeout_s",
            "handshake_timeout_s",
            "handshake_max_clock_skew_s",
            "max_handshake_replay_entries",
            "max_connections_per_peer",
            "request_timeout_s",
            "keepalive_interval_s",
            "dead_connection_timeout_s",
            "idle_connection_timeout_s",
            "socket_buffer_bytes",
        )
        require(self.relay_after_s >= 0, "relay_after_s must be >= 0 (0: try the relays alongside the direct dial)")
        require(self.max_record_bytes <= 16 << 20, "max_record_bytes must be at most 16 MiB")
        require(
            self.max_upload_bytes_per_s is None or self.max_upload_bytes_per_s > 0,
            "max_upload_bytes_per_s must be > 0 (or unset for no limit)",
        )
        require(self.max_frame_bytes <= 64 << 20, "max_frame_bytes must be at most 64 MiB")
        require(
            self.initial_window_bytes <= self.max_window_bytes <= 1 << 30,
            "need initial_window_bytes <= max_window_bytes <= 1 GiB",
        )
        require(
            self.initial_window_bytes <= self.max_buffered_bytes_per_peer <= self.max_buffered_bytes_total,
            "need initial_window_bytes <= max_buffered_bytes_per_peer <= max_buffered_bytes_total",
        )
        require(
            self.dead_connection_timeout_s > self.keepalive_interval_s,
            "dead_connection_timeout_s must exceed keepalive_interval_s",
        )

    @property
    def mux_limits(self) -> MuxLimits:
        """The subset the stream multiplexer enforces."""
        return MuxLimits(
            max_record_bytes=self.max_record_bytes,
            initial_window_bytes=self.initial_window_bytes,
            max_window_bytes=self.max_window_bytes,
            max_streams=self.max_streams_per_connection,
        )

    @classmethod
    def local(cls) -> TransportConfig:
        """One machine (loopback): short timeouts, failures show up fast.

        Every peer dials from 127.0.0.1 here, so the per-address handshake cap is the whole table.
        """
        return cls(
            connect_timeout_s=2.0,
            relay_after_s=0.5,  # a loopback dial takes milliseconds, a handshake on a loaded machine more
            first_message_timeout_s=1.0,
            max_pending_handshakes_per_address=64,
            handshake_timeout_s=2.0,
            request_timeout_s=5.0,
            keepalive_interval_s=1.0,
            dead_connection_timeout_s=5.0,
            handler_idle_timeout_s=60.0,
        )

    @classmethod
    def lan(cls) -> TransportConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> TransportConfig:
        """The open internet between institutions: long RTTs, larger windows for bandwidth-delay."""
        return replace(
            cls(),
            connect_timeout_s=10.0,
            relay_after_s=3.0,  # TCP and the handshake take about 3 round trips, up to 300 ms each
            first_message_timeout_s=5.0,
            handshake_timeout_s=10.0,
            request_timeout_s=30.0,
            keepalive_interval_s=10.0,
            dead_connection_timeout_s=45.0,
            handler_idle_timeout_s=600.0,
            max_buffered_bytes_per_peer=256 << 20,
            initial_window_bytes=1 << 20,
            max_window_bytes=256 << 20,
        )
