"""Up-front checks of a node-classification graph before it is partitioned.

Errors (:class:`GraphValidationError`) are inputs the engine cannot train on
correctly; every message names the problem, where it first occurs and a fix.
Warnings (:class:`GraphWarning`) are inputs PyG itself accepts and that the
partitioned engine reproduces exactly (directed graphs, self-loops, duplicate
edges, isolated nodes, overlapping masks); each is emitted once per call and
becomes an error with :obj:`strict=True`.

Label convention: class labels are integers in ``[0, num_classes)``; ``-1``
marks an *unlabelled* node and is allowed only on nodes outside
:obj:`train_mask`, :obj:`val_mask` and :obj:`test_mask` (as in OGB-style
data sets), because such a node never enters a loss or a metric. Any other
negative label is an error.

All checks are vectorised (one sort of the edge keys, bincounts), so a graph
with tens of millions of edges validates in seconds.
"""
from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.data import Data

__all__ = [
    "GraphValidationError",
    "GraphWarning",
    "GraphReport",
    "validate_graph",
    "check_num_parts",
    "check_no_sparse_adjacency",
    "check_label_range",
]

_MASKS = ("train_mask", "val_mask", "test_mask")


class GraphValidationError(ValueError):
    r"""Raised when a graph cannot be trained on as given. The message names
    the problem, its first occurrence and how to fix it."""


class GraphWarning(UserWarning):
    r"""Emitted for graph properties that PyG accepts and that the engine
    handles exactly like single-process PyG, but that are often unintended.
    :obj:`validate_graph(..., strict=True)` turns them into
    :class:`GraphValidationError`."""


@dataclass(frozen=True)
class GraphReport:
    r"""Summary counts of a validated graph, returned by
    :func:`validate_graph`.

    Args:
        num_nodes (int): Number of nodes.
        num_edges (int): Number of (directed) columns of :obj:`edge_index`.
        num_features (int): Feature dimension of :obj:`x`.
        num_classes (int, optional): Number of classes (given or inferred as
            ``y.max() + 1``); :obj:`None` for floating-point targets.
        is_directed (bool): Whether some edge lacks its reverse.
        num_edges_without_reverse (int): Distinct edges whose reverse is
            missing.
        num_self_loops (int): Edges :math:`(v, v)`.
        num_duplicate_edges (int): Columns repeating an earlier column.
        num_isolated_nodes (int): Nodes with neither in- nor out-edges.
        num_unlabelled_nodes (int): Nodes with label ``-1``.
        mask_counts (Dict[str, int]): Number of selected nodes per present
            mask among :obj:`train_mask`, :obj:`val_mask`, :obj:`test_mask`.
        warnings (List[str]): Messages of the emitted :class:`GraphWarning`.
        num_classes_inferred (bool): Whether :obj:`num_classes` was inferred
            from the labels (no :obj:`num_classes` argument).
        label_range (Tuple[int, int], optional): Smallest and largest class
            id among labelled nodes; :obj:`None` for floating-point targets
            or when no node is labelled.
        num_label_ids (int, optional): Number of distinct class ids among
            labelled nodes; :obj:`None` for floating-point targets.
    """
    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: Optional[int]
    is_directed: bool
    num_edges_without_reverse: int
    num_self_loops: int
    num_duplicate_edges: int
    num_isolated_nodes: int
    num_unlabelled_nodes: int
    mask_counts: Dict[str, int] = field(default_factory=dict)
    warnings: List[str] = field(default_factory=list)
    num_classes_inferred: bool = False
    label_range: Optional[Tuple[int, int]] = None
    num_label_ids: Optional[int] = None

    @property
    def num_train_nodes(self) -> int:
        return self.mask_counts.get("train_mask", 0)

    @property
    def num_val_nodes(self) -> int:
        return self.mask_counts.get("val_mask", 0)

    @property
    def num_test_nodes(self) -> int:
        return self.mask_counts.get("test_mask", 0)


def _first(mask: Tensor) -> int:
    # Index of the first True entry of a 1-D bool tensor (caller ensures any).
    return int(mask.nonzero()[0, 0])


def _rows(value) -> Optional[int]:
    if isinstance(value, Tensor) and value.dim() >= 1:
        return int(value.size(0))
    return None


