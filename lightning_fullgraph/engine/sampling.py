r"""Boundary node sampling (BNS-GCN, Wan et al., MLSys'22).

In every training step each rank keeps a random fraction :math:`p` of its halo (boundary)
nodes: only their rows cross the wire, scaled by :math:`1/p` on arrival, and the others count
as zero rows, so every aggregation that is linear in its source rows (sums and means with
scalar edge weights: ``GCNConv``, ``SAGEConv(aggr="mean")``, ``GINConv``, ``GraphConv``, ...)
stays unbiased, :math:`\mathbb{E}[\sum_u a_{vu} \tilde x_u] = \sum_u a_{vu} x_u`.  Backward
sends the gradients of the kept rows only (also scaled by :math:`1/p`: the chain rule of the
scaling).  Attention and max aggregations see the zero rows and are not unbiased.

The draw is a pure function of ``(seed, step, receiving rank, global node id)``
(:func:`~.draws.node_draws`), so the owner knows which of its rows each peer keeps without a
message, and every receiver draws its own sample, as BNS-GCN's partitions do.

Under pre- or hybrid aggregation a cut edge may cross as part of a *partial aggregate* (one
row per destination node and sending rank, the sum of the sender's sources of that
destination).  With ``pre=True`` (the default) these rows are sampled too, each kept with
probability :math:`p` and scaled by :math:`1/p`: the same expectation, drawn by
``(seed, step, receiving rank, sending rank, destination id)`` so both ends know which rows
come.  The unit is the partial sum, not its sources, so its variance is higher than sampling
the sources one by one would give (the sources of one partial sum are kept or dropped
together); ``pre=False`` keeps partial aggregates exact and samples source rows only.
Evaluation and prediction always use every row; :math:`p = 1` is exact.
"""
from typing import Any, Optional, Sequence

import torch
from torch import Tensor

from .draws import node_draws

__all__ = ["BoundarySampling"]


class BoundarySampling:
    r"""Settings of boundary node sampling of an :class:`~.policy.ExchangePolicy`.

    Args:
        rate (float): Fraction :math:`p \in (0, 1]` of halo nodes kept per training step.
        pre (bool): Sample the partial aggregates of pre-aggregated cut edges as well (each
            row with probability :math:`p`); ``False`` sends them all, exact.
    """

    def __init__(self, rate: float, pre: bool = True) -> None:
        rate = float(rate)
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"BoundarySampling: rate must be in (0, 1], got {rate}")
        self.rate = rate
        self.pre = bool(pre)

    @classmethod
    def of(cls, value: Any) -> Optional["BoundarySampling"]:
        r"""From ``None`` (none), a rate, or a :class:`BoundarySampling`."""
        if value is None or isinstance(value, BoundarySampling):
            return value
        if isinstance(value, (int, float, str)):
            return cls(float(value))
        raise TypeError(f"expected a sampling rate or a BoundarySampling, got "
                        f"{type(value).__name__}")

    @property
    def lossless(self) -> bool:
        return self.rate == 1.0

    def kept(self, node_ids: Tensor, receiver: int, seed: int, step: int) -> Tensor:
        r"""Which of the halo nodes :obj:`node_ids` of rank :obj:`receiver` it keeps."""
        return node_draws(node_ids, self.rate, f"boundary|{int(seed)}|{int(step)}|{int(receiver)}")

    def kept_slots(self, node_ids: Tensor, counts: Sequence[int], seed: int,
                   step: int) -> Tensor:
        r"""The same for send slots: :obj:`counts` consecutive slots go to each rank."""
        receivers = torch.repeat_interleave(torch.arange(len(counts)),
                                            torch.tensor([int(c) for c in counts]))
        out = torch.zeros(node_ids.numel(), dtype=torch.bool)
        for receiver in range(len(counts)):
            where = (receivers == receiver).nonzero().flatten()
            if where.numel():
                out[where] = self.kept(node_ids.cpu()[where], receiver, seed, step)
        return out.to(node_ids.device)

    def kept_partials(self, node_ids: Tensor, counts: Sequence[int], rank: int, sending: bool,
                      seed: int, step: int) -> Tensor:
        r"""Which partial-aggregate rows are kept: :obj:`node_ids` are their destinations,
        :obj:`counts` consecutive rows go to (:obj:`sending`) or come from each rank, and
        :obj:`rank` is this rank.  Sender and receiver draw the same for a row."""
        peers = torch.repeat_interleave(torch.arange(len(counts)),
                                        torch.tensor([int(c) for c in counts]))
        out = torch.zeros(node_ids.numel(), dtype=torch.bool)
        ids = node_ids.cpu()
        for peer in range(len(counts)):
            where = (peers == peer).nonzero().flatten()
            if where.numel():
                receiver, sender = (peer, rank) if sending else (rank, peer)
                out[where] = node_draws(ids[where], self.rate, f"boundary-pre|{int(seed)}|"
                                        f"{int(step)}|{int(receiver)}|{int(sender)}")
        return out.to(node_ids.device)

    def __repr__(self) -> str:
        extra = "" if self.pre else ", pre=False"
        return f"BoundarySampling(rate={self.rate:g}{extra})"
