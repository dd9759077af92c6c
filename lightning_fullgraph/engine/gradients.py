"""Parameter synchronization for partitioned training.

Every rank holds a full replica of the parameters.  The loss of rank ``r`` is a
mean over its ``n_r`` training nodes while the single-process loss is a mean over
all ``N`` of them, so each rank back-propagates ``n_r / N`` times its loss (the
halo exchange carries cross-rank terms in backward) and the parameter gradients
are then *summed* over ranks: the result is the single-process gradient.
"""
from typing import Any, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["broadcast_parameters", "all_reduce_gradients", "loss_weight"]

_BUCKET_BYTES = 32 * 2**20


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def broadcast_parameters(module: torch.nn.Module, src: int = 0,
                         group: Optional[Any] = None) -> None:
    r"""Copies parameters and buffers of rank :obj:`src` to every rank."""
    if _world(group) == 1:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=src, group=group)


def all_reduce_gradients(params: Iterable[Tensor], group: Optional[Any] = None) -> None:
    r"""Sums ``.grad`` of :obj:`params` over ranks in flat buckets.

    Parameters without a gradient take part as zeros, so every rank issues the
    same collectives whatever its local graph touched.
    """
    if _world(group) == 1:
        return
    params = [p for p in params if p.requires_grad]
    bucket: List[Tensor] = []
    size = 0
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= _BUCKET_BYTES:
            _reduce_bucket(bucket, group)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, group)


def _reduce_bucket(params: List[Tensor], group) -> None:
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for same in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in same])
        dist.all_reduce(flat, group=group)
        offset = 0
        for p in same:
            n = p.numel()
            p.grad.copy_(flat[offset:offset + n].view_as(p.grad))
            offset += n


def loss_weight(local_count: int, global_count: int) -> float:
    r"""Factor turning a rank's mean loss into its share of the global mean loss."""
    if global_count <= 0:
        raise ValueError("the training mask selects no node in the whole graph")
    return float(local_count) / float(global_count)
