r"""SIGTERM (and SLURM's requeue signal) acted on by all ranks at the same step.

Lightning's SIGTERM handler broadcasts from *inside* the signal handler.  A signal arrives
whenever the main thread next runs Python code, e.g. between two halo exchanges, so rank 0
then waits in a broadcast while the other ranks wait in an ``all_to_all``: every rank hangs
for the whole collective timeout (observed: 3 of 6 trials on Cora with 2 processes).  SLURM's
requeue handler likewise saves a checkpoint, with collectives, from inside the handler.

:class:`DeferredSignals` replaces those handlers while a Trainer runs: the handler only
records the signal (and forwards it to the processes Lightning launched, as Lightning does).
At the start of every step, where all ranks are at the same point, one all-reduce tells every
rank whether any rank was signalled; then all ranks run the requeue handler together (it
saves the checkpoint), or all stop with Lightning's ``SIGTERMException``.  A second SIGTERM
to a rank that is still busy ends that process at once.

A Python signal handler runs only when the main thread executes Python code.  A rank blocked
in a collective (a peer is stuck, or ordered its collectives differently) never runs it, so
SIGTERM alone, however often sent, would not stop it.  :class:`DeferredSignals` therefore runs
a :class:`~lightning_fullgraph.stop_watchdog.StopWatchdog` from start-up on: if the process has
not stopped :data:`~lightning_fullgraph.stop_watchdog.STOP_GRACE_SECONDS` after the first
SIGTERM (or Ctrl-C), or a second one arrives, it forwards the signal to the processes Lightning
launched and ends the process; its peers then see a closed connection and stop with a
:class:`~lightning_fullgraph.engine.CollectiveError` at once.
"""
import logging
import os
import signal
import threading
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from .. import compat
from ..engine.errors import guarded
from ..stop_watchdog import STOP_GRACE_SECONDS, StopWatchdog

__all__ = ["DeferredSignals", "StopWatchdog", "STOP_GRACE_SECONDS"]

log = logging.getLogger(__name__)

_STOP, _REQUEUE = 0, 1
_MARK = "_lightning_fullgraph_signals"

class DeferredSignals:
    r"""Records termination signals and acts on them at the next step, on every rank.

    Args:
        group (ProcessGroup, optional): Group of the agreement all-reduce (the engine's).
        timeout (float or timedelta, optional): Its timeout, for messages.
    """

    def __init__(self, group: Optional[Any] = None, timeout: Optional[Any] = None,
                 grace: float = STOP_GRACE_SECONDS) -> None:
        self.group = group
        self.timeout = timeout
        self.pending = [False, False]  # [stop, requeue]
        self._installed: Dict[int, Any] = {}
        self._trainer = None
        self._forwarded = False
        self._lock = threading.Lock()
        self.watchdog = StopWatchdog(grace, on_signal=self._forward)

    def watch(self, trainer: Any = None) -> None:
        r"""Starts the :class:`StopWatchdog` (from start-up on: a rank blocked in the
        rendezvous or in the wait for rank 0's partitioning must stop on SIGTERM too)."""
        if trainer is not None:
            self._trainer = trainer
        self.watchdog.start()

    def unwatch(self) -> None:
        r"""Stops the watchdog: the run has stopped (teardown), after a signal or not."""
        self.watchdog.stop()

    # -- handlers ------------------------------------------------------------------------
    def install(self, trainer: Any) -> None:
        r"""Takes over SIGTERM (and the SLURM requeue signal) from Lightning's handlers.

        Called after Lightning registered its own (they are restored by Lightning's
        teardown); a no-op outside the main thread, where signals cannot be handled.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        self._trainer = trainer
        connector = compat.signal_connector(trainer)
        lightning_own = {connector._sigterm_notifier_fn, connector._sigterm_handler_fn,
                         connector._slurm_sigusr_handler_fn}
        for signum, kind in self._signals(trainer).items():
            current = signal.getsignal(signum)
            if getattr(current, _MARK, None) is self:
                continue  # already ours
            # Keep handlers that are not Lightning's own (a user's, composed by Lightning).
            others = [h for h in getattr(current, "signal_handlers", [current])
                      if callable(h) and h not in lightning_own]
            self._installed[signum] = current
            signal.signal(signum, self._handler(kind, others))

    @staticmethod
    def _signals(trainer: Any) -> Dict[int, int]:
        found = {signal.SIGTERM: _STOP}
        environment = getattr(trainer.strategy, "cluster_environment", None)
        requeue = getattr(environment, "requeue_signal", None)
        if requeue is not None and getattr(environment, "auto_requeue", False):
            found[requeue] = _REQUEUE
        return found

    def _handler(self, kind: int, others: List[Any]):
        def handle(signum, frame):
            if kind == _STOP and self.pending[_STOP]:
                # Second SIGTERM while the first is still pending: stop now.
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self.pending[kind] = True
            log.info("rank %s received signal %s; all ranks act on it at the next step",
                     os.environ.get("RANK", "?"), signum)
            self._forward(signum)
            for other in others:
                other(signum, frame)
        setattr(handle, _MARK, self)  # marks the handler as ours (see install)
        return handle

    def _forward(self, signum: int) -> None:
        # As Lightning does: the launching process passes the signal to the ones it started,
        # once (the handler and the watchdog both see the first signal; a second SIGTERM
        # would end a child at once instead of at its next step).
        with self._lock:
            if self._forwarded or self._trainer is None:
                return
            launcher = getattr(self._trainer.strategy, "launcher", None)
            if launcher is None or not getattr(launcher, "procs", None):
                return
            self._forwarded = True
        launcher.kill(signum)

    # -- agreement -----------------------------------------------------------------------
    def sync(self, trainer: Any) -> int:
        r"""Called by every rank at the start of each step: acts on any rank's signal.

        Returns:
            int: The collectives it ran (``1``, or ``0`` for one process).

        Raises:
            SIGTERMException: on every rank, if any rank received SIGTERM.
        """
        flags = torch.tensor([int(self.pending[_STOP]), int(self.pending[_REQUEUE])],
                             dtype=torch.int32)
        ran = 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            rank, world = dist.get_rank(self.group), dist.get_world_size(self.group)
            with guarded("signal agreement all-reduce (start of a step)", rank,
                         (r for r in range(world) if r != rank), self.timeout):
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
            ran = 1
        stop, requeue = (bool(v) for v in flags.tolist())
        connector = compat.signal_connector(trainer)
        if requeue:
            self.pending[_REQUEUE] = False
            # Lightning's own requeue handler, now on all ranks at the same point: it
            # saves the HPC checkpoint (collectives) and rank 0 requeues the job.
            environment = trainer.strategy.cluster_environment
            connector._slurm_sigusr_handler_fn(environment.requeue_signal, None)
        if stop:
            from lightning.pytorch.utilities.exceptions import SIGTERMException
            connector.received_sigterm = True
            raise SIGTERMException()
        return ran
