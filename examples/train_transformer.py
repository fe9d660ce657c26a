"""A transformer big enough that joins move real state: ~46 M parameters, ~555 MB with Adam's moments.

A GPT-style decoder (12 pre-norm layers, width 512, 8 heads, vocabulary 8192) trained with Adam on
generated tokens -- nothing is downloaded. The "language" is a fixed random Markov chain from a seed
over 64 of the 8192 tokens, each with 4 possible successors: the loss falls from ln(8192) = 9.0
towards ln(4) = 1.39 as the model learns the chain (about 2.4 after 50 steps). Each step's global
batch (``--batch`` sequences of ``--seq`` tokens, drawn from the seed and the step number) is split
among the members by their agreed shares, and the gradients are averaged weighted by samples
(``--mode sync``) -- or every member takes ``--local-steps`` Adam steps alone and the parameters are
averaged through DiLoCo's outer step (``--mode diloco``).

Sequences and batches are tiny (4 x 16 tokens) so that a step takes 1-2 s on one idle CPU core; the
point is the size of the state. A newcomer downloads parameters and Adam's moments (~555 MB) from
every member in parallel while they keep training, replays the steps it missed and is admitted
bit-identical::

    python examples/train_transformer.py --steps 100 --metrics-file a.jsonl
    python examples/train_transformer.py --steps 100 --join /ip4/127.0.0.1/tcp/PORT/p2p/12D3KooW...

Flags shared by every example peer: ``--join`` (repeatable), ``--steps``, ``--ready-file``,
``--metrics-file`` (one JSON line per step), ``--profile``; SIGTERM leaves the run gracefully.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import numpy as np
import torch
from torch import nn

import chaosp2p
from chaosp2p.protocols.membership.config import MembershipConfig
from chaosp2p.trainers.script import MetricsWriter, StopSignal, add_peer_arguments, write_ready_file

RUN = "transformer"
DATA_SEED = 11
SUCCESSORS = 4
ACTIVE = 64


class Decoder(nn.Module):
    """A pre-norm causal transformer language model."""

    def __init__(self, *, vocab: int, width: int, layers: int, heads: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position[: tokens.shape[1]]
        hidden = self.blocks(hidden, mask=self.mask, is_causal=True)
        logits: torch.Tensor = self.head(self.norm(hidden))
        return logits


class MarkovTokens:
    """A fixed random Markov chain over ``ACTIVE`` of the tokens, each with ``SUCCESSORS`` successors."""

    def __init__(self, vocab: int, seq: int) -> None:
        rng = np.random.default_rng(DATA_SEED)
        self.active = rng.choice(vocab, size=min(ACTIVE, vocab), replace=False)
        self.successors = self.active[rng.integers(0, len(self.active), size=(vocab, SUCCESSORS))]
        self.seq = seq

    def global_batch(self, step: int, size: int) -> torch.Tensor:
        """The ``size`` sequences of step ``step`` (``seq + 1`` tokens each): every member agrees."""
        rng = np.random.default_rng([DATA_SEED, step])
        tokens = np.empty((size, self.seq + 1), dtype=np.int64)
        tokens[:, 0] = self.active[rng.integers(0, len(self.active), size=size)]
        choices = rng.integers(0, SUCCESSORS, size=(size, self.seq))
        for position in range(self.seq):
            tokens[:, position + 1] = self.successors[tokens[:, position], choices[:, position]]
        return torch.from_numpy(tokens)


def make_model(args: argparse.Namespace) -> tuple[Decoder, torch.optim.Optimizer]:
    """Identical initial weights everywhere (a newcomer overwrites them with the run's anyway)."""
    torch.manual_seed(0)
    model = Decoder(vocab=args.vocab, width=args.width, layers=args.layers, heads=args.heads, seq=args.seq)
    return model, torch.optim.Adam(model.parameters(), lr=args.lr)


def state_megabytes(model: nn.Module) -> float:
    """Parameters plus Adam's two moments, in MB."""
    return 3 * sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6


def profile_config(name: str) -> chaosp2p.PeerConfig:
    if name in ("local", "lan", "wan"):
        return chaosp2p.PeerConfig.profile_named(name)
    return chaosp2p.PeerConfig.from_toml(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.add_argument("--mode", choices=("sync", "diloco"), default="sync")
    parser.add_argument("--local-steps", type=int, default=10, help="DiLoCo: inner steps per outer step")
    parser.add_argument("--batch", type=int, default=4, help="global batch: sequences per step over all members")
    parser.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--wire-dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    args = parser.parse_args()
    torch.set_num_threads(1)  # several peers share this machine's cores
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    for name in ("chaosp2p.training", "chaosp2p.state"):  # the join's download and catch-up timeline
        logging.getLogger(name).setLevel(logging.INFO)

    stop = StopSignal()
    model, optimizer = make_model(args)
    data = MarkovTokens(args.vocab, args.seq)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f} M parameters, {state_megabytes(model):.0f} MB with Adam's moments", flush=True)
    metrics = MetricsWriter(args.metrics_file)
    config = profile_config(args.profile)
    if args.profile == "local":
        # Moving ~555 MB (snapshots, downloads, averaging) keeps this machine's cores busy for whole
        # seconds; the local profile's sub-second failure detection would declare busy peers failed.
        config = config.replace(membership=MembershipConfig.lan())
    from chaosp2p import Collaboration, CollaborationConfig

    collab_config = CollaborationConfig.profile_named(config.profile).replace(
        mode=args.mode,
        global_batch=args.batch,
        local_steps=args.local_steps,
        wire_dtype=args.wire_dtype,
        round_timeout_min_s=30.0,  # a step takes seconds here: wait that long for a member's share
    )
    with chaosp2p.Peer(initial_peers=args.join, config=config, run=RUN) as peer:
        write_ready_file(args.ready_file, peer.peer_id, peer.addrs)
        print(f"peer {peer.peer_id} listening on {peer.addrs[0]}", flush=True)
        started = time.perf_counter()
        collab = Collaboration(peer, run=RUN, model=model, optimizer=optimizer, config=collab_config)
        if args.join:
            print(f"admitted at step {collab.start_step} after {time.perf_counter() - started:.1f} s", flush=True)
        inner_step = 0
        while collab.step_index < args.steps and not stop.requested:
            step = collab.step_index
            start, stop_at = collab.batch_slice()
            # DiLoCo: a fresh batch per inner step (the step index only counts outer steps).
            tokens = data.global_batch(step * args.local_steps + inner_step if args.mode == "diloco" else step,
                                       collab.global_batch)[start:stop_at]
            computed = time.perf_counter()
            optimizer.zero_grad()
            logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            computed = time.perf_counter() - computed
            result = collab.step(samples=len(tokens))
            if result.step < 0:  # a DiLoCo inner step: nothing was averaged
                inner_step += 1
                continue
            inner_step = 0
            metrics.write(
                {
                    "step": result.step,
                    "epoch": result.epoch,
                    "config_digest": result.config_digest,
                    "members": result.members,
                    "loss": round(loss.item(), 6),
                    "samples": result.samples,
                    "round_s": round(result.round_s, 6),
                    "idle_s": round(result.idle_s, 6),
                    "compute_s": round(computed, 6),
                    "bytes_sent": result.bytes_sent,
                    "param_digest": collab.parameter_digest(),
                }
            )
            print(
                f"step {result.step}: loss {loss.item():.3f}, {result.members} members, "
                f"compute {computed:.2f} s, averaging {result.round_s:.2f} s",
                flush=True,
            )
        metrics.write({"final_step": collab.step_index, "param_digest": collab.parameter_digest()})
        if stop.requested:
            print(f"{stop.signal_name}: leaving the run", flush=True)
        collab.leave()
    metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
