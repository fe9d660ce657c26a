"""Record store: signed namespaces, ordering, TTL on a virtual clock, quotas, provider records."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from chaosp2p.clock import VirtualClock
from chaosp2p.dht.contacts import AddressValidator
from chaosp2p.dht.keys import MalformedKey, key_owner, signed_key, state_provider_key
from chaosp2p.dht.messages import MAX_VERSION, StoreStatus
from chaosp2p.dht.records import (
    RecordStore,
    check_record,
    make_provider_record,
    make_record,
    record_signing_payload,
)
from chaosp2p.errors import ConfigError
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import Identity


def ident(n: int) -> Identity:
    return Identity.from_seed(hashlib.sha256(b"records-test/%d" % n).digest())


ALICE, BOB, CAROL, MALLORY = ident(1), ident(2), ident(3), ident(4)
ADDR = ("/ip4/10.0.0.1/tcp/4001",)


def new_store(**overrides: int | float) -> RecordStore:
    params: dict[str, int | float] = dict(
        max_key_bytes=256,
        max_value_bytes=1024,
        max_ttl_s=3600.0,
        max_per_sender=10,
        max_total=100,
        max_providers_per_key=4,
        max_providers_per_sender_per_key=4,
    )
    params.update(overrides)
    return RecordStore(validator=AddressValidator(max_addrs=4), **params)  # type: ignore[arg-type]


# ------------------------------------------------------------------ keys
def test_signed_key_names_its_owner() -> None:
    key = signed_key(ALICE.peer_id, "state")
    assert key == b"/pk/" + str(ALICE.peer_id).encode() + b"/state"
    assert key_owner(key) == ALICE.peer_id
    assert key_owner(b"plain-key") is None


@pytest.mark.parametrize(
    "key",
    [b"/pk/", b"/pk/notapeer/x", b"/pk/" + str(ALICE.peer_id).encode(), b"/pk/\xff\xfe/x"],
)
def test_malformed_signed_keys_are_refused(key: bytes) -> None:
    with pytest.raises(MalformedKey):
        key_owner(key)


def test_state_provider_key_shape() -> None:
    assert state_provider_key("run1", 7) == b"/prov/state/run1/7"
    with pytest.raises(ConfigError):
        state_provider_key("a/b", 1)


def test_signing_payload_is_canonical_msgpack() -> None:
    assert record_signing_payload(b"k", b"v", 3, 1000, 7) == pack(["chaosp2p/dht/record/2", b"k", b"v", 3, 1000, 7])


# ------------------------------------------------------------------ signed records
def test_owner_signed_record_is_accepted_and_served_with_remaining_ttl() -> None:
    clock = VirtualClock(100.0)
    store = new_store()
    key = signed_key(ALICE.peer_id, "x")
    record = make_record(key, b"v1", version=1, ttl_ms=60_000, issued_at_ms=100_000, identity=ALICE)
    assert store.put_record(clock.now(), record, BOB.peer_id) == (StoreStatus.OK, None)
    clock.advance(20.0)
    held = store.get_record(clock.now(), key)
    assert held is not None and held.value == b"v1" and held.remaining_ms == 40_000


def test_forged_signature_is_rejected_and_keeps_the_good_record() -> None:
    store = new_store()
    key = signed_key(ALICE.peer_id, "x")
    good = make_record(key, b"v1", version=1, ttl_ms=60_000, identity=ALICE)
    store.put_record(0.0, good, ALICE.peer_id)
    forged = dataclasses.replace(good, value=b"evil", version=2)
    assert store.put_record(1.0, forged, BOB.peer_id)[0] is StoreStatus.BAD_SIGNATURE
    held = store.get_record(1.0, key)
    assert held is not None and held.value == b"v1"


def test_another_peer_cannot_write_the_owners_namespace() -> None:
    store = new_store()
    key = signed_key(ALICE.peer_id, "x")
    by_bob = make_record(key, b"mine", version=9, ttl_ms=60_000, identity=BOB)
    assert store.put_record(0.0, by_bob, BOB.peer_id)[0] is StoreStatus.BAD_SIGNATURE
    assert store.get_record(0.0, key) is None


def test_signed_record_needs_signature_under_pk() -> None:
    store = new_store()
    key = signed_key(ALICE.peer_id, "x")
    unsigned = make_record(key, b"v", version=1, ttl_ms=1000)
    assert store.put_record(0.0, unsigned, BOB.peer_id)[0] is StoreStatus.BAD_SIGNATURE


def test_only_newer_versions_replace_a_signed_record() -> None:
    store = new_store()
    key = signed_key(ALICE.peer_id, "x")
    v2 = make_record(key, b"two", version=2, ttl_ms=60_000, identity=ALICE)
    v1 = make_record(key, b"one", version=1, ttl_ms=60_000, identity=ALICE)
    v3 = make_record(key, b"three", version=3, ttl_ms=60_000, identity=ALICE)
    assert store.put_record(0.0, v2, BOB.peer_id)[0] is StoreStatus.OK
    assert store.put_record(0.0, v1, BOB.peer_id) == (StoreStatus.STALE, 2)
    assert store.put_record(0.0, v3, BOB.peer_id)[0] is StoreStatus.OK
    held = store.get_record(0.0, key)
    assert held is not None and held.version == 3


def test_equal_record_refreshes_the_republish_clock_but_never_the_life() -> None:
    store = new_store()
    record = make_record(b"k", b"v", version=1, ttl_ms=10_000)
    store.put_record(0.0, record, BOB.peer_id)
    later = dataclasses.replace(record, remaining_ms=10_000)  # a replay claiming the full TTL again
    assert store.put_record(8.0, later, CAROL.peer_id)[0] is StoreStatus.OK
    assert store.due_for_republish(9.9, 5.0) == ([], [])  # re-stored at 8: not due yet
    assert store.get_record(9.9, b"k") is not None
    assert store.get_record(10.0, b"k") is None  # issued at 0 with a 10 s TTL: gone at 10, replay or not


# ------------------------------------------------------------------ lifetimes are signed (issue 10)
def test_replaying_an_owners_signed_record_never_keeps_it_alive() -> None:
    """Anyone may re-send Alice's last record with a fresh ``remaining_ms``; it still lapses on time."""
    key = signed_key(ALICE.peer_id, "cfg")
    record = make_record(key, b"v1", version=1, ttl_ms=10_000, issued_at_ms=0, identity=ALICE)
    holder = new_store()
    assert holder.put_record(0.0, record, ALICE.peer_id)[0] is StoreStatus.OK
    for t in (3.0, 6.0, 9.0):  # a replayer keeps claiming the full TTL
        replay = dataclasses.replace(record, remaining_ms=10_000)
        assert holder.put_record(t, replay, MALLORY.peer_id)[0] is StoreStatus.OK
    assert holder.get_record(10.0, key) is None
    # A holder that never saw it (or forgot it) refuses the lapsed record outright.
    for fresh_holder_time in (10.0, 500.0):
        replay = dataclasses.replace(record, remaining_ms=10_000)
        assert new_store().put_record(fresh_holder_time, replay, MALLORY.peer_id) == (StoreStatus.MALFORMED, None)
    # Changing the issue time or TTL breaks the owner's signature.
    forged = dataclasses.replace(record, issued_at_ms=9_000)
    assert new_store().put_record(9.5, forged, MALLORY.peer_id)[0] is StoreStatus.BAD_SIGNATURE


