"""``FullGraphStrategy``: partitioned full-batch training under Lightning.

The strategy is a small set of overrides of :class:`~lightning.pytorch.strategies.DDPStrategy`
(process launch, cluster environments, process group, barrier/broadcast/reduce and
rank-zero checkpointing are inherited) around :class:`~lightning_fullgraph.engine.FullGraphEngine`:

* ``setup_environment``: checks where the stage's data comes from before any data hook runs,
  and puts a partitioning :class:`~lightning_fullgraph.data.datamodule.FullGraphNodeData` in
  place of PyG's ``LightningNodeData(data, loader="full")``; anything else that would give
  every rank the whole graph is refused with the fix;
* ``setup``: takes the rank's partition from :class:`~lightning_fullgraph.FullGraphDataModule`,
  attaches the engine to the LightningModule (halo hooks, synchronized BatchNorm,
  aggregation kernels) instead of wrapping it in ``DistributedDataParallel``;
* ``backward``: weights the rank's mean loss by its share of the training nodes,
  back-propagates (the halo exchange returns halo gradients to their owners) and sums
  parameter gradients over ranks, which gives the single-process gradient;
* ``predict_step``: returns node predictions in global node order on every rank;
* ``teardown``: reverts the model to its original form.

Faults (:mod:`~.faults`): the engine's collectives run on their own process group whose
timeout is the strategy's ``timeout``; start-up (rendezvous, waiting for rank 0 to partition)
uses ``startup_timeout``, after which Lightning's own collectives are bounded by ``timeout``
too.  A failing collective raises a :class:`~lightning_fullgraph.engine.CollectiveError`
naming the collective, the peers and the option.  SIGTERM and SLURM's requeue signal are
acted on by all ranks together at the next step (:class:`~.signals.DeferredSignals`), never
inside a signal handler, and a rank blocked in a collective ends on SIGTERM within
:data:`~.signals.STOP_GRACE_SECONDS`.  The library's own collectives never run where Lightning
may synchronize a metric on rank 0 alone (the end of a training epoch: the progress bar
computes epoch metrics there on rank 0 only).
"""
import logging
import re
from datetime import timedelta
from functools import partial
from typing import Any, Iterable, Optional, Tuple, Type, Union

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch_geometric.data.data import BaseData

from .. import compat
from .._at_exit import close_process_group_at_exit
from ..engine import ExchangeConfig, FullGraphEngine
from ..engine.config import refuse_moved_arguments
from ..engine.step_aside import StepAside
from ..kernels.config import KernelConfig
from .faults import (BoundedRunMixin, TimeoutConfig, refuse_grouped_arguments,
                     refuse_unknown_arguments)

compat.require("lightning")

__all__ = ["FullGraphStrategy"]

log = logging.getLogger(__name__)


