r"""``GCNConv``'s forward with the kernels: the graph normalized once, the bias added in place,
an input without gradient aggregated first.

PyG's ``GCNConv`` (``cached=False``, its default) calls ``gcn_norm`` on every forward: a
self-loop mask and a concatenation over the edges, a degree scatter, two gathers and products
per edge.  With the aggregation on the kernels that is a large cost left beside the products
(``python -m benchmarks gcn_forward --profile`` shows it; the README has the numbers).  With the
kernels on, an unmodified ``GCNConv`` gets a forward that differs from PyG's in these places
only:

* **The normalization is memoized.**  The tensors PyG's ``gcn_norm`` returned are kept for the
  inputs they came from: the same ``edge_index`` and ``edge_weight`` objects with unchanged
  version counters (an in-place edit recomputes), the same node count, options and dtype.
  The memo is shared by every layer (a GCN's layers normalize one graph once) and holds the
  last :data:`MEMO_SIZE` graphs; an entry goes with its input tensors.  Recomputed, never
  kept: edge weights that require grad (the result must carry their autograd graph), results
  made in inference mode or from inference tensors (those cannot be saved for a later
  backward, nor do they count in-place edits), a ``gcn_norm`` that is not PyG's (a user's
  replacement; the distributed engine's inside a partitioned layer, where its own static
  cache decides), and anything under ``torch.compile`` (PyG's forward is traced as it is).
  Returned tensors that were modified in place since are recomputed too.  Memory: the
  looped edge list kept here is the very tensor the kernels' CSR cache keeps, so between
  steps the memo adds the weights, :math:`(E + N) \times` 4 bytes in float32.
* **The kept edge list is in destination order.**  gcn_norm's looped edges are sorted once,
  stably, when they are kept, so the kernels' CSR of them needs no permutation array
  (:math:`(E + N) \times` 4 bytes) and the weights are not reordered in every call; the
  CSR is the one built from gcn_norm's order, position for position, so the sums are the
  same bits.  (A call the kernels leave to PyG's scatter sums in this order: equal within
  floating-point rounding.)
* **The bias is added in place** when the aggregation is the kernels' fresh output, whose
  autograd node keeps nothing of it (no propagate forward hook, same dtype and device as the
  bias): ``out.add_(bias)`` instead of ``out + bias``, the same values without a second
  :math:`N \times F_{out}` tensor and its first-touch page faults.

* **An input without gradient is aggregated first** (:mod:`.gcn_reorder`): :math:`(\hat{A}X)W`
  in place of :math:`\hat{A}(XW)`, one aggregation per training step in place of two, and none
  while :math:`X` stays the same tensor (the aggregate is kept, :mod:`.kept`). Those results
  equal PyG's within floating-point reassociation (``K.set_static_inputs("off")`` keeps PyG's
  order).

Values in PyG's order are bit-identical to PyG's forward (``tests/kernels/test_gcn.py``);
everything else (tuples of features, ``SparseTensor`` or ``torch.sparse`` graphs, subclasses
with their own forward) runs PyG's forward.

The other layers the kernels run that normalize with ``gcn_norm`` in every forward
(``SGConv`` without ``cached``, ``APPNP``, ``TAGConv``, ``GCN2Conv``) keep PyG's forward and
get the same memo: while their forward runs, their ``gcn_norm`` calls are answered from it
(:func:`memo_scope`).  The memo reaches those calls through the one rebinding of PyG's
``gcn_norm`` that the distributed engine uses too (:func:`..compat.route_gcn_norm`, made
while a layer is accelerated): the engine's handler comes first, so inside a partitioned layer
the engine normalizes (halo degrees) and its static-input memo decides what is kept.
"""
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Tuple

import torch
from torch import Tensor

from .. import compat
from ..memo import TensorMemo
from . import gcn_reorder

__all__ = ["MEMO_SIZE", "NORMALIZING_LAYERS", "SUM_NODE", "applies", "normalizes", "kernel_forward",
           "scoped_forward", "memo_scope", "route", "unroute", "normalize", "clear_memo",
           "memo_info"]

#: PyG layers, besides ``GCNConv``, that the kernels run and that call ``gcn_norm`` in their
#: forward (names in ``torch_geometric.nn``).
NORMALIZING_LAYERS = ("SGConv", "APPNP", "TAGConv", "GCN2Conv")

#: Graphs whose normalization is kept at once (least recently used goes first).
MEMO_SIZE = 4

#: The autograd node of the kernels' sum (``ops.csr_sum``): its output is fresh and unsaved.
SUM_NODE = "GeneratedBackwardFor_lightning_fullgraph_csr_sum_defaultBackward"