def test_only_the_owner_extends_a_signed_record_by_reissuing_it() -> None:
    key = signed_key(ALICE.peer_id, "cfg")
    first = make_record(key, b"v1", version=1, ttl_ms=10_000, issued_at_ms=0, identity=ALICE)
    reissued = make_record(key, b"v1", version=1, ttl_ms=10_000, issued_at_ms=8_000, identity=ALICE)
    store = new_store()
    store.put_record(0.0, first, ALICE.peer_id)
    assert store.put_record(8.0, reissued, ALICE.peer_id)[0] is StoreStatus.OK
    assert store.put_record(8.5, first, MALLORY.peer_id)[0] is StoreStatus.OK  # the older issue changes nothing
    held = store.get_record(12.0, key)
    assert held is not None and held.issued_at_ms == 8_000
    assert store.get_record(18.0, key) is None


def test_records_issued_in_our_future_are_refused() -> None:
    store = new_store(max_clock_skew_s=60.0)
    key = signed_key(ALICE.peer_id, "cfg")
    ahead = make_record(key, b"v", version=1, ttl_ms=10_000, issued_at_ms=61_000, identity=ALICE)
    assert store.put_record(0.0, ahead, ALICE.peer_id)[0] is StoreStatus.MALFORMED
    within_skew = make_record(key, b"v", version=1, ttl_ms=10_000, issued_at_ms=59_000, identity=ALICE)
    assert store.put_record(0.0, within_skew, ALICE.peer_id)[0] is StoreStatus.OK


