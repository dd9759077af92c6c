r"""``SAGEConv`` and ``GraphConv`` narrowing their output: transform first, aggregate after.

Both layers compute :math:`\mathrm{lin}(\mathrm{agg}_j\, x_j) + \mathrm{lin\_root}(x_i)`:
their exchange carries the *input* rows (``in_channels`` wide) and their aggregation sums
them.  With a linear aggregation (``sum``/``add``/``mean``, a message that is :math:`x_j`
or :math:`w_{ij} x_j`), :math:`\mathrm{agg}_j(x_j)\,W^\top = \mathrm{agg}_j(x_j W^\top)`, and
an empty neighbourhood gives zero either way; so when the layer is narrower than its input
(``out_channels < in_channels``, e.g. a last layer mapping hidden features to classes) the
engine runs it as ``propagate(x @ W.T) + bias + lin_root(x)``: the halo rows, the pre
partials and the aggregation are then ``out_channels`` wide instead of ``in_channels``, in
both directions.  With overlap, ``lin_root(x)`` runs while the halo is in flight
(:func:`~lightning_fullgraph.kernels.split.while_in_flight`), unless a hook observes it.  The
result equals the layer's own within floating-point reassociation (DGL's ``SAGEConv`` takes
the same order, ``lin_before_mp``, for the same reason).

The order changes what crosses the wire, so it is agreed by all ranks, once per layer and
phase, from what each rank sees at its first call: the layer's own ``forward`` (not a
subclass's) and what the kernels' :func:`~lightning_fullgraph.kernels.sage_reorder.narrows`
requires of one process's call -- a linear aggregation, a narrower output, nothing that would
observe the rows aggregated (explain mode, ``decomposed_layers``, a hook of the user on
``propagate``, ``message`` or ``aggregate`` or on the linear map), no autocast (which rounds
the two orders at different places), and the layer order ``"auto"``
(``kernels.set_layer_order("pyg")`` keeps PyG's order here too).  A layer that later gains
such an observer takes its own order again on every rank (the ranks agree on it again, so it
must gain it on every rank alike, as training code runs; one rank alone ends in a
:class:`~lightning_fullgraph.engine.CollectiveError`, not in rows of two widths); one that did
not qualify at its first call keeps its own order.  An input without gradient is aggregated as it is while the engine's
static-input memo may keep its aggregation (the raw features: exchanged once, then reused);
once the cache gives up on it (input dropout makes a new tensor every step), it narrows.
"""
from contextlib import nullcontext
from typing import Any, Callable, Collection, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.conv import GraphConv, SAGEConv

from ..compat import call_is_observed
from ..kernels.sage_reorder import narrows
from ..kernels.split import InFlight, while_in_flight
from .agreement import Agreement
from .static import StaticInputs

__all__ = ["narrowable", "narrowed_forward"]

#: The layers, and the attribute names of their neighbour map and root map.
_MAPS = {SAGEConv: ("lin_l", "lin_r"), GraphConv: ("lin_rel", "lin_root")}


def _maps(layer: Any):
    return next(names for base, names in _MAPS.items() if isinstance(layer, base))


def narrowable(layer: Any) -> bool:
    r"""Whether :obj:`layer` is a ``SAGEConv`` or ``GraphConv`` with PyG's own ``forward``, a
    linear aggregation and a neighbour map narrower than its input (whether a call narrows
    also depends on its input and observers, see the module docstring).  Other layers keep
    their forward, so the kernels' own forward may go there (:mod:`..kernels.sage`)."""
    if not (any(isinstance(layer, base) and type(layer).forward is base.forward
                for base in _MAPS)
            and isinstance(getattr(layer, "aggr", None), str)
            and layer.aggr in ("sum", "add", "mean")):
        return False
    weight = getattr(getattr(layer, _maps(layer)[0], None), "weight", None)
    return (isinstance(weight, torch.nn.Parameter)
            and not isinstance(weight, torch.nn.parameter.UninitializedTensorMixin)
            and weight.size(0) < weight.size(1))


