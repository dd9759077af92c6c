r"""``GCNConv`` on an unchanged input: aggregate first, transform after.

``GCNConv`` computes :math:`\hat{A}(XW)`: its exchange carries the transformed rows, which
change every step, so nothing can be reused even when :math:`X` (e.g. the raw features) is
the same tensor every step.  :math:`\hat{A}(XW) = (\hat{A}X)W` (the layer's linear map has no
bias; the bias is added after aggregation), so when the input is unchanged since the previous
call the engine runs the layer as ``lin(propagate(x)) + bias``: the aggregation of :math:`X`
is then a static aggregation (:mod:`.static`) -- exchanged and computed once, reused by every
later step.  The result equals the layer's own within floating-point reassociation.

Which order runs changes the width of the exchanged rows, so it is agreed by all ranks: the
point's eligibility once (an input without gradient), then on every eligible call whether every
rank sees the same input as last time -- or, from the first call, the features the rank loaded
(:meth:`.StaticInputs.mark_loaded`, unmodified).  Input dropout makes a new tensor every step:
the layer then runs in its own order (aggregating :math:`XW` is the cheaper one then).  So it
does under autocast, where the two orders round at different places.
"""
import weakref
from typing import Any, Callable, Collection, Optional

import torch
from torch import Tensor
from torch_geometric.nn.conv import GCNConv, gcn_conv

from .. import compat
from ..compat import has_forward_hooks
from .agreement import Agreement
from .context import current_layer
from ..memo import anchor, signature
from .static import StaticInputs

__all__ = ["reorderable", "reordered_forward"]


def reorderable(layer: Any) -> bool:
    r"""Whether :obj:`layer` is a ``GCNConv`` whose forward is PyG's own (not a subclass that
    changes it) with a bias-free linear map."""
    return (isinstance(layer, GCNConv) and type(layer).forward is GCNConv.forward
            and getattr(layer.lin, "bias", None) is None)


class _LastInput:
    r"""The last input of a phase, referred to weakly (a freed input is not the same input:
    the cache's entries follow the same rule)."""

    def __init__(self) -> None:
        self.tensor: Optional[weakref.ref] = None
        self.signature: Optional[tuple] = None

    def same(self, x: Tensor) -> bool:
        return self.tensor is not None and self.tensor() is not None \
            and signature(x) == self.signature

    def remember(self, x: Tensor) -> None:
        self.tensor, self.signature = weakref.ref(anchor(x)), signature(x)


def _add_bias(layer: GCNConv, out: Tensor) -> Tensor:
    r"""``out + layer.bias``, in place when :obj:`out` is the linear map's own fresh output
    (no forward hook of the map could hold it, and the sum keeps its dtype): one
    :math:`[N, F_{out}]` temporary less, the largest of the layer after its aggregation is
    cached.  The linear map's backward keeps its inputs, not its output."""
    if has_forward_hooks(layer.lin) or out._base is not None \
            or out.dtype != torch.result_type(out, layer.bias):
        return out + layer.bias
    return out.add_(layer.bias)


def reordered_forward(layer: GCNConv, key: str, original: Callable, static: StaticInputs,
                      agreement: Agreement,
                      own_hooks: Callable[[], Collection[int]] = tuple) -> Callable:
    r"""A ``forward`` for :obj:`layer` that aggregates an unchanged input before transforming
    it (see the module docstring); otherwise calls :obj:`original`."""
    last = {"train": _LastInput(), "eval": _LastInput()}

    def forward(x: Tensor, edge_index: Any, edge_weight: Optional[Tensor] = None) -> Tensor:
        if not static.enabled or not isinstance(x, Tensor) or not isinstance(edge_index, Tensor) \
                or not layer.normalize:
            return original(x, edge_index, edge_weight)
        phase = "train" if layer.training else "eval"
        point = f"{key}.reorder.{phase}"
        # Something that sees the rows aggregated (a user's message hook, explain mode,
        # decomposed_layers) would see X instead of XW: PyG's order then.
        observed = compat.rows_observed(layer, own_hooks())
        if not agreement.decide(point, not x.requires_grad and not observed) \
                or static.gave_up(point):
            return original(x, edge_index, edge_weight)
        seen = last[phase]
        # The other phase's input counts too (the phases share aggregations): the first
        # validation after training steps then reuses their aggregate at once.  The rank's
        # own loaded features count from the first call: they are the same every step, and
        # aggregating them first already in step one means the step computes one aggregate
        # of them (kept), not A(XW) and then, in the next call, AX as well.
        same = not x.requires_grad and (
            seen.same(x) or last["eval" if phase == "train" else "train"].same(x)
            or static.is_loaded(x))
        # Under autocast the linear map rounds its output to 16 bits: (AX)W would round
        # after aggregating and A(XW) rounds before, so the results differ by about as
        # much as mixed precision changes them.  The layer then keeps its own order (one
        # process's result); a rank under autocast votes against, so all ranks agree.
        same = same and not torch.is_autocast_enabled(x.device.type)
        # An observer added since the point was agreed votes against here, in the agreement
        # every rank joins on every call, not by leaving it: a rank that alone skipped it
        # would send rows of another width than its peers expect.
        same = same and not observed
        if not x.requires_grad:
            seen.remember(x)
        if not static.agreed_reuse(point, same):
            return original(x, edge_index, edge_weight)
        edge_index, edge_weight = compat.gcn_norm_router()(  # the engine's dispatcher (cached)
            edge_index, edge_weight, x.size(layer.node_dim), layer.improved,
            layer.add_self_loops, layer.flow, x.dtype)
        active = current_layer()
        if active is not None:
            active.variant = ".reordered"  # its own static-cache point
        try:
            aggregated = layer.propagate(edge_index, x=x, edge_weight=edge_weight)
        finally:
            if active is not None:
                active.variant = ""
        out = layer.lin(aggregated)
        if layer.bias is not None:
            out = _add_bias(layer, out)
        return out

    return torch.compiler.disable(forward)