def test_a_provider_record_replay_never_keeps_it_alive() -> None:
    key = state_provider_key("run", 1)
    record = make_provider_record(ALICE, key, ADDR, seq=0, ttl_ms=10_000, issued_at_ms=0)
    store = new_store()
    assert store.put_provider(0.0, record, ALICE.peer_id)[0] is StoreStatus.OK
    assert store.put_provider(9.0, dataclasses.replace(record, remaining_ms=10_000), ALICE.peer_id)[0] is StoreStatus.OK
    assert store.get_providers(10.0, key, 10) == []
    assert new_store().put_provider(10.0, record, ALICE.peer_id)[0] is StoreStatus.MALFORMED


def test_an_unsigned_key_cannot_be_squatted_at_a_huge_version() -> None:
    """Unsigned versions are wall-clock times: one write at the maximum version cannot lock a key."""
    store = new_store(max_clock_skew_s=60.0)
    squat = make_record(b"open", b"mine", version=MAX_VERSION, ttl_ms=3_600_000)
    assert store.put_record(0.0, squat, MALLORY.peer_id) == (StoreStatus.MALFORMED, None)
    # The furthest a squatter gets is the skew ahead of our clock...
    ahead = make_record(b"open", b"mine", version=60_000, ttl_ms=3_600_000)
    assert store.put_record(0.0, ahead, MALLORY.peer_id)[0] is StoreStatus.OK
    honest_now = make_record(b"open", b"ours", version=30_000, ttl_ms=3_600_000, issued_at_ms=30_000)
    assert store.put_record(30.0, honest_now, BOB.peer_id)[0] is StoreStatus.STALE
    # ...and once it stops re-writing, an honest write at the current time wins within the skew.
    honest_later = make_record(b"open", b"ours", version=61_000, ttl_ms=3_600_000, issued_at_ms=61_000)
    assert store.put_record(61.0, honest_later, BOB.peer_id)[0] is StoreStatus.OK
    held = store.get_record(61.0, b"open")
    assert held is not None and held.value == b"ours"


def test_record_expires_on_the_virtual_clock_and_is_swept() -> None:
    clock = VirtualClock()
    store = new_store()
    store.put_record(clock.now(), make_record(b"k", b"v", version=0, ttl_ms=5_000), BOB.peer_id)
    clock.advance(4.999)
    assert store.get_record(clock.now(), b"k") is not None
    clock.advance(0.001)
    assert store.expire(clock.now()) == 1
    assert store.get_record(clock.now(), b"k") is None
    assert store.total == 0 and store.count_for(BOB.peer_id) == 0


def test_claimed_ttl_is_clamped_to_max() -> None:
    store = new_store(max_ttl_s=10.0)
    store.put_record(0.0, make_record(b"k", b"v", version=0, ttl_ms=3_600_000), BOB.peer_id)
    assert store.get_record(9.9, b"k") is not None
    assert store.get_record(10.0, b"k") is None


def test_remaining_beyond_ttl_is_malformed() -> None:
    record = dataclasses.replace(make_record(b"k", b"v", version=0, ttl_ms=1_000), remaining_ms=2_000)
    assert new_store().put_record(0.0, record, BOB.peer_id)[0] is StoreStatus.MALFORMED


# ------------------------------------------------------------------ unsigned records
def test_unsigned_highest_version_then_value_wins() -> None:
    store = new_store()
    assert store.put_record(0.0, make_record(b"k", b"b", version=1, ttl_ms=9_000), BOB.peer_id)[0] is StoreStatus.OK
    assert store.put_record(0.0, make_record(b"k", b"a", version=1, ttl_ms=9_000), CAROL.peer_id) == (
        StoreStatus.STALE,
        1,
    )
    assert store.put_record(0.0, make_record(b"k", b"c", version=1, ttl_ms=9_000), CAROL.peer_id)[0] is StoreStatus.OK
    assert store.put_record(0.0, make_record(b"k", b"a", version=2, ttl_ms=9_000), BOB.peer_id)[0] is StoreStatus.OK
    held = store.get_record(0.0, b"k")
    assert held is not None and (held.version, held.value) == (2, b"a")


def test_unsigned_record_with_a_publisher_is_malformed() -> None:
    record = make_record(b"plain", b"v", version=1, ttl_ms=1_000, identity=ALICE)
    assert new_store().put_record(0.0, record, BOB.peer_id)[0] is StoreStatus.MALFORMED


def test_oversized_values_and_keys_are_rejected() -> None:
    store = new_store(max_value_bytes=10, max_key_bytes=8)
    assert store.put_record(0.0, make_record(b"k", b"x" * 11, version=0, ttl_ms=1000), BOB.peer_id)[0] is (
        StoreStatus.OVERSIZED
    )
    assert store.put_record(0.0, make_record(b"k" * 9, b"x", version=0, ttl_ms=1000), BOB.peer_id)[0] is (
        StoreStatus.OVERSIZED
    )
    assert check_record(make_record(b"k", b"x" * 11, version=0, ttl_ms=1000), max_key_bytes=8, max_value_bytes=10) is (
        StoreStatus.OVERSIZED
    )


