"""Pure-PyTorch reference kernels with exactly the semantics of the compiled ones.

Used when no compiler is available (or ``LIGHTNING_FULLGRAPH_NO_EXT=1``), for dtypes the
compiled kernels do not cover, and as the oracle in tests. Edges are processed in chunks
so that the gathered message tensor stays bounded (PyG materialises all E x F at once).

All functions take a destination-sorted CSR: ``rowptr`` ``[N_dst + 1]`` (int64), ``col``
``[E]`` (source node per edge), optional ``weight`` ``[E]`` in CSR order and ``x``
``[N_src, F]``, and validate it first (:mod:`.validate`: ``ValueError`` for a malformed
CSR, ``IndexError`` for a column outside ``[0, N_src)``), like the compiled kernels.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import validate

__all__ = ["csr_sum", "csr_max", "csr_edge_dot", "row_index", "sum_dtype", "accumulation_dtype"]

_CHUNK_ELEMS = 1 << 24  # gathered elements per chunk (64 MiB of fp32)


def row_index(rowptr: Tensor) -> Tensor:
    """Destination row of every CSR edge, ``[E]`` int64."""
    n = rowptr.numel() - 1
    counts = rowptr[1:] - rowptr[:-1]
    return torch.repeat_interleave(torch.arange(n, device=rowptr.device), counts)


def _chunks(num_edges: int, width: int):
    step = max(1, _CHUNK_ELEMS // max(1, width))
    for s in range(0, num_edges, step):
        yield s, min(num_edges, s + step)


def sum_dtype(x: Tensor, weight: Optional[Tensor]) -> torch.dtype:
    """Output dtype of a sum/mean aggregation: PyG's, whose message ``weight * x_j`` promotes
    (``bfloat16`` features with ``float32`` edge weights, as under autocast, give ``float32``)."""
    return x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """Type sums are accumulated in: ``float32`` for 16-bit floats (rounded once at the end,
    so a row of many edges does not lose precision edge by edge), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def csr_sum(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor, mean: bool,
            out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Sum (or mean over the number of in-edges) of ``weight[e] * x[col[e]]`` per row.

    Args:
        out_dtype: Output dtype (default :func:`sum_dtype`); sums accumulate in
            :func:`accumulation_dtype` of it.

    Returns:
        ``[N_dst, F]``; rows without in-edges are 0.
    """
    validate.check_aggregation("csr_sum", rowptr, col, weight, x)
    out_dtype = out_dtype or sum_dtype(x, weight)
    acc = accumulation_dtype(out_dtype)
    n, f = rowptr.numel() - 1, x.size(1)
    out = x.new_zeros(n, f, dtype=acc)
    row = row_index(rowptr)
    col = col.long()
    for s, e in _chunks(col.numel(), f):
        msg = x.index_select(0, col[s:e]).to(acc)
        if weight is not None:
            msg = msg * weight[s:e].to(acc).unsqueeze(1)
        out.index_add_(0, row[s:e], msg)
    if mean:
        deg = (rowptr[1:] - rowptr[:-1]).clamp(min=1).to(acc)
        out = out / deg.unsqueeze(1)
    return out.to(out_dtype)


def csr_max(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor) -> Tuple[Tensor, Tensor]:
    """Feature-wise maximum of ``weight[e] * x[col[e]]`` per row, with the arg-max.

    Returns:
        ``(out [N_dst, F], arg [N_dst, F] int64)``: ``arg`` is the CSR position of the
        first edge attaining the maximum, ``-1`` for rows without in-edges (output 0).
    """
    validate.check_aggregation("csr_max", rowptr, col, weight, x)
    n, f = rowptr.numel() - 1, x.size(1)
    num_edges = col.numel()
    row = row_index(rowptr)
    col = col.long()
    out = x.new_full((n, f), float("-inf"))
    for s, e in _chunks(num_edges, f):
        msg = x.index_select(0, col[s:e])
        if weight is not None:
            msg = msg * weight[s:e].to(x.dtype).unsqueeze(1)
        idx = row[s:e].unsqueeze(1).expand(-1, f)
        out.scatter_reduce_(0, idx, msg, reduce="amax", include_self=True)
    # First edge (smallest CSR position) equal to the maximum = the compiled kernels' choice.
    arg = torch.full((n, f), num_edges, dtype=torch.long, device=x.device)
    for s, e in _chunks(num_edges, f):
        msg = x.index_select(0, col[s:e])
        if weight is not None:
            msg = msg * weight[s:e].to(x.dtype).unsqueeze(1)
        r = row[s:e]
        pos = torch.arange(s, e, device=x.device).unsqueeze(1).expand(-1, f)
        cand = torch.where(msg == out.index_select(0, r), pos, torch.full_like(pos, num_edges))
        arg.scatter_reduce_(0, r.unsqueeze(1).expand(-1, f), cand, reduce="amin", include_self=True)
    empty = (rowptr[1:] == rowptr[:-1]).unsqueeze(1)
    out = torch.where(empty, torch.zeros_like(out), out)
    arg = torch.where(empty | (arg == num_edges), torch.full_like(arg, -1), arg)
    return out, arg


def csr_edge_dot(rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``out[e] = <a[row(e)], b[col[e]]>`` for every CSR edge (SDDMM), ``[E]``."""
    validate.check_edge_dot("csr_edge_dot", rowptr, col, a, b)
    row = row_index(rowptr)
    col = col.long()
    out = b.new_empty(col.numel())
    for s, e in _chunks(col.numel(), b.size(1)):
        out[s:e] = (a.index_select(0, row[s:e]) * b.index_select(0, col[s:e])).sum(-1)
    return out
