"""The graph Laplacian of ``ChebConv`` with exact global degrees and ``lambda_max``.

PyG's ``get_laplacian`` scales edge ``(j, i)`` by the degrees of its *source* ``j`` (the
sum of the weights of ``j``'s out-edges, self-loops removed).  A rank holds the in-edges
of the nodes it owns, so no rank sees all out-edges of a node: an owned node's out-degree
is the sum over its out-edges inside the partition plus its outgoing cut edges (stored in
the partition since format 2), and the out-degree of a halo source comes from its owner
through the halo exchange.  ``ChebConv`` also defaults ``lambda_max`` to twice the largest
Laplacian weight of the whole graph: one all-reduce (max).

:func:`wrap_chebyshev_norm` replaces a ``ChebConv``'s ``__norm__`` on the instance while
the layer is partitioned; it needs the call's edges and weights to be the partition's own
(``batch.edge_index`` and an edge attribute of the batch) and says so otherwise.
"""
from typing import Any, Callable, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.utils import add_self_loops, remove_self_loops, scatter

from .errors import guarded

__all__ = ["distributed_laplacian", "wrap_chebyshev_norm"]


def _out_degree(partition: Any, edge_index: Tensor, edge_weight: Tensor,
                out_weight: Tensor) -> Tensor:
    r"""Weighted out-degree (self-loops removed) of the rank's owned nodes."""
    n_own = partition.num_owned
    src = edge_index[0]
    inside = src < n_own  # in-edges from owned sources: out-edges of owned nodes
    deg = scatter(edge_weight[inside], src[inside], 0, dim_size=n_own, reduce="sum")
    out_src = partition.out_src.to(src.device)
    return deg + scatter(out_weight, out_src, 0, dim_size=n_own, reduce="sum")


def distributed_laplacian(exchange: Any, partition: Any, edge_index: Tensor,
                          edge_weight: Optional[Tensor], out_weight: Optional[Tensor],
                          normalization: Optional[str], dtype: Optional[torch.dtype] = None,
                          key: str = "laplacian") -> Tuple[Tensor, Tensor]:
    r"""PyG's ``get_laplacian`` on the rank's in-edges, with global source degrees.

    Args:
        exchange (HaloExchange): The rank's (post) exchange.
        partition (LocalPartition): The rank's partition (its outgoing cut edges).
        edge_index (torch.Tensor): The rank's in-edges :math:`[2, E_{local}]`.
        edge_weight (torch.Tensor, optional): Their weights :math:`[E_{local}]`.
        out_weight (torch.Tensor, optional): The weights of the outgoing cut edges
            :math:`[E_{out}]` (same attribute; ``None`` iff :obj:`edge_weight` is).
        normalization (str, optional): ``None``, ``"sym"`` or ``"rw"``.
        dtype (torch.dtype, optional): dtype of created weights.
        key (str): Exchange-point prefix.

    Returns:
        ``(edge_index, edge_weight)`` as ``get_laplacian`` returns them on the whole graph,
        restricted to the rank's in-edges (self-loops of owned nodes added).
    """
    if normalization is not None and normalization not in ("sym", "rw"):
        raise ValueError(f"invalid normalization {normalization!r}")
    n_own = exchange.num_owned
    edge_index, edge_weight = remove_self_loops(edge_index, edge_weight)
    if edge_weight is None:
        edge_weight = torch.ones(edge_index.size(1), dtype=dtype, device=edge_index.device)
    if out_weight is None:
        out_weight = torch.ones(partition.out_src.numel(), dtype=edge_weight.dtype,
                                device=edge_index.device)
    deg_own = _out_degree(partition, edge_index, edge_weight, out_weight.to(edge_weight))
    deg = exchange.extend(deg_own.unsqueeze(-1), key=f"{key}.out_degree",
                          exact=True).squeeze(-1)
    row, col = edge_index[0], edge_index[1]
    if normalization is None:
        # L = D - A: the diagonal holds the owned nodes' degrees.
        edge_index, _ = add_self_loops(edge_index, num_nodes=n_own)
        return edge_index, torch.cat([-edge_weight, deg_own], dim=0)
    if normalization == "sym":
        deg_inv_sqrt = deg.pow(-0.5).masked_fill(deg == 0, 0)
        edge_weight = deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]
    else:
        deg_inv = (1.0 / deg).masked_fill(deg == 0, 0)
        edge_weight = deg_inv[row] * edge_weight
    return add_self_loops(edge_index, -edge_weight, fill_value=1., num_nodes=n_own)


@torch.compiler.disable
def _global_max(value: Tensor, group: Any, key: str, timeout: Any) -> Tensor:
    r"""The maximum over ranks; the gradient reaches the rank(s) that hold it."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return value
    out = value.detach().clone().reshape(1)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    with guarded(f"'{key}' lambda_max (all-reduce max)", rank,
                 [r for r in range(world) if r != rank], timeout):
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return value + (out.reshape(value.shape) - value).detach()


def wrap_chebyshev_norm(layer: Any, key: str, owner: Any) -> Callable:
    r"""The partitioned ``__norm__`` of a ``ChebConv`` (installed on the instance).

    Args:
        layer (ChebConv): The layer.
        key (str): Its qualified name.
        owner (PartitionedModel): The model handle (exchange, router).
    """
    def norm(edge_index: Tensor, num_nodes: Optional[int], edge_weight: Optional[Tensor],
             normalization: Optional[str], lambda_max: Optional[Tensor] = None,
             dtype: Optional[torch.dtype] = None, batch: Optional[Tensor] = None):
        router, exchange = owner.router, owner.exchange
        attr = router.edge_attr_key(edge_weight) if router is not None and \
            edge_weight is not None else None
        if router is None or not router.is_in_edges(edge_index) or \
                (edge_weight is not None and attr is None):
            raise ValueError(
                f"layer '{key}' (ChebConv) scales every edge by its source's out-degree, "
                "which partitioned execution computes from the partition's edges: pass the "
                "batch's edge_index and edge weights (an edge attribute of the batch) "
                "unchanged")
        if batch is not None:
            raise ValueError(f"layer '{key}' (ChebConv): a batch vector of several graphs "
                             "cannot be partitioned; full-graph training has one graph")
        out_weight = None if attr is None else router.partition.out_edge_attrs[attr]
        edge_index, edge_weight = distributed_laplacian(
            exchange, router.partition, edge_index, edge_weight, out_weight, normalization,
            dtype, key=key)
        if lambda_max is None:  # twice the largest Laplacian weight of the whole graph
            lambda_max = _global_max(2.0 * edge_weight.max(), exchange.group, key,
                                     exchange.timeout)
        elif not isinstance(lambda_max, Tensor):
            lambda_max = torch.tensor(lambda_max, dtype=dtype, device=edge_index.device)
        edge_weight = (2.0 * edge_weight) / lambda_max
        edge_weight = edge_weight.masked_fill(edge_weight == float("inf"), 0)
        loop_mask = edge_index[0] == edge_index[1]
        return edge_index, edge_weight - loop_mask.to(edge_weight.dtype)

    return torch.compiler.disable(norm)