def _is_sparse_matrix(value) -> bool:
    # torch.sparse (COO, CSR, ...) or a SparseTensor: torch_sparse's class when it is
    # installed, else PyG's stand-in of that name (an isinstance check never builds one).
    from torch_geometric.typing import SparseTensor
    return isinstance(value, SparseTensor) or (
        isinstance(value, Tensor) and value.layout != torch.strided)


def check_no_sparse_adjacency(data: Data) -> None:
    r"""Refuses a graph that holds its edges (also) as a sparse adjacency matrix.

    ``T.ToSparseTensor()`` (PyG's ``gcn2_cora.py`` and others) replaces ``edge_index`` by
    ``adj_t``: a ``torch_sparse.SparseTensor``, or without ``torch-sparse`` a
    ``torch.sparse_csr`` tensor. Partitioned training splits the graph by ``edge_index``
    and gives every rank its own ``edge_index`` with halo rows and halo degrees added, which
    a sparse matrix over the whole graph cannot become. Checked before anything else, on
    every process that holds the graph, so the error comes once, before partitioning.

    Raises:
        ~lightning_fullgraph.engine.SparseAdjacencyError: For any attribute other than
            ``x`` that is a sparse matrix (``x`` has its own check in
            :func:`validate_graph`).
    """
    keys = [key for key, value in data.items() if key != "x" and _is_sparse_matrix(value)]
    if not keys:
        return
    from ..engine.partitioned import SparseAdjacencyError
    key = keys[0]
    value = data[key]
    what = type(value).__name__ + (f" ({value.layout})" if isinstance(value, Tensor) else "")
    raise SparseAdjacencyError(
        f"data.{key} is a sparse adjacency ({what}, e.g. from T.ToSparseTensor()); "
        "partitioned training splits the graph by data.edge_index and adds halo rows and "
        "halo degrees to every rank's edge_index, which a sparse matrix cannot hold. Fix: "
        "drop T.ToSparseTensor() from the transforms and call the layers with "
        f"batch.edge_index (conv(x, batch.edge_index) rather than conv(x, batch.{key})), "
        f"or rebuild the edges: data.edge_index = torch_geometric.utils.to_edge_index("
        f"data.{key})[0].flip(0); del data.{key}")


def _check_node_counts(data: Data) -> None:
    # Runs before every other check: when x has another number of rows than
    # y, the masks and data.num_nodes agree on, every later message (edges
    # "outside [0, N)", masks of the "wrong" shape, ...) would blame an input
    # that is fine. Only x is judged here; any other odd one out gets its own
    # message from the check of that attribute.
    num_x = _rows(data.x)
    if num_x is None:
        return
    others: Dict[str, int] = {}
    if _rows(data.y) is not None:
        others["y"] = _rows(data.y)
    for name in _MASKS:
        mask = getattr(data, name, None)
        if isinstance(mask, Tensor) and mask.dtype == torch.bool \
                and _rows(mask) is not None:
            others[name] = _rows(mask)
    explicit = getattr(data, "_store", {}).get("num_nodes", None)
    if explicit is not None:
        others["num_nodes"] = int(explicit)
    counts = set(others.values())
    if len(counts) != 1 or num_x in counts:
        return
    num_nodes = counts.pop()
    edge_index = data.edge_index
    max_node = None
    if (isinstance(edge_index, Tensor) and edge_index.layout == torch.strided
            and edge_index.dim() == 2 and edge_index.numel() > 0
            and not edge_index.is_floating_point()):
        max_node = int(edge_index.max())
    # With a single witness (say y alone) x is the odd one out only if the
    # edges also need more nodes than x has rows.
    if len(others) < 2 and not (max_node is not None and max_node >= num_x):
        return
    tensors = [f"data.{k}" for k in others if k != "num_nodes"]
    pieces = []
    if tensors:
        listed = tensors[0] if len(tensors) == 1 else \
            ", ".join(tensors[:-1]) + " and " + tensors[-1]
        pieces.append(f"{listed} {'has' if len(tensors) == 1 else 'have'} "
                      f"{num_nodes} entries")
    if "num_nodes" in others:
        pieces.append(f"data.num_nodes is {num_nodes}")
    what = ", and ".join(pieces)
    edges = ""
    if max_node is not None and max_node >= num_x:
        edges = f" (and edge_index refers to node {max_node})"
    raise GraphValidationError(
        f"data.x has {num_x} rows but {what}{edges}: x, y, the masks "
        f"and edge_index must agree on the number of nodes, and x is the odd "
        f"one out; fix: give data.x one row per node ({num_nodes} rows), i.e. "
        f"take x from the same graph (and the same node subset) as y and the "
        f"masks")


