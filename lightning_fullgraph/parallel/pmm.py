r"""3-D parallel matrix products (ScaleGNN §IV-C): blocks, layouts and the collectives.

A matrix in *layout* ``(R, C)`` has its rows split over grid axis ``R`` and its columns over
axis ``C``, and is replicated along the third axis ``T``.  A GCN layer maps features in
layout ``(R, C)`` to layout ``(T, R)``:

.. code-block:: text

    H   = Ã[rows_T, cols_R] @ F[rows_R, cols_C]      all-reduce over R  ->  H   in (T, C)
    out = H[rows_T, cols_C] @ W[rows_C, cols_R]      all-reduce over C  ->  out in (T, R)

so the layouts rotate ``(x, y) -> (z, x) -> (y, z) -> (x, y)`` with period 3 and no
re-shuffle between layers (:func:`layer_axes`).  Each process stores one block of each
operand; the adjacency ``Ã`` is split by destination rows over ``T`` and source columns over
``R``.

Gradients follow from two conjugate operations (as in Megatron-LM's tensor parallelism):
:func:`reduce_from` sums partial products in the forward and passes the gradient through;
:func:`copy_to` passes the forward through and sums, in the backward, the gradients of the
replicas that used a tensor for *different* outputs.  :func:`all_reduce_sum` does both (a
sum every replica then uses differently, e.g. RMSNorm's squared norms).  Tensors replicated
along an axis whose processes do the *same* work get identical gradients and are not summed.
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["block", "layer_axes", "copy_to", "reduce_from", "all_reduce_sum", "GRID_AXES",
           "bytes_sent", "reset_bytes", "summed", "summed_async"]

GRID_AXES = ("x", "y", "z")

# Bytes this process sent in the grid's all-reduces, counted as a ring all-reduce sends them:
# 2 (g - 1) / g of the payload for a group of g.
_sent = [0.0]


def bytes_sent() -> float:
    r"""Bytes this process has sent in :mod:`.pmm` all-reduces since :func:`reset_bytes`."""
    return _sent[0]


def reset_bytes() -> None:
    _sent[0] = 0.0


def block(n: int, parts: int, index: int) -> slice:
    r"""The :obj:`index`-th of :obj:`parts` contiguous, balanced blocks of ``range(n)``."""
    if not 0 <= index < parts:
        raise ValueError(f"block {index} of {parts}")
    return slice(index * n // parts, (index + 1) * n // parts)


def layer_axes(layer: int) -> Tuple[str, str, str]:
    r"""``(R, C, T)`` of GCN layer :obj:`layer` (1-based): its input is in layout ``(R, C)``,
    its output in ``(T, R)``.  Layer 1 takes the input projection's ``(x, y)``."""
    r, c, t = GRID_AXES
    for _ in range((layer - 1) % 3):
        r, c, t = t, r, c
    return r, c, t


def _active(group: Optional[object]) -> bool:
    return group is not None and dist.is_available() and dist.is_initialized() and \
        dist.get_world_size(group) > 1


def summed(t: Tensor, group: Optional[object], bf16: bool = False) -> Tensor:
    r"""A sum of :obj:`t` over :obj:`group` (a new tensor; counted in :func:`bytes_sent`;
    :obj:`t` itself when the group is a single process).

    With :obj:`bf16` (floating-point :obj:`t`) the sum is a reduce-scatter and an all-gather
    with a bfloat16 wire (:func:`_summed_bf16`): half the bytes of a ring all-reduce in fp32 at
    any group size, accumulated in fp32, and the same result on every member.
    """
    if not _active(group):
        return t
    g = dist.get_world_size(group)
    if bf16 and t.is_floating_point() and t.dtype != torch.bfloat16:
        return _summed_bf16(t, group, g)
    t = t.contiguous().clone()
    _sent[0] += 2.0 * (g - 1) / g * t.numel() * t.element_size()
    dist.all_reduce(t, group=group)
    return t


def _summed_bf16(t: Tensor, group: object, g: int) -> Tensor:
    # Reduce-scatter as one all_to_all_single: member j receives every member's j-th chunk
    # (bfloat16, sent as bytes: gloo has no bfloat16 or int16 collectives) and adds them in
    # fp32, in rank order, its own chunk unrounded; then the sums go round as bfloat16
    # (all_gather), so every member ends with the same rounded values.  Bytes per member:
    # 2 (g - 1) / g of the payload at two bytes a value, against 2 (g - 1) / g at four for a
    # ring all-reduce in fp32.
    n, rank = t.numel(), dist.get_rank(group)
    chunk = -(-n // g)
    flat = t.new_zeros(g * chunk, dtype=torch.float32)
    flat[:n] = t.reshape(-1)
    wire = flat.to(torch.bfloat16).view(torch.uint8)  # [g * chunk * 2] bytes
    received = torch.empty_like(wire)
    dist.all_to_all_single(received, wire, group=group)
    parts = received.view(torch.bfloat16).view(g, chunk).to(torch.float32)
    parts[rank] = flat.view(g, chunk)[rank]
    mine = parts.sum(0).to(torch.bfloat16).view(torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(g)]
    dist.all_gather(gathered, mine, group=group)
    _sent[0] += 2 * (g - 1) * chunk * 2
    total = torch.cat(gathered).view(torch.bfloat16)[:n]
    return total.to(t.dtype).reshape(t.shape)


def summed_async(t: Tensor, group: Optional[object]) -> Tuple[Tensor, Optional[object]]:
    r"""Starts the sum of :obj:`t` over :obj:`group`: ``(result, work)``, the result valid
    after ``work.wait()`` (``work`` is ``None`` for a single process: the result is
    :obj:`t`).  Counted in :func:`bytes_sent` like :func:`summed`."""
    if not _active(group):
        return t, None
    g = dist.get_world_size(group)
    t = t.contiguous().clone()
    _sent[0] += 2.0 * (g - 1) / g * t.numel() * t.element_size()
    return t, dist.all_reduce(t, group=group, async_op=True)


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group, bf16: bool = False) -> Tensor:
        ctx.group, ctx.bf16 = group, bf16
        return x

    @staticmethod
    def backward(ctx, grad: Tensor):
        return summed(grad, ctx.group, ctx.bf16), None, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group, bf16: bool = False) -> Tensor:
        return summed(x, group, bf16)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None, None


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        return summed(x, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return summed(grad, ctx.group), None


def copy_to(x: Tensor, group: Optional[object], bf16: bool = False) -> Tensor:
    r"""Identity forward; backward sums the gradient over :obj:`group` (the replicas of
    :obj:`x` along the group's axis use it for different outputs); :obj:`bf16`: the
    summands cross the wire as bfloat16 (:func:`summed`)."""
    return _CopyTo.apply(x, group, bf16)


def reduce_from(x: Tensor, group: Optional[object], bf16: bool = False) -> Tensor:
    r"""Sums partial products over :obj:`group`; the gradient passes through unchanged;
    :obj:`bf16`: the summands cross the wire as bfloat16 (:func:`summed`)."""
    return _ReduceFrom.apply(x, group, bf16)


def all_reduce_sum(x: Tensor, group: Optional[object]) -> Tensor:
    r"""Sums over :obj:`group` forward and backward (a sum every member then uses for its own
    part of the work)."""
    return _AllReduceSum.apply(x, group)
