"""Layers that aggregate over out-edges too: PyG's ``DirGNNConv``.

``DirGNNConv`` runs ``conv_in`` on the edges and ``conv_out`` on the same edges flipped
(``edge_index.flip([0])``).  A rank holds the in-edges of its nodes, so the flipped list
has targets it does not own and misses the out-edges that other ranks hold.  While the
model is partitioned, :func:`wrap_dir_gnn` replaces the layer's ``forward`` on the instance
by the same computation in which ``conv_out`` gets the rank's *reversed in-edges* (its
nodes' out-edges, flipped: :func:`~lightning_fullgraph.partition.plan.build_reverse_plan`)
and its halo rows come through a second exchange whose plan is that of the reversed graph.
"""
from typing import Any, Callable

import torch
from torch import Tensor

from ..partition.plan import build_reverse_plan
from .exchange import HaloExchange

__all__ = ["reverse_exchange", "wrap_dir_gnn"]


def reverse_exchange(exchange: HaloExchange, partition: Any) -> HaloExchange:
    r"""The halo exchange of the reversed graph, on :obj:`exchange`'s transport and policy
    (same process group, byte counters and codecs)."""
    reverse = HaloExchange(build_reverse_plan(partition), exchange.transport, exchange.policy,
                           exchange.seed)
    reverse.plan.edge_index = reverse.plan.edge_index.to(exchange.plan.post.send_index.device)
    reverse.set_node_ids(partition.owned_ids[reverse.plan.post.send_index.cpu()])
    return reverse.to(exchange.plan.post.send_index.device)


def wrap_dir_gnn(layer: Any, key: str, router: Any, exchange: HaloExchange) -> Callable:
    r"""The partitioned ``forward`` of a ``DirGNNConv`` (installed on the instance).

    Args:
        layer (DirGNNConv): The layer.
        key (str): Its qualified name.
        router (AggregationRouter): Recognizes the partition's in-edge list.
        exchange (HaloExchange): The reversed graph's exchange (its plan's edges are the
            reversed in-edges).
    """
    def forward(x: Tensor, edge_index: Tensor) -> Tensor:
        if not router.is_in_edges(edge_index):
            raise ValueError(
                f"layer '{key}' (DirGNNConv) also aggregates over out-edges, which other "
                "ranks hold; partitioned execution supplies them for the partition's own edge "
                "list only: pass the batch's edge_index unchanged")
        reversed_edges = exchange.plan.edge_index
        if reversed_edges.device != edge_index.device:
            reversed_edges = exchange.plan.edge_index = reversed_edges.to(edge_index.device)
        # As DirGNNConv.forward, with conv_out on the reversed in-edges.
        x_in = layer.conv_in(x, edge_index)
        x_out = layer.conv_out(x, reversed_edges)
        out = layer.alpha * x_out + (1 - layer.alpha) * x_in
        if layer.root_weight:
            out = out + layer.lin(x)
        return out

    return torch.compiler.disable(forward)
