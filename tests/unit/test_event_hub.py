"""peer.events(): no gap between subscribing and the first read; losses are counted."""

from __future__ import annotations

import gc

import pytest

from chaosp2p.runtime.events import EventHub

pytestmark = pytest.mark.anyio


async def test_events_published_before_the_first_read_are_delivered() -> None:
    hub = EventHub()
    subscription = hub.subscribe()
    hub.publish("joined")  # before anyone awaited __anext__
    hub.publish("failed")
    assert [await subscription.__anext__(), await subscription.__anext__()] == ["joined", "failed"]


async def test_overflow_drops_the_oldest_and_counts_it() -> None:
    hub = EventHub(buffer_size=2)
    subscription = hub.subscribe()
    for event in range(5):
        hub.publish(event)
    assert subscription.dropped == 3
    assert hub.dropped == 3
    assert [await subscription.__anext__(), await subscription.__anext__()] == [3, 4]


async def test_closed_subscription_ends_iteration_after_draining() -> None:
    hub = EventHub()
    async with hub.subscribe() as subscription:
        hub.publish(1)
    assert [event async for event in subscription] == [1]
    hub.publish(2)
    assert subscription.pending() == 0


async def test_an_abandoned_subscription_stops_receiving() -> None:
    hub = EventHub()
    subscription = hub.subscribe()
    del subscription
    gc.collect()
    hub.publish("nobody listens")
    assert hub.dropped == 0
    assert len(hub._subscribers) == 0
