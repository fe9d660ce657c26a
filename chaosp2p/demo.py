"""``chaosp2p demo``: a local swarm that finds itself, on loopback, with the built-in defaults."""

from __future__ import annotations

from contextlib import AsyncExitStack

import anyio
from rich.console import Console

from chaosp2p.api import AsyncPeer, open_peer
from chaosp2p.runtime.config import PeerConfig


async def run_demo(peer_count: int, console: Console) -> None:
    """Start ``peer_count`` peers bootstrapped from the first and report what each one sees."""
    console.rule("[bold]chaosp2p demo")
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_peer(PeerConfig.local()))
        console.print(f"peer 1 listening on [cyan]{first.addrs[0]}[/]")
        peers: list[AsyncPeer] = [first]
        for index in range(2, peer_count + 1):
            peer = await stack.enter_async_context(open_peer(PeerConfig.local(bootstrap=(str(first.addrs[0]),))))
            peers.append(peer)
            console.print(f"peer {index} [green]joined[/] through peer 1 as {peer.peer_id.short()}")
        with anyio.fail_after(10):
            await first.wait_connected(peer_count - 1)
        console.print(f"peer 1 sees {len(first.connected_peers())} connected peers")
    console.rule("[bold]done")
