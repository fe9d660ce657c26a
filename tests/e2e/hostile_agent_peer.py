"""A real peer whose self-declared agent string is HTML, for the dashboard's escaping test.

Run as ``python -m tests.e2e.hostile_agent_peer --bootstrap ADDR --ready-file F``. Every connection
it opens or accepts introduces it with :data:`HOSTILE_AGENT` in its Hello, as a malicious peer may.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence
from typing import Any

import anyio

from chaosp2p import PeerConfig
from chaosp2p.cli_common import announce_ready
from chaosp2p.runtime.node import Node, open_node
from chaosp2p.transport.host import Host

HOSTILE_AGENT = "<img src=x onerror=window.pwned=1><script>pwned=2</script>"
"""58 characters: within the Hello's 64-character agent limit, so it reaches every peer intact."""


class HostileAgentNode(Node):
    """A node that names itself with markup (set before the host's first Hello is built)."""

    def __init__(self, *, host: Host, **options: Any) -> None:
        host.agent = HOSTILE_AGENT
        super().__init__(host=host, **options)


async def run(bootstrap: Sequence[str], ready_file: str) -> None:
    config = PeerConfig.local(listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=list(bootstrap))
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_node(config, node_class=HostileAgentNode) as node:
            await announce_ready(node.peer_id, node.addrs, ready_file)
            async for _ in signals:
                break


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    anyio.run(run, args.bootstrap, args.ready_file, backend="trio")


if __name__ == "__main__":
    main()
