r"""``FourDStrategy``: ScaleGNN's mini-batch training, data parallel x a 3-D process grid."""
import sys
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch_geometric.data.data import BaseData

from .._at_exit import close_process_group_at_exit
from ..parallel.dims import FourDDims
from ..parallel.mesh import FourDMesh
from ..parallel.shards import INPUT_BLOCK, ShardPlan, plan_for
from ..parallel.surgery import GridSplit
from .faults import (BoundedRunMixin, TimeoutConfig, refuse_grouped_arguments,
                     refuse_unknown_arguments)

__all__ = ["FourDStrategy"]


class FourDStrategy(BoundedRunMixin, DDPStrategy):
    r"""Trains on uniformly sampled mini-batches (ScaleGNN), each data-parallel replica its
    own, with every :class:`~lightning_fullgraph.parallel.ScaleGNN` of the model split over an
    ``x * y * z`` grid of processes (:class:`~lightning_fullgraph.parallel.Grid3DScaleGNN`).

    Use it with :class:`~lightning_fullgraph.data.sampled.SampledNodeDataModule` (every
    process holds the graph) or :class:`~lightning_fullgraph.data.sampled.ShardedNodeDataModule`
    (each holds only its grid position's shards)::

        trainer = Trainer(strategy=FourDStrategy(dp=2, grid=(2, 1, 1)), devices=4)
        trainer.fit(module, datamodule=SampledNodeDataModule(data, batch_size=1024))

    With ``grid=(1, 1, 1)`` any PyG model trains data parallel on the sampled batches
    (give it the batch's ``edge_weight``: the rescaled normalized weights).  With a larger
    grid, :class:`~lightning_fullgraph.parallel.ScaleGNN` and PyG
    :class:`~torch_geometric.nn.models.GCN` (``normalize=False``; batch or layer norms between
    the layers) modules are split with layouts that rotate
    (:class:`~lightning_fullgraph.parallel.Grid3DGCN`), and any other module holding
    ``GCNConv``, ``SAGEConv``, ``GraphConv`` or ``GINConv`` layers (PyG's GraphSAGE, GIN, a
    hand-written model) with whole rows between its layers
    (:class:`~lightning_fullgraph.parallel.GridRowsModel`); outputs are gathered, so the
    training step's ``out[mask]`` loss works unchanged.  What a grid cannot split (attention,
    batch statistics inside such a model) is refused by name.
    Gradients of split weights are summed over the axis that splits their rows and averaged
    over replicas, the others averaged over replicas.  Checkpoints hold the whole model, as
    one process would save it, and every rank's optimizer state.

    Args:
        dp (int, optional): Data-parallel replicas (default: world size / grid size).
        grid (Tuple[int, int, int]): ``(x, y, z)`` processes per replica.
        seed (int): Seed of the split layers' dropout masks.
        bf16_comm (bool): Send the parallel matmuls' partial sums and their gradients, the
            residual's reshard and the weight-gradient reduction as bfloat16, summed in fp32
            (ScaleGNN §V; lossy, about half a step's bytes at any axis size; announced with a
            warning at setup).
        timeout (timedelta, float or TimeoutConfig): Lightning's meaning: one duration is the
            process group's timeout, for start-up and every collective alike; the default,
            a :class:`~lightning_fullgraph.TimeoutConfig`, gives start-up 30 minutes and the
            grid's collectives (and, after start-up, Lightning's own) 5 minutes.  A stuck
            peer ends the run with a :class:`~lightning_fullgraph.engine.CollectiveError`.
        num_threads (int, optional): Torch intra-op threads per process, set at setup and
            restored at teardown (default: left as the launcher set it, as
            :class:`~lightning_fullgraph.FullGraphStrategy` does).
        log_communication (bool): Add a
            :class:`~lightning_fullgraph.callbacks.CommunicationMonitor` (the grid's bytes
            per epoch, ``comm/sent_MB``) unless one is set.
        **kwargs: Passed to :class:`~lightning.pytorch.strategies.DDPStrategy`:
            ``process_group_backend``, ``start_method``, ``cluster_environment``,
            ``checkpoint_io``, ``accelerator``, ``parallel_devices``, ``precision_plugin``;
            anything else is refused with a ``TypeError``.

    SIGTERM is acted on by every process at the next step, as in
    :class:`~lightning_fullgraph.FullGraphStrategy` (:mod:`~lightning_fullgraph.strategies.faults`).
    """

    strategy_name = "4d"

    def __init__(self, dp: Optional[int] = None, grid: Tuple[int, int, int] = (1, 1, 1),
                 seed: int = 0, bf16_comm: bool = False,
                 timeout: Union[float, timedelta, TimeoutConfig] = TimeoutConfig(),
                 num_threads: Optional[int] = None, log_communication: bool = True,
                 **kwargs: Any) -> None:
        FourDDims.of(1 if dp is None else dp, grid)  # refuse bad values now, not per rank
        refuse_grouped_arguments(type(self).__name__, kwargs,
                                 {"startup_timeout": "timeout=TimeoutConfig(startup={!r})"})
        refuse_unknown_arguments(type(self).__name__, kwargs, _OWN_ARGUMENTS)
        if num_threads is not None and (isinstance(num_threads, bool) or int(num_threads) < 1):
            raise ValueError(f"num_threads must be at least 1 (or None), got {num_threads!r}")
        self.timeouts = TimeoutConfig.of(timeout)
        super().__init__(timeout=self.timeouts.startup, **kwargs)
        self._init_bounded_run(self.timeouts.collectives)
        self.dp, self.grid, self.seed = dp, tuple(grid), int(seed)
        self.bf16_comm = bool(bf16_comm)
        self.num_threads = num_threads
        self._threads_before: Optional[int] = None
        self.log_communication = bool(log_communication)
        self.mesh: Optional[FourDMesh] = None
        self._surgery: Optional[GridSplit] = None  # the model surgery, once applied

    @property
    def dims(self) -> FourDDims:
        return FourDDims.for_world(self.world_size, self.grid, self.dp)

    # -- environment and model surgery --------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        close_process_group_at_exit()  # once, however many Trainers ran
        if self.num_threads is not None:  # only when asked: the count is the process's
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(int(self.num_threads))
        trainer = getattr(self.lightning_module, "trainer", None) \
            if self.lightning_module is not None else None
        if trainer is not None:
            # Before Lightning restores a checkpoint: every rank's random state and the grid's
            # dropout step counters come back from it (a resume draws the same masks).
            from ..callbacks import CommunicationMonitor, RandomStateCheckpoint
            wanted = [RandomStateCheckpoint] + ([CommunicationMonitor]
                                                if self.log_communication else [])
            for kind in wanted:
                if not any(isinstance(c, kind) for c in trainer.callbacks):
                    trainer.callbacks.append(kind())

    def setup(self, trainer) -> None:
        self.mesh = FourDMesh.create(self.dims, timeout=self.collective_timeout)
        if self.bf16_comm:
            rank_zero_warn("FourDStrategy(bf16_comm=True): the parallel matmuls' partial sums "
                           "and the gradients cross the wire as bfloat16; training is not exact (bf16_comm=False "
                           "for fp32)", category=UserWarning)
        super().setup(trainer)
        if trainer.state.fn != TrainerFn.FITTING:
            # Split only now: outside fitting, DDPStrategy.setup broadcasts rank 0's
            # parameters and buffers to every rank (it has no DDP wrapper to do it), which
            # would overwrite every rank's blocks with rank 0's.
            self._apply()
        self._bound_collectives()

    def configure_ddp(self) -> None:
        # No DistributedDataParallel wrapper: gradients are reduced by backward() below.
        self._apply()

    @property
    def _split(self) -> list:
        return self._surgery.splits if self._surgery is not None else []

    def _apply(self) -> None:
        if self.mesh is None or (self._surgery is not None and self._surgery.applied):
            return
        self._surgery = GridSplit(self.lightning_module, self.mesh, seed=self.seed,
                                  bf16_comm=self.bf16_comm)
        try:
            self._surgery.apply(device=self.root_device)
        except TypeError as e:
            raise TypeError(f"FourDStrategy(grid={self.grid}): {e}") from None

    def _revert(self, gather: bool = True) -> None:
        if self._surgery is not None:
            self._surgery.revert(gather=gather)

    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None,
                        dataloader_idx: int = 0) -> Any:
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if isinstance(batch, BaseData):  # precision plugins convert collections, not Data
            convert = self.precision_plugin.convert_input
            batch = batch.apply(lambda t: convert(t) if t.is_floating_point() else t)
            if getattr(batch, INPUT_BLOCK, False):
                # Sharded data: x is this process's input block of the batch.
                for *_, split in self._split:
                    split.bind_input(batch.num_nodes, batch.x.shape)
        return batch

    def shard_plan(self) -> ShardPlan:
        r"""What this process needs of the graph (:class:`~lightning_fullgraph.data.sampled.
        ShardedNodeDataModule` loads it): the input block and adjacency blocks of the split
        models (after setup), everything on a grid of one process."""
        if self.mesh is None:
            raise RuntimeError("FourDStrategy.shard_plan() is known once the strategy is set "
                               "up (the data module asks for its first loader)")
        axes = ("x", "y", "z")
        return plan_for({a: self.mesh.size(a) for a in axes},
                        {a: self.mesh.coordinate(a) for a in axes},
                        [split for *_, split in self._split])

    # -- steps: every rank passes here at the same point, where signals are agreed on -------
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        return super().training_step(*args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        return super().test_step(*args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        self._sync_signals()
        return super().predict_step(*args, **kwargs)

    # -- gradients --------------------------------------------------------------------------
    def backward(self, closure_loss: Tensor, optimizer: Optional[Any], *args: Any,
                 **kwargs: Any) -> Tensor:
        assert self._surgery is not None
        params = [p for p in self.lightning_module.parameters() if p.requires_grad]
        self._surgery.backward(params, lambda: super(FourDStrategy, self).backward(
            closure_loss, optimizer, *args, **kwargs))
        return closure_loss

    # -- checkpoints --------------------------------------------------------------------------
    def lightning_module_state_dict(self) -> Dict[str, Any]:
        if not self._split:
            return self.lightning_module.state_dict()
        return self._surgery.state_dict()

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        # Restore into the set-up model (in its precision, already split; the optimizer
        # already holds the split parameters), not into the module before setup.
        return True

    def load_model_state_dict(self, checkpoint: Dict[str, Any], strict: bool = True) -> None:
        if not self._split:
            return super().load_model_state_dict(checkpoint, strict=strict)
        try:
            self._surgery.load_state_dict(checkpoint["state_dict"], strict=strict)
        except RuntimeError as e:
            raise RuntimeError(f"checkpoint does not match the model: {e}") from None

    def optimizer_state(self, optimizer: Any) -> Dict[str, Any]:
        state = optimizer.state_dict()
        if not (dist.is_available() and dist.is_initialized()) or self.world_size == 1:
            return state
        states: List[Any] = [None] * self.world_size
        dist.all_gather_object(states, state)  # split blocks differ per rank
        return {"per_rank": states, "grid": list(self.grid)}

    def load_optimizer_state_dict(self, checkpoint: Dict[str, Any]) -> None:
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            if isinstance(state, dict) and "per_rank" in state:
                if len(state["per_rank"]) != self.world_size or \
                        tuple(state["grid"]) != self.grid:
                    raise ValueError(
                        f"the checkpoint's optimizer state is for {len(state['per_rank'])} "
                        f"processes with grid {tuple(state['grid'])}; this run has "
                        f"{self.world_size} with grid {self.grid}: resume with the same")
                state = state["per_rank"][self.global_rank]
            optimizer.load_state_dict(state)

    def teardown(self) -> None:
        if self._surgery is not None:
            # While an exception unwinds (a peer may be gone) no collective: the modules are
            # put back without gathering the trained blocks.
            self._revert(gather=sys.exc_info()[0] is None)
        if self._threads_before is not None:
            torch.set_num_threads(self._threads_before)
            self._threads_before = None
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if "4d" not in strategy_registry:
            strategy_registry.register(
                "4d", cls, description="ScaleGNN 4-D mini-batch training (lightning-fullgraph)")


_OWN_ARGUMENTS = ("dp", "grid", "seed", "bf16_comm", "timeout", "num_threads",
                  "log_communication")

FourDStrategy.register_strategies(StrategyRegistry)
