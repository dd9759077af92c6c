"""Model surgery that runs an unmodified PyG model on one partition.

:func:`partition_model` attaches hooks to every ``MessagePassing`` layer of a
model and returns a :class:`PartitionedModel` handle whose :meth:`revert` removes
them again (the LayerSync ``apply``/``revert`` pattern).  While attached:

* a ``propagate`` (and ``edge_updater``) pre-hook replaces every node tensor the
  layer reads on the *source* side (``x_j``, ``alpha_j``, ...) by
  ``(owned + halo rows, owned rows)`` and sets ``size = (N_own + N_halo, N_own)``.
  The exchange therefore happens at the narrowest point the layer itself chose
  (after its linear transform in ``GCNConv``/``GATConv``), once per hop in
  multi-hop layers (``SGConv``, ``APPNP``, ``TAGConv``), and attention layers get
  the source-side attention terms of halo nodes;
* ``gcn_norm`` computes halo degrees through the exchange (see :mod:`.norm`), ``ChebConv``'s
  Laplacian the out-degrees of sources and a global ``lambda_max`` (see :mod:`.laplacian`);
* ``BatchNorm1d`` modules are synchronized (see :mod:`.batchnorm`), and PyG's
  cross-node normalizations (``GraphNorm``, ``PairNorm``, ...) always (see :mod:`.graphnorm`).

Between layers tensors hold only the rank's own nodes, so Linear, Dropout,
activations and per-node normalizations need nothing.

``torch.compile``: PyG's generated ``propagate`` skips its pre-hooks while compiling, which
would silently drop the halo.  Every partitioned layer therefore gets an instance-level
``propagate`` that dynamo does not trace (one graph break per message-passing call), so its
hooks run as in eager mode; the enter/leave hooks and the exchange are excluded likewise.
Everything between message-passing calls is compiled as usual.

Sparse adjacency inputs (``torch.sparse`` tensors, ``SparseTensor``) are refused with a clear
message: the engine's halo rows and degrees are built for the rank-local ``edge_index``.

With an :class:`~.aggregation.AggregationRouter` (``aggregation="pre"`` or ``"hybrid"``),
eligible layers are rewritten per call as :mod:`.aggregation` describes: the pre-hook switches
to the mode's edges and halo, a propagate forward hook adds the received partial aggregates
(and divides mean aggregations by the global in-degree).
"""
import math
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type

import torch
from torch import Tensor
from torch_geometric.nn import aggr as pyg_aggr
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn.conv import MessagePassing

from .. import compat
from .aggregation import PRE_LAYERS, AggregationRouter, pre_eligible, propagated_width
from .batchnorm import convert_batchnorm, revert_batchnorm
from .graphnorm import convert_cross_node_norms, revert_cross_node_norms
from .laplacian import wrap_chebyshev_norm
from .propagation import unwrap_label_propagation, wrap_label_propagation
from .context import ActiveLayer, current_layer, pop_layer, push_layer
from .exchange import HaloExchange
from .one_buffer import Received, exchange_one_buffer, one_buffer_applies, start_one_buffer
from ..kernels.split import SplitRows, split_accepted
from .norm import add_dispatcher, remove_dispatcher
from .agreement import Agreement
from .narrow_first import narrowable, narrowed_forward
from .reorder import reorderable, reordered_forward
from .static import StaticInputs
from .reverse import reverse_exchange, wrap_dir_gnn
from .support import TRAINING_REFUSED_LAYERS, UnsupportedLayerError, check_model

__all__ = ["PartitionedModel", "partition_model", "SparseAdjacencyError"]

_EAGER_FLAG = "_lightning_fullgraph_eager_propagate"


class SparseAdjacencyError(TypeError):
    r"""A partitioned layer received a sparse adjacency instead of ``edge_index``."""


