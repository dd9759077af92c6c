"""Logs what the halo exchange moved and how long it took."""
import time
import warnings
from typing import Any, Dict, List, Optional

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from ..engine.errors import guarded

__all__ = ["CommunicationMonitor"]

# These values are reduced over ranks here already; Lightning's advice to add
# sync_dist=True would only repeat the collective.
warnings.filterwarnings("ignore", message=r"It is recommended to use `self.log\('comm/")


#: The planner's terms of one training step, kept per epoch in :attr:`CommunicationMonitor.history`.
_STEP_TERMS = ("comm/predicted_step_exchange_s", "comm/predicted_step_codec_s",
               "comm/predicted_step_exposed_s", "comm/predicted_step_link_s")


class CommunicationMonitor(Callback):
    r"""Logs halo-exchange bytes and time of every training epoch.

    Logged per epoch (means over ranks, plus ``_max`` over ranks for the bytes):
    ``comm/sent_MB``, ``comm/received_MB``, ``comm/inter_host_sent_MB`` (the part of
    the sent bytes that went to other machines), ``comm/exchange_s`` (seconds inside
    the exchange), ``comm/compute_s`` (rest of the training step), ``comm/step_s``
    (the whole training step: forward, backward, optimizer), ``comm/step_exchange_s`` and
    ``comm/step_compute_s`` (the training steps' own exchange and the rest; ``exchange_s``
    also counts validation's forward exchanges), ``comm/step_compute_s_min`` (the least
    ``step_compute_s`` over ranks: that of the rank that reached the gradient all-reduce
    last; the others' include their wait there for it), ``comm/in_flight_s`` (seconds the rank
    worked between starting an asynchronous exchange and waiting for it: what overlap hides
    the transfers behind), and per layer
    ``comm/layer/<name>_MB``, and ``comm/bits``, the mean bits per feature of the forward rows
    as they were sent, headers aside (32 exact fp32, 16 bfloat16, 1-8 quantized; between for a
    per-node codec such as ``"adaptive"``); with an adaptive halo cache,
    ``comm/rows_skipped_frac``, the share of the rows it could have sent that it skipped (also
    the rows boundary sampling left out), and the same per direction,
    ``comm/rows_skipped_frac_forward`` (halo rows) and ``_backward`` (their gradients); with
    an asynchronous pipeline, ``comm/async``, the share of the epoch's pipelined exchanges that
    ran on one-epoch-stale rows (1 for an asynchronous epoch; 0 for a synchronous one, such as
    the first and each one bounded staleness forces).
    ``comm/sent_MB`` also appears in the progress bar, and ``comm/bits`` too when the codec
    is lossy.

    The figures are reduced over ranks in ``on_train_epoch_end`` (on the engine's process
    group, under the collective timeout).  There Lightning's progress bar computes, and so
    synchronizes, epoch-level metrics on rank 0 alone: a callback with a collective must run
    before it, or rank 0 waits in the metric's collective while the others wait in this one.
    Callbacks passed to the Trainer come before its progress bar; the strategies of this
    library also move every callback of this library there (including the monitor they add).
    The last epoch's figures stay in :attr:`last` and, per rank, in
    :attr:`history` (one dictionary per epoch, with the reduced least compute and the
    planner's step terms, the same on every rank); :meth:`run_mean` averages the reduced figures
    over every epoch of the run (the bytes of a run whose width or cache changes per epoch).

    Strategies without a halo exchange log ``comm/sent_MB`` and ``comm/step_s`` too:
    :class:`~lightning_fullgraph.FourDStrategy` its grid's and replicas' collectives, and a
    plain data-parallel ``DistributedDataParallel`` model (Lightning's ``"ddp"``, e.g. PyG's
    ``NeighborLoader`` training) its gradient all-reduces, counted by a communication hook
    that wraps DDP's default all-reduce (not installed when the strategy has its own
    ``ddp_comm_hook``).  All-reduces are counted as a ring sends them: :math:`2 (g - 1) / g`
    of the payload per process.

    Next to them, the planner's predictions (:mod:`lightning_fullgraph.planner`) for the same
    epoch: ``comm/predicted_sent_MB`` (mean over ranks, and ``_max``) and
    ``comm/predicted_received_MB`` from the engine's aggregation plans and the model's
    exchange calls, and, with a :obj:`link`, ``comm/predicted_exchange_s`` (SuperGCN's model:
    per exchange, latency per peer plus the busiest rank's bytes over the bandwidth), and for
    one steady training step ``comm/predicted_step_exchange_s``,
    ``comm/predicted_step_codec_s`` (encoding and decoding at the link's measured codec
    throughput), ``comm/predicted_step_exposed_s`` (per exchange, the part of its predicted
    seconds longer than the work measured to run while it is in flight) and
    ``comm/predicted_step_link_s`` (the exchange seconds of the transfers the step waits for:
    the asynchronous pipeline's run into the next step), ``comm/link_contention`` (the
    link's :attr:`~lightning_fullgraph.planner.LinkModel.contention`: compute lost while
    transfers are in flight), ``comm/link_queue_wait_s`` (its
    :attr:`~lightning_fullgraph.planner.LinkModel.queue_wait`: what a collective waits behind
    a transfer still in flight), ``comm/link_duplex_gain`` (its
    :attr:`~lightning_fullgraph.planner.LinkModel.duplex_gain`, at which a duplex transport's
    exchanges are predicted while it splits them) and ``comm/step_collectives`` (the
    synchronous collectives outside the exchange per training step, which wait so behind the
    pipeline's): with the step's compute (``comm/step_compute_s``, the training step without
    its blocked exchanges, measured), they are the planner's step time
    (:func:`~lightning_fullgraph.planner.predicted_step_seconds`).  The
    exchange calls come from :obj:`profile` (:func:`~lightning_fullgraph.planner.profile_model`
    of the model before fit) or, without one, are recorded from the run's own steps (no
    collective is added either way; only ``link="calibrate"`` measures the link at fit start,
    the same collectives on every rank).

    With more than one rank it also fits the link to the run's own exchanges
    (:func:`~lightning_fullgraph.planner.fit_link`: per exchange point, the time of the rank
    that arrived last against its calls and its busiest rank's bytes, every steady-state epoch
    so far), and logs it as ``comm/fitted_latency_us`` and ``comm/fitted_bandwidth_GBps``.
    Where ranks share cores with their threads, exchanges inside training cost more than a
    ping-pong calibration sees (1.2-2.4x here at P = 2); the fitted link
    (:attr:`fitted_link`, written to :obj:`save_link` at fit end) is that cost, for
    ``lightning-fullgraph plan --link`` to predict other part counts and modes with.

    Args:
        per_layer (bool): Also log per-layer byte counts.
        prog_bar (bool): Show the sent megabytes in the progress bar.
        predict (bool): Log the predicted figures.
        profile (ExchangeProfile, optional): The model's exchange calls, profiled before fit.
        link (LinkModel or str, optional): Latency and bandwidth for the predicted seconds,
            or ``"calibrate"`` to measure them on the engine's group at fit start.
        save_link (str, optional): JSON file the link fitted to the run is written to at
            fit end (by global rank 0; nothing is written when none was fitted).
    """

    def __init__(self, per_layer: bool = True, prog_bar: bool = True, predict: bool = True,
                 profile: Optional[Any] = None, link: Optional[Any] = None,
                 save_link: Optional[str] = None) -> None:
        if isinstance(link, str) and link != "calibrate":
            raise ValueError(f"link must be a LinkModel, 'calibrate' or None, got {link!r}")
        self.per_layer = per_layer
        self.prog_bar = prog_bar
        self.predict = predict
        self.profile = profile
        self.link = link
        self.save_link = save_link
        self.fitted_link: Optional[Any] = None  # LinkModel fitted to the run's exchanges
        self.predictor: Optional[Any] = None  # the planner's PredictionTracker during fit
        self.last: Dict[str, float] = {}
        self.history = []
        self._reduced: List[Dict[str, float]] = []
        self._step_start: Optional[float] = None
        self._step_seconds = 0.0
        self._step_exchange = 0.0  # exchange seconds inside training steps (not validation)
        self._exchange_at_start = 0.0
        self._ddp_bytes: Optional[_AllReduceBytes] = None

    @staticmethod
    def _engine(trainer: "pl.Trainer"):
        return getattr(trainer.strategy, "engine", None)

    def on_fit_start(self, trainer, pl_module) -> None:
        engine = self._engine(trainer)
        self._ddp_bytes = _count_ddp_bytes(trainer)
        if self.predict and engine is not None:
            from ..planner.tracker import PredictionTracker
            if self.predictor is not None:
                self.predictor.close()
            self.predictor = PredictionTracker.start(engine, self.profile, self.link)
        # Partition statistics (edge cut, halo, imbalance) go to the logger once.
        directory = getattr(trainer.datamodule, "partition_dir", None)
        if directory is None or not trainer.loggers:
            return
        from ..partition import PartitionStats, read_manifest
        stats = read_manifest(directory).get("stats")
        if stats and trainer.is_global_zero:
            summary = PartitionStats.from_dict(stats).summary()
            for logger in trainer.loggers:
                logger.log_metrics({k: float(v) for k, v in summary.items()}, step=0)

    @staticmethod
    def _grid(trainer: "pl.Trainer") -> bool:
        # FourDStrategy: no halo engine; the grid's all-reduces are counted by parallel.pmm.
        return getattr(trainer.strategy, "strategy_name", None) == "4d"

    def _collective_bytes(self, trainer: "pl.Trainer") -> Optional[float]:
        # Strategies without a halo engine: what their collectives sent this epoch.
        if self._grid(trainer):
            from ..parallel import pmm
            return pmm.bytes_sent()
        if self._ddp_bytes is not None:
            return self._ddp_bytes.sent()
        return 0.0 if trainer.world_size == 1 else None  # one process sends nothing

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        engine = self._engine(trainer)
        if engine is not None:
            engine.stats.reset()
        elif self._grid(trainer):
            from ..parallel import pmm
            pmm.reset_bytes()
        elif self._ddp_bytes is not None:
            self._ddp_bytes.payload = 0
        self._step_seconds = self._step_exchange = 0.0
        if self.predictor is not None:
            self.predictor.epoch_start()

    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        self._step_start = time.perf_counter()
        engine = self._engine(trainer)
        if engine is not None:
            self._exchange_at_start = engine.stats.total().seconds
        if self.predictor is not None:
            self.predictor.step_start("train")

    def on_train_batch_end(self, trainer, pl_module, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self._step_start is not None:
            self._step_seconds += time.perf_counter() - self._step_start
            engine = self._engine(trainer)
            if engine is not None:
                self._step_exchange += engine.stats.total().seconds - self._exchange_at_start
        if self.predictor is not None:
            self.predictor.step_end("train")

    def on_validation_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        if self.predictor is not None and trainer.state.fn == "fit":
            self.predictor.step_start("eval")

    def on_validation_batch_end(self, trainer, pl_module, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.predictor is not None and trainer.state.fn == "fit":
            self.predictor.step_end("eval")

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.predictor is not None:
            self.predictor.close()
        if self.save_link and self.fitted_link is not None and trainer.is_global_zero:
            self.fitted_link.save(self.save_link)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.predictor is not None:
            self.predictor.close()

    @staticmethod
    def _all_reduce(trainer, tensor: torch.Tensor, op: Any, group: Optional[Any]) -> None:
        timeout = getattr(trainer.strategy, "collective_timeout", None)
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        with guarded("CommunicationMonitor's all-reduce of the epoch's figures", rank,
                     (r for r in range(world) if r != rank), timeout):
            dist.all_reduce(tensor, op=op, group=group)

    def _collective_epoch_end(self, trainer, pl_module, sent: float) -> None:
        values = torch.tensor([sent / 1e6, self._step_seconds], dtype=torch.float64)
        peak = values.clone()
        if dist.is_initialized() and dist.get_world_size() > 1:
            self._all_reduce(trainer, values, dist.ReduceOp.SUM, None)
            values /= dist.get_world_size()
            self._all_reduce(trainer, peak, dist.ReduceOp.MAX, None)
        metrics = {"comm/sent_MB": values[0].item(), "comm/step_s": values[1].item(),
                   "comm/sent_MB_max": peak[0].item()}
        self.last = metrics
        self.history.append({"comm/sent_MB": sent / 1e6, "comm/step_s": self._step_seconds})
        self._reduced.append(dict(metrics))
        for name, value in metrics.items():
            pl_module.log(name, value, prog_bar=self.prog_bar and name == "comm/sent_MB",
                          on_epoch=True, on_step=False, sync_dist=False, rank_zero_only=False,
                          batch_size=1)

    def run_mean(self) -> Dict[str, float]:
        r"""Each figure of :attr:`last` averaged over all training epochs so far (the same
        on every rank); empty before the first epoch ends."""
        names = sorted({n for m in self._reduced for n in m})
        return {n: sum(m[n] for m in self._reduced if n in m)
                / sum(1 for m in self._reduced if n in m) for n in names}

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        engine = self._engine(trainer)
        if engine is None:
            sent = self._collective_bytes(trainer)
            if sent is not None:
                self._collective_epoch_end(trainer, pl_module, sent)
            return
        stats = engine.stats
        total = stats.total()
        local = {
            "comm/sent_MB": total.bytes_sent / 1e6,
            "comm/received_MB": total.bytes_received / 1e6,
            "comm/inter_host_sent_MB": total.inter_host_bytes_sent / 1e6,
            "comm/exchange_s": total.seconds,
            # What ran while asynchronous exchanges were in flight (what overlap hid them by).
            "comm/in_flight_s": total.in_flight_seconds,
            "comm/compute_s": max(0.0, self._step_seconds - total.seconds),
            "comm/step_s": self._step_seconds,
            # The training steps alone (comm/exchange_s counts validation's exchanges too).
            "comm/step_exchange_s": self._step_exchange,
            "comm/step_compute_s": max(0.0, self._step_seconds - self._step_exchange),
        }
        # Negated, so that the MAX below gives the least over ranks: the rank that reached
        # the gradient all-reduce last; every other rank counts its wait there for that one
        # (for its exchange's larger share, say) as compute.
        local["comm/_neg_step_compute_s"] = -local["comm/step_compute_s"]
        if total.rows_eligible:
            # The adaptive halo cache: the share of the rows it could have sent that the
            # receivers' cached copies served; also per direction (rows, gradients).
            local["comm/rows_skipped_frac"] = total.rows_skipped / total.rows_eligible
            for direction in ("forward", "backward"):
                part = stats.total(direction)
                if part.rows_eligible:
                    local[f"comm/rows_skipped_frac_{direction}"] = \
                        part.rows_skipped / part.rows_eligible
        # The forward rows' wire width as sent (a per-node codec's widths included), and the
        # pipeline's stale exchanges: reduced as means, their ratios are ratios of sums.
        forward = stats.total("forward")
        local["comm/_features"] = float(forward.features_sent)
        local["comm/_feature_bits"] = float(forward.feature_bits)
        local["comm/_pipelined"] = float(total.pipelined)
        local["comm/_stale"] = float(total.stale)
        if self.per_layer:
            for key, counter in sorted(stats.per_key().items()):
                local[f"comm/layer/{key}_MB"] = (counter.bytes_sent + counter.bytes_received) / 1e6
        # Predicted figures of this rank; the seconds per exchange are maxed over ranks
        # in the same all-reduce as the measured peaks (no extra collective).
        predicted, call_seconds = self.predictor.epoch_end() if self.predictor is not None \
            else ({}, None)
        local.update(predicted)
        names = sorted(local)
        values = torch.tensor([local[n] for n in names], dtype=torch.float64)
        extra = call_seconds if call_seconds is not None else torch.zeros(0, dtype=torch.float64)
        # The windows of the training steps only: evaluation overlaps exchanges that training
        # may run synchronously (the halo cache).
        steps = self.predictor.in_epoch["train"] if self.predictor is not None else 0
        step_seconds = self.predictor.step_seconds(
            self.predictor.training_windows(),
            step=self._step_seconds / steps if steps else None) \
            if call_seconds is not None else None
        if step_seconds is not None:
            extra = torch.cat([extra, step_seconds])
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        observed = self.predictor.observation_vector(stats) \
            if self.predictor is not None and distributed else None
        if observed is not None:  # busiest bytes, (negated) fastest seconds, spans: a MAX too
            extra = torch.cat([extra, observed])
        if distributed:
            # The engine's group: its timeout is the collective timeout, and the same ranks.
            group = engine.group
            mean, peak = values.clone(), torch.cat([values, extra])
            self._all_reduce(trainer, mean, dist.ReduceOp.SUM, group)
            mean /= dist.get_world_size(group)
            self._all_reduce(trainer, peak, dist.ReduceOp.MAX, group)
        else:
            mean, peak = values, torch.cat([values, extra])
        metrics = dict(zip(names, mean.tolist()))
        metrics["comm/sent_MB_max"] = peak[names.index("comm/sent_MB")].item()
        metrics["comm/exchange_s_max"] = peak[names.index("comm/exchange_s")].item()
        metrics.pop("comm/_neg_step_compute_s")
        metrics["comm/step_compute_s_min"] = \
            -peak[names.index("comm/_neg_step_compute_s")].item()
        if "comm/predicted_sent_MB" in names:
            metrics["comm/predicted_sent_MB_max"] = \
                peak[names.index("comm/predicted_sent_MB")].item()
        if call_seconds is not None:
            metrics["comm/predicted_exchange_s"] = \
                peak[len(names):len(names) + len(call_seconds)].sum().item()
            start = len(names) + len(call_seconds)
            step = peak[start:start + len(step_seconds)].view(-1, 4).sum(0).tolist()
            metrics["comm/predicted_step_exchange_s"] = step[0]
            metrics["comm/predicted_step_codec_s"] = step[1]
            metrics["comm/predicted_step_exposed_s"] = step[2]
            metrics["comm/predicted_step_link_s"] = step[3]
            # The same on every rank (calibrated from all-reduced times, or read from a file).
            metrics["comm/link_contention"] = self.predictor.link.contention
            metrics["comm/link_queue_wait_s"] = self.predictor.link.queue_wait
            metrics["comm/link_duplex_gain"] = self.predictor.link.duplex_gain
            # Counted alike on every rank (the same collectives run everywhere).
            metrics["comm/step_collectives"] = self.predictor.step_collectives()
        if observed is not None:
            fitted = self.predictor.observe(peak[len(peak) - len(observed):])
            if fitted is not None:
                self.fitted_link = fitted
                metrics["comm/fitted_latency_us"] = fitted.alpha * 1e6
                metrics["comm/fitted_bandwidth_GBps"] = fitted.beta / 1e9
        # The wire format the forward rows were sent in, over all ranks (set by the strategy's
        # codec and changed only by callbacks that decide from all-reduced values; a per-node
        # codec's widths measured): a lossy codec shows in the progress bar, never silently.
        # Without rows sent this epoch (one process), the codec's nominal width.
        from ..engine.codecs.registry import wire_bits
        features, bits = metrics.pop("comm/_features"), metrics.pop("comm/_feature_bits")
        metrics["comm/bits"] = bits / features if features > 0 else \
            wire_bits(engine.policy.codec("", "forward"))
        pipelined, stale = metrics.pop("comm/_pipelined"), metrics.pop("comm/_stale")
        if getattr(engine.policy, "pipeline", None) is not None:
            # The share of the epoch's pipelined exchanges that handed the layers the previous
            # step's rows: 1 for an asynchronous epoch, 0 for a synchronous one (the first, one
            # after max_async_epochs, or one PipelineAdaptor made synchronous).
            metrics["comm/async"] = stale / pipelined if pipelined > 0 else 0.0
        lossy = not engine.policy.lossless
        self.last = metrics
        mine = {n: v for n, v in local.items() if n != "comm/_neg_step_compute_s"}
        # The least over ranks (the same on every rank) next to this rank's own figures.
        mine["comm/step_compute_s_min"] = metrics["comm/step_compute_s_min"]
        # So are the planner's step terms, epoch by epoch (a run's steady epochs, not only
        # its last: the pipeline's last epoch of a bounded run is a synchronous one).
        for name in _STEP_TERMS:
            if name in metrics:
                mine[name] = metrics[name]
        self.history.append(mine)
        self._reduced.append(dict(metrics))
        for name, value in metrics.items():
            shown = name == "comm/sent_MB" or (lossy and name in ("comm/bits", "comm/async"))
            pl_module.log(name, value, prog_bar=self.prog_bar and shown,
                          on_epoch=True, on_step=False, sync_dist=False, rank_zero_only=False,
                          batch_size=1)


class _AllReduceBytes:
    r"""State of a DDP communication hook that counts the gradient buckets it all-reduces."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.payload = 0

    def sent(self) -> float:
        # What one process sends in a ring all-reduce of the payload, as parallel.pmm counts.
        g = self.world_size
        return 2.0 * (g - 1) / g * self.payload


def _counting_allreduce(state: _AllReduceBytes, bucket):  # DDP checks the annotations
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    buffer = bucket.buffer()
    state.payload += buffer.numel() * buffer.element_size()
    return default_hooks.allreduce_hook(None, bucket)


def _count_ddp_bytes(trainer: "pl.Trainer") -> Optional[_AllReduceBytes]:
    r"""Counts a plain ``DistributedDataParallel`` model's gradient all-reduces (DDP's own
    default, unchanged), unless the user registered a communication hook of their own."""
    from torch.nn.parallel import DistributedDataParallel
    model = getattr(trainer.strategy, "model", None)
    if not isinstance(model, DistributedDataParallel) or trainer.world_size < 2:
        return None
    state = _AllReduceBytes(trainer.world_size)
    try:
        model.register_comm_hook(state, _counting_allreduce)
    except RuntimeError:  # a hook is registered already (DDPStrategy(ddp_comm_hook=...))
        return None
    return state
