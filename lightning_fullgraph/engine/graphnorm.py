"""PyG's cross-node normalizations over nodes spread across ranks.

``GraphNorm``, ``PairNorm``, ``LayerNorm(mode="graph")``, ``InstanceNorm``,
``MeanSubtractionNorm`` and ``GraphSizeNorm`` compute statistics over *all* nodes of a
graph (means, variances, the node count).  When each rank holds only its own rows those
statistics are sums over ranks: every distributed version here reproduces its PyG
class's forward with the per-rank sums all-reduced (autograd-aware, so gradients flow to
the rows of every rank) and the node count all-reduced too.  Means and variances take
two passes (mean first, then the centred sum of squares), as PyG computes them, which
keeps fp32 close to the single-process result.  ``DiffGroupNorm`` computes its soft
cluster assignment per node; its only cross-node statistic is the ``BatchNorm1d`` inside,
which is synchronized by :mod:`.batchnorm`.

Partitioned training splits *one* graph over the ranks, so only a single graph is
supported: ``batch=None`` or an all-zero ``batch`` (then PyG's batched formula is
reproduced, which differs for ``LayerNorm``).  A batch vector with several graphs is
refused on every rank with the module's name.  Without a process group, or with one
rank, each module runs PyG's own forward unchanged.

:func:`convert_cross_node_norms` swaps every such module for its distributed version,
which shares the original's parameters, buffers and hooks (state-dict keys and
optimizer state are untouched); :func:`revert_cross_node_norms` swaps back.
"""
import math
from typing import Any, Dict, List, Optional, Tuple, Type

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn import norm as pyg_norm

from .batchnorm import (DistributedBatchNorm, _AllReduceSum, convert_batchnorm,
                        revert_batchnorm)

__all__ = [
    "CROSS_NODE_NORMS", "DistributedGraphNorm", "DistributedPairNorm", "DistributedLayerNorm",
    "DistributedInstanceNorm", "DistributedMeanSubtractionNorm", "DistributedGraphSizeNorm",
    "MultipleGraphsError", "convert_cross_node_norms", "revert_cross_node_norms",
    "unreproduced_norm",
]

Swap = Tuple[torch.nn.Module, str, torch.nn.Module]


class MultipleGraphsError(ValueError):
    r"""A cross-node normalization received a batch of several graphs on a partition."""


def _world_size(group: Optional[Any]) -> int:
    # Constant-folded by torch.compile (no graph break on one process).
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _wide(dtype: torch.dtype) -> torch.dtype:
    # Half-precision sums over ranks (and node counts) are reduced in float32: no precision
    # is lost on the wire beyond what each rank's own sum already lost.
    return torch.promote_types(dtype, torch.float32)


class _CrossNodeNorm:
    r"""Shared machinery of the distributed norms (a mixin placed before the PyG class).

    Instances are never built by ``__init__``: :func:`convert_cross_node_norms` creates
    them from a PyG module and sets :attr:`group` and :attr:`where`.
    """

    group: Optional[Any] = None
    where: str = ""

    def _spans_ranks(self) -> bool:
        return _world_size(self.group) > 1

    # Excluded from torch.compile tracing: an eager collective, one graph break.
    @torch.compiler.disable
    def _all_reduce(self, t: Tensor) -> Tensor:
        return _AllReduceSum.apply(t.to(_wide(t.dtype)), self.group).to(t.dtype)

    def _sum_and_count(self, local_sum: Tensor, x: Tensor, batch: Optional[Tensor],
                       batch_size: Optional[int]) -> Tuple[Tensor, Tensor]:
        r"""All-reduces :obj:`local_sum` together with the node count (one collective).

        The check that :obj:`batch` holds one graph rides in the same collective, so every
        rank raises (no rank is left waiting in a later collective for one that raised).

        Returns:
            ``(global sum, global node count)``; the count is a detached 0-dim tensor of
            ``x.dtype`` (PyG counts nodes in the feature dtype too), or float32 for half
            precision, where counts above 256 (bfloat16) or 2048 would round.
        """
        if batch_size is not None and batch_size > 1:
            raise self._several_graphs(f"batch_size={batch_size}")
        total = self._all_reduce_checked(local_sum.reshape(-1), x.size(0), batch)
        return total[:-2].view_as(local_sum).to(x.dtype), total[-2].detach()

    # Excluded from tracing as a whole: the check reads tensor values, which would break the
    # graph a second time.
    @torch.compiler.disable
    def _all_reduce_checked(self, local_sum: Tensor, rows: int,
                            batch: Optional[Tensor]) -> Tensor:
        several = 0.0 if batch is None else float(bool((batch != 0).any()))
        wide = _wide(local_sum.dtype)
        extra = torch.tensor([float(rows), several], dtype=wide, device=local_sum.device)
        total = _AllReduceSum.apply(torch.cat([local_sum.to(wide), extra]), self.group)
        if float(total[-1].detach()) > 0:
            raise self._several_graphs("a batch vector with graph ids other than 0")
        return total

    def _several_graphs(self, what: str) -> MultipleGraphsError:
        return MultipleGraphsError(
            f"'{self.where}' ({type(self).__bases__[1].__name__}) received {what}. Partitioned "
            "training splits one graph over the ranks, so its statistics cover that one "
            "graph: pass batch=None (or all zeros)")


