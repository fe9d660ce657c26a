"""One host of the firewalled hole-punching test (``test_holepunch_firewall.py``), run in a namespace.

``python punch_agent.py ROLE IP FOLDER [witnessed]``: ``relay`` (and ``witness``) listens and writes
``relay.addr`` (``witness.addr``); ``target`` connects to the relay (and with ``witnessed`` to the
witness too: a second observer of its source ports), writes ``target.addr`` and serves punches;
``source`` does the same connects, checks its reachability (the relay dials it back), tries to
dial the target directly (the target's firewall drops it), reaches it through the relay, punches,
and writes ``result.json``. Every role ends when ``FOLDER/stop`` appears.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import anyio

from chaosp2p.errors import PeerUnreachable
from chaosp2p.protocols.holepunch import HolePunchConfig
from chaosp2p.protocols.reachability import ReachabilityConfig
from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.holepunch import HolePunchService
from chaosp2p.transport.host import open_host
from chaosp2p.transport.reachability import ReachabilityService
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

CONFIG = TransportConfig(handshake_timeout_s=3.0, connect_timeout_s=1.5, request_timeout_s=5.0)
PUNCH = HolePunchConfig.lan()
REACH = ReachabilityConfig.local()


class Lines(logging.Handler):
    """Keeps the hole-punching log lines."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "hole punch" in record.getMessage():
            self.lines.append(record.getMessage())


async def echo(connection: Connection, request: Any) -> Any:
    return request


async def wait_for(path: Path) -> str:
    file = anyio.Path(path)
    with anyio.fail_after(60):
        while not await file.exists():  # noqa: ASYNC110 - another process writes it
            await anyio.sleep(0.05)
    return await file.read_text()


async def main(role: str, ip: str, folder: Path, witnessed: bool) -> None:
    lines = Lines()
    logging.getLogger("chaosp2p.transport").addHandler(lines)
    logging.getLogger("chaosp2p.transport").setLevel(logging.INFO)
    async with open_host(Identity.generate(), CONFIG) as host:
        punches = HolePunchService(host, PUNCH)
        reach = ReachabilityService(host, REACH)
        host.set_request_handler("/chaos/echo/1", echo)
        addr = await host.listen(f"/ip4/{ip}/tcp/0")
        if role in ("relay", "witness"):
            (folder / f"{role}.addr").write_text(str(addr))
        else:
            await host.connect(await wait_for(folder / "relay.addr"))
            if witnessed:
                await host.connect(await wait_for(folder / "witness.addr"))
        if role == "target":
            (folder / "target.addr").write_text(str(addr))
        if role == "source":
            target = Multiaddr.parse(await wait_for(folder / "target.addr"))
            assert target.peer_id is not None
            result: dict[str, Any] = {"reachability": (await reach.check()).value}
            result["port_mapping"] = host.observed.port_mapping().value
            try:
                await host.connect(target)
                result["direct_dial"] = "connected"
            except PeerUnreachable as exc:
                result["direct_dial"] = str(exc)
            relayed = await host.relay.connect(target.peer_id)
            result["relayed"] = relayed.relayed
            started = anyio.current_time()
            try:
                direct = await punches.punch(target.peer_id)
                result["punch_s"] = round(anyio.current_time() - started, 3)
                result["punched"] = not direct.relayed
                result["echo"] = await direct.request("echo", "direct")
                result["is_dialer"] = direct.is_dialer
                result["direct_remote"] = list(direct.remote_address)[:2]
            except PeerUnreachable as exc:
                result["punched"] = False
                result["error"] = str(exc)
            result["relayed_echo"] = await relayed.request("echo", "relayed")
            result["lines"] = lines.lines
            (folder / "result.json").write_text(json.dumps(result))
        await wait_for(folder / "stop")
        if role == "target":
            report = {
                "punched": punches.punched,
                "refused": punches.refused,
                "port_mapping": host.observed.port_mapping().value,
                "lines": lines.lines,
            }
            (folder / "target.json").write_text(json.dumps(report))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4:] == ["witnessed"], backend="trio")
