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

With ``"auto"`` each eligible layer runs the mode predicted fastest on the link
(:meth:`AggregationRouter.auto_mode`): per direction, each channel the mode uses costs one
collective, :math:`\alpha (P - 1) + B / \beta` with :math:`B` the busiest rank's bytes (its
rows, all-reduced once, times the layer's wire bytes per row).  Post sends the most rows,
pre partial aggregates, hybrid the fewest rows; where rows cross the wire as they are, pre
and hybrid send both channels in one collective (:mod:`.one_buffer`), else hybrid makes two,
and then post or pre win where a layer's rows are narrow and latency dominates.
"""
from typing import Any, Dict, Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.nn import aggr as pyg_aggr
from torch_geometric.nn import conv as pyg_conv
from torch_geometric.nn.conv import MessagePassing

from ..memo import TensorMemo, signature
from .agreement import Agreement
from .one_buffer import PreEdges, one_buffer_applies
from .errors import guarded

__all__ = ["MODES", "PRE_LAYERS", "AggregationRouter", "pre_eligible", "propagated_width"]

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


def propagated_width(layer: MessagePassing) -> Optional[int]:
    r"""The values per row :obj:`layer`'s ``propagate`` exchanges, as its constructor
    declares them (``None`` where it does not: APPNP propagates whatever it is given).

    ``GCNConv`` applies its linear map before propagating (``out_channels``); ``SGConv``,
    ``TAGConv``, ``SAGEConv``, ``GraphConv`` and ``GINConv`` propagate their input
    (``in_channels``), ``GCN2Conv`` its ``channels``.
    """
    if isinstance(layer, pyg_conv.GCNConv):
        width = layer.out_channels
    elif isinstance(layer, pyg_conv.GCN2Conv):
        width = layer.channels
    else:
        width = getattr(layer, "in_channels", None)
    if isinstance(width, (tuple, list)):
        width = width[0]
    return int(width) if isinstance(width, int) and width > 0 else None


class _SameTensor:
    r"""Recognizes tensors equal to a reference, checking each new one once.

    A tensor counts as the reference when it is the same storage and version, or when its
    content is equal (after casting the reference to its dtype, as precision plugins do);
    results are remembered in a :class:`~lightning_fullgraph.memo.TensorMemo` (the last
    :data:`SEEN` tensors checked) for as long as the tensor they were computed for lives
    unmodified (a new tensor at a freed one's address, e.g. this step's
    ``edge_weight.double()`` where last step's normalized weights were, is checked anew).
    """

    #: Checked tensors remembered.
    SEEN = 64

    def __init__(self, reference: Tensor) -> None:
        self.reference = reference
        self._seen = TensorMemo(self.SEEN)  # signature -> whether equal to the reference
        self._device_copies: Dict[tuple, Tensor] = {}

    def __call__(self, t: Any) -> bool:
        if not isinstance(t, Tensor) or t.layout != torch.strided:
            return False
        ref = self.reference
        if t.shape != ref.shape:
            return False
        if t is ref:
            return True
        key = signature(t)
        seen = self._seen.get(key, (t,), count=False)
        if seen is not None:
            return seen
        hit = bool(torch.equal(t.detach(), self.like(t)))
        self._seen.put(key, (t,), hit)
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
        mode (str): The engine's aggregation for eligible layers (one of :data:`MODES`, or
            ``"auto"``: :meth:`auto_mode`).
        group (ProcessGroup, optional): Group of the agreement all-reduce.
        timeout (float or timedelta, optional): The group's timeout, named in errors.
        link (LinkModel or str, optional): The link ``"auto"`` predicts on; ``None`` or
            ``"calibrate"`` measures the group at the first decision.
        policy (ExchangePolicy, optional): The codecs ``"auto"`` counts wire bytes with.
    """

    def __init__(self, partition: Any, exchanges: Dict[str, Any], mode: str = "post",
                 group: Optional[Any] = None, timeout: Optional[Any] = None,
                 link: Optional[Any] = None, policy: Optional[Any] = None) -> None:
        if mode not in MODES + ("auto", ):
            raise ValueError(f"aggregation must be one of {MODES + ('auto', )}, got {mode!r}")
        needed = MODES if mode == "auto" else ("post", mode)
        missing = [m for m in needed if m not in exchanges]
        if missing:
            raise ValueError(f"aggregation {mode!r} needs exchanges for {needed}; "
                             f"missing {missing}")
        self.partition = partition
        self.exchanges = exchanges
        self.mode = mode
        self.group = group
        self._in_edges = _SameTensor(partition.edge_index)
        self._attrs = {k: _SameTensor(v) for k, v in partition.edge_attrs.items()}
        self._agreement = Agreement(group, "aggregation", timeout)
        self._graphs: Dict[int, Tuple[str, Tensor]] = {}  # id -> (mode, tensor): mode graphs
        self._cache: Dict[tuple, Tensor] = {}
        self.timeout = timeout
        self.link = link
        self.policy = policy
        #: ``"auto"``'s choices: layer -> ``(mode, predicted seconds of each mode)``.
        self.auto_choices: Dict[str, Tuple[str, Dict[str, float]]] = {}
        self._busiest_rows: Optional[Dict[Tuple[str, str], int]] = None
        #: Every exchange point runs post-aggregated while set (step aside's arm without
        #: the mode: :meth:`hold_post`).
        self.post_held = False

    def reset(self) -> None:
        r"""Forgets the decisions of exchange points (for another model: every rank resets
        at the same point, attaching it).  The link and the row counts are kept."""
        self._agreement.clear()
        self.auto_choices.clear()

    def hold_post(self, held: bool) -> None:
        r"""While :obj:`held`, every exchange point runs post-aggregated (the decisions made
        are kept for when it is released).  Every rank at the same point of training, between
        steps.  An edge list the engine made for a mode keeps its mode (a layer that cached
        its ``gcn_norm``, as ``GCNConv(cached=True)``: its propagate runs what it cached)."""
        self.post_held = bool(held)

    # -- which mode ------------------------------------------------------------------------
    def candidate(self, layer: MessagePassing) -> str:
        r"""The mode :obj:`layer` runs in when its inputs allow (``"post"`` if ineligible)."""
        return self.mode if self.mode != "post" and pre_eligible(layer) else "post"

    def decide(self, point: str, candidate: str, local_ok: bool, layer: Optional[str] = None,
               width: Optional[int] = None, dtype: torch.dtype = torch.float32) -> str:
        r"""The mode of exchange point :obj:`point`, the same on every rank.

        The first call all-reduces whether every rank can run :obj:`candidate`; later calls
        must be able to, or raise (a rank that changed its inputs between calls would
        otherwise send what nobody expects).  A candidate ``"auto"`` becomes
        :meth:`auto_mode` of :obj:`layer` (default: the point) for rows of :obj:`width`
        values of :obj:`dtype`.  While :meth:`hold_post` holds, ``"post"`` without deciding.
        """
        if candidate == "post" or self.post_held:
            return "post"
        decided = candidate if self._agreement.decide(point, local_ok) else "post"
        if decided == "auto":
            decided = self.auto_mode(layer or point, width, dtype)
        if decided != "post" and not local_ok:
            raise RuntimeError(
                f"exchange point '{point}' runs {decided}-aggregated, but this call's edge list "
                "or edge values are no longer the partition's (they were on the first call); "
                "pass the batch's edge_index and edge attributes unchanged, or use "
                "aggregation='post'")
        return decided

    def auto_mode(self, layer: str, width: Optional[int],
                  dtype: torch.dtype = torch.float32) -> str:
        r"""The lossless mode predicted fastest for :obj:`layer`'s exchanges of rows of
        :obj:`width` values (decided on its first call, then held; every rank must make the
        first call at the same point, as for :meth:`decide`).

        Per direction, each channel a mode uses (post rows, pre partials) costs one
        collective, :math:`\alpha (P - 1) + B / \beta` with :math:`B` the busiest rank's
        rows times the codec's wire bytes per row; the codec's own time is added for lossy
        codecs.  Where rows cross the wire as they are, pre and hybrid send both channels in
        one collective (:mod:`.one_buffer`): one :math:`\alpha (P - 1)` per direction.
        Rows are all-reduced once and the link is the same on every rank, so every rank
        picks the same mode.  Without a width (a layer whose exchanged width is not
        known before its first exchange) the mode with the fewest busiest-rank rows wins.
        """
        known = self.auto_choices.get(layer)
        if known is not None:
            return known[0]
        rows = self.busiest_rows()
        world = _world(self.group)
        predicted: Dict[str, float] = {}
        point = f"{layer}.propagate0"
        one_buffer = self.policy is None or one_buffer_applies(
            self.policy, f"{point}.x", f"{point}.pre", training=True)
        for mode in MODES:
            seconds = 0.0
            if one_buffer and mode != "post" and width is not None:
                # Rows and partials in one collective per direction (.one_buffer).
                n = rows[(mode, "post")] + rows[(mode, "pre")]
                for direction in ("forward", "backward"):
                    seconds += self._channel_seconds(n, width, dtype, f"{point}.x", direction,
                                                     world)
                predicted[mode] = seconds
                continue
            for channel in ("post", "pre"):
                n = rows[(mode, channel)]
                if (mode, channel) in (("pre", "post"), ("post", "pre")):
                    continue  # the mode makes no collective on this channel
                if width is None:
                    seconds += n
                    continue
                key = f"{layer}.propagate0" + (".x" if channel == "post" else ".pre")
                for direction in ("forward", "backward"):
                    seconds += self._channel_seconds(n, width, dtype, key, direction, world)
            predicted[mode] = seconds
        # Ties go to the fewest collectives (post, then pre, then hybrid).
        best = min(MODES, key=lambda m: (predicted[m], MODES.index(m)))
        self.auto_choices[layer] = (best, predicted)
        return best

    def _channel_seconds(self, rows: int, width: int, dtype: torch.dtype, key: str,
                         direction: str, world: int) -> float:
        from .codecs import IdentityCodec

        link = self.resolved_link()
        codec = self.policy.codec(key, direction) if self.policy is not None else IdentityCodec()
        wire = codec.wire_bytes(rows, width, dtype)
        seconds = link.exchange_seconds(wire, world)
        if not codec.lossless:
            raw = rows * width * torch.empty((), dtype=dtype).element_size()
            seconds += link.codec_seconds(raw, raw, rows, rows)
        return seconds

    def resolved_link(self) -> Any:
        r"""The link ``"auto"`` predicts on (measured on the group the first time when none
        was given)."""
        from ..planner.link import LinkModel

        if not isinstance(self.link, LinkModel):
            from ..planner.calibrate import calibrate

            # Latency and bandwidth only, on small sizes (up to 1 MiB, 10 repeats): the
            # modes' predictions differ by whole collectives or by large byte counts.
            with guarded("link calibration for aggregation='auto'", _rank(self.group),
                         _peers(self.group), self.timeout):
                self.link = calibrate(self.group, sizes=(0, 1 << 16, 1 << 20), repeats=10)
        return self.link

    def busiest_rows(self) -> Dict[Tuple[str, str], int]:
        r"""Per (mode, channel): the rows the busiest rank sends or receives in one exchange
        (one all-reduce, the first time)."""
        if self._busiest_rows is None:
            keys = [(m, c) for m in MODES for c in ("post", "pre")]
            local = []
            for mode, channel in keys:
                ch = getattr(self.plan(mode), channel)
                local.append(max(int(ch.send_counts.sum()), int(ch.recv_counts.sum())))
            buf = torch.tensor(local, dtype=torch.int64)
            if _world(self.group) > 1:
                with guarded("aggregation='auto' row counts", _rank(self.group),
                             _peers(self.group), self.timeout):
                    dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.group)
            self._busiest_rows = {k: int(v) for k, v in zip(keys, buf.tolist())}
        return self._busiest_rows

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

    def split_pre_edges(self, edge_index: Tensor) -> Tuple[Tensor, Tensor, PreEdges, Tensor]:
        r"""A mode's edge list (one the engine made, so the same object every call) split
        into its in-edges and its outgoing pre edges (destinations :math:`N_{own} + s`):
        ``(in_edge_index, in_positions, pre_edges, pre_positions)``; ``pre_edges`` is a
        :class:`~.one_buffer.PreEdges` (``[owned source; pre slot]``, and reversed for the
        backward), positions are in :obj:`edge_index` (to split the edge values alike).  The
        same objects every call: the kernels' CSR cache knows them."""
        key = ("split", id(edge_index))
        entry = self._cache.get(key)
        if entry is None or entry[0] is not edge_index:
            n = self.partition.num_owned
            pre = edge_index[1] >= n
            in_pos, pre_pos = (~pre).nonzero().view(-1), pre.nonzero().view(-1)
            pre_edges = edge_index.index_select(1, pre_pos)
            pre_edges[1] -= n
            entry = (edge_index, edge_index.index_select(1, in_pos), in_pos,
                     PreEdges.of(pre_edges), pre_pos)
            self._cache[key] = entry
        return entry[1:]

    def in_degree(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        r"""Global in-degree of the owned nodes (the rank holds all their in-edges)."""
        key = ("in_degree", device, dtype)
        out = self._cache.get(key)
        if out is None:
            dst = self.partition.edge_index[1]
            out = torch.bincount(dst, minlength=self.partition.num_owned).to(device, dtype)
            self._cache[key] = out
        return out


def _world(group: Optional[Any]) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def _rank(group: Optional[Any]) -> int:
    return dist.get_rank(group) if _world(group) > 1 else 0


def _peers(group: Optional[Any]) -> list:
    rank = _rank(group)
    return [r for r in range(_world(group)) if r != rank]
