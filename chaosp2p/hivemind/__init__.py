"""A drop-in for hivemind 1.1.12: ``import chaosp2p.hivemind as hivemind`` runs hivemind scripts.

Either change the import line, or leave the script as it is and run it with
``python -m chaosp2p.hivemind script.py ARGS`` (every ``hivemind`` import then resolves here, see
:mod:`chaosp2p.hivemind.alias`). ``hivemind.DHT`` becomes a handle on one chaosp2p peer with
hivemind's ``store``/``get`` (:mod:`chaosp2p.hivemind.dht`), ``hivemind.Optimizer`` a collaboration
of the run ``run_id`` (:mod:`chaosp2p.hivemind.optimizer`), and the helper modules scripts import
(``hivemind.utils.logging``, ``hivemind.utils.networking``, ``hivemind.dht.crypto``/``schema``/
``validation``, ``hivemind.optim.state_averager``, ``hivemind.p2p``) are thin stand-ins over
chaosp2p's pieces.

Every hivemind name and argument is supported, accepted without effect (named in one warning
with its reason), or refused with its reason: the README's compat table lists them, and
:mod:`chaosp2p.hivemind.arguments` holds the argument tables. hivemind's mixture-of-experts,
``DecentralizedAverager``, ``GradScaler`` and a standalone ``TrainingStateAverager`` are not
provided.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chaosp2p.hivemind import compression, utils
from chaosp2p.hivemind.alias import install_alias
from chaosp2p.hivemind.compression import Float16Compression, NoCompression
from chaosp2p.hivemind.dht import DHT
from chaosp2p.hivemind.p2p import PeerID
from chaosp2p.hivemind.utils.multiaddr import Multiaddr
from chaosp2p.hivemind.utils.timed_storage import DHTExpiration, ValueWithExpiration, get_dht_time

if TYPE_CHECKING:
    from chaosp2p.hivemind.optimizer import Optimizer

__version__ = "1.1.12"
"""The hivemind version whose interface this module follows."""

_NOT_PROVIDED = (
    "DecentralizedAverager",
    "TrainingAverager",
    "GradScaler",
    "ModuleBackend",
    "RemoteExpert",
    "RemoteMixtureOfExperts",
    "RemoteSwitchMixtureOfExperts",
    "Server",
    "register_expert_class",
)
_LAZY_MODULES = ("optim", "optimizer")  # they import torch; the DHT alone does not


def __getattr__(name: str) -> Any:
    if name == "Optimizer":
        value = importlib.import_module("chaosp2p.hivemind.optimizer").Optimizer
        globals()[name] = value
        return value
    if name in _LAZY_MODULES:
        return importlib.import_module(f"chaosp2p.hivemind.{name}")
    if name in _NOT_PROVIDED:
        raise AttributeError(f"chaosp2p.hivemind does not provide hivemind.{name} (see the README's compat table)")
    raise AttributeError(f"module 'chaosp2p.hivemind' has no attribute {name!r}")


__all__ = [
    "DHT",
    "DHTExpiration",
    "Float16Compression",
    "Multiaddr",
    "NoCompression",
    "Optimizer",
    "PeerID",
    "ValueWithExpiration",
    "compression",
    "get_dht_time",
    "install_alias",
    "utils",
]
