#!/usr/bin/env python3
"""albert's ``run_training_monitor.py`` (hivemind 1.1.12 ``examples/albert``) for the tiny trainer.

A DHT-only peer: it never trains, it reads every trainer's metrics from the DHT (``dht.get(run_id
+ "_metrics", latest=True)``) and logs the collaboration's loss. Albert's main loop is unchanged;
what differs: no wandb or Hub upload, no checkpoints by default (they need a standalone
``TrainingStateAverager``, which chaosp2p.hivemind does not provide), ``--report_file`` writes what
each refresh saw as JSON lines, and SIGTERM ends the loop. Start it first, then point trainers at
the ``--initial_peers`` it logs.
"""

import hashlib
import json
import signal
import time
from dataclasses import dataclass, field

import hivemind
import utils
from arguments import ArgumentParser, AveragerArguments, BaseTrainingArguments, OptimizerArguments
from hivemind.utils.logging import get_logger, use_hivemind_log_handler
from hivemind.utils.networking import log_visible_maddrs

use_hivemind_log_handler("in_root_logger")
logger = get_logger(__name__)

STOPPING = []


@dataclass
class TrainingMonitorArguments(BaseTrainingArguments):
    """
    Note: You might want to have several initial peers so that if one dies,
    new workers still can join the collaboration via alive initial peers' addresses.
    Specify initial_peers argument for that purpose
    """

    refresh_period: float = field(default=30, metadata={"help": "Period (in seconds) for fetching the keys from DHT"})
    store_checkpoints: bool = field(default=False, metadata={"help": "If False, disables periodic checkpoint saving"})
    report_file: str | None = field(default=None, metadata={"help": "JSON lines: what each refresh saw"})


def report(path, **record):
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(dict(record, time=time.time())) + "\n")


if __name__ == "__main__":
    parser = ArgumentParser((TrainingMonitorArguments, OptimizerArguments, AveragerArguments))
    monitor_args, optimizer_args, averager_args = parser.parse_args_into_dataclasses()
    signal.signal(signal.SIGTERM, lambda *_: STOPPING.append(True))
    if monitor_args.store_checkpoints:
        raise SystemExit("this example keeps no checkpoints (albert's CheckpointHandler needs the real model)")

    run_id = monitor_args.run_id
    validators, local_public_key = utils.make_validators(run_id)

    dht = hivemind.DHT(
        start=True,
        initial_peers=monitor_args.initial_peers,
        record_validators=validators,
        use_ipfs=monitor_args.use_ipfs,
        host_maddrs=monitor_args.host_maddrs,
        announce_maddrs=monitor_args.announce_maddrs,
        identity_path=monitor_args.identity_path,
    )
    log_visible_maddrs(dht.get_visible_maddrs(), only_p2p=monitor_args.use_ipfs)

    current_step = 0

    while not STOPPING:
        metrics_dict = dht.get(run_id + "_metrics", latest=True)
        if metrics_dict is not None:
            metrics_dict = metrics_dict.value
            metrics = [utils.LocalMetrics.parse_obj(metrics_dict[peer].value) for peer in metrics_dict]
            latest_step = max(item.step for item in metrics)
            keys = sorted(hashlib.sha256(peer).hexdigest()[:16] for peer in metrics_dict)
            report(monitor_args.report_file, peers=keys, steps=[item.step for item in metrics])

            if latest_step != current_step:
                logger.debug(f"Got metrics from {len(metrics)} peers")

                for i, metrics_for_peer in enumerate(metrics):
                    logger.debug(f"{i} peer {metrics_for_peer}")

                current_step = latest_step
                alive_peers = 0
                sum_loss = 0
                num_samples = 0
                sum_perf = 0
                sum_mini_steps = 0

                for item in metrics:
                    sum_loss += item.loss
                    alive_peers += 1
                    sum_perf += item.samples_per_second
                    num_samples += item.samples_accumulated
                    sum_mini_steps += item.mini_steps
                current_loss = sum_loss / sum_mini_steps
                logger.info(f"Step #{current_step}\tloss = {current_loss:.5f}")
                report(monitor_args.report_file, step=current_step, loss=current_loss, alive_peers=alive_peers)
        else:
            report(monitor_args.report_file, peers=[], steps=[])
        logger.debug("Peer is still alive...")
        time.sleep(monitor_args.refresh_period)
    dht.shutdown()
    logger.info("Monitor finished")
