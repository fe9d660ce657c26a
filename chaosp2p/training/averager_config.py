"""Configuration of the averaging engine (``/chaos/average/1``), with local/lan/wan profiles."""

from __future__ import annotations

from dataclasses import dataclass, replace

from chaosp2p.configbase import require, require_positive

MIN_CHUNK_BYTES = 64 * 4
"""A chunk holds at least one aligned block of float32 elements."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AveragerConfig:
    """How averaging rounds move bytes and what they tolerate from peers.

    Every ``max_*`` bounds something a remote peer controls.
    """

    chunk_bytes: int = 4 << 20
    """Pipelining unit: an owner reduces a chunk as soon as every contribution's chunk is in."""
    window_bytes: int = 16 << 20
    """Receive window of a bulk averaging stream (how far a sender may run ahead of the reducer)."""
    header_timeout_s: float = 10.0
    """An inbound averaging stream must deliver its header within this."""
    pending_wait_s: float = 30.0
    """A contribution that arrives before the local round started waits at most this long for it."""
    max_pending_streams: int = 64
    """Early contributions held at once. Each holds at most the transport's initial stream window
    (256 KiB by default) of bytes, because its window is raised only once its round starts."""
    max_epochs_ahead: int = 8
    """Only contributions for rounds at most this many epochs ahead of ours are held. Several
    changes may be decided within one step and govern the next one (two LINK_UPs a few ms apart
    were seen): a member one step ahead can then be two or more epochs ahead, and refusing its
    contribution made it retry as the next attempt while the others waited for it in this one.
    What is held stays bounded by ``max_pending_streams`` and ``max_steps_ahead``."""
    max_steps_ahead: int = 2
    """... and at most this many steps ahead."""
    abort_notice_timeout_s: float = 1.0
    """Time spent telling contributors that a round failed (best effort)."""
    abort_grace_s: float = 1.0
    """After a round's timeout, wait at most this long for the owners' own reports of who is missing,
    so every member names the same culprit rather than whoever it happened to wait on."""
    pair_probe_timeout_s: float = 1.0
    """Once every other owner answered and only peers missing here alone hold the round up, each is
    pinged at the connection level; one that does not answer within this is a broken link: the
    round fails at once, naming it (``protocols/averaging.md`` section 4.5), instead of at its timeout."""
    max_weight: float = 1e30
    """Largest contribution weight accepted (keeps weighted sums far from overflow)."""
    history_rounds: int = 64
    """Outcomes of this many finished rounds are remembered to answer late contributions."""
    waiting_log_interval_s: float = 5.0
    """While a round waits, what it waits for (whom, which link, how long) is logged this often --
    every few seconds, not on every poll (see :mod:`chaosp2p.training.waiting`)."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "chunk_bytes",
            "window_bytes",
            "header_timeout_s",
            "pending_wait_s",
            "max_pending_streams",
            "abort_notice_timeout_s",
            "abort_grace_s",
            "pair_probe_timeout_s",
            "max_weight",
            "history_rounds",
            "waiting_log_interval_s",
        )
        require(self.chunk_bytes >= MIN_CHUNK_BYTES, f"chunk_bytes must be at least {MIN_CHUNK_BYTES}")
        require(self.chunk_bytes % MIN_CHUNK_BYTES == 0, f"chunk_bytes must be a multiple of {MIN_CHUNK_BYTES}")
        require(self.max_epochs_ahead >= 0 and self.max_steps_ahead >= 0, "max_*_ahead must be >= 0")

    @classmethod
    def local(cls) -> AveragerConfig:
        """One machine (loopback): failures show up fast."""
        return cls(header_timeout_s=5.0, pending_wait_s=15.0, abort_grace_s=0.5, pair_probe_timeout_s=0.5)

    @classmethod
    def lan(cls) -> AveragerConfig:
        """A data-center or campus network."""
        return cls()

    @classmethod
    def wan(cls) -> AveragerConfig:
        """The open internet: larger windows for the bandwidth-delay product, longer waits."""
        return replace(
            cls(),
            window_bytes=64 << 20,
            header_timeout_s=30.0,
            pending_wait_s=120.0,
            abort_notice_timeout_s=5.0,
            abort_grace_s=3.0,
            pair_probe_timeout_s=5.0,
        )
