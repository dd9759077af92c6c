r"""``SAGEConv`` narrowing its rows: transform first, aggregate after.

PyG's ``SAGEConv`` aggregates its input and then maps it: ``lin_l(aggregate(x))``. A sum or a
mean is linear, so :math:`\mathrm{agg}(X)W^\top + b = \mathrm{agg}(XW^\top) + b` (the bias added
after the aggregation: a mean of rows that each carry the bias would give the bias to nodes
without in-edges too, and a sum would multiply it by the in-degree). When the layer narrows
(:math:`F_{out} < F_{in}`, a model's last layer mapping hidden rows to classes), aggregating
the mapped rows moves :math:`F_{out}` values per edge in place of :math:`F_{in}`, forward and,
for the input's gradient, backward. DGL's ``SAGEConv`` chooses its order the same way.

With the kernels on (:func:`~.sage.fused_forward`), a ``SAGEConv`` with sum or mean aggregation
and :math:`F_{out} < F_{in}` maps first, unless its input's aggregation is kept or about to be
(:mod:`.kept`: a static input costs nothing to aggregate once kept). PyG's order runs for max
aggregation (not linear), with hooks that would see the other order's tensors (``propagate``
hooks, hooks of ``lin_l``), in explain mode, under autocast, for a lazy ``lin_l`` not yet
initialized, and under ``K.set_layer_order("pyg")`` (or ``$LIGHTNING_FULLGRAPH_LAYER_ORDER=pyg``),
which keeps every layer's own order. Results equal PyG's within floating-point reassociation.
"""
from typing import Any, Callable, Collection, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import compat
from . import gcn, kept
from .setting import ModeSetting

__all__ = ["MODES", "ENV", "set_layer_order", "get_layer_order", "narrows", "mapped_first"]

MODES = ("auto", "pyg")
ENV = "LIGHTNING_FULLGRAPH_LAYER_ORDER"

_setting = ModeSetting("layer order", MODES, ENV)


def set_layer_order(mode: Optional[str]) -> None:
    r"""``"auto"`` (default): a narrowing ``SAGEConv`` maps its rows before aggregating them;
    ``"pyg"``: every layer in PyG's order; ``None``: back to ``$LIGHTNING_FULLGRAPH_LAYER_ORDER``
    (or ``"auto"``)."""
    _setting.set(mode)


def get_layer_order() -> str:
    r"""The mode in effect: :func:`set_layer_order`'s, else the environment's, else ``"auto"``."""
    return _setting.get()


def narrows(layer: Any, x: Any, lin: Any, ignore: Tuple[Callable, ...] = (),
            own_hooks: Collection[int] = ()) -> bool:
    r"""Whether a call of :obj:`layer` (a ``SAGEConv`` or ``GraphConv``, whose neighbour map is
    :obj:`lin`) on source rows :obj:`x` aggregates ``x @ W^T`` in place of :obj:`x`: the layer
    order is ``"auto"``, the map narrows the rows, the aggregation is linear, and nothing
    would see the other order's tensors (see the module docstring; :obj:`own_hooks` are ids of
    hooks on the layer that are not the user's, :obj:`ignore` global hooks of the same kind).
    Used by the kernels here and by the distributed engine
    (:mod:`lightning_fullgraph.engine.narrow_first`)."""
    w = getattr(lin, "weight", None)
    if (get_layer_order() != "auto" or not isinstance(x, Tensor) or x.dim() != 2
            or not isinstance(w, torch.nn.Parameter)
            or isinstance(w, torch.nn.parameter.UninitializedTensorMixin)
            or w.size(0) >= x.size(-1) or x.dtype != w.dtype or x.device != w.device
            or not isinstance(layer.aggr, str) or layer.aggr not in ("mean", "add", "sum")
            or torch.is_autocast_enabled(x.device.type)
            or compat.rows_observed(layer, own_hooks)):
        return False
    return not compat.call_is_observed(lin, ignore)


def mapped_first(layer: Any, xs: Tuple[Any, Any], edge_index: Any, size: Any,
                 ignore: Tuple[Callable, ...] = ()) -> Optional[Tensor]:
    r"""``lin_l(aggregate(x))`` computed as ``aggregate(x @ W_l^T) + b_l`` when this call maps
    first (see the module docstring), else :obj:`None` (PyG's order).

    Args:
        layer (SAGEConv): The layer (its forward is the kernels', :func:`.sage.fused_forward`).
        xs (Tuple[Tensor, Tensor]): Source and destination rows, as ``propagate`` takes them.
        edge_index (Tensor): The graph.
        size: ``propagate``'s ``size``.
        ignore (Tuple[Callable, ...]): Global hooks that may be skipped when ``lin_l`` is not
            called (the kernels' own module pre-hook).
    """
    x = xs[0]
    lin = layer.lin_l
    if not narrows(layer, x, lin, ignore):
        return None
    w = lin.weight
    # A static input is the kept aggregation's: aggregated once, then free (.kept).
    if isinstance(edge_index, Tensor) and kept.eligible(x):
        if kept.holds(layer, x, edge_index, None) or kept.sighted_again(layer, x):
            return None
    out = layer.propagate(edge_index, x=(F.linear(x, w), xs[1]), size=size)
    bias = getattr(lin, "bias", None)
    if bias is not None:
        return out + bias
    # The caller accumulates the root term into this in place: fine for the kernels' fresh sum,
    # whose backward keeps nothing of it; anything else (PyG's scatter path) is copied first.
    return out if type(out.grad_fn).__name__ == gcn.SUM_NODE else out.clone()
