r"""The threshold schedule of the adaptive halo cache (CDFGNN, Eqs. 6–7).

Once per epoch, from the global training accuracy :math:`a_t` and its running mean
:math:`\bar a` (initialised to :math:`a_0`, compared *before* it is updated):

.. math::

    \epsilon \leftarrow \begin{cases}
        \min(\lambda_1 \epsilon,\ \epsilon + \xi,\ \nu_1) & a_t > \bar a + \mu_2 \text{ and }
            \epsilon < \nu_1 \quad\text{(a clear gain: relax the cache)} \\
        \max(\lambda_2 \epsilon,\ \epsilon - \xi,\ \nu_2) & a_t < \bar a - \mu_1 \text{ and }
            \epsilon > \nu_2 \quad\text{(any drop: tighten it)} \\
        \epsilon & \text{otherwise}
    \end{cases}
    \qquad \bar a \leftarrow 0.8\, \bar a + 0.2\, a_t

Choices where the paper contradicts itself (design spec §C1, §C4.1–2): Eq. 6 as printed raises
:math:`\epsilon` after an accuracy *drop*, against the prose, the guards (:math:`\nu_1` caps an
increase, :math:`\nu_2` floors a decrease) and Fig. 7, so the rule above follows the prose;
:math:`\xi` is given as 0.01 and 0.02 (0.01 here, exposed); :math:`\epsilon_0` is unstated
(0.01).  The defaults are the paper's: :math:`\mu_1 = 0.001`, :math:`\mu_2 = 0.02`,
:math:`\nu_1 = 0.3`, :math:`\nu_2 = 0.001`, :math:`\lambda_1 = 1.05`, :math:`\lambda_2 = 0.9`.

Every rank takes the same decision: the accuracy is each rank's value weighted by its share of
the training nodes, all-gathered and summed in rank order (identical floats everywhere).  A
different :math:`\epsilon` would not hang the exchange (the receivers learn which rows come
from a bitmask), but it would make ranks train under different rules.
"""
import warnings
from typing import Any, Dict, List, Optional

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from .adaptive_bits import BitWidthController

__all__ = ["CacheThresholdController", "AdaptiveCacheThreshold"]


class CacheThresholdController:
    r"""CDFGNN's :math:`\epsilon` schedule without Lightning: feed :meth:`update` the global
    training accuracy of each epoch; :attr:`epsilon` is then the next epoch's threshold.

    Args:
        epsilon (float): :math:`\epsilon_0`.
        mu1 (float): Accuracy drop below the running mean that tightens the cache.
        mu2 (float): Accuracy gain above the running mean that relaxes it.
        nu1 (float): Upper bound of :math:`\epsilon`.
        nu2 (float): Lower bound of :math:`\epsilon`.
        xi (float): Largest change of :math:`\epsilon` in one epoch.
        lambda1 (float): Growth factor (> 1).
        lambda2 (float): Shrink factor (< 1).
        smoothing (float): Weight of the old mean in the running mean (0.8).
    """

    def __init__(self, epsilon: float = 0.01, mu1: float = 0.001, mu2: float = 0.02,
                 nu1: float = 0.3, nu2: float = 0.001, xi: float = 0.01, lambda1: float = 1.05,
                 lambda2: float = 0.9, smoothing: float = 0.8) -> None:
        if not 0 <= nu2 <= nu1:
            raise ValueError(f"need 0 <= nu2 <= nu1, got nu2={nu2}, nu1={nu1}")
        if not nu2 <= epsilon <= nu1:
            raise ValueError(f"epsilon={epsilon} must lie within [nu2, nu1] = [{nu2}, {nu1}]")
        if lambda1 < 1 or not 0 < lambda2 <= 1 or xi < 0 or mu1 < 0 or mu2 < 0:
            raise ValueError("need lambda1 >= 1, 0 < lambda2 <= 1, and xi, mu1, mu2 >= 0")
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.initial = float(epsilon)
        self.mu1, self.mu2, self.nu1, self.nu2 = float(mu1), float(mu2), float(nu1), float(nu2)
        self.xi, self.lambda1, self.lambda2 = float(xi), float(lambda1), float(lambda2)
        self.smoothing = float(smoothing)
        self.reset()

    def reset(self) -> None:
        self.epsilon = self.initial
        self.mean: Optional[float] = None
        #: One entry per :meth:`update`: epoch, accuracy, mean before, epsilon used, next.
        self.history: List[Dict[str, Any]] = []

    def update(self, accuracy: float) -> float:
        r"""Takes an epoch's global training accuracy; returns the next :attr:`epsilon`."""
        acc = float(accuracy)
        used = self.epsilon
        if acc != acc:  # NaN: nothing learned about the trend
            self.history.append(dict(epoch=len(self.history), accuracy=acc, mean=self.mean,
                                     epsilon=used, next=used))
            return used
        mean = acc if self.mean is None else self.mean
        eps = used
        if acc > mean + self.mu2 and eps < self.nu1:
            eps = min(self.lambda1 * eps, eps + self.xi, self.nu1)
        elif acc < mean - self.mu1 and eps > self.nu2:
            eps = max(self.lambda2 * eps, eps - self.xi, self.nu2)
        self.history.append(dict(epoch=len(self.history), accuracy=acc, mean=mean, epsilon=used,
                                 next=eps))
        self.mean = self.smoothing * mean + (1 - self.smoothing) * acc
        self.epsilon = eps
        return eps

    def state_dict(self) -> Dict[str, Any]:
        return dict(epsilon=self.epsilon, mean=self.mean, history=[dict(h) for h in self.history])

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.epsilon = float(state["epsilon"])
        self.mean = None if state["mean"] is None else float(state["mean"])
        self.history = [dict(h) for h in state.get("history", [])]