#: The kept normalizations (following their edge_index and edge_weight).  A returned input
#: (gcn_norm without self-loops returns edge_index itself) is kept as its position in the
#: inputs, not a second reference that would keep the entry's inputs alive.
_memo = TensorMemo(MEMO_SIZE)


def _positions(result: tuple, given: tuple) -> tuple:
    return tuple(next((i for i, g in enumerate(given) if g is t and t is not None), t)
                 if isinstance(t, Tensor) else t for t in result)


def _resolve(kept: tuple, given: tuple) -> tuple:
    return tuple(given[t] if isinstance(t, int) else t for t in kept)


def clear_memo() -> None:
    r"""Forgets every kept normalization (and resets the counts)."""
    _memo.clear()


def memo_info() -> dict:
    r"""Hits, misses and the graphs kept (with the bytes their normalizations hold)."""
    # (not the inputs a result is: kept as positions)
    return {"hits": _memo.hits, "misses": _memo.misses, "graphs": len(_memo),
            "bytes": _memo.nbytes()}


def applies(layer: Any) -> bool:
    r"""Whether :obj:`layer` is a ``GCNConv`` running PyG's own forward."""
    from torch_geometric.nn.conv import GCNConv
    return isinstance(layer, GCNConv) and type(layer).forward is GCNConv.forward


def normalizes(layer: Any) -> bool:
    r"""Whether :obj:`layer` is one of :data:`NORMALIZING_LAYERS` running PyG's own forward."""
    import torch_geometric.nn as gnn
    for name in NORMALIZING_LAYERS:
        cls = getattr(gnn, name)
        if isinstance(layer, cls):
            return type(layer).forward is cls.forward
    return False


_scope = threading.local()


@contextmanager
def memo_scope() -> Iterator[None]:
    r"""While inside, this thread's ``gcn_norm`` calls are answered from the memo (where it
    is routed, see :func:`route`, and applies: see the module docstring)."""
    _scope.depth = getattr(_scope, "depth", 0) + 1
    try:
        yield
    finally:
        _scope.depth -= 1


def _handler(edge_index: Any, edge_weight: Optional[Tensor] = None, num_nodes: Any = None,
             improved: bool = False, add_self_loops: bool = True,
             flow: str = "source_to_target", dtype: Optional[torch.dtype] = None) -> Any:
    # The kernels' handler of PyG's gcn_norm calls: behind the engine's, before PyG's.
    if torch.compiler.is_compiling() or not getattr(_scope, "depth", 0):
        return NotImplemented
    if (not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided
            or num_nodes is None or (edge_weight is not None
                                     and not isinstance(edge_weight, Tensor))):
        return NotImplemented  # SparseTensor / torch.sparse graphs: PyG's own
    return _memoized(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)


_routed = [0]


def route() -> None:
    r"""Puts the memo in PyG's ``gcn_norm`` calls (reference counted; the kernels do it for
    every layer they accelerate that normalizes, and :func:`unroute` when they revert it)."""
    _routed[0] += 1
    if _routed[0] == 1:
        compat.route_gcn_norm(_handler, priority=10)  # behind the engine's (priority 0)


def unroute() -> None:
    r"""Undoes one :func:`route`."""
    if _routed[0] == 0:
        return
    _routed[0] -= 1
    if _routed[0] == 0:
        compat.unroute_gcn_norm(_handler)


def normalize(edge_index: Tensor, edge_weight: Optional[Tensor], num_nodes: int,
              improved: bool, add_self_loops: bool, flow: str,
              dtype: Optional[torch.dtype]) -> Tuple[Tensor, Optional[Tensor]]:
    r"""What ``gcn_norm(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow,
    dtype)`` returns: through ``GCNConv``'s ``gcn_norm`` as it is bound now, inside
    :func:`memo_scope` (so from the memo while it is routed and applies; the distributed
    engine's normalization inside a partitioned layer; a user's replacement as it is)."""
    from torch_geometric.nn.conv import gcn_conv
    with memo_scope():
        return gcn_conv.gcn_norm(edge_index, edge_weight, num_nodes, improved, add_self_loops,
                                 flow, dtype)


def _destination_sorted(result: Tuple[Tensor, Optional[Tensor]], edge_index: Tensor,
                        num_nodes: int, flow: str) -> Tuple[Tensor, Optional[Tensor]]:
    # The kept edge list in destination order, stably (each row's edges in the order gcn_norm
    # gave them, its added self-loop last): the kernels' CSR of it is the one they would build
    # from gcn_norm's order, position for position, so the sums are bit-identical; but it
    # needs no permutation array and no reordering of the weights in every call. A returned
    # input stays as it is (sorting it would keep a second copy).
    from .csr import _is_sorted, _stable_argsort
    ei, weight = result
    if (ei is edge_index or flow != "source_to_target" or not isinstance(weight, Tensor)
            or weight.dim() != 1 or weight.numel() != ei.size(1) or _is_sorted(ei[1])):
        return result
    order = _stable_argsort(ei[1], int(num_nodes))
    return ei.index_select(1, order), weight.index_select(0, order)


