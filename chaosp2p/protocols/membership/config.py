"""Configuration of the membership / link-detection machine.

One frozen dataclass, units in field names, validated in ``__post_init__``, with three profiles:

* ``local()`` -- peers on one machine (tests, the demo, the acceptance run): a crashed or stalled
  peer is declared failed in well under a second.
* ``lan()``   -- memberlist's LAN defaults (probe 1 s, timeout 0.5 s, suspicion 4 x log10(n) s).
* ``wan()``   -- memberlist's WAN defaults (probe 5 s, timeout 3 s, suspicion 6 x log10(n) s).

How the intervals combine is described in ``protocols/membership.md`` ("Timers").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from chaosp2p.configbase import require, require_non_negative, require_positive

MAX_INCARNATION = (1 << 53) - 1
"""Largest incarnation or info version accepted from the wire (and exact in a JSON double)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MembershipConfig:
    """Every knob of :class:`~chaosp2p.protocols.membership.MembershipMachine`."""

    # --- SWIM failure detection
    probe_interval_s: float = 1.0
    """One SWIM probe (round-robin over members) starts every interval."""
    probe_timeout_s: float = 0.5
    """Wait this long for a direct ACK before asking relays; relays wait as long for theirs."""
    indirect_probes: int = 3
    """k: how many relays a failed direct probe asks (PING_REQ)."""
    suspicion_mult: float = 4.0
    """Minimum suspicion timeout = suspicion_mult x max(1, log10(n)) x probe_interval_s."""
    suspicion_max_timeout_mult: float = 6.0
    """Maximum suspicion timeout = this x the minimum; confirmations shrink it toward the minimum."""
    suspicion_confirmations: int = 3
    """Independent confirmations that bring a suspicion down to the minimum timeout."""
    awareness_max: int = 8
    """Lifeguard local-health cap: probe timeouts are scaled by (1 + score), score <= this."""
    local_pause_threshold_s: float = 3.0
    """A gap this long between calls means we were paused (SIGSTOP, GC): draw no conclusions."""

    # --- overlay links
    max_link_degree: int = 6
    """Bound on the overlay links this peer heartbeats directly."""
    heartbeat_interval_s: float = 1.0
    """Every link gets a heartbeat PING this often."""
    link_down_after_missed: int = 2
    """Consecutive unanswered heartbeats that take a link down (a closed connection does at once)."""
    link_refresh_interval_s: float = 5.0
    """Links are re-chosen from candidates this often."""
    link_replace_improvement: float = 0.3
    """A candidate replaces the worst link only if its cost is lower by this fraction."""
    link_drop_down_after_s: float = 15.0
    """A link that stays down this long is replaced even if its member is not (yet) failed."""
    link_cost_reference_bytes: int = 4 << 20
    """Link cost = rtt + this many bytes / bandwidth: the size of a typical state shard."""
    info_report_interval_s: float = 5.0
    """How often this peer re-publishes its link summary when it changed noticeably."""

    # --- dissemination
    gossip_interval_s: float = 0.2
    """A dedicated GOSSIP message goes to gossip_fanout random members this often (if any news)."""
    gossip_fanout: int = 3
    retransmit_mult: int = 4
    """Each update is sent retransmit_mult x ceil(log10(n + 1)) times, piggybacked or gossiped."""
    info_retransmit_mult: int = 2
    """The same for info records: bulkier and less urgent, and push-pull carries them too."""
    max_gossip_items_per_message: int = 12
    """Membership updates carried by one message (sent and accepted)."""
    max_info_items_per_message: int = 4
    """Resource/link summaries carried by one message (sent and accepted)."""
    max_message_bytes: int = 4096
    """Soft budget for the piggybacked part of one heartbeat/gossip message (TCP, so no MTU limit)."""
    push_pull_interval_s: float = 30.0
    """Full state exchange with one random member; scaled up above 32 members as memberlist does."""
    digest_sync_interval_s: float = 10.0
    """SWIM probes carry a digest of the live view; a mismatch (once our view is quiet) triggers a
    PUSH_PULL with the prober, at most this often: it closes the gossip tail within seconds."""
    max_push_pull_members: int = 1024
    """Members in one PUSH_PULL (sent and accepted); larger views send a prioritised subset."""

    # --- joining, reconnecting, forgetting
    join_retry_interval_s: float = 1.0
    """First retry of an unanswered join; doubles per attempt up to 16x."""
    join_max_attempts: int = 8
    reconnect_interval_s: float = 10.0
    """Every interval one random failed (retained) member gets a PUSH_PULL: heals partitions."""
    dead_member_retention_s: float = 600.0
    """Failed members (and their addresses) are kept, and retried, this long, then forgotten."""
    left_member_retention_s: float = 60.0
    """Members that left are remembered this long so stale gossip cannot resurrect them."""

    # --- limits on what peers send us
    max_members: int = 4096
    """Bound on the member table (alive + suspect + retained failed/left). When it is full, a
    newcomer takes the place of a failed or left member, else of one that only a third party has
    vouched for (never heard from first-hand), from the introducer that vouched for the most: one
    peer's gossip cannot fill the table and shut real newcomers out."""
    max_addrs_per_member: int = 8
    max_addr_chars: int = 256
    max_links_per_info: int = 64
    max_incarnation_jump: int = 1 << 16
    """An unsigned claim about this peer (SUSPECT/DEAD from others) may raise our incarnation by at
    most this much: a claim far above our incarnation is forged, and following it would let anyone
    push us to the largest incarnation, where we could no longer refute."""
    rate_limit_msgs_per_s: float = 50.0
    """Per-sender token bucket refill rate (messages per second)."""
    rate_limit_burst: float = 100.0
    push_pull_token_cost: float = 10.0
    """A PUSH_PULL costs this many tokens: its reply is large."""
    rate_limit_bytes_per_s: float = 256 * 1024
    """Per-sender budget of encoded bytes, charged before a message over 1 KiB is decoded (decoding
    costs about 0.1 s of CPU per MiB): a sender cannot make this peer spend more than its share.
    (Smaller messages are bounded by the message budget, and heartbeats skip this bucket.)"""
    rate_limit_burst_bytes: float = 2 << 20
    """Burst of the byte budget: at least one full push-pull (``max_push_pull_bytes``)."""
    max_datagram_bytes: int = 64 << 10
    """Largest encoded message other than a push-pull, refused before decoding (piggyback is capped
    at ``max_gossip_items_per_message`` + ``max_info_items_per_message`` items: well below this)."""
    max_push_pull_bytes: int = 1 << 20
    """Largest encoded PUSH_PULL / PUSH_PULL_REPLY, refused before decoding."""
    verify_rate_per_s: float = 32.0
    """Per-sender budget of signature checks that miss every cache (about 0.1 ms of CPU each)."""
    verify_burst: float = 2112.0
    """Burst of the signature budget: a newcomer checks a whole view from its contact at once
    (members + infos, 2 x ``max_push_pull_members``, plus some)."""
    signature_cache_entries: int = 4096
    """Signature outcomes remembered besides the records held (good and bad ones each)."""
    max_tracked_senders: int = 8192
    max_pending_relays: int = 1024
    max_contacts: int = 256

    # --- bandwidth estimates
    bandwidth_probe_bytes: int = 8 << 20
    """Size of the bounded active transfer the driver is asked to make when no estimate exists
    (our upload to the peer; never while a bulk transfer runs, see ``bulk_transfer_started``)."""
    bandwidth_min_sample_bytes: int = 256 << 10
    """Transfers smaller than this measure latency, not bandwidth, and are ignored."""
    bandwidth_estimate_max_age_s: float = 600.0
    """An estimate older than this is refreshed by another probe."""
    bandwidth_probe_retry_s: float = 60.0
    """Do not ask for a probe of the same peer more often than this."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "probe_interval_s",
            "probe_timeout_s",
            "suspicion_mult",
            "local_pause_threshold_s",
            "max_link_degree",
            "heartbeat_interval_s",
            "link_down_after_missed",
            "link_refresh_interval_s",
            "link_drop_down_after_s",
            "link_cost_reference_bytes",
            "info_report_interval_s",
            "gossip_interval_s",
            "gossip_fanout",
            "retransmit_mult",
            "info_retransmit_mult",
            "max_gossip_items_per_message",
            "max_info_items_per_message",
            "max_message_bytes",
            "push_pull_interval_s",
            "digest_sync_interval_s",
            "max_push_pull_members",
            "join_retry_interval_s",
            "join_max_attempts",
            "reconnect_interval_s",
            "dead_member_retention_s",
            "left_member_retention_s",
            "max_members",
            "max_addrs_per_member",
            "max_addr_chars",
            "max_links_per_info",
            "max_incarnation_jump",
            "rate_limit_msgs_per_s",
            "rate_limit_burst",
            "push_pull_token_cost",
            "rate_limit_bytes_per_s",
            "rate_limit_burst_bytes",
            "max_datagram_bytes",
            "max_push_pull_bytes",
            "verify_rate_per_s",
            "verify_burst",
            "signature_cache_entries",
            "max_tracked_senders",
            "max_pending_relays",
            "max_contacts",
            "bandwidth_probe_bytes",
            "bandwidth_min_sample_bytes",
            "bandwidth_estimate_max_age_s",
            "bandwidth_probe_retry_s",
        )
        require_non_negative(self, "indirect_probes", "suspicion_confirmations", "awareness_max")
        for name in (
            "indirect_probes",
            "suspicion_confirmations",
            "awareness_max",
            "max_link_degree",
            "link_down_after_missed",
            "gossip_fanout",
            "retransmit_mult",
            "info_retransmit_mult",
            "max_gossip_items_per_message",
            "max_info_items_per_message",
            "max_message_bytes",
            "max_push_pull_members",
            "join_max_attempts",
            "max_members",
            "max_addrs_per_member",
            "max_addr_chars",
            "max_links_per_info",
            "max_incarnation_jump",
            "max_datagram_bytes",
            "max_push_pull_bytes",
            "signature_cache_entries",
            "max_tracked_senders",
            "max_pending_relays",
            "max_contacts",
            "link_cost_reference_bytes",
            "bandwidth_probe_bytes",
            "bandwidth_min_sample_bytes",
        ):
            value = getattr(self, name)
            require(type(value) is int, f"MembershipConfig.{name} must be an int (got {value!r})")
        require(
            self.probe_timeout_s < self.probe_interval_s,
            "MembershipConfig.probe_timeout_s must be shorter than probe_interval_s",
        )
        require(
            self.suspicion_max_timeout_mult >= 1.0,
            "MembershipConfig.suspicion_max_timeout_mult must be >= 1",
        )
        require(
            0.0 <= self.link_replace_improvement < 1.0,
            "MembershipConfig.link_replace_improvement must be in [0, 1)",
        )
        require(
            self.local_pause_threshold_s > max(self.heartbeat_interval_s, self.gossip_interval_s),
            "MembershipConfig.local_pause_threshold_s must exceed heartbeat_interval_s and gossip_interval_s",
        )
        require(
            self.max_link_degree <= self.max_links_per_info,
            "MembershipConfig.max_link_degree must not exceed max_links_per_info",
        )
        require(
            self.max_incarnation_jump < MAX_INCARNATION,
            "MembershipConfig.max_incarnation_jump is larger than any incarnation",
        )
        require(
            self.rate_limit_burst >= self.push_pull_token_cost,
            "MembershipConfig.rate_limit_burst must cover one PUSH_PULL (push_pull_token_cost)",
        )
        require(
            self.rate_limit_burst_bytes >= self.max_push_pull_bytes,
            "MembershipConfig.rate_limit_burst_bytes must cover one push-pull (max_push_pull_bytes)",
        )
        require(
            self.verify_burst >= 1.0,
            "MembershipConfig.verify_burst must allow at least one signature check",
        )
        require(
            self.bandwidth_min_sample_bytes <= self.bandwidth_probe_bytes,
            "MembershipConfig.bandwidth_min_sample_bytes must not exceed bandwidth_probe_bytes",
        )

    # ------------------------------------------------------------------ profiles
    @classmethod
    def lan(cls) -> MembershipConfig:
        """memberlist's LAN defaults: failures are detected in a few seconds."""
        return cls()

    @classmethod
    def local(cls) -> MembershipConfig:
        """One machine / loopback: a crashed or stalled peer is failed in well under a second."""
        return dataclasses.replace(
            cls(),
            probe_interval_s=0.1,
            probe_timeout_s=0.05,
            indirect_probes=2,
            suspicion_mult=3.0,
            suspicion_max_timeout_mult=3.0,
            local_pause_threshold_s=0.5,
            max_link_degree=4,
            heartbeat_interval_s=0.1,
            link_refresh_interval_s=1.0,
            link_drop_down_after_s=3.0,
            info_report_interval_s=1.0,
            gossip_interval_s=0.05,
            retransmit_mult=3,
            push_pull_interval_s=15.0,
            digest_sync_interval_s=1.0,
            join_retry_interval_s=0.2,
            reconnect_interval_s=1.0,
            dead_member_retention_s=120.0,
            left_member_retention_s=30.0,
            rate_limit_msgs_per_s=400.0,
            rate_limit_burst=400.0,
            # Small probes: on one machine every probe competes with the heartbeats for the same
            # CPU, and a 32 MiB probe per link at start-up delayed acks past the 50 ms timeout.
            bandwidth_probe_bytes=4 << 20,
            bandwidth_probe_retry_s=10.0,
        )

    @classmethod
    def wan(cls) -> MembershipConfig:
        """memberlist's WAN defaults: slower probes, longer suspicion, tolerant of jitter."""
        return dataclasses.replace(
            cls(),
            probe_interval_s=5.0,
            probe_timeout_s=3.0,
            suspicion_mult=6.0,
            local_pause_threshold_s=15.0,
            heartbeat_interval_s=5.0,
            link_down_after_missed=3,
            link_refresh_interval_s=30.0,
            link_drop_down_after_s=60.0,
            info_report_interval_s=15.0,
            gossip_interval_s=0.5,
            gossip_fanout=4,
            push_pull_interval_s=60.0,
            digest_sync_interval_s=30.0,
            join_retry_interval_s=3.0,
            reconnect_interval_s=30.0,
            dead_member_retention_s=3600.0,
            left_member_retention_s=300.0,
            rate_limit_msgs_per_s=20.0,
            rate_limit_burst=60.0,
            bandwidth_probe_bytes=4 << 20,
            bandwidth_estimate_max_age_s=1800.0,
            bandwidth_probe_retry_s=300.0,
        )

    # ------------------------------------------------------------------ derived values
    def retransmit_limit(self, members: int) -> int:
        """How many times one update is sent: retransmit_mult x ceil(log10(n + 1))."""
        return self.retransmit_mult * max(1, _ceil_log10(members + 1))

    def info_retransmit_limit(self, members: int) -> int:
        """How many times one info record is sent: info_retransmit_mult x ceil(log10(n + 1))."""
        return self.info_retransmit_mult * max(1, _ceil_log10(members + 1))

    def suspicion_min_s(self, members: int) -> float:
        """The suspicion timeout once enough peers confirm (memberlist's ``suspicionTimeout``)."""
        return self.suspicion_mult * max(1.0, _log10(members)) * self.probe_interval_s

    def push_pull_period_s(self, members: int) -> float:
        """The push-pull interval, stretched above 32 members so total sync traffic stays flat."""
        if members <= 32:
            return self.push_pull_interval_s
        return self.push_pull_interval_s * (1 + _ceil_log2(members) - 5)


def _log10(n: int) -> float:
    return math.log10(n) if n > 0 else 0.0


def _ceil_log10(n: int) -> int:
    return math.ceil(math.log10(n)) if n > 1 else 0


def _ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())
