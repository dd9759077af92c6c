"""Full-graph training in a Fabric script (``fabric run`` or ``Fabric(...).launch()``).

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
        engine.backward(F.cross_entropy(out[data.train_mask], data.y[data.train_mask]))
        optimizer.step()
"""
from pathlib import Path
from typing import Any, Iterable, Optional, Type, Union

import torch
from torch_geometric.data import Data

from .engine import Codec, FullGraphEngine

__all__ = ["launch", "setup_fullgraph"]


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
                    kernels: Optional[str] = "auto", codec: Optional[Codec] = None,
                    trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                    loss_mask: str = "train_mask",
                    timeout: Optional[float] = None,
                    aggregation: str = "hybrid", cache: Any = None,
                    pipeline: Any = None, boundary_sampling: Any = None) -> FullGraphEngine:
    r"""Partitions :obj:`data` (once, on rank 0), loads this rank's part and attaches
    :obj:`model` to it.

    Args:
        fabric (lightning.fabric.Fabric): A launched Fabric.
        model (torch.nn.Module): The PyG model, unmodified; moved to Fabric's device.
        data (Data or str): The graph, a dataset name, or a partition directory.
        cache_dir (str, optional): Partition cache root.
        seed (int): METIS seed.
        kernels (str, optional): Aggregation backend; ``None`` keeps PyG's path.
        codec (Codec, optional): Wire codec of the halo exchange.
        trusted_layers (Iterable[type]): Extra layer classes declared exact.
        loss_mask (str): Mask whose mean the loss is.
        timeout (float, optional): Collective timeout (seconds) of the engine's own
            process group; Fabric's group (start-up, its collectives) keeps its timeout.
        aggregation (str): ``"hybrid"`` (default), ``"post"`` or ``"pre"`` (see
            :class:`~lightning_fullgraph.engine.FullGraphEngine`).
        cache (HaloCache, float or str, optional): Adaptive halo cache of training
            exchanges (:class:`~lightning_fullgraph.engine.HaloCache`; default none).
        pipeline (AsyncPipeline or str, optional): Asynchronous halo pipeline
            (:class:`~lightning_fullgraph.engine.AsyncPipeline`, ``"async"``; default none).
        boundary_sampling (float, optional): Kept fraction of halo nodes per training step
            (:class:`~lightning_fullgraph.engine.BoundarySampling`; default none).

    Returns:
        The :class:`~lightning_fullgraph.engine.FullGraphEngine`; its ``data`` is the
        rank-local graph on Fabric's device.
    """
    from .partition import load_partition, partition_graph
    path = None
    if fabric.global_rank == 0:
        if isinstance(data, (str, Path)) and Path(data).is_dir():
            path = str(data)
        else:
            if not isinstance(data, Data):
                from .data import load_dataset
                data = load_dataset(str(data))
            nodes = int(getattr(fabric, "num_nodes", 1) or 1)
            hosts = nodes if nodes > 1 and fabric.world_size % nodes == 0 else None
            path = str(partition_graph(data, fabric.world_size, root=cache_dir, seed=seed,
                                       hosts=hosts))
    path = fabric.broadcast(path, src=0)
    partition = load_partition(path, fabric.global_rank, num_parts=fabric.world_size)
    group = None
    if timeout is not None and fabric.world_size > 1:
        import torch.distributed as dist
        from datetime import timedelta
        group = dist.new_group(timeout=timedelta(seconds=float(timeout)))
    engine = FullGraphEngine(partition, group=group, codec=codec, cache=cache,
                             pipeline=pipeline, sampling=boundary_sampling,
                             loss_mask=loss_mask, timeout=timeout,
                             aggregation=aggregation)
    model.to(fabric.device)
    engine.to(fabric.device)
    engine.attach(model, trusted_layers=trusted_layers)
    engine.use_kernels(kernels)
    return engine
