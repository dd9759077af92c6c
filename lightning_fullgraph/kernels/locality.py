"""A node order with memory locality for the aggregation kernels, applied and undone inside.

The CPU aggregation gathers one source row per edge. When the rows a destination needs lie
far apart in memory (node ids shuffled, as in most datasets), almost every gather is a DRAM
miss and the kernel runs at the machine's random-row read rate; when the graph has structure
(meshes, road networks, k-NN graphs, communities), an order that puts neighbours next to each
other turns most of those misses into cache hits and lets the hardware prefetcher stream the
next rows. A breadth-first numbering (Cuthill-McKee's, which minimises the matrix bandwidth)
is such an order.

The order is computed once per graph (with the CSR, and cached with it), from the graph's
statistics: the **locality score** of an order is the fraction of edges whose two endpoints
lie within :data:`WINDOW` positions of each other (a window of rows that stays in the last
level cache at 128 fp32 features).  ``"auto"`` keeps the graph's own order unless the
breadth-first order raises the score by at least :data:`MIN_GAIN`; a random graph has no
order with locality, and nothing changes.  Computing the order costs about as much as
building the CSR, so ``"auto"`` first asks whether there is any locality to find: in a graph
with structure, the nodes within three hops of a node are few (a mesh's ball grows with the
cube of the radius, not with the degree cubed); when sampled 3-hop balls reach
:data:`MAX_EXPANSION` of ``1 + d + d^2 + d^3`` nodes (``d`` the mean degree), the graph
expands like a random one and no order is computed; an order already scoring
:data:`ALREADY_LOCAL` is kept as it is.  Reordering costs one permutation of the
source rows before and one of the output rows after each aggregation (two row gathers against
the ``E / N`` per row of the aggregation itself), and for the backward the same again;
callers see their own node ids throughout.  Those two permutations cost about as much as the
reordered aggregation itself; a caller that keeps its data in the order
(:class:`~lightning_fullgraph.data.LocalityOrder`, a PyG transform) pays neither.

Graphs with at least as many sources as destinations are taken to number their destinations
as their first sources: a whole graph in one process (square), and a partition's graph, whose
sources are the owned rows (the destinations, in the same ids) followed by halo rows. The
order is computed on that leading square and the remaining sources keep their positions after
it. Sources and destinations are permuted separately, so the result is right for any graph;
for one whose ids do not follow that convention the order finds no locality and is not used.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .setting import ModeSetting

__all__ = ["NodeOrder", "locality_score", "bfs_order", "choose_order", "set_locality", "get_locality",
           "permute_rows", "expansion", "ENV", "MODES", "WINDOW", "MIN_GAIN", "MIN_EDGES", "MAX_EXPANSION",
           "ALREADY_LOCAL"]

MODES = ("auto", "bfs", "off")
#: Positions within which an edge counts as local: 4096 rows of 128 fp32 = 2 MiB.
WINDOW = 4096
#: Score gain (fraction of edges that become local) for ``"auto"`` to reorder.
MIN_GAIN = 0.25
#: ``"auto"`` leaves graphs with fewer edges alone (mostly cache-resident: an order would only cost).
MIN_EDGES = 1 << 20
#: 3-hop balls at least this fraction of a tree's size: expands like a random graph.
MAX_EXPANSION = 0.5
#: A graph whose own order already scores this is left alone by ``"auto"`` (e.g. one ordered by
#: :class:`~lightning_fullgraph.data.LocalityOrder`: the breadth-first order of a mesh scores ~0.5).
ALREADY_LOCAL = 0.45

#: Environment variable giving the default mode (e.g. for every rank of a launched job).
ENV = "LIGHTNING_FULLGRAPH_LOCALITY"
_setting = ModeSetting("locality mode", MODES, ENV)


def set_locality(mode: Optional[str]) -> None:
    """Set how graphs are ordered for the kernels: ``"auto"`` (default: reorder large graphs
    when a breadth-first order gains locality), ``"bfs"`` (always) or ``"off"``; ``None``
    goes back to ``$LIGHTNING_FULLGRAPH_LOCALITY`` (or ``"auto"``)."""
    _setting.set(mode)


def get_locality() -> str:
    """The mode in effect: :func:`set_locality`'s, else ``$LIGHTNING_FULLGRAPH_LOCALITY``'s,
    else ``"auto"``."""
    return _setting.get()


@dataclass(frozen=True, eq=False)
class NodeOrder:
    """A node permutation and what it gains.

    Attributes:
        perm: ``[N]`` int64, old id of the node at each new position (``x_new = x[perm]``).
        inv: ``[N]`` int64, new position of each old id (``x = x_new[inv]``).
        method: how it was computed (``"bfs"``).
        score_before: :func:`locality_score` of the graph's own order.
        score_after: the same in this order.
        seconds: time spent computing the order and the scores.
        src_perm, src_inv: the same for the source rows (``[N_src]``): ``perm`` then the
            sources beyond ``N_dst`` in place; ``perm``/``inv`` themselves for a square graph.
    """

    perm: Tensor
    inv: Tensor
    method: str
    score_before: float
    score_after: float
    seconds: float
    src_perm: Optional[Tensor] = None
    src_inv: Optional[Tensor] = None

    def __post_init__(self) -> None:
        if self.src_perm is None:  # square graph: sources are ordered like the destinations
            object.__setattr__(self, "src_perm", self.perm)
            object.__setattr__(self, "src_inv", self.inv)


def locality_score(src: Tensor, dst: Tensor, window: int = WINDOW) -> float:
    """Fraction of edges ``(src[e], dst[e])`` whose endpoints are fewer than ``window`` apart."""
    if src.numel() == 0:
        return 1.0
    near = ((src.long() - dst.long()).abs_() < window).sum()
    return float(near) / src.numel()


def expansion(rowptr: Tensor, col: Tensor, num_nodes: int, samples: int = 16, hops: int = 3,
              seed: int = 0) -> float:
    """Mean size of the ``hops``-hop in-neighbourhood balls of ``samples`` random edges' heads, as a
    fraction of ``1 + d + ... + d^hops`` (``d`` = mean in-degree, capped at ``N``): near 1
    for a random graph, small for a graph with locality."""
    e = col.numel()
    if num_nodes == 0 or e == 0:
        return 0.0
    d = e / num_nodes
    tree = min(float(num_nodes), sum(d ** k for k in range(hops + 1)))
    g = torch.Generator().manual_seed(seed)
    # Destinations of random edges: rows with neighbours (most rows of a graph with skewed
    # in-degrees have none, and their empty balls would look local).
    pos = torch.randint(0, e, (samples,), generator=g)
    seeds = torch.searchsorted(rowptr, pos, right=True) - 1
    sizes = []
    for s in seeds.tolist():
        ball = frontier = torch.tensor([s])
        for _ in range(hops):
            starts, ends = rowptr[frontier], rowptr[frontier + 1]
            counts = ends - starts
            if int(counts.sum()) == 0:
                break
            # positions [start, end) of every frontier row, concatenated
            offsets = torch.repeat_interleave(starts - torch.cumsum(counts, 0) + counts, counts)
            nxt = col[torch.arange(int(counts.sum())) + offsets].long().unique()
            nxt = nxt[nxt < num_nodes]  # sources beyond the leading square (halo rows)
            frontier = nxt[~torch.isin(nxt, ball)]
            ball = torch.cat([ball, frontier])
            if ball.numel() >= tree:
                break
        sizes.append(ball.numel())
    return sum(sizes) / len(sizes) / tree


def bfs_order(rowptr: Tensor, col: Tensor, t_rowptr: Tensor, t_col: Tensor, num_nodes: int,
              max_restarts: int = 1024) -> Tensor:
    """Breadth-first (Cuthill-McKee-like) order of the graph seen as undirected, from a
    lowest-degree node; every level's new nodes in the order their first neighbour was
    numbered. Level-synchronous, with torch ops over whole levels: a hub costs its degree,
    not its degree squared (scipy's ``reverse_cuthill_mckee`` insertion-sorts each node's
    neighbours by degree and took 129 s on a graph with a 1.6M-degree hub). Components are
    started one after another from their lowest-degree node; after ``max_restarts`` of them,
    and for nodes without edges, the rest keep their relative order at the end.

    Args:
        rowptr, col: CSR of in-edges (``col`` = sources); ``t_rowptr, t_col``: of out-edges.
        num_nodes: ``N``, the destinations; sources from ``N`` on (halo rows) are not ordered.

    Returns:
        ``[N]`` int64 ``perm``: the old id at each new position.
    """
    deg = (rowptr[1:] - rowptr[:-1]) + (t_rowptr[1:num_nodes + 1] - t_rowptr[:num_nodes])
    visited = torch.zeros(num_nodes, dtype=torch.bool)
    visited[deg == 0] = True  # appended at the end
    by_degree = torch.argsort(deg, stable=True)
    cursor = 0  # into by_degree: the next candidate root
    order = []
    col, t_col = col.long(), t_col.long()

    def neighbours(frontier: Tensor, ptr: Tensor, idx: Tensor) -> Tensor:
        starts, counts = ptr[frontier], ptr[frontier + 1] - ptr[frontier]
        total = int(counts.sum())
        if total == 0:
            return idx.new_empty(0)
        offsets = torch.repeat_interleave(starts - torch.cumsum(counts, 0) + counts, counts)
        return idx[torch.arange(total) + offsets]

    restarts = 0
    while restarts < max_restarts:
        while cursor < num_nodes and visited[by_degree[cursor]]:
            cursor += 1
        if cursor == num_nodes:
            break
        frontier = by_degree[cursor:cursor + 1]
        visited[frontier] = True
        restarts += 1
        while frontier.numel() > 0:
            order.append(frontier)
            # out-neighbours of each frontier node after its in-neighbours, frontier in order
            nb = torch.cat([neighbours(frontier, rowptr, col), neighbours(frontier, t_rowptr, t_col)])
            nb = nb[nb < num_nodes]
            nb = nb[~visited[nb]]
            if nb.numel() == 0:
                break
            uniq, inverse = torch.unique(nb, return_inverse=True)
            first = torch.full((uniq.numel(),), nb.numel(), dtype=torch.long)
            first.scatter_reduce_(0, inverse, torch.arange(nb.numel()), reduce="amin")
            frontier = uniq[torch.argsort(first)]
            visited[frontier] = True
    rest = (~visited).nonzero().flatten()
    isolated = (deg == 0).nonzero().flatten()
    return torch.cat(order + [rest, isolated]) if order else torch.cat([rest, isolated])


def choose_order(src: Tensor, dst: Tensor, rowptr: Tensor, col: Tensor, t_rowptr: Tensor, t_col: Tensor,
                 num_nodes: int, mode: Optional[str] = None, num_src: Optional[int] = None,
                 min_edges: Optional[int] = None) -> Optional[NodeOrder]:
    """The order to use for a graph (``None``: keep its own; see the module docstring).

    Args:
        src, dst: ``[E]`` edge endpoints in the graph's own ids.
        rowptr, col: its destination-sorted CSR (``col`` = sources), on the CPU;
            ``t_rowptr, t_col`` its transpose.
        num_nodes: ``N_dst``.
        mode: ``"auto"``, ``"bfs"`` or ``"off"``; default :func:`get_locality`.
        num_src: ``N_src >= N_dst`` (default ``N_dst``).
        min_edges: ``"auto"`` leaves smaller graphs alone (default :data:`MIN_EDGES`).
    """
    import time

    mode = mode or get_locality()
    if mode not in MODES:
        raise ValueError(f"locality mode must be one of {MODES}, got {mode!r}")
    e = src.numel()
    num_src = num_nodes if num_src is None else int(num_src)
    if mode == "off" or num_nodes < 2 or e == 0 or src.device.type != "cpu" or num_src < num_nodes or \
            (mode == "auto" and e < (MIN_EDGES if min_edges is None else min_edges)):
        return None
    t = time.perf_counter()
    before = locality_score(src, dst)
    if mode == "auto" and before >= ALREADY_LOCAL:
        return None  # already local (ordered by its maker, or by us before)
    if mode == "auto" and expansion(rowptr, col, num_nodes) >= MAX_EXPANSION:
        return None  # expands like a random graph: no order has locality
    perm = bfs_order(rowptr, col, t_rowptr, t_col, num_nodes)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(num_nodes)
    src_perm = src_inv = None
    if num_src > num_nodes:  # the sources beyond the leading square stay where they are
        rest = torch.arange(num_nodes, num_src)
        src_perm, src_inv = torch.cat([perm, rest]), torch.cat([inv, rest])
    after = locality_score((inv if src_inv is None else src_inv)[src], inv[dst])
    seconds = time.perf_counter() - t
    if mode == "auto" and after < before + MIN_GAIN:
        return None
    return NodeOrder(perm, inv, "bfs", before, after, seconds, src_perm, src_inv)


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
