"""Drop-in PyG backend: per-instance ``propagate`` wrappers that route aggregation to our kernels.

A layer is *supported* when its message is ``x_j`` times an optional per-edge scalar and
its aggregation is sum/mean/max - registered here for ``GCNConv``, ``SAGEConv``,
``GINConv``, ``GraphConv``, ``SGConv``, ``APPNP``, ``GCN2Conv`` and ``TAGConv``; user
classes can be added with :func:`register_layer`. Everything else (``GATConv``, custom
``message``/``aggregate``, SparseTensor inputs, explain mode, extra hooks, ...) keeps PyG's
path untouched.

Composition with ``_propagate_forward_pre_hooks`` (the distributed engine replaces ``x``
with ``(x_with_halo, x_own)`` and ``size`` with ``(N_src, N_dst)``): the wrapper runs the
pre-hooks itself (also under ``torch.compile``, through a graph break, where PyG would skip
them and lose e.g. the engine's halo rows), aggregates over the possibly rectangular
graph, then runs ``update`` and the propagate forward hooks. Calls it does not handle go
to PyG's ``propagate`` unchanged; if a pre-hook makes a call unsupported, PyG's
``propagate`` runs with the pre-hooks suppressed, so hooks never run twice.
"""
from __future__ import annotations

import sys
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .. import compat
from . import backend as _backend
from . import gcn, kept, sage
from .functional import aggregate
from .split import SplitRows, accepting_split, aggregate_split

__all__ = ["register_layer", "registered_layers", "accelerate", "AccelerationHandle", "is_accelerated"]

_WRAPPER_FLAG = "_lightning_fullgraph_wrapper"


@dataclass(frozen=True)
class LayerSpec:
    """How to read a supported layer's ``propagate`` keyword arguments."""

    x: str
    weight: Optional[str]
    message: Callable  # the message function this spec describes (overrides disqualify)


_registry: "OrderedDict[type, LayerSpec]" = OrderedDict()


def register_layer(cls: type, x: str = "x", weight: Optional[str] = "edge_weight") -> type:
    """Declare that ``cls.message`` returns ``x_j`` (times ``edge_weight.view(-1, 1)`` if given).

    The class's aggregation must be a sum/mean/max ``Aggregation`` (``aggr="add"``,
    ``"sum"``, ``"mean"``, ``"max"``) and ``update`` must be the default one. Subclasses
    inherit the registration unless they override ``message``. Usable as a decorator.

    Args:
        cls: A ``torch_geometric.nn.MessagePassing`` subclass.
        x: Name of the node-feature keyword of ``propagate`` (``Tensor`` or
            ``(x_src, x_dst)`` tuple).
        weight: Name of the optional ``[E]`` per-edge scalar keyword, or ``None``.

    Returns:
        ``cls`` unchanged.
    """
    _registry[cls] = LayerSpec(x=x, weight=weight, message=cls.message)
    _seen_unsupported.clear()
    return cls


def registered_layers() -> Tuple[type, ...]:
    """Classes registered with :func:`register_layer`."""
    _register_builtin()
    return tuple(_registry)


_builtin_done = False


def _register_builtin() -> None:
    global _builtin_done
    if _builtin_done:
        return
    _builtin_done = True
    from torch_geometric import nn as gnn

    for name in ("GCNConv", "GraphConv", "SGConv", "APPNP", "GCN2Conv", "TAGConv"):
        register_layer(getattr(gnn, name), x="x", weight="edge_weight")
    for name in ("SAGEConv", "GINConv"):
        register_layer(getattr(gnn, name), x="x", weight=None)


def _spec_for(module) -> Optional[LayerSpec]:
    _register_builtin()
    for klass in type(module).__mro__:
        spec = _registry.get(klass)
        if spec is not None:
            return spec if type(module).message is spec.message else None
    return None


def _reduce_of(module) -> Optional[str]:
    from torch_geometric.nn import aggr as A

    kind = type(getattr(module, "aggr_module", None))
    return {A.SumAggregation: "sum", A.MeanAggregation: "mean", A.MaxAggregation: "max"}.get(kind)


