r"""Graph shards of a 3-D grid: every process stores only the part of the graph and of the
features its grid position needs, and extracts its part of each mini-batch without
communication (ScaleGNN §IV-B, Alg. 2).

The graph is cut once (:func:`write_shards`, on one process, before training) into
:math:`L \times L` tiles, :math:`L` the grid's size: tile :math:`(j, k)` holds the
normalized edges (``gcn_norm`` of the whole graph, self-loops added) from source range
``block(N, L, k)`` into destination range ``block(N, L, j)`` as a CSR over its destinations,
and feature tile :math:`(j, c)` the rows of range :math:`j` and the columns ``block(F, L, c)``.
Any axis's block of the graph is a union of ranges (its size divides :math:`L`), so a process
loads (:class:`GraphShard`) exactly the tiles of the adjacency blocks its layers multiply and
of its input block (:class:`ShardPlan`): at most three adjacency blocks (the layouts rotate
with period 3; on a cube of side :math:`s` each is :math:`1/s^2` of the edges) and, for PyG's
``GCN``, ``1/(x y)`` of the features.

The mini-batch is drawn stratum by stratum (:func:`~.sampling.stratified_nodes` with
:math:`L` strata): range :math:`j` gives ``block(B, L, j)``'s size of vertices, so the rows
of any grid block of the batch are exactly the sampled vertices of that block's ranges and
the split models' batch-position blocks line up with the shards.  Per step and tile (Alg. 2):
the sampled rows of the tile's destination range (a slice of the sorted sample), their CSR
rows gathered in one vectorized pass, sources kept by binary search in the sample's slice of
the source range, positions in the batch, off-diagonal weights divided by the inclusion
probability.  The result equals :class:`~.sampling.UniformVertexSampler` ``(strata=L)``'s
batch restricted to this process's blocks, edge for edge (tested).
"""
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor
from torch_geometric.data import Data

from .sampling import check_strata, strata_bounds, strata_inclusion, stratified_nodes

__all__ = ["GraphShard", "ShardPlan", "read_meta", "write_shards"]

FORMAT = 2  # 2: the graph's fingerprint in meta.json
NODE_KEYS = ("y", "train_mask", "val_mask", "test_mask")
#: Attribute of a batch whose ``x`` is this process's input block, not the batch's rows.
INPUT_BLOCK = "grid_input_block"
Axis = Optional[str]


@dataclass(frozen=True)
class ShardPlan:
    r"""What one process of a grid needs of the graph.

    Attributes:
        sizes (Dict[str, int]): Grid size along ``x``, ``y``, ``z``.
        coords (Dict[str, int]): This process's coordinates.
        input_rows, input_cols (str, optional): The axes splitting the rows and the columns of
            the first layer's input (``None``: whole).
        pairs (FrozenSet[Tuple[str, str]]): ``(destination axis, source axis)`` of every
            adjacency block its layers multiply (``(None, None)``: the whole graph).
    """

    sizes: Dict[str, int]
    coords: Dict[str, int]
    input_rows: Axis = None
    input_cols: Axis = None
    pairs: FrozenSet[Tuple[Axis, Axis]] = field(default_factory=lambda: frozenset({(None,
                                                                                    None)}))

    @property
    def parts(self) -> int:
        return self.sizes["x"] * self.sizes["y"] * self.sizes["z"]

    def strata(self, axis: Axis) -> range:
        r"""The ranges (of :attr:`parts`) that this process's block along :obj:`axis` spans."""
        if axis is None:
            return range(self.parts)
        per = self.parts // self.sizes[axis]
        return range(self.coords[axis] * per, (self.coords[axis] + 1) * per)

    def tiles(self) -> List[Tuple[int, int]]:
        r"""The adjacency tiles ``(destination range, source range)`` to load, each once."""
        return sorted({(j, k) for dst, src in self.pairs
                       for j in self.strata(dst) for k in self.strata(src)})


def _directory(root: Union[str, Path], parts: int) -> Path:
    return Path(root) / f"grid-{parts}"


