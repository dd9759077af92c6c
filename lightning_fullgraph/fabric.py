"""Full-graph and 4-D training in a Fabric script (``fabric run`` or ``Fabric(...).launch()``).

Fabric launches the processes and owns the process group; the engine does the
rest.  The model is *not* passed through ``fabric.setup`` (that would wrap it in
DistributedDataParallel, whose gradient averaging is wrong for partitions)::

    fabric = Fabric(accelerator="cpu", devices=4)
    fabric.launch()
    engine = setup_fullgraph(fabric, model, "cora")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data = engine.data
    for epoch in range(200):
        optimizer.zero_grad()
        out = model(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        fabric.backward(loss)  # or loss.backward(), or engine.backward(loss)
        optimizer.step()

All three backward calls give the single-process gradient on every rank: the engine's
gradient hooks weight the model output's gradient by the rank's share of the loss and average
the parameter gradients over the ranks (see :class:`~.engine.gradients.BackwardHooks`).
``engine.backward(loss)`` weights the loss itself, so it also covers loss terms that do not
come from the model's output; a backward that reaches the model's parameters without passing
through its output is refused on every rank
(:class:`~.engine.gradients.UnreducedBackwardError`).

ScaleGNN's 4-D mini-batch training the same way (:func:`setup_fourd`; the model is split over
the grid in place, and not passed through ``fabric.setup`` either)::

    run = setup_fourd(fabric, model, "cora", batch_size=1024, grid=(2, 1, 1))
    model = run.model  # the split model (a model split as a whole is replaced)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(100):
        for batch in run.train_batches():
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, batch.edge_weight)
            run.backward(F.cross_entropy(out[batch.train_mask], batch.y[batch.train_mask]))
            optimizer.step()
"""
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Mapping, Optional, Tuple, Type, Union

import torch
from torch_geometric.data import Data

from ._at_exit import close_process_group_at_exit
from .engine import ExchangeConfig, FullGraphEngine
from .engine.config import refuse_moved_arguments
from .kernels.config import KernelConfig

__all__ = ["launch", "setup_fullgraph", "setup_fourd", "FourDRun"]


def launch(fabric: Any) -> Any:
    r"""``fabric.launch()`` unless ``fabric run`` already created the processes.

    One script then works both as ``fabric run ... script.py`` and as
    ``python script.py`` with devices set in code.
    """
    from .compat import fabric_is_using_cli
    if not fabric_is_using_cli():
        fabric.launch()
    return fabric