class DistributedGraphNorm(_CrossNodeNorm, pyg_norm.GraphNorm):
    r""":class:`~torch_geometric.nn.norm.GraphNorm` over the nodes of all ranks.

    Args:
        x (torch.Tensor): The rank's node features.
        batch (torch.Tensor, optional): ``None`` or all zeros (one graph).
        batch_size (int, optional): ``None`` or 1.

    Shapes:
        - **input:** :math:`(N_{own}, C)`
        - **output:** :math:`(N_{own}, C)`
    """

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        if not self._spans_ranks():
            return super().forward(x, batch, batch_size)
        total, n = self._sum_and_count(x.sum(0), x, batch, batch_size)
        out = x - (total / n) * self.mean_scale
        # Not centred unless mean_scale == 1: PyG's "variance" is the mean square of out.
        var = self._all_reduce(out.pow(2).sum(0)) / n
        return self.weight * out / (var + self.eps).sqrt() + self.bias


class DistributedPairNorm(_CrossNodeNorm, pyg_norm.PairNorm):
    r""":class:`~torch_geometric.nn.norm.PairNorm` over the nodes of all ranks.

    The centring mean always spans all ranks; with ``scale_individually=False`` so does
    the mean squared row norm (with ``True`` each row is scaled by its own norm).

    Args:
        x (torch.Tensor): The rank's node features.
        batch (torch.Tensor, optional): ``None`` or all zeros (one graph).
        batch_size (int, optional): ``None`` or 1.

    Shapes:
        - **input:** :math:`(N_{own}, C)`
        - **output:** :math:`(N_{own}, C)`
    """

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        if not self._spans_ranks():
            return super().forward(x, batch, batch_size)
        total, n = self._sum_and_count(x.sum(0), x, batch, batch_size)
        x = x - total / n
        if self.scale_individually:
            return self.scale * x / (self.eps + x.norm(2, -1, keepdim=True))
        # PyG: mean over nodes of the squared row norm (batch=None and one-graph batch alike).
        per_node = math.prod(x.shape[1:-1])
        mean_sq = self._all_reduce(x.pow(2).sum()) / (n * per_node)
        return self.scale * x / (self.eps + mean_sq).sqrt()


class DistributedLayerNorm(_CrossNodeNorm, pyg_norm.LayerNorm):
    r""":class:`~torch_geometric.nn.norm.LayerNorm` with ``mode="graph"`` over the nodes of
    all ranks: one mean and one variance over every entry of the graph.

    PyG divides by ``std + eps`` without a batch vector and by ``sqrt(var + eps)`` with one;
    both are reproduced.

    Args:
        x (torch.Tensor): The rank's node features.
        batch (torch.Tensor, optional): ``None`` or all zeros (one graph).
        batch_size (int, optional): ``None`` or 1.

    Shapes:
        - **input:** :math:`(N_{own}, C)`
        - **output:** :math:`(N_{own}, C)`
    """

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        if self.mode != "graph" or not self._spans_ranks():
            return super().forward(x, batch, batch_size)
        total, n = self._sum_and_count(x.sum().reshape(1), x, batch, batch_size)
        entries = n * math.prod(x.shape[1:])
        x = x - total / entries
        var = self._all_reduce(x.pow(2).sum().reshape(1)) / entries
        if batch is None:
            out = x / (var.sqrt() + self.eps)
        else:
            out = x / (var + self.eps).sqrt()
        if self.weight is not None and self.bias is not None:
            out = out * self.weight + self.bias
        return out


