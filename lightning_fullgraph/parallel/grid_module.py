r"""What every model split over a 3-D grid shares: its weight blocks, the GCN layer's two
parallel products, dropout masks that replicas agree on, gathered logits and the gradient
reduction (ScaleGNN §IV-C; see :mod:`.pmm` for the layouts).

A subclass keeps each weight's block with :meth:`GridModule.keep`, naming the axis that splits
each dimension and the axes over which its gradient is summed (those whose processes use the
block for other rows); :meth:`GridModule.full_state_dict` and
:meth:`GridModule.load_full_state_dict` translate between the blocks and the ``state_dict``
of the model on one process.
"""
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from ..memo import anchor, signature
from . import pmm
from .mesh import FourDMesh
from .pmm import block, copy_to, layer_axes, reduce_from, summed
from .reshard import reshard, reshard_start
from .sampling import sample_seed
from .scalegnn import aggregate_sum

__all__ = ["GridModule"]


@dataclass(frozen=True)
class _Block:
    key: str                        # name in the single-process state_dict
    transpose: bool                 # the block is of key.t() (linear weights: (in, out))
    shape: Tuple[int, ...]          # full shape, in the block's orientation
    split: Tuple[Optional[str], ...]  # axis splitting each dimension (None: whole)
    sum_over: Tuple[str, ...]       # axes the gradient is summed over
    buffer: bool = False            # a buffer (running statistics), not a parameter


class _GatherRows(torch.autograd.Function):
    r"""All row blocks on every process; backward keeps this block's rows (the loss on the
    gathered rows is the same computation on every process)."""

    @staticmethod
    def forward(ctx, rows: Tensor, group, sizes: List[int], index: int) -> Tensor:
        ctx.sizes, ctx.index = sizes, index
        if len(sizes) == 1:
            return rows.clone()
        longest = max(sizes)
        padded = rows.new_zeros((longest, ) + tuple(rows.shape[1:]))
        padded[:rows.size(0)] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous(), group=group)
        pmm._sent[0] += (len(sizes) - 1) * padded.numel() * padded.element_size()
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: Tensor):
        start = sum(ctx.sizes[:ctx.index])
        return grad[start:start + ctx.sizes[ctx.index]].contiguous(), None, None, None


