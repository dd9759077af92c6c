"""The raw aggregation function, usable without PyG layers (e.g. by the distributed engine)."""
from __future__ import annotations

import math
from typing import Optional, Union

from torch import Tensor

from . import backend as _backend
from . import ops
from .csr import CSRGraph, get_csr
from .locality import permute_rows

__all__ = ["aggregate", "REDUCTIONS"]

REDUCTIONS = ("sum", "add", "mean", "max")


def aggregate(
    src: Tensor,
    index: Union[Tensor, CSRGraph],
    weight: Optional[Tensor] = None,
    reduce: str = "sum",
    num_dst: Optional[int] = None,
    *,
    num_src: Optional[int] = None,
    backend: Optional[str] = "auto",
) -> Tensor:
    """Aggregate source rows into destination rows: ``out[d] = reduce_{(s,d)} w_e * src[s]``.

    Equivalent to PyG's ``scatter(w.view(-1, 1) * src[edge_index[0]], edge_index[1],
    dim=0, dim_size=num_dst, reduce=reduce)``, without materialising the ``E x F``
    message tensor. Rows without in-edges are 0 for every reduction. ``mean`` divides by
    the number of in-edges (not by the weight sum), like PyG.

    Args:
        src: ``[N_src, F]`` (or ``[N_src, *]``, flattened internally) source features.
        index: ``[2, E]`` ``edge_index`` (``Tensor`` or ``torch_geometric.EdgeIndex``;
            row 0 = source in ``[0, N_src)``, row 1 = destination in ``[0, N_dst)``), or a
            prebuilt :class:`~lightning_fullgraph.kernels.csr.CSRGraph`.
        weight: Optional ``[E]`` per-edge scalar, in ``edge_index`` order.
        reduce: ``"sum"`` (``"add"``), ``"mean"`` or ``"max"``.
        num_dst: ``N_dst``; defaults to ``N_src`` (square graph) for an ``edge_index``.
        num_src: ``N_src``; defaults to ``src.size(0)``.
        backend: ``"auto"``, ``"cpp"``, ``"triton"`` or ``"torch"``.

    Returns:
        ``[N_dst, *]`` tensor of ``src``'s dtype.

    Note:
        ``max`` backward sends each ``(row, feature)`` gradient to one maximising edge (the
        first in CSR order); PyG splits exact ties evenly among tied edges, so results
        differ only for exactly tied messages from *different* source rows.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    n_src = int(num_src) if num_src is not None else src.size(0)
    if isinstance(index, CSRGraph):
        csr = index
    else:
        n_dst = int(num_dst) if num_dst is not None else n_src
        csr = get_csr(index, n_src, n_dst)
    if src.size(0) != csr.num_src:
        raise ValueError(f"src has {src.size(0)} rows but the graph has {csr.num_src} sources")
    if weight is not None and weight.numel() != csr.num_edges:
        raise ValueError(f"weight has {weight.numel()} entries for {csr.num_edges} edges")
    trailing = src.shape[1:]
    # (The width spelled out: with no rows, e.g. the empty halo of a single process, -1 is
    # ambiguous.)
    x = src.reshape(src.size(0), math.prod(trailing))
    be = _backend.resolve(backend, x.device) or "torch"
    w = csr.permute_edge_values(weight.reshape(-1) if weight is not None else None, be)
    if csr.order is not None:  # numbered for locality: rows in, and back out (see .locality)
        x = permute_rows(x, csr.order.src_perm, csr.order.src_inv)
    if reduce == "max":
        out, _ = ops.csr_max(csr.rowptr, csr.col, w, x, be)
    else:
        out = ops.csr_sum(csr.rowptr, csr.col, w, x, reduce == "mean", csr.t_rowptr, csr.t_col,
                          csr.t_perm, be)
    if csr.order is not None:
        out = permute_rows(out, csr.order.inv, csr.order.perm)
    shape = (csr.num_dst,) + tuple(trailing)
    # Not a view when the shape already fits: an in-place add into a view (the split
    # aggregation's halo part) costs autograd two N x F copies in backward (CopySlices).
    return out if out.shape == shape else out.reshape(shape)