class DistributedInstanceNorm(_CrossNodeNorm, pyg_norm.InstanceNorm):
    r""":class:`~torch_geometric.nn.norm.InstanceNorm` over the nodes of all ranks.

    In training (or without running statistics) each channel is normalized with its mean
    and biased variance over all nodes; the running statistics (``track_running_stats``)
    move towards that mean and the unbiased variance, updated in place and identically on
    every rank.  In evaluation with running statistics the transform is per node.

    Args:
        x (torch.Tensor): The rank's node features.
        batch (torch.Tensor, optional): ``None`` or all zeros (one graph).
        batch_size (int, optional): ``None`` or 1.

    Shapes:
        - **input:** :math:`(N_{own}, C)`
        - **output:** :math:`(N_{own}, C)`
    """

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        if not self._spans_ranks():
            return super().forward(x, batch, batch_size)
        if not (self.training or not self.track_running_stats):
            # Running statistics: nothing crosses nodes (and F.instance_norm's eval path is
            # this formula; PyG's batch= path would need a local batch.max()).
            out = (x - self.running_mean) * torch.rsqrt(self.running_var + self.eps)
        else:
            total, n = self._sum_and_count(x.sum(0), x, batch, batch_size)
            mean = total / n
            x = x - mean
            sq = self._all_reduce(x.pow(2).sum(0))
            var = sq / n
            if self.running_mean is not None:
                # In place: the buffer is shared with the original module.
                with torch.no_grad():
                    unbiased = sq / (n - 1).clamp_min(1)
                    self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                    self.running_var.mul_(1 - self.momentum).add_(self.momentum * unbiased)
            out = x / (var + self.eps).sqrt()
        if self.weight is not None and self.bias is not None:
            out = out * self.weight.view(1, -1) + self.bias.view(1, -1)
        return out


class DistributedMeanSubtractionNorm(_CrossNodeNorm, pyg_norm.MeanSubtractionNorm):
    r""":class:`~torch_geometric.nn.norm.MeanSubtractionNorm`: subtracts the mean over the
    nodes of all ranks.

    Args:
        x (torch.Tensor): The rank's node features.
        batch (torch.Tensor, optional): ``None`` or all zeros (one graph).
        dim_size (int, optional): ``None`` or 1.

    Shapes:
        - **input:** :math:`(N_{own}, *)`
        - **output:** :math:`(N_{own}, *)`
    """

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tensor:
        if not self._spans_ranks():
            return super().forward(x, batch, dim_size)
        total, n = self._sum_and_count(x.sum(0), x, batch, dim_size)
        return x - total / n


class DistributedGraphSizeNorm(_CrossNodeNorm, pyg_norm.GraphSizeNorm):
    r""":class:`~torch_geometric.nn.norm.GraphSizeNorm`: divides by the square root of the
    number of nodes of the whole graph (all ranks).

    Args:
        x (torch.Tensor): The rank's node features.
        batch (torch.Tensor, optional): ``None`` or all zeros (one graph).
        batch_size (int, optional): ``None`` or 1.

    Shapes:
        - **input:** :math:`(N_{own}, C)`
        - **output:** :math:`(N_{own}, C)`
    """

    def forward(self, x: Tensor, batch: Optional[Tensor] = None,
                batch_size: Optional[int] = None) -> Tensor:
        if not self._spans_ranks():
            return super().forward(x, batch, batch_size)
        _, n = self._sum_and_count(x.new_zeros(0), x, batch, batch_size)
        return x * n.pow(-0.5)


