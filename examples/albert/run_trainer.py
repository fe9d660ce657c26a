#!/usr/bin/env python3
"""albert's ``run_trainer.py`` (hivemind 1.1.12 ``examples/albert``) with a tiny model and local data.

Its imports, arguments, ``Optimizer(...)`` call, ``CollaborativeCallback`` and ``NoOpScheduler``
are albert's; what differs is what needs transformers or a download: the model (a small MLP), the
data (a synthetic regression set made from ``--seed``), the optimizer (AdamW for Lamb), the
schedule (linear warmup/decay written out) and the training loop (a few lines standing in for
``transformers.Trainer``, calling the callback where the Trainer does). Run it with hivemind::

    python examples/albert/run_trainer.py --initial_peers /ip4/.../p2p/...

or, unchanged, on chaosp2p::

    python -m chaosp2p.hivemind examples/albert/run_trainer.py --initial_peers /ip4/.../p2p/...

Two imports differ from albert's file: ``Float16Compression`` and ``get_dht_time`` come from
their modules, because ``from hivemind import Float16Compression, get_dht_time`` (albert's line)
fails on hivemind 1.1.12 itself. SIGTERM stops the loop and leaves the run.
"""

import hashlib
import json
import os
import pickle
import signal
import time
from dataclasses import asdict

import torch
import utils
from arguments import (
    ArgumentParser,
    AveragerArguments,
    CollaborationArguments,
    ProgressTrackerArguments,
    TinyTrainingArguments,
)
from hivemind import DHT, Optimizer
from hivemind.compression import Float16Compression
from hivemind.optim.state_averager import LRSchedulerBase
from hivemind.utils import get_dht_time
from hivemind.utils.logging import get_logger, use_hivemind_log_handler
from hivemind.utils.networking import log_visible_maddrs
from torch.utils.data import DataLoader, TensorDataset

use_hivemind_log_handler("in_root_logger")
logger = get_logger(__name__)

STOPPING = []


class TrainerState:
    """What the callback reads from transformers' TrainerState."""

    def __init__(self):
        self.log_history = []


class CollaborativeCallback:
    """
    This callback monitors and reports collaborative training progress.
    In case of a catastrophic failure, it can also revert training to a backup.
    """

    def __init__(self, dht, optimizer, model, local_public_key, statistics_expiration, backup_every_steps, report):
        super().__init__()
        self.model = model
        self.dht, self.optimizer = dht, optimizer
        self.local_public_key = local_public_key
        self.statistics_expiration = statistics_expiration
        self.last_reported_collaboration_step = -1
        self.samples = 0
        self.steps = 0
        self.loss = 0
        self.total_samples_processed = 0
        self.backup_every_steps = backup_every_steps
        self.latest_backup = self.backup_state()
        self.report = report

    def on_train_begin(self, args, state, control, **kwargs):
        logger.info("Loading state from peers")
        self.optimizer.load_state_from_peers()

    def on_step_end(self, args, state, control, **kwargs):
        control["should_log"] = True
        if not self.params_are_finite():
            self.restore_from_backup(self.latest_backup)
            return control

        local_progress = self.optimizer.local_progress

        if state.log_history:
            self.loss += state.log_history[-1]["loss"]
            self.steps += 1

            if self.optimizer.local_epoch != self.last_reported_collaboration_step:
                self.last_reported_collaboration_step = self.optimizer.local_epoch
                self.total_samples_processed += self.samples
                samples_per_second = local_progress.samples_per_second
                statistics = utils.LocalMetrics(
                    step=self.optimizer.local_epoch,
                    samples_per_second=samples_per_second,
                    samples_accumulated=self.samples,
                    loss=self.loss,
                    mini_steps=self.steps,
                )
                logger.info(f"Step #{self.optimizer.local_epoch}")
                logger.info(f"Your current contribution: {self.total_samples_processed} samples")
                logger.info(f"Performance: {samples_per_second:.3f} samples/sec")
                if self.steps:
                    logger.info(f"Local loss: {self.loss / self.steps:.5f}")
                    self.report(epoch=self.optimizer.local_epoch, loss=self.loss / self.steps)
                if self.optimizer.local_epoch % self.backup_every_steps == 0:
                    self.latest_backup = self.backup_state()

                self.loss = 0
                self.steps = 0
                if self.optimizer.is_synchronized_with_peers():
                    self.dht.store(
                        key=self.optimizer.run_id + "_metrics",
                        subkey=self.local_public_key,
                        value=statistics.dict(),
                        expiration_time=get_dht_time() + self.statistics_expiration,
                        return_future=True,
                    )

        self.samples = local_progress.samples_accumulated

        return control

    @torch.no_grad()
    def params_are_finite(self):
        for param in self.model.parameters():  # noqa: SIM110 (albert's code)
            if not torch.all(torch.isfinite(param)):
                return False
        return True

    @torch.no_grad()
    def backup_state(self) -> bytes:
        return pickle.dumps({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()})

    @torch.no_grad()
    def restore_from_backup(self, backup: bytes):
        state = pickle.loads(backup)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])


class NoOpScheduler(LRSchedulerBase):
    """Dummy scheduler for transformers.Trainer. The real scheduler is defined in Optimizer.scheduler"""

    def get_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]

    def print_lr(self, *args, **kwargs):
        if self.optimizer.scheduler:
            return self.optimizer.scheduler.print_lr(*args, **kwargs)

    def step(self):
        self._last_lr = self.get_lr()

    def state_dict(self):
        return {}

    def load_state_dict(self, *args, **kwargs):
        logger.debug("Called NoOpScheduler.load_state_dict")


