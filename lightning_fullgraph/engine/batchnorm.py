"""Batch normalization over nodes spread across ranks.

Single-process BatchNorm normalizes with the mean and variance over *all* nodes.
When each rank holds only its own nodes those statistics need two all-reduces
(sum and count, then the centred sum of squares: the two-pass form keeps fp32
close to the single-process result).  ``torch.nn.SyncBatchNorm`` does this on
GPUs only, so this module does it with autograd-aware collectives on any device.

:func:`convert_batchnorm` swaps every ``BatchNorm1d`` for a
:class:`DistributedBatchNorm` that shares its parameters and buffers (state-dict
keys and optimizer state are untouched); :func:`revert_batchnorm` swaps back.

The running statistics move as one process moves them (``tests/engine/test_batchnorm_*.py``;
after training steps ``tests/engine/test_models.py`` and ``test_exactness.py``).  One effect is
not the engine's and shows between any two fp32 runs: a bias right before a BatchNorm (the
conv's bias in PyG's ``GraphSAGE(..., norm=BatchNorm1d(...))``) has a mathematically zero
gradient, computed as rounding noise whose sign depends on the summation order.  Adam divides
each coordinate by its own magnitude and so moves that bias by whole learning rates; the
running mean follows the bias, so ``running_mean`` and eval-mode outputs drift apart while
train-mode outputs, invariant to that bias, agree (on Cora, 15 % of ``running_mean`` after 5
steps between two ranks and one process -- and between one process and itself with its nodes
in another order).  In float64, with a step proportional to the gradient (SGD), or without
that bias, partitioned training keeps the single-process statistics.
"""
from typing import Any, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from .errors import guarded

__all__ = ["DistributedBatchNorm", "convert_batchnorm", "revert_batchnorm"]


class DistributedBatchNorm(_BatchNorm):
    r"""BatchNorm whose batch statistics cover the nodes of every rank.

    Args:
        num_features (int): Channels :math:`C`; input :math:`[N, C]` or :math:`[N, C, L]`.
        group (ProcessGroup, optional): Ranks that hold the other nodes.

    Other arguments as :class:`torch.nn.BatchNorm1d`.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 group: Optional[Any] = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.group = group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() not in (2, 3):
            raise ValueError(f"expected 2D or 3D input (got {input.dim()}D input)")

    # Excluded from torch.compile tracing: an eager collective, one graph break.
    @torch.compiler.disable
    def _all_reduce(self, t: Tensor) -> Tensor:
        if not dist.is_initialized() or dist.get_world_size(self.group) == 1:
            return t
        return _AllReduceSum.apply(t, self.group)

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps)

        # Channels last: [M, C] with M = N (2D) or N * L (3D).
        flat = input.transpose(1, -1).reshape(-1, self.num_features) if input.dim() == 3 \
            else input
        count = torch.tensor([float(flat.size(0))], dtype=flat.dtype, device=flat.device)
        total = self._all_reduce(torch.cat([flat.sum(0), count]))
        n = total[-1]
        mean = total[:-1] / n
        centred = flat - mean
        var = self._all_reduce(centred.pow(2).sum(0)) / n

        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked)) if self.momentum is None \
                else self.momentum
            with torch.no_grad():
                unbiased = var * (n / (n - 1)).clamp_min(0) if float(n) > 1 else var
                self.running_mean.mul_(1 - factor).add_(factor * mean.detach())
                self.running_var.mul_(1 - factor).add_(factor * unbiased.detach())

        out = centred * torch.rsqrt(var + self.eps)
        if self.affine:
            out = out * self.weight + self.bias
        if input.dim() == 3:  # (the channel count, not -1: a rank may hold no node)
            out = out.reshape(input.size(0), input.size(2), self.num_features)
            out = out.transpose(1, -1)
        return out


class _AllReduceSum(torch.autograd.Function):
    r"""Sum over ranks; its gradient is the sum over ranks of the upstream gradients."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        ctx.group = group
        return _reduce(t.clone(), group, "forward")

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _reduce(grad.contiguous().clone(), ctx.group, "backward"), None


def _reduce(t: Tensor, group, direction: str) -> Tensor:
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    with guarded(f"BatchNorm statistics all-reduce ({direction})", rank,
                 [r for r in range(world) if r != rank]):
        dist.all_reduce(t, group=group)
    return t


def _swap(parent: torch.nn.Module, name: str, new: torch.nn.Module, old: torch.nn.Module) -> None:
    # Share parameters and buffers by reference: checkpoints and optimizers see no change.
    for attr in ("weight", "bias"):
        setattr(new, attr, getattr(old, attr))
    for attr in ("running_mean", "running_var", "num_batches_tracked"):
        new._buffers[attr] = old._buffers.get(attr)
    new.train(old.training)
    setattr(parent, name, new)


def convert_batchnorm(module: torch.nn.Module,
                      group: Optional[Any] = None) -> List[Tuple[torch.nn.Module, str, torch.nn.Module]]:
    r"""Replaces every ``BatchNorm1d`` below :obj:`module` by a :class:`DistributedBatchNorm`.

    Returns:
        The swaps made, to hand to :func:`revert_batchnorm`.
    """
    swaps = []
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.BatchNorm1d:
                new = DistributedBatchNorm(child.num_features, child.eps, child.momentum,
                                           child.affine, child.track_running_stats, group)
                _swap(parent, name, new, child)
                swaps.append((parent, name, child))
            elif isinstance(child, _BatchNorm) and not isinstance(child, DistributedBatchNorm):
                raise ValueError(
                    f"'{name}' ({type(child).__name__}) normalizes over nodes and has no "
                    "partitioned version; use BatchNorm1d")
    return swaps


def revert_batchnorm(swaps: List[Tuple[torch.nn.Module, str, torch.nn.Module]]) -> None:
    r"""Puts back the modules replaced by :func:`convert_batchnorm` (parameters kept)."""
    for parent, name, original in reversed(swaps):
        _swap(parent, name, original, getattr(parent, name))