#: PyG class -> distributed version (exact classes: a subclass may compute anything).
_DISTRIBUTED: Dict[Type[torch.nn.Module], Type[torch.nn.Module]] = {
    pyg_norm.GraphNorm: DistributedGraphNorm,
    pyg_norm.PairNorm: DistributedPairNorm,
    pyg_norm.LayerNorm: DistributedLayerNorm,
    pyg_norm.InstanceNorm: DistributedInstanceNorm,
    pyg_norm.MeanSubtractionNorm: DistributedMeanSubtractionNorm,
    pyg_norm.GraphSizeNorm: DistributedGraphSizeNorm,
}

#: PyG normalizations whose statistics span nodes, all made exact by
#: :func:`convert_cross_node_norms` (``LayerNorm`` only matters in ``mode="graph"``).
CROSS_NODE_NORMS: Tuple[Type[torch.nn.Module], ...] = tuple(_DISTRIBUTED) + (
    pyg_norm.DiffGroupNorm, )


def unreproduced_norm(module: torch.nn.Module) -> Optional[str]:
    r"""Why :obj:`module`, a cross-node normalization, cannot be made exact, or ``None``.

    Only PyG's own classes are reproduced: a subclass may change what the forward
    computes, which no distributed version can know.
    """
    if not isinstance(module, CROSS_NODE_NORMS) or isinstance(module, _CrossNodeNorm):
        return None
    if isinstance(module, pyg_norm.LayerNorm) and module.mode != "graph":
        return None  # per node: nothing crosses ranks
    if type(module) in CROSS_NODE_NORMS:
        return None
    base = next(c for c in CROSS_NODE_NORMS if isinstance(module, c))
    return (f"subclasses {base.__name__}, which normalizes across nodes; only PyG's own "
            f"{base.__name__} is reproduced across ranks (its statistics are all-reduced), "
            "so use it or normalize per node")


def _distributed_copy(cls: Type[torch.nn.Module], old: torch.nn.Module, group: Optional[Any],
                      where: str) -> torch.nn.Module:
    # Same instance dictionary contents: the very same _parameters/_buffers/_modules and hook
    # dicts, so parameters, buffers (also if reassigned), hooks and state-dict keys are
    # shared with the original, which comes back unchanged on revert.
    new = cls.__new__(cls)
    new.__dict__.update(old.__dict__)
    new.__dict__["group"] = group
    new.__dict__["where"] = where
    return new


def convert_cross_node_norms(module: torch.nn.Module,
                             group: Optional[Any] = None) -> List[Swap]:
    r"""Makes every cross-node normalization below :obj:`module` exact on partitions.

    PyG's ``GraphNorm``, ``PairNorm``, ``LayerNorm(mode="graph")``, ``InstanceNorm``,
    ``MeanSubtractionNorm`` and ``GraphSizeNorm`` are replaced by their distributed
    versions (sharing parameters and buffers); the ``BatchNorm1d`` inside each
    ``DiffGroupNorm`` is synchronized (whether or not other BatchNorms are).

    Args:
        module (torch.nn.Module): The model (any nesting).
        group (ProcessGroup, optional): Ranks that hold the other nodes.

    Returns:
        The swaps made, to hand to :func:`revert_cross_node_norms`.
    """
    swaps: List[Swap] = []
    for prefix, parent in list(module.named_modules()):
        for name, child in list(parent.named_children()):
            where = f"{prefix}.{name}" if prefix else name
            if type(child) is pyg_norm.DiffGroupNorm:
                swaps += convert_batchnorm(child, group)
                continue
            cls = _DISTRIBUTED.get(type(child))
            if cls is None or (cls is DistributedLayerNorm and child.mode != "graph"):
                continue
            setattr(parent, name, _distributed_copy(cls, child, group, where))
            swaps.append((parent, name, child))
    return swaps


def revert_cross_node_norms(swaps: List[Swap]) -> None:
    r"""Puts back the modules replaced by :func:`convert_cross_node_norms`."""
    for parent, name, original in reversed(swaps):
        current = getattr(parent, name)
        if isinstance(current, DistributedBatchNorm):
            revert_batchnorm([(parent, name, original)])
        else:
            original.training = current.training  # the only state not shared
            setattr(parent, name, original)
