"""hivemind's key/subkey/expiration rules on per-writer records (issue 22, item 1).

hivemind keeps, under one key, a regular value or a dictionary of subkeys, each entry with its own
expiration; ``get`` merges replicas. The drop-in keeps each writer's entries in one signed record
(:class:`Entries`) and merges writers' records (:func:`merge`). These tests pin the rules to
hivemind 1.1.12's ``DHTLocalStorage`` and ``_SearchState`` (``hivemind/dht/storage.py``,
``hivemind/dht/node.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaosp2p.errors import RemoteProtocolError
from chaosp2p.hivemind.dht.entries import Entries, merge
from chaosp2p.hivemind.utils.serializer import MSGPackSerializer
from chaosp2p.hivemind.utils.timed_storage import ValueWithExpiration

NOW = 1000.0


def test_a_regular_value_is_replaced_only_by_a_later_expiration() -> None:
    held = Entries()
    assert held.store(None, b"a", NOW + 10, NOW)
    assert not held.store(None, b"b", NOW + 5, NOW)  # older: refused, as in hivemind
    assert held.regular == (b"a", NOW + 10)
    assert held.store(None, b"c", NOW + 20, NOW)
    assert held.regular == (b"c", NOW + 20)


def test_an_expired_entry_is_refused_and_held_ones_expire() -> None:
    held = Entries()
    assert not held.store(b"k", b"v", NOW - 1, NOW)
    assert held.store(b"k", b"v", NOW + 1, NOW)
    held.prune(NOW + 2)
    assert held.expiration is None and not held.subkeys


def test_subkeys_keep_their_own_expirations_and_the_dictionary_the_latest() -> None:
    held = Entries()
    assert held.store(b"x", b"1", NOW + 10, NOW)
    assert held.store(b"y", b"2", NOW + 30, NOW)
    assert not held.store(b"x", b"old", NOW + 5, NOW)
    assert held.expiration == NOW + 30
    held.prune(NOW + 20)
    assert set(held.subkeys) == {b"y"}


def test_a_subkey_replaces_an_older_regular_value_but_not_a_newer_one() -> None:
    held = Entries()
    held.store(None, b"plain", NOW + 10, NOW)
    assert not held.store(b"s", b"v", NOW + 5, NOW)
    assert held.store(b"s", b"v", NOW + 15, NOW)
    assert held.regular is None and held.subkeys == {b"s": (b"v", NOW + 15)}
    assert held.store(None, b"plain again", NOW + 20, NOW)  # a later regular value replaces the dictionary
    assert held.regular == (b"plain again", NOW + 20) and not held.subkeys


def test_writers_dictionaries_merge_subkey_by_subkey_newest_first() -> None:
    a, b = Entries(), Entries()
    a.store(b"shared", b"from a", NOW + 10, NOW)
    a.store(b"only a", b"1", NOW + 10, NOW)
    b.store(b"shared", b"from b", NOW + 20, NOW)
    merged = merge([a, b], NOW)
    assert merged is not None
    assert merged.subkeys == {b"shared": (b"from b", NOW + 20), b"only a": (b"1", NOW + 10)}
    assert merged.expiration == NOW + 20


def test_the_latest_holding_wins_between_a_regular_value_and_a_dictionary() -> None:
    regular, dictionary = Entries(), Entries()
    regular.store(None, b"r", NOW + 10, NOW)
    dictionary.store(b"s", b"d", NOW + 5, NOW)
    for order in ([regular, dictionary], [dictionary, regular]):
        merged = merge(order, NOW)
        assert merged is not None and merged.regular == (b"r", NOW + 10)


def test_merge_drops_what_expired_and_returns_none_when_nothing_is_left() -> None:
    a = Entries()
    a.store(b"s", b"v", NOW + 1, NOW)
    assert merge([a], NOW + 2) is None
    assert merge([], NOW) is None


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from([None, b"a", b"b"]), st.binary(max_size=4), st.floats(NOW - 5, NOW + 50)),
        max_size=12,
    )
)
def test_records_round_trip_and_never_hold_both_kinds(writes: list[tuple[bytes | None, bytes, float]]) -> None:
    held = Entries()
    for subkey, value, expiration in writes:
        held.store(subkey, value, expiration, NOW)
        assert not (held.regular is not None and held.subkeys)
    again = Entries.decode(held.encode())
    assert (again.regular, again.subkeys, again.expiration) == (held.regular, held.subkeys, held.expiration)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x93\x01\xc0\x90",
        MSGPackSerializer.dumps([2, None, [], 0.0]),
        MSGPackSerializer.dumps([1, None, [[1, b"v", 1.0]], 0.0]),
    ],
)
def test_a_malformed_record_is_a_remote_protocol_error(raw: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        Entries.decode(raw)


def test_values_keep_their_types_through_the_serializer() -> None:
    value = {"step": 3, "loss": 0.5, "pair": (1, b"x"), "list": [1, 2]}
    assert MSGPackSerializer.loads(MSGPackSerializer.dumps(value)) == value
    assert isinstance(MSGPackSerializer.loads(MSGPackSerializer.dumps((1, 2))), tuple)


def test_a_value_with_expiration_unpacks_and_compares_like_hivemind() -> None:
    item = ValueWithExpiration({"a": 1}, 12.5)
    value, expiration = item
    assert (value, expiration) == ({"a": 1}, 12.5)
    assert item == ({"a": 1}, 12.5) and item[0] == {"a": 1} and item[1] == 12.5
    assert item.value == {"a": 1} and item["expiration_time"] == 12.5
