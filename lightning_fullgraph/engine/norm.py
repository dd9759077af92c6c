"""Graph normalizations that need the degrees of halo nodes.

``gcn_norm`` scales edge ``(j, i)`` by ``deg(j)^-1/2 * w * deg(i)^-1/2``.  A rank
holds every in-edge of the nodes it owns, so it computes their degrees exactly;
the degree of a halo source ``j`` is known only to ``j``'s owner.  The
distributed version computes owned degrees locally and fetches halo degrees
through the same halo exchange that carries features (one scalar per halo row).

PyG's convolutions call ``gcn_norm`` from their module namespaces
(``sg_conv.gcn_norm``, ``appnp.gcn_norm``, ...).  :func:`add_dispatcher` routes each of
those references through a dispatcher that runs the distributed version while a partitioned
layer is executing and passes the call on otherwise (to the kernels' memo where it applies,
else to PyG's own; :func:`.compat.route_gcn_norm`); it is reference counted and undone by
:func:`remove_dispatcher`.  Inside a partitioned layer a sparse
adjacency is refused (PyG's local normalization would use wrong halo degrees).

In pre/hybrid aggregation (:mod:`.aggregation`) the layer propagates over its mode's edges,
which include this rank's outgoing pre edges into pre slots: :func:`mode_gcn_norm` computes
owned degrees over the complete in-edge list, fetches the degrees of the mode's halo sources
(post channel) and of the pre slots' destinations (from their owners), and returns the mode's
edges (with self-loops) and weights.  The layer then propagates exactly what one process would.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.utils import add_remaining_self_loops, scatter

from .. import compat
from .context import current_layer

__all__ = ["distributed_gcn_norm", "add_dispatcher", "remove_dispatcher"]

_pyg_gcn_norm = compat.pyg_gcn_norm()
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
    deg = exchange.extend(deg.unsqueeze(-1), key=f"{_layer_key()}.degree",
                          exact=True).squeeze(-1)
    deg_inv_sqrt = deg.pow(-0.5)
    deg_inv_sqrt = deg_inv_sqrt.masked_fill(deg_inv_sqrt == float('inf'), 0)
    return edge_index, deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]


def mode_gcn_norm(router, mode: str, edge_index: Tensor, edge_weight: Optional[Tensor],
                  attr: Optional[str], improved: bool, add_self_loops: bool,
                  dtype: Optional[torch.dtype], key: str) -> Tuple[Tensor, Tensor]:
    r"""``gcn_norm`` of a rank in pre/hybrid aggregation (see the module docstring).

    Args:
        router (AggregationRouter): The engine's router.
        mode (str): ``"pre"`` or ``"hybrid"``.
        edge_index (torch.Tensor): The rank's in-edge list (``batch.edge_index``).
        edge_weight (torch.Tensor, optional): Its raw weights (partition attribute
            :obj:`attr`).
        improved, add_self_loops, dtype: As PyG's ``gcn_norm``.
        key (str): Layer name, for the exchange points.

    Returns:
        The mode's edges (owned rows + halo -> owned rows + pre slots, self-loops added)
        and their normalized weights.
    """
    ex = router.exchanges[mode]
    n, device = ex.num_owned, edge_index.device
    fill = 2. if improved else 1.
    # Owned degrees from the complete in-edge list (this rank holds every in-edge).
    deg = _owned_degree(edge_index, edge_weight, fill, n, add_self_loops, dtype)
    deg_src = ex.extend(deg.unsqueeze(-1), key=f"{key}.degree", exact=True).squeeze(-1)
    deg_slots = ex.to_slots(deg.unsqueeze(-1), key=f"{key}.degree.slots").squeeze(-1)

    # The mode's edges and raw weights; self-loops belong to owned nodes only.  The looped
    # edge list is made once (the router keeps it); later calls only loop the weights.
    index = router.mode_edge_index(mode, device)
    weight = router.mode_edge_values(mode, edge_weight, attr)
    if add_self_loops:
        graph_key = (mode, "self-loops", device)
        looped = router.cached_graph(graph_key)
        if looped is None:
            looped = _plan_looped(router.plan(mode), index, n)
            if looped is None:
                looped, weight = add_remaining_self_loops(index, weight, fill, n)
            elif weight is not None:
                weight = _self_loop_values(index, weight, fill, n)
            looped = router.canonical_graph(graph_key, looped, mode)
        elif weight is not None:
            weight = _self_loop_values(index, weight, fill, n)
        index = looped
    dis_src = deg_src.pow(-0.5).masked_fill(deg_src == 0, 0)
    deg_dst = torch.cat([deg, deg_slots])
    dis_dst = deg_dst.pow(-0.5).masked_fill(deg_dst == 0, 0)
    norm = dis_src[index[0]]
    if weight is not None:  # unit weights: the product is the same without them
        norm = norm * weight
    return index, norm * dis_dst[index[1]]


def _plan_looped(plan, index: Tensor, n: int) -> Optional[Tensor]:
    r"""``add_remaining_self_loops(index, num_nodes=n)``'s edge list without a copy: the plan's
    buffer that :obj:`index` begins (:attr:`AggregationPlan.looped`), when :obj:`index` is that
    very storage and has no self-loops of its own (else :obj:`None`)."""
    looped = getattr(plan, "looped", None)
    if looped is None or index.device != looped.device or index.size(1) + n != looped.size(1) \
            or index.data_ptr() != looped.data_ptr() or index.stride() != looped.stride():
        return None
    if bool((index[0] == index[1]).any()):
        return None  # add_remaining_self_loops drops those and re-adds one per node
    return looped


def _owned_degree(edge_index: Tensor, edge_weight: Optional[Tensor], fill: float, n: int,
                  add_self_loops: bool, dtype: Optional[torch.dtype]) -> Tensor:
    r"""In-degree of the owned nodes as ``gcn_norm`` computes it (existing self-loops
    replaced by one per node, weighted like ``add_remaining_self_loops``), without
    materializing the looped edge list: that is a copy of all in-edges every call."""
    dst = edge_index[1]
    if not add_self_loops:
        weight = edge_weight if edge_weight is not None else \
            torch.ones(dst.numel(), dtype=dtype, device=dst.device)
        return scatter(weight, dst, dim=0, dim_size=n, reduce='sum')
    keep = edge_index[0] != dst
    kept_dst = dst[keep]
    if edge_weight is None:  # add_remaining_self_loops gives no weights: all ones
        ones = torch.ones(kept_dst.numel(), dtype=dtype, device=dst.device)
        return scatter(ones, kept_dst, dim=0, dim_size=n, reduce='sum') + 1
    loops = _loop_values(edge_index, edge_weight, keep, fill, n)
    return scatter(edge_weight[keep], kept_dst, dim=0, dim_size=n, reduce='sum') + loops


def _loop_values(edge_index: Tensor, weight: Tensor, keep: Tensor, fill: float,
                 n: int) -> Tensor:
    # add_remaining_self_loops' weights of the added loops: fill, or an existing loop's.
    loops = torch.full((n, ), fill, dtype=weight.dtype, device=weight.device)
    dropped = ~keep
    loops[edge_index[0][dropped]] = weight[dropped]
    return loops


def _self_loop_values(edge_index: Tensor, weight: Tensor, fill: float, n: int) -> Tensor:
    r"""The weights ``add_remaining_self_loops(edge_index, weight, fill, n)`` returns."""
    keep = edge_index[0] != edge_index[1]
    return torch.cat([weight[keep], _loop_values(edge_index, weight, keep, fill, n)])


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
        return NotImplemented  # not inside a partitioned layer: the next handler, or PyG
    from .partitioned import check_dense_edge_index
    check_dense_edge_index(edge_index, layer.key)
    router = getattr(layer.owner, "router", None)
    static = getattr(layer.owner, "static", None)
    call, layer.norm_calls = layer.norm_calls, layer.norm_calls + 1
    attr = router.edge_attr_key(edge_weight) if router is not None and \
        edge_weight is not None else None
    vouched = router is not None and router.is_in_edges(edge_index) and (
        edge_weight is None or attr is not None)

    if static is None:
        return _routed_gcn_norm(layer, router, _norm_mode(layer, router, call, vouched), attr,
                                edge_index, edge_weight, num_nodes, improved, add_self_loops,
                                flow, dtype)
    phase = "train" if layer.training else "eval"
    static_ok = vouched and (edge_weight is None or not edge_weight.requires_grad)
    mode = _norm_mode(layer, router, call, vouched)
    # What the result depends on -- not which layer or phase asks: layers with the same
    # options share one copy, and a validation pass gets the training steps' weights (the
    # very tensor, so their static aggregations match too).
    key = (mode, improved, add_self_loops, flow, dtype, num_nodes, attr, edge_index.device)
    return static.normalization(
        f"{layer.key}.gcn_norm{call}.{phase}", key, static_ok,
        lambda: _routed_gcn_norm(layer, router, mode, attr, edge_index, edge_weight, num_nodes,
                                 improved, add_self_loops, flow, dtype))


def _norm_mode(layer, router, call: int, vouched: bool) -> str:
    r"""The aggregation mode of the layer's normalization (agreed on its first call)."""
    state = layer.state
    if router is None or state is None or state.candidate == "post":
        return "post"
    phase = "train" if layer.training else "eval"
    # "auto" decides the layer's mode here, before its propagate: the width it will exchange
    # is the one the layer declares (:func:`~.aggregation.propagated_width`), else its
    # input's (APPNP propagates what it is given).
    return router.decide(f"{layer.key}.gcn_norm{call}.{phase}", state.candidate, vouched,
                         layer.key, state.width or layer.input_width)


