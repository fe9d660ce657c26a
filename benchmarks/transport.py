"""Transport benchmark: encrypted chaosp2p streams vs plain anyio TCP, and RPC vs a raw echo.

    python benchmarks/transport.py [--gib 1] [--repeats 3] [--backend trio] [--relay] [--json out.json]

Sender and receiver are two processes on 127.0.0.1. Every figure is a median over repeats and is
reported next to the plain-TCP baseline measured in the same run, as a ratio.

``--relay`` adds a third process, a relay R connected to the receiver: the sender also moves the
same bytes over one stream of a connection relayed by R (``/chaos/relay/1``: the end-to-end
encrypted connection runs inside the two streams A-R and R-B), right after the direct transfer
of each repeat, and R's CPU time (user + system, from ``/proc``) is read around the relayed
transfers only: seconds of relay CPU per GB relayed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

# Run as a script, so its own folder is on sys.path and the shared helpers import directly.
from _common import median, percentile, print_table, write_json

from chaosp2p.transport.config import TransportConfig
from chaosp2p.transport.connection import Connection
from chaosp2p.transport.host import open_host
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import Identity

WRITE_BYTES = 4 << 20
CONFIG = TransportConfig(max_window_bytes=64 << 20, request_timeout_s=60.0)


# ----------------------------------------------------------------------------------------- server
def make_sink() -> Callable[[Stream], Awaitable[None]]:
    """The ``sink`` stream handler: reads the announced number of bytes into a reused buffer and
    answers with the count (shared with ``nat_relay.py``)."""
    sink_buffer = bytearray(64 << 20)

    async def sink(stream: Stream) -> None:
        stream.set_receive_window(16 << 20)
        header = await stream.receive_frame()
        total = int(header)
        view = memoryview(sink_buffer)
        done = 0
        while done < total:
            count = min(WRITE_BYTES, total - done)
            offset = done % (len(view) - WRITE_BYTES)
            await stream.receive_into(view[offset : offset + count])
            done += count
        # Wait for the sender's end of stream before answering: a handler that returns while the
        # remote is still open has its stream reset (the sender's send_eof would then fail).
        if await stream.receive_frame() is not None:
            raise RuntimeError("the sender sent more than it announced")
        await stream.send_frame(done, eof=True)

    return sink


async def serve() -> None:
    """Both servers in one process; prints their addresses as one JSON line, then serves forever."""

    async def plain_client(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            mode = await stream.receive(1)
            if mode == b"E":  # echo 32-byte messages until EOF
                while True:
                    try:
                        data = await stream.receive(32)
                    except anyio.EndOfStream:
                        return
                    await stream.send(data)
            total = 0
            while True:
                try:
                    total += len(await stream.receive(65536))
                except anyio.EndOfStream:
                    break
            await stream.send(total.to_bytes(8, "big"))

    async def echo(connection: Connection, request: Any) -> Any:
        return request

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    plain_port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with open_host(Identity.generate(), CONFIG) as host:
        host.set_stream_handler("/chaos/sink/1", make_sink())
        host.set_request_handler("/chaos/echo/1", echo)
        addr = await host.listen("/ip4/127.0.0.1/tcp/0")
        print(json.dumps({"plain_port": plain_port, "chaos_addr": str(addr)}), flush=True)
        await listener.serve(plain_client)


async def serve_relay(target: str) -> None:
    """A relay: connects to the receiver (a relay forwards only over connections it holds), then
    prints its address and pid as one JSON line and serves forever."""
    async with open_host(Identity.generate(), CONFIG) as host:
        addr = await host.listen("/ip4/127.0.0.1/tcp/0")
        await host.connect(target)
        print(json.dumps({"relay_addr": str(addr), "pid": os.getpid()}), flush=True)
        await anyio.sleep_forever()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------------------- client
async def plain_bulk(port: int, total: int) -> float:
    chunk = bytes(WRITE_BYTES)
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        started = time.perf_counter()
        await stream.send(b"B")
        sent = 0
        while sent < total:
            await stream.send(chunk)
            sent += len(chunk)
        await stream.send_eof()
        ack = await stream.receive(8)
        elapsed = time.perf_counter() - started
    assert int.from_bytes(ack, "big") == total
    return total / elapsed


async def chaos_bulk(connection: Connection, total: int, streams: int) -> float:
    chunk = memoryview(bytes(WRITE_BYTES))
    per_stream = total // streams

    async def one() -> None:
        stream = connection.open_stream("sink")
        await stream.send_frame(per_stream)
        sent = 0
        while sent < per_stream:
            count = min(WRITE_BYTES, per_stream - sent)
            await stream.send(chunk[:count])
            sent += count
        await stream.send_eof()
        assert await stream.receive_frame() == per_stream

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(streams):
            tg.start_soon(one)
    return per_stream * streams / (time.perf_counter() - started)


async def plain_echo(port: int, count: int) -> list[float]:
    times = []
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        await stream.send(b"E")
        message = bytes(32)
        for _ in range(count):
            started = time.perf_counter()
            await stream.send(message)
            received = b""
            while len(received) < 32:
                received += await stream.receive(32 - len(received))
            times.append(time.perf_counter() - started)
    return times


async def chaos_echo(connection: Connection, count: int) -> list[float]:
    times = []
    message = bytes(32)
    for _ in range(count):
        started = time.perf_counter()
        await connection.request("echo", message)
        times.append(time.perf_counter() - started)
    return times


async def run_client(info: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    total = int(args.gib * (1 << 30))
    results: dict[str, list[float]] = {"plain": [], "chaos_1": [], "chaos_4": []}
    relay_cpu_s = 0.0
    async with open_host(Identity.generate(), CONFIG) as host:
        connection = await host.connect(info["chaos_addr"])
        await chaos_echo(connection, 200)  # warm up
        relayed = None
        if "relay_addr" in info:
            relay = await host.connect(info["relay_addr"])
            relayed = await host.relay.connect_via(relay.remote_peer, connection.remote_peer)
            await chaos_echo(relayed, 200)
            results["relayed_1"] = []
        for _ in range(args.repeats):
            results["plain"].append(await plain_bulk(info["plain_port"], total))
            results["chaos_1"].append(await chaos_bulk(connection, total, 1))
            if relayed is not None:
                before = cpu_seconds(info["relay_pid"])
                results["relayed_1"].append(await chaos_bulk(relayed, total, 1))
                relay_cpu_s += cpu_seconds(info["relay_pid"]) - before
            results["chaos_4"].append(await chaos_bulk(connection, total, 4))
        raw = await plain_echo(info["plain_port"], args.round_trips)
        rpc = await chaos_echo(connection, args.round_trips)
    extra = {}
    if relayed is not None:
        extra["relay_cpu_s_per_gb"] = relay_cpu_s / (total * args.repeats / 1e9)
    return {
        **extra,
        "bulk_bytes": total,
        "bulk_bytes_per_s": {k: median(v) for k, v in results.items()},
        "bulk_runs": results,
        "rtt_s": {
            "raw_echo": {"p50": percentile(raw, 0.5), "p99": percentile(raw, 0.99)},
            "rpc": {"p50": percentile(rpc, 0.5), "p99": percentile(rpc, 0.99)},
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0, help="bytes per bulk transfer, in GiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--round-trips", type=int, default=2000)
    parser.add_argument("--backend", default="trio", choices=["trio", "asyncio"])
    parser.add_argument("--json", default=None, help="write results here")
    parser.add_argument("--relay", action="store_true", help="also measure a relayed connection (3 processes)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--relay-serve", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        anyio.run(serve, backend=args.backend)
        return
    if args.relay_serve:
        anyio.run(serve_relay, args.relay_serve, backend=args.backend)
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--backend", args.backend], stdout=subprocess.PIPE, text=True
    )
    processes = [server]
    try:
        assert server.stdout is not None
        info = json.loads(server.stdout.readline())
        if args.relay:
            command = [sys.executable, __file__, "--relay-serve", info["chaos_addr"], "--backend", args.backend]
            relay = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
            processes.append(relay)
            assert relay.stdout is not None
            relay_info = json.loads(relay.stdout.readline())
            info.update(relay_addr=relay_info["relay_addr"], relay_pid=relay_info["pid"])
        report = anyio.run(run_client, info, args, backend=args.backend)
    finally:
        for process in processes:
            process.terminate()
            process.wait(10)
    bulk = report["bulk_bytes_per_s"]
    plain = bulk["plain"]
    print_table(
        f"bulk transfer, {args.gib:g} GiB, median of {args.repeats} ({args.backend})",
        ["transfer", "MB/s", "ratio to plain anyio TCP"],
        [
            ["plain anyio TCP (unencrypted)", plain / 1e6, 1.0],
            ["chaosp2p, 1 encrypted stream", bulk["chaos_1"] / 1e6, bulk["chaos_1"] / plain],
            ["chaosp2p, 4 encrypted streams", bulk["chaos_4"] / 1e6, bulk["chaos_4"] / plain],
            *(
                [["chaosp2p, 1 stream relayed", bulk["relayed_1"] / 1e6, bulk["relayed_1"] / plain]]
                if "relayed_1" in bulk
                else []
            ),
        ],
    )
    if "relayed_1" in bulk:
        print(
            f"relayed / direct (1 stream): {bulk['relayed_1'] / bulk['chaos_1']:.3f}; "
            f"relay CPU: {report['relay_cpu_s_per_gb']:.2f} s per GB relayed"
        )
    rtt = report["rtt_s"]
    print_table(
        f"round trips, {args.round_trips} each",
        ["exchange", "p50 ms", "p99 ms", "p50 ratio to raw echo"],
        [
            ["raw anyio TCP 32-byte echo", rtt["raw_echo"]["p50"] * 1e3, rtt["raw_echo"]["p99"] * 1e3, 1.0],
            [
                "chaosp2p RPC (new stream per call)",
                rtt["rpc"]["p50"] * 1e3,
                rtt["rpc"]["p99"] * 1e3,
                rtt["rpc"]["p50"] / rtt["raw_echo"]["p50"],
            ],
        ],
    )
    report["ratios"] = {
        "chaos_1_to_plain": bulk["chaos_1"] / plain,
        "chaos_4_to_plain": bulk["chaos_4"] / plain,
        "rpc_p50_to_raw_echo_p50": rtt["rpc"]["p50"] / rtt["raw_echo"]["p50"],
    }
    if "relayed_1" in bulk:
        report["ratios"]["relayed_1_to_chaos_1"] = bulk["relayed_1"] / bulk["chaos_1"]
    write_json(args.json, {"benchmark": "transport", "backend": args.backend, **report})


if __name__ == "__main__":
    main()
