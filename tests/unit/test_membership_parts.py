"""Unit tests of the membership machine's parts: config, state table, queues, limits, links, codec."""

from __future__ import annotations

import dataclasses
import inspect
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaosp2p.configbase import from_table
from chaosp2p.errors import ConfigError, RemoteProtocolError
from chaosp2p.protocols.membership import PROTOCOL, MembershipConfig, MembershipMachine, MemberState
from chaosp2p.protocols.membership.core import MembershipCore, TimerKind
from chaosp2p.protocols.membership.gossip import BroadcastQueue
from chaosp2p.protocols.membership.links import LinkMetrics, link_costs, plan_links
from chaosp2p.protocols.membership.machine import _HANDLERS, _TIMERS
from chaosp2p.protocols.membership.messages import (
    Gossip,
    MemberUpdate,
    Ping,
    PushPull,
    UpdateKind,
    codec,
)
from chaosp2p.protocols.membership.transitions import TRANSITIONS, transition
from chaosp2p.protocols.ratelimit import RateLimiter
from chaosp2p.wire.framing import pack
from tests.unit.membership_claims import alive, identity, left, peer

PEERS = [peer(i) for i in range(12)]


# ------------------------------------------------------------------------------------- config
@pytest.mark.parametrize("profile", ["local", "lan", "wan"])
def test_profiles_are_valid_and_ordered(profile: str) -> None:
    config = getattr(MembershipConfig, profile)()
    assert config.probe_timeout_s < config.probe_interval_s
    assert config.suspicion_min_s(5) > 0


def test_profiles_get_slower_from_local_to_wan() -> None:
    local, lan, wan = MembershipConfig.local(), MembershipConfig.lan(), MembershipConfig.wan()
    assert local.probe_interval_s < lan.probe_interval_s < wan.probe_interval_s
    assert local.suspicion_min_s(5) < lan.suspicion_min_s(5) < wan.suspicion_min_s(5)
    assert lan.probe_interval_s == 1.0 and lan.probe_timeout_s == 0.5  # memberlist's LAN anchor
    # local: a refused connection (check of 2 timeouts) plus a fully confirmed suspicion is < 1 s.
    assert 2 * local.probe_timeout_s + local.suspicion_min_s(5) < 1.0


@pytest.mark.parametrize(
    "change",
    [
        {"probe_interval_s": 0.0},
        {"probe_timeout_s": 2.0},
        {"indirect_probes": -1},
        {"max_link_degree": 0},
        {"max_link_degree": 2.5},
        {"suspicion_max_timeout_mult": 0.5},
        {"link_replace_improvement": 1.0},
        {"local_pause_threshold_s": 0.1},
        {"rate_limit_burst": 1.0},
        {"max_link_degree": 100},
        {"bandwidth_min_sample_bytes": 1 << 40},
    ],
)
def test_invalid_config_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        dataclasses.replace(MembershipConfig.lan(), **change)  # type: ignore[arg-type]


def test_config_loads_from_a_toml_table() -> None:
    config = from_table(MembershipConfig.lan(), {"probe_interval_s": 2, "max_link_degree": 3}, section="membership")
    assert config.probe_interval_s == 2.0 and config.max_link_degree == 3
    with pytest.raises(ConfigError):
        from_table(MembershipConfig.lan(), {"probe_intervall_s": 2}, section="membership")


def test_derived_timers_scale_like_memberlist() -> None:
    lan = MembershipConfig.lan()
    assert lan.suspicion_min_s(1) == lan.suspicion_min_s(10) == 4.0
    assert lan.suspicion_min_s(100) == pytest.approx(8.0)
    assert lan.retransmit_limit(5) == 4 and lan.retransmit_limit(256) == 12
    assert lan.push_pull_period_s(32) == 30.0 and lan.push_pull_period_s(256) == 120.0


# ------------------------------------------------------------------------------------- state table
def test_transition_table() -> None:
    alive, suspect, failed, left = MemberState.ALIVE, MemberState.SUSPECT, MemberState.FAILED, MemberState.LEFT
    assert transition(None, 0, UpdateKind.ALIVE, 7) is alive
    assert transition(None, 0, UpdateKind.SUSPECT, 0) is None
    assert transition(alive, 3, UpdateKind.ALIVE, 3) is None  # same incarnation: old news
    assert transition(alive, 3, UpdateKind.SUSPECT, 3) is suspect
    assert transition(alive, 3, UpdateKind.SUSPECT, 2) is None
    assert transition(suspect, 3, UpdateKind.ALIVE, 3) is None  # refuting needs a higher incarnation
    assert transition(suspect, 3, UpdateKind.ALIVE, 4) is alive
    assert transition(suspect, 3, UpdateKind.DEAD, 3) is failed
    assert transition(failed, 3, UpdateKind.SUSPECT, 9) is None
    assert transition(failed, 3, UpdateKind.ALIVE, 4) is alive
    assert transition(left, 3, UpdateKind.DEAD, 9) is None
    assert transition(left, 3, UpdateKind.ALIVE, 4) is alive
    assert all(new is not None for new, _ in TRANSITIONS.values())


