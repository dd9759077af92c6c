r"""Exact minimum vertex covers of the per-rank-pair "remote graphs" (SuperGCN
hybrid pre/post aggregation, ICS'25 Alg. 1).

For an ordered rank pair :math:`(s, d)` the remote graph is the bipartite graph
:math:`B_{sd} = (U_{sd}, W_{sd}, E_{sd})`: the cut edges :math:`u \to v` with
``owner(u) = s`` and ``owner(v) = d`` (duplicates collapse), their distinct
sources :math:`U_{sd}` and distinct destinations :math:`W_{sd}`. A vertex cover
:math:`C` decides, per cut edge, how it crosses the wire:

* **post** (source in :math:`C`, tested first as in Alg. 1): :math:`s` ships the
  row of :math:`u`, :math:`d` aggregates (today's halo exchange);
* **pre** (otherwise, then :math:`v \in C`): :math:`s` sums the edge into a
  partial aggregate of :math:`v` and ships that one row.

Rows shipped :math:`s \to d` per exchange are then exactly :math:`|C|` for a
minimum cover, i.e. at most :math:`\min(|U_{sd}|, |W_{sd}|)` (both sides are
covers), the post-only and the pre-only volumes.

The cover is computed with König's theorem from a maximum matching
(Hopcroft–Karp, :func:`scipy.sparse.csgraph.maximum_bipartite_matching`):
with :math:`Z` the vertices reachable from unmatched :math:`U`-vertices by
alternating paths, :math:`C = (U \setminus Z) \cup (W \cap Z)`.
All pairs are solved in **one** matching of their disjoint union (a matching is
maximum on a union iff it is maximum on every component), so the work is one
sort plus one :math:`O(E\sqrt{V})` call regardless of :math:`P`.

**The result is canonical**: :math:`Z \cap U` is the set of :math:`U`-vertices
left unmatched by *some* maximum matching and :math:`Z \cap W` its
neighbourhood (Gallai–Edmonds / Dulmage–Mendelsohn), both independent of which
maximum matching the solver returns. The cover therefore depends only on the
set of edges -- not on their order, on SciPy's tie-breaking or its version -- so
every node that partitions the same graph gets the same plan.
"""
import time
from dataclasses import dataclass, field
from typing import Dict, NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MODES",
    "VertexCover",
    "CutCover",
    "min_vertex_cover",
    "cut_cover",
    "post_rows",
]

#: Aggregation modes of a partition: every cut edge post (today's halo
#: exchange), every cut edge pre, or the minimum-vertex-cover hybrid.
MODES = ("post", "pre", "hybrid")


class VertexCover(NamedTuple):
    r"""Result of :func:`min_vertex_cover`, aligned with the input edges.

    Attributes:
        src_in_cover (torch.Tensor): bool :math:`[E]`, the edge's source
            (within its group) is in the cover. Such an edge is **post**.
        dst_in_cover (torch.Tensor): bool :math:`[E]`, the edge's destination
            (within its group) is in the cover. An edge with
            ``~src_in_cover`` is **pre** and always has ``dst_in_cover``.
        cover_size (torch.Tensor): int64 :math:`[G]`, :math:`|C|` per group
            (= maximum matching size, König).
        num_src (torch.Tensor): int64 :math:`[G]`, distinct sources per group
            (:math:`|U|`, the post-only row count).
        num_dst (torch.Tensor): int64 :math:`[G]`, distinct destinations per
            group (:math:`|W|`, the pre-only row count).
    """
    src_in_cover: Tensor
    dst_in_cover: Tensor
    cover_size: Tensor
    num_src: Tensor
    num_dst: Tensor

    @property
    def post(self) -> Tensor:
        r"""bool :math:`[E]`: the edge is post-aggregated (source in the cover)."""
        return self.src_in_cover


