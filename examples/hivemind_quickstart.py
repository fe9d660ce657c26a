"""hivemind's quickstart (``docs/user/quickstart.md``) running on chaosp2p through the drop-in.

Two things differ from hivemind's script, as the drop-in promises:

1. the import line: ``import chaosp2p.hivemind as hivemind`` instead of ``import hivemind``;
2. the data set. There is no internet here, so instead of downloading CIFAR-10 the script builds a
   CIFAR-shaped set locally: 32x32 RGB images in 10 classes, normalised to [-1, 1] like the
   quickstart's transform, generated from a fixed seed. Each class is a smooth random colour pattern;
   every image is its class pattern, shifted by up to 3 pixels and buried in noise, so the CNN has
   something to learn. It is NOT CIFAR-10: losses are not comparable with the tutorial's.

Everything else -- the CNN, SGD(lr=0.001, momentum=0.9), the DHT, the ``Optimizer`` arguments,
``load_state_from_peers()`` on the second peer, the training loop -- is the quickstart's. Run it like
the quickstart (first peer, then the second with the address the first prints)::

    python examples/hivemind_quickstart.py
    python examples/hivemind_quickstart.py --join /ip4/127.0.0.1/tcp/PORT/p2p/12D3KooW...

It also takes the flags every example peer takes (``--join`` is the second peer's
``initial_peers``; ``--steps N`` stops after epoch N, an epoch being ``target_batch_size`` samples
processed by all peers together; ``--ready-file``; ``--metrics-file`` gets one JSON line per epoch;
SIGTERM leaves the run gracefully). ``--real-hivemind`` runs the very same code on hivemind 1.1.12
itself (``benchmarks/training_hivemind.py`` compares the two).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

if "--real-hivemind" in sys.argv:  # the benchmark's baseline: the same script on hivemind itself
    import hivemind
else:
    import chaosp2p.hivemind as hivemind  # the one line that differs from hivemind's quickstart

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # chaosp2p's helpers, also for --real-hivemind
from chaosp2p.trainers.script import MetricsWriter, StopSignal, add_peer_arguments, write_ready_file

try:
    from tqdm.auto import tqdm
except ImportError:  # tqdm is not a chaosp2p dependency: count quietly (verbose=True logs every epoch)

    class tqdm:  # type: ignore[no-redef]
        def __init__(self) -> None:
            self.desc = ""
            self.n = 0

        def __enter__(self) -> tqdm:
            return self

        def __exit__(self, *exc_info: object) -> None:
            pass

        def update(self) -> None:
            self.n += 1


class CifarShapedData(torch.utils.data.TensorDataset):
    """``count`` 3x32x32 images in [-1, 1] with labels 0..9, from ``seed`` (see the module docstring)."""

    def __init__(self, count: int, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        patterns = F.interpolate(torch.randn(10, 3, 4, 4, generator=generator), size=(32, 32), mode="bilinear")
        labels = torch.randint(0, 10, (count,), generator=generator)
        images = patterns[labels]
        shifts = torch.randint(-3, 4, (count, 2), generator=generator)
        for i in range(0, count, 1000):  # roll in blocks that share a shift: cheap and still varied
            dx, dy = (int(v) for v in shifts[i])
            images[i : i + 1000] = torch.roll(images[i : i + 1000], shifts=(dx, dy), dims=(2, 3))
        images = 0.2 * images + 1.0 * torch.randn(images.shape, generator=generator)
        super().__init__(images.clamp_(-1.0, 1.0), labels)


class Harness:
    """The shared example flags around the quickstart's loop: ready file, metrics, --steps, SIGTERM."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = StopSignal()
        self.metrics = MetricsWriter(args.metrics_file)
        self.samples = 0
        self.epoch: int | None = None
        self.more_epochs: int | None = None  # after --linger: epochs still to finish (--resume-epochs)
        if args.real_hivemind:
            self._watch_hivemind_averaging()

    def listening(self, dht: Any) -> None:
        """The DHT is up: write the ready file."""
        write_ready_file(self.args.ready_file, str(dht.peer_id), [str(a) for a in dht.get_visible_maddrs()])

    def training(self) -> None:
        """The optimizer is ready (joined, for a newcomer): training starts now."""
        self.metrics.write({"event": "started", "time": time.time(), "backend": backend()})

    def _watch_hivemind_averaging(self) -> None:
        """hivemind reports parameter averaging only in its log: turn those lines into records."""
        harness = self

        class Averaged(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                message = record.getMessage()
                if message.startswith("Averaged parameters with"):
                    peers = int(message.split()[3])
                    harness.metrics.write({"event": "averaged", "peers": peers, "time": time.time()})

        logging.getLogger("hivemind.optim.state_averager").addHandler(Averaged())

    def after_step(self, opt: Any, loss: torch.Tensor) -> bool:
        """Record a finished epoch; True when the loop should stop (``--steps`` reached or SIGTERM)."""
        self.samples += 32
        if self.epoch is None:
            self.epoch = opt.local_epoch
        elif opt.local_epoch != self.epoch:
            self.epoch = opt.local_epoch
            record = self._record(opt, loss)
            if record is not None:
                self.metrics.write(record)
                if self.more_epochs is not None:
                    self.more_epochs -= 1
        if self.more_epochs is not None:
            return self.stop.requested or self.more_epochs <= 0
        return self.stop.requested or opt.local_epoch >= self.args.steps

    def _record(self, opt: Any, loss: torch.Tensor) -> dict[str, Any] | None:
        record: dict[str, Any] = {"step": opt.local_epoch - 1, "loss": round(loss.item(), 6)}
        record.update(time=time.time(), local_samples=self.samples, cpu_s=round(time.process_time(), 3))
        if self.args.real_hivemind:
            record.update(members=opt.tracker.global_progress.num_peers, param_digest=parameter_digest(opt))
            return record
        stats = opt.statistics()
        if stats is None or stats.step != opt.local_epoch - 1:
            # The epoch moved on without this peer training it: it stepped aside while idle and
            # served the others' rounds with zero weight. Its next epoch rejoins the run.
            return None
        record.update(
            epoch=stats.epoch,
            config_digest=stats.config_digest,
            members=stats.members,
            samples=stats.samples,
            round_s=round(stats.round_s, 6),
            idle_s=round(stats.idle_s, 6),
            param_digest=opt.parameter_digest(),
        )
        return record

    def linger(self, seconds: float) -> bool:
        """Stay up without training (the peer is idle, as during evaluation or checkpointing); True if
        it then trains ``--resume-epochs`` more epochs."""
        self.metrics.write({"event": "idle", "time": time.time()})
        deadline = time.monotonic() + seconds
        while not self.stop.requested and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.args.resume_epochs and not self.stop.requested:
            self.more_epochs = self.args.resume_epochs
            self.metrics.write({"event": "resumed", "time": time.time()})
            return True
        return False

    def close(self) -> None:
        if self.stop.requested:
            print(f"{self.stop.signal_name}: leaving the run", flush=True)
        self.metrics.close()


def backend() -> str:
    return "hivemind" if hivemind.__name__ == "hivemind" else "chaosp2p"


def parameter_digest(opt: Any) -> str:
    """A hash of the parameters (for hivemind, which has no such helper)."""
    digest = hashlib.sha256()
    for group in opt.param_groups:
        for p in group["params"]:
            digest.update(p.detach().contiguous().view(torch.uint8).reshape(-1).numpy().tobytes())
    return digest.hexdigest()[:32]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_peer_arguments(parser)
    parser.set_defaults(steps=3)
    parser.add_argument("--target-batch-size", type=int, default=10000, help="samples per epoch (quickstart: 10000)")
    parser.add_argument("--no-local-updates", dest="local_updates", action="store_false",
                        help="accumulate gradients to the target batch instead (hivemind's default mode)")
    parser.add_argument("--dataset-size", type=int, default=10000, help="images in the local CIFAR-shaped set")
    parser.add_argument("--real-hivemind", action="store_true", help="run on hivemind 1.1.12 (needs it installed)")
    parser.add_argument("--linger", type=float, default=0.0, metavar="S",
                        help="after the last epoch, stay up S seconds without calling step() (an idle peer)")
    parser.add_argument("--resume-epochs", type=int, default=0, metavar="N",
                        help="after --linger, train N more epochs (the idle peer comes back)")
    args = parser.parse_args()
    if args.profile != "local" or args.listen:
        parser.error("the quickstart's DHT listens on loopback: only --profile local applies, and no --listen")
    torch.set_num_threads(1)  # two peers share this machine's cores

    harness = Harness(args)

    # The quickstart's data set, model and optimizer (data: the local CIFAR-shaped set, see above).
    trainset = CifarShapedData(args.dataset_size)

    model = nn.Sequential(nn.Conv2d(3, 16, (5, 5)), nn.MaxPool2d(2, 2), nn.ReLU(),
                          nn.Conv2d(16, 32, (5, 5)), nn.MaxPool2d(2, 2), nn.ReLU(),
                          nn.Flatten(), nn.Linear(32 * 5 * 5, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)

    # The first peer starts a DHT of its own; every other peer names a running one.
    dht = hivemind.DHT(initial_peers=args.join or None, start=True)
    print("To join the training, use initial_peers =", [str(addr) for addr in dht.get_visible_maddrs()], flush=True)
    harness.listening(dht)

    # The quickstart's settings; only target_batch_size and use_local_updates are flags (for tests).
    opt = hivemind.Optimizer(
        dht=dht,
        run_id='my_cifar_run',
        batch_size_per_step=32,
        target_batch_size=args.target_batch_size,  # quickstart: 10000 samples per epoch, all peers together
        optimizer=opt,
        use_local_updates=args.local_updates,  # quickstart: True (local SGD steps, parameters averaged per epoch)
        matchmaking_time=3.0,
        averaging_timeout=10.0,
        verbose=True,
    )

    if args.join:
        opt.load_state_from_peers()

    harness.training()
    resume = True
    while resume:
        done = False
        with tqdm() as progressbar:
            while not done:
                for x_batch, y_batch in torch.utils.data.DataLoader(trainset, shuffle=True, batch_size=32):
                    opt.zero_grad()
                    loss = F.cross_entropy(model(x_batch), y_batch)
                    loss.backward()
                    opt.step()

                    progressbar.desc = f"loss = {loss.item():.3f}"
                    progressbar.update()
                    if harness.after_step(opt, loss):
                        done = True
                        break

        print(f"finished at epoch {opt.local_epoch}: loss {loss.item():.3f}", flush=True)
        resume = harness.more_epochs is None and harness.linger(args.linger)
    harness.close()
    opt.shutdown()
    dht.shutdown()


if __name__ == "__main__":
    main()