class GridModule(torch.nn.Module):
    r"""Base of the models split over a replica's 3-D grid.

    Args:
        mesh (FourDMesh): This rank's groups.
        seed (int): Seed of the dropout masks (replicas of a block draw the same mask).
        bf16_comm (bool): The parallel products' partial sums, their gradients and the
            weight-gradient reduction (over the grid's axes and the replicas, as DDP's bf16
            compression hook) cross the wire as bfloat16, summed in fp32
            (:func:`~.pmm.summed`); the logits stay fp32.
    """

    def __init__(self, mesh: FourDMesh, seed: int = 0, bf16_comm: bool = False) -> None:
        super().__init__()
        self.mesh, self.seed, self.bf16_comm = mesh, int(seed), bool(bf16_comm)
        self._blocks: Dict[str, _Block] = {}
        self._adjacency: Dict[tuple, Tuple[Tensor, Optional[Tensor]]] = {}
        self._batch_key: Optional[tuple] = None  # (weak ref to the batch's edge list, key)
        self._grid_members: Optional[tuple] = None  # reshard's view of the grid group
        # (batch rows, shape) of an input that is this process's block, not the batch's rows
        # (sharded data: bind_input).
        self._input_block: Optional[Tuple[int, tuple]] = None
        # Training forwards so far: seeds the dropout masks.  Checkpoint state (with the
        # random states: surgery.grid_steps), not a parameter of the single-process model.
        self.step = 0

    def __getstate__(self) -> dict:
        # The current batch's blocks are a cache of its edge list, and a weak reference
        # cannot be pickled: a saved module (torch.save, deepcopy) starts a new batch.
        state = dict(self.__dict__)
        state["_batch_key"], state["_adjacency"] = None, {}
        return state

    # -- blocks -----------------------------------------------------------------------------
    def _cols(self, n: int, axis: Optional[str]) -> slice:
        if axis is None:
            return slice(0, n)
        return block(n, self.mesh.size(axis), self.mesh.coordinate(axis))

    def keep(self, name: str, full: Tensor, key: str, split: Sequence[Optional[str]],
             sum_over: Sequence[str], transpose: bool = False) -> None:
        r"""Registers this process's block of :obj:`full` (``key`` in the single-process
        ``state_dict``; :obj:`transpose`: of ``full.t()``) as parameter :obj:`name`."""
        value = full.detach().t() if transpose else full.detach()
        info = _Block(key, transpose, tuple(value.shape), tuple(split), tuple(sum_over))
        self._blocks[name] = info
        self.register_parameter(name, torch.nn.Parameter(value[self._index(info)].clone()))

    def keep_buffer(self, name: str, full: Tensor, key: str,
                    split: Sequence[Optional[str]]) -> None:
        r"""Registers this process's block of the buffer :obj:`full` (``key`` in the
        single-process ``state_dict``, e.g. running statistics) as buffer :obj:`name`; its
        processes along the axes not splitting it hold equal copies."""
        info = _Block(key, False, tuple(full.shape), tuple(split), (), buffer=True)
        self._blocks[name] = info
        self.register_buffer(name, full.detach()[self._index(info)].clone())

    def _index(self, info: _Block) -> tuple:
        return tuple(self._cols(n, axis) for n, axis in zip(info.shape, info.split))

    def blocks(self) -> List[Tuple[str, Tensor, tuple]]:
        r"""``(name, block, index into the full parameter)`` of every block held; the full
        parameter is the single-process one, transposed for linear weights (``(in, out)``)."""
        return [(name, getattr(self, name), self._index(info))
                for name, info in self._blocks.items() if not info.buffer]

    def full_state_dict(self) -> Dict[str, Tensor]:
        r"""The single-process ``state_dict`` of the split weights (and buffers), assembled
        from every process's blocks (a collective over the replica's grid)."""
        out: Dict[str, Tensor] = {}
        for name, info in self._blocks.items():
            param = getattr(self, name).detach()
            value = param.new_zeros(info.shape)
            # One copy of each block: its holder at coordinate 0 of the axes not splitting it.
            if all(self.mesh.coordinate(a) == 0 for a in ("x", "y", "z")
                   if a not in info.split):
                value[self._index(info)] = param
            value = summed(value, self.mesh.group("grid"))
            out[info.key] = value.t().contiguous() if info.transpose else value
        return out

    @torch.no_grad()
    def load_full_state_dict(self, state: Dict[str, Tensor]) -> None:
        r"""Copies this process's blocks out of a single-process ``state_dict`` into the
        existing parameters (an optimizer holding them stays valid); no communication."""
        for name, info in self._blocks.items():
            if info.key not in state:
                raise KeyError(f"state_dict has no '{info.key}' (for block '{name}')")
            full = state[info.key].t() if info.transpose else state[info.key]
            if tuple(full.shape) != info.shape:
                raise ValueError(f"'{info.key}' has shape {tuple(full.shape)}, the split model "
                                 f"expects {info.shape} (another model size?)")
            getattr(self, name).copy_(full[self._index(info)])

    def reduce_gradients(self, coalesce: bool = True) -> None:
        r"""Sums every block's gradient over the axes whose processes computed other rows'
        share of it, then averages over the data-parallel replicas (call after backward).

        With :obj:`coalesce` (default) the blocks summed over the same axis travel in one
        buffer, the buffers of different axes are all-reduced at the same time (independent
        groups, asynchronous), and all of them are averaged over the replicas in one more
        all-reduce: a handful of collectives per step instead of two per block (the same
        bytes); ``coalesce=False`` reduces block by block (the reference)."""
        if not coalesce:
            for name, info in self._blocks.items():
                p = getattr(self, name)
                if info.buffer or p.grad is None:
                    continue
                grad = p.grad
                for axis in info.sum_over:
                    grad = summed(grad, self.mesh.group(axis), self.bf16_comm)
                p.grad.copy_(summed(grad, self.mesh.group("dp"), self.bf16_comm)
                             / self.mesh.size("dp"))
            return
        by_axes: Dict[Tuple[str, ...], List[torch.nn.Parameter]] = {}
        for name, info in self._blocks.items():
            p = getattr(self, name)
            if not info.buffer and p.grad is not None:
                by_axes.setdefault(info.sum_over, []).append(p)
        if not by_axes:
            return
        flats = {axes: torch.cat([p.grad.reshape(-1) for p in params])
                 for axes, params in by_axes.items()}
        for depth in range(max(len(axes) for axes in flats)):
            pending = [pmm.summed_async(flats[axes], self.mesh.group(axes[depth]))
                       if not self.bf16_comm else
                       (summed(flats[axes], self.mesh.group(axes[depth]), True), None)
                       for axes in flats if len(axes) > depth]
            for axes, (total, work) in zip([a for a in flats if len(a) > depth], pending):
                if work is not None:
                    work.wait()
                flats[axes] = total
        order = list(flats)
        every = summed(torch.cat([flats[axes] for axes in order]), self.mesh.group("dp"),
                       self.bf16_comm) / self.mesh.size("dp")
        offset = 0
        for axes in order:
            for p in by_axes[axes]:
                n = p.grad.numel()
                p.grad.copy_(every[offset:offset + n].view_as(p.grad))
                offset += n

    # -- what a process needs of the graph (sharded data) ------------------------------------
    #: The axes splitting the rows and columns of the input (``None``: whole rows/columns).
    input_layout: Tuple[Optional[str], Optional[str]] = (None, None)

    def shard_layout(self) -> Tuple[Tuple[Optional[str], Optional[str]], frozenset]:
        r"""``(input layout, adjacency blocks)``: the axes splitting the input's rows and
        columns, and the ``(destination axis, source axis)`` of every adjacency block the
        layers multiply (:class:`~.shards.ShardPlan`)."""
        pairs = frozenset((layer_axes(layer)[2], layer_axes(layer)[0])
                          for layer in range(1, getattr(self, "num_layers", 1) + 1))
        return self.input_layout, pairs

    def bind_input(self, num_nodes: int, shape: Sequence[int]) -> None:
        r"""The next inputs of shape :obj:`shape` are this process's block of the input
        layout of a batch of :obj:`num_nodes` rows (sharded data:
        :class:`~lightning_fullgraph.data.sampled.ShardedNodeDataModule`), not whole rows."""
        self._input_block = (int(num_nodes), tuple(shape))

    def input_block(self, x: Tensor, width: int) -> Tuple[int, Tensor]:
        r"""``(batch rows, this process's block of x)``: :obj:`x` itself when it is the bound
        block (:meth:`bind_input`), else cut from the whole rows of :obj:`x` (:obj:`width`
        columns) along :attr:`input_layout`."""
        bound = self._input_block
        if bound is not None and tuple(x.shape) == bound[1]:
            return bound[0], x
        n = x.size(0)
        rows, cols = self.input_layout
        return n, x[self._cols(n, rows), self._cols(width, cols)]

    # -- the pieces of a forward --------------------------------------------------------------
    def new_batch(self, edge_index: Tensor, n: int) -> bool:
        r"""Forgets the adjacency blocks when :obj:`edge_index` (of :obj:`n` vertices) is
        another mini-batch's; returns whether it was."""
        # The very tensor, unmodified (memo.signature), and alive: a new batch's edge list
        # may be allocated where the last one's was freed, with the same shape and version.
        key = (signature(edge_index), n)
        last = self._batch_key
        if last is not None and last[0]() is anchor(edge_index) and last[1] == key:
            return False
        self._adjacency.clear()
        self._batch_key = (weakref.ref(anchor(edge_index)), key)
        return True

    def _adjacency_block(self, edge_index: Tensor, edge_weight: Optional[Tensor], n: int,
                         dst_axis: str, src_axis: str) -> Tuple[Tensor, Optional[Tensor], int]:
        rows, cols = self._cols(n, dst_axis), self._cols(n, src_axis)
        key = (dst_axis, src_axis)
        if key not in self._adjacency:
            src, dst = edge_index[0], edge_index[1]
            keep = (dst >= rows.start) & (dst < rows.stop) & (src >= cols.start) & \
                (src < cols.stop)
            local = torch.stack([src[keep] - cols.start, dst[keep] - rows.start])
            self._adjacency[key] = (local, edge_weight[keep] if edge_weight is not None
                                    else None)
        local, weight = self._adjacency[key]
        return local, weight, rows.stop - rows.start

    def gcn_product(self, feats: Tensor, weight: Tensor, layer: int, edge_index: Tensor,
                    edge_weight: Optional[Tensor], n: int) -> Tensor:
        r""":math:`Ã X W` of layer :obj:`layer`: :obj:`feats` in layout ``(R, C)``, the result in
        ``(T, R)`` (replicated along ``C``)."""
        group, bf16 = self.mesh.group, self.bf16_comm
        r, c, _ = layer_axes(layer)
        # R's processes use the sum for other output columns: its gradient is summed over R.
        agg = copy_to(self.aggregate(feats, layer, edge_index, edge_weight, n), group(r), bf16)
        return reduce_from(agg @ weight, group(c), bf16)  # (t, r)

    def aggregate(self, feats: Tensor, layer: int, edge_index: Tensor,
                  edge_weight: Optional[Tensor], n: int) -> Tensor:
        r""":math:`Ã X` of layer :obj:`layer`: :obj:`feats` in layout ``(R, C)``, the sum in
        ``(T, C)`` (replicated along ``R``; its gradient passes through to each partial)."""
        group, bf16 = self.mesh.group, self.bf16_comm
        r, _, t = layer_axes(layer)
        adj, values, n_dst = self._adjacency_block(edge_index, edge_weight, n, t, r)
        agg = aggregate_sum(copy_to(feats, group(t), bf16), adj, values, n_dst)
        return reduce_from(agg, group(r), bf16)  # (t, c)

    def reshard(self, x: Tensor, n: int, width: int, src, dst, overlapped: bool = False):
        r"""This process's block of the :obj:`dst` layout of the ``n x width`` matrix whose
        :obj:`src` block :obj:`x` it holds (:func:`~.reshard.reshard`); with
        :obj:`overlapped`, the function that waits for it (:func:`~.reshard.reshard_start`:
        the exchange travels while the caller computes)."""
        if self._grid_members is None:  # the mesh does not change: once
            dims = self.mesh.dims
            members = [dims.coordinates(r) for r in dims.group_ranks("x", "y", "z")[
                self.mesh.coordinate("dp")]]
            self._grid_members = (members, members.index(dims.coordinates(self.mesh.rank)),
                                  {a: self.mesh.size(a) for a in ("x", "y", "z")})
        members, me, sizes = self._grid_members
        move = reshard_start if overlapped else reshard
        return move(x, self.mesh.group("grid"), members, me, sizes, src, dst, n, width,
                    self.bf16_comm)

    def dropout_mask(self, x: Tensor, p: float, layer: int, t: str, r: str) -> Tensor:
        r"""Dropout of a block in layout ``(t, r)``: its replicas draw the same mask."""
        if not self.training or p == 0.0:
            return x
        g = torch.Generator(device=x.device)
        g.manual_seed(sample_seed(self.seed, self.mesh.coordinate("dp"),
                                  ((self.step * 64 + layer) * 64 + self.mesh.coordinate(t)) * 64
                                  + self.mesh.coordinate(r)))
        keep = torch.rand(x.shape, generator=g, device=x.device) >= p
        return x * keep / (1.0 - p)

    def gather_rows(self, rows: Tensor, n: int, axis: str) -> Tensor:
        r"""The :obj:`n` rows split over :obj:`axis`, on every process (differentiable)."""
        parts = self.mesh.size(axis)
        sizes = [block(n, parts, i).stop - block(n, parts, i).start for i in range(parts)]
        return _GatherRows.apply(rows, self.mesh.group(axis), sizes, self.mesh.coordinate(axis))
