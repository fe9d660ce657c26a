"""A drop-in for hivemind 1.1.12: ``import chaosp2p.hivemind as hivemind`` runs hivemind scripts.

Only the import line changes. ``hivemind.DHT`` becomes a handle on one chaosp2p peer and
``hivemind.Optimizer`` a collaboration of the run ``run_id`` (see :mod:`chaosp2p.hivemind.optimizer`
for how hivemind's epochs map onto collaboration steps). The mapping, argument by argument:

========================================  ==========================================================
hivemind                                  chaosp2p
========================================  ==========================================================
``DHT(initial_peers=...)``                ``PeerConfig.bootstrap``; with initial peers the optimizer
                                          *joins* its run, without them it *founds* it
``DHT(host_maddrs=...)``                  ``PeerConfig.listen`` (TCP only); loopback-only addresses
                                          select the ``local`` profile, anything else ``lan``
``DHT(identity_path=...)``                ``PeerConfig.identity_path``
``DHT(start=, await_ready=)``             start the peer now / ready when started
``DHT(daemon=True)``                      the peer shuts down (runs left gracefully) at exit
``DHT(shutdown_timeout=)``                kept; leaving is bounded by the optimizer's own timeout
``dht.get_visible_maddrs()``              the peer's multiaddrs, ``/p2p/<peer id>`` included
``dht.shutdown()`` / ``dht.is_alive()``   leave every run, stop the peer / whether it runs
``Optimizer(run_id=)``                    the collaboration's run id
``Optimizer(target_batch_size=)``         the run's global batch (split into agreed shares)
``Optimizer(batch_size_per_step=)``       samples per ``step()`` call towards this peer's share
``Optimizer(optimizer=, params=)``        the wrapped optimizer (instance, or factory + params)
``Optimizer(scheduler=)``                 stepped once per epoch; joins carry its position
``Optimizer(use_local_updates=False)``    synchronous mode, one averaged step per epoch
``Optimizer(use_local_updates=True)``     DiLoCo mode, 1 outer step per epoch, outer SGD lr 1,
                                          momentum 0 (= parameter averaging weighted by samples)
``Optimizer(averaging_timeout=)``         ``round_timeout_min_s``: how long a round waits at least
                                          for a stalled member before it is redone without it
``Optimizer(allreduce_timeout=)``         the same, when given (hivemind: per all-reduce attempt)
``Optimizer(matchmaking_time=)``          ``retry_wait_s``: how long a member waits for the group
                                          to re-form (a new configuration) after a failed round
``Optimizer(load_state_timeout=)``        ``join_timeout_s`` (download + catch-up)
``Optimizer(shutdown_timeout=)``          bound on a graceful leave (raised to 3 epochs' time)
``Optimizer(grad_compression=)``          ``wire_dtype``: NoCompression float32,
``Optimizer(state_averaging_compression=)``   Float16Compression float16
``Optimizer(verbose=True)``               progress lines on the ``chaosp2p.hivemind`` logger
``opt.step()`` / ``opt.zero_grad()``      see :class:`chaosp2p.hivemind.Optimizer`
``opt.local_epoch``                       the collaboration's step
``opt.load_state_from_peers()``           nothing to fetch: joining already loaded the state
``opt.shutdown()``                        a graceful leave of the run
========================================  ==========================================================

Every other hivemind argument must keep hivemind's default value; any other value raises a
:class:`chaosp2p.errors.ConfigError` naming it (:mod:`chaosp2p.hivemind.arguments`). hivemind's
mixture-of-experts, ``DecentralizedAverager`` and ``GradScaler`` are not provided.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chaosp2p.hivemind import compression
from chaosp2p.hivemind.compression import Float16Compression, NoCompression
from chaosp2p.hivemind.dht import DHT

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


def __getattr__(name: str) -> Any:
    # The optimizer needs torch; the DHT alone does not.
    if name == "Optimizer":
        value = importlib.import_module("chaosp2p.hivemind.optimizer").Optimizer
        globals()[name] = value
        return value
    if name in _NOT_PROVIDED:
        raise AttributeError(f"chaosp2p.hivemind does not provide hivemind.{name} (only DHT and Optimizer)")
    raise AttributeError(f"module 'chaosp2p.hivemind' has no attribute {name!r}")


__all__ = ["DHT", "Float16Compression", "NoCompression", "Optimizer", "compression"]
