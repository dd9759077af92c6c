r"""``FourDStrategy``: ScaleGNN's mini-batch training, data parallel x a 3-D process grid."""
import math
import os
import sys
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from torch_geometric.data.data import BaseData

from ..parallel.dims import FourDDims
from ..parallel.gcn3d import Grid3DGCN, check_convertible
from ..parallel.grid3d import Grid3DScaleGNN
from ..parallel.mesh import FourDMesh
from ..parallel.pmm import summed
from ..parallel.scalegnn import ScaleGNN

__all__ = ["FourDStrategy"]


class FourDStrategy(DDPStrategy):
    r"""Trains on uniformly sampled mini-batches (ScaleGNN), each data-parallel replica its
    own, with every :class:`~lightning_fullgraph.parallel.ScaleGNN` of the model split over an
    ``x * y * z`` grid of processes (:class:`~lightning_fullgraph.parallel.Grid3DScaleGNN`).

    Use it with :class:`~lightning_fullgraph.data.sampled.SampledNodeDataModule`::

        trainer = Trainer(strategy=FourDStrategy(dp=2, grid=(2, 1, 1)), devices=4)
        trainer.fit(module, datamodule=SampledNodeDataModule(data, batch_size=1024))

    With ``grid=(1, 1, 1)`` any PyG model trains data parallel on the sampled batches
    (give it the batch's ``edge_weight``: the rescaled normalized weights).  With a larger
    grid, :class:`~lightning_fullgraph.parallel.ScaleGNN` and PyG
    :class:`~torch_geometric.nn.models.GCN` (``normalize=False``, no norm layers) modules are
    split (:class:`~lightning_fullgraph.parallel.Grid3DGCN`; outputs gathered, so the training
    step's ``out[mask]`` loss works unchanged); a parameter outside them is refused by name.
    Gradients of split weights are summed over the axis that splits their rows and averaged
    over replicas, the others averaged over replicas.  Checkpoints hold the whole model, as
    one process would save it, and every rank's optimizer state.

    Args:
        dp (int, optional): Data-parallel replicas (default: world size / grid size).
        grid (Tuple[int, int, int]): ``(x, y, z)`` processes per replica.
        seed (int): Seed of the split layers' dropout masks.
        bf16_comm (bool): Send the parallel matmuls' partial sums and their gradients as
            bfloat16, summed in fp32 (ScaleGNN §V; lossy, half those bytes).
        timeout (timedelta or float): Collective timeout of the grid's groups.
        num_threads (int, optional): Torch threads per process (default: the node's cores
            divided by its processes).
        log_communication (bool): Add a
            :class:`~lightning_fullgraph.callbacks.CommunicationMonitor` (the grid's bytes
            per epoch, ``comm/sent_MB``) unless one is set.
        **kwargs: Passed to :class:`~lightning.pytorch.strategies.DDPStrategy`.
    """

    strategy_name = "4d"

    def __init__(self, dp: Optional[int] = None, grid: Tuple[int, int, int] = (1, 1, 1),
                 seed: int = 0, bf16_comm: bool = False,
                 timeout: Union[float, timedelta] = timedelta(minutes=5),
                 num_threads: Optional[int] = None, log_communication: bool = True,
                 **kwargs: Any) -> None:
        FourDDims.of(1 if dp is None else dp, grid)  # refuse bad values now, not per rank
        if isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=float(timeout))
        super().__init__(timeout=timeout, **kwargs)
        self.dp, self.grid, self.seed = dp, tuple(grid), int(seed)
        self.bf16_comm = bool(bf16_comm)
        self.num_threads = num_threads
        self.log_communication = bool(log_communication)
        self.mesh: Optional[FourDMesh] = None
        # (parent module, attribute, the ScaleGNN, its Grid3DScaleGNN), for revert.
        self._split: List[Tuple[torch.nn.Module, str, ScaleGNN, Grid3DScaleGNN]] = []

    @property
    def dims(self) -> FourDDims:
        grid_size = math.prod(self.grid)
        world = self.world_size
        if self.dp is None and world % grid_size:
            raise ValueError(f"the world of {world} processes is not a multiple of the grid "
                             f"{self.grid} ({grid_size} processes per replica)")
        dp = self.dp if self.dp is not None else world // grid_size
        return FourDDims.of(dp, self.grid).validate(world)

    # -- environment and model surgery --------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.root_device.type == "cpu":
            torch.set_num_threads(self.num_threads or max(
                1, (os.cpu_count() or 1) // max(1, self.num_processes)))
        trainer = getattr(self.lightning_module, "trainer", None) \
            if self.lightning_module is not None else None
        if trainer is not None and self.log_communication:
            from ..callbacks import CommunicationMonitor
            if not any(isinstance(c, CommunicationMonitor) for c in trainer.callbacks):
                trainer.callbacks.append(CommunicationMonitor())

    def setup(self, trainer) -> None:
        self.mesh = FourDMesh.create(self.dims, timeout=self._timeout)
        super().setup(trainer)

    def configure_ddp(self) -> None:
        # No DistributedDataParallel wrapper: gradients are reduced by backward() below.
        self._apply()

    def model_to_device(self) -> None:
        super().model_to_device()
        trainer = getattr(self.lightning_module, "trainer", None)
        if trainer is not None and trainer.state.fn != TrainerFn.FITTING:
            self._apply()

    def _apply(self) -> None:
        if self._split or self.mesh is None:
            return
        module = self.lightning_module
        _broadcast(module)  # one initial model on every process: rank 0's
        if math.prod(self.grid) == 1:
            return  # data parallel only: every model runs whole
        for parent, name, child in _splittable_children(module):
            if isinstance(child, ScaleGNN):
                split = Grid3DScaleGNN(child, self.mesh, seed=self.seed, gather_output=True,
                                       bf16_comm=self.bf16_comm)
            else:
                split = Grid3DGCN(child, self.mesh, seed=self.seed, bf16_comm=self.bf16_comm)
            setattr(parent, name, split.to(self.root_device))
            self._split.append((parent, name, child, split))
        held = {id(p) for *_, split in self._split for p in split.parameters()}
        others = [n for n, p in module.named_parameters() if id(p) not in held]
        if others:
            self._revert(gather=False)
            raise TypeError(
                f"FourDStrategy(grid={self.grid}) splits ScaleGNN and torch_geometric GCN "
                f"models over the grid; these parameters are outside them: "
                f"{', '.join(others[:8])}{' ...' if len(others) > 8 else ''}. Their gradients "
                "would be wrong on a grid: put every layer inside the split model, or train "
                "with grid=(1, 1, 1)")

    def _revert(self, gather: bool = True) -> None:
        for parent, name, child, split in reversed(self._split):
            if gather:  # a collective over the grid
                child.load_state_dict(split.full_state_dict())
            setattr(parent, name, child)
        self._split = []

    def batch_to_device(self, batch: Any, device: Optional[torch.device] = None,
                        dataloader_idx: int = 0) -> Any:
        batch = super().batch_to_device(batch, device, dataloader_idx)
        if isinstance(batch, BaseData):  # precision plugins convert collections, not Data
            convert = self.precision_plugin.convert_input
            batch = batch.apply(lambda t: convert(t) if t.is_floating_point() else t)
        return batch

    # -- gradients --------------------------------------------------------------------------
    def backward(self, closure_loss: Tensor, optimizer: Optional[Any], *args: Any,
                 **kwargs: Any) -> Tensor:
        params = [p for p in self.lightning_module.parameters() if p.requires_grad]
        # Only what this backward adds is reduced (a second manual_backward before the step
        # must not reduce the first one again).
        earlier = [p.grad for p in params]
        for p in params:
            p.grad = None
        super().backward(closure_loss, optimizer, *args, **kwargs)
        self._reduce_gradients(params)
        for p, old in zip(params, earlier):
            if old is not None:
                p.grad = old if p.grad is None else old + p.grad
        return closure_loss

    def _reduce_gradients(self, params: List[Tensor]) -> None:
        assert self.mesh is not None
        split = set()
        for _, _, _, module in self._split:
            module.reduce_gradients()
            split.update(id(p) for p in module.parameters())
        group, replicas = self.mesh.group("dp"), self.mesh.size("dp")
        for p in params:
            if id(p) in split or p.grad is None or replicas == 1:
                continue
            p.grad.copy_(summed(p.grad, group) / replicas)

    # -- checkpoints --------------------------------------------------------------------------
    def lightning_module_state_dict(self) -> Dict[str, Any]:
        state = self.lightning_module.state_dict()
        names = {id(m): n for n, m in self.lightning_module.named_modules()}
        for _, _, _, split in self._split:
            prefix = names[id(split)] + "."
            state = {k: v for k, v in state.items() if not k.startswith(prefix)}
            state.update({prefix + k: v for k, v in split.full_state_dict().items()})
        return state

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        # Restore into the set-up model (in its precision, already split; the optimizer
        # already holds the split parameters), not into the module before setup.
        return True

    def load_model_state_dict(self, checkpoint: Dict[str, Any], strict: bool = True) -> None:
        if not self._split:
            return super().load_model_state_dict(checkpoint, strict=strict)
        state = dict(checkpoint["state_dict"])
        names = {id(m): n for n, m in self.lightning_module.named_modules()}
        for _, _, _, split in self._split:
            prefix = names[id(split)] + "."
            split.load_full_state_dict({k[len(prefix):]: v for k, v in state.items()
                                        if k.startswith(prefix)})
            state = {k: v for k, v in state.items() if not k.startswith(prefix)}
        missing, unexpected = self.lightning_module.load_state_dict(state, strict=False)
        missing = [k for k in missing
                   if not any(k.startswith(names[id(s)] + ".") for *_, s in self._split)]
        if strict and (missing or unexpected):
            raise RuntimeError(f"checkpoint does not match the model: missing {missing}, "
                               f"unexpected {unexpected}")

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
        if self._split:
            # While an exception unwinds (a peer may be gone) no collective: the modules are
            # put back without gathering the trained blocks.
            self._revert(gather=sys.exc_info()[0] is None)
        super().teardown()

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        if "4d" not in strategy_registry:
            strategy_registry.register(
                "4d", cls, description="ScaleGNN 4-D mini-batch training (lightning-fullgraph)")


def _splittable_children(module: torch.nn.Module):
    from torch_geometric.nn.models import GCN

    found = []
    for parent in module.modules():
        for name, child in parent.named_children():
            if isinstance(child, ScaleGNN):
                found.append((parent, name, child))
            elif isinstance(child, GCN):
                check_convertible(child, name)  # refuses what cannot be split, by name
                found.append((parent, name, child))
    return found


@torch.no_grad()
def _broadcast(module: torch.nn.Module) -> None:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for tensor in list(module.parameters()) + list(module.buffers()):
        dist.broadcast(tensor.data, src=0)


FourDStrategy.register_strategies(StrategyRegistry)
