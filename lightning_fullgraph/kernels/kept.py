r"""Aggregations of unchanged inputs, kept between calls.

A model's first layer aggregates the same features in every step: the dataset's ``x``, which
needs no gradient and does not change. Its aggregation is then the same in every step too. The
kernels' ``propagate`` (:mod:`.pyg`) keeps it and answers later calls with it, as the distributed
engine's static-input memo does for a partitioned layer (:mod:`lightning_fullgraph.engine.static`):
``SAGEConv``, ``GINConv`` and ``GraphConv`` then aggregate their input once, and ``GCNConv``,
which aggregates its transformed input, is run in the other order for such an input
(:mod:`.gcn_reorder`).

An aggregation is kept when a layer aggregates the same input again (it is among the inputs of
its last :data:`SIGHTINGS` aggregations): the same tensor (or a view of the same base, with the
same geometry), with an unchanged version counter, that needs no gradient; over the same graph
tensor and edge weights (unchanged, without gradient), with the same sizes, reduction and
backend. So tensors made anew in every call (input dropout, hops over a changing input) are
never kept; a hop over a kept aggregation is (``SGConv`` on the features keeps all its hops:
SGC's precomputation, found by itself). Nothing is kept in inference mode (its tensors cannot be
saved for a later backward), for 16-bit rows (not measured), under autocast, in code that
``torch.compile`` traces (a compiled graph would not re-check what an entry came from; calls it
leaves to eager mode keep as usual), or in calls the distributed engine's hooks rewrite (its own
cache decides there).

An entry is answered only while everything it came from is alive and unchanged, and while the
kept output itself is unchanged (a layer or hook that edits its aggregation in place makes the
next call aggregate anew); it goes when its layer, input, graph or weights are freed. At most
:data:`SIZE` are kept (least recently used goes first); each is :math:`N_{dst} \times F`.
``K.set_static_inputs("off")`` (or ``$LIGHTNING_FULLGRAPH_STATIC_INPUTS=off``) keeps and uses
nothing and leaves ``GCNConv`` in PyG's order; :func:`~.clear_memos` forgets everything kept.
"""
import weakref
from typing import Any, Optional

import torch
from torch import Tensor

from ..memo import TensorMemo, anchor, signature
from .setting import ModeSetting

__all__ = ["MODES", "ENV", "SIZE", "set_static_inputs", "get_static_inputs", "eligible", "lookup",
           "holds", "sighted_again", "keep", "clear", "info", "SIGHTINGS"]

MODES = ("auto", "off")
ENV = "LIGHTNING_FULLGRAPH_STATIC_INPUTS"
#: Aggregations kept at once.
SIZE = 4

_setting = ModeSetting("static-inputs mode", MODES, ENV)


def set_static_inputs(mode: Optional[str]) -> None:
    r"""``"auto"`` (default): keep the aggregations of unchanged inputs, and aggregate such an
    input of ``GCNConv`` first; ``"off"``: neither (what is kept already is not used, and goes
    with its inputs or :func:`~.clear_memos`); ``None``: back to
    ``$LIGHTNING_FULLGRAPH_STATIC_INPUTS`` (or ``"auto"``)."""
    _setting.set(mode)


def get_static_inputs() -> str:
    r"""The mode in effect: :func:`set_static_inputs`'s, else the environment's, else ``"auto"``."""
    return _setting.get()


def eligible(x: Any, weight: Any = None) -> bool:
    r"""Whether an aggregation of :obj:`x` (with :obj:`weight`) may be kept (module docstring)."""
    return (get_static_inputs() == "auto" and isinstance(x, Tensor) and x.layout == torch.strided
            and x.dtype in (torch.float32, torch.float64) and not x.requires_grad
            and not x.is_inference() and not torch.is_inference_mode_enabled()
            and not torch.is_autocast_enabled(x.device.type)
            and (weight is None or (isinstance(weight, Tensor) and not weight.requires_grad
                                    and not weight.is_inference())))


#: The kept aggregations: following their layer, input, graph and weights; the kept output
#: must stay unmodified too.
_kept = TensorMemo(SIZE)
_counts = {"hits": 0, "kept": 0}
# Per layer: the inputs of its latest eligible calls (weakly), with their signatures; a few, so
# that the hops of one forward (SGConv's K propagations) do not push out its first input.
_sighted: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
SIGHTINGS = 4


def _tensors(x: Tensor, edge_index: Tensor, weight: Optional[Tensor]) -> tuple:
    return (x, edge_index) + ((weight,) if weight is not None else ())


def _key(layer: Any, x: Tensor, edge_index: Tensor, weight: Optional[Tensor], extra: tuple) -> tuple:
    # The input's place, not its version: an edited input replaces its entry.
    return (id(layer), id(anchor(x)), signature(x)[1:-1], id(edge_index),
            None if weight is None else id(weight), extra)


def lookup(layer: Any, x: Tensor, edge_index: Tensor, weight: Optional[Tensor],
           extra: tuple = ()) -> Optional[Tensor]:
    r"""The kept aggregation of this call (:obj:`extra`: its sizes, reduction and backend), or
    ``None``."""
    out = _kept.get(_key(layer, x, edge_index, weight, extra), _tensors(x, edge_index, weight),
                    count=False)
    if out is not None:
        _counts["hits"] += 1
    return out


def holds(layer: Any, x: Tensor, edge_index: Tensor, weight: Optional[Tensor]) -> bool:
    r"""Whether an aggregation of :obj:`x` over this graph by :obj:`layer` is kept (any sizes,
    reduction and backend)."""
    tensors = _tensors(x, edge_index, weight)
    head = _key(layer, x, edge_index, weight, ())[:-1]
    return any(key[:-1] == head and _kept.matches(key, tensors) for key, *_ in _kept.items())


def sighted_again(layer: Any, x: Tensor) -> bool:
    r"""Whether one of :obj:`layer`'s latest eligible calls (:data:`SIGHTINGS`) had this very
    input, unchanged; records this call's input as the latest."""
    base, sig = anchor(x), signature(x)
    seen = [s for s in _sighted.get(layer, ()) if s[0]() is not None]  # freed inputs drop out
    again = any(ref() is base and old == sig for ref, old in seen)
    seen = [s for s in seen if s[0]() is not base] + [(weakref.ref(base), sig)]
    _sighted[layer] = seen[-SIGHTINGS:]
    return again


def keep(layer: Any, x: Tensor, edge_index: Tensor, weight: Optional[Tensor], extra: tuple,
         output: Tensor) -> None:
    r"""Keeps :obj:`output`, the aggregation of this call (:func:`lookup` answers with it)."""
    if output.requires_grad:  # made from tensors without gradient, it has none: else not ours
        return
    _kept.put(_key(layer, x, edge_index, weight, extra), _tensors(x, edge_index, weight), output,
              follow=(layer,))
    _counts["kept"] += 1


def clear() -> None:
    r"""Forgets every kept aggregation and sighting (and resets the counts)."""
    _kept.clear()
    _sighted.clear()
    _counts["hits"] = _counts["kept"] = 0


def info() -> dict:
    r"""``hits`` (calls answered), ``kept`` (aggregations kept so far), ``aggregations`` (kept
    now) and the ``bytes`` they hold."""
    return {**_counts, "aggregations": len(_kept), "bytes": _kept.nbytes()}
