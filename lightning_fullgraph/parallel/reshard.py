r"""Moving a replicated block matrix from one grid layout to another (the residual of a
rotating 3-D layer: features in layout ``(R, C)`` are added to a layer output in ``(T, R)``).

Every process of the grid holds the block of the source layout given by its coordinates, and
needs the block of the destination layout.  One ``all_to_all`` moves exactly the overlaps:
the replicas of a source block at third-axis coordinate 0 send each process the part of their
block that falls in its destination block; nothing else crosses the wire (about
:math:`N h / |grid|` values per process instead of the whole matrix).  Backward is the
transpose: the destination replicas at their third-axis coordinate 0 send every holder of a
source block (all its replicas: they must all get the complete gradient) the overlapping part
of the gradient.
"""
from typing import Callable, Dict, List, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from . import pmm
from .pmm import block

__all__ = ["Layout", "reshard", "reshard_start"]

#: ``(row axes, column axes)`` of a block layout over the grid axes ``x``, ``y``, ``z``: each
#: one axis, or a tuple of axes whose coordinates index the blocks in mixed radix (``()``: not
#: split), e.g. ``("x", "y")`` or ``(("x", "y", "z"), ())`` (rows over the whole grid, in the
#: grid group's rank order).  The processes along the axes in neither hold equal copies.
Layout = Tuple[Union[str, Tuple[str, ...]], Union[str, Tuple[str, ...]]]
_AXES = ("x", "y", "z")


def _axes(part: Union[str, Tuple[str, ...]]) -> Tuple[str, ...]:
    return (part, ) if isinstance(part, str) else tuple(part)


def _replicated(layout: Layout) -> Tuple[str, ...]:
    used = _axes(layout[0]) + _axes(layout[1])
    return tuple(a for a in _AXES if a not in used)


def _split(n: int, coords: Dict[str, int], sizes: Dict[str, int], axes: Tuple[str, ...]) -> slice:
    index, count = 0, 1
    for a in axes:
        index, count = index * sizes[a] + coords[a], count * sizes[a]
    return block(n, count, index)


def _blk(coords: Dict[str, int], sizes: Dict[str, int], layout: Layout, n: int,
         h: int) -> Tuple[slice, slice]:
    return (_split(n, coords, sizes, _axes(layout[0])),
            _split(h, coords, sizes, _axes(layout[1])))


def _overlap(a: Tuple[slice, slice], b: Tuple[slice, slice]) -> Tuple[slice, slice]:
    rows = slice(max(a[0].start, b[0].start), max(max(a[0].start, b[0].start),
                                                  min(a[0].stop, b[0].stop)))
    cols = slice(max(a[1].start, b[1].start), max(max(a[1].start, b[1].start),
                                                  min(a[1].stop, b[1].stop)))
    return rows, cols


def _size(piece: Tuple[slice, slice]) -> int:
    return (piece[0].stop - piece[0].start) * (piece[1].stop - piece[1].start)


def _local(piece: Tuple[slice, slice], within: Tuple[slice, slice]) -> Tuple[slice, slice]:
    return (slice(piece[0].start - within[0].start, piece[0].stop - within[0].start),
            slice(piece[1].start - within[1].start, piece[1].stop - within[1].start))


def _start(x: Tensor, group, members: List[Dict[str, int]], me: int, sizes: Dict[str, int],
           src: Layout, dst: Layout, n: int, h: int, bf16: bool = False,
           async_op: bool = False) -> Callable[[], Tensor]:
    r"""Sends the pieces of :obj:`x` (see :func:`_exchange`); returns the function that
    waits for the received pieces and assembles this process's :obj:`dst` block."""
    owner = _replicated(src)
    mine_src = _blk(members[me], sizes, src, n, h)
    mine_dst = _blk(members[me], sizes, dst, n, h)
    sends, send_counts, recv_pieces, recv_counts = [], [], [], []
    for q in members:
        q_dst, q_src = _blk(q, sizes, dst, n, h), _blk(q, sizes, src, n, h)
        piece = _overlap(mine_src, q_dst) if all(members[me][a] == 0 for a in owner) \
            else (slice(0, 0), slice(0, 0))
        rows, cols = _local(piece, mine_src)
        sends.append(x[rows, cols].reshape(-1))
        send_counts.append(_size(piece))
        incoming = _overlap(q_src, mine_dst) if all(q[a] == 0 for a in owner) \
            else (slice(0, 0), slice(0, 0))
        recv_pieces.append(incoming)
        recv_counts.append(_size(incoming))
    send = torch.cat(sends)
    wide = 2 if bf16 and x.is_floating_point() else 1  # bytes per value on a bf16 wire
    if wide == 2:
        wire = send.to(torch.bfloat16).view(torch.uint8)
        received = wire.new_empty(2 * sum(recv_counts))
        pmm._sent[0] += (sum(send_counts) - send_counts[me]) * 2
    else:
        wire, received = send.contiguous(), x.new_empty(sum(recv_counts))
        pmm._sent[0] += (sum(send_counts) - send_counts[me]) * x.element_size()
    work = dist.all_to_all_single(received, wire,
                                  output_split_sizes=[wide * c for c in recv_counts],
                                  input_split_sizes=[wide * c for c in send_counts],
                                  group=group, async_op=async_op)
    shape = (mine_dst[0].stop - mine_dst[0].start, mine_dst[1].stop - mine_dst[1].start)

    def finish() -> Tensor:
        if work is not None and async_op:
            work.wait()
        recv = received.view(torch.bfloat16).to(x.dtype) if wide == 2 else received
        out = x.new_empty(shape)
        for piece, part in zip(recv_pieces, torch.split(recv, recv_counts)):
            if part.numel():
                rows, cols = _local(piece, mine_dst)
                out[rows, cols] = part.view(rows.stop - rows.start, cols.stop - cols.start)
        return out
    return finish


