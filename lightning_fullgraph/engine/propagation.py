"""Label propagation and Correct & Smooth across ranks.

PyG's ``LabelPropagation`` and ``CorrectAndSmooth`` (``torch_geometric.nn.models``) post-process
predictions over the whole graph.  Their propagation is message passing over in-edges (with
``gcn_norm``), which the engine makes exact like any layer; two quantities are global and
are fixed here, on the instance, while the model is partitioned:

* ``LabelPropagation`` one-hot encodes integer labels with as many classes as the largest
  label it sees: each rank would size it by its own labels (and exchange rows of different
  widths).  The number of classes is all-reduced (max) first.
* ``CorrectAndSmooth.correct`` (``autoscale=True``) scales the propagated error by the mean
  absolute error over *all* training nodes: its sum and count are all-reduced.
"""
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn.models import CorrectAndSmooth, LabelPropagation
from torch_geometric.utils import one_hot

from .errors import guarded

__all__ = ["wrap_label_propagation", "unwrap_label_propagation"]


@torch.compiler.disable
def _all_reduce(values: Tensor, group: Any, op: Any, what: str, timeout: Any) -> Tensor:
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return values
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    with guarded(what, rank, [r for r in range(world) if r != rank], timeout):
        dist.all_reduce(values, op=op, group=group)
    return values


def _labels_forward(layer: LabelPropagation, key: str, group: Any, timeout: Any) -> Callable:
    inner = layer.forward

    def forward(y: Tensor, edge_index: Any, mask: Optional[Tensor] = None,
                edge_weight: Optional[Tensor] = None, post_step: Optional[Callable] = None):
        if y.dtype == torch.long and y.size(0) == y.numel():
            largest = torch.tensor([int(y.max()) if y.numel() else -1], dtype=torch.long)
            classes = _all_reduce(largest, group, dist.ReduceOp.MAX,
                                  f"'{key}' (LabelPropagation) number of classes", timeout)
            y = one_hot(y.view(-1), num_classes=int(classes) + 1)
        return inner(y, edge_index, mask=mask, edge_weight=edge_weight, post_step=post_step)

    return forward


def _correct(module: CorrectAndSmooth, key: str, group: Any, timeout: Any) -> Callable:
    inner = module.correct

    def correct(y_soft: Tensor, y_true: Tensor, mask: Tensor, edge_index: Any,
                edge_weight: Optional[Tensor] = None) -> Tensor:
        if not module.autoscale:  # nothing global: the error is fixed at training nodes
            return inner(y_soft, y_true, mask, edge_index, edge_weight)
        # As CorrectAndSmooth.correct, with sigma over the training nodes of every rank.
        numel = int(mask.sum()) if mask.dtype == torch.bool else mask.size(0)
        if y_true.size(0) != numel:
            raise ValueError(f"'{key}' (CorrectAndSmooth): y_true has {y_true.size(0)} rows "
                             f"but the rank's mask selects {numel} nodes")
        if y_true.dtype == torch.long and y_true.size(0) == y_true.numel():
            y_true = one_hot(y_true.view(-1), num_classes=y_soft.size(-1), dtype=y_soft.dtype)
        error = torch.zeros_like(y_soft)
        error[mask] = y_true - y_soft[mask]
        smoothed_error = module.prop1(error, edge_index, edge_weight=edge_weight,
                                      post_step=lambda x: x.clamp_(-1., 1.))
        totals = torch.stack([error[mask].abs().sum().double(),
                              torch.tensor(float(numel), dtype=torch.float64)])
        totals = _all_reduce(totals, group, dist.ReduceOp.SUM,
                             f"'{key}' (CorrectAndSmooth) mean training error", timeout)
        sigma = (totals[0] / totals[1]).to(y_soft.dtype)
        scale = sigma / smoothed_error.abs().sum(dim=1, keepdim=True)
        scale[scale.isinf() | (scale > 1000)] = 1.0
        return y_soft + scale * smoothed_error

    return correct


def wrap_label_propagation(model: torch.nn.Module, group: Any,
                           timeout: Any = None) -> List[Tuple[Any, str, Any, Callable]]:
    r"""Installs the global versions on every ``LabelPropagation`` (``forward``) and
    ``CorrectAndSmooth`` (``correct``) of :obj:`model`.

    Returns:
        What :func:`unwrap_label_propagation` needs to undo it.
    """
    done = []
    for name, module in model.named_modules():
        key = name or type(module).__name__
        if isinstance(module, LabelPropagation):
            attr, ours = "forward", _labels_forward(module, key, group, timeout)
        elif isinstance(module, CorrectAndSmooth):
            attr, ours = "correct", _correct(module, key, group, timeout)
        else:
            continue
        done.append((module, attr, module.__dict__.get(attr), ours))
        module.__dict__[attr] = ours
    return done


def unwrap_label_propagation(done: List[Tuple[Any, str, Any, Callable]]) -> None:
    r"""Undoes :func:`wrap_label_propagation`."""
    for module, attr, had_own, ours in reversed(done):
        if module.__dict__.get(attr) is not ours:
            continue
        if had_own is None:
            del module.__dict__[attr]
        else:
            module.__dict__[attr] = had_own
    done.clear()
