"""The machine driver's send queues: bounded, and ``wait_sent`` always ends (issue 10)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from chaosp2p.clock import MonotonicClock
from chaosp2p.dht.messages import DHT_CODEC, Ping
from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.base import Outgoing
from chaosp2p.runtime import driver as driver_module
from chaosp2p.runtime.driver import MachineDriver
from chaosp2p.transport.config import TransportConfig
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message
from chaosp2p.wire.multiaddr import Multiaddr

pytestmark = pytest.mark.anyio


class UnreachableHost:
    """Enough of a Host for the driver: every dial hangs until ``release`` is set, then fails."""

    def __init__(self) -> None:
        self.peer_id = Identity.generate().peer_id
        self.config = TransportConfig.local()
        self.release = anyio.Event()

    def set_message_handler(self, protocol: object, handler: object) -> None:
        pass

    def connection(self, peer: PeerID) -> None:
        return None  # never connected: every message goes through a sender task and its dial

    async def connection_to(self, peer: PeerID, addrs: Sequence[Multiaddr] = ()) -> Any:
        await self.release.wait()
        raise PeerUnreachable(f"{peer} is down")


@dataclass
class Talker:
    """A machine that only sends what the test puts in ``out``."""

    out: list[Outgoing] = field(default_factory=list)
    unreachable: list[PeerID] = field(default_factory=list)

    def receive(self, now: float, sender: PeerID, protocol: str, message: Message) -> None:
        pass

    def handle_timeout(self, now: float) -> None:
        pass

    def next_deadline(self) -> float | None:
        return None

    def take_outgoing(self) -> list[Outgoing]:
        out, self.out = self.out, []
        return out

    def peer_unreachable(self, now: float, peer: PeerID) -> None:
        self.unreachable.append(peer)


async def test_a_message_beyond_the_sender_cap_never_leaves_wait_sent_hanging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_module, "MAX_SENDERS", 2)
    host, machine = UnreachableHost(), Talker()
    peers = [Identity.generate().peer_id for _ in range(3)]
    async with anyio.create_task_group() as tg:
        driver = MachineDriver(
            host=host,  # type: ignore[arg-type]
            machine=machine,
            codecs={"dht": DHT_CODEC},
            clock=MonotonicClock(),
            task_group=tg,
        )
        machine.out = [Outgoing(to=p, protocol="dht", message=Ping(request_id=1, sender_addrs=())) for p in peers]
        driver.flush()
        assert driver.dropped_outgoing == 1  # the third peer would need a third sender
        host.release.set()
        with anyio.fail_after(5):
            await driver.wait_sent()  # returned: no queue was left without a sender
        assert sorted(machine.unreachable, key=str) == sorted(peers[:2], key=str)
        tg.cancel_scope.cancel()


async def test_a_full_queue_drops_and_still_drains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver_module, "MAX_QUEUED_PER_PEER", 3)
    host, machine = UnreachableHost(), Talker()
    peer = Identity.generate().peer_id
    async with anyio.create_task_group() as tg:
        driver = MachineDriver(
            host=host,  # type: ignore[arg-type]
            machine=machine,
            codecs={"dht": DHT_CODEC},
            clock=MonotonicClock(),
            task_group=tg,
        )
        machine.out = [Outgoing(to=peer, protocol="dht", message=Ping(request_id=i, sender_addrs=())) for i in range(5)]
        driver.flush()
        assert driver.dropped_outgoing == 2
        host.release.set()
        with anyio.fail_after(5):
            await driver.wait_sent()
        assert driver.dropped_outgoing == 5  # the three queued ones were given up on when the peer failed
        tg.cancel_scope.cancel()
