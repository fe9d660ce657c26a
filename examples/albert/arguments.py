"""albert's ``arguments.py`` (hivemind 1.1.12 ``examples/albert``) for a tiny local model.

The collaboration, averager and tracker arguments are albert's, field for field and with its
defaults. ``TinyTrainingArguments`` stands in for transformers' ``TrainingArguments`` (no
transformers here), and :class:`ArgumentParser` for ``HfArgumentParser``: one ``--name value``
flag per dataclass field, lists as several values, booleans as ``True``/``False``.
"""

import argparse
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any


@dataclass
class BaseTrainingArguments:
    run_id: str = field(
        default="albert", metadata={"help": "A unique 'name' of this experiment, used to store metadata on the DHT"}
    )
    initial_peers: list[str] = field(
        default_factory=list,
        metadata={"help": "Multiaddrs of the peers that will welcome you into the existing collaboration."},
    )
    use_ipfs: bool = field(default=False, metadata={"help": "Use IPFS to find initial_peers."})
    host_maddrs: list[str] = field(
        default_factory=lambda: ["/ip4/0.0.0.0/tcp/0"],
        metadata={"help": "Multiaddrs to listen for external connections from other p2p instances."},
    )
    announce_maddrs: list[str] = field(
        default_factory=list,
        metadata={"help": "Visible multiaddrs the host announces for external connections from other p2p instances"},
    )
    identity_path: str | None = field(default=None, metadata={"help": "Path to a pre-generated private key file."})


@dataclass
class AveragerArguments:
    target_group_size: int = field(default=256, metadata={"help": "Maximum group size for all-reduce"})


@dataclass
class ProgressTrackerArguments:
    min_refresh_period: float = field(default=0.5, metadata={"help": "Wait at least this long between fetches"})
    max_refresh_period: float = field(default=30, metadata={"help": "Wait at most this long between fetches"})
    default_refresh_period: float = field(default=3, metadata={"help": "Fetch this often until successful"})
    expected_drift_peers: float = field(default=3, metadata={"help": "New peers that can join per step"})
    expected_drift_rate: float = field(default=0.2, metadata={"help": "Fraction of current size that can join"})
    metadata_expiration: float = field(default=120, metadata={"help": "Peer metadata expires after this long"})


@dataclass
class OptimizerArguments:
    target_batch_size: int = field(
        default=4096,
        metadata={"help": "Perform optimizer step after all peers collectively accumulate this many samples"},
    )
    client_mode: bool = field(default=False, metadata={"help": "Train without incoming connections"})
    batch_size_lead: int = field(default=0, metadata={"help": "Look for a group this many samples in advance"})
    bandwidth: float = field(default=100.0, metadata={"help": "Available network bandwidth, in mbps"})
    averaging_timeout: float = field(default=60.0, metadata={"help": "Give up on averaging step after this long"})
    matchmaking_time: float = field(default=5.0, metadata={"help": "Wait this long for group requests"})


@dataclass
class CollaborationArguments(OptimizerArguments, BaseTrainingArguments):
    statistics_expiration: float = field(
        default=600, metadata={"help": "Statistics will be removed if not updated in this many seconds"}
    )
    backup_every_steps: int = field(default=10, metadata={"help": "Frequency of backups to restore from"})


@dataclass
class TinyTrainingArguments:
    """What albert takes from transformers' TrainingArguments, for a tiny model on local data."""

    per_device_train_batch_size: int = 4
    gradient_accumulation_steps: int = 2
    total_steps: int = 125_000  # please note: this only affects the learning rate schedule
    learning_rate: float = 0.00176
    warmup_steps: int = 5000
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-6
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 42
    dataset_size: int = 4096
    step_delay: float = 0.0  # seconds of "compute" per step, to pace a demo
    stop_file: str | None = None  # stop once the epoch written in this file is reached (for tests)
    report_file: str | None = None  # JSON lines: one per epoch, and the final parameters


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text}")


class ArgumentParser:
    """``HfArgumentParser`` for plain dataclasses: ``parse_args_into_dataclasses()``."""

    def __init__(self, types: tuple) -> None:
        self.types = types
        self.parser = argparse.ArgumentParser()
        seen = set()
        for kind in types:
            hints = typing.get_type_hints(kind)
            for item in dataclasses.fields(kind):
                if item.name in seen:
                    continue
                seen.add(item.name)
                self.parser.add_argument(f"--{item.name}", **self._options(item, hints[item.name]))

    @staticmethod
    def _options(item: Any, hint: Any) -> dict:
        default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
        options: dict = {"default": default, "help": item.metadata.get("help")}
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (typing.Union, types.UnionType):  # Optional[X], X | None
            hint = next(arg for arg in args if arg is not type(None))
            origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin in (list, list):
            options.update(nargs="*", type=args[0])
        elif hint is bool:
            options.update(type=_bool)
        else:
            options.update(type=hint)
        return options

    def parse_args_into_dataclasses(self) -> tuple:
        namespace = vars(self.parser.parse_args())
        return tuple(
            kind(**{item.name: namespace[item.name] for item in dataclasses.fields(kind) if item.init})
            for kind in self.types
        )