def _module_supported(module) -> bool:
    from torch_geometric.nn import MessagePassing

    if _spec_for(module) is None or _reduce_of(module) is None:
        return False
    cls = type(module)
    if cls.aggregate is not MessagePassing.aggregate or cls.update is not MessagePassing.update:
        return False
    if getattr(module, "flow", "source_to_target") != "source_to_target":
        return False
    if module.explain or getattr(module, "decomposed_layers", 1) != 1:
        return False
    # Hooks on message/aggregate level would be skipped by the kernel path.
    for kind in ("message_pre", "message", "aggregate_pre", "aggregate",
                 "message_and_aggregate_pre", "message_and_aggregate"):
        if len(compat.hook_dicts(module, kind)) > 0:
            return False
    return True


def _is_edge_index(ei) -> bool:
    if not isinstance(ei, Tensor) or ei.is_sparse or ei.layout != torch.strided:
        return False
    return ei.dim() == 2 and ei.size(0) == 2 and not ei.is_floating_point() and not ei.is_complex()


def _call_supported(module, spec: LayerSpec, edge_index, kwargs: Dict[str, Any]) -> bool:
    if not _is_edge_index(edge_index):
        return False
    allowed = {spec.x} | ({spec.weight} if spec.weight else set())
    if not set(kwargs) <= allowed or spec.x not in kwargs:
        return False
    x = kwargs[spec.x]
    if isinstance(x, (tuple, list)):
        if len(x) != 2 or not isinstance(x[0], Tensor) or not (x[1] is None or isinstance(x[1], Tensor)):
            return False
        x_src = x[0]
    elif isinstance(x, Tensor):
        x_src = x
    else:
        return False
    if x_src.dim() != 2 or module.node_dim not in (0, -2) or not x_src.is_floating_point():
        return False
    if x_src.device != edge_index.device:
        return False
    w = kwargs.get(spec.weight) if spec.weight else None
    if w is not None and (not isinstance(w, Tensor) or w.dim() != 1 or w.numel() != edge_index.size(1)):
        return False
    return True


def _sizes(edge_index, size, x) -> Optional[Tuple[int, int]]:
    """``(N_src, N_dst)`` exactly as PyG infers them; ``None`` if inconsistent (let PyG raise)."""
    s: List[Optional[int]] = list(size) if size is not None else [None, None]
    if hasattr(edge_index, "sparse_size") and hasattr(edge_index, "num_rows"):
        s = [edge_index.num_rows, edge_index.num_cols]  # EdgeIndex overrides size
    x_src, x_dst = (x[0], x[1]) if isinstance(x, (tuple, list)) else (x, None)
    for dim, t in ((1, x_dst), (0, x_src)):
        if isinstance(t, Tensor):
            if s[dim] is None:
                s[dim] = t.size(0)
            elif s[dim] != t.size(0):
                return None
    n_src = s[0] if s[0] is not None else s[1]
    n_dst = s[1] if s[1] is not None else s[0]
    return int(n_src), int(n_dst)


def _make_wrapper(module, original: Callable, pinned: Optional[str], follow_default: Optional[str]):
    module_ref = weakref.ref(module)

    def propagate(edge_index, *args, size=None, **kwargs):
        mod = module_ref()
        # Pinned backend, else the global switch; "auto" for accelerate()d layers while off.
        requested = pinned if pinned is not None else (_backend.current() or follow_default)
        spec = _spec_for(mod) if mod is not None else None
        if (args or requested is None or spec is None or not _module_supported(mod)
                or not _call_supported(mod, spec, edge_index, kwargs)):
            return original(edge_index, *args, size=size, **kwargs)

        x = kwargs[spec.x]
        be = _backend.resolve(requested, (x[0] if isinstance(x, (tuple, list)) else x).device)
        if be is None:
            return original(edge_index, size=size, **kwargs)
        if spec.weight and spec.weight not in kwargs:
            kwargs = {**kwargs, spec.weight: None}  # hooks see every argument, as in PyG's template
        reduce = _reduce_of(mod)
        rewritten = len(compat.hook_dicts(mod, "propagate_pre")) > 0
        if rewritten:
            # A sum or mean over a split source (owned rows now, halo rows later) is ours.
            edge_index, size, kwargs = _run_pre_hooks(mod, edge_index, size, kwargs,
                                                      accept_split=reduce in ("sum", "mean"))
        split = _split_source(kwargs.get(spec.x))
        if split is not None:
            out = _aggregate_split_call(mod, spec, split, edge_index, size, kwargs, be)
            if out is not None:
                return _finish(mod, out, edge_index, out_sizes=(split.num_rows, out.size(0)),
                               kwargs=kwargs)
            kwargs = _materialized(kwargs)
        # The pre-hooks may have changed the call; re-check without re-running them.
        if not _call_supported(mod, spec, edge_index, kwargs):
            return _original_without_pre_hooks(mod, original, edge_index, size, kwargs)
        x = kwargs[spec.x]
        sizes = _sizes(edge_index, size, x)
        if sizes is None:
            return _original_without_pre_hooks(mod, original, edge_index, size, kwargs)
        n_src, n_dst = sizes
        x_src = x[0] if isinstance(x, (tuple, list)) else x
        weight = kwargs.get(spec.weight) if spec.weight else None
        out = _aggregate_or_kept(mod, x_src, edge_index, weight, reduce, n_src, n_dst, be,
                                 static=not rewritten)
        return _finish(mod, out, edge_index, (n_src, n_dst), kwargs)

    setattr(propagate, _WRAPPER_FLAG, True)
    propagate.__wrapped__ = original
    return propagate