class FullGraphStrategy(BoundedRunMixin, DDPStrategy):
    r"""Trains an unmodified PyG model full-graph on a graph partitioned across processes.

    Use it with :class:`~lightning_fullgraph.FullGraphDataModule`::

        trainer = Trainer(accelerator="cpu", devices=4, strategy=FullGraphStrategy())
        trainer.fit(module, datamodule=FullGraphDataModule(data))

    or with the data module of a PyG script written for one device, which it partitions the
    same way (see :class:`~lightning_fullgraph.data.datamodule.FullGraphNodeData`)::

        trainer = Trainer(accelerator="cpu", devices=4, strategy="fullgraph")
        trainer.fit(module, datamodule=LightningNodeData(data, loader="full"))

    Dataloaders passed to ``fit`` (or defined by the LightningModule) and other data modules
    would give every rank the whole graph and are refused, with the fix in the message.

    Args:
        loss_mask (str): Node mask over which the training loss is a mean
            (default ``"train_mask"``).  Each rank's loss is weighted by its share of
            these nodes so that the summed gradients equal the single-process ones.
            Set ``loss_reduction="sum"`` if your loss is a sum instead of a mean.
        loss_reduction (str): ``"mean"`` (weight by mask share) or ``"sum"``
            (no weighting).
        trusted_layers (Iterable[type]): Extra message-passing classes declared exact
            (see :func:`~lightning_fullgraph.engine.check_model`).
        sync_batchnorm (bool): Synchronize ``BatchNorm1d`` statistics across ranks.
        kernels (str, KernelConfig or dict, optional): How aggregations and dense maps
            run: a backend name (``"auto"``, default; ``"cpp"``, ``"triton"``,
            ``"torch"``; ``None`` keeps PyG's own path) or a
            :class:`~lightning_fullgraph.kernels.KernelConfig` that also opts into huge
            pages or sets torch's thread count for the run.  Nothing outside the model
            changes unless asked there; what was set comes back at teardown.
        exchange (ExchangeConfig or dict, optional): How halo rows cross the wire: the
            aggregation mode (``"hybrid"`` by default, ``"post"``, ``"pre"`` or ``"auto"``),
            a codec, the adaptive halo cache, the asynchronous pipeline, boundary sampling,
            overlap (on) and stepping aside (on: after a few steps, the configured
            reductions are timed against the step without them and only those that shorten
            it are kept; the decision is logged and checkpointed); see
            :class:`~lightning_fullgraph.engine.ExchangeConfig`.  Default: exact.  A lossy
            configuration is announced at setup and its bits per feature are logged
            (``comm/bits``).
        timeout (timedelta, float or TimeoutConfig): Lightning's meaning: one duration is the
            process group's timeout, for start-up and every collective alike.  The default,
            a :class:`~lightning_fullgraph.TimeoutConfig`, gives start-up 30 minutes (rank
            0 partitions meanwhile) and every collective of training 5 minutes: a rank
            whose peer is stuck then raises a
            :class:`~lightning_fullgraph.engine.CollectiveError` naming the collective and
            the peers.
        log_communication (bool): Add a
            :class:`~lightning_fullgraph.callbacks.CommunicationMonitor` unless one is set.
        **kwargs: Passed to :class:`~lightning.pytorch.strategies.DDPStrategy`:
            ``process_group_backend``, ``start_method``, ``cluster_environment``,
            ``checkpoint_io``, ``accelerator``, ``parallel_devices``, ``precision_plugin``.
            Anything else (a misspelled option, DistributedDataParallel's options, which do
            not apply: the model is never wrapped in DDP) is refused with a ``TypeError``.
    """

    strategy_name = "fullgraph"

    def __init__(self, loss_mask: str = "train_mask", loss_reduction: str = "mean",
                 trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                 sync_batchnorm: bool = True,
                 # Typed (not Any) so that LightningCLI/jsonargparse parse and save them.
                 kernels: Union[str, None, KernelConfig] = "auto",
                 exchange: Optional[ExchangeConfig] = None,
                 timeout: Union[float, timedelta, TimeoutConfig] = TimeoutConfig(),
                 log_communication: bool = True, **kwargs: Any) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        refuse_moved_arguments(type(self).__name__, kwargs)
        refuse_grouped_arguments(type(self).__name__, kwargs)
        refuse_unknown_arguments(type(self).__name__, kwargs, _OWN_ARGUMENTS)
        self.timeouts = TimeoutConfig.of(timeout)
        super().__init__(timeout=self.timeouts.startup, **kwargs)
        self._init_bounded_run(self.timeouts.collectives)
        self.loss_mask = loss_mask
        self.loss_reduction = loss_reduction
        self.trusted_layers = tuple(trusted_layers)
        self.sync_batchnorm = sync_batchnorm
        #: The compute settings (:class:`~lightning_fullgraph.kernels.KernelConfig`).
        self.kernel_config = KernelConfig.of(kernels)
        self.kernels = self.kernel_config.backend
        self.huge_pages = self.kernel_config.huge_pages
        # Checked now (an unknown codec, stages that cannot combine), not at setup on every
        # rank.
        self.exchange = ExchangeConfig.of(exchange)
        # One step-aside decision per strategy: fit's decision is what validate and test
        # report, and what a checkpoint restores into the next engine.
        self._step_aside = StepAside.of(self.exchange.step_aside)
        self.num_threads = self.kernel_config.num_threads
        self._threads_before: Optional[int] = None
        self.log_communication = log_communication
        self.engine: Optional[FullGraphEngine] = None
        # (the user's LightningNodeData, the FullGraphNodeData that replaces it): reused when
        # the same data module comes back for validate/test/predict after fit.
        self._taken_over: Optional[Tuple[Any, Any]] = None
        self._group: Optional[Any] = None
        self._huge_pages: Optional[Any] = None  # kernels.huge_pages.HugePagesHandle
        #: Whether the last setup put large CPU tensors in huge pages (``huge_pages``).
        self.huge_pages_active = False

    # -- environment -----------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        close_process_group_at_exit()  # once, however many Trainers ran
        if self.num_threads is not None:  # only when asked: the count is the process's
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(int(self.num_threads))
        self._add_callbacks()
        if self.kernels in ("auto", "cpp") and self.root_device.type == "cpu":
            # Before the data is set up, so that the partition's features land in huge pages.
            from ..kernels import huge_pages
            self._huge_pages = huge_pages.enable_for_kernels(self.huge_pages)
            self.huge_pages_active = huge_pages.is_active()
            if self.huge_pages_active:
                log.info("FullGraphStrategy: large CPU tensors in transparent huge pages "
                         "for this run (huge_pages=True)")
        # Here, before the Trainer calls any data hook (prepare_data comes next).
        self._take_over_data()

    def _add_callbacks(self) -> None:
        # Here, before Lightning restores a checkpoint, so that the random-state callback
        # gets its on_load_checkpoint call.
        trainer = getattr(self.lightning_module, "trainer", None) if self.lightning_module \
            is not None else None
        if trainer is None:
            return
        from ..callbacks import CommunicationMonitor, RandomStateCheckpoint
        wanted = [RandomStateCheckpoint] + ([CommunicationMonitor] if self.log_communication else [])
        for kind in wanted:
            if not any(isinstance(c, kind) for c in trainer.callbacks):
                trainer.callbacks.append(kind())

    def _engine_group(self) -> Optional[Any]:
        r"""The process group of the engine's collectives, with the collective timeout."""
        if self._group is None and dist.is_available() and dist.is_initialized() \
                and dist.get_world_size() > 1:
            self._group = dist.new_group(timeout=self.collective_timeout)
        return self._group

    # -- data --------------------------------------------------------------------------
    def _take_over_data(self) -> None:
        r"""Makes sure that every rank gets its own partition in the running stage.

        Looks at where each dataloader of the stage comes from.  A data module with a
        ``partition`` (:class:`~lightning_fullgraph.FullGraphDataModule`) is used as it is.  PyG's
        ``LightningNodeData(data, loader="full")`` is replaced, for the Trainer, by a
        :class:`~lightning_fullgraph.data.datamodule.FullGraphNodeData` over its graph and splits;
        the replacement is attached as ``trainer.fit(datamodule=...)`` attaches one, so the
        original's hooks never run, its ``prepare_data`` included, which refuses more than one
        device because it would give each the whole graph.  Everything else (dataloaders passed
        to ``fit``/``validate``/``test``/``predict``, a LightningModule's own ``*_dataloader``,
        other data modules and loaders) would give every rank the whole graph: refused here,
        before anything is partitioned or trained, with the fix in the message.

        Raises:
            RuntimeError: For data that does not come partitioned.
        """
        module = self.lightning_module
        trainer = getattr(module, "trainer", None) if module is not None else None
        if trainer is None or getattr(trainer, "state", None) is None:
            return
        call = f"trainer.{getattr(trainer.state.fn, 'value', 'fit')}"
        for hook, source in compat.stage_data_sources(trainer).items():
            instance = source.instance
            if instance is None or hasattr(instance, "partition"):
                continue
            if isinstance(instance, pl.LightningModule):
                if source.is_defined():
                    raise RuntimeError(_data_error(
                        f"the LightningModule defines {hook}(), whose batches would be the "
                        "whole graph on every rank",
                        f"remove it and pass the graph as {call}(module, datamodule="
                        "FullGraphDataModule(data))"))
                continue  # no such loader; Lightning says so itself if one is needed
            if not isinstance(instance, pl.LightningDataModule):
                raise RuntimeError(_data_error(
                    f"the {hook.replace('_dataloader', '')} dataloaders were passed to {call}() "
                    "directly, and every rank would get the whole graph from them",
                    f"pass the graph instead: {call}(module, datamodule="
                    "FullGraphDataModule(data))"))
            compat.attach_datamodule(trainer, module, self._partitioned(instance, call))

    def _partitioned(self, datamodule: Any, call: str) -> Any:
        r"""The partitioned replacement of PyG's ``LightningNodeData(loader="full")``."""
        from torch_geometric.data.lightning import (LightningDataset, LightningLinkData,
                                                    LightningNodeData)
        name = type(datamodule).__name__
        if isinstance(datamodule, (LightningDataset, LightningLinkData)):
            what = "batches of whole graphs" if isinstance(datamodule, LightningDataset) \
                else "edges as training examples"
            raise RuntimeError(_data_error(
                f"{name} serves {what}, and FullGraphStrategy partitions one graph for node-level "
                "training (its loss is weighted by each rank's share of train_mask)",
                "train it with strategy='ddp'; for node classification on one large graph use "
                f"{call}(module, datamodule=LightningNodeData(data, loader='full')) or "
                "FullGraphDataModule(data)"))
        if not isinstance(datamodule, LightningNodeData):
            raise RuntimeError(_data_error(
                f"{name} would give every rank the whole graph (it has no partition)",
                f"{call}(module, datamodule=FullGraphDataModule(data)) with your PyG Data (or a "
                "dataset name, or a partition directory), or LightningNodeData(data, "
                "loader='full'), which the strategy partitions"))
        if datamodule.loader != "full":
            raise RuntimeError(_data_error(
                f"{name}(loader={datamodule.loader!r}) samples neighbourhood mini-batches from "
                "the whole graph on every rank",
                f"use {name}(data, loader='full'), which the strategy partitions for full-graph "
                "training (or FullGraphDataModule(data)); for mini-batches keep "
                f"loader={datamodule.loader!r} with strategy='ddp'"))
        if self._taken_over is None or self._taken_over[0] is not datamodule:
            from ..data.datamodule import FullGraphDataModule
            self._taken_over = (datamodule, FullGraphDataModule.from_node_data(datamodule))
            log.info("FullGraphStrategy: %s(loader='full') is trained partitioned: every rank "
                     "gets its own part of the graph", name)
        return self._taken_over[1]

    # -- model -------------------------------------------------------------------------
    def setup(self, trainer) -> None:
        datamodule = trainer.datamodule
        partition = getattr(datamodule, "partition", None)
        if partition is None:
            raise RuntimeError(_data_error(
                "trainer.datamodule has no partition" if datamodule is not None
                else "no data module was given",
                "call trainer.fit(module, datamodule=FullGraphDataModule(data)); dataloaders "
                "passed directly would give every rank the whole graph"))
        if partition.num_parts != self.world_size:
            raise RuntimeError(f"partition has {partition.num_parts} parts but the world size "
                               f"is {self.world_size}")
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("full-graph training takes one batch per epoch; "
                             "accumulate_grad_batches must be 1")
        group = self._engine_group()
        exchange = self.exchange.replace(step_aside=self._step_aside or False)
        self.engine = FullGraphEngine(partition, group=group, exchange=exchange,
                                      loss_mask=self.loss_mask,
                                      loss_reduction=self.loss_reduction,
                                      timeout=self.collective_timeout,
                                      ranks_per_host=self.num_processes)
        if not self.engine.policy.lossless:
            rank_zero_warn(f"FullGraphStrategy: halo rows cross the wire with a lossy codec "
                           f"or cache ({self.engine.policy.describe()}); training is not exact "
                           "(use the default ExchangeConfig() for the single-process result)",
                           category=UserWarning)
        super().setup(trainer)
        self._bound_collectives()

    def _signal_group(self) -> Optional[Any]:
        return self._engine_group()

    def configure_ddp(self) -> None:
        # Attach instead of wrapping in DistributedDataParallel: gradients are summed by
        # backward() below, and the forward needs no DDP bookkeeping.
        self._attach_engine()

    def model_to_device(self) -> None:
        super().model_to_device()
        if self.lightning_module is not None and self.lightning_module.trainer is not None \
                and self.lightning_module.trainer.state.fn != TrainerFn.FITTING:
            self._attach_engine()  # validate/test/predict run partitioned too

    def _attach_engine(self) -> None:
        assert self.engine is not None
        if self.engine.attached:
            return
        module = self.lightning_module
        self.engine.to(self.root_device)  # send/receive indices where the rows are
        self.engine.attach(module, trusted_layers=self.trusted_layers,
                           sync_batchnorm=self.sync_batchnorm, broadcast=True)
        self.engine.use_kernels(self.kernels)

    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None,
                        dataloader_idx: int = 0) -> Any:
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if isinstance(batch, BaseData):
            # Lightning's precision plugins convert tensor collections, not PyG Data.
            convert = self.precision_plugin.convert_input
            batch = batch.apply(lambda t: convert(t) if t.is_floating_point() else t)
        return batch

    # -- training ----------------------------------------------------------------------
    def backward(self, closure_loss: Tensor, optimizer: Optional[Any], *args: Any,
                 **kwargs: Any) -> Tensor:
        assert self.engine is not None
        scaled = self.engine.scale_loss(closure_loss) if self.loss_reduction == "mean" \
            else closure_loss
        # Only what this backward adds is summed over ranks: a second manual_backward
        # before the optimizer step must not count the first one again.
        self.engine.reduce_backward(partial(super().backward, scaled, optimizer, *args, **kwargs),
                                    self.lightning_module.parameters())
        return closure_loss

    # -- steps: every rank passes here at the same point, where signals are agreed on -----
    def on_train_end(self) -> None:
        super().on_train_end()
        if self.engine is not None:
            self.engine.drain()  # the pipeline's last transfers, before anything else

    def _sync_signals(self) -> int:
        ran = super()._sync_signals()
        if self.engine is not None:
            # Counted with the engine's other collectives outside the exchange: the planner
            # prices each one's wait behind the pipeline's transfers still in flight.
            self.engine.stats.record_collectives(ran)
        return ran

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        if self.engine is not None:
            # Stochastic codecs draw per step: the Trainer's step, the same on every rank and
            # after a resume what the uninterrupted run would have had.
            self.engine.set_step(self.lightning_module.trainer.global_step)
        try:
            return super().training_step(*args, **kwargs)
        except Exception as error:
            self._explain(error, "training_step")
            raise

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        return super().test_step(*args, **kwargs)

    def _explain(self, error: BaseException, where: str) -> None:
        # Adds what this rank knows; the other ranks raise a CollectiveError at their next
        # exchange, so the cause must be readable from this one.
        if getattr(error, "peer_failed", False) or not hasattr(error, "add_note"):
            return
        error.add_note(f"lightning-fullgraph: raised on rank {self.global_rank} of "
                       f"{self.world_size} in {where}; the other ranks stop at their next "
                       "exchange with a CollectiveError")
        match = re.search(r"Target (-?\d+) is out of bounds", str(error))
        datamodule = getattr(self.lightning_module.trainer, "datamodule", None)
        note = _label_note(datamodule, int(match.group(1))) if match else None
        if note is not None:
            error.add_note(note)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        out = super().predict_step(*args, **kwargs)
        if isinstance(out, Tensor) and self.engine is not None \
                and out.dim() > 0 and out.size(0) == self.engine.partition.num_owned:
            return self.engine.gather(out)
        return out

    def teardown(self) -> None:
        if self.engine is not None:
            # The next stage (validate, test, predict) builds an engine of its own: this one's
            # pipeline group would otherwise stay open until the process group is destroyed.
            self.engine.close()
        if self._huge_pages is not None:
            self._huge_pages.revert()
            self._huge_pages = None
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if "fullgraph" not in strategy_registry:
            strategy_registry.register(
                "fullgraph", cls, description="Partitioned full-graph training (lightning-fullgraph)")
            strategy_registry.register(
                "fullgraph_spawn", cls, description="FullGraphStrategy with spawned processes",
                start_method="spawn")


