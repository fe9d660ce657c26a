"""Configurations and operations of the negotiation protocol: pure functions, no machine."""

from __future__ import annotations

import dataclasses

import pytest

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.protocols.negotiation.configuration_change import APPLY_BY_KIND, check_operation, next_configuration
from chaosp2p.protocols.negotiation.configuration_decode import decode_configuration
from chaosp2p.protocols.negotiation.operations import (
    Operation,
    OpKind,
    SignatureCache,
    apply_order,
    op_id,
    sign_operation,
)
from chaosp2p.protocols.negotiation.run_configuration import (
    MAX_OP_AGE_EPOCHS,
    Configuration,
    LinkEntry,
    RunParams,
    compute_shares,
    genesis_configuration,
    make_configuration,
    quorum,
    ring_order,
)
from chaosp2p.wire.identity import Identity, PeerID

IDS = sorted((Identity.from_seed(bytes([i + 1]) * 32) for i in range(8)), key=lambda i: i.peer_id.raw)
P = [i.peer_id for i in IDS]
PARAMS = RunParams(global_batch=100)


def config_of(
    peers: list[PeerID], *, epoch: int = 3, step: int = 10, links: tuple[LinkEntry, ...] = ()
) -> Configuration:
    return make_configuration(
        run="r",
        epoch=epoch,
        activation_step=step,
        peers=peers,
        incarnations=[1] * len(peers),
        throughputs=[1.0] * len(peers),
        links=links,
        params=PARAMS,
        seed=12345,
    )


def op(signer: int, kind: OpKind, subject: int, **kw: object) -> tuple[bytes, Operation]:
    fields: dict[str, object] = {"epoch": 3, "incarnation": 1, "detected_at": 1.0}
    if kind in (OpKind.JOIN, OpKind.THROUGHPUT):
        fields["throughput_samples_per_s"] = 2.0
    fields.update(kw)
    o = sign_operation(IDS[signer], kind=kind, run="r", subject=P[subject], **fields)  # type: ignore[arg-type]
    return op_id(o), o


# ------------------------------------------------------------------------------------------ shares
def test_shares_are_proportional_sum_to_the_batch_and_never_zero() -> None:
    assert compute_shares([1.0, 1.0, 1.0], 10) == (4, 3, 3)
    shares = compute_shares([1.0, 3.0, 0.001], 100)
    assert sum(shares) == 100 and min(shares) >= 1
    assert shares[1] > 2 * shares[0]
    assert compute_shares([5.0, 1.0], 2) == (1, 1)  # batch smaller than members: one sample each
    assert compute_shares([], 10) == ()


def test_shares_break_ties_by_member_order() -> None:
    assert compute_shares([1.0, 1.0, 2.0], 7) == (2, 2, 3)  # spare 4: quotas 1, 1, 2
    # spare 5: quotas 1.67, 0.83, 0.83, 1.67 -> the two 0.83s, then the first 1.67 (tie: order)
    assert compute_shares([2.0, 1.0, 1.0, 2.0], 9) == (3, 2, 2, 2)


# ------------------------------------------------------------------------------------------ digest and codec
def test_digest_covers_every_field_and_roundtrips() -> None:
    c = config_of(P[:3], links=(LinkEntry(a=P[0], b=P[1], up=True, bandwidth_bytes_per_s=1e9, rtt_s=0.001),))
    again = config_of(P[:3], links=c.links)
    assert c.digest == again.digest
    assert config_of(P[:3], step=11).digest != c.digest
    assert config_of(P[:3], epoch=4).digest != c.digest
    decoded = decode_configuration(c.encode(), max_members=16, max_links=16)
    assert decoded == c and decoded.digest == c.digest
    assert decoded.members[1].batch_share == c.shares[1]


def test_decoding_refuses_a_tampered_or_oversized_configuration() -> None:
    c = config_of(P[:3])
    raw = bytearray(c.encode())
    raw[-1] ^= 1  # flip a bit of the digest
    with pytest.raises(RemoteProtocolError, match="digest"):
        decode_configuration(bytes(raw), max_members=16, max_links=16)
    with pytest.raises(RemoteProtocolError, match="members"):
        decode_configuration(c.encode(), max_members=2, max_links=16)
    with pytest.raises(RemoteProtocolError):
        decode_configuration(b"\x93\x01\x02\x03", max_members=16, max_links=16)


def test_lookups_bisect_the_sorted_members() -> None:
    c = config_of(P[:5])
    assert [c.index_of(p) for p in P[:5]] == [0, 1, 2, 3, 4]
    assert c.index_of(P[6]) == -1 and not c.has_member(P[6])
    assert c.incarnation_of(P[2]) == 1 and c.member(P[7]) is None
    assert quorum(c) == 4 and c.quorum == 4  # 5 members: a majority + 1 (two quorums share 2)