def min_vertex_cover(src: Tensor, dst: Tensor, group: Optional[Tensor] = None,
                     num_groups: Optional[int] = None) -> VertexCover:
    r"""Exact minimum vertex cover of one or many bipartite graphs.

    Edge :math:`e` joins source vertex ``(group[e], src[e])`` to destination
    vertex ``(group[e], dst[e])``; sources and destinations are different
    vertex sets even when the ids coincide, and graphs of different groups
    share no vertex. Duplicate edges collapse.

    Args:
        src (torch.Tensor): Source ids (non-negative integers), shape :math:`[E]`.
        dst (torch.Tensor): Destination ids (non-negative integers), shape :math:`[E]`.
        group (torch.Tensor, optional): Group (bipartite graph) of every edge,
            non-negative integers, shape :math:`[E]` (default: one group).
        num_groups (int, optional): Number of groups :math:`G` (default
            ``group.max() + 1``).

    Returns:
        VertexCover: per-edge membership of both endpoints and per-group sizes.
        Canonical: equal edge sets give equal covers, whatever their order.
    """
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import breadth_first_order, maximum_bipartite_matching

    src = torch.as_tensor(src).detach().cpu().to(torch.long).reshape(-1)
    dst = torch.as_tensor(dst).detach().cpu().to(torch.long).reshape(-1)
    E = src.numel()
    if dst.numel() != E:
        raise ValueError(f"src has {E} entries but dst has {dst.numel()}")
    if group is None:
        group = torch.zeros(E, dtype=torch.long)
    group = torch.as_tensor(group).detach().cpu().to(torch.long).reshape(-1)
    if group.numel() != E:
        raise ValueError(f"group has {group.numel()} entries but there are {E} edges")
    G = (int(group.max()) + 1 if E else 0) if num_groups is None else int(num_groups)
    if E == 0:
        zero = torch.zeros(G, dtype=torch.long)
        empty = torch.zeros(0, dtype=torch.bool)
        return VertexCover(empty, empty.clone(), zero, zero.clone(), zero.clone())
    if int(torch.min(torch.stack([src.min(), dst.min(), group.min()]))) < 0:
        raise ValueError("min_vertex_cover needs non-negative ids and groups")
    if int(group.max()) >= G:
        raise ValueError(f"group contains {int(group.max())} but num_groups={G}")

    # Vertices = (group, id) keys; sorted unique keys number them, so the
    # biadjacency matrix (hence everything below) depends only on the edge set.
    span = max(int(src.max()), int(dst.max())) + 1
    if G * span >= 2**62:
        raise ValueError("too many groups x ids for int64 vertex keys")
    u_key, row = torch.unique(group * span + src, sorted=True, return_inverse=True)
    w_key, col = torch.unique(group * span + dst, sorted=True, return_inverse=True)
    nU, nW = u_key.numel(), w_key.numel()
    pair = torch.unique(row * nW + col, sorted=True)  # CSR order, duplicates gone
    p_row, p_col = pair // nW, pair % nW
    indptr = np.zeros(nU + 1, dtype=np.int64)
    np.cumsum(torch.bincount(p_row, minlength=nU).numpy(), out=indptr[1:])
    indices = p_col.numpy()
    idx_dtype = np.int32 if max(nU, nW, indices.size) < 2**31 - 1 else np.int64
    biadj = csr_array((np.ones(indices.size, dtype=np.int8), indices.astype(idx_dtype),
                       indptr.astype(idx_dtype)), shape=(nU, nW))
    # match_of_u[i] = column matched to row i, or -1.
    match_of_u = np.asarray(maximum_bipartite_matching(biadj, perm_type="column"),
                            dtype=np.int64)

    # Z by one BFS on a directed graph: super-source -> unmatched U,
    # U -> W along every edge (the matching edge of a reached U only leads
    # back to the W it was reached from), W -> U along the matching.
    matched_u = np.flatnonzero(match_of_u >= 0)
    unmatched_u = np.flatnonzero(match_of_u < 0)
    n = nU + nW + 1
    source = nU + nW
    rows_ = np.concatenate([p_row.numpy(), nU + match_of_u[matched_u],
                            np.full(unmatched_u.size, source, dtype=np.int64)])
    cols_ = np.concatenate([nU + indices, matched_u, unmatched_u])
    order = np.argsort(rows_, kind="stable")
    g_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows_, minlength=n), out=g_indptr[1:])
    g_dtype = np.int32 if max(n, cols_.size) < 2**31 - 1 else np.int64
    graph = csr_array((np.ones(cols_.size, dtype=np.int8), cols_[order].astype(g_dtype),
                       g_indptr.astype(g_dtype)), shape=(n, n))
    reached = breadth_first_order(graph, source, directed=True,
                                  return_predecessors=False)
    in_z = np.zeros(n, dtype=bool)
    in_z[reached] = True
    cover_u = torch.from_numpy(~in_z[:nU])          # U \ Z
    cover_w = torch.from_numpy(in_z[nU:nU + nW].copy())  # W ∩ Z

    u_group, w_group = u_key // span, w_key // span
    cover_size = (torch.bincount(u_group[cover_u], minlength=G)
                  + torch.bincount(w_group[cover_w], minlength=G))
    return VertexCover(
        src_in_cover=cover_u[row], dst_in_cover=cover_w[col], cover_size=cover_size,
        num_src=torch.bincount(u_group, minlength=G),
        num_dst=torch.bincount(w_group, minlength=G))


