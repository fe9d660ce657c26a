"""Reaching a peer that may sit behind NAT: directly if that works, through a relay if it does not.

A member behind NAT or a firewall cannot be dialled; its announced address (``198.19.0.10`` inside
its site, say) times out only after ``connect_timeout_s`` (5 s in ``lan``). Waiting that long on
every attempt before trying a relay made a newcomer's snapshot requests arrive after the members had
stepped past the snapshot's step, and its join was refused again and again (issue 21). So, in the
manner of "happy eyeballs" (RFC 8305): reuse any open connection (direct first, then relayed);
otherwise dial directly, and if that has not succeeded within ``relay_after_s`` (``TransportConfig``,
per profile) -- or has failed --
also try the relays this host is connected to, then the relay addresses among ``addrs`` (those a
private peer announces, ``protocols/relay.md`` §6: through its relays, dialing them if need be).
The first connection wins and the other attempt is cancelled; if that one had completed too (both
finished at once), its connection is closed, so no second connection to the peer lingers. A relayed
connection runs the same end-to-end handshake (the relay sees ciphertext only), so what a caller
sends over it arrives bit-identical.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

import anyio

from chaosp2p.errors import ChaosError, PeerUnreachable
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import Host
from chaosp2p.wire.circuit_addr import CircuitAddr, Dialable
from chaosp2p.wire.identity import PeerID
from chaosp2p.wire.multiaddr import Multiaddr


async def reach(
    host: Host,
    peer: PeerID,
    addrs: Sequence[Dialable],
    *,
    relay_after_s: float | None = None,
    any_relay: bool = True,
) -> Connection:
    """An open connection to ``peer``: an existing one, a new direct one, or one through a relay.

    ``relay_after_s`` defaults to the host's ``TransportConfig.relay_after_s``. ``any_relay=False``
    tries only the relay addresses among ``addrs``, not every relay this host is connected to: for
    callers that contact many peers, most of them public, where a dead one would cost a circuit
    request at each connected relay before it is reported unreachable. Raises
    :class:`PeerUnreachable` with both reasons when neither way works.
    """
    existing = host.connection(peer) or host.relayed_connection(peer)
    if existing is not None:
        return existing
    head_start_s = host.config.relay_after_s if relay_after_s is None else relay_after_s
    direct_addrs = [a for a in addrs if isinstance(a, Multiaddr)]
    circuits = [a for a in addrs if isinstance(a, CircuitAddr) and a.target == peer]
    won: list[tuple[Connection, bool]] = []  # each connection, and whether this call opened it
    errors: list[str] = []
    direct_failed = anyio.Event()

    async def direct(scope: anyio.CancelScope) -> None:
        try:
            before = host.connection(peer)
            connection = await host.connection_to(peer, direct_addrs)
            won.append((connection, connection is not before))
            scope.cancel()
        except ChaosError as exc:  # unreachable, or a handshake that failed: the relay may still work
            errors.append(str(exc))
            direct_failed.set()

    # The relays we are connected to, then the peer's announced relays (we need not be connected to them).
    ways: list[tuple[str, Callable[[], Awaitable[Connection]]]] = [
        *([("no relay reached it", functools.partial(host.relay.connect, peer))] if any_relay else []),
        *((str(c), functools.partial(host.relay.connect_addr, c)) for c in circuits),
    ]

    async def relayed(scope: anyio.CancelScope) -> None:
        with anyio.move_on_after(head_start_s):
            await direct_failed.wait()
        for name, way in ways:
            try:
                before = host.relayed_connection(peer)
                connection = await way()
                won.append((connection, connection is not before))
                scope.cancel()
                return
            except ChaosError as exc:
                errors.append(f"{name}: {exc}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(direct, tg.cancel_scope)
        tg.start_soon(relayed, tg.cancel_scope)
    if won:
        winner = won[0][0]
        for loser, opened_here in won[1:]:
            # Both attempts completed before the cancellation reached the slower one. Close its
            # connection unless another task uses it too (it existed before this attempt).
            if opened_here and loser is not winner:
                await loser.aclose(f"a parallel way to {peer.short()} connected first")
        return winner
    raise PeerUnreachable(f"cannot reach {peer}: " + "; ".join(errors))