# ------------------------------------------------------------------------------------- dispatch tables
def test_every_message_type_and_timer_kind_has_a_handler_and_every_core_hook_an_implementation() -> None:
    assert set(_HANDLERS) == set(codec.message_classes().values())
    assert set(_TIMERS) == set(TimerKind)
    hooks = [
        name
        for name, function in vars(MembershipCore).items()
        if inspect.isfunction(function) and "raise NotImplementedError" in inspect.getsource(function)
    ]
    assert len(hooks) >= 10
    assert [name for name in hooks if getattr(MembershipMachine, name) is vars(MembershipCore)[name]] == []


# ------------------------------------------------------------------------------------- gossip queue
def test_queue_sends_each_item_limit_times_fresh_first() -> None:
    q: BroadcastQueue[str] = BroadcastQueue()
    q.put(b"a", "a0", 10)
    q.put(b"b", "b0", 10)
    sent = q.take(max_items=1, max_bytes=100, limit=3)
    assert sent == ["b0"]  # newest first
    q.put(b"c", "c0", 10)
    while q:
        sent += q.take(max_items=2, max_bytes=100, limit=3)
    assert sent.count("a0") == 3 and sent.count("b0") == 3 and sent.count("c0") == 3
    assert sent[1] == "c0"


def test_queue_replaces_news_about_the_same_subject_and_honours_skip_and_budget() -> None:
    q: BroadcastQueue[str] = BroadcastQueue()
    q.put(b"a", "old", 10)
    q.put(b"a", "new", 10)
    q.put(b"b", "b", 10)
    assert len(q) == 2
    assert q.take(max_items=5, max_bytes=100, limit=5, skip=b"b") == ["new"]
    assert q.take(max_items=5, max_bytes=15, limit=5) == ["b"]  # the budget holds one item
    q.discard(b"a")
    q.discard(b"b")
    assert not q and q.take(max_items=5, max_bytes=100, limit=5) == []
    # A single oversized item is still sent alone rather than never.
    q.put(b"big", "big", 1000)
    assert q.take(max_items=5, max_bytes=100, limit=1) == ["big"] and not q


def test_queue_stays_compact_under_churn() -> None:
    q: BroadcastQueue[int] = BroadcastQueue()
    for i in range(10_000):
        q.put(bytes([i % 7]), i, 1)
    assert len(q) == 7
    assert len(q._order) <= 4 * len(q) + 64
    assert sorted(q.take(max_items=10, max_bytes=100, limit=9)) == list(range(9993, 10_000))


