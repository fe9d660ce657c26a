"""Elastic training with a plain PyTorch script: peers join a running swarm and catch up.

Start the first peer; it trains a small classifier on generated data and publishes its model and
Adam state every few steps:

    python examples/elastic_training.py --steps 400

It prints its address. Start more peers (on this or other machines) pointing at it; each one
downloads the newest model + optimizer state from every peer that has it, in parallel, then keeps
training from that step instead of from scratch:

    python examples/elastic_training.py --join /ip4/127.0.0.1/tcp/PORT/p2p/12D3KooW... --steps 400

No data is downloaded: the task is a fixed random linear teacher the script generates itself.
(Averaging gradients between peers is out of scope here; each peer trains on its own shard.)
"""

from __future__ import annotations

import argparse
import time

import torch

import chaosp2p

RUN = "elastic-example"


def make_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return model, torch.optim.Adam(model.parameters(), lr=3e-3)


def batches(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--join", action="append", default=[], metavar="MULTIADDR", help="a peer of the swarm")
    parser.add_argument("--steps", type=int, default=400, help="train until this step")
    parser.add_argument("--publish-every", type=int, default=20)
    parser.add_argument("--linger", type=float, default=0.0, help="keep serving this many seconds at the end")
    parser.add_argument("--seed", type=int, default=0, help="this peer's data shard")
    parser.add_argument(
        "--profile",
        default="lan",
        help="lan (default: every interface, a free port, reachable from other machines) or local (loopback only)",
    )
    args = parser.parse_args()

    torch.manual_seed(1234)  # the teacher every peer learns from
    teacher = torch.randn(64, 10)
    model, optimizer = make_model()
    if args.profile == "local":
        config = chaosp2p.PeerConfig.local()
    else:
        config = chaosp2p.PeerConfig.profile_named(args.profile, listen=["/ip4/0.0.0.0/tcp/0"])
    with chaosp2p.Peer(initial_peers=args.join, run=RUN, config=config) as peer:
        print(f"peer {peer.peer_id} listening on {peer.addrs[0]}", flush=True)
        start = 0
        if args.join:
            started = time.perf_counter()
            start = peer.load_state_from_peers(model, optimizer, timeout=120)
            print(f"caught up: loaded step {start} in {time.perf_counter() - started:.2f} s", flush=True)
        generator = batches(args.seed)
        for step in range(start + 1, args.steps + 1):
            x = torch.randn(128, 64, generator=generator)
            y = (x @ teacher).argmax(dim=1)
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            if step % args.publish_every == 0 or step == args.steps:
                peer.publish_state(model, optimizer, step=step)
                print(f"step {step}: loss {loss.item():.3f} (published)", flush=True)
        time.sleep(args.linger)


if __name__ == "__main__":
    main()