def test_per_publisher_quota_does_not_evict_existing_records() -> None:
    store = new_store(max_per_sender=3)
    for i in range(3):
        assert store.put_record(0.0, make_record(b"k%d" % i, b"v", version=0, ttl_ms=9_000), BOB.peer_id)[0] is (
            StoreStatus.OK
        )
    assert store.put_record(0.0, make_record(b"k9", b"v", version=0, ttl_ms=9_000), BOB.peer_id)[0] is (
        StoreStatus.QUOTA
    )
    # Updating one of its own keys is not a new record, so it still works; others are unaffected.
    assert store.put_record(0.0, make_record(b"k0", b"w", version=1, ttl_ms=9_000), BOB.peer_id)[0] is StoreStatus.OK
    assert store.put_record(0.0, make_record(b"c", b"v", version=0, ttl_ms=9_000), CAROL.peer_id)[0] is StoreStatus.OK
    assert all(store.get_record(0.0, b"k%d" % i) is not None for i in range(3))


def test_signed_records_count_against_the_sender_not_the_signer() -> None:
    """Issue 20, finding 6: signed records are charged to the peer that stored them here; charging
    the signer let one sender store past its quota under throwaway identities."""
    store = new_store(max_per_sender=2)
    for i in range(2):
        signer = Identity.generate()
        record = make_record(signed_key(signer.peer_id, str(i)), b"v", version=0, ttl_ms=9_000, identity=signer)
        assert store.put_record(0.0, record, CAROL.peer_id)[0] is StoreStatus.OK
    signer = Identity.generate()
    extra = make_record(signed_key(signer.peer_id, "x"), b"v", version=0, ttl_ms=9_000, identity=signer)
    assert store.put_record(0.0, extra, CAROL.peer_id)[0] is StoreStatus.QUOTA
    assert store.count_for(CAROL.peer_id) == 2 and store.count_for(signer.peer_id) == 0
    # The owner's record relayed by another sender is that sender's to pay for.
    assert store.put_record(0.0, extra, BOB.peer_id)[0] is StoreStatus.OK
    assert store.count_for(BOB.peer_id) == 1


def test_total_capacity_refuses_newcomers() -> None:
    store = new_store(max_total=2, max_per_sender=2)
    store.put_record(0.0, make_record(b"a", b"v", version=0, ttl_ms=9_000), BOB.peer_id)
    store.put_record(0.0, make_record(b"b", b"v", version=0, ttl_ms=9_000), CAROL.peer_id)
    assert store.put_record(0.0, make_record(b"c", b"v", version=0, ttl_ms=9_000), ALICE.peer_id)[0] is (
        StoreStatus.QUOTA
    )
    assert store.total == 2


def test_overwrite_by_another_writer_moves_the_quota() -> None:
    store = new_store()
    store.put_record(0.0, make_record(b"a", b"v", version=0, ttl_ms=9_000), BOB.peer_id)
    store.put_record(0.0, make_record(b"a", b"w", version=1, ttl_ms=9_000), CAROL.peer_id)
    assert store.count_for(BOB.peer_id) == 0 and store.count_for(CAROL.peer_id) == 1 and store.total == 1


# ------------------------------------------------------------------ provider records
def test_provider_record_roundtrip_and_expiry() -> None:
    store = new_store()
    key = state_provider_key("run", 3)
    record = make_provider_record(ALICE, key, ADDR, seq=0, ttl_ms=30_000)
    assert store.put_provider(0.0, record, ALICE.peer_id)[0] is StoreStatus.OK
    got = store.get_providers(10.0, key, 10)
    assert [p.provider for p in got] == [ALICE.peer_id] and got[0].remaining_ms == 20_000
    assert store.get_providers(30.0, key, 10) == []


def test_nobody_can_advertise_someone_else() -> None:
    store = new_store()
    key = b"/prov/x"
    by_bob = make_provider_record(BOB, key, ADDR, seq=0, ttl_ms=30_000)
    claimed = dataclasses.replace(by_bob, provider=ALICE.peer_id)
    assert store.put_provider(0.0, claimed, BOB.peer_id)[0] is StoreStatus.BAD_SIGNATURE
    forged_addrs = dataclasses.replace(by_bob, addrs=("/ip4/6.6.6.6/tcp/1",))
    assert store.put_provider(0.0, forged_addrs, BOB.peer_id)[0] is StoreStatus.BAD_SIGNATURE
    assert store.get_providers(0.0, key, 10) == []