def narrowed_forward(layer: Any, key: str, original: Callable, agreement: Agreement,
                     own_hooks: Callable[[], Collection[int]],
                     static: Optional[StaticInputs] = None) -> Callable:
    r"""A ``forward`` for :obj:`layer` that transforms its input before aggregating it when
    that narrows the rows (see the module docstring); otherwise calls :obj:`original`.

    Args:
        layer: A layer :func:`narrowable` accepts.
        key (str): The layer's name (its agreement points).
        original (Callable): The layer's forward as it was.
        agreement (Agreement): Where the ranks agree on the order.
        own_hooks (Callable): The ids of the hooks the engine put on the layer (not the
            user's: they observe nothing).
        static (StaticInputs, optional): The engine's static-input memo: an input it may keep
            the aggregation of is aggregated as it is (once, then reused).
    """
    neighbour_name, root_name = _maps(layer)
    is_sage = isinstance(layer, SAGEConv)

    def local_ok(x: Any) -> bool:
        source = x[0] if isinstance(x, tuple) else x
        return narrows(layer, source, getattr(layer, neighbour_name), own_hooks=own_hooks())

    def forward(x: Any, edge_index: Any, *args: Any, **kwargs: Any) -> Tensor:
        phase = "train" if layer.training else "eval"
        source = x[0] if isinstance(x, tuple) else x
        # Both agreements are taken at the first call on every rank (then held, without
        # communication), whatever either answers: the ranks call the same collectives.  A
        # rank that can no longer narrow (an observer added since) never acts alone: the
        # held answer is agreed again (see :meth:`Agreement.decide`), so the rows every
        # rank sends keep one width.
        narrow = agreement.decide(f"{key}.narrow.{phase}", local_ok(x), revocable=True)
        # An input without gradient on every rank may be the same every step (the raw
        # features): the static-input memo then exchanges and aggregates it once, which beats
        # narrowing it every step.  The cache gives up on it after its misses (input dropout
        # makes a new tensor every step); that, too, every rank decides alike.  Evaluation
        # follows training's answer once there is one (under no_grad every input lacks a
        # gradient; a hidden layer's is new every call all the same).
        trained = agreement.known(f"{key}.narrow.train.input") is not None
        basis = "train" if trained else phase
        no_grad = agreement.decide(f"{key}.narrow.{basis}.input",
                                   isinstance(source, Tensor) and not source.requires_grad)
        keep = (no_grad and static is not None and static.enabled
                and not static.gave_up(f"{key}.propagate0.{basis}"))
        if not narrow or keep:
            return original(x, edge_index, *args, **kwargs)
        if isinstance(x, Tensor):
            x = (x, x)
        if is_sage:
            size = args[0] if args else kwargs.get("size")
            if layer.project and hasattr(layer, "lin"):
                x = (layer.lin(x[0]).relu(), x[1])
            extra = {}
        else:  # GraphConv(x, edge_index, edge_weight=None, size=None)
            names = ("edge_weight", "size")
            given = dict(zip(names, args), **kwargs)
            size = given.get("size")
            extra = {"edge_weight": given.get("edge_weight")}
        lin = getattr(layer, neighbour_name)
        source = None if x[0] is None else F.linear(x[0], lin.weight)
        x_r = x[1]
        root_map = getattr(layer, root_name)
        root = None
        if x_r is not None and (not is_sage or layer.root_weight):
            root = InFlight(lambda: root_map(x_r))
        # The root term needs no halo rows: with overlap it is computed while the halo is in
        # flight (..kernels.split), unless a hook would see it called at another time.
        with while_in_flight(root) if root is not None and not call_is_observed(root_map) \
                else nullcontext():
            out = layer.propagate(edge_index, x=(source, x[1]), size=size, **extra)
        if lin.bias is not None:
            out = out + lin.bias
        if root is not None:
            out = out + root.run()
        if is_sage and layer.normalize:
            out = F.normalize(out, p=2., dim=-1)
        return out

    return torch.compiler.disable(forward)
