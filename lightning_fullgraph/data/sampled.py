r"""Mini-batches of ScaleGNN's uniform vertex sampling, as a Lightning data module."""
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, Optional

import lightning.pytorch as pl
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data

from ..parallel.sampling import SampledSubgraph, UniformVertexSampler

__all__ = ["SampledNodeDataModule"]

_NODE_KEYS = ("x", "y", "train_mask", "val_mask", "test_mask")


class SampledNodeDataModule(pl.LightningDataModule):
    r"""Training mini-batches drawn by :class:`~lightning_fullgraph.parallel.UniformVertexSampler`
    (no communication), evaluation on the whole graph.

    Each training batch is a :class:`~torch_geometric.data.Data` with the sampled nodes'
    ``x``, ``y`` and masks, the induced ``edge_index`` and the rescaled normalized
    ``edge_weight`` (feed it to layers that do not normalize again, e.g.
    ``GCNConv(normalize=False)`` or :class:`~lightning_fullgraph.parallel.ScaleGNN`), and
    ``n_id`` (global ids).  Under :class:`~lightning_fullgraph.strategies.FourDStrategy` each
    data-parallel replica draws its own batches; the processes of a replica draw the same.  The
    next batch is drawn in a background thread while the current one trains.  The step counter
    is saved in checkpoints, so a resumed run draws the batches it would have drawn.

    Args:
        data (Data): The graph (``x``, ``edge_index``, ``y``, masks).
        batch_size (int): Vertices per step.
        steps_per_epoch (int, optional): Default :math:`\lceil N / B \rceil`.
        seed (int): Sampling seed shared by every process.
        prefetch (bool): Draw the next batch in the background.
    """

    def __init__(self, data: Data, batch_size: int, steps_per_epoch: Optional[int] = None,
                 seed: int = 0, prefetch: bool = True) -> None:
        super().__init__()
        if data.edge_index is None or data.num_nodes is None:
            raise ValueError("SampledNodeDataModule needs a graph with edge_index and nodes")
        self.data = data
        self.sampler = UniformVertexSampler(data.edge_index, data.num_nodes, batch_size,
                                            seed=seed, edge_weight=getattr(data, "edge_weight",
                                                                           None))
        n = int(data.num_nodes)
        self.steps_per_epoch = int(steps_per_epoch) if steps_per_epoch else -(-n // batch_size)
        if self.steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
        self.prefetch = bool(prefetch)
        self.step = 0  # next training step to draw (checkpointed)
        self._replica: Optional[int] = None
        # Seconds spent drawing batches, and seconds the training loop waited for one (with
        # prefetch, drawing overlaps training: 1 - wait / sample is the hidden share).
        self.sample_seconds = 0.0
        self.wait_seconds = 0.0

    @property
    def replica(self) -> int:
        r"""This process's data-parallel replica: set by hand (Fabric, plain
        ``torch.distributed``), else from the trainer's strategy; 0 without either."""
        if self._replica is not None:
            return self._replica
        trainer = getattr(self, "trainer", None)
        mesh = getattr(getattr(trainer, "strategy", None), "mesh", None)
        return mesh.coordinate("dp") if mesh is not None else 0

    @replica.setter
    def replica(self, value: int) -> None:
        self._replica = int(value)

    def batch(self, sub: SampledSubgraph) -> Data:
        r"""The :class:`Data` of a sampled subgraph."""
        out = Data(edge_index=sub.edge_index, edge_weight=sub.edge_weight, n_id=sub.nodes,
                   num_nodes=sub.num_nodes)
        for key in _NODE_KEYS:
            value = getattr(self.data, key, None)
            if value is not None:
                out[key] = value[sub.nodes]
        return out

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
        return DataLoader(_Once(self.batch(self.sampler.full())), batch_size=None)

    def state_dict(self) -> Dict[str, Any]:
        return {"step": self.step, "batch_size": self.sampler.batch_size,
                "seed": self.sampler.seed}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if (state.get("batch_size"), state.get("seed")) != (self.sampler.batch_size,
                                                             self.sampler.seed):
            raise ValueError(
                f"the checkpoint was trained with batch_size={state.get('batch_size')}, "
                f"seed={state.get('seed')}; this data module has batch_size="
                f"{self.sampler.batch_size}, seed={self.sampler.seed}: resume with the same")
        self.step = int(state["step"])


class _Steps(IterableDataset):
    def __init__(self, module: SampledNodeDataModule) -> None:
        self.module = module

    def __len__(self) -> int:
        return self.module.steps_per_epoch

    def __iter__(self) -> Iterator[Data]:
        module, replica = self.module, self.module.replica

        def draw(step: int) -> Data:
            start = time.perf_counter()
            batch = module.batch(module.sampler.sample(step, replica))
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