def check_dense_edge_index(edge_index: Any, key: str) -> None:
    r"""Refuses sparse adjacency inputs of a partitioned layer, naming the fix."""
    layout = getattr(edge_index, "layout", torch.strided)
    if isinstance(edge_index, Tensor) and layout == torch.strided:
        return  # a [2, E] edge_index (plain Tensor or PyG's EdgeIndex)
    what = type(edge_index).__name__ + ("" if layout == torch.strided else f" ({layout})")
    raise SparseAdjacencyError(
        f"layer '{key}' received a sparse adjacency ({what}); partitioned execution adds "
        "halo rows and halo degrees to the rank-local edge_index, which a sparse matrix "
        "sized for the rank's own nodes cannot hold. Pass the batch's edge_index "
        "(and edge_weight) instead of a SparseTensor / torch.sparse adjacency, e.g. "
        "conv(x, batch.edge_index) rather than conv(x, batch.adj_t)")


def _eager(function: Callable) -> Callable:
    # torch.compile traces neither this call nor what it calls, so PyG runs its
    # propagate pre-hooks (the halo exchange) exactly as in eager mode.
    wrapped = torch.compiler.disable(function)
    setattr(wrapped, _EAGER_FLAG, True)
    return wrapped


@dataclass
class LayerState:
    r"""How one partitioned layer aggregates.

    Attributes:
        key (str): The layer's qualified name.
        candidate (str): Its mode when its inputs allow (``"post"`` if ineligible).
        mean (bool): Its mean aggregation runs as a sum divided by the in-degree.
        edge_args (Tuple[str, ...]): ``propagate`` arguments aligned with the edges.
        width (int, optional): Values per row it exchanges, as declared
            (:func:`~.aggregation.propagated_width`; for ``aggregation="auto"``).
    """
    key: str
    candidate: str = "post"
    mean: bool = False
    edge_args: Tuple[str, ...] = ()
    width: Optional[int] = None


@dataclass
class _Pending:
    mode: str
    exchange: HaloExchange
    point: str
    degree: Optional[Tensor]
    # The partials received with the halo rows (the one-buffer exchange), added after the
    # aggregation instead of the pre channel's collective.
    received: Optional[Any] = None