# ------------------------------------------------------------------------------------- rate limits
def test_token_bucket_per_sender() -> None:
    limiter = RateLimiter(rate_per_s=10.0, burst=5.0, max_senders=100)
    a, b = PEERS[0], PEERS[1]
    assert [limiter.allow(a, 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.allow(b, 0.0)
    assert not limiter.allow(a, 0.05)  # half a token
    assert limiter.allow(a, 0.1)
    assert not limiter.allow(a, 1.0, cost=20.0)


def test_token_bucket_table_is_bounded() -> None:
    limiter = RateLimiter(rate_per_s=1.0, burst=2.0, max_senders=5)
    for p in PEERS:
        limiter.allow(p, 0.0, cost=2.0)  # every sender empties its bucket: none can be swept
    assert len(limiter) <= 5
    limiter.sweep(10.0)
    assert len(limiter) == 0


# ------------------------------------------------------------------------------------- links
def test_link_costs_use_medians_for_unknown_figures() -> None:
    metrics = {
        PEERS[0]: LinkMetrics(rtt_s=0.010, bandwidth_bytes_per_s=1e9),
        PEERS[1]: LinkMetrics(rtt_s=0.030, bandwidth_bytes_per_s=1e8),
        PEERS[2]: LinkMetrics(rtt_s=None, bandwidth_bytes_per_s=None),
    }
    costs = link_costs(metrics, reference_bytes=10**8)
    assert costs[PEERS[0]] == pytest.approx(0.010 + 0.1)
    assert costs[PEERS[1]] == pytest.approx(0.030 + 1.0)
    assert costs[PEERS[2]] == pytest.approx(0.020 + 10**8 / 5.5e8)


def test_plan_fills_free_slots_with_the_cheapest_and_replaces_only_for_a_clear_gain() -> None:
    rng = random.Random(1)
    metrics = {p: LinkMetrics(rtt_s=0.001 * (i + 1), bandwidth_bytes_per_s=None) for i, p in enumerate(PEERS[:6])}
    plan = plan_links([], metrics, degree=3, improvement=0.3, reference_bytes=1, rng=rng)
    assert set(plan.add) == set(PEERS[:3]) and plan.drop == ()
    # Full: a candidate 10 % better does not displace the worst link, a much better one does.
    current = [PEERS[3], PEERS[4], PEERS[5]]
    del metrics[PEERS[1]], metrics[PEERS[2]]
    metrics[PEERS[0]] = LinkMetrics(rtt_s=0.0055, bandwidth_bytes_per_s=None)
    assert plan_links(current, metrics, degree=3, improvement=0.3, reference_bytes=1, rng=rng).add == ()
    metrics[PEERS[0]] = LinkMetrics(rtt_s=0.0001, bandwidth_bytes_per_s=None)
    plan = plan_links(current, metrics, degree=3, improvement=0.3, reference_bytes=1, rng=rng)
    assert plan.add == (PEERS[0],) and plan.drop == (PEERS[5],)
    # Links whose peer is no longer a candidate are dropped.
    del metrics[PEERS[4]]
    plan = plan_links(current, metrics, degree=3, improvement=0.3, reference_bytes=1, rng=rng)
    assert PEERS[4] in plan.drop and len(plan.add) == 1


# ------------------------------------------------------------------------------------- codec
def new_machine() -> MembershipMachine:
    config = MembershipConfig.lan()
    return MembershipMachine(
        identity=identity(0), addrs=("/ip4/10.0.0.1/tcp/1",), config=config, rng=random.Random(0), now=0.0
    )


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decoding_arbitrary_bytes_only_ever_raises_remote_protocol_error(data: bytes) -> None:
    try:
        codec.decode(data, max_bytes=1 << 16)
    except RemoteProtocolError:
        pass


objects = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=6),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.lists(objects, max_size=6))
def test_structurally_random_messages_are_refused_cleanly_or_handled(kind: int, fields: list[object]) -> None:
    try:
        message = codec.decode(pack([kind, *fields]), max_bytes=1 << 16)
    except RemoteProtocolError:
        return
    machine = new_machine()
    machine.receive(0.0, PEERS[1], PROTOCOL, message)  # must not raise, whatever it says
    machine.handle_timeout(100.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(list(UpdateKind)),
            st.integers(0, 11),
            st.integers(0, 5),
            st.booleans(),
        ),
        max_size=30,
    )
)
def test_any_sequence_of_updates_keeps_the_view_consistent(steps: list[tuple[UpdateKind, int, int, bool]]) -> None:
    machine = new_machine()
    for who in range(1, 12):  # every sender is a member: what it says about others counts
        machine.receive(0.0, PEERS[who], PROTOCOL, Gossip(updates=(alive(who),)))
    now = 0.0
    for kind, who, incarnation, via_push_pull in steps:
        now += 0.3
        if kind is UpdateKind.ALIVE:
            update = alive(who, incarnation)  # claims in the subject's own name are signed by it
        elif kind is UpdateKind.LEFT:
            update = left(who, incarnation)
        else:
            update = MemberUpdate(kind=kind, peer=PEERS[who], incarnation=incarnation)
        sender = PEERS[(who + 1) % 12 or 1]
        message = PushPull(seq=1, join=False, members=(update,)) if via_push_pull else Gossip(updates=(update,))
        machine.receive(now, sender, PROTOCOL, message)
        machine.handle_timeout(now)
        machine.take_outgoing()
    members = machine.members()
    assert members[0].peer_id == PEERS[0] and members[0].state is MemberState.ALIVE
    assert all(m.incarnation <= 5 or m.peer_id == PEERS[0] for m in members)
    assert all(m.addrs for m in members if m.state is MemberState.ALIVE)
    assert len({m.peer_id for m in members}) == len(members)
    # The machine's own incarnation only ever moved past claims made about it.
    assert 0 <= machine.incarnation <= 6
    assert math.isfinite(machine.next_deadline() or 0.0)


def test_ping_with_an_out_of_range_digest_is_refused() -> None:
    with pytest.raises(RemoteProtocolError):
        codec.decode(pack([1, 1, [], [], -5]), max_bytes=64)
    with pytest.raises(RemoteProtocolError):
        codec.decode(pack([1, 1, [[0, PEERS[1].raw, 2**60, ["x"]]]]), max_bytes=256)
    assert isinstance(codec.decode(pack([1, 1, [], [], 5]), max_bytes=64), Ping)