def _label_note(datamodule: Any, target: int) -> Optional[str]:
    r"""Why a training target is out of the model's range, from the labels' true maximum
    over all ranks (``FullGraphDataModule.max_label``), and the fix."""
    top = getattr(datamodule, "max_label", None)
    if top is None:
        return None
    given = getattr(datamodule, "num_classes_arg", None)
    note = (f"lightning-fullgraph: target {target} is not below the model's number of outputs; "
            f"the graph's labels reach {top}, so the model needs {top + 1} outputs")
    if given is not None and top >= given:
        # Only possible without the up-front check (validate=False).
        return note + (f", but num_classes was given as {given} and not checked "
                       f"(validate=False): pass num_classes={top + 1} (--num-classes {top + 1}) "
                       f"and size the model with it, or remap the labels to 0..{given - 1}")
    return note + (": size the model's output layer with datamodule.num_classes "
                   f"({getattr(datamodule, 'num_classes', top + 1)})")


def _data_error(problem: str, fix: str) -> str:
    return ("FullGraphStrategy needs its data from FullGraphDataModule (or PyG's "
            f"LightningNodeData(data, loader='full'), which it partitions): {problem}. Fix: {fix}.")


_OWN_ARGUMENTS = ("loss_mask", "loss_reduction", "trusted_layers", "sync_batchnorm", "kernels",
                  "exchange", "timeout", "log_communication")

FullGraphStrategy.register_strategies(StrategyRegistry)