class PartitionedModel:
    r"""Handle of a model attached to a halo exchange; :meth:`revert` detaches it.

    Args:
        model (torch.nn.Module): The model; it is modified in place.
        exchange (HaloExchange): The rank's (post-aggregation) exchange.
        trusted_layers (Iterable[type]): Extra layer classes declared exact.
        sync_batchnorm (bool): Synchronize ``BatchNorm1d`` across ranks.
        router (AggregationRouter, optional): Pre/hybrid aggregation of eligible layers.
        static (StaticInputs, optional): Normalizations and aggregations of unchanged inputs
            computed once (see :mod:`.static`).
    """

    def __init__(self, model: torch.nn.Module, exchange: HaloExchange,
                 trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                 sync_batchnorm: bool = True,
                 router: Optional[AggregationRouter] = None,
                 static: Optional[StaticInputs] = None) -> None:
        self.model = model
        self.exchange = exchange
        self.router = router
        self.static = static
        self._static_wrapped: List[Any] = []
        self._forward_wrapped: List[Any] = []
        self._reverse: Optional[HaloExchange] = None
        self.layers: List[Tuple[str, MessagePassing]] = check_model(model, trusted_layers)
        # Layers whose halo comes through another exchange (conv_out of a DirGNNConv).
        self._exchanges: Dict[str, HaloExchange] = {}
        self.states: Dict[str, LayerState] = {}
        self._handles: List[Any] = []
        self._bn_swaps: List[Any] = []
        self._norm_swaps: List[Any] = []
        self._propagation: List[Any] = []
        self._edge_wrapped: List[Any] = []
        self._norm_wrapped: List[Any] = []
        self._propagate_wrapped: List[Any] = []
        self._aggr_swaps: List[Tuple[MessagePassing, Any]] = []
        self._attached = False
        self._sync_batchnorm = sync_batchnorm
        self._attach()

    # -- apply / revert ------------------------------------------------------------
    def _state(self, key: str, layer: MessagePassing) -> LayerState:
        candidate = self.router.candidate(layer) if self.router is not None else "post"
        if key in self._exchanges:
            candidate = "post"  # a reversed graph has no pre plan
        if candidate == "post":
            return LayerState(key)
        mean = isinstance(layer.aggr_module, pyg_aggr.MeanAggregation)
        if mean:  # partial aggregates are sums; the owner divides by the global in-degree
            self._aggr_swaps.append((layer, layer.aggr_module))
            layer.aggr_module = pyg_aggr.SumAggregation()
        cls = next(c for c in PRE_LAYERS if isinstance(layer, c))
        return LayerState(key, candidate, mean, PRE_LAYERS[cls], propagated_width(layer))

    def _exchange_of(self, key: str) -> HaloExchange:
        return self._exchanges.get(key, self.exchange)

    def _wrap_dir_gnn(self) -> None:
        for name, module in self.model.named_modules():
            if not isinstance(module, pyg_conv.DirGNNConv):
                continue
            if self.router is None:
                raise UnsupportedLayerError(
                    f"'{name}' (DirGNNConv) needs the partition's outgoing cut edges: attach "
                    "the model through FullGraphEngine")
            if self._reverse is None:
                self._reverse = reverse_exchange(self.exchange, self.router.partition)
            self._exchanges[f"{name}.conv_out" if name else "conv_out"] = self._reverse
            ours = wrap_dir_gnn(module, name or type(module).__name__, self.router,
                                self._reverse)
            self._forward_wrapped.append((module, module.__dict__.get("forward"), ours))
            module.__dict__["forward"] = ours

    def _attach(self) -> None:
        self._wrap_dir_gnn()
        for name, layer in self.layers:
            key = name or type(layer).__name__
            state = self.states[key] = self._state(key, layer)
            self._handles += [
                layer.register_forward_pre_hook(self._enter(state)),
                layer.register_forward_hook(_leave, always_call=True),
                layer.register_propagate_forward_pre_hook(
                    self._extend_hook(key, compat.propagate_source_args(layer), "propagate",
                                      state)),
            ]
            if state.candidate != "post" or state.mean:
                self._handles.append(layer.register_propagate_forward_hook(_combine))
            self._wrap_propagate(layer)
            edge_args = compat.edge_update_source_args(layer)
            if edge_args:
                self._wrap_edge_updater(layer, key, edge_args)
            if isinstance(layer, pyg_conv.ChebConv):
                self._wrap_chebyshev_norm(layer, key)
        if self._sync_batchnorm:
            self._bn_swaps = convert_batchnorm(self.model, self.exchange.group)
        # Not optional like BatchNorm sync: unsynchronized, these norms are simply wrong.
        self._norm_swaps = convert_cross_node_norms(self.model, self.exchange.group)
        self._propagation = wrap_label_propagation(self.model, self.exchange.group,
                                                   self.exchange.timeout)
        add_dispatcher()
        # Given back by revert(), or when the model is collected without one: PyG's
        # gcn_norm is routed only while an attached model exists.
        self._dispatcher = weakref.finalize(self.model, remove_dispatcher)
        self._dispatcher.atexit = False
        self._attached = True
        self._wrap_reordered()
        self.wrap_static()

    def _wrap_reordered(self) -> None:
        agreement = Agreement(self.exchange.group, "aggregation order", self.exchange.timeout)
        own_hooks = lambda: {handle.id for handle in self._handles}  # noqa: E731
        for name, layer in self.layers:
            if narrowable(layer) and (name or type(layer).__name__) not in self._exchanges:
                ours = narrowed_forward(layer, name or type(layer).__name__, layer.forward,
                                        agreement, own_hooks, self.static)
                self._forward_wrapped.append((layer, layer.__dict__.get("forward"), ours))
                layer.__dict__["forward"] = ours
        if self.static is None:
            return
        for name, layer in self.layers:
            if reorderable(layer) and (name or type(layer).__name__) not in self._exchanges:
                ours = reordered_forward(layer, name or type(layer).__name__, layer.forward,
                                         self.static, agreement, own_hooks)
                self._forward_wrapped.append((layer, layer.__dict__.get("forward"), ours))
                layer.__dict__["forward"] = ours

    def wrap_static(self) -> None:
        r"""Puts the static-input memo around the ``propagate`` of every eligible layer
        (outermost: call again after another wrapper, e.g. the kernels', was added)."""
        if self.static is None or self._static_wrapped:
            return
        for name, layer in self.layers:
            # Static reuse assumes the partition's in-edges: not the reversed graph's.
            if pre_eligible(layer) and (name or type(layer).__name__) not in self._exchanges:
                ours = _eager(_static_propagate(layer, name or type(layer).__name__,
                                                layer.propagate, self.static))
                self._static_wrapped.append((layer, layer.__dict__.get("propagate"), ours))
                layer.__dict__["propagate"] = ours

    def unwrap_static(self) -> None:
        r"""Removes what :meth:`wrap_static` added."""
        for layer, had_own, ours in reversed(self._static_wrapped):
            _restore(layer, "propagate", had_own, ours)
        self._static_wrapped.clear()

    def revert(self) -> torch.nn.Module:
        r"""Removes every hook and swap; returns the model as it was (parameters kept)."""
        if not self._attached:
            return self.model
        self.unwrap_static()
        for layer, had_own, ours in reversed(self._forward_wrapped):
            _restore(layer, "forward", had_own, ours)
        self._forward_wrapped.clear()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for layer, had_own, ours in self._edge_wrapped:
            _restore(layer, "edge_updater", had_own, ours)
        self._edge_wrapped.clear()
        for layer, had_own, ours in self._norm_wrapped:
            _restore(layer, "__norm__", had_own, ours)
        self._norm_wrapped.clear()
        for layer, had_own, ours in self._propagate_wrapped:
            _restore(layer, "propagate", had_own, ours)
        self._propagate_wrapped.clear()
        for layer, original in reversed(self._aggr_swaps):
            layer.aggr_module = original
        self._aggr_swaps.clear()
        revert_cross_node_norms(self._norm_swaps)
        unwrap_label_propagation(self._propagation)
        self._norm_swaps = []
        revert_batchnorm(self._bn_swaps)
        self._bn_swaps = []
        self._dispatcher()  # remove_dispatcher, once
        self._attached = False
        return self.model

    @property
    def attached(self) -> bool:
        return self._attached

    # -- hooks ---------------------------------------------------------------------
    def _enter(self, state: LayerState):
        @torch.compiler.disable
        def hook(module, args):
            if module.training and type(module).__name__ in TRAINING_REFUSED_LAYERS:
                # Every rank is in the same mode: all raise here, before any collective.
                raise UnsupportedLayerError(
                    f"'{state.key}' ({type(module).__name__}) "
                    f"{TRAINING_REFUSED_LAYERS[type(module).__name__]}")
            first = next((a for a in args if isinstance(a, Tensor) and a.dim() > 0), None)
            push_layer(ActiveLayer(state.key, self._exchange_of(state.key), owner=self,
                                   state=state, training=module.training,
                                   input_width=None if first is None
                                   else math.prod(first.shape[1:])))
        return hook

    def _wrap_propagate(self, layer: MessagePassing) -> None:
        current = layer.__dict__.get("propagate")
        if getattr(current, _EAGER_FLAG, False):
            return
        ours = _eager(layer.propagate)
        self._propagate_wrapped.append((layer, current, ours))
        layer.__dict__["propagate"] = ours

    def _wrap_chebyshev_norm(self, layer: MessagePassing, key: str) -> None:
        # ChebConv's Laplacian needs source out-degrees and a global lambda_max.
        ours = wrap_chebyshev_norm(layer, key, self)
        self._norm_wrapped.append((layer, layer.__dict__.get("__norm__"), ours))
        layer.__dict__["__norm__"] = ours

    def _wrap_edge_updater(self, layer: MessagePassing, key: str,
                           source_args: Tuple[str, ...]) -> None:
        # PyG runs edge-update pre-hooks after collecting ``alpha_j`` from ``alpha``,
        # too late to add halo rows, so the instance's ``edge_updater`` is wrapped.
        original = layer.edge_updater
        rewrite = self._extend_hook(key, source_args, "edge_update")

        def edge_updater(edge_index, size=None, **kwargs):
            edge_index, size, kwargs = rewrite(layer, (edge_index, size, kwargs))
            return original(edge_index, size=size, **kwargs)

        ours = _eager(edge_updater)
        self._edge_wrapped.append((layer, layer.__dict__.get("edge_updater"), ours))
        layer.__dict__["edge_updater"] = ours

    def _extend_hook(self, key: str, source_args: Tuple[str, ...], what: str,
                     state: Optional[LayerState] = None):
        exchange = self._exchange_of(key)

        def hook(module: MessagePassing, inputs):
            edge_index, size, kwargs = inputs
            check_dense_edge_index(edge_index, key)
            n_own, n_all = exchange.num_owned, exchange.num_local
            active = current_layer()
            call = 0
            if active is not None:
                call, active.calls = active.calls, active.calls + 1
            if state is not None and state.candidate != "post":
                phase = "train" if module.training else "eval"
                mode = self._mode_of_call(f"{key}.{what}{call}.{phase}", edge_index, kwargs,
                                          state, _source_width(module, kwargs, source_args))
                if mode != "post":
                    return self._rewrite(module, mode, f"{key}.{what}{call}", edge_index, size,
                                         kwargs, source_args, state, active)
            if state is not None and state.mean and active is not None:
                # Post-aggregated mean as a sum: divide by this call's in-degree.
                degree = torch.bincount(edge_index[1], minlength=n_own)
                active.pending.append(_Pending("post", exchange, "", degree))
            new_kwargs = dict(kwargs)
            for arg in source_args:
                value = kwargs.get(arg)
                point = f"{key}.{what}{call}.{arg}"
                if isinstance(value, Tensor):
                    new_kwargs[arg] = (self._extend(exchange, value, module, key, point), value)
                elif isinstance(value, (tuple, list)) and len(value) == 2 \
                        and isinstance(value[0], Tensor):
                    new_kwargs[arg] = (self._extend(exchange, value[0], module, key, point),
                                       value[1])
            if size is not None and tuple(size) not in ((n_own, n_own), (n_all, n_own)):
                raise ValueError(f"layer '{key}': size={tuple(size)} does not match the "
                                 f"partition ({n_own} owned nodes)")
            return edge_index, (n_all, n_own), new_kwargs

        return hook

    # -- pre / hybrid ---------------------------------------------------------------
    def _mode_of_call(self, point: str, edge_index: Any, kwargs: Dict[str, Any],
                      state: LayerState, width: Optional[Tuple[int, torch.dtype]]) -> str:
        router = self.router
        made = router.graph_mode(edge_index)
        if made is not None:  # the engine's gcn_norm made this edge list: already decided
            return made
        if router.post_held:  # step aside's arm without the mode: nothing to vouch for
            return "post"
        return router.decide(point, state.candidate, self._vouched(edge_index, kwargs, state),
                             state.key, *(width or (None, )))

    def _vouched(self, edge_index: Any, kwargs: Dict[str, Any], state: LayerState) -> bool:
        r"""Whether the call sees the partition's in-edges and edge values senders hold."""
        if not self.router.is_in_edges(edge_index):
            return False
        return all(kwargs.get(arg) is None or self.router.edge_attr_key(kwargs[arg]) is not None
                   for arg in state.edge_args)

    def _rewrite(self, module: MessagePassing, mode: str, point: str, edge_index: Tensor,
                 size: Any, kwargs: Dict[str, Any], source_args: Tuple[str, ...], state: LayerState,
                 active: Optional[ActiveLayer]):
        router = self.router
        ex = router.exchanges[mode]
        new_kwargs = dict(kwargs)
        if router.graph_mode(edge_index) is None:
            # The in-edge list: switch to the mode's edges and their values.
            for arg in state.edge_args:
                value = kwargs.get(arg)
                new_kwargs[arg] = router.mode_edge_values(
                    mode, value, router.edge_attr_key(value) if value is not None else None)
            edge_index = router.mode_edge_index(mode, edge_index.device)
        degree = router.in_degree(edge_index.device, torch.long) if state.mean else None
        if active is None:
            raise RuntimeError(f"layer '{state.key}': propagate called outside its forward")
        sources = [arg for arg in source_args if isinstance(_own_rows(kwargs.get(arg)), Tensor)]
        if len(sources) == 1 and one_buffer_applies(ex.policy, f"{point}.{sources[0]}",
                                                    f"{point}.pre", HaloExchange._training()):
            done = self._one_buffer(ex, mode, point, sources[0], edge_index, new_kwargs,
                                    state, active, degree)
            if done is not None:
                return done
        for arg in source_args:
            value = kwargs.get(arg)
            own = value[0] if isinstance(value, (tuple, list)) else value
            if isinstance(own, Tensor):
                # Eligible layers read sources only (x_j): no destination rows are needed.
                new_kwargs[arg] = (ex.extend(own, key=f"{point}.{arg}"), None)
        active.pending.append(_Pending(mode, ex, point, degree))
        return edge_index, (ex.num_local, ex.num_targets), new_kwargs

    def _one_buffer(self, ex: HaloExchange, mode: str, point: str, arg: str, edge_index: Tensor,
                    kwargs: Dict[str, Any], state: LayerState, active: ActiveLayer,
                    degree: Optional[Tensor]):
        r"""The sender's partial aggregates computed before the aggregation and sent with the
        halo rows in one collective (:mod:`.one_buffer`); the layer aggregates its in-edges.
        ``None`` (nothing changed) where the partials would not have the rows' dtype."""
        own = _own_rows(kwargs[arg])
        values = [(name, kwargs[name]) for name in state.edge_args
                  if isinstance(kwargs.get(name), Tensor)]
        if len(values) > 1 or (values and (values[0][1].requires_grad or torch.promote_types(
                own.dtype, values[0][1].dtype) != own.dtype)):
            # Partials of another dtype than the rows (bfloat16 rows, fp32 weights under
            # autocast) would be rounded to the rows' on the wire, and a learned edge weight's
            # gradient is PyG's message backward's: two collectives instead. The same on
            # every rank (dtypes and flags, not values).
            return None
        in_edges, in_pos, pre_edges, pre_pos = self.router.split_pre_edges(edge_index)
        weight = None
        for name, edge_value in values:  # aligned with the edges: split alike
            weight = edge_value.index_select(0, pre_pos)
            kwargs[name] = edge_value.index_select(0, in_pos)
        if ex.overlap and own.dim() == 2 and split_accepted():
            # The owned edges aggregate while rows and partials travel (either way every
            # rank makes the same collectives, so ranks may differ here).
            local, complete, received = start_one_buffer(
                ex, own, pre_edges, weight, f"{point}.{arg}")
            kwargs[arg] = (SplitRows(local, complete, ex.num_halo), None)
        else:
            rows, received = exchange_one_buffer(ex, own, pre_edges, weight, f"{point}.{arg}")
            kwargs[arg] = (rows, None)
        active.pending.append(_Pending(mode, ex, point, degree, received))
        return in_edges, (ex.num_local, ex.num_owned), kwargs

    def _extend(self, exchange: HaloExchange, value: Tensor, module: MessagePassing, key: str,
                point: str) -> Tensor:
        n_own, n_all = exchange.num_owned, exchange.num_local
        dim = module.node_dim % value.dim() if value.dim() > 1 else 0
        rows = value.size(dim)
        if rows == n_all and n_all != n_own:
            return value  # already carries the halo (e.g. a second hook)
        if rows != n_own:
            raise ValueError(
                f"layer '{key}' received a node tensor with {rows} rows "
                f"but this rank owns {n_own} nodes: feed the model the rank-local "
                "batch (batch.x of the partition), not the global graph")
        return exchange.extend(value, key=point, dim=dim)