def _aggregate_or_kept(mod, x: Tensor, edge_index, weight, reduce: str, n_src: int, n_dst: int,
                       be: str, static: bool) -> Tensor:
    # An unchanged input's aggregation, kept from an earlier call (.kept); not in a call the
    # distributed engine's pre-hooks rewrote (its static-input memo decides there), nor while
    # torch.compile traces (a traced graph would not re-check versions and lifetimes).
    if not (static and isinstance(edge_index, Tensor) and not torch.compiler.is_compiling()
            and kept.eligible(x, weight)):
        return aggregate(x, edge_index, weight, reduce, n_dst, num_src=n_src, backend=be)
    extra = (reduce, int(n_src), int(n_dst), be)  # a backend switched to aggregates anew
    out = kept.lookup(mod, x, edge_index, weight, extra)
    if out is None:
        out = aggregate(x, edge_index, weight, reduce, n_dst, num_src=n_src, backend=be)
        if kept.sighted_again(mod, x):
            kept.keep(mod, x, edge_index, weight, extra, out)
    return out


def _finish(mod, out: Tensor, edge_index, out_sizes: Tuple[int, int], kwargs: Dict[str, Any]):
    # PyG's propagate after aggregation: update, then the propagate forward hooks.
    n_src, n_dst = out_sizes
    out = mod.update(out)
    for hook in compat.hook_dicts(mod, "propagate").values():
        res = hook(mod, (edge_index, [n_src, n_dst], kwargs), out)
        if res is not None:
            out = res
    return out


def _split_source(x: Any) -> Optional[SplitRows]:
    src = x[0] if isinstance(x, (tuple, list)) and len(x) == 2 else x
    return src if isinstance(src, SplitRows) else None


@torch.compiler.disable
def _materialized(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    # Sources a split could not serve, as the one tensor PyG's path expects.
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, SplitRows):
            v = v.materialize()
        elif isinstance(v, (tuple, list)) and any(isinstance(t, SplitRows) for t in v):
            v = type(v)(t.materialize() if isinstance(t, SplitRows) else t for t in v)
        out[k] = v
    return out


@torch.compiler.disable  # completes the halo exchange (eager collectives)
def _aggregate_split_call(mod, spec: LayerSpec, split: SplitRows, edge_index, size,
                          kwargs: Dict[str, Any], be: str) -> Optional[Tensor]:
    r"""The layer's sum or mean over a split source, or ``None`` when the call needs PyG's
    path."""
    x = kwargs[spec.x]
    probe = {**kwargs, spec.x: (split.local, x[1]) if isinstance(x, (tuple, list)) else split.local}
    reduce = _reduce_of(mod)
    if (reduce not in ("sum", "mean") or size is None
            or not _call_supported(mod, spec, edge_index, probe)):
        return None
    n_src, n_dst = int(size[0]), int(size[1])
    if n_src != split.num_rows:
        return None
    weight = kwargs.get(spec.weight) if spec.weight else None
    return aggregate_split(split, _plain_index(edge_index), weight, n_dst, backend=be,
                           reduce=reduce)


def _plain_index(edge_index):
    return edge_index.as_tensor() if hasattr(edge_index, "as_tensor") else edge_index


# Eager on purpose: pre-hooks may run collectives or read thread-local state (the
# distributed engine does both), which torch.compile must not trace or skip.
@torch.compiler.disable
def _run_pre_hooks(mod, edge_index, size, kwargs, accept_split: bool = False):
    with accepting_split(accept_split):
        for hook in compat.hook_dicts(mod, "propagate_pre").values():
            res = hook(mod, (edge_index, size, kwargs))
            if res is not None:
                edge_index, size, kwargs = res
    return edge_index, size, kwargs


