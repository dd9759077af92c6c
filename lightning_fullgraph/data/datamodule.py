"""``FullGraphDataModule``: one graph in, one rank-local partition per process out.

The data module partitions the graph once (on local rank 0 of every node, in
``prepare_data``; the result is cached on disk by graph fingerprint, number of
parts and options) and then every rank loads only its own partition in
``setup``.  Each dataloader yields that rank-local graph as a single PyG
:class:`~torch_geometric.data.Data` batch, like PyG's
``LightningNodeData(loader="full")`` does for the whole graph on one device.

:class:`FullGraphNodeData` (made by :meth:`FullGraphDataModule.from_node_data`) does the same
for a PyG ``LightningNodeData(data, loader="full")``: it is what
:class:`~lightning_fullgraph.FullGraphStrategy` puts in place of such a data module, so a
script written for one device needs no other change than the Trainer's strategy.
"""
import copy
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Sequence, Union

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset
from torch_geometric.data import Data

__all__ = ["FullGraphDataModule", "FullGraphNodeData"]

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
        cache_dir (str, optional): Root of the partition cache (default: ``partitions/``
            in ``$LIGHTNING_FULLGRAPH_CACHE`` or ``~/.cache/lightning_fullgraph``).
        seed (int): METIS seed.
        validate (bool): Check the graph (NaN features, labels out of range,
            masks, ...) before partitioning.
        num_classes (int, optional): Number of classes: labels are checked against it
            before partitioning (without it, it is inferred as the largest label + 1).
        transform (Callable, optional): Applied to the global graph before it is
            validated and partitioned (e.g. ``torch_geometric.transforms.NormalizeFeatures()``),
            as PyG datasets apply ``transform``; its result decides the partition cache key.
        normalize_features (bool or str): Row-normalize the features of a data set given by
            name (:func:`~lightning_fullgraph.data.load_dataset`): ``"auto"`` (default) does
            for ``"cora"``, as PyG's Planetoid examples and ``lightning-fullgraph train`` do,
            and not for synthetic graphs; :obj:`True`/:obj:`False` decide. A
            :class:`~torch_geometric.data.Data` is used as given unless :obj:`True` (use
            :obj:`transform` for anything else); a partition directory keeps the features
            it was written with.
        hosts (int or str, optional): Host-aware partitioning: split the graph into
            :obj:`hosts` parts first, then each into ``world // hosts`` ranks
            (ranks numbered host-major, as Lightning numbers them across nodes), so
            fewer rows cross machines; must divide the number of parts.
            ``"auto"`` (default) takes the trainer's ``num_nodes`` when it divides the
            number of parts; :obj:`None` or ``1``: flat METIS.
        level_percentiles (Sequence[float], optional): Where the importance levels of
            boundary nodes start, for per-node bit widths (``codec="adaptive"``): three
            increasing in-degree percentiles in (0, 1) (default: quartiles); see
            :func:`~lightning_fullgraph.partition.partition_graph`.

    Only local rank 0 of each node loads the global graph when :obj:`data` is a
    name or path, and it drops it once the partitions are written: during
    training no rank holds the whole graph.
    """

    def __init__(self, data: Union[Data, str, os.PathLike], num_parts: Optional[int] = None,
                 cache_dir: Optional[str] = None, seed: int = 0, validate: bool = True,
                 num_classes: Optional[int] = None,
                 transform: Optional[Callable[[Data], Data]] = None,
                 hosts: Union[int, str, None] = "auto",
                 level_percentiles: Optional[Sequence[float]] = None,
                 normalize_features: Union[bool, str] = "auto") -> None:
        super().__init__()
        if normalize_features not in ("auto", True, False):
            raise ValueError(f"normalize_features must be 'auto', True or False, got "
                             f"{normalize_features!r}")
        self.normalize_features = normalize_features
        if level_percentiles is not None:
            from ..partition.local import check_level_percentiles
            level_percentiles = check_level_percentiles(level_percentiles)
        self.level_percentiles = level_percentiles
        if hosts is not None and hosts != "auto" and (
                not isinstance(hosts, int) or isinstance(hosts, bool) or hosts < 1):
            raise ValueError(f"hosts must be 'auto', None or a positive int, got {hosts!r}")
        self.hosts = hosts
        if isinstance(data, Data):
            # Here, on every process before any collective: one clear error, the same on
            # every rank, instead of rank 0 failing in prepare_data while its peers wait.
            from .validation import check_no_sparse_adjacency
            check_no_sparse_adjacency(data)
        self._data = data if isinstance(data, Data) else None
        self._source = None if isinstance(data, Data) else str(data)
        self.num_parts = num_parts
        self.cache_dir = cache_dir
        self.seed = seed
        self.validate = validate
        self.num_classes_arg = num_classes
        self.transform = transform
        self._num_classes: Optional[int] = None
        self._max_label: Optional[int] = None
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
            if self.normalize_features is True:
                import torch_geometric.transforms as T
                data = T.NormalizeFeatures()(data.clone())
        else:
            from . import load_dataset
            data = load_dataset(self._source, normalize_features=self.normalize_features)
        return self.transform(data.clone() if data is self._data else data) \
            if self.transform is not None else data

    # -- Lightning hooks -------------------------------------------------------------
    def prepare_data(self) -> None:
        r"""Partitions the graph (or reuses the cache); runs once per node."""
        from ..partition import partition_graph
        _, world = self._rank_world()
        if self._source is not None and Path(self._source).is_dir():
            if self.level_percentiles is not None:
                raise ValueError(
                    f"level_percentiles={list(self.level_percentiles)} cannot apply to the "
                    f"partition directory {self._source}: its levels were fixed when it was "
                    "written; re-partition with the percentiles (`lightning-fullgraph "
                    "partition --level-percentiles ...`) or pass the dataset instead")
            if self.normalize_features != "auto":
                raise ValueError(
                    f"normalize_features={self.normalize_features} cannot apply to the "
                    f"partition directory {self._source}: its features were fixed when it "
                    "was written; re-partition (`lightning-fullgraph partition "
                    "--normalize-features yes|no`) or pass the dataset instead")
            # Every rank's file and the labels, here on one process: an error found by one
            # rank's load in setup would reach the user from that rank only, after its
            # peers started waiting for it.
            from ..partition import check_partition
            check_partition(self._source, self.num_parts or world,
                            num_classes=self.num_classes_arg if self.validate else None)
            self.partition_dir = Path(self._source)
            return
        data = self._global_graph()
        if self.validate:
            from .validation import validate_graph
            validate_graph(data, num_classes=self.num_classes_arg)
        parts = self.num_parts or world
        # Lines of a partitioning that runs, once, at Lightning's info level; the reuse of a
        # cached partition (every fit/test/predict) is only logged.
        from lightning.pytorch.utilities import rank_zero_info
        self.partition_dir = partition_graph(data, parts, root=self.cache_dir,
                                             seed=self.seed, hosts=self._hosts(parts),
                                             level_percentiles=self.level_percentiles,
                                             progress=rank_zero_info)

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

    @classmethod
    def from_node_data(cls, node_data: Any, **kwargs: Any) -> "FullGraphNodeData":
        r"""The partitioned equivalent of PyG's ``LightningNodeData(data, loader="full")``.

        :class:`~lightning_fullgraph.FullGraphStrategy` calls this itself when it is given
        such a data module; call it to pass options (e.g. :obj:`cache_dir`).

        Args:
            node_data (torch_geometric.data.lightning.LightningNodeData): A data module
                with ``loader="full"`` over a homogeneous :class:`~torch_geometric.data.Data`.
            **kwargs: Options of :class:`FullGraphDataModule` (not :obj:`data`).
        """
        return FullGraphNodeData(node_data, **kwargs)

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

    @property
    def max_label(self) -> Optional[int]:
        r"""Largest label over the whole graph (all ranks), :obj:`None` for floating-point
        targets; known after :meth:`setup` (e.g. to explain a target out of the model's
        range)."""
        return self._max_label

    def _global_num_classes(self) -> Optional[int]:
        y = self.local_data.get("y")
        if y is None or y.is_floating_point():
            return None
        # Also with num_classes given (the same collective on every rank either way): the
        # labels' true range, which num_classes alone does not tell when it is wrong.
        top = torch.tensor([int(y.max()) + 1 if y.numel() else 0])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
        self._max_label = int(top) - 1
        if self.num_classes_arg is not None:
            return self.num_classes_arg
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


#: Split names of ``LightningNodeData`` and the mask each is given as on the partitioned graph.
_SPLITS = ("train", "val", "test", "pred")
# Index-valued split attributes (``data.train_idx``, OGB's ``valid_idx``, ...): graph-level
# tensors that the partitioner would drop, so they are turned into masks and rebuilt per rank.
_INDEX_KEY = re.compile(r"^(train|val|valid|test|pred)_(idx|index)$")
# Attributes the partitioner sets or handles itself, never copied as graph-level values.
_OWN_KEYS = {"edge_index", "num_nodes", "n_id"}


def _node_data_error(node_data: Any, problem: str) -> ValueError:
    return ValueError(
        f"{type(node_data).__name__} cannot be partitioned for FullGraphStrategy: {problem}")


def _check_full_loader_arguments(node_data: Any) -> None:
    r"""Refuses the sampling arguments PyG's own full loader fails on.

    ``LightningNodeData(loader="full")`` hands its loader arguments to torch's ``DataLoader``
    over the one graph: ``batch_size`` and ``num_workers`` it resets itself (with a warning),
    anything ``DataLoader`` does not take (``num_neighbors``, ...) fails there with a
    ``TypeError``. The partitioned replacement never builds that loader, so it says so here.
    """
    import inspect
    accepted = set(inspect.signature(DataLoader.__init__).parameters)
    given: Dict[str, Any] = {}
    for attr in ("loader_kwargs", "eval_loader_kwargs"):
        given.update(getattr(node_data, attr, None) or {})
    unknown = sorted(key for key in given if key not in accepted)
    if unknown:
        name = type(node_data).__name__
        raise ValueError(
            f"'{name}' with loader='full' does not sample mini-batches, so it does not take "
            f"{', '.join(repr(k) for k in unknown)} (PyG's own full loader fails on them): "
            f"remove {'it' if len(unknown) == 1 else 'them'} from {name}(...), since "
            "FullGraphStrategy trains on the whole graph, partitioned; for neighbour "
            "mini-batches use loader='neighbor' with strategy='ddp'")


def _as_mask(nodes: Any, num_nodes: int, what: str, node_data: Any) -> torch.Tensor:
    if isinstance(nodes, (str, tuple)):
        raise _node_data_error(node_data, f"{what} names a node type ({nodes!r}), which only "
                                          "HeteroData has; give a node mask or index tensor")
    nodes = torch.as_tensor(nodes)
    if nodes.dtype == torch.bool:
        if nodes.shape != (num_nodes,):
            raise _node_data_error(node_data, f"{what} is a mask of shape {tuple(nodes.shape)}, "
                                              f"expected ({num_nodes},)")
        return nodes
    if nodes.is_floating_point() or nodes.dim() != 1:
        raise _node_data_error(node_data, f"{what} must be a bool mask or a 1-D index tensor, "
                                          f"got {nodes.dtype} of shape {tuple(nodes.shape)}")
    if nodes.numel() and (int(nodes.min()) < -num_nodes or int(nodes.max()) >= num_nodes):
        raise _node_data_error(node_data, f"{what} holds node indices outside "
                                          f"[0, {num_nodes})")
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    mask[nodes.long()] = True
    return mask


class FullGraphNodeData(FullGraphDataModule):
    r"""PyG's ``LightningNodeData(data, loader="full")``, partitioned.

    :class:`~lightning_fullgraph.FullGraphStrategy` takes over such a data module before any of
    its hooks run (PyG's ``prepare_data`` refuses more than one device, because its full loader
    would give every device the whole graph): this class partitions its :obj:`data` like
    :class:`FullGraphDataModule` and gives every rank a batch that looks like PyG's own, so the
    LightningModule written for one device trains unchanged and computes the single-process
    result:

    * node- and edge-level attributes are the rank's rows (``batch.x``, ``batch.y``,
      ``batch.train_mask``, ...), as for :class:`FullGraphDataModule`;
    * index attributes of the splits (``data.train_idx``, ``data.valid_index``, ...) become
      indices into the rank's nodes (in ascending order), so ``out[batch.train_idx]`` selects
      the rank's training nodes;
    * other graph-level values (tensors that are neither per node nor per edge, numbers,
      strings) are copied unchanged into every rank's batch;
    * the split inputs given to ``LightningNodeData`` (``input_train_nodes`` etc., as mask or
      index, or found on :obj:`data` by PyG) also appear as ``train_mask``, ``val_mask``,
      ``test_mask``, ``pred_mask`` when :obj:`data` has no attribute of that name: the
      strategy weights each rank's loss by its share of ``train_mask`` and METIS balances it;
    * validation and test run only if the original has them, as in PyG; the original's batch
      transfer hooks and ``state_dict`` are used.

    The original's :obj:`data`, split inputs and hooks are read as they are at take-over
    (when ``fit``/``validate``/``test``/``predict`` starts); its ``prepare_data`` and
    ``setup`` are not called.

    Args:
        node_data (torch_geometric.data.lightning.LightningNodeData): The data module, with
            ``loader="full"`` over a homogeneous :class:`~torch_geometric.data.Data`.
        **kwargs: Options of :class:`FullGraphDataModule` (``cache_dir``, ``seed``,
            ``validate``, ``num_classes``, ``hosts``, ...).

    Raises:
        ValueError: For another loader, a :class:`~torch_geometric.data.HeteroData`, loader
            arguments that only a sampling loader takes (``num_neighbors``, ...), or split
            inputs that are not node masks or indices of the graph; the message says what to
            use instead.
        ~lightning_fullgraph.engine.SparseAdjacencyError: For a graph with a sparse adjacency
            (``adj_t`` from ``T.ToSparseTensor()``).
    """

    def __init__(self, node_data: Any, **kwargs: Any) -> None:
        loader = getattr(node_data, "loader", None)
        if loader != "full":
            raise _node_data_error(
                node_data, f"loader={loader!r} samples mini-batches of the whole graph on every "
                           "rank; FullGraphStrategy trains full-batch on partitions: use "
                           "loader='full' (or FullGraphDataModule(data)), or keep "
                           "loader='neighbor' with strategy='ddp'")
        data = getattr(node_data, "data", None)
        if not isinstance(data, Data):
            raise _node_data_error(
                node_data, f"its data is a {type(data).__name__}; FullGraphStrategy partitions "
                           "a homogeneous torch_geometric.data.Data (e.g. "
                           "HeteroData.to_homogeneous())")
        from .validation import check_no_sparse_adjacency
        check_no_sparse_adjacency(data)
        _check_full_loader_arguments(node_data)
        graph, self._index_masks = self._graph(node_data, data)
        super().__init__(graph, **kwargs)
        self.node_data = node_data
        for name in ("val_dataloader", "test_dataloader"):
            # PyG sets these to None when there are no such nodes: no loop runs, as in PyG.
            if getattr(node_data, name, None) is None:
                setattr(self, name, None)
        from lightning.pytorch.utilities.model_helpers import is_overridden
        for name in ("on_before_batch_transfer", "transfer_batch_to_device",
                     "on_after_batch_transfer"):
            # Only hooks the original overrides, so a LightningModule's own hooks stay in use.
            if is_overridden(name, node_data, pl.LightningDataModule):
                setattr(self, name, getattr(node_data, name))

    @staticmethod
    def _graph(node_data: Any, data: Data):
        # A shallow copy with its own attribute store: the user's Data is not changed.
        graph = copy.copy(data)
        num_nodes = int(data.num_nodes)
        index_masks: Dict[str, torch.Tensor] = {}
        for key in list(graph.keys()):
            value = graph[key]
            if _INDEX_KEY.match(key) and isinstance(value, torch.Tensor) \
                    and not value.is_floating_point() and value.dtype != torch.bool:
                index_masks[key] = _as_mask(value, num_nodes, f"data.{key}", node_data)
                del graph[key]
        for split in _SPLITS:
            nodes = getattr(node_data, f"input_{split}_nodes", None)
            if nodes is None:
                continue
            key = f"{split}_mask"
            mask = _as_mask(nodes, num_nodes, f"input_{split}_nodes", node_data)
            if key not in graph:
                graph[key] = mask
            elif not torch.equal(graph[key].bool(), mask):
                # PyG's full loader never reads input nodes: its batch is the whole graph and
                # the LightningModule picks the nodes itself, so data's own mask is kept.
                warnings.warn(
                    f"input_{split}_nodes differs from data.{key}: with loader='full' PyG "
                    f"hands the LightningModule the whole graph (batch.{key} is data.{key}) "
                    f"and does not use input_{split}_nodes; FullGraphStrategy does the same. "
                    f"Set data.{key} to the nodes you mean", stacklevel=3)
        return graph, index_masks

    @property
    def data(self) -> Data:
        r"""The global graph as given to ``LightningNodeData`` (e.g. to size a model).
        Batches hold only the rank's partition."""
        return self.node_data.data

    def setup(self, stage: Optional[str] = None) -> None:
        r"""Loads this rank's partition and completes its batch as PyG's would look."""
        first = self._local is None
        super().setup(stage)
        if not first:
            return
        local = self._local
        owned = self.partition.owned_ids
        for key, mask in self._index_masks.items():
            local[key] = mask[owned].nonzero().view(-1)
        graph = self.node_data.data
        node_keys, edge_keys = _split_keys(graph)
        for key in graph.keys():
            if key in _OWN_KEYS or key in node_keys or key in edge_keys \
                    or key in self._index_masks or key in local:
                continue
            value = graph[key]
            if isinstance(value, torch.Tensor) or isinstance(value, (int, float, str, bool)):
                local[key] = value

    def state_dict(self) -> Dict[str, Any]:
        return self.node_data.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.node_data.load_state_dict(state_dict)


def _split_keys(data: Data):
    from ..partition.local import split_attr_keys
    return split_attr_keys(data)
