"""Admission under a flood of idle connections: real peers still get in, ``status`` still answers.

The flood comes from this test process: a few hundred TCP connections to a real ``chaosp2p peer``
that never send a byte, each re-opened the moment the peer closes it. Everything is on 127.0.0.1,
so a per-address cap alone could not help here: the peer must rely on evicting the oldest idle
handshake and on the first-message deadline. The flood is bounded in connections and in time and
stops by itself.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from dataclasses import dataclass

import anyio
import pytest

from chaosp2p.errors import ChaosError
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.host import open_host
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

from .processes import Swarm, cli, swarm, wait_until

__all__ = ["swarm"]

FLOOD_SOCKETS = 300
FLOOD_MAX_CONNECTIONS = 200_000
FLOOD_MAX_S = 60.0
DIALS = 20


@dataclass
class FloodStats:
    opened: int = 0
    closed_by_peer: int = 0


class IdleFlood:
    """Holds ``sockets`` idle connections to ``port``, re-opening each as soon as it is closed."""

    def __init__(self, port: int, sockets: int) -> None:
        self.port = port
        self.sockets = sockets
        self.stats = FloodStats()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle flood", daemon=True)

    def __enter__(self) -> IdleFlood:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        started = time.monotonic()

        def open_one() -> None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", self.port))
            selector.register(sock, selectors.EVENT_READ)
            self.stats.opened += 1

        try:
            for _ in range(self.sockets):
                open_one()
            while (
                not self._stop.is_set()
                and self.stats.opened < FLOOD_MAX_CONNECTIONS
                and time.monotonic() - started < FLOOD_MAX_S
            ):
                for key, _ in selector.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(1)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:  # closed by the peer (evicted or timed out): come straight back
                        selector.unregister(sock)
                        sock.close()
                        self.stats.closed_by_peer += 1
                        open_one()
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            selector.close()


async def dial_many(addr: str, count: int) -> tuple[int, list[float]]:
    """Complete ``count`` fresh handshakes (+ a ping) with ``addr``; returns successes and their times."""
    successes, times = 0, []
    async with open_host(Identity.generate(), TransportConfig.local()) as host:
        for _ in range(count):
            started = time.monotonic()
            try:
                connection = await host.connect(Multiaddr.parse(addr))
                await connection.ping()
                await connection.aclose("done")
            except ChaosError:
                continue
            successes += 1
            times.append(time.monotonic() - started)
    return successes, times


def status_ok(addr: str) -> tuple[bool, dict[str, object] | None]:
    result = cli("status", addr, "--json", timeout_s=30)
    if result.returncode != 0:
        return False, None
    return True, json.loads(result.stdout)


@pytest.mark.timeout(180)
def test_a_peer_under_an_idle_connection_flood_still_admits_real_peers(swarm: Swarm) -> None:
    target = swarm.start(command=("peer", "--listen", "/ip4/127.0.0.1/tcp/0", "--profile", "local"))
    port = Multiaddr.parse(target.addr).port
    with IdleFlood(port, FLOOD_SOCKETS) as flood:
        # Wait until the flood has filled the admission table and is being churned through it.
        wait_until(
            lambda: flood.stats.closed_by_peer >= FLOOD_SOCKETS, timeout_s=30, what="the flood to fill the table"
        )
        status_answers = sum(status_ok(target.addr)[0] for _ in range(3))
        successes, times = anyio.run(dial_many, target.addr, DIALS)
        newcomer = swarm.start(
            bootstrap=[target.addr],
            command=("peer", "--listen", "/ip4/127.0.0.1/tcp/0", "--profile", "local"),
        )

        def newcomer_admitted() -> bool:
            ok, report = status_ok(target.addr)
            connections: list[dict[str, str]] = report["connections"] if ok and report else []  # type: ignore[assignment]
            return newcomer.peer_id in {c["peer_id"] for c in connections}

        wait_until(newcomer_admitted, timeout_s=30, what="a real peer to join through the flood", interval_s=0.5)
        churned = flood.stats.closed_by_peer
        assert flood.stats.opened - churned <= FLOOD_SOCKETS  # the flood really was held at its size
    times.sort()
    median_ms = times[len(times) // 2] * 1e3 if times else float("nan")
    print(
        f"under a flood of {FLOOD_SOCKETS} idle connections ({churned} closed by the peer and re-opened): "
        f"status answered {status_answers}/3, handshakes {successes}/{DIALS}, median {median_ms:.1f} ms"
    )
    assert status_answers == 3
    assert successes == DIALS
    assert target.process.poll() is None
    assert "admission table full" in target.log()  # it evicted, and said so (rate-limited)
