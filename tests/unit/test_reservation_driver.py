"""The private peer's reservation plan (``chaosp2p.protocols.relay.holding``): pure decisions."""

from __future__ import annotations

import pytest

from chaosp2p.errors import ConfigError
from chaosp2p.protocols.relay.holding import Held, ReservationConfig, circuit_addrs, plan
from chaosp2p.protocols.relay.messages import Reservation
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.multiaddr import Multiaddr

CONFIG = ReservationConfig(max_relays=2, renew_fraction=0.5, retry_after_s=10.0)


def peers(count: int) -> list[PeerID]:
    return sorted((Identity.generate().peer_id for _ in range(count)), key=lambda p: p.raw)


def held(granted: float, expires: float) -> Held:
    return Held(granted_at=granted, expires_at=expires, addrs=())


def test_a_public_or_unknown_peer_reserves_nothing_and_drops_what_it_held() -> None:
    r1, r2 = peers(2)
    step = plan(0.0, private=False, candidates=[r1, r2], held={r1: held(0, 100)}, backoff={}, config=CONFIG)
    assert step.reserve == () and step.drop == (r1,)


def test_a_private_peer_reserves_at_up_to_max_relays() -> None:
    r1, r2, r3 = peers(3)
    step = plan(0.0, private=True, candidates=[r1, r2, r3], held={}, backoff={}, config=CONFIG)
    assert step.reserve == (r1, r2) and step.drop == ()
    disabled = ReservationConfig(enabled=False)
    assert plan(0.0, private=True, candidates=[r1], held={}, backoff={}, config=disabled).reserve == ()


def test_renews_after_the_fraction_of_its_life_and_tops_up() -> None:
    r1, r2, r3 = peers(3)
    slots = {r1: held(0, 100), r2: held(40, 140)}
    assert plan(49.0, private=True, candidates=[r1, r2, r3], held=slots, backoff={}, config=CONFIG).reserve == ()
    step = plan(50.0, private=True, candidates=[r1, r2, r3], held=slots, backoff={}, config=CONFIG)
    assert step.reserve == (r1,)  # renewal of r1; r2 not yet due; r3 not needed (2 held)


def test_drops_a_slot_whose_relay_went_away_or_expired_and_replaces_it() -> None:
    r1, r2, r3 = peers(3)
    slots = {r1: held(0, 100), r2: held(0, 30)}
    step = plan(31.0, private=True, candidates=[r2, r3], held=slots, backoff={}, config=CONFIG)
    assert set(step.drop) == {r1, r2}
    assert step.reserve == (r3,)  # r2 expired: it is dropped, and r3 tried; r2 comes back next step


def test_a_relay_that_refused_is_left_alone_until_its_backoff_ends() -> None:
    r1, r2 = peers(2)
    assert plan(5.0, private=True, candidates=[r1, r2], held={}, backoff={r1: 10.0}, config=CONFIG).reserve == (r2,)
    assert plan(10.0, private=True, candidates=[r1, r2], held={}, backoff={r1: 10.0}, config=CONFIG).reserve == (
        r1,
        r2,
    )


def test_config_validates_and_has_profiles() -> None:
    assert ReservationConfig.local().check_interval_s < ReservationConfig.wan().check_interval_s
    assert ReservationConfig.lan() == ReservationConfig()
    with pytest.raises(ConfigError):
        ReservationConfig(renew_fraction=1.0)
    with pytest.raises(ConfigError):
        ReservationConfig(max_relays=0)


def test_only_relay_addresses_naming_the_relay_and_this_peer_are_kept() -> None:
    relay, me, other = peers(3)
    base = Multiaddr.parse(f"/ip4/198.18.0.1/tcp/4001/p2p/{relay}")
    good = str(CircuitAddr(base, me))
    wrong_target = str(CircuitAddr(base, other))
    wrong_relay = str(CircuitAddr(Multiaddr.parse(f"/ip4/198.18.0.1/tcp/4001/p2p/{other}"), me))
    answer = Reservation(ttl_s=60.0, addrs=(good, wrong_target, wrong_relay, "/ip4/1.2.3.4/tcp/1", "garbage"))
    assert circuit_addrs(relay, me, answer) == (CircuitAddr.parse(good),)
