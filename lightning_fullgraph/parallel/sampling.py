r"""Communication-free uniform vertex sampling with unbiased edge rescaling (ScaleGNN §III-D).

Every step, each data-parallel replica draws ``B`` of the ``N`` vertices uniformly without
replacement from a seed that all processes of the replica derive alike (``seed``, the
replica's index, the step): the processes of a replica get the same sample, different
replicas different ones, and no process sends anything to sample.  The mini-batch is the
vertex-induced subgraph with the **full graph's** normalized weights (``gcn_norm`` of the whole
graph, self-loops added); off-diagonal weights are divided by
:math:`p = (B - 1) / (N - 1)`, the probability that a neighbour :math:`u \ne v` of a sampled
:math:`v` is sampled too, so that one aggregation is unbiased given its inputs:

.. math::
    \mathbb{E}\Big[\sum_{u \in N(v) \cap S} \tilde a_{vu} x_u \,\Big|\, v \in S\Big]
    = \sum_u a_{vu} x_u .

Self-loops keep their weight (:math:`v` is always in its own sample).  This holds per linear
aggregation, not through nonlinearities or stacked layers (the GraphSAINT caveat).

:class:`UniformVertexSampler` holds the normalized graph as a destination-sorted CSR built
once; a step costs :math:`O(B \log B + \text{edges of the sampled rows})`, with no
:math:`N`-sized work (membership by binary search in the sorted sample).
"""
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

__all__ = ["SampledSubgraph", "UniformVertexSampler", "sample_seed", "stratified_nodes",
           "strata_bounds", "strata_inclusion"]

_MASK = (1 << 63) - 1


def sample_seed(seed: int, replica: int, step: int) -> int:
    r"""The generator seed of one step of one replica: the same on every process that knows
    :obj:`seed`, :obj:`replica` and :obj:`step` (a hash, so neighbouring steps and replicas
    get unrelated samples)."""
    h = 0xcbf29ce484222325
    for value in (int(seed), int(replica), int(step)):
        h ^= value & _MASK
        h = (h * 0x100000001b3) & _MASK
        h ^= h >> 29
    return h


def strata_bounds(n: int, parts: int) -> Tensor:
    r"""The :obj:`parts` + 1 boundaries of the contiguous, balanced strata of ``range(n)``
    (stratum :math:`j` is :func:`~.pmm.block` ``(n, parts, j)``)."""
    return torch.arange(parts + 1, dtype=torch.long) * n // parts


def stratified_nodes(num_nodes: int, batch_size: int, strata: int, seed: int, replica: int,
                     step: int) -> Tensor:
    r"""The sorted sample of :obj:`step` for :obj:`replica`: with one stratum, :obj:`batch_size`
    of the :obj:`num_nodes` vertices uniformly without replacement; with :math:`L` strata,
    ``block(batch_size, L, j)``'s size of them from each stratum ``block(num_nodes, L, j)``
    (see :class:`UniformVertexSampler`)."""
    g = torch.Generator().manual_seed(sample_seed(seed, replica, step))
    if strata == 1:
        return torch.randperm(num_nodes, generator=g)[:batch_size].sort().values
    n, b = strata_bounds(num_nodes, strata), strata_bounds(batch_size, strata)
    return torch.cat([torch.randperm(int(n[j + 1] - n[j]), generator=g)[:int(b[j + 1] - b[j])]
                      .sort().values + n[j] for j in range(strata)])


def strata_inclusion(num_nodes: int, batch_size: int, strata: int,
                     dtype: torch.dtype = torch.float32) -> Tensor:
    r""":math:`q_{jk}`: the probability that a vertex :math:`u` of stratum :math:`k` is in a
    sample that holds a vertex :math:`v \ne u` of stratum :math:`j` (:math:`[L, L]`;
    ``(b_k - 1) / (n_k - 1)`` on the diagonal, ``b_k / n_k`` off it)."""
    n = strata_bounds(num_nodes, strata).diff().double()
    b = strata_bounds(batch_size, strata).diff().double()
    same = torch.eye(strata, dtype=torch.double)
    q = (b[None, :] - same) / (n[None, :] - same).clamp_min(1.0)
    return q.clamp_min(torch.finfo(torch.double).tiny).to(dtype)


@dataclass
class SampledSubgraph:
    r"""One mini-batch: the sampled vertices and their rescaled induced subgraph.

    Attributes:
        nodes (torch.Tensor): :math:`[B]` global ids, ascending.
        edge_index (torch.Tensor): :math:`[2, E_S]` positions in :obj:`nodes` (source row 0,
            destination row 1, PyG's ``source_to_target``), sorted by destination.
        edge_weight (torch.Tensor): :math:`[E_S]` full-graph normalized weights, off-diagonal
            ones divided by :obj:`p`.
        p (float): :math:`(B - 1) / (N - 1)`.
        step (int): The step it was drawn for.
        replica (int): The data-parallel replica it was drawn for.
    """

    nodes: Tensor
    edge_index: Tensor
    edge_weight: Tensor
    p: float
    step: int
    replica: int

    @property
    def num_nodes(self) -> int:
        return int(self.nodes.numel())


def check_strata(num_nodes: int, batch_size: int, strata: int) -> None:
    r"""Raises a :class:`ValueError` unless every one of :obj:`strata` vertex ranges can give
    its share of the batch."""
    if strata < 1:
        raise ValueError(f"strata must be at least 1, got {strata}")
    n, b = strata_bounds(num_nodes, strata).diff(), strata_bounds(batch_size, strata).diff()
    if bool((b > n).any()) or strata > num_nodes:
        raise ValueError(f"{strata} strata of {num_nodes} vertices cannot give a batch of "
                         f"{batch_size} (each gives its share): use fewer processes per grid "
                         "or a smaller batch")