def _own_rows(value: Any) -> Any:
    r"""The source rows of a ``propagate`` argument (``x`` or ``(x_src, x_dst)``)."""
    return value[0] if isinstance(value, (tuple, list)) and value else value


def _source_width(module: MessagePassing, kwargs: Dict[str, Any],
                  source_args: Tuple[str, ...]) -> Optional[Tuple[int, torch.dtype]]:
    r"""Values per row and dtype of the first source rows a ``propagate`` call exchanges."""
    for arg in source_args:
        value = kwargs.get(arg)
        own = value[0] if isinstance(value, (tuple, list)) and value else value
        if isinstance(own, Tensor) and own.dim() > 0:
            # From the shape alone, not numel // rows: a rank without rows must decide as
            # the others do ("auto" picks its mode from this width on every rank).
            dim = module.node_dim % own.dim() if own.dim() > 1 else 0
            return math.prod(own.shape[:dim] + own.shape[dim + 1:]), own.dtype
    return None


def _static_propagate(layer: MessagePassing, key: str, inner: Callable,
                      static: StaticInputs) -> Callable:
    def propagate(*args, **kwargs):
        active = current_layer()
        if active is None:
            return inner(*args, **kwargs)
        call = active.calls
        phase = "train" if layer.training else "eval"

        def fresh():
            # What may be kept is computed from current rows, as evaluation exchanges them
            # (no halo cache, pipeline or boundary sampling).
            training, active.training = active.training, False
            try:
                return inner(*args, **kwargs)
            finally:
                active.training = training

        out = static.aggregation(f"{key}.propagate{call}{active.variant}.{phase}", (args, kwargs),
                                 lambda: inner(*args, **kwargs), phase=phase, fresh=fresh)
        if active.calls == call:  # reused: no pre-hook ran, keep the hop numbering
            active.calls += 1
        return out
    return propagate


