"""Plumbing shared by training scripts that a harness drives (the examples use it).

Every example peer takes the same flags -- ``--join MULTIADDR`` (repeatable), ``--steps N``,
``--ready-file PATH``, ``--metrics-file PATH``, ``--profile NAME|FILE``, ``--listen MULTIADDR``
(repeatable; replaces the profile's listen addresses), ``--identity KEYFILE``, ``--admit PEER_ID``
(repeatable; a founder closes the run to those peers) -- and leaves the run gracefully on SIGTERM, so the
cluster harness and the tests can drive any of them the same way. ``--metrics-file`` receives one
JSON object per step::

    {"step", "epoch", "config_digest", "members", "loss", "samples", "round_s", "idle_s", "param_digest"}
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import IO, Any

from chaosp2p.atomic_file import write_bytes_atomically


def add_peer_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every example peer shares."""
    parser.add_argument(
        "--join", action="append", default=[], metavar="MULTIADDR", help="a peer of the swarm (repeatable)"
    )
    parser.add_argument(
        "--steps", type=int, default=200, help="train until this step (all members stop at the same step)"
    )
    parser.add_argument("--ready-file", type=Path, help='write {"peer_id", "addrs"} here once listening')
    parser.add_argument("--metrics-file", type=Path, help="append one JSON line per step here")
    parser.add_argument("--profile", default="local", help="peer profile: local, lan, wan or a TOML file")
    parser.add_argument(
        "--listen",
        action="append",
        default=[],
        metavar="MULTIADDR",
        help="listen here instead of the profile's addresses, e.g. /ip4/0.0.0.0/tcp/4001 (repeatable)",
    )
    parser.add_argument(
        "--identity",
        type=Path,
        default=None,
        metavar="KEYFILE",
        help="Ed25519 key file (created with mode 0600 if missing): a stable PeerID, e.g. for --admit",
    )
    parser.add_argument(
        "--admit",
        action="append",
        default=[],
        metavar="PEER_ID",
        help="when founding: close the run to these peers (repeatable; the founder is always in);"
        " every member refuses anyone else's join, and answers outsiders nothing about the run",
    )


def write_ready_file(path: Path | None, peer_id: str, addrs: list[str]) -> None:
    """Atomically write the ready file (a reader never sees half of it)."""
    if path is None:
        return
    # The temporary file (PATH.tmp) is created without following a link planted there.
    write_bytes_atomically(path, json.dumps({"peer_id": peer_id, "addrs": addrs}).encode(), suffix=".tmp")


class MetricsWriter:
    """One JSON line per record, flushed at once (a harness tails the file)."""

    def __init__(self, path: Path | None) -> None:
        self._file: IO[str] | None = path.open("a") if path is not None else None

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record``."""
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        """Close the file."""
        if self._file is not None:
            self._file.close()
            self._file = None


class StopSignal:
    """Turns SIGTERM (and SIGINT) into a flag the training loop checks: a graceful leave."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self._handle)

    def _handle(self, number: int, frame: FrameType | None) -> None:
        self.signal_name = signal.Signals(number).name
        self._event.set()

    @property
    def requested(self) -> bool:
        """Whether the process was asked to stop."""
        return self._event.is_set()
