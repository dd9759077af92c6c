r"""PyG's normalization layers on a block of features split over a 3-D grid.

Between two GCN layers the features are in layout ``(T, R)``: rows split over axis ``T``,
channels over axis ``R``, replicated along the third axis (see :mod:`.pmm`).  A normalization
needs statistics over rows, channels or both, so each is computed as a differentiable sum over
the axes that split them (:func:`~.pmm.all_reduce_sum`: every process uses the sum for its own
rows or channels, so the gradient is summed back too), in two passes (mean, then the squared
deviations) like PyTorch's own kernels, so the result equals the single-process layer to fp32
rounding:

=================================================  ======================  =================
layer                                              statistics over         summed over
=================================================  ======================  =================
:class:`~torch_geometric.nn.norm.BatchNorm`        rows, per channel       ``T``
:class:`~torch_geometric.nn.norm.LayerNorm`        channels, per row       ``R``
(``mode="node"``)
:class:`~torch_geometric.nn.norm.LayerNorm`        every row and channel   ``T`` and ``R``
(``mode="graph"``)
=================================================  ======================  =================

BatchNorm's running statistics are updated with the batch's global statistics (identical on
every process of a replica) and then averaged over the data-parallel replicas, so that all
processes evaluate with the same statistics (one more small all-reduce per layer and step).
"""
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor

from .pmm import all_reduce_sum, summed

__all__ = ["SPLITTABLE_NORMS", "norm_kind", "split_norm"]

#: PyG normalization classes :func:`split_norm` reproduces (by class name, for messages).
SPLITTABLE_NORMS = ("BatchNorm", "LayerNorm(mode='node')", "LayerNorm(mode='graph')",
                    "Identity")


def norm_kind(norm: torch.nn.Module) -> Optional[str]:
    r"""``"batch"``, ``"layer_node"``, ``"layer_graph"`` or ``"identity"`` for a layer
    :func:`split_norm` can split, ``None`` otherwise."""
    from torch_geometric.nn.norm import BatchNorm, LayerNorm
    if isinstance(norm, torch.nn.Identity):
        return "identity"
    if type(norm) is BatchNorm:
        return "batch"
    if type(norm) is LayerNorm and norm.mode in ("node", "graph"):
        return "layer_" + norm.mode
    return None


def _mean(x: Tensor, dim: Optional[int], groups: Tuple[object, ...], count: float) -> Tensor:
    s = x.sum() if dim is None else x.sum(dim, keepdim=True)
    for group in groups:
        s = all_reduce_sum(s, group)
    return s / count


def split_norm(kind: str, x: Tensor, norm: torch.nn.Module, weight: Optional[Tensor],
               bias: Optional[Tensor], group: Callable[[str], object], t: str, r: str,
               num_rows: int, num_channels: int, training: bool,
               running: Optional[Tuple[Tensor, Tensor, Tensor]] = None) -> Tensor:
    r"""Applies the normalization :obj:`norm` (of kind :func:`norm_kind`) to this process's
    block :obj:`x` in layout ``(t, r)`` of a :obj:`num_rows` × :obj:`num_channels` matrix.

    Args:
        kind (str): From :func:`norm_kind`.
        x (Tensor): The block.
        norm (torch.nn.Module): The single-process layer (its ``eps``, ``momentum``, ...;
            its own parameters and buffers are not used).
        weight (Tensor, optional): This block's channels of the affine weight.
        bias (Tensor, optional): This block's channels of the affine bias.
        group (Callable): Axis name (and ``"dp"``) to process group.
        t (str): The axis splitting the rows.
        r (str): The axis splitting the channels.
        num_rows (int): Rows of the whole matrix (the batch).
        num_channels (int): Channels of the whole matrix.
        training (bool): Batch statistics (and running-statistics update) or running ones.
        running (tuple, optional): BatchNorm's running mean and variance blocks (this
            block's channels) and its batch counter, updated in place when training.

    Shapes:
        - **x:** :math:`(N_t, C_r)`, the block; **output:** the same.
    """
    if kind == "identity":
        return x
    if kind == "batch":
        bn = norm.module
        if training or running is None:
            mean = _mean(x, 0, (group(t), ), num_rows)
            dev = x - mean
            var = _mean(dev * dev, 0, (group(t), ), num_rows)
            if training and running is not None:
                _update_running(bn.momentum, running, mean.detach().squeeze(0),
                                var.detach().squeeze(0), num_rows, group("dp"))
            out = dev * torch.rsqrt(var + bn.eps)
        else:
            out = (x - running[0]) * torch.rsqrt(running[1] + bn.eps)
    elif kind == "layer_node":
        mean = _mean(x, -1, (group(r), ), num_channels)
        dev = x - mean
        out = dev * torch.rsqrt(_mean(dev * dev, -1, (group(r), ), num_channels) + norm.eps)
    elif kind == "layer_graph":
        count = num_rows * num_channels
        dev = x - _mean(x, None, (group(t), group(r)), count)
        std = _mean(dev * dev, None, (group(t), group(r)), count).sqrt()
        out = dev / (std + norm.eps)
    else:
        raise ValueError(f"unknown normalization kind {kind!r}")
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


@torch.no_grad()
def _update_running(momentum: Optional[float], running: Tuple[Tensor, Tensor, Tensor],
                    mean: Tensor, var: Tensor, n: int, dp_group: object) -> None:
    # As torch's BatchNorm: the running variance is unbiased; momentum None is a cumulative
    # average.  The replicas' updates are averaged so that every process keeps the same.
    running_mean, running_var, tracked = running
    tracked.add_(1)
    factor = momentum if momentum is not None else 1.0 / float(tracked)
    unbiased = var * (n / max(n - 1, 1))
    new_mean = (1 - factor) * running_mean + factor * mean
    new_var = (1 - factor) * running_var + factor * unbiased
    replicas = 1
    if dp_group is not None:
        import torch.distributed as dist
        replicas = dist.get_world_size(dp_group) if dist.is_initialized() else 1
    if replicas > 1:
        both = summed(torch.cat([new_mean, new_var]), dp_group) / replicas
        new_mean, new_var = both[:mean.numel()], both[mean.numel():]
    running_mean.copy_(new_mean)
    running_var.copy_(new_var)
