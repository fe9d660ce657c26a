"""``hivemind.Optimizer`` for the drop-in: hivemind's epochs on top of a chaosp2p collaboration.

Theory of operation
-------------------
hivemind counts progress in *epochs*: an epoch ends when the peers of a run have processed
``target_batch_size`` samples together, whatever their number. Here one epoch is one step of a
:class:`chaosp2p.Collaboration` whose global batch is ``target_batch_size``: the run's
agreed configuration splits it into per-member shares (equal at first, then following each
member's measured throughput), and each ``step()`` call adds ``batch_size_per_step`` samples to
this peer's share of the current epoch. When the share is full the epoch ends on every member at
the same collaboration step:

* ``use_local_updates=False`` (hivemind's default): gradients accumulate locally, weighted by
  samples, and nothing moves until the share is full; then the mean gradient is averaged among the
  members weighted by their samples (chaosp2p's synchronous mode) and the wrapped optimizer steps
  once. Parameters and optimizer state are bit-identical on every member after every epoch.
* ``use_local_updates=True``: the wrapped optimizer steps on every call; at the end of the share the
  parameters are averaged among the members, weighted by samples. That is chaosp2p's DiLoCo mode
  with one outer step per epoch, outer learning rate 1 and no momentum -- the outer update
  ``global - 1 * (global - average)`` *is* the average. Each member keeps its own inner optimizer
  state, as in hivemind.

A peer joins the run while ``Optimizer(...)`` is constructed: it downloads the members' state from
all of them in parallel while they keep training, replays the epochs it missed and is admitted at
an agreed epoch, bit-identical to the members. ``load_state_from_peers()`` therefore has nothing to
fetch any more; it only drops progress accumulated since the last epoch, as hivemind's does.

A learning-rate ``scheduler`` steps once per epoch. Its position travels with the state: the
parameter module the collaboration snapshots carries an ``epoch`` counter, and after a download the
scheduler is moved to it before the next optimizer step (replayed catch-up steps included).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from chaosp2p.errors import ConfigError, LocalProtocolError
from chaosp2p.hivemind.arguments import OptimizerSettings, ignored_warning, optimizer_settings
from chaosp2p.hivemind.dht import DHT
from chaosp2p.hivemind.founding import ANNOUNCE_TTL_S, announce_member, find_member
from chaosp2p.hivemind.optim.grad_averager import GradientAveragerView
from chaosp2p.hivemind.optim.progress_tracker import LocalTrainingProgress, ProgressTracker
from chaosp2p.hivemind.optim.state_averager import StateAveragerView
from chaosp2p.hivemind.utils.logging import get_logger

if TYPE_CHECKING:
    from chaosp2p.api.blocking_collaboration import Collaboration
    from chaosp2p.training.collab_core import StepStatistics

log = logging.getLogger("chaosp2p.hivemind")


class ParameterModule(torch.nn.Module):
    """The wrapped optimizer's parameters as one module, plus the epoch counter.

    hivemind's optimizer gets parameters, not a model, but a collaboration snapshots and averages
    a module: this one holds the very same ``Parameter`` objects (no copies), in the optimizer's
    order, which is the same on every peer running the same script.
    """

    def __init__(self, parameters: list[torch.nn.Parameter]) -> None:
        super().__init__()
        self.params = torch.nn.ParameterList(parameters)
        self.register_buffer("epoch", torch.zeros((), dtype=torch.int64))

    @property
    def epochs_done(self) -> int:
        """Optimizer steps taken through the collaboration (the scheduler's position)."""
        value: torch.Tensor = self.get_buffer("epoch")
        return int(value)

    def set_epochs_done(self, count: int) -> None:
        """Set the epoch counter (a newcomer in local-updates mode, whose download omits it)."""
        self.get_buffer("epoch").fill_(count)


class EpochStepper:
    """The optimizer the collaboration drives: one call is one epoch's optimizer step.

    It steps the wrapped optimizer, counts the epoch in the parameter module and steps the
    scheduler. After the collaboration loads a downloaded state into it, the scheduler is moved to
    the downloaded epoch count before the next step.
    """

    def __init__(self, optimizer: Any, module: ParameterModule, scheduler: Any) -> None:
        self.optimizer = optimizer
        self.module = module
        self.scheduler = scheduler
        self._resync = False

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups."""
        groups: list[dict[str, Any]] = self.optimizer.param_groups
        return groups

    @property
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state."""
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        state: dict[str, Any] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a downloaded optimizer state; the scheduler follows at the next step."""
        self.optimizer.load_state_dict(state_dict)
        self._resync = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        """One epoch's optimizer step (and scheduler step)."""
        if self._resync:
            self._resync = False
            self.sync_scheduler(self.module.epochs_done, lr_loaded=True)
        self.optimizer.step()
        self.module.set_epochs_done(self.module.epochs_done + 1)
        if self.scheduler is not None:
            self.scheduler.step()

    def sync_scheduler(self, epochs: int, *, lr_loaded: bool) -> None:
        """Move the scheduler to ``epochs`` steps.

        ``lr_loaded``: the learning rates in the optimizer already are the run's (they travel in the
        optimizer state), so only the position moves -- right for closed-form schedules and for
        chainable ones alike. Otherwise (a fresh optimizer) the schedule is replayed from its start.
        """
        if self.scheduler is None:
            return
        if lr_loaded:
            self.scheduler.last_epoch = epochs
            self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
            return
        with warnings.catch_warnings():
            # torch warns when a scheduler steps before its optimizer ever did; replaying is the point.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(epochs - self.scheduler.last_epoch):
                self.scheduler.step()


def _parameters(optimizer: Any) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _build_optimizer(optimizer: Any, params: Any) -> Any:
    is_instance = all(hasattr(optimizer, name) for name in ("param_groups", "step", "zero_grad"))
    if is_instance:
        if params is not None:
            raise ConfigError("params= is only for an optimizer factory (optimizer=lambda params: ...)")
        return optimizer
    if callable(optimizer):
        if params is None:
            raise ConfigError("optimizer is a factory: pass params= (the model's parameters or param groups)")
        materialised = list(params)
        built = optimizer(materialised)
        if not all(hasattr(built, name) for name in ("param_groups", "step", "zero_grad", "state_dict")):
            raise ConfigError(f"optimizer(params) returned {type(built).__name__}, not a torch optimizer")
        return built
    raise ConfigError("optimizer must be a torch optimizer or a callable(params) -> optimizer")


def _build_scheduler(scheduler: Any, optimizer: Any) -> Any:
    if scheduler is None:
        return None
    if isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler):
        if scheduler.optimizer is not optimizer:
            raise ConfigError("scheduler was built on another optimizer than the one hivemind.Optimizer wraps")
        return scheduler
    if callable(scheduler):
        return scheduler(optimizer)
    raise ConfigError("scheduler must be an LR scheduler or a callable(optimizer) -> scheduler")


