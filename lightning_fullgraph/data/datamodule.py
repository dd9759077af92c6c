"""``FullGraphDataModule``: one graph in, one rank-local partition per process out.

The data module partitions the graph once (on local rank 0 of every node, in
``prepare_data``; the result is cached on disk by graph fingerprint, number of
parts and options) and then every rank loads only its own partition in
``setup``.  Each dataloader yields that rank-local graph as a single PyG
:class:`~torch_geometric.data.Data` batch, like PyG's
``LightningNodeData(loader="full")`` does for the whole graph on one device.
"""
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data

__all__ = ["FullGraphDataModule"]

# Our one-batch iterable has an exact length; Lightning's caution about iterable
# datasets with __len__ under multi-worker loading does not apply to it.
warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


def _identity(batch: Any) -> Any:
    return batch


class _OneGraph(IterableDataset):
    # Iterable on purpose: Lightning never wraps iterable datasets in a
    # DistributedSampler, which would split this single batch across ranks.
    def __init__(self, data: Data) -> None:
        self.data = data

    def __iter__(self) -> Iterator[Data]:
        yield self.data

    def __len__(self) -> int:
        return 1


class FullGraphDataModule(pl.LightningDataModule):
    r"""Serves the rank-local partition of one graph to every process.

    Args:
        data (Data or str): A PyG :class:`~torch_geometric.data.Data` with
            ``x``, ``edge_index``, ``y`` and node masks, a dataset name
            (``"cora"``, ``"synthetic:nodes=100000,degree=10"``, see
            :func:`~lightning_fullgraph.data.load_dataset`), or the directory of
            partitions written by ``lightning-fullgraph partition``.
        num_parts (int, optional): Number of parts (default: the world size;
            anything else is an error at load time).
        cache_dir (str, optional): Root of the partition cache (default:
            ``$LIGHTNING_FULLGRAPH_CACHE`` or ``~/.cache/lightning_fullgraph``).
        seed (int): METIS seed.
        validate (bool): Check the graph (NaN features, labels out of range,
            masks, ...) before partitioning.
        num_classes (int, optional): Number of classes: labels are checked against it
            before partitioning (without it, it is inferred as the largest label + 1).
        transform (Callable, optional): Applied to the global graph before it is
            validated and partitioned (e.g. ``torch_geometric.transforms.NormalizeFeatures()``),
            as PyG datasets apply ``transform``; its result decides the partition cache key.
        hosts (int or str, optional): Host-aware partitioning: split the graph into
            :obj:`hosts` parts first, then each into ``world // hosts`` ranks
            (ranks numbered host-major, as Lightning numbers them across nodes), so
            fewer rows cross machines; must divide the number of parts.
            ``"auto"`` (default) takes the trainer's ``num_nodes`` when it divides the
            number of parts; :obj:`None` or ``1``: flat METIS.

    Only local rank 0 of each node loads the global graph when :obj:`data` is a
    name or path, and it drops it once the partitions are written: during
    training no rank holds the whole graph.
    """

    def __init__(self, data: Union[Data, str, os.PathLike], num_parts: Optional[int] = None,
                 cache_dir: Optional[str] = None, seed: int = 0, validate: bool = True,
                 num_classes: Optional[int] = None,
                 transform: Optional[Callable[[Data], Data]] = None,
                 hosts: Union[int, str, None] = "auto") -> None:
        super().__init__()
        if hosts is not None and hosts != "auto" and (
                not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1):
            raise ValueError(f"hosts must be 'auto', None or a positive int, got {hosts!r}")
        self.hosts = hosts
        self._data = data if isinstance(data, Data) else None
        self._source = None if isinstance(data, Data) else str(data)
        self.num_parts = num_parts
        self.cache_dir = cache_dir
        self.seed = seed
        self.validate = validate
        self.num_classes_arg = num_classes
        self.transform = transform
        self._num_classes: Optional[int] = None
        self.partition_dir: Optional[Path] = None
        self.partition = None  # LocalPartition of this rank after setup()
        self._local: Optional[Data] = None

    # -- where am I ---------------------------------------------------------------
    def _rank_world(self):
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            return trainer.global_rank, trainer.world_size
        if dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def _global_graph(self) -> Data:
        if self._data is not None:
            data = self._data
        else:
            from . import load_dataset
            data = load_dataset(self._source)
        return self.transform(data.clone() if data is self._data else data) \
            if self.transform is not None else data

    # -- Lightning hooks -------------------------------------------------------------
    def prepare_data(self) -> None:
        r"""Partitions the graph (or reuses the cache); runs once per node."""
        from ..partition import partition_graph
        _, world = self._rank_world()
        if self._source is not None and Path(self._source).is_dir():
            self.partition_dir = Path(self._source)
            return
        data = self._global_graph()
        if self.validate:
            from .validation import validate_graph
            validate_graph(data, num_classes=self.num_classes_arg)
        parts = self.num_parts or world
        self.partition_dir = partition_graph(data, parts, root=self.cache_dir,
                                             seed=self.seed, hosts=self._hosts(parts))

    def _hosts(self, parts: int) -> Optional[int]:
        if self.hosts != "auto":
            return self.hosts
        trainer = getattr(self, "trainer", None)
        nodes = int(getattr(trainer, "num_nodes", 1) or 1) if trainer is not None else 1
        return nodes if nodes > 1 and parts % nodes == 0 else None

    def setup(self, stage: Optional[str] = None) -> None:
        r"""Loads this rank's partition."""
        from ..partition import load_partition
        if self.partition is not None:
            return
        rank, world = self._rank_world()
        trainer = getattr(self, "trainer", None)
        if self.partition_dir is None and trainer is None and rank == 0:
            self.prepare_data()
        local = self.partition_dir
        path = str(local) if local is not None else None
        if trainer is not None:
            path = trainer.strategy.broadcast(path, src=0)
        elif dist.is_initialized():
            box = [path]
            dist.broadcast_object_list(box, src=0)
            path = box[0]
        if path is None:
            raise RuntimeError("no partition directory: prepare_data() did not run on rank 0")
        self.partition_dir = self._resolve(Path(path), local)
        self.partition = load_partition(self.partition_dir, rank, num_parts=world)
        self._local = self.partition.to_data()
        self._num_classes = self._global_num_classes()
        if self._source is not None:
            self._data = None  # the global graph is not kept past partitioning

    def _resolve(self, broadcast: Path, local: Optional[Path]) -> Path:
        # Every node partitions into its own cache (prepare_data runs on each node's local
        # rank 0), possibly under another root than rank 0's: prefer this node's copy,
        # found by the same directory name under this process's cache root.
        if local is not None:
            return local
        if self._source is not None and Path(self._source).is_dir():
            return broadcast
        from ..partition import default_cache_root
        root = Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_root()
        mine = root / broadcast.name
        return mine if (mine / "manifest.json").is_file() else broadcast

    @property
    def local_data(self) -> Data:
        r"""This rank's graph (owned nodes, local edges with halo sources)."""
        if self._local is None:
            raise RuntimeError("call setup() first")
        return self._local

    @property
    def num_features(self) -> int:
        r"""Node feature width."""
        return int(self.local_data.x.size(-1))

    @property
    def num_classes(self) -> int:
        r"""Number of classes over the whole graph (largest label + 1, all ranks)."""
        if self._num_classes is None:
            raise RuntimeError("call setup() first")
        return self._num_classes

    def _global_num_classes(self) -> Optional[int]:
        y = self.local_data.get("y")
        if y is None or y.is_floating_point():
            return None
        if self.num_classes_arg is not None:
            return self.num_classes_arg
        top = torch.tensor([int(y.max()) + 1 if y.numel() else 0])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return int(top)

    def _loader(self) -> DataLoader:
        return DataLoader(_OneGraph(self.local_data), batch_size=None, collate_fn=_identity)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()

    def predict_dataloader(self) -> DataLoader:
        return self._loader()
