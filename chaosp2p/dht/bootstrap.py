"""The DHT machine joining the network: bootstrap attempts with backoff, and contacts the driver resolved.

Theory of operation
-------------------
``start_bootstrap`` gets the bootstrap addresses; each *attempt* is a BOOTSTRAP operation, a
self-lookup seeded with every bootstrap peer whose PeerID is known (from ``/p2p/`` or given) and
every peer the driver resolved so far. It succeeds once any peer answered (the lookup has a
closest contact): the lookup itself filled the routing table, and a :class:`BootstrapResult`
reports it. An attempt nobody answered fails: :class:`BootstrapRetrying` is announced and the next
attempt follows after an exponential backoff with jitter (BOOTSTRAP_RETRY), for as long as the
driver keeps the machine running. The states are :class:`~chaosp2p.dht.operation.BootstrapState`.

An address without ``/p2p/`` cannot be the target of a datagram, so every attempt emits
:class:`BootstrapDialRequested` for it and stays open ``2 * request_timeout_s`` (BOOTSTRAP_WAIT)
even if every known peer already failed. The driver dials, learns the PeerID from the secure
handshake and calls :meth:`Bootstrapping.add_contact`: the peer joins the running attempt at once,
or starts the next one at once during a backoff. Outside a bootstrap, ``add_contact`` pings the
peer, which enters the routing table when it answers.
"""

from __future__ import annotations

from collections.abc import Sequence

from chaosp2p.dht.events import (
    BootstrapDialRequested,
    BootstrapResult,
    BootstrapRetrying,
    DHTOperationDone,
    LookupStats,
)
from chaosp2p.dht.messages import Contact, Ping
from chaosp2p.dht.operation import (
    BootstrapState,
    LookupKind,
    LookupQuery,
    Operation,
    OpPhase,
    RequestKind,
)
from chaosp2p.dht.querying import Querying
from chaosp2p.dht.timers import DHTTimer
from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr


