r"""Time-adaptive bit width of quantized halo exchanges (SYLVIE, ICDE'24, §V-A, Eq. 5).

SYLVIE starts training at the smallest bit width and lets the *loss descent rate* decide when
to change it: while the smoothed loss keeps falling at least as fast as it did :math:`\delta`
epochs ago, the current width suffices and is halved; once the descent slows down (training
is converging, or quantization noise holds it back), the width is doubled.

With :math:`L_t` the global training loss of epoch :math:`t` (the single-process loss: every
rank's term of the global mean, summed over ranks) and :math:`e_t` the epoch's training time:

.. math::

    F_0 = L_0, \qquad F_t = \lambda F_{t-1} + (1 - \lambda) L_t, \qquad
    \mathrm{LDR}_t = \frac{F_{t-1} - F_t}{e_t} \quad (t \ge 1)

    b_{t+1} = \begin{cases}
        \mathrm{up}(b_t) & t > \delta \text{ and } \mathrm{LDR}_t < \mathrm{LDR}_{t-\delta} \\
        \mathrm{down}(b_t) & t > \delta \text{ and } \mathrm{LDR}_t \ge \mathrm{LDR}_{t-\delta} \\
        b_t & \text{otherwise}
    \end{cases}

where :math:`\mathrm{up}`/:math:`\mathrm{down}` move one step within the allowed widths
(:math:`\times 2` / :math:`\div 2` for ``(1, 2, 4, 8)``), saturating at the ends.

Choices where the paper is silent or self-contradictory (see the design spec, §B1 and §B4):

* **Sign of LDR** (B4.1): the paper prints :math:`(F_t - F_{t-1})/e_t`, negative while the loss
  falls, which would make "LDR did not drop" mean "the descent slowed".  The text's intent
  (descent holds → fewer bits) needs a positive descent rate, so it is
  :math:`(F_{t-1} - F_t)/e_t` here.
* **One comparison** with the value :math:`\delta` epochs back (B4.3), as Eq. 5 prints it.
* **Every rank takes the same decision** (spec §0.4): a rank that chose another width would
  send wire rows of another size and the next collective would hang or corrupt data.  The
  loss terms and epoch times of all ranks are all-gathered once per training step and summed
  (loss) / maxed (time) locally in rank order, so every rank computes the decision from the
  same bits, whatever the collective's reduction order.
* **Time** (B4.2): the epoch time is the maximum over ranks; ``ldr_time="epochs"`` uses
  :math:`e_t = 1`, which makes the schedule deterministic (tests, reproducible runs).
* :math:`b_0`: the paper starts at :math:`b_{min}` (Eq. 5's :math:`t = 0` case); ``initial_bits``
  may start elsewhere.  No hysteresis by default, as in the paper (B4.4): ``patience`` (the
  condition must hold that many consecutive epochs) and ``cooldown`` (epochs held after a change)
  are opt-in; ``min_epochs`` holds the width through a warm-up.
* A non-finite global loss changes nothing (and is not smoothed in).

The width reaches the codecs through :func:`apply_bit_width`, which sets ``bits`` on every codec
of the engine's :class:`~lightning_fullgraph.engine.ExchangePolicy` that has one (duck-typed:
any codec with a ``bits`` attribute, e.g. a quantized codec).
"""
import math
import time
import warnings
from typing import Any, Dict, Iterable, List, Optional, Sequence

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from .communication import CommunicationMonitor

__all__ = ["BitWidthController", "AdaptiveBitWidth", "apply_bit_width", "exchange_codecs"]

# Reduced over ranks here already (see _gather_global); Lightning's advice to add
# sync_dist=True would only repeat the collective.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('comm/")

_LDR_TIME = ("seconds", "epochs")


