"""``peer.dht``: the Kademlia DHT as awaitable calls.

The DHT machine runs under a :class:`MachineDriver`; each call here starts an operation on the
machine and waits for its ``DHTOperationDone`` event. Bootstrap needs the driver's help in two
places, both handled here: a bootstrap address without ``/p2p/`` must be dialed to learn whose it
is, and every new connection is a direct contact the routing table may admit.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import anyio.abc

from chaosp2p.clock import Clock
from chaosp2p.dht import (
    DHT_CODEC,
    AddProviderResult,
    BootstrapDialRequested,
    BootstrapResult,
    BootstrapRetrying,
    DHTMachine,
    DHTOperationDone,
    FindPeerResult,
    GetProvidersResult,
    GetResult,
    OperationResult,
    ProviderRecord,
    StoreResult,
    signed_key,
)
from chaosp2p.dht.contacts import announced_relay_addrs
from chaosp2p.errors import ChaosError
from chaosp2p.runtime.driver import MachineDriver
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host
from chaosp2p.wire.circuit_addr import CircuitAddr
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr

log = logging.getLogger("chaosp2p.dht")

R = TypeVar("R", bound=OperationResult)


def _key(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else key


class DHTService:
    """Async access to the DHT: ``store``, ``get``, ``find_peer``, provider records."""

    def __init__(
        self,
        *,
        machine: DHTMachine,
        host: Host,
        clock: Clock,
        task_group: anyio.abc.TaskGroup,
        publish: Callable[[Any], None],
    ) -> None:
        self.machine = machine
        self._host = host
        self._clock = clock
        self._task_group = task_group
        self._publish = publish
        self._waiters: dict[int, anyio.Event] = {}
        self._results: dict[int, OperationResult] = {}
        self.driver = MachineDriver(
            host=host,
            machine=machine,
            codecs={"dht": DHT_CODEC},
            clock=clock,
            task_group=task_group,
            resolve=machine.dial_addrs,
            on_event=self._on_event,
            after_flush=self._after_flush,
            name="dht",
            # A private peer found in a lookup is reached at the relay addresses it announced
            # (``protocols/dht.md`` §3.1), through a relay this peer need not be connected to. Only
            # there: a lookup meets many peers, and a dead one must be reported at once, not after
            # a circuit request at every relay this peer is connected to.
            relay=True,
            any_relay=False,
        )
        self._changed = anyio.Event()
        host.on_connection_change(self._on_connection)

    def start(self, bootstrap: Sequence[Multiaddr]) -> None:
        """Start timers and, if given, bootstrap through ``bootstrap``."""
        self.machine.set_listen_addrs([str(a) for a in self._host.listen_addrs])
        self.driver.start()
        if bootstrap:
            peers = [(addr.peer_id, str(addr.without_peer())) for addr in bootstrap]
            self.driver.call(lambda now: self.machine.start_bootstrap(now, peers))

    # ------------------------------------------------------------------ public operations
    async def store(self, key: bytes | str, value: bytes, *, ttl_s: float | None = None) -> StoreResult:
        """Store ``value`` under ``key`` on the k closest peers (unsigned key space)."""
        return await self._run(lambda now: self.machine.start_store(now, _key(key), value, ttl_s=ttl_s), StoreResult)

    async def store_signed(self, name: bytes | str, value: bytes, *, ttl_s: float | None = None) -> StoreResult:
        """Store ``value`` under ``/pk/<our peer id>/<name>``, which only we can ever replace."""
        key = signed_key(self._host.peer_id, _key(name))
        return await self._run(lambda now: self.machine.start_store(now, key, value, ttl_s=ttl_s), StoreResult)

    async def get(self, key: bytes | str) -> bytes | None:
        """The newest valid value under ``key``, or ``None`` if nobody holds one."""
        return (await self.get_record(key)).value

    async def get_record(self, key: bytes | str) -> GetResult:
        """Like :meth:`get`, with the record's version and the lookup's statistics."""
        return await self._run(lambda now: self.machine.start_get(now, _key(key)), GetResult)

    async def get_signed(self, owner: PeerID, name: bytes | str) -> bytes | None:
        """The value ``owner`` stored with :meth:`store_signed`."""
        return await self.get(signed_key(owner, _key(name)))

    async def find_peer(self, peer: PeerID) -> FindPeerResult:
        """Look up a peer's addresses."""
        return await self._run(lambda now: self.machine.start_find_peer(now, peer), FindPeerResult)

    async def add_provider(self, key: bytes | str, *, ttl_s: float | None = None) -> AddProviderResult:
        """Announce that this peer provides ``key`` (e.g. a state version of a run)."""
        return await self._run(
            lambda now: self.machine.start_add_provider(now, _key(key), ttl_s=ttl_s), AddProviderResult
        )

    async def get_providers(self, key: bytes | str) -> tuple[ProviderRecord, ...]:
        """Verified provider records for ``key`` (newest per provider)."""
        result = await self._run(lambda now: self.machine.start_get_providers(now, _key(key)), GetProvidersResult)
        return result.providers

    def set_relay_addrs(self, addrs: Sequence[CircuitAddr]) -> None:
        """Announce where this peer is relayed (empty: nowhere) in its DHT requests and provider records.

        Relays listening on several addresses may give more than a contact carries: then every
        relay keeps its first addresses (:func:`~chaosp2p.dht.contacts.announced_relay_addrs`).
        """
        self.driver.call(self.machine.set_relay_addrs, announced_relay_addrs(addrs, self.machine.max_relay_addrs))

    def statistics(self) -> Any:
        """The DHT machine's counters."""
        return self.machine.statistics()

    def contacts(self) -> list[PeerID]:
        """The peers in this peer's routing table (whom to ask when the membership view is young)."""
        return [entry.peer_id for entry in self.machine.routing_table]

    @property
    def ready(self) -> bool:
        """True once the routing table knows at least one other peer."""
        return len(self.machine.routing_table) > 0

    async def wait_ready(self) -> None:
        """Return once the routing table knows another peer (bound it with ``anyio.fail_after``)."""
        while not self.ready:
            self._changed = anyio.Event()
            await self._changed.wait()

    # ------------------------------------------------------------------ plumbing
    def _after_flush(self) -> None:
        self._changed.set()

    async def _run(self, start: Callable[[float], int], kind: type[R]) -> R:
        done = anyio.Event()
        # Register the waiter before flushing: an operation answered from local state completes
        # during the flush, and its event must find someone waiting.
        op_id = start(self._clock.now())
        self._waiters[op_id] = done
        self.driver.flush()
        try:
            await done.wait()
        finally:
            self._waiters.pop(op_id, None)
        result = self._results.pop(op_id)
        if not isinstance(result, kind):
            raise ChaosError(f"DHT operation {op_id} returned {type(result).__name__}, expected {kind.__name__}")
        return result

    def _on_event(self, event: Any) -> None:
        if isinstance(event, DHTOperationDone):
            waiter = self._waiters.get(event.op_id)
            if waiter is not None:
                self._results[event.op_id] = event.result
                waiter.set()
            elif isinstance(event.result, BootstrapResult):
                log.info("DHT bootstrapped: %d peers in the routing table", event.result.routing_table_size)
                self._publish(event.result)
        elif isinstance(event, BootstrapDialRequested):
            self._task_group.start_soon(self._dial_bootstrap, event.addr)
        elif isinstance(event, BootstrapRetrying):
            log.warning(
                "DHT bootstrap attempt %d failed (%s); retrying in %.1f s", event.attempt, event.reason, event.delay_s
            )
            self._publish(event)

    async def _dial_bootstrap(self, addr: str) -> None:
        try:
            connection = await self._host.connect(addr)
        except ChaosError as exc:
            log.debug("bootstrap dial %s failed: %s", addr, exc)
            return
        peer = connection.remote_peer
        self.driver.call(lambda now: self.machine.add_contact(now, peer, (addr,)))

    def _on_connection(self, connection: Connection, opened: bool) -> None:
        if not opened or connection.remote_hello is None or not connection.supports("dht"):
            return
        addrs = connection.remote_hello.listen_addrs
        if addrs:
            peer = connection.remote_peer
            self.driver.call(lambda now: self.machine.add_contact(now, peer, addrs))

