"""The machine driver's timer task and its encoding of broadcasts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from chaosp2p.clock import MonotonicClock
from chaosp2p.dht.messages import DHT_CODEC, Ping
from chaosp2p.protocols.base import Outgoing
from chaosp2p.runtime.driver import MachineDriver
from chaosp2p.transport.config import TransportConfig
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message
from chaosp2p.wire.multiaddr import Multiaddr

pytestmark = pytest.mark.anyio


class QuietHost:
    """Enough of a Host for the driver: no connections, and every dial waits forever."""

    def __init__(self) -> None:
        self.peer_id = Identity.generate().peer_id
        self.config = TransportConfig.local()

    def set_message_handler(self, protocol: object, handler: object) -> None:
        pass

    def connection(self, peer: PeerID) -> None:
        return None

    async def connection_to(self, peer: PeerID, addrs: Sequence[Multiaddr] = ()) -> Any:
        await anyio.sleep_forever()


@dataclass
class Timed:
    """A machine with one timer the test moves; counts how often it fired."""

    deadline: float | None = None
    fired: list[float] = field(default_factory=list)
    out: list[Outgoing] = field(default_factory=list)
    fired_event: anyio.Event = field(default_factory=anyio.Event)

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        pass

    def handle_timeout(self, now: float) -> None:
        if self.deadline is not None and now >= self.deadline:
            self.fired.append(now)
            self.deadline = None
            self.fired_event.set()

    def next_deadline(self) -> float | None:
        return self.deadline

    def take_outgoing(self) -> list[Outgoing]:
        out, self.out = self.out, []
        return out

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        pass


class CountingCodec:
    """DHT_CODEC, counting encodes."""

    def __init__(self) -> None:
        self.encodes = 0

    def encode(self, message: Message) -> bytes:
        self.encodes += 1
        return DHT_CODEC.encode(message)

    def decode(self, body: bytes, *, max_bytes: int) -> Message:
        return DHT_CODEC.decode(body, max_bytes=max_bytes)


def driver_for(machine: Timed, tg: anyio.abc.TaskGroup, codec: Any = DHT_CODEC) -> MachineDriver:
    return MachineDriver(
        host=QuietHost(),  # type: ignore[arg-type]
        machine=machine,  # type: ignore[arg-type]
        codecs={"dht": codec},
        clock=MonotonicClock(),
        task_group=tg,
    )


async def test_a_deadline_moved_earlier_wakes_the_sleeping_timer() -> None:
    clock = MonotonicClock()
    machine = Timed(deadline=clock.now() + 3600)
    async with anyio.create_task_group() as tg:
        driver = driver_for(machine, tg)
        driver.start()
        await anyio.wait_all_tasks_blocked()  # the timer task sleeps until the far deadline
        driver.call(lambda now: setattr(machine, "deadline", now + 0.01))
        with anyio.fail_after(10):
            await machine.fired_event.wait()
        tg.cancel_scope.cancel()
    assert len(machine.fired) == 1


async def test_a_deadline_moved_later_fires_at_the_new_time_only() -> None:
    clock = MonotonicClock()
    machine = Timed(deadline=clock.now() + 0.02)
    async with anyio.create_task_group() as tg:
        driver = driver_for(machine, tg)
        driver.start()
        await anyio.wait_all_tasks_blocked()
        later = clock.now() + 0.2
        driver.call(lambda now: setattr(machine, "deadline", later))  # no wake-up: the task looks early
        with anyio.fail_after(10):
            await machine.fired_event.wait()
        tg.cancel_scope.cancel()
    assert machine.fired[0] >= later  # the early look did not fire it before its time


async def test_a_message_to_many_peers_is_encoded_once() -> None:
    codec = CountingCodec()
    machine = Timed()
    peers = [Identity.generate().peer_id for _ in range(5)]
    ping, other = Ping(request_id=1, sender_addrs=()), Ping(request_id=2, sender_addrs=())
    async with anyio.create_task_group() as tg:
        driver = driver_for(machine, tg, codec)
        machine.out = [Outgoing(to=p, protocol="dht", message=ping) for p in peers]
        machine.out.append(Outgoing(to=peers[0], protocol="dht", message=other))
        driver.flush()
        assert codec.encodes == 2
        assert [body for _, body in driver._queues[peers[1]]] == [DHT_CODEC.encode(ping)]
        assert [body for _, body in driver._queues[peers[0]]] == [DHT_CODEC.encode(ping), DHT_CODEC.encode(other)]
        tg.cancel_scope.cancel()