def halo_caches(target: Any) -> List[Any]:
    r"""The :class:`~lightning_fullgraph.engine.HaloCache` objects of an engine (or policy)."""
    policy = getattr(target, "policy", target)
    return list(policy.caches()) if hasattr(policy, "caches") else []


class AdaptiveCacheThreshold(Callback):
    r"""Adapts the halo cache's threshold :math:`\epsilon` every epoch from the global
    training accuracy (CDFGNN; the rule in :mod:`this module's <.cache_threshold>` docstring).

    Use with ``FullGraphStrategy(exchange=ExchangeConfig(cache="adaptive"))`` (or any
    cache): it sets ``epsilon`` on every :class:`~lightning_fullgraph.engine.HaloCache` of the strategy's engine before each
    training epoch.  Logged every epoch: ``cache/epsilon`` (the epoch's threshold) and, from
    the second epoch on, ``cache/train_acc`` (the global accuracy of the previous epoch, which it
    was decided on); the fraction of rows the cache
    served is ``comm/rows_skipped_frac`` of
    :class:`~lightning_fullgraph.callbacks.CommunicationMonitor`.  Its state (threshold, running
    mean, history) is saved in checkpoints, so a resumed run continues the same schedule.

    Each rank reads its accuracy when a training epoch ends; the ranks combine them when the
    next one starts, when a checkpoint is saved (:meth:`state_dict`, which every rank calls) or
    when training ends, never in ``on_train_epoch_end`` itself: there Lightning's progress bar
    synchronizes epoch metrics on rank 0 alone, and a collective of the other ranks would wait
    for it forever.  A checkpoint holds the decided threshold, so a run resumed from an epoch's
    end decides as the uninterrupted one.

    Args:
        monitor (str): The logged training accuracy (each rank's own, or already global: both
            are combined correctly), default ``"train_acc"``.
        epsilon, mu1, mu2, nu1, nu2, xi, lambda1, lambda2, smoothing: See
            :class:`CacheThresholdController`.
        target: Where the threshold goes (default: the strategy's engine).
        log (bool): Log the figures above.
    """

    def __init__(self, monitor: str = "train_acc", epsilon: float = 0.01, mu1: float = 0.001,
                 mu2: float = 0.02, nu1: float = 0.3, nu2: float = 0.001, xi: float = 0.01,
                 lambda1: float = 1.05, lambda2: float = 0.9, smoothing: float = 0.8,
                 target: Any = None, log: bool = True) -> None:
        self.controller = CacheThresholdController(epsilon, mu1, mu2, nu1, nu2, xi, lambda1,
                                                   lambda2, smoothing)
        self.monitor = monitor
        self.target = target
        self.log = log
        self._warned = set()
        self._last_accuracy: Optional[float] = None
        # This rank's share-weighted accuracy of an epoch that ended, not yet combined.
        self._pending: Optional[Dict[str, float]] = None
        # A combined accuracy not logged yet (logged when the next epoch starts).
        self._unlogged: Optional[float] = None
        self._trainer: Optional[Any] = None

    @property
    def epsilon(self) -> float:
        return self.controller.epsilon

    def _engine(self, trainer: "pl.Trainer") -> Any:
        return self.target if self.target is not None else getattr(trainer.strategy, "engine",
                                                                   None)

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"AdaptiveCacheThreshold: {message}", RuntimeWarning, stacklevel=3)

    def _apply(self, trainer: "pl.Trainer") -> None:
        caches = halo_caches(self._engine(trainer))
        if not caches:
            self._warn_once("cache", "the engine has no halo cache (use FullGraphStrategy("
                                     "exchange=ExchangeConfig(cache='adaptive'))); the "
                                     "threshold changes nothing")
        for cache in caches:
            cache.epsilon = self.controller.epsilon

    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._trainer = trainer  # state_dict() decides a pending epoch on the engine's group

    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._apply(trainer)

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._decide(trainer)
        self._apply(trainer)
        total, self._unlogged = self._unlogged, None
        if self.log:
            pl_module.log("cache/epsilon", float(self.controller.epsilon), on_epoch=True,
                          on_step=False, sync_dist=False, rank_zero_only=False, batch_size=1)
            if total is not None:
                pl_module.log("cache/train_acc", float(total), on_epoch=True, on_step=False,
                              sync_dist=False, rank_zero_only=False, batch_size=1)

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # No collective here (see the class docstring): this rank's value only.
        value = trainer.callback_metrics.get(self.monitor)
        engine = getattr(trainer.strategy, "engine", None)
        # The rank's share of the training nodes (the accuracy a rank logs is its own); a
        # data-parallel run without an engine sees equal shares.
        if engine is not None and hasattr(engine, "loss_weight"):
            weight = float(engine.loss_weight())
        else:
            weight = 1.0 / max(1, trainer.world_size)
        local = float("nan") if value is None else float(value) * weight
        self._pending = dict(epoch=float(trainer.current_epoch),
                             value=0.0 if weight == 0.0 else local,
                             missing=float(value is None))

    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._decide(trainer)  # the last epoch's, so that the schedule's history is whole

    def _decide(self, trainer: Optional["pl.Trainer"]) -> None:
        r"""Combines the pending epoch's accuracies over ranks and updates the threshold.  A
        collective when an epoch is pending, and every rank has the same pending epoch (each
        records one at every epoch end)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        engine = getattr(getattr(trainer, "strategy", None), "engine", None)
        total, _ = BitWidthController.reduce(pending["value"], 0.0, getattr(engine, "group", None))
        if pending["missing"]:
            self._warn_once("monitor", f"'{self.monitor}' is not logged; the threshold stays "
                                       f"{self.controller.epsilon:g}")
        self.controller.update(total)
        self._last_accuracy = self._unlogged = total

    def state_dict(self) -> Dict[str, Any]:
        r"""The schedule, with the epoch that just ended decided first (a collective when one
        is pending: Lightning calls it on every rank when it saves a checkpoint, and writes
        rank 0's, so nothing rank-local may stay undecided in it)."""
        self._decide(self._trainer)
        return dict(controller=self.controller.state_dict(), unlogged=self._unlogged)

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict["controller"])
        self._pending, self._unlogged = None, state_dict.get("unlogged")
