"""One hivemind 1.1.12 process of the all-reduce benchmark (benchmarks/training.py part a).

Runs under an interpreter that has hivemind (with numpy<2.4, see BENCHMARKS.md):

    python benchmarks/_hivemind_allreduce.py --rank R --world N --elements E --rounds K --workdir DIR

Rank 0 starts the DHT and writes its addresses to DIR/hivemind-dht.json; every rank runs a
``DecentralizedAverager`` (group size N, ``min_matchmaking_time`` 1 s) and times ``step()``, which
includes matchmaking, as hivemind users experience it. Prints one JSON line {"seconds": [...]}.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import hivemind
import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    workdir = Path(args.workdir)
    dht_file = workdir / "hivemind-dht.json"
    if args.rank == 0:
        dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        tmp = dht_file.with_suffix(".tmp")
        tmp.write_text(json.dumps([str(a) for a in dht.get_visible_maddrs()]))
        tmp.rename(dht_file)
    else:
        deadline = time.monotonic() + 120
        while not dht_file.exists():
            if time.monotonic() > deadline:
                raise SystemExit("rank 0 never published its DHT address")
            time.sleep(0.05)
        peers = json.loads(dht_file.read_text())
        dht = hivemind.DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    tensor = torch.zeros(args.elements, dtype=torch.float32)
    averager = hivemind.averaging.DecentralizedAverager(
        [tensor],
        dht,
        start=True,
        prefix="bench",
        target_group_size=args.world,
        min_group_size=args.world,
        min_matchmaking_time=1.0,
        request_timeout=3.0,
    )
    seconds = []
    failures = 0
    for index in range(args.rounds):
        with averager.get_tensors() as tensors:
            tensors[0].fill_(float(args.rank + index))
        started = time.perf_counter()
        result = averager.step(timeout=120)
        elapsed = time.perf_counter() - started
        if result is None:
            failures += 1
            continue
        with averager.get_tensors() as tensors:
            expected = sum(rank + index for rank in range(args.world)) / args.world
            error = float((tensors[0] - expected).abs().max())
        if error > 1e-3:
            raise SystemExit(f"hivemind returned a wrong average (max error {error})")
        seconds.append(elapsed)
    print(json.dumps({"seconds": seconds, "failures": failures, "group": len(result or {})}), flush=True)
    averager.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
