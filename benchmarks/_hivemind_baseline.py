"""hivemind's ``load_state_from_peers`` on the same state, for benchmarks/state.py.

Runs under an interpreter that has hivemind 1.1.12 (with numpy<2.4, see BENCHMARKS.md):

    python benchmarks/_hivemind_baseline.py --bytes N --seed S

It starts a donor (a DecentralizedAverager holding the state, sharing allowed) and a newcomer
averager in this process, times ``load_state_from_peers`` and prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import hivemind
import numpy as np
import torch
from _state_data import model_and_adam_state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    arrays = model_and_adam_state(args.bytes, args.seed)
    tensors = [torch.from_numpy(np.array(a, dtype=np.float32).reshape(-1)) for a in arrays.values()]
    donor_dht = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    donor = hivemind.averaging.DecentralizedAverager(
        tensors, donor_dht, start=True, prefix="bench", declare_state_period=1.0
    )
    peers = [str(a) for a in donor_dht.get_visible_maddrs()]
    newcomer_dht = hivemind.DHT(start=True, initial_peers=peers, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    newcomer = hivemind.averaging.DecentralizedAverager(
        [torch.zeros_like(t) for t in tensors], newcomer_dht, start=True, prefix="bench", allow_state_sharing=False
    )
    times = []
    deadline = time.monotonic() + 60
    for _ in range(args.repeats):
        while True:
            started = time.perf_counter()
            result = newcomer.load_state_from_peers(timeout=600)
            elapsed = time.perf_counter() - started
            if result is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)  # the donor has not declared its state in the DHT yet
        if result is None:
            raise SystemExit("hivemind never found the donor")
        _, loaded = result
        # Compare bits, not values: random bytes viewed as float32 include NaNs.
        same = all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(loaded, tensors, strict=True))
        assert same, "hivemind returned other bytes"
        times.append(elapsed)
    print(json.dumps({"seconds": times, "bytes": sum(t.numel() * 4 for t in tensors)}), flush=True)
    newcomer.shutdown()
    donor.shutdown()
    newcomer_dht.shutdown()
    donor_dht.shutdown()


if __name__ == "__main__":
    main()