def _routed_gcn_norm(layer, router, mode, attr, edge_index, edge_weight, num_nodes,
                     improved, add_self_loops, flow, dtype):
    if flow != "source_to_target":
        raise ValueError(f"layer '{layer.key}': flow='{flow}' is not supported by "
                         "partitioned execution (ranks hold in-edges of their nodes)")
    if num_nodes is not None and num_nodes != layer.exchange.num_owned:
        raise ValueError(
            f"layer '{layer.key}': gcn_norm called for {num_nodes} nodes but this rank "
            f"owns {layer.exchange.num_owned}; pass the rank-local node features")
    if mode != "post":
        return mode_gcn_norm(router, mode, edge_index, edge_weight, attr, improved,
                             add_self_loops, dtype, layer.key)
    return distributed_gcn_norm(layer.exchange, edge_index, edge_weight, improved,
                                add_self_loops, dtype)


def add_dispatcher() -> None:
    r"""Routes every imported ``gcn_norm`` reference through the dispatcher (a process-wide
    rebinding while a model is attached: models call ``gcn_norm`` outside any layer too,
    e.g. ``LabelPropagation``, and a scoped copy of a forward misses the functions
    ``torch.compile`` adds to its module's globals)."""
    global _patch_count
    _patch_count += 1
    if _patch_count == 1:  # first in line: a partitioned layer's call is the engine's
        compat.route_gcn_norm(_dispatch_gcn_norm, priority=0)


def remove_dispatcher() -> None:
    r"""Undoes one :func:`add_dispatcher`; the last one takes the dispatcher out."""
    global _patch_count
    if _patch_count == 0:
        return
    _patch_count -= 1
    if _patch_count == 0:
        compat.unroute_gcn_norm(_dispatch_gcn_norm)
