r"""What both strategies do so that no fault hangs a run: bounded collectives, signals acted
on by every rank, errors that name the collective and the peers.

:class:`BoundedRunMixin` sits before :class:`~lightning.pytorch.strategies.DDPStrategy` in the
bases of :class:`~lightning_fullgraph.FullGraphStrategy` and
:class:`~lightning_fullgraph.FourDStrategy`:

* **Two timeouts** (:class:`TimeoutConfig`).  Start-up (rendezvous, the wait while rank 0
  partitions) may take long on a loaded machine and runs under ``startup``; once :meth:`setup`
  is done the default process group, which Lightning's own collectives and metric
  synchronization use, is switched to ``collectives`` as well, and back at teardown.  A rank that is stuck anywhere
  (in a step, a callback, a data hook) then stops every other rank within that timeout.
* **Errors.**  A collective outside the library's own (Lightning's barrier or broadcast, a
  torchmetrics ``compute``) that times out or loses its peer ends the run with a
  :class:`~lightning_fullgraph.engine.CollectiveError` naming its caller and the peers, as the
  library's collectives do: the launcher's function is wrapped (:class:`_Translating`).  A rank
  that timed out also sends SIGTERM to the processes it launched, so that a rank stuck in
  Python code ends too.
* **Signals.**  :class:`~.signals.DeferredSignals` from start-up on (its watchdog ends a rank
  blocked in a collective), agreed on at every step.
"""
import signal
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Mapping, Optional, Union

import torch.distributed as dist

from .. import compat
from .._config import from_mapping
from ..engine.errors import CollectiveError, from_backend_error
from .signals import DeferredSignals

_SubprocessScriptLauncher, _MultiProcessingLauncher = compat.lightning_launchers()

__all__ = ["BoundedRunMixin", "TimeoutConfig", "as_timedelta", "refuse_grouped_arguments"]