@dataclass
class CutCover:
    r"""Hybrid pre/post decision for every cut edge of a partition, plus the
    rows each ordered rank pair exchanges per aggregation in every mode.

    Attributes:
        num_parts (int): :math:`P`.
        pre (torch.Tensor): bool :math:`[E]` aligned with the global
            ``edge_index``: the edge is a cut edge that the **hybrid** mode
            pre-aggregates at its source's owner (:obj:`False` for post cut
            edges and for edges inside a part).
        rows (Dict[str, torch.Tensor]): ``rows[mode][s, d]`` rows rank
            :math:`s` sends to rank :math:`d` per exchange (int64
            :math:`[P, P]`, zero diagonal), for every mode of :data:`MODES`.
        seconds (float): Wall time of the cover computation.
    """
    num_parts: int
    pre: Tensor
    rows: Dict[str, Tensor] = field(default_factory=dict)
    seconds: float = 0.0


def cut_cover(edge_index: Tensor, parts: Tensor, num_parts: Optional[int] = None
              ) -> CutCover:
    r"""Solves the minimum vertex cover of every ordered rank pair's remote graph.

    Args:
        edge_index (torch.Tensor): Global edges (``edge_index[1]`` is the
            target), shape :math:`[2, E]`.
        parts (torch.Tensor): Owner rank of every node, shape :math:`[N]`.
        num_parts (int, optional): :math:`P` (default ``parts.max() + 1``).

    Returns:
        CutCover
    """
    t0 = time.perf_counter()
    parts = torch.as_tensor(parts).detach().cpu().to(torch.long).reshape(-1)
    P = int(parts.max()) + 1 if num_parts is None else int(num_parts)
    ei = edge_index.detach().cpu().to(torch.long)
    src, dst = ei[0], ei[1]
    ps, pd = parts[src], parts[dst]
    cut = (ps != pd).nonzero().flatten()
    pair = ps[cut] * P + pd[cut]
    vc = min_vertex_cover(src[cut], dst[cut], pair, num_groups=P * P)
    pre = torch.zeros(src.numel(), dtype=torch.bool)
    pre[cut] = ~vc.src_in_cover
    rows = {"post": vc.num_src.view(P, P), "pre": vc.num_dst.view(P, P),
            "hybrid": vc.cover_size.view(P, P)}
    return CutCover(num_parts=P, pre=pre, rows=rows, seconds=time.perf_counter() - t0)


def post_rows(edge_index: Tensor, parts: Tensor, num_parts: int) -> Tensor:
    r"""Rows of the post mode per ordered rank pair, without the vertex cover.

    ``rows[s, d]`` = distinct nodes of part ``s`` with an edge into part ``d`` (the
    halo rows ``s`` sends ``d``; equal to ``cut_cover(...).rows["post"]``).

    Args:
        edge_index (torch.Tensor): Global edges, shape :math:`[2, E]`.
        parts (torch.Tensor): Owner rank of every node, shape :math:`[N]`.
        num_parts (int): :math:`P`.

    Returns:
        torch.Tensor: int64 :math:`[P, P]`, zero diagonal.
    """
    parts = torch.as_tensor(parts).detach().cpu().to(torch.long).reshape(-1)
    ei = edge_index.detach().cpu().to(torch.long)
    P, N = int(num_parts), parts.numel()
    ps, pd = parts[ei[0]], parts[ei[1]]
    cut = ps != pd
    pairs = torch.unique(pd[cut] * N + ei[0, cut])  # (receiver, source node), once each
    receiver, node = pairs // N, pairs % N
    return torch.bincount(parts[node] * P + receiver, minlength=P * P).view(P, P)
