"""A node order with memory locality for the aggregation kernels, applied and undone inside.

The CPU aggregation gathers one source row per edge. When the rows a destination needs lie
far apart in memory (node ids shuffled, as in most datasets), almost every gather is a DRAM
miss and the kernel runs at the machine's random-row read rate; when the graph has structure
(meshes, road networks, k-NN graphs, communities), an order that puts neighbours next to each
other turns most of those misses into cache hits.  Reverse Cuthill-McKee (RCM) is such an
order: a breadth-first numbering that minimises the matrix bandwidth.

The order is computed once per graph (with the CSR, and cached with it), from the graph's
statistics: the **locality score** of an order is the fraction of edges whose two endpoints
lie within :data:`WINDOW` positions of each other (a window of rows that stays in the last
level cache at 128 fp32 features).  ``"auto"`` keeps the graph's own order unless RCM raises
the score by at least :data:`MIN_GAIN`; a random graph has no order with locality, RCM does
not raise its score, and nothing changes.  Reordering costs one permutation of the source
rows before and one of the output rows after each aggregation (two row gathers against the
``E / N`` per row of the aggregation itself), and for the backward the same again; callers
see their own node ids throughout.

Only square graphs (``N_src == N_dst``: a whole graph in one process) are reordered; the
rectangular graphs of a partition (owned + halo sources, owned destinations) keep their order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

__all__ = ["NodeOrder", "locality_score", "rcm_order", "choose_order", "set_locality", "get_locality",
           "permute_rows", "MODES", "WINDOW", "MIN_GAIN", "MIN_EDGES"]

MODES = ("auto", "rcm", "off")
#: Positions within which an edge counts as local: 4096 rows of 128 fp32 = 2 MiB.
WINDOW = 4096
#: Score gain (fraction of edges that become local) for ``"auto"`` to reorder.
MIN_GAIN = 0.25
#: ``"auto"`` leaves graphs with fewer edges alone (they fit in cache; RCM would only cost).
MIN_EDGES = 1 << 20

_default = "auto"


def set_locality(mode: str) -> None:
    """Set how graphs are ordered for the kernels: ``"auto"`` (default: reorder large square
    graphs when RCM gains locality), ``"rcm"`` (always, for square graphs) or ``"off"``."""
    global _default
    if mode not in MODES:
        raise ValueError(f"locality mode must be one of {MODES}, got {mode!r}")
    _default = mode


def get_locality() -> str:
    """The mode in effect (see :func:`set_locality`)."""
    return _default


@dataclass(frozen=True, eq=False)
class NodeOrder:
    """A node permutation and what it gains.

    Attributes:
        perm: ``[N]`` int64, old id of the node at each new position (``x_new = x[perm]``).
        inv: ``[N]`` int64, new position of each old id (``x = x_new[inv]``).
        method: how it was computed (``"rcm"``).
        score_before: :func:`locality_score` of the graph's own order.
        score_after: the same in this order.
        seconds: time spent computing the order and the scores.
    """

    perm: Tensor
    inv: Tensor
    method: str
    score_before: float
    score_after: float
    seconds: float


def locality_score(src: Tensor, dst: Tensor, window: int = WINDOW) -> float:
    """Fraction of edges ``(src[e], dst[e])`` whose endpoints are fewer than ``window`` apart."""
    if src.numel() == 0:
        return 1.0
    near = ((src.long() - dst.long()).abs_() < window).sum()
    return float(near) / src.numel()


def rcm_order(rowptr: Tensor, col: Tensor, num_nodes: int) -> Tensor:
    """Reverse Cuthill-McKee order of the symmetrised graph given as a square CSR.

    Returns:
        ``[N]`` int64 ``perm``: the old id at each new position.
    """
    import numpy as np
    import scipy.sparse as sp
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    # Structure only (the values are never read); scipy symmetrises (A + A^T) itself.
    a = sp.csr_matrix((np.ones(col.numel(), dtype=np.int8), col.numpy(), rowptr.numpy()),
                      shape=(num_nodes, num_nodes))
    return torch.from_numpy(reverse_cuthill_mckee(a, symmetric_mode=False).astype(np.int64))


def choose_order(src: Tensor, dst: Tensor, rowptr: Tensor, col: Tensor, num_nodes: int,
                 mode: Optional[str] = None) -> Optional[NodeOrder]:
    """The order to use for a square graph (``None``: keep its own).

    Args:
        src, dst: ``[E]`` edge endpoints in the graph's own ids.
        rowptr, col: its destination-sorted CSR (``col`` = sources), on the CPU.
        num_nodes: ``N``.
        mode: ``"auto"``, ``"rcm"`` or ``"off"``; default :func:`get_locality`.
    """
    import time

    mode = mode or get_locality()
    if mode not in MODES:
        raise ValueError(f"locality mode must be one of {MODES}, got {mode!r}")
    e = src.numel()
    if mode == "off" or num_nodes < 2 or e == 0 or src.device.type != "cpu" or \
            (mode == "auto" and e < MIN_EDGES):
        return None
    t = time.perf_counter()
    before = locality_score(src, dst)
    if mode == "auto" and before >= 1.0 - MIN_GAIN:
        return None  # already local: nothing RCM could add
    perm = rcm_order(rowptr, col.long(), num_nodes)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(num_nodes)
    after = locality_score(inv[src], inv[dst])
    seconds = time.perf_counter() - t
    if mode == "auto" and after < before + MIN_GAIN:
        return None
    return NodeOrder(perm, inv, "rcm", before, after, seconds)


class _PermuteRows(torch.autograd.Function):
    # Rows by a permutation; its gradient goes back by the inverse permutation (a gather,
    # not the scatter index_select's own backward would run).
    @staticmethod
    def forward(ctx, x: Tensor, perm: Tensor, inv: Tensor) -> Tensor:
        ctx.save_for_backward(inv)
        return x.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inv,) = ctx.saved_tensors
        return grad.index_select(0, inv), None, None


def permute_rows(x: Tensor, perm: Tensor, inv: Tensor) -> Tensor:
    """``x[perm]`` (``inv`` the inverse permutation), differentiable."""
    return _PermuteRows.apply(x, perm, inv)