# ------------------------------------------------------------------------------------------ validity
def test_who_may_raise_what() -> None:
    c = config_of(P[:4])
    assert check_operation(op(1, OpKind.LEAVE, 1)[1], c) is None
    assert check_operation(op(2, OpKind.LEAVE, 1)[1], c) == "forged_origin"  # about another peer
    assert check_operation(op(2, OpKind.FAIL, 1)[1], c) is None
    assert check_operation(op(6, OpKind.FAIL, 1)[1], c) == "forged_origin"  # a non-member
    assert check_operation(op(1, OpKind.FAIL, 1)[1], c) == "forged_origin"  # FAIL of oneself
    assert check_operation(op(5, OpKind.JOIN, 5)[1], c) is None
    assert check_operation(op(4, OpKind.JOIN, 5)[1], c) == "forged_origin"
    assert check_operation(op(1, OpKind.JOIN, 1)[1], c) == "already_member"  # same incarnation
    assert check_operation(op(1, OpKind.JOIN, 1, incarnation=2)[1], c) is None  # a restart
    assert check_operation(op(1, OpKind.THROUGHPUT, 1)[1], c) is None
    assert check_operation(op(1, OpKind.THROUGHPUT, 1, incarnation=0)[1], c) == "stale_incarnation"
    assert check_operation(op(5, OpKind.LEAVE, 5)[1], c) == "subject_not_member"
    link = op(0, OpKind.LINK_UP, 0, other=P[1])[1]
    assert check_operation(link, c) is None
    assert check_operation(op(2, OpKind.LINK_UP, 0, other=P[1])[1], c) == "forged_origin"
    assert check_operation(op(0, OpKind.LINK_DOWN, 0, other=P[6])[1], c) == "subject_not_member"
    assert check_operation(op(1, OpKind.LEAVE, 1, epoch=4)[1], c) == "future_epoch"
    old = config_of(P[:4], epoch=3 + MAX_OP_AGE_EPOCHS + 1)
    assert check_operation(op(1, OpKind.LEAVE, 1)[1], old) == "too_old"


def test_signatures_are_checked_and_cached() -> None:
    cache = SignatureCache(16)
    ident, good = op(1, OpKind.LEAVE, 1)
    assert cache.check(good) == ident and cache.verifications == 1
    assert cache.check(good) == ident and cache.hits == 1
    forged = dataclasses.replace(good, origin=P[2])  # claims another origin with the same signature
    assert cache.check(forged) is None
    garbage = dataclasses.replace(good, signature=bytes(64))
    assert cache.check(garbage) is None


# ------------------------------------------------------------------------------------------ apply order
def test_higher_incarnation_wins_and_removal_beats_join_at_equal_incarnation() -> None:
    c = config_of(P[:3])
    fail_old = op(0, OpKind.FAIL, 1, incarnation=1)
    rejoin = op(1, OpKind.JOIN, 1, incarnation=2)
    new, results = next_configuration(c, [fail_old, rejoin], 20)
    assert new.incarnation_of(P[1]) == 2  # the restart (inc 2) beats the failure of inc 1
    assert {r.op_id: r.applied for r in results} == {fail_old[0]: False, rejoin[0]: True}

    fail_new = op(0, OpKind.FAIL, 1, incarnation=2)
    second = op(2, OpKind.FAIL, 1, incarnation=2)  # a FAIL needs two signers (issue 20, finding 3)
    new, _ = next_configuration(c, [fail_new, second, rejoin], 20)
    assert not new.has_member(P[1])  # equal incarnation: the removal wins

    leave = op(2, OpKind.LEAVE, 2)
    thr = op(2, OpKind.THROUGHPUT, 2)
    new, results = next_configuration(c, [thr, leave], 20)
    assert not new.has_member(P[2]) and [r.applied for r in results if r.op_id == thr[0]] == [False]


def test_latest_throughput_wins_and_shares_follow() -> None:
    c = config_of(P[:2])
    early = op(0, OpKind.THROUGHPUT, 0, throughput_samples_per_s=9.0, detected_at=1.0)
    late = op(0, OpKind.THROUGHPUT, 0, throughput_samples_per_s=3.0, detected_at=2.0)
    new, _ = next_configuration(c, [late, early], 20)
    assert new.throughputs[0] == 3.0
    assert new.shares == compute_shares([3.0, 1.0], 100) == (75, 25)


