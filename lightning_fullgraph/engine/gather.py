"""Bringing per-rank node tensors back into global node order."""
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .errors import guarded

__all__ = ["gather_nodes"]


def gather_nodes(local: Tensor, owned_ids: Tensor, num_nodes: int,
                 group: Optional[Any] = None) -> Tensor:
    r"""All-gathers rows owned by each rank into one tensor in global node order.

    Args:
        local (torch.Tensor): This rank's rows, shape :math:`[N_{own}, *]`.
        owned_ids (torch.Tensor): Their global ids, shape :math:`[N_{own}]`.
        num_nodes (int): Global number of nodes :math:`N`.
        group (ProcessGroup, optional): The process group.

    Returns:
        :math:`[N, *]` on every rank (not differentiable).
    """
    if local.size(0) != owned_ids.numel():
        raise ValueError(f"gather_nodes: {local.size(0)} rows for {owned_ids.numel()} "
                         "owned nodes")
    local = local.detach()
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        out = local.new_zeros((num_nodes, ) + tuple(local.shape[1:]))
        out[owned_ids] = local
        return out
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    counts = torch.tensor([local.size(0)], dtype=torch.long, device=local.device)
    all_counts = [torch.zeros_like(counts) for _ in range(world)]
    with guarded("gather of node rows (sizes)", rank, range(world)):
        dist.all_gather(all_counts, counts, group=group)
    longest = int(max(c.item() for c in all_counts))
    pad = longest - local.size(0)
    rows = torch.cat([local, local.new_zeros((pad, ) + tuple(local.shape[1:]))])
    ids = torch.cat([owned_ids, owned_ids.new_full((pad, ), -1)]).to(local.device)
    all_rows = [torch.empty_like(rows) for _ in range(world)]
    all_ids = [torch.empty_like(ids) for _ in range(world)]
    with guarded("gather of node rows", rank, range(world)):
        dist.all_gather(all_rows, rows.contiguous(), group=group)
        dist.all_gather(all_ids, ids.to(local.device), group=group)
    out = local.new_zeros((num_nodes, ) + tuple(local.shape[1:]))
    for rows_r, ids_r, c in zip(all_rows, all_ids, all_counts):
        n = int(c.item())
        out[ids_r[:n].to(out.device)] = rows_r[:n]
    return out