def setup_fullgraph(fabric: Any, model: torch.nn.Module, data: Union[Data, str, Path],
                    cache_dir: Optional[str] = None, seed: int = 0,
                    kernels: Union[None, str, KernelConfig, Mapping[str, Any]] = "auto",
                    exchange: Union[None, ExchangeConfig, Mapping[str, Any]] = None,
                    trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                    loss_mask: str = "train_mask", loss_reduction: str = "mean",
                    timeout: Optional[float] = None, **moved: Any) -> FullGraphEngine:
    r"""Partitions :obj:`data` (once, on rank 0), loads this rank's part and attaches
    :obj:`model` to it.  Train with ``fabric.backward(loss)``, ``loss.backward()`` or
    ``engine.backward(loss)`` (the same gradients; see the module docstring).

    Args:
        fabric (lightning.fabric.Fabric): A launched Fabric.
        model (torch.nn.Module): The PyG model, unmodified; moved to Fabric's device.
        data (Data or str): The graph, a dataset name, or a partition directory.
        cache_dir (str, optional): Partition cache root.
        seed (int): METIS seed.
        kernels (str, KernelConfig or dict, optional): How aggregations and dense maps run
            (:class:`~lightning_fullgraph.kernels.KernelConfig`, as in
            :class:`~lightning_fullgraph.FullGraphStrategy`): a backend name, ``None`` for
            PyG's path.  Its ``num_threads`` and ``huge_pages``, where given, are set for the
            script's process (a Fabric script owns it) before the partition is loaded.
        exchange (ExchangeConfig or dict, optional): How halo rows cross the wire
            (:class:`~lightning_fullgraph.engine.ExchangeConfig`; default exact, hybrid
            aggregation, overlap and step aside on, as in
            :class:`~lightning_fullgraph.FullGraphStrategy`).
        trusted_layers (Iterable[type]): Extra layer classes declared exact.
        loss_mask (str): Mask whose mean the loss is.
        loss_reduction (str): ``"mean"`` (the loss is a mean over :obj:`loss_mask`) or
            ``"sum"`` (a sum over the rank's nodes).
        timeout (float, optional): Collective timeout (seconds) of the engine's own
            process group; Fabric's group (start-up, its collectives) keeps its timeout.

    Returns:
        The :class:`~lightning_fullgraph.engine.FullGraphEngine`; its ``data`` is the
        rank-local graph on Fabric's device.
    """
    from lightning.fabric.utilities.rank_zero import rank_zero_info

    from .data.validation import check_no_sparse_adjacency
    refuse_moved_arguments("setup_fullgraph", moved)
    if moved:
        raise TypeError(f"setup_fullgraph got unexpected keyword argument(s) {sorted(moved)}")
    exchange = ExchangeConfig.of(exchange)  # checked before anything is partitioned
    kernels = KernelConfig.of(kernels)
    close_process_group_at_exit()
    if kernels.num_threads is not None:  # asked for: the script's process
        torch.set_num_threads(int(kernels.num_threads))
    if kernels.huge_pages is not None and kernels.backend in ("auto", "cpp") \
            and fabric.device.type == "cpu":  # before the partition's features are loaded
        from .kernels import huge_pages
        huge_pages.enable_for_kernels(kernels.huge_pages)
    from .partition import load_partition, partition_graph
    if isinstance(data, Data):
        check_no_sparse_adjacency(data)  # on every rank, before any collective
    path, failure = None, None
    if fabric.global_rank == 0:
        try:
            if isinstance(data, (str, Path)) and Path(data).is_dir():
                path = str(data)
            else:
                if not isinstance(data, Data):
                    from .data import load_dataset
                    data = load_dataset(str(data))
                nodes = int(getattr(fabric, "num_nodes", 1) or 1)
                hosts = nodes if nodes > 1 and fabric.world_size % nodes == 0 else None
                path = str(partition_graph(data, fabric.world_size, root=cache_dir, seed=seed,
                                           hosts=hosts, progress=rank_zero_info))
        except Exception as error:  # told to the other ranks, which would wait forever
            failure = error
    path, reason = fabric.broadcast(
        (path, None if failure is None else f"{type(failure).__name__}: {failure}"), src=0)
    if failure is not None:
        raise failure
    if reason is not None:
        raise RuntimeError(f"rank 0 could not partition the graph ({reason}); its own error "
                           "says more")
    partition = load_partition(path, fabric.global_rank, num_parts=fabric.world_size)
    group = None
    if timeout is not None and fabric.world_size > 1:
        import torch.distributed as dist
        from datetime import timedelta
        group = dist.new_group(timeout=timedelta(seconds=float(timeout)))
    engine = FullGraphEngine(partition, group=group, exchange=exchange, loss_mask=loss_mask,
                             timeout=timeout, loss_reduction=loss_reduction)
    model.to(fabric.device)
    engine.to(fabric.device)
    engine.attach(model, trusted_layers=trusted_layers)
    engine.use_kernels(kernels.backend)
    return engine