def test_apply_order_is_deterministic_whatever_the_input_order() -> None:
    entries = [
        op(0, OpKind.FAIL, 3),
        op(1, OpKind.FAIL, 3),
        op(6, OpKind.JOIN, 6),
        op(2, OpKind.LEAVE, 2),
        op(0, OpKind.LINK_DOWN, 0, other=P[1]),
        op(1, OpKind.THROUGHPUT, 1),
    ]
    forward, _ = apply_order(entries)
    backward, _ = apply_order(list(reversed(entries)))
    assert forward == backward
    assert [o.kind for _, o in forward] == [
        OpKind.FAIL,
        OpKind.FAIL,
        OpKind.LEAVE,
        OpKind.LINK_DOWN,
        OpKind.JOIN,
        OpKind.THROUGHPUT,
    ]
    c = config_of(P[:5])
    a, _ = next_configuration(c, entries, 20)
    b, _ = next_configuration(c, list(reversed(entries)), 20)
    assert a.digest == b.digest and not a.has_member(P[3]) and a.has_member(P[6])


def test_every_operation_kind_has_a_way_to_apply() -> None:
    assert set(APPLY_BY_KIND) == set(OpKind)


def test_departed_members_cannot_be_readmitted_by_a_replayed_join() -> None:
    c = config_of(P[:3])
    join = op(5, OpKind.JOIN, 5, incarnation=1)
    c1, _ = next_configuration(c, [join], 11)
    c2, _ = next_configuration(c1, [op(5, OpKind.LEAVE, 5, epoch=4)], 12)
    assert not c2.has_member(P[5]) and c2.departed_incarnation(P[5]) == 1
    assert check_operation(join[1], c2) == "replayed"
    assert check_operation(op(5, OpKind.JOIN, 5, incarnation=2, epoch=5)[1], c2) is None
    # The tombstone is kept as long as an operation may be replayed, then dropped.
    later = c2
    for _ in range(MAX_OP_AGE_EPOCHS + 1):
        later, _ = next_configuration(later, [], later.activation_step)
    assert later.departed == ()
    assert check_operation(join[1], later) == "too_old"


def test_link_ops_update_the_snapshot_and_removals_drop_links() -> None:
    c = config_of(P[:3])
    up = op(0, OpKind.LINK_UP, 0, other=P[1], bandwidth_bytes_per_s=5e8, rtt_s=0.002)
    c1, _ = next_configuration(c, [up], 11)
    link = c1.link(P[1], P[0])
    assert link is not None and link.up and link.bandwidth_bytes_per_s == 5e8
    c2, _ = next_configuration(c1, [op(1, OpKind.LINK_DOWN, 0, other=P[1], epoch=4)], 12)
    down = c2.link(P[0], P[1])
    assert down is not None and not down.up and down.bandwidth_bytes_per_s == 5e8
    c3, _ = next_configuration(c2, [op(2, OpKind.FAIL, 1, epoch=5), op(0, OpKind.FAIL, 1, epoch=5)], 13)
    assert c3.links == ()


def test_seed_and_epoch_advance_and_shares_are_reused_when_members_do_not_change() -> None:
    c = genesis_configuration("r", P[0], incarnation=0, throughput=1.0, params=PARAMS)
    assert c.epoch == 0 and c.activation_step == 0 and c.shares == (100,)
    c1, _ = next_configuration(c, [], 5)
    assert c1.epoch == 1 and c1.seed != c.seed and c1.shares is c.shares


# ------------------------------------------------------------------------------------------ ring
def test_ring_prefers_wide_links_and_avoids_down_ones() -> None:
    peers = P[:4]
    links = (
        LinkEntry(a=P[0], b=P[2], up=True, bandwidth_bytes_per_s=10e9),
        LinkEntry(a=P[1], b=P[2], up=True, bandwidth_bytes_per_s=1e6),
        LinkEntry(a=P[2], b=P[3], up=True, bandwidth_bytes_per_s=10e9),
        LinkEntry(a=P[0], b=P[1], up=False),
    )
    c = config_of(peers, links=links)
    ring = ring_order(c)
    assert sorted(ring) == sorted(peers)
    assert ring[:3] == (P[0], P[2], P[3])
    assert ring_order(c) == ring  # deterministic
    plain = ring_order(config_of(P[:5]))
    assert plain == tuple(P[:5])  # nothing measured: PeerID order


def test_ring_of_a_thousand_members_is_quick_and_complete() -> None:
    ids = [Identity.from_seed(i.to_bytes(32, "big")).peer_id for i in range(1, 1025)]
    c = config_of(sorted(ids, key=lambda p: p.raw))
    assert len(set(ring_order(c))) == 1024