def _check_x(data: Data) -> int:
    x = data.x
    if x is None:
        raise GraphValidationError(
            "data.x is missing; the model needs node features: add them, "
            "e.g. data.x = torch.ones(data.num_nodes, 1) for a featureless "
            "graph")
    if not isinstance(x, Tensor) or x.layout != torch.strided:
        what = type(x).__name__
        if isinstance(x, Tensor):
            what += f" with layout {x.layout}"
        raise GraphValidationError(
            f"data.x must be a dense torch.Tensor, got {what}; fix: "
            f"data.x = data.x.to_dense()")
    if x.dim() != 2:
        raise GraphValidationError(
            f"data.x must be 2-D [num_nodes, num_features], got shape "
            f"{tuple(x.shape)}; fix: data.x = data.x.view(data.x.size(0), -1)")
    if not x.is_floating_point():
        raise GraphValidationError(
            f"data.x must be floating point, got {x.dtype}; fix: "
            f"data.x = data.x.float()")
    bad = ~torch.isfinite(x)
    num_bad = int(bad.sum())
    if num_bad:
        node = _first(bad.any(dim=1))
        raise GraphValidationError(
            f"x contains {num_bad} NaN/inf values (first at node {node}); "
            f"fix: clean or impute them, e.g. data.x = "
            f"torch.nan_to_num(data.x, nan=0.0, posinf=0.0, neginf=0.0)")
    return x.size(1)


def _num_nodes(data: Data) -> int:
    num_x = data.x.size(0)
    explicit = getattr(data, "_store", {}).get("num_nodes", None)
    if explicit is not None and int(explicit) != num_x:
        raise GraphValidationError(
            f"data.num_nodes is {int(explicit)} but data.x has {num_x} rows; "
            f"fix: give one feature row per node or correct data.num_nodes")
    if num_x == 0:
        raise GraphValidationError(
            "empty graph: data has 0 nodes; a graph needs at least one node "
            "(and one per partition)")
    return num_x


def _check_edge_index(data: Data, num_nodes: int) -> Tensor:
    edge_index = data.edge_index
    if edge_index is None:
        raise GraphValidationError(
            "data.edge_index is missing; fix: store the edges as a [2, "
            "num_edges] int64 tensor")
    if (not isinstance(edge_index, Tensor)
            or edge_index.layout != torch.strided):
        raise GraphValidationError(
            f"data.edge_index must be a dense torch.Tensor, got "
            f"{type(edge_index).__name__}; fix: store a [2, num_edges] int64 "
            f"tensor")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise GraphValidationError(
            f"edge_index must have shape [2, num_edges], got "
            f"{tuple(edge_index.shape)}; fix: for a list of (src, dst) pairs "
            f"use data.edge_index = data.edge_index.t().contiguous()")
    if edge_index.dtype != torch.long:
        raise GraphValidationError(
            f"edge_index must be int64 (torch.long), got {edge_index.dtype}; "
            f"fix: data.edge_index = data.edge_index.long()")
    bad = ((edge_index < 0) | (edge_index >= num_nodes)).any(dim=0)
    num_bad = int(bad.sum())
    if num_bad:
        e = _first(bad)
        src, dst = (int(v) for v in edge_index[:, e])
        raise GraphValidationError(
            f"edge_index has {num_bad} edges with node indices outside "
            f"[0, {num_nodes}) (first at edge {e}: ({src}, {dst})); fix: drop "
            f"those edges or add the missing nodes to data.x")
    # Plain Tensor ops: an EdgeIndex subclass would re-dispatch every op.
    return edge_index.as_subclass(Tensor)


