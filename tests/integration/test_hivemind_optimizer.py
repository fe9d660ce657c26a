"""hivemind.Optimizer on the drop-in with a DHT-only peer first, and the views scripts read (issue 22).

Peers are real chaosp2p peers in one process; two trainers step in two threads, as two processes
would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chaosp2p.hivemind import DHT

torch = pytest.importorskip("torch")

from chaosp2p.hivemind.optimizer import Optimizer  # noqa: E402 (needs torch)

TARGET = 32
BATCH = 8


def addrs(dht: DHT) -> list[str]:
    return [str(addr) for addr in dht.get_visible_maddrs()]


class Trainer:
    """A model, its data and a drop-in optimizer on its own DHT."""

    def __init__(self, initial_peers: list[str], **options: Any) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.data = torch.Generator().manual_seed(len(initial_peers) + id(self) % 97)
        self.dht = DHT(initial_peers=initial_peers, start=True)
        self.opt = Optimizer(
            dht=self.dht,
            run_id="views",
            target_batch_size=TARGET,
            batch_size_per_step=BATCH,
            optimizer=torch.optim.SGD(self.model.parameters(), lr=0.1),
            scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9),
            matchmaking_time=1.0,
            averaging_timeout=10.0,
            load_state_timeout=60.0,
            **options,
        )

    def one_step(self) -> None:
        time.sleep(0.01)  # compute: a newcomer joins a run whose epochs take some time, as real ones do
        x = torch.randn(BATCH, 4, generator=self.data)
        loss = (self.model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        self.opt.step()
        if not self.opt.settings.reuse_grad_buffers:
            self.opt.zero_grad()

    def train_until(self, epoch: int) -> None:
        while self.opt.local_epoch < epoch:
            self.one_step()

    def params(self) -> list[float]:
        return [float(v) for p in self.model.parameters() for v in p.detach().flatten()]

    def close(self) -> None:
        self.dht.shutdown()


def together(*calls: Callable[[], None]) -> None:
    errors: list[BaseException] = []

    def run(call: Callable[[], None]) -> None:
        try:
            call()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)


@pytest.fixture
def monitor() -> Iterator[DHT]:
    dht = DHT(start=True)
    try:
        yield dht
    finally:
        dht.shutdown()


@pytest.mark.timeout(180)
def test_a_dht_only_peer_first_then_two_trainers_that_stay_identical(monitor: DHT) -> None:
    """issue 22, findings 2, 5 and 7: founding behind a monitor, the views, and load_state_dict with others."""
    first = Trainer(addrs(monitor))  # used to retry "none of 1 peers takes part" for load_state_timeout
    trainers = [first]
    try:
        first.train_until(2)
        assert first.opt.tracker.global_progress.num_peers == 1
        joined, target = threading.Event(), [0]

        def member() -> None:  # a newcomer joins while the members train (they do in scripts)
            while not joined.is_set() or first.opt.local_epoch < target[0]:
                first.one_step()

        def newcomer() -> None:
            trainers.append(Trainer(addrs(monitor)))
            target[0] = trainers[1].opt.local_epoch + 3
            joined.set()
            trainers[1].train_until(target[0])

        together(member, newcomer)
        second = trainers[1]
        assert first.opt.collaboration.world_size == second.opt.collaboration.world_size == 2
        assert first.opt.local_epoch == second.opt.local_epoch
        assert first.params() == second.params()
        assert monitor.peer.async_peer.negotiation.runs() == []  # the monitor never is a member

        progress = first.opt.tracker.global_progress
        assert (progress.epoch, progress.target_batch_size, progress.num_peers) == (first.opt.local_epoch, TARGET, 2)
        assert first.opt.tracker.global_epoch == first.opt.local_epoch
        first.one_step()
        assert first.opt.grad_averager is not None
        assert first.opt.grad_averager.local_samples_accumulated == first.opt.local_progress.samples_accumulated
        assert first.opt.state_averager.scheduler is first.opt.scheduler is not None
        assert first.opt.state_averager.optimizer is first.opt.opt
        assert first.opt.state_averager.local_epoch == first.opt.local_epoch

        # albert restores a backup when parameters go bad: the member must not drift from the others
        backup = first.opt.state_dict()
        with torch.no_grad():
            for p in first.model.parameters():
                p.add_(1.0)
        resynchronised, goal = threading.Event(), [0]

        def restore_then_train() -> None:
            first.opt.load_state_dict(backup)  # re-synchronises: leaves and joins again
            goal[0] = first.opt.local_epoch + 2
            resynchronised.set()
            first.train_until(goal[0])

        def keep_training() -> None:
            while not resynchronised.is_set() or second.opt.local_epoch < goal[0]:
                second.one_step()

        together(restore_then_train, keep_training)
        assert first.opt.local_epoch == second.opt.local_epoch
        assert first.params() == second.params()
    finally:
        for trainer in reversed(trainers):
            trainer.close()


@pytest.mark.timeout(120)
def test_reuse_grad_buffers_averages_the_summed_gradients_per_call(monitor: DHT) -> None:
    """issue 22, finding 4: reuse_grad_buffers=True was refused; it is hivemind's buffer-reusing mode."""
    trainer = Trainer(addrs(monitor), reuse_grad_buffers=True)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(trainer.model.state_dict())
    try:
        with pytest.raises(ValueError, match="zero_grad"):
            trainer.opt.zero_grad()
        inputs = [torch.randn(BATCH, 4) for _ in range(TARGET // BATCH)]
        for x in inputs:  # .grad sums every call's gradient; hivemind steps with their mean
            (trainer.model(x) - x.sum(1, keepdim=True)).pow(2).mean().backward()
            trainer.opt.step()
        for x in inputs:
            ((reference(x) - x.sum(1, keepdim=True)).pow(2).mean() / len(inputs)).backward()
        torch.optim.SGD(reference.parameters(), lr=0.1).step()
        assert trainer.opt.local_epoch == 1
        for ours, theirs in zip(trainer.model.parameters(), reference.parameters(), strict=True):
            assert torch.allclose(ours, theirs, atol=1e-6)
            assert ours.grad is not None and not ours.grad.any()  # emptied for the next epoch
    finally:
        trainer.close()
