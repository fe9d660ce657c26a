"""A state source for benchmarks/state.py: builds a deterministic model + Adam state and serves it.

    python benchmarks/_state_source.py --bytes N --seed S --run R --ready-file F [--cap BYTES_PER_S] [--bootstrap A]
                                       [--profile local|lan]

Every source started with the same --bytes/--seed serves byte-identical state.
"""

from __future__ import annotations

import argparse
import logging
import signal

import anyio
from _state_data import model_and_adam_state

from chaosp2p import PeerConfig, SnapshotStore, open_peer
from chaosp2p.cli.common import announce_ready
from chaosp2p.transport.config import TransportConfig


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    base = PeerConfig.profile_named(args.profile)
    transport = base.transport
    if args.cap:
        transport = TransportConfig(**{**_fields(transport), "max_upload_bytes_per_s": args.cap})
    config = PeerConfig.profile_named(
        args.profile, listen=("/ip4/127.0.0.1/tcp/0",), bootstrap=tuple(args.bootstrap), transport=transport
    )
    store = SnapshotStore(config.transfer)
    store.publish(args.run, args.step, model_and_adam_state(args.bytes, args.seed))
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_peer(config) as peer:
            await peer.serve_state(store)
            await announce_ready(peer.peer_id, peer.addrs, args.ready_file)
            async for _ in signals:
                break


def _fields(config: TransportConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run", default="bench")
    parser.add_argument("--step", type=int, default=1000)
    parser.add_argument("--cap", type=float, default=None, help="upload cap in bytes/s")
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--profile", choices=["local", "lan"], default="local", help="timing of the source peer")
    parser.add_argument("--ready-file", required=True)
    anyio.run(main, parser.parse_args(), backend="trio")