def _check_masks(data: Data, num_nodes: int) -> Dict[str, Tensor]:
    masks: Dict[str, Tensor] = {}
    for name in _MASKS:
        mask = getattr(data, name, None)
        if mask is None:
            if name == "train_mask":
                raise GraphValidationError(
                    "data.train_mask is missing; fix: add a bool [num_nodes] "
                    "mask of training nodes, e.g. with "
                    "torch_geometric.transforms.RandomNodeSplit()(data)")
            continue  # val/test are optional
        if not isinstance(mask, Tensor):
            raise GraphValidationError(
                f"data.{name} must be a torch.Tensor, got "
                f"{type(mask).__name__}")
        if mask.dim() == 2 and mask.size(0) == num_nodes:
            raise GraphValidationError(
                f"{name} has shape {tuple(mask.shape)} (several splits); fix: "
                f"select one split, e.g. data.{name} = data.{name}[:, 0]")
        if mask.dtype != torch.bool:
            if mask.dim() == 1 and mask.numel() == num_nodes:
                fix = f"data.{name} = data.{name}.bool()"
            else:
                fix = (f"if it holds node indices use data.{name} = "
                       f"torch_geometric.utils.index_to_mask(data.{name}, "
                       f"size=data.num_nodes)")
            raise GraphValidationError(
                f"{name} must be a bool tensor, got {mask.dtype} with shape "
                f"{tuple(mask.shape)}; fix: {fix}")
        if mask.dim() != 1 or mask.numel() != num_nodes:
            raise GraphValidationError(
                f"{name} must have shape [num_nodes] = [{num_nodes}], got "
                f"{tuple(mask.shape)}; fix: build it with "
                f"torch_geometric.utils.index_to_mask(index, "
                f"size={num_nodes})")
        masks[name] = mask
    if not bool(masks["train_mask"].any()):
        raise GraphValidationError(
            "train_mask selects no nodes; fix: mark at least one training "
            "node")
    return masks


def _check_y(data: Data, num_nodes: int, num_classes: Optional[int],
             masks: Dict[str, Tensor]) -> tuple:
    y = data.y
    if y is None:
        raise GraphValidationError(
            "data.y is missing; fix: add node labels as an int64 [num_nodes] "
            "tensor (use -1 for unlabelled nodes outside all masks)")
    if not isinstance(y, Tensor):
        raise GraphValidationError(
            f"data.y must be a torch.Tensor, got {type(y).__name__}")
    if y.dim() == 0 or y.size(0) != num_nodes:
        raise GraphValidationError(
            f"y must have one entry per node (size(0) = {num_nodes}), got "
            f"shape {tuple(y.shape)}")
    if y.is_floating_point():
        # Regression / multi-label targets: no class range to check.
        bad = ~torch.isfinite(y).view(num_nodes, -1).all(dim=1)
        if bool(bad.any()):
            raise GraphValidationError(
                f"y contains NaN/inf targets on {int(bad.sum())} nodes (first "
                f"at node {_first(bad)}); fix: clean them or exclude those "
                f"nodes from all masks")
        return None, 0, None
    if y.dtype == torch.bool or y.is_complex():
        raise GraphValidationError(
            f"y must hold integer class labels, got {y.dtype}; fix: "
            f"data.y = data.y.long()")
    if y.dim() != 1:
        raise GraphValidationError(
            f"y must be 1-D [num_nodes] class labels, got shape "
            f"{tuple(y.shape)}; fix: data.y = data.y.view(-1)")
    if num_classes is not None and num_classes < 1:
        raise GraphValidationError(
            f"num_classes must be >= 1, got {num_classes}")

    too_small = y < -1
    if bool(too_small.any()):
        node = _first(too_small)
        raise GraphValidationError(
            f"y has {int(too_small.sum())} negative labels other than -1 "
            f"(first at node {node}: {int(y[node])}); labels must be in "
            f"[0, num_classes), or -1 for unlabelled nodes outside all masks")
    labelled = y[y >= 0]
    ids = _label_ids(labelled) if labelled.numel() else labelled
    if num_classes is None:
        num_classes = int(ids[-1]) + 1 if ids.numel() else 0
    check_label_range([(torch.arange(num_nodes), y)], num_classes)
    unlabelled = y == -1
    for name, mask in masks.items():
        inside = unlabelled & mask
        if bool(inside.any()):
            raise GraphValidationError(
                f"y has {int(inside.sum())} unlabelled nodes (label -1) "
                f"inside {name} (first at node {_first(inside)}); fix: "
                f"remove them from the mask (data.{name} &= data.y >= 0) or "
                f"label them")
    return num_classes, int(unlabelled.sum()), ids