class BitWidthController:
    r"""SYLVIE's time-adaptive base bit width (Eq. 5), without Lightning.

    Feed it the *global* training loss of each epoch (the same value on every rank, e.g. from
    :meth:`reduce`) with :meth:`update`; :attr:`bits` is then the width of the next epoch.

    Args:
        widths (Sequence[int]): Allowed bit widths (default ``(1, 2, 4, 8)``); "halve" and
            "double" move one step in this sorted set.
        initial_bits (int, optional): Width of epoch 0 (default: the smallest, as in the paper).
        smoothing (float): :math:`\lambda` of the running loss :math:`F_t` (paper: 0.9).
        delta (int): :math:`\delta`, how many epochs back the descent rate is compared
            (paper: 5 for quality, 20 for speed).
        patience (int): Consecutive epochs the same verdict ("raise" or "lower") must hold
            before the width moves (1: Eq. 5 as printed).
        cooldown (int): Epochs the width is held after each change (0: Eq. 5 as printed).
        min_epochs (int): No change before this many epochs have been seen (warm-up).
        ldr_time (str): ``"seconds"`` (LDR per second of epoch time, the paper) or
            ``"epochs"`` (per epoch: deterministic).
    """

    def __init__(self, widths: Sequence[int] = (1, 2, 4, 8), initial_bits: Optional[int] = None,
                 smoothing: float = 0.9, delta: int = 5, patience: int = 1, cooldown: int = 0,
                 min_epochs: int = 0, ldr_time: str = "seconds") -> None:
        widths = sorted({int(w) for w in widths})
        if not widths or widths[0] < 1:
            raise ValueError(f"widths must be positive integers, got {widths!r}")
        if initial_bits is not None and int(initial_bits) not in widths:
            raise ValueError(f"initial_bits={initial_bits} is not one of widths {widths}")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if delta < 1 or patience < 1 or cooldown < 0 or min_epochs < 0:
            raise ValueError("need delta >= 1, patience >= 1, cooldown >= 0, min_epochs >= 0")
        if ldr_time not in _LDR_TIME:
            raise ValueError(f"ldr_time must be one of {_LDR_TIME}, got {ldr_time!r}")
        self.widths = tuple(widths)
        self.initial_bits = widths[0] if initial_bits is None else int(initial_bits)
        self.smoothing = float(smoothing)
        self.delta = int(delta)
        self.patience = int(patience)
        self.cooldown = int(cooldown)
        self.min_epochs = int(min_epochs)
        self.ldr_time = ldr_time
        self.reset()

    def reset(self) -> None:
        r"""Back to epoch 0 at :attr:`initial_bits`."""
        self.bits = self.initial_bits
        self.epoch = 0                     # epochs seen (t of the next update)
        self.smoothed: Optional[float] = None  # F_{t-1}
        self.ldr: List[float] = []         # LDR_1 .. LDR_t, the last delta + 1 kept
        self.streak = 0                    # consecutive epochs of the same verdict (signed)
        self.hold = 0                      # cooldown epochs left
        #: One entry per :meth:`update`: epoch, bits used, loss, smoothed loss, LDR, next bits.
        self.history: List[Dict[str, Any]] = []

    # -- one epoch ---------------------------------------------------------------------------
    def update(self, loss: float, seconds: float = 1.0) -> int:
        r"""Takes epoch :math:`t`'s global loss and returns the width of epoch :math:`t+1`.

        Args:
            loss (float): The global training loss of the epoch (identical on every rank).
            seconds (float): The epoch's training time (identical on every rank: the maximum
                over ranks); ignored with ``ldr_time="epochs"``.

        Returns:
            The new :attr:`bits`.
        """
        loss = float(loss)
        t, used = self.epoch, self.bits
        ldr = None
        if math.isfinite(loss):
            if self.smoothed is None:
                smoothed = loss  # F_0 = L_0 (the spec's choice; the paper leaves F_{-1} open)
            else:
                smoothed = self.smoothing * self.smoothed + (1.0 - self.smoothing) * loss
                elapsed = 1.0 if self.ldr_time == "epochs" else max(float(seconds), 1e-12)
                ldr = (self.smoothed - smoothed) / elapsed  # positive while the loss falls
                self.ldr = (self.ldr + [ldr])[-(self.delta + 1):]
            self.smoothed = smoothed
            self._decide(t, ldr)
        self.history.append(dict(epoch=t, bits=used, loss=loss, smoothed=self.smoothed, ldr=ldr,
                                 next_bits=self.bits))
        self.epoch = t + 1
        return self.bits

    def _decide(self, t: int, ldr: Optional[float]) -> None:
        # LDR_t and LDR_{t-delta} both exist once t > delta (LDR starts at t = 1).
        if ldr is None or t <= self.delta or len(self.ldr) <= self.delta:
            return
        if self.hold > 0:
            self.hold -= 1
            return
        verdict = -1 if ldr >= self.ldr[-1 - self.delta] else 1  # -1: lower, +1: raise
        self.streak = self.streak + verdict if self.streak * verdict > 0 else verdict
        if t < self.min_epochs or abs(self.streak) < self.patience:
            return
        index = self.widths.index(self.bits) + verdict
        if 0 <= index < len(self.widths):
            self.bits = self.widths[index]
            self.hold = self.cooldown
        self.streak = 0

    # -- the same decision on every rank -------------------------------------------------------
    @staticmethod
    def reduce(loss_term: float, seconds: float = 0.0, group: Optional[Any] = None):
        r"""``(sum of loss_term, max of seconds)`` over the ranks of :obj:`group`.

        All ranks' values are all-gathered and combined locally in rank order, so every rank
        gets the same floats bit for bit (an all-reduce only promises that up to its
        reduction order).  Without an initialized process group the values come back as they
        are.  A collective: every rank must call it.

        Args:
            loss_term (float): This rank's term of the global loss (its share-weighted loss).
            seconds (float): This rank's time.
            group (ProcessGroup, optional): The ranks (default: the world).
        """
        if not (dist.is_available() and dist.is_initialized()) \
                or dist.get_world_size(group) == 1:
            return float(loss_term), float(seconds)
        mine = torch.tensor([float(loss_term), float(seconds)], dtype=torch.float64)
        backend = dist.get_backend(group)
        if backend == "nccl":
            mine = mine.cuda()
        gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, mine, group=group)
        rows = torch.stack(gathered).cpu().tolist()
        total = 0.0
        for value, _ in rows:  # rank order: identical on every rank
            total += value
        return total, max(s for _, s in rows)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        r"""Everything :meth:`update` depends on (plain Python values)."""
        return dict(bits=self.bits, epoch=self.epoch, smoothed=self.smoothed, ldr=list(self.ldr),
                    streak=self.streak, hold=self.hold,
                    history=[dict(h) for h in self.history],
                    config=dict(widths=list(self.widths), smoothing=self.smoothing,
                                delta=self.delta, ldr_time=self.ldr_time))

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        r"""Restores :meth:`state_dict`; the next :meth:`update` continues the schedule."""
        bits = int(state["bits"])
        if bits not in self.widths:
            raise ValueError(f"saved width {bits} is not one of widths {self.widths}")
        config = state.get("config", {})
        if config and (tuple(config.get("widths", self.widths)) != self.widths
                       or config.get("delta", self.delta) != self.delta):
            warnings.warn(f"resuming a bit-width schedule saved with {config} under "
                          f"widths={self.widths}, delta={self.delta}: it continues from the "
                          "saved state with the new settings", RuntimeWarning, stacklevel=2)
        self.bits = bits
        self.epoch = int(state["epoch"])
        self.smoothed = None if state["smoothed"] is None else float(state["smoothed"])
        self.ldr = [float(v) for v in state["ldr"]][-(self.delta + 1):]
        self.streak = int(state["streak"])
        self.hold = int(state["hold"])
        self.history = [dict(h) for h in state.get("history", [])]