def _exchange(x: Tensor, group, members: List[Dict[str, int]], me: int,
              sizes: Dict[str, int], src: Layout, dst: Layout, n: int, h: int,
              bf16: bool = False) -> Tensor:
    r"""The replicas of every :obj:`src` block at coordinate 0 of its third axis send each
    process the overlap with its :obj:`dst` block; returns this process's :obj:`dst` block
    (covered exactly once: the senders' blocks tile the matrix).  :obj:`bf16`: the pieces
    travel as bfloat16 (as bytes; the piece a process keeps is rounded too, as its replicas
    receive it)."""
    return _start(x, group, members, me, sizes, src, dst, n, h, bf16)()


class _Reshard(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group, members, me, sizes, src, dst, n, h, bf16) -> Tensor:
        ctx.args = (group, members, me, sizes, src, dst, n, h, bf16)
        return _exchange(x, group, members, me, sizes, src, dst, n, h, bf16)

    @staticmethod
    def backward(ctx, grad: Tensor):
        group, members, me, sizes, src, dst, n, h, bf16 = ctx.args
        # The transpose: the destination blocks' owners send every holder of a source block
        # (all its replicas) the overlapping part of the gradient.
        out = _exchange(grad.contiguous(), group, members, me, sizes, dst, src, n, h, bf16)
        return (out, ) + (None, ) * 9


class _ReshardFinish(torch.autograd.Function):
    r"""The block a :func:`reshard_start` moved, once it has arrived (forward); the gradient
    goes back synchronously, as :class:`_Reshard`'s does."""

    @staticmethod
    def forward(ctx, x: Tensor, finish, group, members, me, sizes, src, dst, n, h,
                bf16) -> Tensor:
        ctx.args = (group, members, me, sizes, src, dst, n, h, bf16)
        return finish()

    @staticmethod
    def backward(ctx, grad: Tensor):
        group, members, me, sizes, src, dst, n, h, bf16 = ctx.args
        out = _exchange(grad.contiguous(), group, members, me, sizes, dst, src, n, h, bf16)
        return (out, ) + (None, ) * 10


def reshard_start(x: Tensor, group, members: List[Dict[str, int]], me: int,
                  sizes: Dict[str, int], src: Layout, dst: Layout, n: int, h: int,
                  bf16: bool = False) -> Callable[[], Tensor]:
    r""":func:`reshard` in two halves, so that the exchange runs while the caller computes
    (ScaleGNN §IV-C: the residual's reshard overlaps the layer's products): starts sending
    :obj:`x`'s pieces and returns the function that waits for this process's block and
    returns it (differentiable; its backward is synchronous).  Every process of the group
    must start its reshards in the same order."""
    if len(members) == 1:
        return lambda: x.clone()
    finish = _start(x.detach(), group, members, me, sizes, src, dst, n, h, bf16, async_op=True)
    return lambda: _ReshardFinish.apply(x, finish, group, members, me, sizes, src, dst, n, h,
                                        bf16)


def reshard(x: Tensor, group, members: List[Dict[str, int]], me: int, sizes: Dict[str, int],
            src: Layout, dst: Layout, n: int, h: int, bf16: bool = False) -> Tensor:
    r"""This process's block of the :obj:`dst` layout of the :math:`n \times h` matrix whose
    :obj:`src` block :obj:`x` it holds (differentiable).

    Args:
        x (torch.Tensor): This process's block in layout :obj:`src`.
        group (ProcessGroup): The replica's grid (every member in :obj:`members` order).
        members (List[Dict[str, int]]): The grid coordinates of every group member, in group
            rank order.
        me (int): This process's index in :obj:`members`.
        sizes (Dict[str, int]): Grid size along ``x``, ``y``, ``z``.
        src, dst (Layout): ``(row axis, column axis)`` of the two layouts.
        n, h (int): Rows and columns of the whole matrix.
        bf16 (bool): The pieces (and their gradients) cross the wire as bfloat16.
    """
    if len(members) == 1:
        return x.clone()
    return _Reshard.apply(x, group, members, me, sizes, src, dst, n, h, bf16)