class FourDRun:
    r"""What :func:`setup_fourd` returns: the mesh, the model surgery and the sampled batches
    of one process of a 4-D run.

    Attributes:
        mesh (FourDMesh): This process's groups (``dp``, ``x``, ``y``, ``z``, ``grid``).
        surgery (GridSplit): The model's split (:meth:`teardown` puts the model back).
        data (SampledNodeDataModule): The sampler and whole-graph batches, for this replica.
    """

    def __init__(self, fabric: Any, holder: torch.nn.Module, mesh: Any, surgery: Any,
                 data: Any) -> None:
        # The model sits in a holder so that a model split as a whole can be replaced.
        self.fabric, self._holder, self.mesh, self.surgery, self.data = \
            fabric, holder, mesh, surgery, data

    @property
    def model(self) -> torch.nn.Module:
        r"""The module to train: the model given, or its split when it is a ScaleGNN or
        GCN itself (models inside it are split in place)."""
        return self._holder.model

    def train_batches(self) -> Iterator[Data]:
        r"""This epoch's training batches, on Fabric's device (the next one is drawn in the
        background while the current one trains)."""
        for batch in self.data.train_dataloader():
            yield batch.to(self.fabric.device)

    def eval_batch(self) -> Data:
        r"""The whole graph, for evaluation (every process evaluates all of it)."""
        return self.data.batch(self.data.sampler.full()).to(self.fabric.device)

    def backward(self, loss: torch.Tensor) -> None:
        r"""``loss.backward()``, then the gradients reduced over the grid and the replicas."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.surgery.backward(params, loss.backward)

    def state_dict(self) -> Dict[str, Any]:
        r"""The model as one process holds it (a collective over the grid), the sampler's
        step and the split models' dropout step counters, for ``fabric.save`` (save this
        process's torch random state beside it when a model outside the split draws from
        it, e.g. ``torch.nn.Dropout`` with ``grid=(1, 1, 1)``)."""
        from .parallel.surgery import grid_steps
        model = {k[len("model."):]: v for k, v in self.surgery.state_dict().items()}
        return {"model": model, "data": self.data.state_dict(),
                "grid_steps": grid_steps(self._holder)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        r"""Restores :meth:`state_dict` (a resumed run then draws the dropout masks and
        batches the uninterrupted run would)."""
        from .parallel.surgery import load_grid_steps
        self.surgery.load_state_dict({"model." + k: v for k, v in state["model"].items()})
        self.data.load_state_dict(state["data"])
        load_grid_steps(self._holder, state.get("grid_steps", {}))

    def teardown(self) -> torch.nn.Module:
        r"""Puts the original model back, with the trained weights (a collective); returns
        it."""
        self.surgery.revert(gather=True)
        return self.model


def setup_fourd(fabric: Any, model: torch.nn.Module, data: Union[Data, str], batch_size: int,
                dp: Optional[int] = None, grid: Tuple[int, int, int] = (1, 1, 1),
                seed: int = 0, bf16_comm: bool = False,
                steps_per_epoch: Optional[int] = None,
                timeout: Optional[float] = None) -> FourDRun:
    r"""Sets up ScaleGNN's 4-D training (the Fabric counterpart of
    :class:`~lightning_fullgraph.strategies.FourDStrategy`): the process groups of
    ``dp`` replicas of an ``x * y * z`` grid, :obj:`model` split over the grid (every
    :class:`~lightning_fullgraph.parallel.ScaleGNN`, PyG GCN, and module of ``GCNConv``,
    ``SAGEConv``, ``GraphConv`` or ``GINConv`` layers, as
    :class:`~lightning_fullgraph.FourDStrategy` splits them; rank 0's initial weights
    everywhere), and this replica's uniformly sampled mini-batches.

    Args:
        fabric (lightning.fabric.Fabric): A launched Fabric.
        model (torch.nn.Module): The model (moved to Fabric's device); train
            :attr:`FourDRun.model`, which is its split when the model itself is split.
        data (Data or str): The graph or a dataset name.
        batch_size (int): Vertices sampled per step.
        dp (int, optional): Data-parallel replicas (default: world size / grid size).
        grid (Tuple[int, int, int]): ``(x, y, z)`` processes per replica.
        seed (int): Sampling and dropout seed, shared by every process.
        bf16_comm (bool): bfloat16 partial sums on the wire (lossy).
        steps_per_epoch (int, optional): Default :math:`\lceil N / B \rceil`.
        timeout (float, optional): Collective timeout (seconds) of the grid's groups.
    """
    from .data.sampled import SampledNodeDataModule
    from .parallel.dims import FourDDims
    from .parallel.mesh import FourDMesh
    from .parallel.surgery import GridSplit

    close_process_group_at_exit()
    mesh = FourDMesh.create(FourDDims.for_world(fabric.world_size, grid, dp), timeout=timeout)
    if not isinstance(data, Data):
        from .data import load_dataset
        data = load_dataset(str(data))
    holder = torch.nn.Module()
    holder.model = model.to(fabric.device)
    surgery = GridSplit(holder, mesh, seed=seed, bf16_comm=bf16_comm).apply(fabric.device)
    sampled = SampledNodeDataModule(data, batch_size, steps_per_epoch, seed=seed)
    sampled.replica = mesh.coordinate("dp")
    return FourDRun(fabric, holder, mesh, surgery, sampled)