def get_linear_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    """transformers' schedule of the same name."""

    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def get_model():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def get_dataset(seed, size):
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(size, 16, generator=generator)
    weights = torch.randn(16, 1, generator=torch.Generator().manual_seed(0))  # the same task on every peer
    targets = torch.tanh(features @ weights) + 0.05 * torch.randn(size, 1, generator=generator)
    return TensorDataset(features, targets)


def make_reporter(path, local_public_key):
    def report(**record):
        if path:
            record.update(pid=os.getpid(), key=hashlib.sha256(local_public_key).hexdigest()[:16], time=time.time())
            with open(path, "a") as out:
                out.write(json.dumps(record) + "\n")

    return report


def train(training_args, model, optimizer, dataset, callback, local_public_key):
    """A few lines standing in for transformers.Trainer.train(): the same calls, in the same order."""
    torch.manual_seed(hash(local_public_key) % 2**31)  # independent shuffling per peer (albert does this)
    loader = DataLoader(dataset, batch_size=training_args.per_device_train_batch_size, shuffle=True)
    state, control = TrainerState(), {}
    callback.on_train_begin(training_args, state, control)
    loss_fn = torch.nn.MSELoss()
    micro_step = 0
    while not STOPPING:
        for features, targets in loader:
            loss = loss_fn(model(features), targets) / training_args.gradient_accumulation_steps
            loss.backward()
            micro_step += 1
            if micro_step % training_args.gradient_accumulation_steps:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), training_args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            state.log_history.append({"loss": loss.item() * training_args.gradient_accumulation_steps})
            callback.on_step_end(training_args, state, control)
            if training_args.step_delay:
                time.sleep(training_args.step_delay)
            if STOPPING or should_stop(training_args, optimizer):
                return


def should_stop(training_args, optimizer):
    if not training_args.stop_file or not os.path.exists(training_args.stop_file):
        return False
    with open(training_args.stop_file) as file:
        text = file.read().strip()
    return bool(text) and optimizer.local_epoch >= int(text)


def main():
    parser = ArgumentParser(
        (TinyTrainingArguments, CollaborationArguments, AveragerArguments, ProgressTrackerArguments)
    )
    training_args, collaboration_args, averager_args, tracker_args = parser.parse_args_into_dataclasses()
    logger.info(f"Found {len(collaboration_args.initial_peers)} initial peers: {collaboration_args.initial_peers}")
    signal.signal(signal.SIGTERM, lambda *_: STOPPING.append(True))

    torch.manual_seed(training_args.seed)
    model = get_model()
    dataset = get_dataset(training_args.seed + os.getpid(), training_args.dataset_size)

    validators, local_public_key = utils.make_validators(collaboration_args.run_id)

    dht = DHT(
        start=True,
        initial_peers=collaboration_args.initial_peers,
        client_mode=collaboration_args.client_mode,
        record_validators=validators,
        use_ipfs=collaboration_args.use_ipfs,
        host_maddrs=collaboration_args.host_maddrs,
        announce_maddrs=collaboration_args.announce_maddrs,
        identity_path=collaboration_args.identity_path,
    )
    log_visible_maddrs(dht.get_visible_maddrs(), only_p2p=collaboration_args.use_ipfs)

    total_batch_size_per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    adjusted_target_batch_size = collaboration_args.target_batch_size - collaboration_args.batch_size_lead

    # We need to make such a lambda function instead of just an optimizer instance
    # to make hivemind.Optimizer(..., offload_optimizer=True) work
    opt = lambda params: torch.optim.AdamW(  # noqa: E731 (albert's style)
        params,
        lr=training_args.learning_rate,
        betas=(training_args.adam_beta1, training_args.adam_beta2),
        eps=training_args.adam_epsilon,
        weight_decay=training_args.weight_decay,
    )

    no_decay = ["bias"]
    params = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": training_args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]

    scheduler = lambda opt: get_linear_schedule_with_warmup(  # noqa: E731
        opt, num_warmup_steps=training_args.warmup_steps, num_training_steps=training_args.total_steps
    )

    optimizer = Optimizer(
        dht=dht,
        run_id=collaboration_args.run_id,
        target_batch_size=adjusted_target_batch_size,
        batch_size_per_step=total_batch_size_per_step,
        optimizer=opt,
        params=params,
        scheduler=scheduler,
        matchmaking_time=collaboration_args.matchmaking_time,
        averaging_timeout=collaboration_args.averaging_timeout,
        offload_optimizer=True,
        delay_optimizer_step=True,
        delay_grad_averaging=True,
        client_mode=collaboration_args.client_mode,
        grad_compression=Float16Compression(),
        state_averaging_compression=Float16Compression(),
        averager_opts={"bandwidth": collaboration_args.bandwidth, **asdict(averager_args)},
        tracker_opts=asdict(tracker_args),
        verbose=True,
    )
    report = make_reporter(training_args.report_file, local_public_key)
    callback = CollaborativeCallback(
        dht,
        optimizer,
        model,
        local_public_key,
        collaboration_args.statistics_expiration,
        collaboration_args.backup_every_steps,
        report,
    )
    NoOpScheduler(optimizer)  # what albert hands to the Trainer beside the optimizer
    try:
        train(training_args, model, optimizer, dataset, callback, local_public_key)
    finally:
        optimizer.shutdown()
        with torch.no_grad():
            values = [round(float(v), 7) for p in model.parameters() for v in p.flatten()]
        report(final=True, epoch=optimizer.local_epoch, params=values)
        dht.shutdown()
    logger.info("Trainer finished")


if __name__ == "__main__":
    main()
