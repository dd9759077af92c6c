"""A PyG transform that renumbers a graph's nodes in an order with memory locality."""
from __future__ import annotations

import copy
from typing import Optional

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

__all__ = ["LocalityOrder"]


class LocalityOrder(BaseTransform):
    r"""Renumbers the nodes of a graph whose locality is hidden by its ids (a mesh, road network
    or k-NN graph shipped with shuffled ids) breadth-first, so that neighbours get nearby ids.

    The aggregation kernels find such an order by themselves (see
    :mod:`lightning_fullgraph.kernels.locality`) but must then permute the rows into it and back
    on every call, which costs about as much as the reordered aggregation; data kept in the
    order needs neither: on a 1M-node / 16M-edge shuffled torus the forward aggregation ran
    3.9x faster in the order than in the shuffled ids, against 1.8x with the per-call
    permutations (``python -m benchmarks kernels``; log ``kernels-roofline-torus-kernel-only.log`` in the git history of ``benchmarks/results/``). Every node-level attribute (``x``, ``y``, masks, ...) is permuted, ``edge_index``
    renumbered (edges keep their order, so edge attributes stay aligned), and ``n_id`` holds the
    original id of every node (composed with an existing ``n_id``), e.g. to map predictions back:
    ``out[data.n_id.argsort()]`` is in the original order.

    Args:
        mode (str, optional): ``"auto"``: renumber only when the order raises the fraction of
            edges whose endpoints lie within :data:`~lightning_fullgraph.kernels.locality.WINDOW`
            ids of each other by at least ``MIN_GAIN`` (a random graph is left as it is);
            ``"bfs"``: always. (default: :obj:`"auto"`)

    Shapes:
        - **input:** a :class:`~torch_geometric.data.Data` with ``edge_index`` :math:`[2, E]`
        - **output:** the same graph renumbered; ``n_id`` :math:`[N]`
    """

    def __init__(self, mode: str = "auto") -> None:
        if mode not in ("auto", "bfs"):
            raise ValueError(f"LocalityOrder mode must be 'auto' or 'bfs', got {mode!r}")
        self.mode = mode

    def forward(self, data: Data) -> Data:
        from lightning_fullgraph.kernels import build_csr
        from lightning_fullgraph.kernels.locality import choose_order

        if not isinstance(data, Data) or data.edge_index is None:
            raise TypeError("LocalityOrder needs a homogeneous torch_geometric Data with edge_index "
                            f"(got {type(data).__name__}); renumber each node type of a HeteroData yourself")
        n = int(data.num_nodes)
        ei = data.edge_index
        csr = build_csr(ei, n, n)
        order = choose_order(ei[0], ei[1], csr.rowptr, csr.col, csr.t_rowptr, csr.t_col, n, self.mode,
                             min_edges=0)
        if order is None:
            return data
        out = copy.copy(data)
        for key, value in data.items():
            if key == "edge_index":
                out.edge_index = order.inv[ei].to(ei.dtype)
            elif key != "n_id" and isinstance(value, torch.Tensor) and data.is_node_attr(key):
                out[key] = value.index_select(data.__cat_dim__(key, value), order.perm)
        n_id: Optional[torch.Tensor] = data.get("n_id")
        out.n_id = order.perm if n_id is None else n_id[order.perm]
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(mode={self.mode!r})"
