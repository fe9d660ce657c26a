"""A hostile state source for end-to-end tests: serves a checkpoint whose bytes rot after hashing.

Run as ``python -m tests.e2e.corrupt_source CHECKPOINT --run R --bootstrap ADDR --ready-file F``.
The manifest (and its chunk hashes) describe the true checkpoint; the bytes actually sent have one
byte flipped in every chunk, as a faulty disk or a malicious peer would produce.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Sequence

import anyio
import numpy as np

from chaosp2p import PeerConfig, open_peer
from chaosp2p.cli.common import announce_ready
from chaosp2p.protocols.transfer import PinnedSnapshot
from chaosp2p.protocols.transfer.messages import VersionInfo
from chaosp2p.state.checkpoint_file import read_checkpoint
from chaosp2p.state.manifest import Manifest
from chaosp2p.state.snapshot import SnapshotStore


class RottenSnapshot:
    """A pinned snapshot whose manifest is honest but whose bytes have one flipped byte per chunk."""

    def __init__(self, pinned: PinnedSnapshot, chunk_bytes: int) -> None:
        self._pinned = pinned
        damaged = np.frombuffer(pinned.data, dtype=np.uint8).copy()
        damaged[::chunk_bytes] ^= 0xFF
        self._data = memoryview(damaged).toreadonly()

    @property
    def manifest(self) -> Manifest:
        return self._pinned.manifest

    @property
    def manifest_body(self) -> bytes:
        return self._pinned.manifest_body

    @property
    def digest(self) -> bytes:
        return self._pinned.digest

    @property
    def data(self) -> memoryview:
        return self._data

    def release(self) -> None:
        self._pinned.release()


class RottenCatalog:
    """Serves a real store's versions, but every pinned snapshot rots."""

    def __init__(self, store: SnapshotStore, chunk_bytes: int) -> None:
        self._store = store
        self._chunk_bytes = chunk_bytes

    def versions(self, run: str) -> Sequence[VersionInfo] | None:
        return self._store.versions(run)

    def pin(self, run: str, step: int) -> PinnedSnapshot | None:
        pinned = self._store.pin(run, step)
        return None if pinned is None else RottenSnapshot(pinned, self._chunk_bytes)


async def main(args: argparse.Namespace) -> None:
    config = PeerConfig.local(bootstrap=tuple(args.bootstrap))
    store = SnapshotStore(config.transfer)
    store.publish(args.run, args.step, read_checkpoint(args.checkpoint))
    catalog = RottenCatalog(store, config.transfer.chunk_bytes)
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_peer(config) as peer:
            await peer.serve_state(catalog)  # not announced: the tests name this source explicitly
            await announce_ready(peer.peer_id, peer.addrs, args.ready_file)
            async for _ in signals:
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--run", required=True)
    parser.add_argument("--step", type=int, default=0)
    parser.add_argument("--bootstrap", action="append", default=[])
    parser.add_argument("--ready-file", required=True)
    anyio.run(main, parser.parse_args(), backend="trio")
