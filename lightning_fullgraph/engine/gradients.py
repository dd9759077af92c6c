"""Parameter synchronization for partitioned training.

Every rank holds a full replica of the parameters.  The loss of rank ``r`` is a
mean over its ``n_r`` training nodes while the single-process loss is a mean over
all ``N`` of them, so each rank back-propagates ``n_r / N`` times its loss (the
halo exchange carries cross-rank terms in backward) and the parameter gradients
are then *summed* over ranks: the result is the single-process gradient.  Each backward
pass is reduced once (:func:`reduce_backward`), so several ``manual_backward`` calls
before one optimizer step add up as on one process.
"""
from typing import Any, Callable, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .errors import guarded

__all__ = ["broadcast_parameters", "all_reduce_gradients", "reduce_backward", "loss_weight"]

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


def all_reduce_gradients(params: Iterable[Tensor], group: Optional[Any] = None,
                         timeout: Optional[Any] = None) -> None:
    r"""Sums ``.grad`` of :obj:`params` over ranks in flat buckets.

    Reduces what single-process training would have: a parameter whose gradient is
    :obj:`None` on *every* rank (unused, frozen by the graph) keeps :obj:`None`, so
    optimizers with weight decay or momentum leave it alone as they would on one
    process; one with a gradient on some ranks only gets zeros on the others first.
    Which parameters take part is agreed with one all-reduce of a presence mask, so all
    ranks issue the same collectives whatever their local graph touched.

    Args:
        params (Iterable[torch.Tensor]): Parameters (those without ``requires_grad``
            are skipped).
        group (ProcessGroup, optional): The process group.
        timeout (float or timedelta, optional): The group's timeout, for messages.
    """
    if _world(group) == 1:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    rank, peers = dist.get_rank(group), range(_world(group))
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8,
                           device=params[0].device)
    with guarded("gradient all-reduce (which parameters have gradients)", rank, peers,
                 timeout):
        dist.all_reduce(present, op=dist.ReduceOp.MAX, group=group)
    bucket: List[Tensor] = []
    size = 0
    for p, used in zip(params, present.tolist()):
        if not used:
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        bucket.append(p)
        size += p.numel() * p.element_size()
        if size >= _BUCKET_BYTES:
            _reduce_bucket(bucket, group, rank, peers, timeout)
            bucket, size = [], 0
    if bucket:
        _reduce_bucket(bucket, group, rank, peers, timeout)


def reduce_backward(run_backward: Callable[[], Any], params: Iterable[Tensor],
                    group: Optional[Any] = None, timeout: Optional[Any] = None) -> Any:
    r"""Runs a backward pass and sums over ranks only the gradients it produced.

    Gradients already accumulated in ``.grad`` (an earlier ``manual_backward`` of the
    same step) were reduced when they were produced; they are set aside, the new ones
    are reduced with :func:`all_reduce_gradients`, and the two are added.  Reducing the
    accumulated ``.grad`` instead would count the earlier backward once per rank.

    Args:
        run_backward (Callable): Performs the backward pass (e.g. ``loss.backward``).
        params (Iterable[torch.Tensor]): The model's parameters.
        group (ProcessGroup, optional): The process group.
        timeout (float or timedelta, optional): The group's timeout, for messages.

    Returns:
        What :obj:`run_backward` returned.
    """
    params = [p for p in params if p.requires_grad]
    earlier = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        result = run_backward()
    except BaseException:
        for p, old in zip(params, earlier):  # leave .grad as the caller had it
            p.grad = old
        raise
    all_reduce_gradients(params, group, timeout)
    for p, old in zip(params, earlier):
        if old is None:
            continue
        if p.grad is not None:
            old.add_(p.grad)
        p.grad = old
    return result


def _reduce_bucket(params: List[Tensor], group, rank: int, peers, timeout) -> None:
    by_dtype = {}
    for p in params:
        by_dtype.setdefault(p.grad.dtype, []).append(p)
    for same in by_dtype.values():
        flat = torch.cat([p.grad.reshape(-1) for p in same])
        with guarded("gradient all-reduce", rank, peers, timeout):
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