def as_timedelta(value: Any, name: str) -> timedelta:
    r"""A positive duration from seconds or a :class:`~datetime.timedelta`.

    Raises:
        TypeError: For anything else.
        ValueError: For zero or a negative duration.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise TypeError(f"{name} must be seconds or a timedelta, got {value!r}")
    else:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must be seconds or a timedelta, got {value!r}") from None
    if not seconds > 0:
        raise ValueError(f"{name} must be positive, got {seconds:g} s")
    return timedelta(seconds=seconds)


@dataclass(frozen=True)
class TimeoutConfig:
    r"""How long a process waits for its peers, before and after start-up.

    A strategy's ``timeout`` keeps Lightning's meaning: one duration (seconds or a
    :class:`~datetime.timedelta`) is the process group's timeout, for start-up and every
    collective alike.  This object sets the two apart, which is the default: start-up
    (rendezvous, the wait while rank 0 partitions the graph) may take long on a loaded
    machine, while a peer that is stuck in training should stop the run soon::

        FullGraphStrategy(timeout=600)                                   # both 10 minutes
        FullGraphStrategy(timeout=TimeoutConfig(collectives=60))         # start-up 30 min

    Args:
        startup (timedelta or float): Start-up: rendezvous of the processes and the wait
            while rank 0 partitions the graph (default 30 minutes).
        collectives (timedelta or float): Every collective after start-up: the engine's
            (halo exchanges, gradient and BatchNorm all-reduces, the per-step signal
            agreement) and Lightning's own (metric synchronization, checkpoint barriers).  A
            rank whose peer is stuck raises a
            :class:`~lightning_fullgraph.engine.CollectiveError` naming the collective and the
            peers after at most this long; a peer that died is noticed at once (default 5
            minutes).

    Raises:
        TypeError, ValueError: A duration that is not positive seconds or a timedelta.
    """
    startup: Union[float, timedelta] = timedelta(minutes=30)
    collectives: Union[float, timedelta] = timedelta(minutes=5)

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, as_timedelta(getattr(self, f.name), f.name))

    @classmethod
    def of(cls, value: Union[None, float, timedelta, "TimeoutConfig", Mapping[str, Any]]
           ) -> "TimeoutConfig":
        r"""A config from a config, one duration (start-up and collectives alike, as
        Lightning's ``timeout``), a mapping of its fields or ``None`` (the defaults)."""
        if value is None:
            return cls()
        if isinstance(value, TimeoutConfig):
            return value
        if isinstance(value, Mapping):
            return from_mapping(cls, value)
        duration = as_timedelta(value, "timeout")
        return cls(startup=duration, collectives=duration)


class _Translating:
    r"""The launcher's function, with backend errors of collectives turned into
    :class:`~lightning_fullgraph.engine.CollectiveError` (picklable, for spawned processes)."""

    def __init__(self, function: Any, timeout: timedelta) -> None:
        self.function, self.timeout = function, timeout

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.function(*args, **kwargs)
        except (RuntimeError, OSError) as error:
            if not (dist.is_available() and dist.is_initialized()):
                raise
            rank, world = dist.get_rank(), dist.get_world_size()
            translated = from_backend_error(error, rank, (r for r in range(world) if r != rank),
                                            self.timeout)
            if translated is None:
                raise
            raise translated from error


class _BoundedSubprocessScriptLauncher(_SubprocessScriptLauncher):
    def __init__(self, *args: Any, timeout: timedelta, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collective_timeout = timeout

    def launch(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return super().launch(_Translating(function, self.collective_timeout), *args, **kwargs)


class _BoundedMultiProcessingLauncher(_MultiProcessingLauncher):
    def __init__(self, *args: Any, timeout: timedelta, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.collective_timeout = timeout

    def launch(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        return super().launch(_Translating(function, self.collective_timeout), *args, **kwargs)


def _before_progress_bars(callbacks: list) -> None:
    r"""Moves this library's callbacks before Lightning's progress bars, in place.

    At the end of a training epoch a progress bar computes epoch-level metrics on rank 0
    alone, and a torchmetrics metric synchronizes there (a collective).  A callback that
    all-reduces in ``on_train_epoch_end`` after it would wait for a different collective than
    rank 0 (a deadlock); before it, every rank runs the two in the same order.
    """
    from lightning.pytorch.callbacks.progress import ProgressBar
    bars = [i for i, c in enumerate(callbacks) if isinstance(c, ProgressBar)]
    if not bars:
        return
    ours = [c for c in callbacks[bars[0]:]
            if type(c).__module__.startswith("lightning_fullgraph.")]
    for callback in ours:
        callbacks.remove(callback)
    first = min(i for i, c in enumerate(callbacks) if isinstance(c, ProgressBar))
    callbacks[first:first] = ours


class BoundedRunMixin:
    r"""Bounded collectives, deferred signals and clear collective errors for a
    :class:`~lightning.pytorch.strategies.DDPStrategy` subclass (see the module docstring).

    The subclass calls :meth:`_init_bounded_run` in its ``__init__`` (after
    ``DDPStrategy.__init__(timeout=startup_timeout)``), :meth:`_bound_collectives` at the end
    of its ``setup`` (after it added its callbacks), and :meth:`_sync_signals` at the start of every step; it may override
    :meth:`_signal_group` (default: the default group, bounded by then).
    """

    collective_timeout: timedelta

    def _init_bounded_run(self, timeout: timedelta) -> None:
        self.collective_timeout = timeout
        self._signals = DeferredSignals(None, timeout)
        self._bounded = False

    # -- launch --------------------------------------------------------------------------------
    def _configure_launcher(self) -> None:
        assert self.cluster_environment is not None
        if self._start_method == "popen":
            self._launcher = _BoundedSubprocessScriptLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes,
                timeout=self.collective_timeout)
        else:
            self._launcher = _BoundedMultiProcessingLauncher(
                self, start_method=self._start_method, timeout=self.collective_timeout)

    def setup_environment(self) -> None:
        trainer = getattr(self.lightning_module, "trainer", None) \
            if self.lightning_module is not None else None
        # Before the rendezvous: a rank blocked there must stop on SIGTERM too.
        self._signals.watch(trainer)
        super().setup_environment()

    # -- timeouts ------------------------------------------------------------------------------
    def _bound_collectives(self) -> None:
        r"""Start-up is over: the default group's collectives (Lightning's, metrics') get the
        collective timeout, and this library's callbacks run before the progress bars."""
        trainer = getattr(self.lightning_module, "trainer", None) \
            if self.lightning_module is not None else None
        if trainer is not None:
            _before_progress_bars(trainer.callbacks)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            compat.set_group_timeout(self.collective_timeout)
            self._bounded = True
        self._signals.group = self._signal_group()

    def _unbound_collectives(self) -> None:
        if self._bounded and dist.is_available() and dist.is_initialized():
            compat.set_group_timeout(self._timeout)  # Lightning's: the start-up timeout
        self._bounded = False

    def _signal_group(self) -> Optional[Any]:
        return None

    # -- signals -------------------------------------------------------------------------------
    def _install_signals(self) -> None:
        if self.lightning_module is not None:
            self._signals.install(self.lightning_module.trainer)

    def _sync_signals(self) -> int:
        r"""Agrees on every rank's signals; returns the collectives it ran."""
        if self.lightning_module is None:
            return 0
        return self._signals.sync(self.lightning_module.trainer)

    def on_train_start(self) -> None:
        super().on_train_start()
        self._install_signals()

    def on_validation_start(self) -> None:
        super().on_validation_start()
        self._install_signals()

    def on_test_start(self) -> None:
        super().on_test_start()
        self._install_signals()

    def on_predict_start(self) -> None:
        super().on_predict_start()
        self._install_signals()

    # -- faults --------------------------------------------------------------------------------
    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        if isinstance(exception, CollectiveError) and exception.timed_out:
            # A peer is stuck: the processes this one launched must not outlive it (one stuck
            # in Python code acts on SIGTERM at once, one blocked in C++ within the grace).
            self._signals._forward(signal.SIGTERM)

    def teardown(self) -> None:
        self._unbound_collectives()
        self._signals.unwatch()
        super().teardown()


#: ``DDPStrategy`` arguments the strategies pass on: they launch, place and checkpoint the
#: processes.  The others configure ``DistributedDataParallel``, which neither strategy uses.
_PASSED_ON = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io",
              "precision_plugin", "process_group_backend", "start_method")


#: Arguments the strategies took directly before they were grouped: where each went.
_GROUPED = {"huge_pages": "kernels=KernelConfig(huge_pages={!r})",
            "num_threads": "kernels=KernelConfig(num_threads={!r})",
            "startup_timeout": "timeout=TimeoutConfig(startup={!r})"}


def refuse_grouped_arguments(strategy: str, kwargs: Mapping[str, Any],
                             grouped: Mapping[str, str] = _GROUPED) -> None:
    r"""Refuses, with the fix, an argument that now lives in a config object.

    Raises:
        TypeError: Naming each such argument and where it went.
    """
    moved = [k for k in kwargs if k in grouped]
    if moved:
        fixes = ", ".join(grouped[k].format(kwargs[k]) for k in moved)
        raise TypeError(f"{strategy} takes {', '.join(moved)} in a config object: pass {fixes} "
                        f"(lightning_fullgraph.KernelConfig, lightning_fullgraph.TimeoutConfig)")


def refuse_unknown_arguments(strategy: str, kwargs: dict, own: Any) -> None:
    r"""Refuses keyword arguments a strategy would otherwise hand to ``DDPStrategy`` and ignore
    (a misspelled option, or an option of ``DistributedDataParallel``).

    Args:
        strategy (str): The strategy's class name, for the message.
        kwargs (dict): The extra keyword arguments.
        own (Iterable[str]): The strategy's own argument names, for suggestions.

    Options of ``DistributedDataParallel`` left at their defaults are accepted (LightningCLI
    passes every one of them).

    Raises:
        TypeError: Naming each refused argument, with the closest valid name.
    """
    import difflib
    defaults = _ddp_defaults()
    # DDP's options at their defaults change nothing (LightningCLI passes every one of them).
    unknown = [k for k, v in kwargs.items() if k not in _PASSED_ON
               and not (k in defaults and _is_default(v, defaults[k]))]
    if not unknown:
        return
    names = list(own) + list(_PASSED_ON)
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, names, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(
        f"{strategy} got unexpected keyword argument(s) {', '.join(parts)}. It does not wrap "
        "the model in DistributedDataParallel, so DDP's options (ddp_comm_hook, "
        "find_unused_parameters, static_graph, ...) do not apply; what it passes on to "
        f"DDPStrategy is {', '.join(_PASSED_ON)}")


def _ddp_defaults() -> dict:
    r"""Default values of ``DDPStrategy``'s and ``DistributedDataParallel``'s arguments."""
    import inspect

    from lightning.pytorch.strategies import DDPStrategy
    from torch.nn.parallel import DistributedDataParallel
    out = {}
    for fn in (DDPStrategy.__init__, DistributedDataParallel.__init__):
        for name, p in inspect.signature(fn).parameters.items():
            if p.default is not inspect.Parameter.empty:
                out[name] = p.default
    return out


def _is_default(value: Any, default: Any) -> bool:
    try:
        return value is default or bool(value == default)
    except Exception:  # e.g. tensors
        return False