# -- reaching the codecs -----------------------------------------------------------------------
def _policy_codecs(policy: Any) -> Iterable[Any]:
    # A public iterator on ExchangePolicy would replace this read of its private `_codecs`.
    public = getattr(policy, "codecs", None)
    if public is not None:
        yield from (public() if callable(public) else public)
        return
    yield from (c for c in getattr(policy, "_codecs", {}).values() if c is not None)
    for rule in getattr(policy, "points", {}).values():
        yield from _policy_codecs(rule)


def exchange_codecs(target: Any) -> List[Any]:
    r"""The distinct codecs :obj:`target` can send rows with.

    Args:
        target: A :class:`~lightning_fullgraph.engine.FullGraphEngine` (or anything with a
            ``policy``, e.g. a :class:`~lightning_fullgraph.engine.HaloExchange`), a strategy
            with an ``engine``, an :class:`~lightning_fullgraph.engine.ExchangePolicy`, a codec
            or an iterable of those.
    """
    if target is None:
        return []
    if hasattr(target, "engine") and not hasattr(target, "policy"):
        return exchange_codecs(target.engine)
    if hasattr(target, "policy"):
        return exchange_codecs(target.policy)
    if hasattr(target, "_codecs") or hasattr(target, "points"):
        codecs = list(_policy_codecs(target))
    elif hasattr(target, "encode") and hasattr(target, "decode"):
        codecs = [target]
    elif isinstance(target, Iterable):
        codecs = [c for item in target for c in exchange_codecs(item)]
    else:
        raise TypeError(f"cannot find exchange codecs in {type(target).__name__}")
    unique = {id(c): c for c in codecs}  # one codec may serve both directions and many points
    return list(unique.values())