class UniformVertexSampler:
    r"""Draws :class:`SampledSubgraph` mini-batches without communication.

    Args:
        edge_index (torch.Tensor): :math:`[2, E]` edges of the full graph (source, target).
        num_nodes (int): :math:`N`.
        batch_size (int): :math:`B`, vertices per step (``2 <= B <= N``).
        seed (int): Seed shared by every process.
        edge_weight (torch.Tensor, optional): Raw weights of the edges (``gcn_norm``'s input).
        normalize (bool): Use ``gcn_norm`` weights with self-loops (ScaleGNN's
            :math:`D^{-1/2}(A + I)D^{-1/2}`); otherwise :obj:`edge_weight` (or ones) as given.
        dtype (torch.dtype): Weight dtype.
        strata (int): Draw the sample stratum by stratum: ``block(B, L, j)``'s size of
            vertices from each of :math:`L` contiguous vertex ranges ``block(N, L, j)``, so
            that the rows of a grid block of the batch are exactly the sampled vertices of one
            range of the graph (what lets every process of a grid hold only its ranges:
            :mod:`~lightning_fullgraph.parallel.shards`).  An off-diagonal weight from stratum
            :math:`k` into :math:`j` is divided by :math:`q_{jk}`
            (:func:`strata_inclusion`) instead of :math:`p`: still unbiased.  Default 1 (plain
            uniform sampling).

    Example::

        sampler = UniformVertexSampler(data.edge_index, data.num_nodes, batch_size=1024)
        batch = sampler.sample(step=0, replica=dp_rank)
        out = model(data.x[batch.nodes], batch.edge_index, batch.edge_weight)
    """

    def __init__(self, edge_index: Tensor, num_nodes: int, batch_size: int, seed: int = 0,
                 edge_weight: Optional[Tensor] = None, normalize: bool = True,
                 dtype: torch.dtype = torch.float32, strata: int = 1) -> None:
        num_nodes, batch_size, strata = int(num_nodes), int(batch_size), int(strata)
        if num_nodes < 2:
            raise ValueError(f"uniform vertex sampling needs at least 2 nodes, got {num_nodes}")
        if not 2 <= batch_size <= num_nodes:
            raise ValueError(f"batch_size must lie in [2, {num_nodes}] (the number of nodes), "
                             f"got {batch_size}")
        if edge_index.dim() != 2 or edge_index.size(0) != 2:
            raise ValueError(f"edge_index must be [2, E], got {tuple(edge_index.shape)}")
        check_strata(num_nodes, batch_size, strata)
        self.num_nodes, self.batch_size, self.seed = num_nodes, batch_size, int(seed)
        self.strata = strata
        self.p = (batch_size - 1) / (num_nodes - 1)
        self.q = strata_inclusion(num_nodes, batch_size, strata, dtype)
        edge_index = edge_index.long().cpu()
        if normalize:
            from torch_geometric.nn.conv.gcn_conv import gcn_norm
            edge_index, weight = gcn_norm(edge_index, edge_weight, num_nodes,
                                          add_self_loops=True, dtype=dtype)
        else:
            weight = (edge_weight.to(dtype) if edge_weight is not None
                      else torch.ones(edge_index.size(1), dtype=dtype))
        src, dst = edge_index[0], edge_index[1]
        order = torch.argsort(dst * num_nodes + src)  # by destination, then source
        self.col = src[order]
        self.weight = weight.cpu()[order]
        self.rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
        torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0, out=self.rowptr[1:])

    def full(self) -> SampledSubgraph:
        r"""The whole graph with the normalized weights, unscaled (evaluation)."""
        counts = self.rowptr[1:] - self.rowptr[:-1]
        dst = torch.repeat_interleave(torch.arange(self.num_nodes), counts)
        return SampledSubgraph(torch.arange(self.num_nodes), torch.stack([self.col, dst]),
                               self.weight, 1.0, -1, -1)

    def nodes(self, step: int, replica: int = 0) -> Tensor:
        r"""The sorted sample of :obj:`step` for data-parallel :obj:`replica`."""
        return stratified_nodes(self.num_nodes, self.batch_size, self.strata, self.seed,
                                replica, step)

    def sample(self, step: int, replica: int = 0) -> SampledSubgraph:
        r"""The rescaled vertex-induced subgraph of :obj:`step` for :obj:`replica`."""
        nodes = self.nodes(step, replica)
        start, end = self.rowptr[nodes], self.rowptr[nodes + 1]
        counts = end - start
        dst = torch.repeat_interleave(torch.arange(nodes.numel()), counts)
        offsets = torch.cumsum(counts, 0) - counts
        pos = start[dst] + (torch.arange(int(counts.sum())) - offsets[dst])
        src_global = self.col[pos]
        # Membership by binary search in the sorted sample: no N-sized mask per step.
        at = torch.searchsorted(nodes, src_global).clamp(max=nodes.numel() - 1)
        keep = nodes[at] == src_global
        src, dst, pos = at[keep], dst[keep], pos[keep]
        weight = self.weight[pos]
        off = src != dst
        if self.strata == 1:
            weight[off] /= self.p
        else:
            bounds = strata_bounds(self.batch_size, self.strata)
            of = lambda i: torch.searchsorted(bounds, i, right=True) - 1  # noqa: E731
            weight[off] /= self.q[of(dst[off]), of(src[off])]
        return SampledSubgraph(nodes, torch.stack([src, dst]), weight, self.p, int(step),
                               int(replica))
