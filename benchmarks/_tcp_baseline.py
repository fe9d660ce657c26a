"""Plain, unencrypted TCP between two processes: the floor a state pull is compared with.

    python benchmarks/_tcp_baseline.py serve --bytes N --ready-file F   # sends N bytes to each client
    (the benchmark process connects and receives into a fresh buffer, as a pull does)

The sender holds the same bytes as a state source (one contiguous numpy buffer, already faulted in)
and writes them with ``sendall`` in 4 MiB slices; the receiver reads them with ``recv_into`` straight
into a freshly allocated buffer -- so both sides pay what a pull pays for memory, and nothing else.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from pathlib import Path

import numpy as np

SLICE_BYTES = 4 << 20


def serve(total: int, ready_file: Path) -> None:
    data = np.frombuffer(np.random.default_rng(0).bytes(total), dtype=np.uint8)
    view = memoryview(data)
    listener = socket.create_server(("127.0.0.1", 0))
    ready_file.write_text(json.dumps({"port": listener.getsockname()[1]}))
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for offset in range(0, total, SLICE_BYTES):
                conn.sendall(view[offset : offset + SLICE_BYTES])


def receive(port: int, total: int) -> float:
    """Seconds to receive ``total`` bytes from the sender on ``port`` into a fresh buffer."""
    started = time.perf_counter()
    buffer = np.empty(total, dtype=np.uint8)
    view = memoryview(buffer)
    with socket.create_connection(("127.0.0.1", port)) as conn:
        filled = 0
        while filled < total:
            got = conn.recv_into(view[filled:], min(total - filled, SLICE_BYTES))
            if not got:
                raise SystemExit("sender closed early")
            filled += got
    return time.perf_counter() - started


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve"])
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--ready-file", required=True)
    args = parser.parse_args()
    serve(args.bytes, Path(args.ready_file))
