"""Graph normalizations that need the degrees of halo nodes.

``gcn_norm`` scales edge ``(j, i)`` by ``deg(j)^-1/2 * w * deg(i)^-1/2``.  A rank
holds every in-edge of the nodes it owns, so it computes their degrees exactly;
the degree of a halo source ``j`` is known only to ``j``'s owner.  The
distributed version computes owned degrees locally and fetches halo degrees
through the same halo exchange that carries features (one scalar per halo row).

PyG's convolutions call ``gcn_norm`` from their module namespaces
(``sg_conv.gcn_norm``, ``appnp.gcn_norm``, ...).  :func:`patch_gcn_norm` swaps
each of those references for a dispatcher that runs the distributed version
while a partitioned layer is executing and PyG's own otherwise; it is reference
counted and undone by :func:`unpatch_gcn_norm`.  Inside a partitioned layer a sparse
adjacency is refused (PyG's local normalization would use wrong halo degrees).
"""
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.nn.conv import gcn_conv
from torch_geometric.utils import add_remaining_self_loops, scatter

from .. import compat
from .context import current_layer

__all__ = ["distributed_gcn_norm", "patch_gcn_norm", "unpatch_gcn_norm"]

_pyg_gcn_norm = gcn_conv.gcn_norm
_patched: List[Tuple[object, str]] = []
_patch_count = 0


def distributed_gcn_norm(exchange, edge_index: Tensor, edge_weight: Optional[Tensor] = None,
                         improved: bool = False, add_self_loops: bool = True,
                         dtype: Optional[torch.dtype] = None) -> Tuple[Tensor, Tensor]:
    r"""Symmetric GCN normalization of a rank-local graph with exact global degrees.

    Args:
        exchange (HaloExchange): The rank's halo exchange.
        edge_index (torch.Tensor): Local edges, sources in
            :math:`[0, N_{own} + N_{halo})`, targets in :math:`[0, N_{own})`.
        edge_weight (torch.Tensor, optional): Edge weights :math:`[E]`.
        improved (bool): Self-loop weight 2 instead of 1.
        add_self_loops (bool): Add remaining self-loops to owned nodes.
        dtype (torch.dtype, optional): dtype of created weights.

    Returns:
        ``(edge_index, edge_weight)`` exactly as PyG's ``gcn_norm`` returns them on
        the whole graph, restricted to the rank's edges.
    """
    num_owned = exchange.num_owned
    if add_self_loops:
        # Self-loops belong to their targets, so owned nodes get all of theirs here.
        edge_index, edge_weight = add_remaining_self_loops(
            edge_index, edge_weight, 2. if improved else 1., num_owned)
    if edge_weight is None:
        edge_weight = torch.ones((edge_index.size(1), ), dtype=dtype,
                                 device=edge_index.device)
    row, col = edge_index[0], edge_index[1]
    deg = scatter(edge_weight, col, dim=0, dim_size=num_owned, reduce='sum')
    deg = exchange.extend(deg.unsqueeze(-1), key=f"{_layer_key()}.degree").squeeze(-1)
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt = deg_inv_sqrt.masked_fill(deg_inv_sqrt == float('inf'), 0)
    return edge_index, deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]


def _layer_key() -> str:
    layer = current_layer()
    return layer.key if layer is not None else "gcn_norm"


# Not traced by torch.compile: the active layer lives in a thread-local stack, and the
# halo degrees need the (eager) exchange.
@torch.compiler.disable
def _dispatch_gcn_norm(edge_index, edge_weight=None, num_nodes=None, improved=False,
                       add_self_loops=True, flow="source_to_target", dtype=None):
    layer = current_layer()
    if layer is None:
        return _pyg_gcn_norm(edge_index, edge_weight, num_nodes, improved,
                             add_self_loops, flow, dtype)
    from .partitioned import check_dense_edge_index
    check_dense_edge_index(edge_index, layer.key)
    if flow != "source_to_target":
        raise ValueError(f"layer '{layer.key}': flow='{flow}' is not supported by "
                         "partitioned execution (ranks hold in-edges of their nodes)")
    if num_nodes is not None and num_nodes != layer.exchange.num_owned:
        raise ValueError(
            f"layer '{layer.key}': gcn_norm called for {num_nodes} nodes but this rank "
            f"owns {layer.exchange.num_owned}; pass the rank-local node features")
    return distributed_gcn_norm(layer.exchange, edge_index, edge_weight, improved,
                                add_self_loops, dtype)


def patch_gcn_norm() -> None:
    r"""Routes every imported ``gcn_norm`` reference through the dispatcher."""
    global _patch_count
    _patch_count += 1
    if _patch_count > 1:
        return
    for module in compat.modules_binding(_pyg_gcn_norm):
        setattr(module, "gcn_norm", _dispatch_gcn_norm)
        _patched.append((module, "gcn_norm"))


def unpatch_gcn_norm() -> None:
    r"""Undoes one :func:`patch_gcn_norm`; the last one restores PyG's function."""
    global _patch_count
    _patch_count = max(0, _patch_count - 1)
    if _patch_count == 0:
        while _patched:
            module, attr = _patched.pop()
            setattr(module, attr, _pyg_gcn_norm)