@torch.compiler.disable
def _leave(module, args, output):
    pop_layer()


@torch.compiler.disable
def _combine(module, inputs, output):
    r"""After aggregation: add the received partial aggregates, finish a mean."""
    active = current_layer()
    if active is None or not active.pending:
        return output
    pending = active.pending.pop(0)
    out = output
    if pending.received is None and pending.mode == "post" and pending.degree is None:
        return out  # nothing to add or divide (a post layer)
    # The aggregation's output (pre layers keep PyG's identity `update`: pre_eligible) is
    # fresh and replaced by the result: add into it and divide it in place (no copy of the
    # owned rows), unless a propagate hook that ran before this one (the user's) may have
    # kept it; then the first step makes a new tensor, which the next may change.
    hooks = list(compat.hook_dicts(module, "propagate").values())
    ours = bool(hooks) and hooks[0] is _combine
    if pending.received is not None:  # the partials came with the halo rows
        received = pending.received
        if isinstance(received, Received):  # overlapped: complete by now
            received = received.rows
        index, rows = pending.exchange.plan.pre.recv_index, received.to(out.dtype)
        out = out.index_add_(0, index, rows) if ours else out.index_add(0, index, rows)
        ours = True
    elif pending.mode != "post":
        out = pending.exchange.reduce(out, key=f"{pending.point}.pre", in_place=ours)
        ours = True
    if pending.degree is not None:
        degree = pending.degree.clamp(min=1).to(out.dtype).view((-1, ) + (1, ) * (out.dim() - 1))
        out = out.div_(degree) if ours else out / degree
    return out


def _restore(layer: MessagePassing, name: str, had_own: Any, ours: Callable) -> None:
    if layer.__dict__.get(name) is not ours:
        return  # replaced since (e.g. by PyG's explain setter): leave the newer one
    if had_own is None:
        del layer.__dict__[name]
    else:
        layer.__dict__[name] = had_own


def partition_model(model: torch.nn.Module, exchange: HaloExchange,
                    trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                    sync_batchnorm: bool = True,
                    router: Optional[AggregationRouter] = None,
                    static: Optional[StaticInputs] = None) -> PartitionedModel:
    r"""Attaches :obj:`model` to a halo exchange; see :class:`PartitionedModel`."""
    return PartitionedModel(model, exchange, trusted_layers, sync_batchnorm, router, static)