def _memoized(edge_index: Tensor, edge_weight: Optional[Tensor], num_nodes: int,
              improved: bool, add_self_loops: bool, flow: str,
              dtype: Optional[torch.dtype]) -> Tuple[Tensor, Optional[Tensor]]:
    norm = compat.pyg_gcn_norm()
    keep = (not torch.is_inference_mode_enabled()
            and not edge_index.is_inference()  # no version counter to check
            and (edge_weight is None or not (edge_weight.requires_grad
                                             or edge_weight.is_inference())))
    if not keep:
        return norm(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)
    key = (id(edge_index), None if edge_weight is None else id(edge_weight), int(num_nodes),
           bool(improved), bool(add_self_loops), flow, dtype)
    given = (edge_index, edge_weight)
    kept = _memo.get(key, given)
    if kept is not None:
        return _resolve(kept, given)
    raw = norm(edge_index, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)
    result = _destination_sorted(raw, edge_index, num_nodes, flow)
    if result[0] is not raw[0]:
        # A CSR the kernels built of the unsorted list (gcn_norm's result aggregated outside
        # the memo) would never be used again: the kept list is the sorted one.
        from .csr import forget
        forget(raw[0])
    _memo.put(key, given, _positions(tuple(result), given))
    return result


def _add_bias(layer: Any, out: Tensor) -> Tensor:
    bias = layer.bias
    if bias is None:
        return out
    if (type(out.grad_fn).__name__ == SUM_NODE and out._base is None and out.is_contiguous()
            and out.dtype == bias.dtype and out.device == bias.device and out.dim() == 2
            and bias.shape == out.shape[-1:] and not compat.hook_dicts(layer, "propagate")):
        return out.add_(bias)
    return out + bias


def _add_bias_to_product(layer: Any, out: Tensor) -> Tensor:
    # The linear map's fresh output (no hook of the map observes it: .gcn_reorder checked):
    # its backward keeps the map's input, not this, so the bias goes in in place.
    bias = layer.bias
    if bias is None:
        return out
    if out._base is None and out.dtype == bias.dtype and out.device == bias.device:
        return out.add_(bias)
    return out + bias


def kernel_forward(layer: Any, original: Callable, ignore: Tuple[Callable, ...] = ()) -> Callable:
    r"""A ``forward`` for :obj:`layer` (:func:`applies`) with the memoized normalization, the
    bias added in place and an input without gradient aggregated first (:mod:`.gcn_reorder`);
    PyG's :obj:`original` for every call it does not cover.

    Args:
        layer (GCNConv): The layer.
        original (Callable): Its forward as it was.
        ignore (Tuple[Callable, ...]): Global hooks that may see the reordered tensors (the
            kernels' own module pre-hook).
    """

    def forward(x: Tensor, edge_index: Any, edge_weight: Optional[Tensor] = None) -> Tensor:
        if (torch.compiler.is_compiling() or not isinstance(x, Tensor)
                or not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided):
            return original(x, edge_index, edge_weight)
        if layer.normalize:  # as PyG's forward, with the memo in place of gcn_norm
            cache = layer._cached_edge_index
            if cache is None:
                edge_index, edge_weight = normalize(
                    edge_index, edge_weight, x.size(layer.node_dim), layer.improved,
                    layer.add_self_loops, layer.flow, x.dtype)
                if layer.cached:
                    layer._cached_edge_index = (edge_index, edge_weight)
            else:
                edge_index, edge_weight = cache[0], cache[1]
        out = gcn_reorder.reordered(layer, x, edge_index, edge_weight, ignore)
        if out is not None:
            return _add_bias_to_product(layer, out)
        x = layer.lin(x)
        out = layer.propagate(edge_index, x=x, edge_weight=edge_weight)
        return _add_bias(layer, out)

    forward.__wrapped__ = original
    return forward


def scoped_forward(layer: Any, original: Callable) -> Callable:
    r"""A ``forward`` for :obj:`layer` (:func:`normalizes`): PyG's :obj:`original` with its
    ``gcn_norm`` calls inside :func:`memo_scope`."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            return original(*args, **kwargs)
        with memo_scope():
            return original(*args, **kwargs)

    forward.__wrapped__ = original
    return forward
