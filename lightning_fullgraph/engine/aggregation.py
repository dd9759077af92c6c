r"""Post, pre and hybrid aggregation of unmodified PyG layers (SuperGCN's pre/post).

With ``aggregation="post"`` every cut edge's source row crosses the wire (the halo exchange).
With ``"pre"`` or ``"hybrid"`` some cut edges are aggregated by the *sender* into a partial
row per remote destination (a *pre slot*), which is added into the destination's row by its
owner; ``"hybrid"`` picks, per rank pair, the exact minimum vertex cover of the cut edges, so
no pair sends more rows than either pure scheme (see :mod:`lightning_fullgraph.partition.plan`).

A layer can be pre-aggregated when its message is a source row times an edge scalar and its
aggregation is a sum or a mean: :data:`PRE_LAYERS`.  The engine then rewrites the layer's
``propagate`` call: the rank's edge list becomes the mode's (in-edges minus those aggregated
by their senders, plus this rank's outgoing pre edges into pre slots), sources get the mode's
(smaller) halo, and after aggregation :meth:`HaloExchange.reduce` adds the pre slots into their
owners' rows.  A mean aggregation runs as a sum divided by the destination's *global* in-degree.

This is exact only if the call sees the rank's own in-edge list and edge values the sender
also holds (the partition's edge attributes, or weights from the engine's ``gcn_norm``).  A call
whose inputs the engine cannot vouch for (an edge list changed by the user, computed edge
weights, edge dropout) runs post-aggregated instead.  That choice changes what crosses the wire,
so it is agreed by all ranks (one all-reduce the first time each exchange point runs).
"""
from typing import Any, Dict, Optional, Tuple

import torch
from torch import Tensor
from torch_geometric.nn import aggr as pyg_aggr
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn.conv import MessagePassing

from .agreement import Agreement

__all__ = ["MODES", "PRE_LAYERS", "AggregationRouter", "pre_eligible"]

MODES = ("post", "pre", "hybrid")

#: Layers whose message is ``x_j`` times an edge scalar, with the ``propagate`` arguments that
#: carry that scalar (aligned with the edges).
PRE_LAYERS: Dict[type, Tuple[str, ...]] = {
    pyg_conv.GCNConv: ("edge_weight", ),
    pyg_conv.SAGEConv: (),
    pyg_conv.GraphConv: ("edge_weight", ),
    pyg_conv.GINConv: (),
    pyg_conv.SGConv: ("edge_weight", ),
    pyg_conv.APPNP: ("edge_weight", ),
    pyg_conv.TAGConv: ("edge_weight", ),
    pyg_conv.GCN2Conv: ("edge_weight", ),
}
_SUM_OR_MEAN = (pyg_aggr.SumAggregation, pyg_aggr.MeanAggregation)


def pre_eligible(layer: MessagePassing) -> bool:
    r"""Whether :obj:`layer` can be pre-aggregated (message ``x_j * w``, sum or mean)."""
    cls = next((c for c in PRE_LAYERS if isinstance(layer, c)), None)
    if cls is None:
        return False
    return (type(layer).message is cls.message
            and type(layer).update is MessagePassing.update
            and type(getattr(layer, "aggr_module", None)) in _SUM_OR_MEAN)


class _SameTensor:
    r"""Recognizes tensors equal to a reference, checking each new one once.

    A tensor counts as the reference when it is the same storage and version, or when its
    content is equal (after casting the reference to its dtype, as precision plugins do);
    positive results are remembered per (storage, version, dtype, shape).
    """

    def __init__(self, reference: Tensor) -> None:
        self.reference = reference
        self._seen: Dict[tuple, bool] = {}
        self._device_copies: Dict[tuple, Tensor] = {}

    def __call__(self, t: Any) -> bool:
        if not isinstance(t, Tensor) or t.layout != torch.strided:
            return False
        ref = self.reference
        if t.shape != ref.shape:
            return False
        if t is ref:
            return True
        sig = (t.data_ptr(), t._version, t.dtype, t.device, tuple(t.shape))
        hit = self._seen.get(sig)
        if hit is None:
            hit = bool(torch.equal(t.detach(), self.like(t)))
            if len(self._seen) > 64:
                self._seen.clear()
            self._seen[sig] = hit
        return hit

    def like(self, t: Tensor) -> Tensor:
        r"""The reference on :obj:`t`'s device and in its dtype (cached)."""
        sig = (t.device, t.dtype)
        out = self._device_copies.get(sig)
        if out is None:
            out = self.reference.to(device=t.device, dtype=t.dtype)
            self._device_copies[sig] = out
        return out


