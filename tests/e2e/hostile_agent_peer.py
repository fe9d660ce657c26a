"""A real peer that names itself and a training run with HTML, for the dashboard's escaping test.

Run as ``python -m tests.e2e.hostile_agent_peer --bootstrap ADDR --ready-file F``. Every connection
it opens or accepts introduces it with :data:`HOSTILE_AGENT` in its Hello, and its status reports a
run whose id is :data:`HOSTILE_RUN`, as a malicious peer may.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
from collections.abc import Sequence
from typing import Any

import anyio

from chaosp2p import PeerConfig
from chaosp2p.cli.common import announce_ready
from chaosp2p.runtime.node import Node, open_node
from chaosp2p.runtime.status import RunStatusInfo, StatusConfig, StatusReport
from chaosp2p.transport.host import Host

HOSTILE_AGENT = "<img src=x onerror=window.pwned=1><script>pwned=2</script>"
"""58 characters: within the Hello's 64-character agent limit, so it reaches every peer intact."""
HOSTILE_RUN = '"><svg onload=window.pwned=3><script>window.pwned=4</script>'


class HostileAgentNode(Node):
    """A node that names itself with markup (set before the host's first Hello is built)."""

    def __init__(self, *, host: Host, **options: Any) -> None:
        host.agent = HOSTILE_AGENT
        super().__init__(host=host, **options)

    def status_report(self) -> StatusReport:
        """The real report, plus a run with a hostile id that this peer claims to train."""
        report = super().status_report()
        run = RunStatusInfo(
            run=HOSTILE_RUN, epoch=7, step=1234, config_digest="<b>digest</b>", members=(str(self.peer_id),)
        )
        return dataclasses.replace(report, runs=(*report.runs, run))


async def run(bootstrap: Sequence[str], ready_file: str) -> None:
    # It shows its (hostile) run to anyone who asks, as a peer may choose to (runs are members-only
    # by default): the dashboard observer must render what it reports as text.
    config = PeerConfig.local(
        listen=["/ip4/127.0.0.1/tcp/0"], bootstrap=list(bootstrap), status=StatusConfig(runs_visible_to="anyone")
    )
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
