"""Training time and validation metric at every validation: time to a target accuracy."""
import time
from typing import Any, Dict, List, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

__all__ = ["ValidationTrace"]


class ValidationTrace(Callback):
    r"""Records, at every validation of :meth:`~lightning.pytorch.Trainer.fit`, the epoch,
    the seconds spent *training* so far (validation time excluded, so that a run validated
    more often is not charged for it) and the logged :obj:`monitor` metric.

    :meth:`time_to` answers "how long did training take to reach this accuracy", the
    measure used to compare strategies that run epochs of very different cost (a full-graph
    epoch, a few sampled mini-batches, a NeighborLoader epoch).  The metric is read from
    ``trainer.callback_metrics`` after Lightning reduced it over ranks, so every rank records
    the same values.

    Args:
        monitor (str): The logged metric to record. (default: ``"val_acc"``)

    Example::

        trace = ValidationTrace()
        trainer = Trainer(strategy=FullGraphStrategy(), callbacks=[trace])
        trainer.fit(model, datamodule)
        trace.time_to(0.75)     # seconds of training until val_acc >= 0.75, or None
    """

    def __init__(self, monitor: str = "val_acc") -> None:
        self.monitor = monitor
        #: ``[{"epoch": e, "train_s": t, monitor: v}, ...]``, one per validation.
        self.points: List[Dict[str, float]] = []
        self.train_seconds = 0.0
        self._epoch_start: Optional[float] = None

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: Any) -> None:
        self._epoch_start = time.perf_counter()

    def _stop_clock(self) -> None:
        # Validation runs inside the training epoch (before on_train_epoch_end): the clock
        # stops at whichever comes first.
        if self._epoch_start is not None:
            self.train_seconds += time.perf_counter() - self._epoch_start
            self._epoch_start = None

    def on_validation_start(self, trainer: "pl.Trainer", pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._stop_clock()

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: Any) -> None:
        self._stop_clock()

    def on_validation_end(self, trainer: "pl.Trainer", pl_module: Any) -> None:
        # After the evaluation loop reduced and published its epoch metrics.
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is not None:
            self.points.append({"epoch": trainer.current_epoch,
                                "train_s": self.train_seconds,
                                self.monitor: float(value)})

    def time_to(self, target: float) -> Optional[float]:
        r"""Training seconds until the first validation with the metric :math:`\geq` target,
        or ``None`` if it was never reached."""
        for point in self.points:
            if point[self.monitor] >= target:
                return point["train_s"]
        return None

    def best(self) -> Optional[float]:
        r"""The highest recorded value, ``None`` before the first validation."""
        return max((p[self.monitor] for p in self.points), default=None)

    def state_dict(self) -> Dict[str, Any]:
        return {"points": list(self.points), "train_seconds": self.train_seconds}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.points = list(state_dict.get("points", []))
        self.train_seconds = float(state_dict.get("train_seconds", 0.0))
