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
* ``gcn_norm`` computes halo degrees through the exchange (see :mod:`.norm`);
* ``BatchNorm1d`` modules are synchronized (see :mod:`.batchnorm`).

Between layers tensors hold only the rank's own nodes, so Linear, Dropout,
activations and per-node normalizations need nothing.

``torch.compile``: PyG's generated ``propagate`` skips its pre-hooks while compiling, which
would silently drop the halo.  Every partitioned layer therefore gets an instance-level
``propagate`` that dynamo does not trace (one graph break per message-passing call), so its
hooks run as in eager mode; the enter/leave hooks and the exchange are excluded likewise.
Everything between message-passing calls is compiled as usual.

Sparse adjacency inputs (``torch.sparse`` tensors, ``SparseTensor``) are refused with a clear
message: the engine's halo rows and degrees are built for the rank-local ``edge_index``.
"""
from typing import Any, Callable, Iterable, List, Set, Tuple, Type

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing

from .. import compat
from .batchnorm import convert_batchnorm, revert_batchnorm
from .context import ActiveLayer, current_layer, pop_layer, push_layer
from .exchange import HaloExchange
from .norm import patch_gcn_norm, unpatch_gcn_norm
from .support import check_model

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


class PartitionedModel:
    r"""Handle of a model attached to a halo exchange; :meth:`revert` detaches it.

    Args:
        model (torch.nn.Module): The model; it is modified in place.
        exchange (HaloExchange): The rank's exchange.
        trusted_layers (Iterable[type]): Extra layer classes declared exact.
        sync_batchnorm (bool): Synchronize ``BatchNorm1d`` across ranks.
    """

    def __init__(self, model: torch.nn.Module, exchange: HaloExchange,
                 trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                 sync_batchnorm: bool = True) -> None:
        self.model = model
        self.exchange = exchange
        self.layers: List[Tuple[str, MessagePassing]] = check_model(model, trusted_layers)
        self._handles: List[Any] = []
        self._bn_swaps: List[Any] = []
        self._edge_wrapped: List[Any] = []
        self._propagate_wrapped: List[Any] = []
        self._attached = False
        self._sync_batchnorm = sync_batchnorm
        self._attach()

    # -- apply / revert ------------------------------------------------------------
    def _attach(self) -> None:
        for name, layer in self.layers:
            key = name or type(layer).__name__
            self._handles += [
                layer.register_forward_pre_hook(self._enter(key)),
                layer.register_forward_hook(_leave, always_call=True),
                layer.register_propagate_forward_pre_hook(
                    self._extend_hook(key, compat.propagate_source_args(layer), "propagate")),
            ]
            self._wrap_propagate(layer)
            edge_args = compat.edge_update_source_args(layer)
            if edge_args:
                self._wrap_edge_updater(layer, key, edge_args)
        if self._sync_batchnorm:
            self._bn_swaps = convert_batchnorm(self.model, self.exchange.group)
        patch_gcn_norm()
        self._attached = True

    def revert(self) -> torch.nn.Module:
        r"""Removes every hook and swap; returns the model as it was (parameters kept)."""
        if not self._attached:
            return self.model
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for layer, had_own, ours in self._edge_wrapped:
            _restore(layer, "edge_updater", had_own, ours)
        self._edge_wrapped.clear()
        for layer, had_own, ours in self._propagate_wrapped:
            _restore(layer, "propagate", had_own, ours)
        self._propagate_wrapped.clear()
        revert_batchnorm(self._bn_swaps)
        self._bn_swaps = []
        unpatch_gcn_norm()
        self._attached = False
        return self.model

    @property
    def attached(self) -> bool:
        return self._attached

    # -- hooks ---------------------------------------------------------------------
    def _enter(self, key: str):
        @torch.compiler.disable
        def hook(module, args):
            push_layer(ActiveLayer(key, self.exchange))
        return hook

    def _wrap_propagate(self, layer: MessagePassing) -> None:
        current = layer.__dict__.get("propagate")
        if getattr(current, _EAGER_FLAG, False):
            return
        ours = _eager(layer.propagate)
        self._propagate_wrapped.append((layer, current, ours))
        layer.__dict__["propagate"] = ours

    def _wrap_edge_updater(self, layer: MessagePassing, key: str, source_args: Set[str]) -> None:
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

    def _extend_hook(self, key: str, source_args: Set[str], what: str):
        exchange = self.exchange

        def hook(module: MessagePassing, inputs):
            edge_index, size, kwargs = inputs
            check_dense_edge_index(edge_index, key)
            n_own, n_all = exchange.num_owned, exchange.num_local
            active = current_layer()
            call = 0
            if active is not None:
                call, active.calls = active.calls, active.calls + 1
            new_kwargs = dict(kwargs)
            for arg in source_args:
                value = kwargs.get(arg)
                point = f"{key}.{what}{call}.{arg}"
                if isinstance(value, Tensor):
                    new_kwargs[arg] = (self._extend(value, module, key, point), value)
                elif isinstance(value, (tuple, list)) and len(value) == 2 \
                        and isinstance(value[0], Tensor):
                    new_kwargs[arg] = (self._extend(value[0], module, key, point),
                                       value[1])
            if size is not None and tuple(size) not in ((n_own, n_own), (n_all, n_own)):
                raise ValueError(f"layer '{key}': size={tuple(size)} does not match the "
                                 f"partition ({n_own} owned nodes)")
            return edge_index, (n_all, n_own), new_kwargs

        return hook

    def _extend(self, value: Tensor, module: MessagePassing, key: str, point: str) -> Tensor:
        n_own, n_all = self.exchange.num_owned, self.exchange.num_local
        dim = module.node_dim % value.dim() if value.dim() > 1 else 0
        rows = value.size(dim)
        if rows == n_all and n_all != n_own:
            return value  # already carries the halo (e.g. a second hook)
        if rows != n_own:
            raise ValueError(
                f"layer '{key}' received a node tensor with {rows} rows "
                f"but this rank owns {n_own} nodes: feed the model the rank-local "
                "batch (batch.x of the partition), not the global graph")
        return self.exchange.extend(value, key=point, dim=dim)


@torch.compiler.disable
def _leave(module, args, output):
    pop_layer()


def _restore(layer: MessagePassing, name: str, had_own: Any, ours: Callable) -> None:
    if layer.__dict__.get(name) is not ours:
        return  # replaced since (e.g. by PyG's explain setter): leave the newer one
    if had_own is None:
        del layer.__dict__[name]
    else:
        layer.__dict__[name] = had_own


def partition_model(model: torch.nn.Module, exchange: HaloExchange,
                    trusted_layers: Iterable[Type[torch.nn.Module]] = (),
                    sync_batchnorm: bool = True) -> PartitionedModel:
    r"""Attaches :obj:`model` to a halo exchange; see :class:`PartitionedModel`."""
    return PartitionedModel(model, exchange, trusted_layers, sync_batchnorm)