@torch.compiler.disable
def _original_without_pre_hooks(mod, original, edge_index, size, kwargs):
    saved = compat.hook_dicts(mod, "propagate_pre")
    compat.set_hook_dict(mod, "propagate_pre", OrderedDict())
    try:
        return original(edge_index, size=size, **kwargs)
    finally:
        compat.set_hook_dict(mod, "propagate_pre", saved)


_MISSING = object()


def _install(module, pinned: Optional[str],
             follow_default: Optional[str]) -> Optional[Tuple[Any, ...]]:
    """Install the wrapper on ``module``; returns the restore token or ``None`` if skipped."""
    if getattr(module.__dict__.get("propagate"), _WRAPPER_FLAG, False):
        return None  # already wrapped (by accelerate() or use())
    saved = module.__dict__.get("propagate", _MISSING)
    wrapper = _make_wrapper(module, module.propagate, pinned, follow_default)
    module.__dict__["propagate"] = wrapper
    fused, routed = None, False
    # The layer's dense side with the kernels (see .sage, .gcn); not over another instance
    # forward (the distributed engine's, a user's).
    own = module.__dict__.get("forward")
    if own is None:
        if sage.fusable(module):  # SAGEConv's root term accumulated into lin_l's product
            fused = sage.fused_forward(module, module.forward, (_global_pre_hook, ))
        elif gcn.applies(module):  # GCNConv: normalization memoized, bias in place, reordered
            fused, routed = gcn.kernel_forward(module, module.forward, (_global_pre_hook, )), True
        elif gcn.normalizes(module):  # APPNP, TAGConv, ...: their gcn_norm calls memoized
            fused, routed = gcn.scoped_forward(module, module.forward), True
    if fused is not None:
        module.__dict__["forward"] = fused
    if routed:
        gcn.route()  # the memo in PyG's gcn_norm calls while this layer is accelerated
        # ... and no longer than the layer lives: a layer dropped without being reverted
        # gives its route back when it is collected.
        routed = weakref.finalize(module, gcn.unroute)
        routed.atexit = False
    if "__prepare_scriptable__" not in module.__dict__:
        module.__dict__["__prepare_scriptable__"] = _ScriptableCopy(module, saved)
    return saved, wrapper, fused, routed, own


class _ScriptableCopy:
    r"""``torch.jit.script(layer)`` of an accelerated layer scripts PyG's own layer.

    TorchScript compiles a module's ``forward`` and ``propagate`` as it finds them on the
    instance: the kernels' (closures, resolved in this package's globals, where PyG's type
    aliases such as ``Adj`` are unknown).  It first calls ``__prepare_scriptable__``: this one
    returns a shallow copy of the layer (the same parameters, buffers and hooks) with PyG's
    own ``forward`` and ``propagate``, so the scripted module is the one PyG scripts; the
    layer itself stays accelerated."""

    def __init__(self, module, saved) -> None:
        self.module, self.saved = weakref.ref(module), saved

    def __call__(self):
        import copy
        module = self.module()
        plain = copy.copy(module)  # shares _parameters, _buffers, _modules, hooks
        plain.__dict__ = dict(module.__dict__)
        for name in ("forward", "__prepare_scriptable__"):
            plain.__dict__.pop(name, None)
        if self.saved is _MISSING:
            plain.__dict__.pop("propagate", None)
        else:
            plain.__dict__["propagate"] = self.saved
        prepare = getattr(type(plain), "__prepare_scriptable__", None)
        return prepare(plain) if prepare is not None else plain


def _uninstall(module, token) -> None:
    saved, wrapper, fused, routed, own = token
    if routed:
        routed()  # gcn.unroute, once
    if isinstance(module.__dict__.get("__prepare_scriptable__"), _ScriptableCopy):
        del module.__dict__["__prepare_scriptable__"]
    if fused is not None and module.__dict__.get("forward") is fused:
        if own is None:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = own
    if module.__dict__.get("propagate") is not wrapper:
        return  # someone replaced it since (e.g. PyG's explain setter); leave theirs
    if saved is _MISSING:
        del module.__dict__["propagate"]
    else:
        module.__dict__["propagate"] = saved


