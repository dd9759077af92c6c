r"""The weight gradient of the map after a split aggregation, computed while the halo's
gradients travel back.

``SAGEConv`` maps its aggregation, ``lin_l(agg) = agg @ W^T + b``.  Its backward has two dense
products: the input's gradient ``grad @ W``, which the aggregation's backward and so the halo
gradients' transfer need, and the weight's ``grad^T @ agg``, which nothing in the exchange
needs.  As one autograd node both run before the transfer starts, so the weight's product
lengthens the time the link waits for its bytes.  Here the map is one node that computes the
input's gradient alone (:class:`_MapInput`), and the weight's gradient comes from another
(:class:`_WeightSink`) created while the halo was in flight (:func:`~.split.deferring`, after
the owned part's aggregation and the root term, before the halo's receive).  The autograd
engine runs nodes created later first, so the sink runs after the halo gradients' transfer has
started, beside the owned part's backward and the root term's, as the overlap's other work
does (:mod:`.split`).

The products are PyTorch's own for ``F.linear``'s backward (``grad @ W``, ``grad^T @ agg``,
``grad.sum(0)`` for the bias), so the gradients are those of ``lin_l(agg)``.  Where a second
backward differentiates them (``create_graph=True``), both nodes compute them with autograd
recording, from the saved aggregation and the parameter itself.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["DeferredWeightGrad"]


class DeferredWeightGrad:
    r"""``agg @ W^T + b`` whose ``W`` gradient is computed after the halo gradients leave.

    Args:
        weight (torch.nn.Parameter): :math:`[F_{out}, F_{in}]`, the map's weight.
    """

    __slots__ = ("weight", "token", "grad", "agg")

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.token: Optional[Tensor] = None  # the sink's output, made while the halo flies
        self.grad: Optional[Tensor] = None  # handed from the map's backward to the sink's
        self.agg: Optional[Tensor] = None

    @property
    def started(self) -> bool:
        r"""Whether :meth:`start` ran (a split aggregation took the request)."""
        return self.token is not None

    def start(self) -> None:
        r"""Creates the weight gradient's node: called while the halo is in flight, before
        the node that receives it is created."""
        self.token = _WeightSink.apply(self.weight, self)

    def linear(self, agg: Tensor, bias: Optional[Tensor]) -> Optional[Tensor]:
        r"""``agg @ W^T + b``, or ``None`` where :meth:`start` did not run (no split
        aggregation took the request) or :obj:`agg` is not a matrix the weight maps (the
        caller then calls the layer's map itself)."""
        w = self.weight
        if (self.token is None or agg.dim() != 2 or agg.size(1) != w.size(1)
                or agg.dtype != w.dtype or agg.device != w.device):
            return None
        return _MapInput.apply(agg, w, bias, self.token, self)


class _WeightSink(torch.autograd.Function):
    r"""Weight -> a scalar token the map consumes; backward: the weight's gradient from what
    the map's backward handed over."""

    @staticmethod
    def forward(ctx, weight: Tensor, deferred: DeferredWeightGrad) -> Tensor:
        ctx.deferred = deferred
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx, _unused: Tensor):
        deferred: DeferredWeightGrad = ctx.deferred
        grad, agg = deferred.grad, deferred.agg
        deferred.grad = deferred.agg = None
        return grad.t().mm(agg), None


class _MapInput(torch.autograd.Function):
    r"""``agg @ W^T + b``; backward: the input's and the bias's gradients, the weight's handed
    to :class:`_WeightSink` (through the token)."""

    @staticmethod
    def forward(ctx, agg: Tensor, weight: Tensor, bias: Optional[Tensor], token: Tensor,
                deferred: DeferredWeightGrad) -> Tensor:
        ctx.save_for_backward(agg, weight)
        ctx.deferred = deferred
        ctx.bias = bias is not None
        return F.linear(agg, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor):
        agg, weight = ctx.saved_tensors
        ctx.deferred.grad, ctx.deferred.agg = grad, agg
        grad_agg = grad.mm(weight) if ctx.needs_input_grad[0] else None
        grad_bias = grad.sum(0) if ctx.bias and ctx.needs_input_grad[2] else None
        # The weight's gradient is the sink's; the token's is nothing.
        return grad_agg, None, grad_bias, grad.new_zeros(()), None