def test_provider_addresses_must_be_valid_and_name_the_provider() -> None:
    store = new_store()
    other = f"/ip4/10.0.0.1/tcp/1/p2p/{BOB.peer_id}"
    bad = make_provider_record(ALICE, b"/prov/x", (other,), seq=0, ttl_ms=30_000)
    assert store.put_provider(0.0, bad, ALICE.peer_id)[0] is StoreStatus.MALFORMED
    garbage = make_provider_record(ALICE, b"/prov/x", ("not an address",), seq=0, ttl_ms=30_000)
    assert store.put_provider(0.0, garbage, ALICE.peer_id)[0] is StoreStatus.MALFORMED


def test_provider_seq_ordering() -> None:
    store = new_store()
    key = b"/prov/x"
    first = make_provider_record(ALICE, key, ADDR, seq=2, ttl_ms=30_000)
    assert store.put_provider(0.0, first, ALICE.peer_id)[0] is StoreStatus.OK
    assert store.put_provider(0.0, make_provider_record(ALICE, key, ADDR, seq=1, ttl_ms=30_000), ALICE.peer_id) == (
        StoreStatus.STALE,
        2,
    )
    newer = make_provider_record(ALICE, key, ("/ip4/10.0.0.2/tcp/2",), seq=3, ttl_ms=30_000)
    assert store.put_provider(0.0, newer, ALICE.peer_id)[0] is StoreStatus.OK
    assert store.get_providers(0.0, key, 10)[0].addrs == ("/ip4/10.0.0.2/tcp/2",)
    assert store.count_for(ALICE.peer_id) == 1


def test_providers_per_key_limit_keeps_existing_ones() -> None:
    store = new_store(max_providers_per_key=2)
    key = b"/prov/x"
    for who in (ALICE, BOB):
        assert store.put_provider(0.0, make_provider_record(who, key, ADDR, seq=0, ttl_ms=30_000), who.peer_id)[0] is (
            StoreStatus.OK
        )
    assert store.put_provider(0.0, make_provider_record(CAROL, key, ADDR, seq=0, ttl_ms=30_000), CAROL.peer_id)[0] is (
        StoreStatus.QUOTA
    )
    assert {p.provider for p in store.get_providers(0.0, key, 10)} == {ALICE.peer_id, BOB.peer_id}


def test_provider_records_under_one_key_are_bounded_per_sender() -> None:
    """Issue 20, finding 9: one sender may hold only a few provider records under a key (its own and
    relayed ones together); the rest of the key's list stays open to other senders."""
    store = new_store(max_providers_per_key=4, max_providers_per_sender_per_key=2)
    key = b"/prov/x"
    throwaways = [Identity.generate() for _ in range(4)]
    verdicts = [
        store.put_provider(0.0, make_provider_record(t, key, ADDR, seq=0, ttl_ms=30_000), MALLORY.peer_id)[0]
        for t in throwaways
    ]
    assert verdicts == [StoreStatus.OK, StoreStatus.OK, StoreStatus.QUOTA, StoreStatus.QUOTA]
    for who in (ALICE, BOB):
        record = make_provider_record(who, key, ADDR, seq=0, ttl_ms=30_000)
        assert store.put_provider(0.0, record, who.peer_id)[0] is StoreStatus.OK
    # A relayed provider's own newer record moves it onto the provider's account.
    newer = make_provider_record(throwaways[0], key, ADDR, seq=1, ttl_ms=30_000)
    assert store.put_provider(0.0, newer, throwaways[0].peer_id)[0] is StoreStatus.OK
    assert store.count_for(MALLORY.peer_id) == 1 and store.count_for(throwaways[0].peer_id) == 1
    # Expiry gives every sender its slots back.
    store.expire(31.0)
    assert store.total == 0 and store.count_for(MALLORY.peer_id) == 0


def test_due_for_republish_marks_records() -> None:
    store = new_store()
    store.put_record(0.0, make_record(b"a", b"v", version=0, ttl_ms=100_000), BOB.peer_id)
    store.put_provider(0.0, make_provider_record(ALICE, b"/prov/x", ADDR, seq=0, ttl_ms=100_000), ALICE.peer_id)
    assert store.due_for_republish(5.0, 10.0) == ([], [])
    records, providers = store.due_for_republish(10.0, 10.0)
    assert [r.key for r in records] == [b"a"] and records[0].remaining_ms == 90_000
    assert [p.provider for p in providers] == [ALICE.peer_id]
    assert store.due_for_republish(11.0, 10.0) == ([], [])