def read_meta(root: Union[str, Path], parts: int) -> Optional[dict]:
    r"""The description of the shards of :obj:`parts` ranges under :obj:`root`, or ``None``."""
    path = _directory(root, parts) / "meta.json"
    if not path.is_file():
        return None
    meta = json.loads(path.read_text())
    return meta if meta.get("format") == FORMAT else None


def write_shards(data: Data, root: Union[str, Path], parts: int,
                 dtype: torch.dtype = torch.float32) -> Path:
    r"""Cuts :obj:`data` into the tiles of a grid of :obj:`parts` processes under
    ``root/grid-{parts}`` (written to a temporary directory first, then moved in place: an
    interrupted run leaves nothing half written; existing shards are kept as they are).

    Args:
        data (Data): The graph: ``x``, ``edge_index``, optional ``edge_weight``, ``y`` and
            masks.
        root (str or Path): Directory of the shards.
        parts (int): Processes per grid (:math:`x y z`).
        dtype (torch.dtype): Dtype of the normalized weights.

    Returns:
        The directory written (or the existing one, when it holds the shards of this graph).

    Raises:
        ValueError: The directory holds the shards of another graph (an edited one): nothing
            is overwritten.
    """
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    from ..partition.fingerprint import graph_fingerprint

    n, parts = int(data.num_nodes), int(parts)
    check_strata(n, 2, parts)
    out = _directory(root, parts)
    fingerprint = graph_fingerprint(data)
    meta = read_meta(root, parts)
    if meta is not None:
        if (meta.get("fingerprint"), meta.get("dtype")) != (fingerprint, _dtype_name(dtype)):
            raise ValueError(
                f"{out} holds the shards of another graph (or weight dtype {meta.get('dtype')}): "
                f"its fingerprint is {str(meta.get('fingerprint'))[:16]}, this graph's "
                f"{fingerprint[:16]}. Cut this one into another root, or move that directory "
                "away (nothing is deleted for you)")
        return out
    if out.exists():
        raise FileExistsError(f"{out} exists but holds no shards this version reads: move it "
                              "away (nothing is deleted for you) and write them again")
    if data.x is None or data.x.dim() != 2:
        raise ValueError("write_shards needs node features x of shape [N, F]")
    edge_index, weight = gcn_norm(data.edge_index.long(), getattr(data, "edge_weight", None),
                                  n, add_self_loops=True, dtype=dtype)
    src, dst = edge_index[0], edge_index[1]
    order = torch.argsort(dst * n + src)
    src, dst, weight = src[order], dst[order], weight[order]
    del edge_index, order
    bounds = strata_bounds(n, parts)
    cols = strata_bounds(data.x.size(1), parts)
    index_dtype = torch.int32 if n < 2 ** 31 else torch.long
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".grid-{parts}-", dir=out.parent))
    try:
        edge_bounds = torch.searchsorted(dst, bounds)
        for j in range(parts):
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            e0, e1 = int(edge_bounds[j]), int(edge_bounds[j + 1])
            s, d, w = src[e0:e1], dst[e0:e1] - lo, weight[e0:e1]
            of = torch.searchsorted(bounds, s, right=True) - 1
            for k in range(parts):
                keep = of == k
                rowptr = torch.zeros(hi - lo + 1, dtype=torch.long)
                torch.cumsum(torch.bincount(d[keep], minlength=hi - lo), 0, out=rowptr[1:])
                torch.save({"rowptr": rowptr, "col": s[keep].to(index_dtype),
                            "weight": w[keep].clone()}, tmp / f"adj-{j}-{k}.pt")
                torch.save(data.x[lo:hi, int(cols[k]):int(cols[k + 1])].clone(),
                           tmp / f"x-{j}-{k}.pt")
        nodes = {key: data[key] for key in NODE_KEYS if getattr(data, key, None) is not None}
        torch.save(nodes, tmp / "nodes.pt")
        num_classes = int(data.y.max()) + 1 if getattr(data, "y", None) is not None \
            and data.y.dim() == 1 else None
        (tmp / "meta.json").write_text(json.dumps({
            "format": FORMAT, "parts": parts, "num_nodes": n, "num_edges": int(src.numel()),
            "num_features": int(data.x.size(1)), "num_classes": num_classes,
            "keys": sorted(nodes), "dtype": _dtype_name(dtype), "fingerprint": fingerprint}))
        try:
            os.replace(tmp, out)
        except OSError:
            theirs = read_meta(root, parts)
            if theirs is None or theirs.get("fingerprint") != fingerprint:
                raise
            shutil.rmtree(tmp)  # written meanwhile by another process (node): keep theirs
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class GraphShard:
    r"""The tiles of the graph one process of a grid holds (see the module docstring), and
    its part of every mini-batch.

    Args:
        root (str or Path): Directory given to :func:`write_shards`.
        plan (ShardPlan): What this process needs.

    Example::

        shard = GraphShard(root, ShardPlan(sizes, coords, "x", "y", pairs))
        batch = shard.sample(step, replica, batch_size, seed)  # this process's part
    """

    def __init__(self, root: Union[str, Path], plan: ShardPlan) -> None:
        meta = read_meta(root, plan.parts)
        if meta is None:
            raise FileNotFoundError(
                f"no shards for a grid of {plan.parts} processes under {root}: write them "
                f"first with lightning_fullgraph.parallel.shards.write_shards(data, root, "
                f"{plan.parts})")
        self.plan, self.meta = plan, meta
        self.num_nodes, parts = int(meta["num_nodes"]), plan.parts
        self.num_features = int(meta["num_features"])
        directory = _directory(root, parts)
        self.bounds = strata_bounds(self.num_nodes, parts)
        self.tiles: Dict[Tuple[int, int], Tuple[Tensor, Tensor, Tensor]] = {}
        for j, k in plan.tiles():
            tile = torch.load(directory / f"adj-{j}-{k}.pt", weights_only=True)
            self.tiles[(j, k)] = (tile["rowptr"], tile["col"], tile["weight"])
        # The input block, filled tile by tile (no second copy of it at any time).
        self.row_strata, self.col_strata = plan.strata(plan.input_rows), \
            plan.strata(plan.input_cols)
        cols = strata_bounds(self.num_features, parts)
        rows0, rows1 = int(self.bounds[self.row_strata[0]]), \
            int(self.bounds[self.row_strata[-1] + 1])
        c0, c1 = int(cols[self.col_strata[0]]), int(cols[self.col_strata[-1] + 1])
        self.x: Optional[Tensor] = None
        for j in self.row_strata:
            for c in self.col_strata:
                part = torch.load(directory / f"x-{j}-{c}.pt", weights_only=True)
                if self.x is None:
                    self.x = part.new_empty((rows1 - rows0, c1 - c0))
                self.x[int(self.bounds[j]) - rows0:int(self.bounds[j + 1]) - rows0,
                       int(cols[c]) - c0:int(cols[c + 1]) - c0] = part
                del part
        self.row_offset = rows0
        self.nodes: Dict[str, Tensor] = torch.load(directory / "nodes.pt", weights_only=True)

    @property
    def parts(self) -> int:
        return self.plan.parts

    def _check(self, batch_size: int) -> None:
        check_strata(self.num_nodes, batch_size, self.parts)

    def sample(self, step: int, replica: int, batch_size: int, seed: int = 0) -> Data:
        r"""This process's part of the batch of :obj:`step` for :obj:`replica`: the input
        block of ``x`` (rows and columns of :attr:`plan`'s input axes), the edges of its
        adjacency blocks (positions in the batch, rescaled), and the batch's ``y`` and masks
        whole (every process computes the loss on the gathered logits)."""
        self._check(batch_size)
        nodes = stratified_nodes(self.num_nodes, batch_size, self.parts, seed, replica, step)
        where = strata_bounds(batch_size, self.parts)
        q = strata_inclusion(self.num_nodes, batch_size, self.parts,
                             getattr(torch, self.meta["dtype"]))
        sources, targets, weights = [], [], []
        for (j, k), (rowptr, col, weight) in self.tiles.items():
            b0, b1, c0, c1 = int(where[j]), int(where[j + 1]), int(where[k]), int(where[k + 1])
            rows, among = nodes[b0:b1], nodes[c0:c1]
            if rows.numel() == 0 or among.numel() == 0:
                continue
            local = rows - self.bounds[j]
            start = rowptr[local]
            counts = rowptr[local + 1] - start
            dst = torch.repeat_interleave(torch.arange(rows.numel()), counts)
            offsets = torch.cumsum(counts, 0) - counts
            pos = start[dst] + (torch.arange(int(counts.sum())) - offsets[dst])
            src_global = col[pos].long()
            at = torch.searchsorted(among, src_global).clamp(max=among.numel() - 1)
            keep = among[at] == src_global
            w = weight[pos[keep]]
            off = src_global[keep] != rows[dst[keep]]
            # As UniformVertexSampler divides (one stratum: by the float p).
            w[off] = w[off] / (q[j, k] if self.parts > 1 else
                               (batch_size - 1) / (self.num_nodes - 1))
            sources.append(at[keep] + c0)
            targets.append(dst[keep] + b0)
            weights.append(w)
        batch = self._batch(sources, targets, weights, batch_size)
        inputs = range(int(where[self.row_strata[0]]), int(where[self.row_strata[-1] + 1]))
        batch.x = self.x[nodes[inputs.start:inputs.stop] - self.row_offset]
        for key, value in self.nodes.items():
            batch[key] = value[nodes]
        batch.n_id = nodes
        return batch

    def full(self) -> Data:
        r"""This process's part of the whole graph, unscaled (evaluation): the input block
        and the edges of its adjacency blocks, in global ids."""
        sources, targets, weights = [], [], []
        for (j, k), (rowptr, col, weight) in self.tiles.items():
            counts = rowptr[1:] - rowptr[:-1]
            targets.append(torch.repeat_interleave(
                torch.arange(int(self.bounds[j]), int(self.bounds[j + 1])), counts))
            sources.append(col.long())
            weights.append(weight)
        batch = self._batch(sources, targets, weights, self.num_nodes)
        batch.x = self.x
        for key, value in self.nodes.items():
            batch[key] = value
        batch.n_id = torch.arange(self.num_nodes)
        return batch

    def _batch(self, sources: List[Tensor], targets: List[Tensor], weights: List[Tensor],
               num_nodes: int) -> Data:
        # Sorted by (destination, source), as the whole batch's edges are: the blocks a split
        # model cuts from them then sum in the same order as one process does.
        empty = torch.empty(0, dtype=torch.long)
        src = torch.cat(sources) if sources else empty
        dst = torch.cat(targets) if targets else empty
        weight = torch.cat(weights) if weights else torch.empty(0)
        order = torch.argsort(dst * num_nodes + src)
        batch = Data(edge_index=torch.stack([src[order], dst[order]]), edge_weight=weight[order],
                     num_nodes=num_nodes)
        batch[INPUT_BLOCK] = (self.plan.input_rows, self.plan.input_cols) != (None, None)
        return batch

    def nbytes(self) -> int:
        r"""Bytes of the tensors held (tiles, input block, labels and masks)."""
        held = [t for tile in self.tiles.values() for t in tile] + [self.x] + \
            list(self.nodes.values())
        return sum(t.numel() * t.element_size() for t in held if t is not None)


def plan_for(sizes: Dict[str, int], coords: Dict[str, int], splits: Sequence) -> ShardPlan:
    r"""The :class:`ShardPlan` of a process whose model is split by :obj:`splits`
    (split models, each naming its input layout and adjacency blocks:
    :meth:`~.grid_module.GridModule.shard_layout`); without splits, everything."""
    if not splits or sizes["x"] * sizes["y"] * sizes["z"] == 1:
        return ShardPlan(dict(sizes), dict(coords))
    layouts = [split.shard_layout() for split in splits]
    inputs = {layout[0] for layout in layouts}
    rows, cols = inputs.pop() if len(inputs) == 1 else (None, None)
    pairs = frozenset(pair for layout in layouts for pair in layout[1])
    return ShardPlan(dict(sizes), dict(coords), rows, cols, pairs)
