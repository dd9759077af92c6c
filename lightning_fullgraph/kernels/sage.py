r"""``SAGEConv``'s two linear maps as one accumulating product.

PyG's ``SAGEConv`` computes ``lin_l(aggregate(x)) + lin_r(x_r)``: two products, each writing
an :math:`N \times F_{out}` tensor, then an add reading both and writing a third.  With the
kernels on, the layer's forward runs ``lin_l(aggregate(x)).addmm_(x_r, W_r^T)`` instead: the
second product accumulates into the first one's fresh output (BLAS with :math:`\beta = 1`),
equal within floating-point reassociation -- one :math:`N \times F_{out}` tensor and one pass
over it fewer, forward and backward alike (``python -m benchmarks sage_fusion`` times both).

A narrowing layer (:math:`F_{out} < F_{in}`) with sum or mean aggregation maps its rows before
aggregating them (:mod:`.sage_reorder`).

In a distributed layer whose halo exchange overlaps (:mod:`.split`), the root term
``x_r @ W_r^T`` is computed while the halo is in flight instead, and added to ``lin_l``'s
output as PyG adds it (its backward then runs while the halo's gradients travel back), and
``lin_l``'s weight gradient is computed while they travel too (:mod:`.deferred_weight`),
unless a hook would see ``lin_l`` called.

The layer's own forward runs instead whenever that could differ from what PyG does: a
subclass with its own forward, ``root_weight=False``, a biased or replaced ``lin_r``, hooks
that would see ``lin_r`` called (its own, or global ones), autocast (which casts each product
itself), and inputs that are not dense matrices of ``lin_r``'s dtype and device.  The product
accumulates out of place when a forward hook of ``lin_l`` may hold its output.
"""
from typing import Any, Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import compat
from . import sage_reorder, split
from .deferred_weight import DeferredWeightGrad

__all__ = ["fusable", "fused_forward"]


def fusable(layer: Any) -> bool:
    r"""Whether :obj:`layer` is a ``SAGEConv`` running PyG's own forward whose root term is a
    bias-free PyG ``Linear`` (checked again per call for what can change)."""
    from torch_geometric.nn.conv import SAGEConv
    from torch_geometric.nn.dense.linear import Linear
    return (isinstance(layer, SAGEConv) and type(layer).forward is SAGEConv.forward
            and bool(layer.root_weight) and type(getattr(layer, "lin_l", None)) is Linear
            and type(getattr(layer, "lin_r", None)) is Linear and layer.lin_r.bias is None)


def _root(layer: Any, x: Any, ignore: Tuple[Callable, ...]) -> Optional[Tensor]:
    r"""The root input ``x_r`` when this call can be fused, else :obj:`None`."""
    x_r = x if isinstance(x, Tensor) else (x[1] if isinstance(x, tuple) and len(x) == 2
                                           else None)
    w = layer.lin_r.weight
    if (not isinstance(x_r, Tensor) or x_r.dim() != 2 or x_r.layout != torch.strided
            or isinstance(w, torch.nn.parameter.UninitializedTensorMixin)
            or x_r.dtype != w.dtype or x_r.device != w.device
            or not layer.root_weight or layer.lin_r.bias is not None
            or torch.is_autocast_enabled(x_r.device.type)
            or compat.call_is_observed(layer.lin_r, ignore)):
        return None
    return x_r


def _deferred_weight_grad(lin: Any, ignore: Tuple[Callable, ...]) -> Optional[DeferredWeightGrad]:
    r"""A request that a split aggregation's map defer its weight gradient, where the map's
    weight is a parameter that needs one and nothing would see the map called."""
    w = getattr(lin, "weight", None)
    if (not torch.is_grad_enabled() or not isinstance(w, torch.nn.Parameter)
            or isinstance(w, torch.nn.parameter.UninitializedTensorMixin)
            or not w.requires_grad or w.dim() != 2 or compat.call_is_observed(lin, ignore)):
        return None
    return DeferredWeightGrad(w)


def fused_forward(layer: Any, original: Callable, ignore: Tuple[Callable, ...] = ()) -> Callable:
    r"""A ``forward`` for :obj:`layer` (:func:`fusable`) that adds the root term with one
    accumulating product; otherwise it calls :obj:`original`.

    Args:
        layer (SAGEConv): The layer.
        original (Callable): Its forward as it was.
        ignore (Tuple[Callable, ...]): Global hooks that may be skipped when ``lin_r`` is not
            called (the kernels' own module pre-hook, which only acts on message passing).
    """

    def forward(x: Any, edge_index: Any, size: Any = None) -> Tensor:
        x_r = _root(layer, x, ignore)
        if x_r is None:
            return original(x, edge_index, size)
        xs = (x, x) if isinstance(x, Tensor) else x
        if layer.project and hasattr(layer, "lin"):  # as PyG does
            xs = (layer.lin(xs[0]).relu(), xs[1])
        w = layer.lin_r.weight
        # The root term needs no halo rows: a distributed layer whose exchange overlaps
        # computes it while the halo is in flight (.split), PyG's own product and sum.
        root = split.InFlight(lambda: torch.mm(x_r, w.t()))
        with split.while_in_flight(root):
            out = sage_reorder.mapped_first(layer, xs, edge_index, size, ignore)
            if out is None:  # PyG's order: aggregate, then map
                deferred = _deferred_weight_grad(layer.lin_l, ignore)
                with split.deferring(deferred):
                    agg = layer.propagate(edge_index, x=xs, size=size)
                # None where no split aggregation started it (or agg is not its input).
                out = deferred.linear(agg, layer.lin_l.bias) if deferred is not None else None
                if out is None:
                    out = layer.lin_l(agg)
        if root.ran:
            fresh = (out.shape == root.result.shape and out.dtype == root.result.dtype
                     and out._base is None and out.is_contiguous()
                     and not compat.has_forward_hooks(layer.lin_l))
            out = out.add_(root.result) if fresh else out + root.result
        elif out.shape != (x_r.size(0), w.size(0)) or out.dtype != w.dtype:
            out = out + layer.lin_r(x_r)  # PyG's own sum (and its errors)
        elif out._base is None and out.is_contiguous() and not compat.has_forward_hooks(
                layer.lin_l):
            out = out.addmm_(x_r, w.t())  # lin_l's fresh output; its backward keeps inputs
        else:
            out = torch.addmm(out, x_r, w.t())
        if layer.normalize:
            out = F.normalize(out, p=2., dim=-1)
        return out

    forward.__wrapped__ = original
    return forward