def check_label_range(parts: Iterable[Tuple[Tensor, Tensor]], num_classes: int,
                      where: str = "") -> None:
    r"""Refuses integer labels ``>= num_classes``, over the parts of a graph.

    Args:
        parts (Iterable[Tuple[Tensor, Tensor]]): ``(global node ids, labels)`` of each part
            (the whole graph: one part).
        num_classes (int): Number of classes.
        where (str): Where the labels are, for the message (e.g. the partition directory).

    Raises:
        GraphValidationError: Naming how many labels are too large, the first such node
            (smallest global id) and its label, and the fix.
    """
    count, first = 0, None
    for ids, y in parts:
        if y is None or y.is_floating_point() or y.numel() == 0:
            continue
        too_large = y.view(-1) >= num_classes
        n = int(too_large.sum())
        if not n:
            continue
        count += n
        bad_ids = ids[too_large]
        at = int(bad_ids.argmin())
        if first is None or int(bad_ids[at]) < first[0]:
            first = (int(bad_ids[at]), int(y.view(-1)[too_large][at]))
    if count:
        raise GraphValidationError(
            f"y has {count} labels >= num_classes={num_classes} (first at node "
            f"{first[0]}: {first[1]}){where}; fix: pass the right num_classes or remap "
            f"labels to 0..num_classes-1")


def _label_ids(labelled: Tensor) -> Tensor:
    # Sorted distinct class ids of non-negative labels: a bincount (O(N + C))
    # unless the largest id is far beyond the number of nodes (a corrupted
    # label such as 10**9 would allocate a huge count vector), then a sort.
    largest = int(labelled.max())
    if largest <= 2 * labelled.numel() + 1024:
        counts = torch.bincount(labelled.view(-1).long(),
                                minlength=largest + 1)
        return counts.nonzero().view(-1)
    return torch.unique(labelled)


def _id_gaps(ids: Tensor, limit: int = 4) -> str:
    # "7..98" or "2, 5..8, 11" for the ids in [0, ids[-1]] missing from ids.
    ids = ids.tolist()
    gaps, prev = [], -1
    for v in ids:
        if v > prev + 1:
            lo, hi = prev + 1, v - 1
            gaps.append(str(lo) if lo == hi else f"{lo}..{hi}")
        prev = v
    text = ", ".join(gaps[:limit])
    if len(gaps) > limit:
        text += f" and {len(gaps) - limit} more ranges"
    return text


