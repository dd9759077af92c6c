"""A fast, seeded generator of large learnable node-classification graphs.

The model is a degree-corrected stochastic block model: every node gets a
community and a power-law weight; an edge picks its first endpoint in
proportion to the weights and its second endpoint, again in proportion to the
weights, inside the first endpoint's community with probability
:obj:`homophily` and among all other communities otherwise. Features are noisy
community centroids, so a single node's features are only weakly informative
while averaging over (mostly same-community) neighbours removes the noise:
exactly the regime in which a GCN clearly beats an MLP.

Everything is vectorised (Poisson source counts, inverse-CDF sampling through
a guide table, deduplication by sorting integer edge keys), so 2M nodes / 20M
directed edges take seconds, not minutes; time it with
``python -m lightning_fullgraph.data.bench_synthetic 1000000 2000000``.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor
from torch_geometric.data import Data

__all__ = ["synthetic_graph"]

# Top-up rounds used to replace pairs lost to deduplication / self-loops. Each
# round only samples the remaining deficit, which shrinks geometrically with
# the (small) collision rate, so a handful of rounds reaches the target.
_MAX_ROUNDS = 10


class _EndpointSampler:
    r"""Samples nodes in proportion to their weight, optionally restricted to
    (or excluded from) a given community, by inverse-CDF lookups into the
    weight cumsum of the nodes sorted by community."""

    def __init__(self, weight: Tensor, community: Tensor, num_communities: int,
                 homophily: float, gen: torch.Generator) -> None:
        self.gen = gen
        self.homophily = homophily
        self.community = community
        self.weight = weight
        # Stable sort keeps the order reproducible across torch versions.
        self.order = torch.sort(community, stable=True).indices
        # float64: with millions of nodes a float32 cumsum loses the
        # resolution needed to hit low-weight nodes.
        self.cum = torch.cumsum(weight[self.order], dim=0)
        self.mass = torch.bincount(community, weights=weight,
                                   minlength=num_communities)
        self.end = torch.cumsum(self.mass, dim=0)
        self.start = self.end - self.mass
        self.total = float(self.end[-1])
        self.num_communities = num_communities

        # Guide table: ``guide[j]`` is the first node whose cumsum exceeds
        # ``j * total / G``. A query then starts there and steps forward a
        # few nodes (weights >= 1 vs. a bucket width of mean weight), i.e. a
        # handful of random reads instead of the ~21 of a binary search over
        # millions of nodes; the result equals ``searchsorted(right=True)``.
        self.num_buckets = self.cum.numel()
        grid = torch.arange(self.num_buckets, dtype=torch.float64)
        grid *= self.total / self.num_buckets
        self.guide = torch.searchsorted(self.cum, grid, right=True)

    def _lookup(self, u: Tensor) -> Tensor:
        last = self.cum.numel() - 1
        bucket = (u * (self.num_buckets / self.total)).long()
        idx = self.guide[bucket.clamp_(max=self.num_buckets - 1)]
        # Rounding can push ``u`` onto ``cum[-1]``: clamp, never overrun.
        idx.clamp_(max=last)
        todo = (self.cum[idx] <= u).nonzero().view(-1)
        while todo.numel() > 0:
            step = (idx[todo] + 1).clamp_(max=last)
            idx[todo] = step
            todo = todo[(self.cum[step] <= u[todo]) & (step < last)]
        return self.order[idx]

    def source(self, n: int) -> Tensor:
        u = torch.rand(n, generator=self.gen, dtype=torch.float64) * self.total
        return self._lookup(u)

    def sources_poisson(self, n: int) -> Tensor:
        # About ``n`` weight-proportional sources in one sequential pass:
        # Poisson counts per node, then repeat_interleave. Unlike ``source``
        # there is no binary search (random memory access), which matters for
        # tens of millions of samples; the shortfall or excess relative to
        # ``n`` is absorbed by the top-up rounds.
        counts = torch.poisson(self.weight * (n / self.total),
                               generator=self.gen)
        return torch.repeat_interleave(counts.long())

    def target(self, src: Tensor) -> Tensor:
        c = self.community[src]
        mass, start = self.mass[c], self.start[c]
        r = torch.rand(src.numel(), generator=self.gen, dtype=torch.float64)
        intra = torch.rand(src.numel(), generator=self.gen) < self.homophily
        if self.num_communities == 1:
            intra.fill_(True)
        # Intra: a point inside the community's slice of the cumsum.
        u_in = start + r * mass
        # Inter: a point in the cumsum with the community's slice cut out,
        # shifted past that slice, i.e. weight-proportional among the others.
        u_out = r * (self.total - mass)
        u_out = u_out + mass * (u_out >= start)
        return self._lookup(torch.where(intra, u_in, u_out))


def _pair_keys(src: Tensor, dst: Tensor, num_nodes: int) -> Tensor:
    # Canonical undirected key min * N + max, without self-loops, unique.
    keep = src != dst
    src, dst = src[keep], dst[keep]
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    return torch.unique(lo * num_nodes + hi)


def _not_in(keys: Tensor, sorted_chunks: list) -> Tensor:
    # Membership against already accepted (sorted, unique) chunks by binary
    # search: far cheaper than re-sorting everything after each top-up round.
    keep = torch.ones_like(keys, dtype=torch.bool)
    for chunk in sorted_chunks:
        if chunk.numel() == 0:
            continue
        pos = torch.searchsorted(chunk, keys).clamp_(max=chunk.numel() - 1)
        keep &= chunk[pos] != keys
    return keys[keep]


def _check_args(num_nodes: int, avg_degree: float, num_features: int,
                num_classes: int, num_communities: int,
                power_law_exponent: Optional[float], homophily: float,
                feature_noise: float, train_ratio: float,
                val_ratio: float) -> None:
    if num_nodes < 2:
        raise ValueError(f"num_nodes must be >= 2, got {num_nodes}")
    if not 0 < avg_degree <= num_nodes - 1:
        raise ValueError(f"avg_degree must be in (0, num_nodes - 1 = "
                         f"{num_nodes - 1}], got {avg_degree}")
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if not num_classes <= num_communities <= num_nodes:
        raise ValueError(f"num_communities must be in [num_classes = "
                         f"{num_classes}, num_nodes = {num_nodes}], got "
                         f"{num_communities}")
    if power_law_exponent is not None and not power_law_exponent > 1:
        raise ValueError(f"power_law_exponent must be > 1 (or None for no "
                         f"degree skew), got {power_law_exponent}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    if feature_noise < 0:
        raise ValueError(f"feature_noise must be >= 0, got {feature_noise}")
    if not (0 < train_ratio and 0 <= val_ratio
            and train_ratio + val_ratio <= 1):
        raise ValueError(f"need 0 < train_ratio, 0 <= val_ratio and "
                         f"train_ratio + val_ratio <= 1, got {train_ratio} "
                         f"and {val_ratio}")


def synthetic_graph(
    num_nodes: int,
    avg_degree: float = 10.0,
    num_features: int = 32,
    num_classes: int = 5,
    num_communities: Optional[int] = None,
    power_law_exponent: Optional[float] = 2.5,
    homophily: float = 0.8,
    feature_noise: float = 1.0,
    train_ratio: float = 0.6,
    val_ratio: float = 0.2,
    seed: int = 0,
) -> Data:
    r"""Generates a random undirected node-classification graph with a
    power-law degree distribution, community structure and community-driven
    features and labels (a degree-corrected stochastic block model).

    * Communities are balanced; community :math:`c` has label
      :math:`c \bmod` :obj:`num_classes`.
    * Node weights follow a Pareto law :math:`P(w) \propto w^{-\gamma}`
      (:math:`\gamma` = :obj:`power_law_exponent`), capped at the structural
      cut-off so that no expected degree exceeds
      :math:`\sqrt{\text{avg\_degree} \cdot N}`; a node's expected degree is
      proportional to its weight. Every node gets at least one edge (so an
      :obj:`avg_degree` below 2 yields somewhat more edges than requested).
    * An edge joins two nodes of the same community with probability
      :obj:`homophily`, otherwise nodes of different communities.
    * :math:`\mathbf{x}_v = \boldsymbol{\mu}_{c(v)} +
      \sigma \boldsymbol{\epsilon}_v`
      with random centroids of norm about 1 and
      :math:`\sigma` = :obj:`feature_noise`.

    The graph is undirected (both directions stored), coalesced (sorted by
    row, then column; no duplicates) and free of self-loops. The same
    arguments always give the same graph. 2M nodes with 20M directed edges
    take a few seconds on a laptop-class CPU.

    Args:
        num_nodes (int): Number of nodes.
        avg_degree (float, optional): Target average degree, i.e. about
            :obj:`num_nodes * avg_degree` directed edges (slightly fewer if
            duplicates cannot be replaced, e.g. for near-complete graphs).
            (default: :obj:`10.0`)
        num_features (int, optional): Feature dimension. (default: :obj:`32`)
        num_classes (int, optional): Number of classes. (default: :obj:`5`)
        num_communities (int, optional): Number of communities, at least
            :obj:`num_classes`; several communities then share a class.
            (default: :obj:`None` = :obj:`num_classes`)
        power_law_exponent (float, optional): Exponent :math:`\gamma > 1` of
            the degree distribution; :obj:`None` gives a homogeneous
            (Poisson-like) degree distribution. (default: :obj:`2.5`)
        homophily (float, optional): Fraction of edges inside a community
            (equal to the edge homophily of the labels when
            :obj:`num_communities == num_classes`). (default: :obj:`0.8`)
        feature_noise (float, optional): Standard deviation of the per-entry
            Gaussian feature noise; higher values make features alone less
            informative. (default: :obj:`1.0`)
        train_ratio (float, optional): Fraction of nodes in :obj:`train_mask`.
            (default: :obj:`0.6`)
        val_ratio (float, optional): Fraction of nodes in :obj:`val_mask`;
            the rest form :obj:`test_mask`. (default: :obj:`0.2`)
        seed (int, optional): Random seed. (default: :obj:`0`)

    Returns:
        torch_geometric.data.Data: With :obj:`x` (float32 ``[N, F]``),
        :obj:`edge_index` (int64 ``[2, E]``), :obj:`y` (int64 ``[N]``) and
        disjoint boolean :obj:`train_mask`, :obj:`val_mask`, :obj:`test_mask`.
    """
    num_nodes, num_features, num_classes = (int(num_nodes), int(num_features),
                                            int(num_classes))
    num_communities = num_classes if num_communities is None else int(
        num_communities)
    _check_args(num_nodes, avg_degree, num_features, num_classes,
                num_communities, power_law_exponent, homophily,
                feature_noise, train_ratio, val_ratio)
    N = num_nodes
    gen = torch.Generator().manual_seed(int(seed))

    # Balanced communities in random order: sizes differ by at most one.
    community = (torch.arange(N) % num_communities)[torch.randperm(
        N, generator=gen)]
    y = community % num_classes

    if power_law_exponent is None:
        weight = torch.ones(N, dtype=torch.float64)
    else:
        # Inverse-CDF Pareto(w >= 1); 1 - rand lies in (0, 1], no inf.
        u = 1.0 - torch.rand(N, generator=gen, dtype=torch.float64)
        weight = u.pow(-1.0 / (power_law_exponent - 1.0))
        # Structural cut-off: without it a few hubs would want to connect to
        # a large part of the graph, most of their pairs would be duplicates
        # and the realised degrees would no longer follow the weights.
        max_degree = min(math.sqrt(avg_degree * N), N - 1)
        weight.clamp_(max=float(weight.mean()) * max_degree / avg_degree)
    sampler = _EndpointSampler(weight, community, num_communities, homophily,
                               gen)

    # Undirected target edge count; never more than the complete graph.
    target = min(int(round(N * avg_degree / 2)), N * (N - 1) // 2)
    # One "anchor" edge per node guarantees (almost) no isolated node while
    # barely changing the degree distribution; skipped for very sparse
    # targets where it would dominate.
    if target >= N:
        src = torch.cat([torch.arange(N), sampler.sources_poisson(target - N)])
    else:
        src = sampler.sources_poisson(target)
    chunks = [_pair_keys(src, sampler.target(src), N)]
    count = chunks[0].numel()
    for _ in range(_MAX_ROUNDS):
        if count >= target:
            break
        src = sampler.source(target - count)
        new = _not_in(_pair_keys(src, sampler.target(src), N), chunks)
        chunks.append(new)
        count += new.numel()
    keys = torch.cat(chunks)
    if count > target:
        # Poisson sources can overshoot; drop a random excess.
        keys = keys[torch.randperm(count, generator=gen)[:target]]

    # Connect the (rare) nodes left isolated, e.g. whose anchor was a
    # self-loop. Such a node has no edge yet, so every new pair is new.
    degree = torch.bincount(torch.cat([keys // N, keys % N]), minlength=N)
    isolated = (degree == 0).nonzero().view(-1)
    if isolated.numel() > 0:
        dst = sampler.target(isolated)
        # Fall back to the next node in community order for self-loops.
        position = torch.empty_like(sampler.order)
        position[sampler.order] = torch.arange(N)
        loop = dst == isolated
        dst[loop] = sampler.order[(position[isolated[loop]] + 1) % N]
        # ``_pair_keys`` dedupes pairs of two isolated nodes picking each
        # other; no pair can repeat an existing key, so no global re-sort.
        keys = torch.cat([keys, _pair_keys(isolated, dst, N)])

    # Both directions, then one sort of the directed keys gives the
    # coalesced (row-major) order PyG's ``coalesce`` would produce.
    lo, hi = keys // N, keys % N
    directed = torch.sort(torch.cat([keys, hi * N + lo])).values
    edge_index = torch.stack([directed // N, directed % N], dim=0)

    # Centroids of norm ~1 keep the class separation independent of
    # ``num_features``; the noise then sets how informative features are.
    centroids = torch.randn(num_communities, num_features, generator=gen)
    centroids /= math.sqrt(num_features)
    x = torch.randn(N, num_features, generator=gen)
    x.mul_(feature_noise).add_(centroids[community])

    perm = torch.randperm(N, generator=gen)
    num_train = max(1, int(round(train_ratio * N)))
    num_val = min(int(round(val_ratio * N)), N - num_train)
    masks = []
    for lo_, hi_ in ((0, num_train), (num_train, num_train + num_val),
                     (num_train + num_val, N)):
        mask = torch.zeros(N, dtype=torch.bool)
        mask[perm[lo_:hi_]] = True
        masks.append(mask)

    return Data(x=x, edge_index=edge_index, y=y, train_mask=masks[0],
                val_mask=masks[1], test_mask=masks[2])