def is_accelerated(module) -> bool:
    """Whether ``module`` currently carries a kernel ``propagate`` wrapper."""
    return bool(getattr(module.__dict__.get("propagate"), _WRAPPER_FLAG, False))


class AccelerationHandle:
    """Returned by :func:`accelerate`; :meth:`revert` restores every wrapped layer."""

    def __init__(self, installed: List[Tuple[Any, Any]]):
        self._installed = installed

    @property
    def modules(self) -> List[Any]:
        """The layers that were wrapped."""
        return [m for m, _ in self._installed]

    def revert(self) -> None:
        """Remove the wrappers (idempotent)."""
        for module, token in reversed(self._installed):
            _uninstall(module, token)
        self._installed = []

    def __enter__(self) -> "AccelerationHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.revert()


def accelerate(model: torch.nn.Module, backend: Optional[str] = None) -> AccelerationHandle:
    """Wrap every supported PyG layer inside ``model`` (in place).

    Args:
        model: Any module; supported ``MessagePassing`` submodules (and ``model`` itself)
            are wrapped, others are untouched.
        backend: Pin a backend for these layers; ``None`` follows the global :func:`use`
            switch, or uses ``"auto"`` while that switch is off.

    Returns:
        An :class:`AccelerationHandle`; call ``.revert()`` to undo.
    """
    from torch_geometric.nn import MessagePassing

    pinned = _backend._normalize(backend) if backend is not None else None
    installed = []
    for module in model.modules():
        if isinstance(module, MessagePassing) and _spec_for(module) is not None:
            if module in _auto_installed:  # wrapped lazily by use(): take it over
                _uninstall(module, _auto_installed.pop(module))
            token = _install(module, pinned, "auto")
            if token is not None:
                installed.append((module, token))
    return AccelerationHandle(installed)


# --------------------------------------------------------------------------- global switch
# use(backend) installs wrappers lazily: a global forward pre-hook wraps each supported
# layer the first time it runs, so unmodified models need no call to accelerate().
_auto_installed: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_global_hook = None


def _global_pre_hook(module, args):
    # Under torch.compile the layer keeps PyG's path, traced into the graph: installing
    # (instance attributes, a module's memo) is eager-only work that would break the graph.
    if torch.compiler.is_compiling() or module.__class__ in _seen_unsupported:
        return None
    if _first_call_exits:  # empty except during a first call or after one that raised
        left = _first_call_exits.pop(module, None)
        if left is not None:
            left.remove()  # its first call is over (here: torch may be iterating it there)
    from torch_geometric.nn import MessagePassing

    if not isinstance(module, MessagePassing) or _spec_for(module) is None:
        _seen_unsupported.add(module.__class__)
        return None
    if module not in _auto_installed and not is_accelerated(module):
        token = _install(module, None, None)
        if token is not None:
            _auto_installed[module] = token
            if token[3]:
                _first_call_in_memo_scope(module)
    return None


def _first_call_in_memo_scope(module) -> None:
    # torch picked this call's forward before the pre-hook ran, so PyG's forward runs once
    # more; its gcn_norm calls are answered from the memo all the same (the same bits, and
    # no CSR of an unsorted edge list that no later call uses). A forward hook of the layer,
    # also called when the forward raises, leaves the scope and removes itself: at once
    # normally; when the forward raised, at the layer's next call (torch is iterating the
    # layer's hooks then).
    if torch.compiler.is_compiling():
        return  # the memo stands aside under compile anyway
    scope = [gcn.memo_scope()]
    scope[0].__enter__()

    def leave(_module, _args, _result):
        if scope:
            scope.pop().__exit__(None, None, None)
        handle = _first_call_exits.pop(_module, None)
        if handle is not None:
            if sys.exc_info()[0] is None:
                handle.remove()
            else:
                _first_call_exits[_module] = handle

    _first_call_exits[module] = module.register_forward_hook(leave, always_call=True)


_seen_unsupported: set = set()
_first_call_exits: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _on_backend_change(backend: Optional[str]) -> None:
    global _global_hook
    if backend is not None and _global_hook is None:
        from torch.nn.modules.module import register_module_forward_pre_hook

        _global_hook = register_module_forward_pre_hook(_global_pre_hook)
    elif backend is None and _global_hook is not None:
        _global_hook.remove()
        _global_hook = None
        for module, left in list(_first_call_exits.items()):
            left.remove()
        _first_call_exits.clear()
        for module, token in list(_auto_installed.items()):
            _uninstall(module, token)
        _auto_installed.clear()