class AggregationRouter:
    r"""Decides how each exchange point aggregates and provides what the mode needs.

    Args:
        partition (LocalPartition): The rank's partition (plans, outgoing cut edges).
        exchanges (Dict[str, HaloExchange]): One exchange per mode in use (``"post"``
            always).
        mode (str): The engine's aggregation for eligible layers.
        group (ProcessGroup, optional): Group of the agreement all-reduce.
        timeout (float or timedelta, optional): The group's timeout, named in errors.
    """

    def __init__(self, partition: Any, exchanges: Dict[str, Any], mode: str = "post",
                 group: Optional[Any] = None, timeout: Optional[Any] = None) -> None:
        if mode not in MODES:
            raise ValueError(f"aggregation must be one of {MODES}, got {mode!r}")
        if mode not in exchanges or "post" not in exchanges:
            raise ValueError(f"exchanges for 'post' and {mode!r} are needed")
        self.partition = partition
        self.exchanges = exchanges
        self.mode = mode
        self.group = group
        self._in_edges = _SameTensor(partition.edge_index)
        self._attrs = {k: _SameTensor(v) for k, v in partition.edge_attrs.items()}
        self._agreement = Agreement(group, "aggregation", timeout)
        self._graphs: Dict[int, Tuple[str, Tensor]] = {}  # id -> (mode, tensor): mode graphs
        self._cache: Dict[tuple, Tensor] = {}

    # -- which mode ------------------------------------------------------------------------
    def candidate(self, layer: MessagePassing) -> str:
        r"""The mode :obj:`layer` runs in when its inputs allow (``"post"`` if ineligible)."""
        return self.mode if self.mode != "post" and pre_eligible(layer) else "post"

    def decide(self, point: str, candidate: str, local_ok: bool) -> str:
        r"""The mode of exchange point :obj:`point`, the same on every rank.

        The first call all-reduces whether every rank can run :obj:`candidate`; later calls
        must be able to, or raise (a rank that changed its inputs between calls would
        otherwise send what nobody expects).
        """
        if candidate == "post":
            return "post"
        decided = candidate if self._agreement.decide(point, local_ok) else "post"
        if decided != "post" and not local_ok:
            raise RuntimeError(
                f"exchange point '{point}' runs {decided}-aggregated, but this call's edge list "
                "or edge values are no longer the partition's (they were on the first call); "
                "pass the batch's edge_index and edge attributes unchanged, or use "
                "aggregation='post'")
        return decided

    # -- inputs ------------------------------------------------------------------------------
    def is_in_edges(self, edge_index: Any) -> bool:
        r"""Whether :obj:`edge_index` is the rank's in-edge list (``batch.edge_index``)."""
        return self._in_edges(edge_index)

    def edge_attr_key(self, value: Any) -> Optional[str]:
        r"""Name of the partition edge attribute :obj:`value` equals, if any."""
        for key, same in self._attrs.items():
            if same(value):
                return key
        return None

    def graph_mode(self, edge_index: Any) -> Optional[str]:
        r"""The mode whose edge list :obj:`edge_index` is (made by the engine), if any."""
        entry = self._graphs.get(id(edge_index))
        return entry[0] if entry is not None and entry[1] is edge_index else None

    def register_graph(self, edge_index: Tensor, mode: str) -> Tensor:
        self._graphs[id(edge_index)] = (mode, edge_index)
        return edge_index

    def cached_graph(self, key: tuple) -> Optional[Tensor]:
        r"""The edge list :meth:`canonical_graph` stored under :obj:`key`, if any."""
        return self._cache.get(key)

    def canonical_graph(self, key: tuple, edge_index: Tensor, mode: str) -> Tensor:
        r"""One tensor object per derived edge list (e.g. the mode's edges with self-loops),
        so that ``gcn_norm`` returns the same object every call (and PyG's ``cached``
        layers, the router and the kernels' CSR cache recognize it)."""
        out = self._cache.get(key)
        if out is None or out.shape != edge_index.shape:
            out = self.register_graph(edge_index, mode)
            self._cache[key] = out
        return out

    # -- what a mode needs, on the call's device -----------------------------------------
    def plan(self, mode: str) -> Any:
        return self.exchanges[mode].plan

    def mode_edge_index(self, mode: str, device: torch.device) -> Tensor:
        key = ("edges", mode, device)
        out = self._cache.get(key)
        if out is None:
            edges = self.plan(mode).edge_index.to(device)
            if edges.untyped_storage().data_ptr() == \
                    self.partition.edge_index.untyped_storage().data_ptr():
                # The plan shares the in-edge list (nothing pre-aggregated on this rank): a
                # view of it, so that the user's edge_index is not taken for an edge list
                # the engine made (its calls must still take part in the agreement).
                edges = edges.view(edges.shape)
            out = self.register_graph(edges, mode)
            self._cache[key] = out
        return out

    def _index(self, mode: str, which: str, device: torch.device) -> Tensor:
        key = (which, mode, device)
        out = self._cache.get(key)
        if out is None:
            out = getattr(self.plan(mode), which).to(device)
            self._cache[key] = out
        return out

    def mode_edge_values(self, mode: str, value: Optional[Tensor],
                         attr: Optional[str]) -> Optional[Tensor]:
        r"""Edge values of a mode's edges: the rank's in-edge values it keeps, then the
        partition's values of its outgoing pre edges (attribute :obj:`attr`)."""
        if value is None:
            return None
        inner = value.index_select(0, self._index(mode, "in_edges", value.device))
        outer = self.partition.out_edge_attrs[attr]
        outer = outer.to(device=value.device, dtype=value.dtype).index_select(
            0, self._index(mode, "out_edges", value.device))
        return torch.cat([inner, outer], dim=0)

    def in_degree(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        r"""Global in-degree of the owned nodes (the rank holds all their in-edges)."""
        key = ("in_degree", device, dtype)
        out = self._cache.get(key)
        if out is None:
            dst = self.partition.edge_index[1]
            out = torch.bincount(dst, minlength=self.partition.num_owned).to(device, dtype)
            self._cache[key] = out
        return out