def _edge_stats(edge_index: Tensor, num_nodes: int) -> Dict[str, int]:
    row, col = edge_index[0], edge_index[1]
    num_edges = row.numel()
    # Isolated = no in- and no out-edge: such a node never sends or receives.
    degree = (torch.bincount(row, minlength=num_nodes) +
              torch.bincount(col, minlength=num_nodes))
    stats = dict(
        num_self_loops=int((row == col).sum()),
        num_isolated_nodes=int((degree == 0).sum()),
        num_duplicate_edges=0,
        num_edges_without_reverse=0,
    )
    if num_edges == 0:
        return stats
    # Sorting the int64 keys row * N + col exposes duplicates as equal
    # neighbours; coalesced input (the common case) is already sorted.
    key = row * num_nodes + col
    if not bool((key[1:] >= key[:-1]).all()):
        key = torch.sort(key).values
    first = torch.ones(num_edges, dtype=torch.bool)
    first[1:] = key[1:] != key[:-1]
    unique = key[first]
    stats["num_duplicate_edges"] = num_edges - unique.numel()
    # Reversal is an involution, so an edge lacks its reverse iff it is not
    # in the reversed set. Compare sorted sets: equality is the undirected
    # fast path, otherwise a binary search with *sorted* queries (random
    # queries into tens of millions of keys are ~10x slower, cache misses).
    reverse = torch.sort((unique % num_nodes) * num_nodes +
                         unique // num_nodes).values
    if not torch.equal(unique, reverse):
        pos = torch.searchsorted(unique, reverse).clamp_(
            max=unique.numel() - 1)
        stats["num_edges_without_reverse"] = int(
            (unique[pos] != reverse).sum())
    return stats


def _issue(message: str, strict: bool, fix: str, emitted: List[str]) -> None:
    if strict:
        raise GraphValidationError(f"{message} (strict=True: {fix})")
    # stacklevel=3 points at the caller of validate_graph.
    warnings.warn(message, GraphWarning, stacklevel=3)
    emitted.append(message)


def validate_graph(data: Data, *, num_classes: Optional[int] = None,
                   strict: bool = False) -> GraphReport:
    r"""Checks that :obj:`data` is a node-classification graph the engine can
    train on, raising :class:`GraphValidationError` on the first problem and
    emitting one :class:`GraphWarning` per benign-but-notable property.

    Errors: :obj:`x` with another number of rows than :obj:`y`, the masks
    and :obj:`num_nodes` agree on (checked first, so that x is named rather
    than the edges or masks); missing, non-dense, non-2-D, non-float or
    non-finite :obj:`x`;
    :obj:`num_nodes` disagreeing with :obj:`x`; an empty graph;
    :obj:`edge_index` missing, not ``[2, E]``, not int64, or with indices
    outside ``[0, num_nodes)``; :obj:`train_mask` missing or empty; any mask
    not bool or not of shape ``[num_nodes]``; :obj:`y` missing or of the
    wrong shape; integer labels below ``-1`` or ``>= num_classes``; label
    ``-1`` (unlabelled) on a node inside any mask. Floating-point :obj:`y`
    (regression, multi-label) is accepted if finite. A sparse adjacency
    (``adj_t`` from ``T.ToSparseTensor()``) raises
    :class:`~lightning_fullgraph.engine.SparseAdjacencyError`
    (:func:`check_no_sparse_adjacency`).

    Warnings (errors if :obj:`strict`): a directed graph (METIS partitions
    the symmetrized graph, message passing uses the edges as given),
    self-loops and duplicate edges (kept as given, so results equal
    single-process PyG), isolated nodes (assigned to partitions by weight,
    they receive no messages), overlapping masks, and (without
    :obj:`num_classes`) class ids in ``[0, y.max()]`` that no node uses,
    which usually means a stray label inflated the inferred
    :obj:`num_classes`.

    Args:
        data (torch_geometric.data.Data): The graph.
        num_classes (int, optional): Number of classes; if :obj:`None` it is
            inferred as ``y.max() + 1``, only negative labels are checked,
            and a :class:`GraphWarning` says which class ids below the
            largest have no node. (default: :obj:`None`)
        strict (bool, optional): Turn every :class:`GraphWarning` into a
            :class:`GraphValidationError`. (default: :obj:`False`)

    Returns:
        GraphReport: Counts of nodes, edges, self-loops, duplicates, isolated
        nodes, unlabelled nodes and mask sizes, and the label range.
    """
    if not isinstance(data, Data):
        raise GraphValidationError(
            f"expected a torch_geometric.data.Data, got {type(data).__name__}"
            f"; heterogeneous graphs are not supported (fix: "
            f"data.to_homogeneous() for HeteroData)")
    check_no_sparse_adjacency(data)
    _check_node_counts(data)
    with warnings.catch_warnings():
        # PyG warns when it has to guess num_nodes; we only need "any?".
        warnings.simplefilter("ignore")
        if not data.num_nodes:
            raise GraphValidationError(
                "empty graph: data has 0 nodes; a graph needs at least one "
                "node (and one per partition)")
    num_features = _check_x(data)
    num_nodes = _num_nodes(data)
    edge_index = _check_edge_index(data, num_nodes)
    masks = _check_masks(data, num_nodes)
    inferred = num_classes is None
    num_classes, num_unlabelled, ids = _check_y(data, num_nodes, num_classes,
                                                masks)
    stats = _edge_stats(edge_index, num_nodes)

    emitted: List[str] = []
    if inferred and ids is not None and 0 < ids.numel() < num_classes:
        # A stray label (say 99 in a 7-class graph) makes the inferred
        # num_classes too large instead of being rejected, and training
        # later fails on one rank ("Target 99 is out of bounds").
        _issue(f"labels use {ids.numel()} distinct class ids but the largest "
               f"is {num_classes - 1}, so num_classes is inferred as "
               f"{num_classes} and ids {_id_gaps(ids)} have no node; pass "
               f"num_classes=... (FullGraphDataModule(num_classes=...)) to "
               f"check labels against your model", strict,
               "pass num_classes=... or remap the labels to "
               "0..num_classes-1", emitted)
    missing = stats["num_edges_without_reverse"]
    if missing:
        _issue(f"graph is directed ({missing} edges lack a reverse); METIS "
               f"partitions the symmetrized graph, message passing uses the "
               f"edges as given (in-edges of each node)", strict,
               "symmetrize with torch_geometric.utils.to_undirected",
               emitted)
    if stats["num_self_loops"]:
        _issue(f"graph has {stats['num_self_loops']} self-loops; kept as "
               f"given, so results equal single-process PyG; call "
               f"torch_geometric.utils.remove_self_loops first to drop them",
               strict, "drop them with remove_self_loops", emitted)
    if stats["num_duplicate_edges"]:
        _issue(f"graph has {stats['num_duplicate_edges']} duplicate edges; "
               f"kept as given, so results equal single-process PyG; call "
               f"torch_geometric.utils.coalesce first to drop them", strict,
               "drop them with coalesce", emitted)
    if stats["num_isolated_nodes"]:
        _issue(f"graph has {stats['num_isolated_nodes']} isolated nodes; "
               f"they are assigned to partitions by weight and receive no "
               f"messages", strict,
               "remove them, e.g. with torch_geometric.transforms."
               "RemoveIsolatedNodes", emitted)
    names = list(masks)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            overlap = int((masks[a] & masks[b]).sum())
            if overlap:
                _issue(f"{a} and {b} overlap on {overlap} nodes; both are "
                       f"used as given, so metrics on {b} include nodes of "
                       f"{a}", strict, "make the masks disjoint", emitted)

    return GraphReport(
        num_nodes=num_nodes,
        num_edges=edge_index.size(1),
        num_features=num_features,
        num_classes=num_classes,
        is_directed=missing > 0,
        num_edges_without_reverse=missing,
        num_self_loops=stats["num_self_loops"],
        num_duplicate_edges=stats["num_duplicate_edges"],
        num_isolated_nodes=stats["num_isolated_nodes"],
        num_unlabelled_nodes=num_unlabelled,
        mask_counts={name: int(m.sum()) for name, m in masks.items()},
        warnings=emitted,
        num_classes_inferred=inferred and num_classes is not None,
        label_range=((int(ids[0]), int(ids[-1]))
                     if ids is not None and ids.numel() else None),
        num_label_ids=None if ids is None else int(ids.numel()),
    )


def check_num_parts(num_nodes: int, num_parts: int) -> int:
    r"""Checks that a graph with :obj:`num_nodes` nodes can be split into
    :obj:`num_parts` non-empty partitions.

    Args:
        num_nodes (int): Number of nodes of the graph.
        num_parts (int): Requested number of partitions (usually the world
            size).

    Returns:
        int: :obj:`num_parts`, as a Python :obj:`int`.
    """
    ints = []
    for name, value in (("num_nodes", num_nodes), ("num_parts", num_parts)):
        try:
            # operator.index accepts int, numpy and 0-d integer tensors, and
            # rejects floats; bools are ints in Python but never meant here.
            if isinstance(value, bool):
                raise TypeError
            ints.append(operator.index(value))
        except TypeError:
            raise GraphValidationError(
                f"{name} must be an int, got {type(value).__name__} "
                f"({value!r})") from None
    num_nodes, num_parts = ints
    if num_nodes < 1:
        raise GraphValidationError(
            f"empty graph: num_nodes is {num_nodes}; nothing to partition")
    if num_parts < 1:
        raise GraphValidationError(
            f"num_parts must be >= 1, got {num_parts}; fix: use at least one "
            f"partition (one per process)")
    if num_parts > num_nodes:
        raise GraphValidationError(
            f"num_parts={num_parts} exceeds num_nodes={num_nodes}: every "
            f"partition needs at least one node; fix: use at most "
            f"{num_nodes} partitions (fewer devices/processes)")
    return num_parts