class Bootstrapping(Querying):
    """Bootstrap attempts and the contacts the driver hands in."""

    @property
    def bootstrap_state(self) -> BootstrapState:
        """Where bootstrapping stands."""
        return self._boot.state

    def start_bootstrap(self, now: float, peers: Sequence[tuple[PeerID | None, str]]) -> int:
        """Join the DHT through ``peers`` (``(PeerID or None, multiaddr)``); returns the op id.

        Completes (``DHTOperationDone`` with :class:`BootstrapResult`) once any bootstrap peer
        answered the self-lookup. Until then every failed attempt emits :class:`BootstrapRetrying`
        and the next one follows after an exponential backoff; addresses without a PeerID emit
        :class:`BootstrapDialRequested` on every attempt.
        """
        if not peers:
            raise ConfigError("start_bootstrap needs at least one bootstrap address")
        if self._boot.active:
            raise LocalProtocolError("a bootstrap is already running")
        resolved: list[tuple[PeerID | None, str]] = []
        for peer, text in peers:
            addr = Multiaddr.parse(text)
            if addr.peer_id is not None:
                if peer is not None and peer != addr.peer_id:
                    raise ConfigError(f"bootstrap address {text} names another peer than {peer}")
                peer = addr.peer_id
            if peer == self.peer_id:
                continue
            resolved.append((peer, str(addr)))
        if not resolved:
            raise ConfigError("start_bootstrap: every bootstrap address is our own")
        boot = self._boot
        boot.peers = resolved
        boot.extra = {}
        boot.attempts = 0
        boot.started_at = now
        boot.op_id = self._new_op_id()
        boot.move(BootstrapState.RUNNING)
        self._bootstrap_attempt(now)
        return boot.op_id

    def add_contact(self, now: float, peer: PeerID, addrs: Sequence[str]) -> None:
        """The driver knows ``peer`` is at ``addrs`` (e.g. it resolved a bootstrap address).

        During a bootstrap attempt the peer joins the attempt at once (a retry in backoff starts
        immediately); otherwise it is pinged and enters the routing table when it answers.
        """
        if peer == self.peer_id:
            return
        checked = tuple(addrs)
        if not self._validator.valid(peer, checked):
            raise ConfigError(f"invalid addresses for {peer}: {checked!r}")
        contact = Contact(peer_id=peer, addrs=checked)
        self._remember(contact)
        boot = self._boot
        if boot.active:
            boot.extra[peer] = contact
            if boot.state is BootstrapState.BACKOFF:
                boot.move(BootstrapState.RUNNING)
                self._bootstrap_attempt(now)
            elif boot.op is not None and boot.op.phase is OpPhase.LOOKUP:
                boot.op.lookup.add(contact, depth=0)
                self._pump(now, boot.op)
            return
        ping = Ping(request_id=self._new_request_id(), sender_addrs=self._listen_addrs,
                    sender_relay_addrs=self._relay_addrs)
        self._send_request(now, contact, ping, RequestKind.PING, None)

    def _bootstrap_attempt(self, now: float) -> None:
        boot = self._boot
        boot.attempts += 1
        self._counts["bootstrap_attempts"] += 1
        own = self.routing_table.own_id
        op = self._new_op(now, LookupKind.BOOTSTRAP, LookupQuery.FIND_NODE, own, report=False, op_id=boot.op_id)
        unresolved = [addr for peer, addr in boot.peers if peer is None]
        for peer, addr in boot.peers:
            if peer is not None:
                op.lookup.add(Contact(peer_id=peer, addrs=(addr,)), depth=0)
        for contact in boot.extra.values():
            op.lookup.add(contact, depth=0)
        for addr in unresolved:
            self._events.append(BootstrapDialRequested(addr=addr))
        if unresolved:
            self._timers.arm(DHTTimer.BOOTSTRAP_WAIT, now + 2 * self.config.request_timeout_s)
        else:
            self._timers.cancel(DHTTimer.BOOTSTRAP_WAIT)
        boot.op = op
        self._pump(now, op)

    def _bootstrap_lookup_finished(self, now: float, op: Operation) -> None:
        boot = self._boot
        boot.op = None
        self._timers.cancel(DHTTimer.BOOTSTRAP_WAIT)
        self._ops.pop(op.op_id, None)
        op.move(OpPhase.DONE)
        if op.lookup.closest(1):
            boot.move(BootstrapState.DONE)
            result = BootstrapResult(
                attempts=boot.attempts,
                routing_table_size=len(self.routing_table),
                stats=LookupStats(hops=op.lookup.hops(), messages=op.lookup.messages,
                                  failures=op.lookup.failures, duration_s=now - boot.started_at),
            )
            self._events.append(DHTOperationDone(op_id=op.op_id, result=result))
            return
        boot.move(BootstrapState.BACKOFF)
        cfg = self.config
        base = min(cfg.bootstrap_backoff_max_s, cfg.bootstrap_backoff_min_s * 2 ** min(boot.attempts - 1, 30))
        delay = base * (0.5 + 0.5 * self._rng.random())
        self._timers.arm(DHTTimer.BOOTSTRAP_RETRY, now + delay)
        tried = len(boot.peers) + len(boot.extra)
        self._events.append(BootstrapRetrying(
            attempt=boot.attempts, delay_s=delay, retry_at=now + delay,
            reason=f"none of {tried} bootstrap peers answered",
        ))

    # ================================================================== timers
    def _bootstrap_retry_due(self, now: float) -> None:
        self._timers.cancel(DHTTimer.BOOTSTRAP_RETRY)
        if self._boot.state is BootstrapState.BACKOFF:
            self._boot.move(BootstrapState.RUNNING)
            self._bootstrap_attempt(now)

    def _bootstrap_wait_over(self, now: float) -> None:
        self._timers.cancel(DHTTimer.BOOTSTRAP_WAIT)
        op = self._boot.op
        if op is not None and op.phase is OpPhase.LOOKUP:
            self._pump(now, op)