def apply_bit_width(target: Any, bits: int) -> int:
    r"""Sets ``bits`` on every codec of :obj:`target` that has a ``bits`` attribute.

    Every rank must apply the same width before the next exchange: encoder and decoder derive
    the wire format from it.

    Args:
        target: An engine, a strategy with an ``engine``, an exchange policy, a codec or an
            iterable of those (see :func:`exchange_codecs`).
        bits (int): The width.

    Returns:
        How many codecs were set (0: no codec of :obj:`target` has a bit width).
    """
    bits = int(bits)
    if bits < 1:
        raise ValueError(f"bits must be positive, got {bits}")
    count = 0
    for codec in exchange_codecs(target):
        if hasattr(codec, "bits"):
            codec.bits = bits
            count += 1
    return count


# -- Lightning ---------------------------------------------------------------------------------
def _loss_of(outputs: Any) -> Optional[float]:
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        return float(outputs.detach())
    if isinstance(outputs, (int, float)):
        return float(outputs)
    return None


class AdaptiveBitWidth(Callback):
    r"""Changes the bit width of quantized halo exchanges epoch by epoch (SYLVIE, Eq. 5).

    After each training step the rank's loss term (the loss ``training_step`` returned, weighted
    by the rank's share of the loss mask as :class:`~lightning_fullgraph.FullGraphStrategy`
    weights it, so the sum over ranks is the single-process loss) and step time are gathered
    from all ranks; at the start of the next epoch the :class:`BitWidthController` turns the
    epoch's global loss and time into the next width, identical on every rank, and
    :func:`apply_bit_width` sets it on the engine's codecs.  Deciding at the start of the next
    epoch rather than at the end of this one keeps a checkpoint saved anywhere after the
    epoch's steps (e.g. at the end of validation, before ``on_train_epoch_end``) complete: the
    saved state holds the epoch's reduced loss, and a resumed run takes the decision the
    uninterrupted run takes.

    Logged every epoch: ``comm/bits`` (the width of the epoch), and the figures that width was
    decided on, those of the epoch before: ``comm/loss_smoothed`` (:math:`F_{t-1}`) and
    ``comm/loss_descent_rate`` (:math:`\mathrm{LDR}_{t-1}`, once defined).  The decisions
    themselves are in ``controller.history``.

    Args:
        widths, initial_bits, smoothing, delta, patience, cooldown, min_epochs, ldr_time:
            See :class:`BitWidthController`.
        target: Where the width goes (see :func:`apply_bit_width`; default: the strategy's
            engine).
        log (bool): Log the figures above.
        prog_bar (bool): Show ``comm/bits`` in the progress bar.
    """

    def __init__(self, widths: Sequence[int] = (1, 2, 4, 8), initial_bits: Optional[int] = None,
                 smoothing: float = 0.9, delta: int = 5, patience: int = 1, cooldown: int = 0,
                 min_epochs: int = 0, ldr_time: str = "seconds", target: Any = None,
                 log: bool = True, prog_bar: bool = False) -> None:
        self.controller = BitWidthController(widths, initial_bits, smoothing, delta, patience,
                                             cooldown, min_epochs, ldr_time)
        self.target = target
        self.log = log
        self.prog_bar = prog_bar
        # The reduced figures of the epoch not yet decided on (identical on every rank).
        self._pending: Optional[Dict[str, Any]] = None
        self._step_start: Optional[float] = None
        self._warned = False

    @property
    def bits(self) -> int:
        r"""The width in use (the current epoch's)."""
        return self.controller.bits

    # -- where the width goes, and from whom the loss comes ------------------------------------
    def _target(self, trainer: "pl.Trainer") -> Any:
        return self.target if self.target is not None else getattr(trainer.strategy, "engine",
                                                                   None)

    @staticmethod
    def _group(trainer: "pl.Trainer") -> Optional[Any]:
        engine = getattr(trainer.strategy, "engine", None)
        return getattr(engine, "group", None)

    @staticmethod
    def _weight(trainer: "pl.Trainer") -> float:
        r"""This rank's weight in the global loss."""
        strategy = trainer.strategy
        engine = getattr(strategy, "engine", None)
        if engine is not None:
            # FullGraphStrategy: a "mean" loss is weighted by the rank's mask share; a "sum"
            # loss is already the rank's term.
            if getattr(strategy, "loss_reduction", "mean") == "mean":
                return float(engine.loss_weight())
            return 1.0
        # Data-parallel strategies: ranks see batches of the same size, the mean is global.
        return 1.0 / max(1, trainer.world_size)

    def _apply(self, trainer: "pl.Trainer") -> None:
        target = self._target(trainer)
        if apply_bit_width(target, self.controller.bits) == 0 and not self._warned:
            self._warned = True
            warnings.warn("AdaptiveBitWidth: no exchange codec has a `bits` attribute (use a "
                          "quantized codec); the schedule is computed and logged but changes "
                          "nothing", RuntimeWarning, stacklevel=2)

    # -- hooks ---------------------------------------------------------------------------------
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._apply(trainer)  # before the first exchange (sanity validation included)

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        pending = self._pending
        if pending is not None and pending["epoch"] < trainer.current_epoch:
            # Epoch `pending["epoch"]` is over: decide the width of this one.
            loss = pending["loss"] / max(1, pending["steps"])
            self.controller.update(loss, pending["seconds"])
            self._pending = None
        self._apply(trainer)

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                             batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()

    def on_train_batch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule",
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        seconds = time.perf_counter() - self._step_start if self._step_start is not None else 0.0
        loss = _loss_of(outputs)
        weight = self._weight(trainer)
        # A rank without loss nodes returns NaN (a mean over nothing) with weight 0.
        term = 0.0 if loss is None or weight == 0.0 else loss * weight
        # Every rank calls the collective, also one whose step returned nothing.
        total, slowest = BitWidthController.reduce(term, seconds, self._group(trainer))
        pending = self._pending
        if pending is None or pending["epoch"] != trainer.current_epoch:
            pending = self._pending = dict(epoch=trainer.current_epoch, loss=0.0, seconds=0.0,
                                           steps=0)
        pending["loss"] += total
        pending["seconds"] += slowest
        pending["steps"] += 1

    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not self.log:
            return
        metrics = {"comm/bits": float(self.controller.bits)}
        if any(isinstance(c, CommunicationMonitor) for c in trainer.callbacks):
            # The monitor logs the engine's wire width under the same name (the width this
            # callback set): Lightning refuses one name logged twice in a hook.
            del metrics["comm/bits"]
        if self.controller.smoothed is not None:
            metrics["comm/loss_smoothed"] = float(self.controller.smoothed)
        if self.controller.ldr:
            metrics["comm/loss_descent_rate"] = float(self.controller.ldr[-1])
        for name, value in metrics.items():
            pl_module.log(name, value, prog_bar=self.prog_bar and name == "comm/bits",
                          on_epoch=True, on_step=False, sync_dist=False, rank_zero_only=False)

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return dict(controller=self.controller.state_dict(),
                    pending=None if self._pending is None else dict(self._pending))

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.controller.load_state_dict(state_dict["controller"])
        pending = state_dict.get("pending")
        self._pending = None if pending is None else dict(pending)
