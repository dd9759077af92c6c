r"""SYLVIE's pipeline adaptor (ICDE'24, §V-B): synchronous or asynchronous epochs from the
loss-descent rate.

Training starts synchronous.  After epoch :math:`t`, with the smoothed global loss
:math:`F_t = \lambda F_{t-1} + (1 - \lambda) L_t` and the descent rate
:math:`\mathrm{LDR}_t = (F_{t-1} - F_t) / e_t` (exactly as
:class:`~.adaptive_bits.AdaptiveBitWidth` computes them, the sign as the design spec §B4.1
fixes it):

.. math::

    \mathrm{mode}_{t+1} = \begin{cases}
        \text{sync} & t > \delta \text{ and } \mathrm{LDR}_t < \mathrm{LDR}_{t-\delta}
            \quad\text{(the descent slowed: fresh rows)} \\
        \text{async} & \text{otherwise}
    \end{cases}

The staleness of an asynchronous run is bounded by the pipeline itself
(:class:`~lightning_fullgraph.engine.AsyncPipeline`'s ``max_async_epochs``).  Every rank takes the
same decision from the same all-gathered loss terms and epoch times (the maximum over ranks).
"""
import math
import warnings
from typing import Any, Dict, List, Optional

import lightning.pytorch as pl

from .adaptive_bits import _LDR_TIME, AdaptiveBitWidth
from .communication import CommunicationMonitor

__all__ = ["PipelineController", "PipelineAdaptor"]


class PipelineController:
    r"""The sync/async rule without Lightning: feed :meth:`update` each epoch's global loss.

    Args:
        smoothing (float): :math:`\lambda` (0.9).
        delta (int): :math:`\delta`, how many epochs back the descent rate is compared (5).
        ldr_time (str): ``"seconds"`` (per second of epoch time, the paper) or ``"epochs"``
            (deterministic).
    """

    def __init__(self, smoothing: float = 0.9, delta: int = 5, ldr_time: str = "seconds") -> None:
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if delta < 1:
            raise ValueError(f"delta must be >= 1, got {delta}")
        if ldr_time not in _LDR_TIME:
            raise ValueError(f"ldr_time must be one of {_LDR_TIME}, got {ldr_time!r}")
        self.smoothing, self.delta, self.ldr_time = float(smoothing), int(delta), ldr_time
        self.reset()

    def reset(self) -> None:
        self.mode = "sync"
        self.epoch = 0
        self.smoothed: Optional[float] = None
        self.ldr: List[float] = []
        #: One entry per :meth:`update`: epoch, mode used, loss, smoothed loss, LDR, next mode.
        self.history: List[Dict[str, Any]] = []

    def update(self, loss: float, seconds: float = 1.0) -> str:
        r"""Takes epoch :math:`t`'s global loss (and time); returns the next epoch's mode."""
        loss, t, used, ldr = float(loss), self.epoch, self.mode, None
        if math.isfinite(loss):
            if self.smoothed is None:
                smoothed = loss
            else:
                smoothed = self.smoothing * self.smoothed + (1.0 - self.smoothing) * loss
                elapsed = 1.0 if self.ldr_time == "epochs" else max(float(seconds), 1e-12)
                ldr = (self.smoothed - smoothed) / elapsed
                self.ldr = (self.ldr + [ldr])[-(self.delta + 1):]
            self.smoothed = smoothed
            slowed = ldr is not None and t > self.delta and len(self.ldr) > self.delta \
                and ldr < self.ldr[-1 - self.delta]
            self.mode = "sync" if slowed else "async"
        self.history.append(dict(epoch=t, mode=used, loss=loss, smoothed=self.smoothed, ldr=ldr,
                                 next_mode=self.mode))
        self.epoch = t + 1
        return self.mode

    # The attribute the shared epoch bookkeeping of AdaptiveBitWidth reads and logs.
    @property
    def bits(self) -> str:
        return self.mode

    def state_dict(self) -> Dict[str, Any]:
        return dict(mode=self.mode, epoch=self.epoch, smoothed=self.smoothed, ldr=list(self.ldr),
                    history=[dict(h) for h in self.history])

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.mode, self.epoch = state["mode"], int(state["epoch"])
        self.smoothed = state["smoothed"]
        self.ldr = [float(v) for v in state["ldr"]]
        self.history = [dict(h) for h in state["history"]]


class PipelineAdaptor(AdaptiveBitWidth):
    r"""Switches the asynchronous halo pipeline between synchronous and asynchronous epochs
    (SYLVIE's adaptor; the rule in this module's docstring).

    Use with ``FullGraphStrategy(exchange=ExchangeConfig(pipeline="adaptive"))`` (or any
    :class:`~lightning_fullgraph.engine.AsyncPipeline`): before each training epoch it sets
    the pipeline's ``mode``.  Logged every epoch: ``comm/async`` (1 for an asynchronous
    epoch); the decisions, with the loss and descent rate, are in ``controller.history``.
    Its state is saved in checkpoints, so a resumed run continues the same schedule.

    Args:
        smoothing, delta, ldr_time: See :class:`PipelineController`.
        target: Where the mode goes (default: the strategy's engine).
        log (bool): Log the figures above.
        prog_bar (bool): Show ``comm/async`` in the progress bar.
    """

    def __init__(self, smoothing: float = 0.9, delta: int = 5, ldr_time: str = "seconds",
                 target: Any = None, log: bool = True, prog_bar: bool = False) -> None:
        super().__init__(target=target, log=log, prog_bar=prog_bar)
        self.controller = PipelineController(smoothing, delta, ldr_time)

    @property
    def mode(self) -> str:
        return self.controller.mode

    def _apply(self, trainer: "pl.Trainer") -> None:
        target = self._target(trainer)
        policy = getattr(target, "policy", target)
        pipeline = getattr(policy, "pipeline", None)
        if pipeline is None:
            if not self._warned:
                self._warned = True
                warnings.warn("PipelineAdaptor: the engine has no asynchronous pipeline (use "
                              "FullGraphStrategy(exchange=ExchangeConfig(pipeline='adaptive'))); "
                              "the schedule changes nothing", RuntimeWarning, stacklevel=2)
            return
        pipeline.mode = self.controller.mode

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not self.log or any(isinstance(c, CommunicationMonitor) for c in trainer.callbacks):
            return  # the monitor logs comm/async (Lightning refuses a name logged twice)
        # Only the mode: AdaptiveBitWidth logs the descent rate.
        pl_module.log("comm/async", float(self.controller.mode == "async"),
                      prog_bar=self.prog_bar, on_epoch=True, on_step=False, sync_dist=False,
                      rank_zero_only=False)
