r"""``GCNConv`` on an input without gradient: aggregate first, transform after.

``GCNConv`` computes :math:`\hat{A}(XW)` (PyG: the linear map, then ``propagate``). When
:math:`X` needs no gradient (the raw features a model's first layer reads) that order costs two
aggregations per training step: :math:`\hat{A}(XW)` forward, and :math:`\hat{A}^\top G` backward,
for :math:`W`'s gradient. :math:`\hat{A}(XW) = (\hat{A}X)W` (the layer's linear map has no bias;
the bias is added after), and in that order the step costs one aggregation, of :math:`X`, and
none backward: :math:`W`'s gradient is :math:`(\hat{A}X)^\top G`. While :math:`X` is the same
tensor, unmodified, over the same normalized graph (:mod:`.gcn`'s memo hands out the same
tensors), :math:`\hat{A}X` is kept (:mod:`.kept`) and later calls cost the linear map only. The
distributed engine does the same for a partitioned ``GCNConv``
(:mod:`lightning_fullgraph.engine.reorder`); this is the one-process version, under :func:`~.use`
or :func:`~.accelerate`.

Which order runs, per call, for an input whose aggregation may be kept (:func:`.kept.eligible`):

* aggregate first when :math:`\hat{A}X` is kept;
* else when that is not dearer: :math:`F_{in} \le 2 F_{out}` when the step computes :math:`W`'s
  gradient, :math:`F_{in} \le F_{out}` when it does not;
* else when the layer saw this very input in one of its latest calls (:func:`.kept.sighted_again`):
  a static input pays its aggregation once, whatever the widths;
* else PyG's order.

PyG's order runs, as before, for other inputs (one that needs a gradient, 16-bit rows, under
autocast -- where the two orders round to 16 bits at different places --, in inference mode), with
edge weights that need a gradient, with hooks that would see the other order's tensors
(``propagate`` hooks -- the distributed engine's among them -- or hooks of the linear map besides
the kernels' own) and in explain mode. ``K.set_static_inputs("off")`` keeps PyG's order always,
whose results are PyG's bit for bit; the reordered results equal them within floating-point
reassociation.
"""
from typing import Any, Callable, Optional, Tuple

import torch
from torch import Tensor

from .. import compat
from . import kept

__all__ = ["reordered"]


def _eligible(layer: Any, x: Any, edge_weight: Optional[Tensor],
              ignore: Tuple[Callable, ...]) -> bool:
    lin = getattr(layer, "lin", None)
    return (kept.eligible(x, edge_weight) and x.dim() == 2 and layer.node_dim in (0, -2)
            and isinstance(lin, torch.nn.Module) and getattr(lin, "bias", None) is None
            and not compat.rows_observed(layer)  # explain, decomposed_layers, hooks
            and not compat.call_is_observed(lin, ignore))


def reordered(layer: Any, x: Any, edge_index: Tensor, edge_weight: Optional[Tensor],
              ignore: Tuple[Callable, ...] = ()) -> Optional[Tensor]:
    r"""``layer.lin(layer.propagate(x))`` -- the layer's output before its bias -- when this call
    aggregates first (see the module docstring), else :obj:`None` (run PyG's order).

    Args:
        layer (GCNConv): The layer (its forward is the kernels', :func:`.gcn.kernel_forward`).
        x (Tensor): Its input.
        edge_index (Tensor): The graph as the layer aggregates it (normalized).
        edge_weight (Tensor, optional): Its edge weights (normalized).
        ignore (Tuple[Callable, ...]): Global hooks that may see the other order's tensors (the
            kernels' own module pre-hook, which only acts on message passing).
    """
    if not _eligible(layer, x, edge_weight, ignore):
        return None
    if not kept.holds(layer, x, edge_index, edge_weight):
        grads = torch.is_grad_enabled() and any(p.requires_grad for p in layer.lin.parameters())
        cheaper = x.size(-1) <= (2 if grads else 1) * int(layer.out_channels)
        if not cheaper and not kept.sighted_again(layer, x):
            return None
    # The kernels' propagate aggregates x and keeps it from the second call on (.kept).
    return layer.lin(layer.propagate(edge_index, x=x, edge_weight=edge_weight))
