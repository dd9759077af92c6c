r"""Mini-batches of ScaleGNN's uniform vertex sampling, as Lightning data modules: the
whole graph on every process (:class:`SampledNodeDataModule`), or each process of a grid
holding only its shards of it (:class:`ShardedNodeDataModule`)."""
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Union

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data

from ..parallel.sampling import SampledSubgraph, UniformVertexSampler

__all__ = ["SampledNodeDataModule", "ShardedNodeDataModule"]

_NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask")


class _SampledBatches(pl.LightningDataModule):
    r"""What both sampled data modules share: the step counter (checkpointed), the replica,
    prefetching, and the loaders (:meth:`draw` a training batch, :meth:`full_batch` for
    evaluation)."""

    def __init__(self, steps_per_epoch: Optional[int], prefetch: bool) -> None:
        super().__init__()
        if steps_per_epoch is not None and int(steps_per_epoch) < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self._steps_per_epoch = int(steps_per_epoch) if steps_per_epoch else None
        self.prefetch = bool(prefetch)
        self.step = 0  # next training step to draw (checkpointed)
        self._replica: Optional[int] = None
        # Seconds spent drawing batches, and seconds the training loop waited for one (with
        # prefetch, drawing overlaps training: 1 - wait / sample is the hidden share).
        self.sample_seconds = 0.0
        self.wait_seconds = 0.0

    batch_size: int
    seed: int
    num_nodes: int

    @property
    def steps_per_epoch(self) -> int:
        r"""Training steps per epoch (default :math:`\lceil N / B \rceil`)."""
        return self._steps_per_epoch or -(-self.num_nodes // self.batch_size)

    @property
    def replica(self) -> int:
        r"""This process's data-parallel replica: set by hand (Fabric, plain
        ``torch.distributed``), else from the trainer's strategy; 0 without either."""
        if self._replica is not None:
            return self._replica
        mesh = getattr(self._strategy(), "mesh", None)
        return mesh.coordinate("dp") if mesh is not None else 0

    @replica.setter
    def replica(self, value: int) -> None:
        self._replica = int(value)

    def _strategy(self):
        return getattr(getattr(self, "trainer", None), "strategy", None)

    def draw(self, step: int, replica: int) -> Data:
        raise NotImplementedError

    def full_batch(self) -> Data:
        raise NotImplementedError

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Steps(self), batch_size=None)

    def val_dataloader(self) -> DataLoader:
        return self._full()

    def test_dataloader(self) -> DataLoader:
        return self._full()

    def predict_dataloader(self) -> DataLoader:
        return self._full()

    def _full(self) -> DataLoader:
        # Iterable: every process evaluates the one whole-graph batch (no DistributedSampler).
        return DataLoader(_Once(self.full_batch()), batch_size=None)

    def state_dict(self) -> Dict[str, Any]:
        return {"step": self.step, "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if (state.get("batch_size"), state.get("seed")) != (self.batch_size, self.seed):
            raise ValueError(
                f"the checkpoint was trained with batch_size={state.get('batch_size')}, "
                f"seed={state.get('seed')}; this data module has batch_size="
                f"{self.batch_size}, seed={self.seed}: resume with the same")
        self.step = int(state["step"])


class SampledNodeDataModule(_SampledBatches):
    r"""Training mini-batches drawn by :class:`~lightning_fullgraph.parallel.UniformVertexSampler`
    (no communication), evaluation on the whole graph.

    Each training batch is a :class:`~torch_geometric.data.Data` with the sampled nodes'
    ``x``, ``y`` and masks, the induced ``edge_index`` and the rescaled normalized
    ``edge_weight`` (feed it to layers that do not normalize again, e.g.
    ``GCNConv(normalize=False)`` or :class:`~lightning_fullgraph.parallel.ScaleGNN`), and
    ``n_id`` (global ids).  Under :class:`~lightning_fullgraph.strategies.FourDStrategy` each
    data-parallel replica draws its own batches; the processes of a replica draw the same.  The
    next batch is drawn in a background thread while the current one trains.  The step counter
    is saved in checkpoints, so a resumed run draws the batches it would have drawn.  Every
    process holds the whole graph: :class:`ShardedNodeDataModule` holds only its shards.

    Args:
        data (Data): The graph (``x``, ``edge_index``, ``y``, masks).
        batch_size (int): Vertices per step.
        steps_per_epoch (int, optional): Default :math:`\lceil N / B \rceil`.
        seed (int): Sampling seed shared by every process.
        prefetch (bool): Draw the next batch in the background.
        strata (int): Stratify the sample over this many vertex ranges
            (:class:`~lightning_fullgraph.parallel.UniformVertexSampler`); with the grid's
            size, the batches of :class:`ShardedNodeDataModule`.
    """

    def __init__(self, data: Data, batch_size: int, steps_per_epoch: Optional[int] = None,
                 seed: int = 0, prefetch: bool = True, strata: int = 1) -> None:
        super().__init__(steps_per_epoch, prefetch)
        if data.edge_index is None or data.num_nodes is None:
            raise ValueError("SampledNodeDataModule needs a graph with edge_index and nodes")
        self.data = data
        self.sampler = UniformVertexSampler(data.edge_index, data.num_nodes, batch_size,
                                            seed=seed, strata=strata,
                                            edge_weight=getattr(data, "edge_weight", None))

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @property
    def num_nodes(self) -> int:
        return int(self.data.num_nodes)

    def draw(self, step: int, replica: int) -> Data:
        return self.batch(self.sampler.sample(step, replica))

    def full_batch(self) -> Data:
        return self.batch(self.sampler.full())

    def batch(self, sub: SampledSubgraph) -> Data:
        r"""The :class:`Data` of a sampled subgraph."""
        out = Data(edge_index=sub.edge_index, edge_weight=sub.edge_weight, n_id=sub.nodes,
                   num_nodes=sub.num_nodes)
        for key in _NODE_KEYS:
            value = getattr(self.data, key, None)
            if value is not None:
                out[key] = value[sub.nodes]
        return out


class ShardedNodeDataModule(_SampledBatches):
    r""":class:`SampledNodeDataModule`'s batches where every process of a grid holds only
    its shards of the graph (ScaleGNN Alg. 2; :mod:`~lightning_fullgraph.parallel.shards`):
    the tiles of the adjacency blocks its layers multiply and its block of the features,
    loaded from the shards written once under :obj:`root`.  A training batch carries this
    process's input block as ``x`` (the split model knows it:
    :class:`~lightning_fullgraph.strategies.FourDStrategy` binds it), the edges of its
    adjacency blocks, and the batch's ``y`` and masks whole; evaluation runs on the whole
    graph the same way.  The sample is stratified over the grid's vertex ranges
    (:func:`~lightning_fullgraph.parallel.sampling.stratified_nodes`), so the batches differ
    from :class:`SampledNodeDataModule`'s and equal those of
    ``UniformVertexSampler(strata=x * y * z)``.

    Args:
        root (str or Path): Directory of the shards (one subdirectory per grid size).
        data (Data or callable, optional): The graph, or a function returning it, for local
            rank 0 of each node to cut in ``prepare_data``.  A graph in memory is checked
            against existing shards (an edited graph is refused by its fingerprint); a
            function is called only when the shards for this grid size are missing, so it
            must return the same graph for the same :obj:`root` (the CLI keys the root by the
            data set spec).  Without it the shards must exist
            (:func:`~lightning_fullgraph.parallel.shards.write_shards`).
        batch_size (int, optional): Vertices per step (default: half the graph).
        steps_per_epoch (int, optional): Default :math:`\lceil N / B \rceil`.
        seed (int): Sampling seed shared by every process.
        prefetch (bool): Draw the next batch in the background.

    Example::

        datamodule = ShardedNodeDataModule("shards/", data=lambda: load_dataset("cora"))
        trainer = Trainer(strategy=FourDStrategy(grid=(2, 2, 1)), devices=4)
        trainer.fit(NodeClassifier(gcn_factory), datamodule=datamodule)
    """

    def __init__(self, root: Union[str, Path], data: Optional[Union[Data, Callable[[], Data]]]
                 = None, batch_size: Optional[int] = None,
                 steps_per_epoch: Optional[int] = None, seed: int = 0,
                 prefetch: bool = True) -> None:
        super().__init__(steps_per_epoch, prefetch)
        self.root, self._data, self.seed = Path(root).expanduser(), data, int(seed)
        self._batch_size = None if batch_size is None else int(batch_size)
        self._meta: Optional[dict] = None
        self.shard = None  # this process's GraphShard, loaded with the first loader
        self.plan = None  # what it holds (set by hand outside a FourDStrategy)
        self._plan_from_strategy = False

    @property
    def parts(self) -> int:
        r"""Processes per grid: the shards' vertex ranges."""
        if self.plan is not None:
            return self.plan.parts
        return math.prod(getattr(self._strategy(), "grid", (1, 1, 1)))

    def prepare_data(self) -> None:
        from ..parallel.shards import read_meta, write_shards
        # A Data is callable too (it iterates its attributes): only a function is called.
        if isinstance(self._data, Data):
            # In memory already: write_shards checks that existing shards were cut from it
            # (an edited graph is refused, not trained on stale shards).
            write_shards(self._data, self.root, self.parts)
            return
        if read_meta(self.root, self.parts) is not None:
            return  # a function is not called (the graph is not loaded) once they exist
        if self._data is None:
            raise FileNotFoundError(
                f"no shards for a grid of {self.parts} processes under {self.root}, and no "
                "data to write them from: pass data= (the graph or a function returning it)")
        write_shards(self._data(), self.root, self.parts)

    @property
    def meta(self) -> dict:
        if self._meta is None:
            from ..parallel.shards import read_meta
            self._meta = read_meta(self.root, self.parts)
            if self._meta is None:
                raise FileNotFoundError(
                    f"no shards for a grid of {self.parts} processes under {self.root}: "
                    "prepare_data writes them (from data=)")
        return self._meta

    @property
    def num_nodes(self) -> int:
        return int(self.meta["num_nodes"])

    @property
    def num_features(self) -> int:
        return int(self.meta["num_features"])

    @property
    def num_classes(self) -> Optional[int]:
        return self.meta["num_classes"]

    @property
    def batch_size(self) -> int:
        return self._batch_size or max(2, self.num_nodes // 2)

    def _load(self):
        from ..parallel.shards import GraphShard, ShardPlan
        plan = self.plan
        if plan is None or self._plan_from_strategy:
            # Asked again at every loader: another fit may split the model otherwise.
            strategy = self._strategy()
            plan = strategy.shard_plan() if hasattr(strategy, "shard_plan") else \
                ShardPlan({"x": 1, "y": 1, "z": 1}, {"x": 0, "y": 0, "z": 0})
            self._plan_from_strategy = True
        if self.shard is None or self.shard.plan != plan:
            self.plan, self.shard = plan, None  # the old tiles go before the new ones load
            self.shard = GraphShard(self.root, plan)
        return self.shard

    def train_dataloader(self) -> DataLoader:
        self._load()  # here, on the main thread, before the first batch is drawn
        return super().train_dataloader()

    def draw(self, step: int, replica: int) -> Data:
        shard = self.shard if self.shard is not None else self._load()
        return shard.sample(step, replica, self.batch_size, self.seed)

    def full_batch(self) -> Data:
        return self._load().full()


class _Steps(IterableDataset):
    def __init__(self, module: _SampledBatches) -> None:
        self.module = module

    def __len__(self) -> int:
        return self.module.steps_per_epoch

    def __iter__(self) -> Iterator[Data]:
        module, replica = self.module, self.module.replica

        def draw(step: int) -> Data:
            start = time.perf_counter()
            batch = module.draw(step, replica)
            module.sample_seconds += time.perf_counter() - start
            return batch

        first = module.step
        last = first + module.steps_per_epoch
        if not module.prefetch:
            for step in range(first, last):
                start = time.perf_counter()
                batch = draw(step)
                module.wait_seconds += time.perf_counter() - start
                module.step = step + 1
                yield batch
            return
        with ThreadPoolExecutor(max_workers=1) as pool:
            ahead = pool.submit(draw, first)
            for step in range(first, last):
                start = time.perf_counter()
                batch = ahead.result()
                module.wait_seconds += time.perf_counter() - start
                if step + 1 < last:  # the next step's batch, while this one trains
                    ahead = pool.submit(draw, step + 1)
                module.step = step + 1
                yield batch


class _Once(IterableDataset):
    def __init__(self, item: Data) -> None:
        self.item = item

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[Data]:
        yield self.item
