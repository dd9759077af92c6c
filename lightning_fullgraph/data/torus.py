"""A mesh-like graph whose locality is hidden by shuffled node ids (for kernel benchmarks).

Meshes, road networks and k-NN graphs connect nodes to their spatial neighbours; datasets
ship them with ids that follow no spatial order. :func:`torus_graph` builds such a graph:
nodes on a ``side x side`` torus, each with ``degree`` in-edges from random cells within
``radius``, ids then randomly permuted. An order that recovers the neighbourhoods (see
:mod:`lightning_fullgraph.kernels.locality`) turns most of the aggregation's row gathers into
cache hits; in the shuffled ids they are as random as in a random graph.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["torus_graph"]


def torus_graph(num_nodes: int, degree: int, *, radius: int = 3, seed: int = 0) -> Tensor:
    r"""Edges of a shuffled torus graph.

    Args:
        num_nodes (int): Nodes wanted; the torus has :math:`\lfloor\sqrt{N}\rceil^2` of them.
        degree (int): In-edges per node (sources drawn uniformly from the
            :math:`(2r + 1)^2` cells around it; duplicates and self-loops kept).
        radius (int, optional): Neighbourhood radius :math:`r`. (default: :obj:`3`)
        seed (int, optional): Seed of the draws and the id shuffle. (default: :obj:`0`)

    Returns:
        ``[2, N * degree]`` int64 ``edge_index`` (row 0 sources, row 1 destinations).

    Shapes:
        - **output:** :math:`[2, N \cdot \text{degree}]`
    """
    if degree < 1 or radius < 0 or num_nodes < 1:
        raise ValueError(f"torus_graph needs num_nodes >= 1, degree >= 1, radius >= 0; got {num_nodes}, "
                         f"{degree}, {radius}")
    side = max(1, int(round(num_nodes ** 0.5)))
    n = side * side
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(n).repeat_interleave(degree)
    dx = torch.randint(-radius, radius + 1, (n * degree,), generator=g)
    dy = torch.randint(-radius, radius + 1, (n * degree,), generator=g)
    src = ((dst // side + dy) % side) * side + (dst % side + dx) % side
    return torch.randperm(n, generator=g)[torch.stack([src, dst])]