def _enable_verbose_logging() -> None:
    """Print the drop-in's progress lines, as hivemind's ``verbose=True`` does (its handler, its format)."""
    get_logger("chaosp2p.hivemind")
    if log.level == logging.NOTSET or log.level > logging.INFO:
        log.setLevel(logging.INFO)


class Optimizer(torch.optim.Optimizer):
    """hivemind 1.1.12's ``Optimizer`` on a chaosp2p collaboration (see the module docstring).

    Supported arguments: ``dht``, ``run_id``, ``target_batch_size``, ``batch_size_per_step``,
    ``optimizer``, ``params``, ``scheduler``, ``matchmaking_time``, ``averaging_timeout``,
    ``allreduce_timeout``, ``load_state_timeout``, ``use_local_updates``, ``grad_compression``,
    ``state_averaging_compression``, ``offload_optimizer`` (CPU parameters only),
    ``delay_state_averaging``, ``shutdown_timeout``, ``verbose``. Every other hivemind argument must
    keep hivemind's default; see :mod:`chaosp2p.hivemind.arguments` for the mapping.
    """

    def __init__(
        self,
        *,
        dht: DHT,
        run_id: str,
        target_batch_size: int,
        batch_size_per_step: int | None = None,
        optimizer: Any,
        params: Iterable[Any] | None = None,
        scheduler: Any = None,
        matchmaking_time: float | None = 15.0,
        averaging_timeout: float | None = 60.0,
        allreduce_timeout: float | None = None,
        load_state_timeout: float = 600.0,
        reuse_grad_buffers: bool = False,
        offload_optimizer: bool | None = None,
        delay_state_averaging: bool = True,
        use_local_updates: bool = False,
        grad_compression: Any = None,
        state_averaging_compression: Any = None,
        shutdown_timeout: float = 5,
        verbose: bool = False,
        **kwargs: Any,
    ) -> None:
        # Like hivemind's, this optimizer is a torch.optim.Optimizer (LR schedulers and trainers
        # check that) without calling its __init__: the parameter groups are the wrapped optimizer's.
        if not isinstance(dht, DHT):
            raise ConfigError(f"dht must be a chaosp2p.hivemind.DHT (got {type(dht).__name__})")
        self.settings: OptimizerSettings = optimizer_settings(
            target_batch_size=target_batch_size,
            batch_size_per_step=batch_size_per_step,
            use_local_updates=use_local_updates,
            matchmaking_time=matchmaking_time,
            averaging_timeout=averaging_timeout,
            allreduce_timeout=allreduce_timeout,
            load_state_timeout=load_state_timeout,
            shutdown_timeout=shutdown_timeout,
            grad_compression=grad_compression,
            state_averaging_compression=state_averaging_compression,
            delay_state_averaging=delay_state_averaging,
            verbose=verbose,
            unsupported=kwargs,
            reuse_grad_buffers=reuse_grad_buffers,
        )
        """The arguments in chaosp2p terms."""
        self.dht, self.run_id = dht, run_id
        self.target_batch_size, self.batch_size_per_step = target_batch_size, batch_size_per_step
        self.matchmaking_time, self.averaging_timeout = matchmaking_time, averaging_timeout
        self.load_state_timeout, self.shutdown_timeout = load_state_timeout, shutdown_timeout
        self.status_loglevel = logging.INFO if verbose else logging.DEBUG
        if verbose:
            _enable_verbose_logging()
        for note in self.settings.notes:
            log.warning("%s", note)
        if self.settings.ignored:
            log.warning("%s", ignored_warning("Optimizer", self.settings.ignored))
        inner = _build_optimizer(optimizer, params)
        parameters = _parameters(inner)
        if offload_optimizer and any(p.device.type != "cpu" for p in parameters):
            raise ConfigError("offload_optimizer=True is not supported for parameters off the CPU")
        self._inner = inner
        self._module = ParameterModule(parameters)
        self._trainable = [p for p in parameters if p.requires_grad]
        self._stepper = EpochStepper(inner, self._module, _build_scheduler(scheduler, inner))
        self._accumulators: list[torch.Tensor] | None = None
        self._samples = 0
        self._calls = 0
        self._epoch_started = time.perf_counter()
        self._samples_per_second = 0.0
        self._epoch_s = 0.0
        self._left = False
        self._announced_at = float("-inf")
        self._collab = self._start_collaboration(dht)
        self._announce()
        dht.on_shutdown(self.shutdown)
        self.tracker = ProgressTracker(self)
        """The run's progress (read-only; hivemind's ``ProgressTracker``)."""
        self.state_averager = StateAveragerView(self)
        """The optimizer, scheduler, parameters and epoch (read-only; hivemind's ``TrainingStateAverager``)."""
        self.grad_averager: GradientAveragerView | None = (
            None
            if use_local_updates
            else GradientAveragerView(self.accumulation, self.is_alive, reuse_grad_buffers=reuse_grad_buffers)
        )
        """Gradient accumulation in this epoch (read-only); None with ``use_local_updates=True``, as in hivemind."""

    def _start_collaboration(self, dht: DHT) -> Collaboration:
        from chaosp2p.api.blocking_collaboration import Collaboration

        config = self.settings.collaboration_config(dht.config.profile)
        # The first optimizer to find no run founds it; a peer that only runs the DHT (a monitor)
        # answers that it takes part in none, so it never blocks a start (see founding.py).
        member = None
        if dht.config.bootstrap:
            member = dht.peer.call(
                partial(find_member, dht.peer.async_peer, self.run_id, patience_s=self.settings.join_timeout_s)
            )
        joining = member is not None
        if joining:
            logger_verb = "Joining run %r through %s: downloading the members' state and catching up"
            log.log(self.status_loglevel, logger_verb, self.run_id, member)
        else:
            log.log(self.status_loglevel, "Found no peer training run %r: starting it", self.run_id)
        started = time.perf_counter()
        collab = Collaboration(
            dht.peer,
            run=self.run_id,
            model=self._module,
            optimizer=self._stepper,
            config=config,
            found=not joining,
            timeout=self.settings.join_timeout_s,
        )
        params = collab.configuration.params
        if params.mode != self.settings.mode:
            collab.leave()
            theirs = "True" if params.mode == "diloco" else "False"
            raise ConfigError(f"run {self.run_id!r} trains with use_local_updates={theirs}; this peer asked otherwise")
        if collab.global_batch != self.target_batch_size:
            log.warning(
                "run %r uses target_batch_size=%d (its founder's); this peer asked for %d",
                self.run_id,
                collab.global_batch,
                self.target_batch_size,
            )
        if joining:
            if self.settings.mode == "diloco":
                # The download held the global parameters, not this peer's fresh inner optimizer.
                self._module.set_epochs_done(collab.start_step)
                self._stepper.sync_scheduler(collab.start_step, lr_loaded=False)
            log.log(
                self.status_loglevel,
                "Joined run %r at epoch %d after %.2f s",
                self.run_id,
                collab.start_step,
                time.perf_counter() - started,
            )
        return collab

    # ------------------------------------------------------------------ hivemind's interface
    @property
    def local_epoch(self) -> int:
        """This peer's epoch, which every member of the run shares (the collaboration's step)."""
        return self._collab.step_index

    @property
    def use_local_updates(self) -> bool:
        """Whether the wrapped optimizer steps on every call (parameters averaged each epoch)."""
        return self.settings.mode == "diloco"

    @property
    def use_gradient_averaging(self) -> bool:
        """Whether gradients accumulate to the epoch and are averaged (hivemind's default)."""
        return self.settings.mode == "sync"

    @property
    def opt(self) -> Any:
        """The wrapped torch optimizer."""
        return self._inner

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (the very same dicts)."""
        groups: list[dict[str, Any]] = self._inner.param_groups
        return groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        raise ConfigError("parameter groups are fixed when hivemind.Optimizer is created")

    @property
    def state(self) -> defaultdict[Any, Any]:
        """The wrapped optimizer's state, plus ``local_epoch`` (as hivemind reports it)."""
        state: defaultdict[Any, Any] = defaultdict(dict, self._inner.state)
        state["local_epoch"] = self.local_epoch
        return state

    @state.setter
    def state(self, value: Any) -> None:
        raise ConfigError("use load_state_dict() to change the optimizer state")

    @property
    def local_progress(self) -> LocalTrainingProgress:
        """Samples accumulated towards this peer's share of the current epoch."""
        return LocalTrainingProgress(
            peer_id=self.dht.peer_id.raw,
            epoch=self.local_epoch,
            samples_accumulated=self._samples,
            samples_per_second=self._samples_per_second,
            time=time.time(),
            client_mode=False,
        )

    def step(
        self,
        closure: Callable[[], Any] | None = None,
        batch_size: int | None = None,
        grad_scaler: Any = None,
    ) -> Any:
        """Add this call's samples to the epoch; at the end of this peer's share, average and step.

        ``batch_size`` overrides ``batch_size_per_step`` for this call. ``closure`` is evaluated
        (with gradients enabled) before anything else, and its loss returned.
        """
        if grad_scaler is not None:
            raise ConfigError("grad_scaler is not supported by chaosp2p's drop-in (no mixed-precision scaling)")
        if self._left:
            raise LocalProtocolError("this optimizer was shut down")
        size = batch_size if batch_size is not None else self.batch_size_per_step
        if size is None:
            raise ConfigError("set batch_size_per_step when creating the optimizer, or pass step(batch_size=...)")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigError(f"batch_size must be a non-negative int (got {size!r})")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._samples += size
        self._calls += 1
        self._collab.note_activity()  # an inner step is activity: only a peer that stops calling step() is idle
        share = max(self._collab.local_batch_size, 1)
        if self._samples < share:
            if self.use_local_updates:
                self._inner.step()
            elif not self.settings.reuse_grad_buffers:
                self._accumulate(size)
            return loss
        self._end_epoch(size)
        return loss

    def _accumulate(self, size: int) -> None:
        with torch.no_grad():
            if self._accumulators is None:
                self._accumulators = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self._trainable]
            for accumulator, p in zip(self._accumulators, self._trainable, strict=True):
                if p.grad is not None:
                    accumulator.add_(p.grad, alpha=size)

    def _mean_gradient_into_grad(self, size: int) -> None:
        """Leave the samples-weighted mean of this epoch's gradients in ``.grad``."""
        if self._calls == 1:
            return  # one call made the whole share: .grad already is its mean
        if self.settings.reuse_grad_buffers:
            # The script let backward() sum every call's gradient into .grad; hivemind divides
            # that sum by the number of calls.
            with torch.no_grad():
                for p in self._trainable:
                    if p.grad is not None:
                        p.grad.div_(self._calls)
            return
        self._accumulate(size)
        assert self._accumulators is not None
        with torch.no_grad():
            for accumulator, p in zip(self._accumulators, self._trainable, strict=True):
                mean = accumulator.div_(max(self._samples, 1))
                if p.grad is None:
                    p.grad = mean.clone()
                else:
                    p.grad.copy_(mean)
                accumulator.zero_()

    def _end_epoch(self, size: int) -> None:
        if self.use_gradient_averaging:
            self._mean_gradient_into_grad(size)
        samples = self._samples
        result = self._collab.step(samples=samples)
        self._samples = 0
        self._calls = 0
        if self.settings.reuse_grad_buffers:
            with torch.no_grad():  # the buffers start the next epoch empty, as hivemind resets them
                for p in self._trainable:
                    if p.grad is not None:
                        p.grad.zero_()
        self._announce()
        now = time.perf_counter()
        elapsed = now - self._epoch_started
        self._epoch_started = now
        if elapsed > 0:
            self._samples_per_second = samples / elapsed
            self._epoch_s = elapsed
        what = "gradients" if self.use_gradient_averaging else "parameters"
        log.log(
            self.status_loglevel,
            "Averaged %s with %d peers in %.3f s (%d samples from this peer); transitioning to epoch %d",
            what,
            result.members,
            result.round_s,
            samples,
            self.local_epoch,
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradients of the wrapped optimizer's parameters (refused with ``reuse_grad_buffers``)."""
        if self.settings.reuse_grad_buffers:
            raise ConfigError(
                "with reuse_grad_buffers=True gradients accumulate in .grad until the epoch ends: "
                "never call zero_grad() (hivemind refuses it too)"
            )
        for p in _parameters(self._inner):
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()

    def load_state_from_peers(self, **kwargs: Any) -> None:
        """Be in sync with the run: already true, since joining downloaded its state (see above).

        Progress accumulated since the last epoch is dropped, as hivemind drops it.
        """
        unknown = sorted(set(kwargs) - {"timeout"})
        if unknown:
            raise ConfigError(f"load_state_from_peers: unsupported argument(s) {', '.join(unknown)}")
        self._samples = 0
        self._calls = 0
        if self._accumulators is not None:
            for accumulator in self._accumulators:
                accumulator.zero_()
        log.log(
            self.status_loglevel,
            "Peer holds the run's state at epoch %d (downloaded when it joined; nothing to fetch)",
            self.local_epoch,
        )

    def is_synchronized_with_peers(self) -> bool:
        """Always true: every member of the run is at the same epoch."""
        return True

    def is_alive(self) -> bool:
        """Whether this optimizer still takes part in the run."""
        return not self._left and self.dht.is_alive()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict with ``state["local_epoch"]`` (hivemind's layout)."""
        state: dict[str, Any] = self._inner.state_dict()
        state["state"]["local_epoch"] = self.local_epoch
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load optimizer state (albert restores a backup this way) without members ever differing.

        The epoch stays the run's (it is agreed, not set by one peer; hivemind would take the
        backup's and then find the peer out of sync). Training alone, the state is loaded as is.
        With use_local_updates=True each member's optimizer state is its own, so it is loaded as
        is too, and the parameters meet the others' at the next epoch's average. With averaged
        gradients the members hold one state: loading a different one into one member would make
        it diverge, so this peer loads it and then re-synchronises with the run -- it leaves and
        joins again, downloading the members' state (what hivemind's ``load_state_from_peers`` does
        when a restored peer finds itself behind).
        """
        inner_state = dict(state_dict["state"])
        epoch = inner_state.pop("local_epoch", self.local_epoch)
        if epoch != self.local_epoch:
            log.warning("loaded optimizer state from epoch %s; the run stays at epoch %d", epoch, self.local_epoch)
        self._inner.load_state_dict({**state_dict, "state": inner_state})
        if self.use_gradient_averaging and self._collab.world_size > 1:
            self._resynchronise()

    def _resynchronise(self) -> None:
        log.log(self.status_loglevel, "Re-synchronising with run %r after a local state change", self.run_id)
        self._collab.leave(timeout=max(self.settings.leave_timeout_s, 3.0 * self._epoch_s))
        self._collab = self._start_collaboration(self.dht)
        self.load_state_from_peers()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: parameter groups are fixed at creation (as in hivemind)."""
        raise ConfigError("hivemind.Optimizer takes all parameter groups at creation")

    def shutdown(self) -> None:
        """Leave the run gracefully: the other members go on without this peer. Idempotent.

        Waits until the leave takes effect (a step or two after it is announced), for at most the
        larger of ``shutdown_timeout`` and 3 epochs' time.
        """
        if self._left:
            return
        self._left = True
        if self.dht.is_alive():
            # The run commits a leave a step or two ahead and the leaver serves those rounds with
            # zero weight; epochs can be long, so the bound follows the measured epoch time.
            timeout = max(self.settings.leave_timeout_s, 3.0 * self._epoch_s)
            log.log(self.status_loglevel, "Leaving run %r at epoch %d", self.run_id, self.local_epoch)
            self._collab.leave(timeout=timeout)

    # ------------------------------------------------------------------ what the views read
    @property
    def scheduler(self) -> Any:
        """The learning-rate scheduler, stepped once per epoch (hivemind: ``state_averager.scheduler``)."""
        return self._stepper.scheduler

    def run_shape(self) -> tuple[int, int, int]:
        """``(members, global batch, this peer's share)`` of the run's current configuration."""
        return self._collab.world_size, self._collab.global_batch, self._collab.local_batch_size

    def accumulation(self) -> tuple[int, int]:
        """``(samples, step() calls)`` accumulated towards this peer's share of the current epoch."""
        return self._samples, self._calls

    def _announce(self) -> None:
        """Keep this peer announced as a member of the run, so that peers outside its view find it."""
        now = time.monotonic()
        if now - self._announced_at < ANNOUNCE_TTL_S / 2 or not self.dht.is_alive():
            return
        self._announced_at = now
        self.dht.peer.call(announce_member, self.dht.peer.async_peer, self.run_id)

    # ------------------------------------------------------------------ chaosp2p extras
    @property
    def collaboration(self) -> Collaboration:
        """The :class:`chaosp2p.Collaboration` underneath (chaosp2p only)."""
        return self._collab

    def statistics(self) -> StepStatistics | None:
        """What the last epoch's averaging did (members, round and idle time, bytes; chaosp2p only)."""
        return self._collab.statistics()

    def parameter_digest(self) -> str:
        """Hash of the parameters: equal on every member right after an epoch (chaosp2p only)."""
        return self._collab.parameter_digest()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(prefix={self.run_id}, epoch={self.local_epoch})"
