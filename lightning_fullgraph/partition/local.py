"""Per-rank views of a partitioned graph and the halo-exchange plan.

Layout of one rank's node rows (what the engine materializes per layer)::

    [ owned nodes (ascending global id) | halo nodes (by owner rank, then id) ]
      0 .. N_own-1                        N_own .. N_own+N_halo-1

Local edges keep the *original global order* (a stable filter on the
destination's owner), which is what makes scatter reductions — and thus model
outputs — bit-comparable with single-process PyG.

Besides its in-edges, a rank stores its *outgoing cut edges* (owned source,
destination owned elsewhere) and the hybrid pre/post decision of every cut edge
(an exact minimum vertex cover per rank pair, computed at partition time), from
which :meth:`LocalPartition.plan` derives the post-, pre- and hybrid
aggregation plans (:mod:`~.plan`).
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .cover import CutCover, cut_cover
from .plan import AggregationPlan, build_plan

__all__ = [
    "LOCAL_FORMAT_VERSION",
    "LocalPartition",
    "build_local_partitions",
    "iter_local_partitions",
    "split_attr_keys",
]

#: Version of :meth:`LocalPartition.to_dict`; bump on incompatible changes.
#: 2: outgoing cut edges and hybrid pre/post decisions (aggregation plans).
#: 3: importance levels of boundary nodes (owned_level, halo_level) for per-node bit widths.
LOCAL_FORMAT_VERSION = 3

#: Importance levels of boundary nodes (SYLVIE's data-adaptive bit width: quartiles).
NUM_LEVELS = 4

#: Default percentile cut points of the levels: quartiles, SYLVIE's "evenly distributed
#: percentiles" (seed-specs B1).
QUARTILES = (0.25, 0.5, 0.75)

_TENSOR_FIELDS = ("owned_ids", "halo_ids", "halo_counts", "send_index", "send_counts",
                  "edge_index", "edge_ids", "in_pre", "out_edge_ids", "out_src", "out_dst",
                  "out_dst_rank", "out_pre", "out_dst_in_degree", "owned_level", "halo_level")
_INT_FIELDS = ("rank", "num_parts", "num_nodes", "num_edges")


@dataclass
class LocalPartition:
    r"""Everything one rank needs to train on its part of the graph.

    Args:
        rank (int): This rank.
        num_parts (int): Number of parts :math:`P` (the world size).
        num_nodes (int): Number of nodes of the *global* graph.
        num_edges (int): Number of edges of the *global* graph.
        owned_ids (torch.Tensor): Global ids of owned nodes, ascending,
            shape :math:`[N_{own}]`.
        halo_ids (torch.Tensor): Global ids of non-owned sources of local
            edges, grouped by owner rank ascending and ascending within a
            group, shape :math:`[N_{halo}]`.
        halo_counts (torch.Tensor): Halo nodes received from each rank
            (``0`` at :obj:`rank`), shape :math:`[P]`.
        send_index (torch.Tensor): Local owned indices sent to other ranks,
            concatenated by destination rank ascending; the block for rank
            :math:`r` is in the order of :math:`r`'s :obj:`halo_ids`,
            shape :math:`[S]`.
        send_counts (torch.Tensor): Rows sent to each rank (``0`` at
            :obj:`rank`), shape :math:`[P]`.
        edge_index (torch.Tensor): Local edges (all global edges whose target is
            owned, in global order); sources index into owned rows followed by
            halo rows, targets into owned rows, shape :math:`[2, E_{local}]`.
        edge_ids (torch.Tensor): Global position of every local edge,
            shape :math:`[E_{local}]`.
        node_attrs (Dict[str, torch.Tensor]): Node-level attributes of owned
            nodes (``x``, ``y``, masks, ...), first dimension :math:`N_{own}`.
        edge_attrs (Dict[str, torch.Tensor]): Edge-level attributes of local
            edges, first dimension :math:`E_{local}`.
        global_counts (Dict[str, int]): Number of :obj:`True` entries of every
            boolean node attribute in the whole graph.
        fingerprint (str): Fingerprint of the global graph.
        options (Dict[str, Any]): JSON-able options the partition was made with.
        in_pre (torch.Tensor): bool :math:`[E_{local}]`, aligned with
            :obj:`edge_index`: the in-edge is a cut edge that the **hybrid**
            mode pre-aggregates at its source's owner.
        out_edge_ids (torch.Tensor): Global ids of this rank's *outgoing cut
            edges* (owned source, destination owned by another rank), ascending
            (global order), shape :math:`[E_{out}]`.
        out_src (torch.Tensor): Owned local index of their sources.
        out_dst (torch.Tensor): Global id of their destinations.
        out_dst_rank (torch.Tensor): Owner rank of their destinations.
        out_pre (torch.Tensor): bool, the **hybrid** mode pre-aggregates the
            edge here (same decision as the destination's :obj:`in_pre`).
        out_dst_in_degree (torch.Tensor): In-degree (edges, duplicates and
            self-loops counted) of their destinations in the global graph.
        out_edge_attrs (Dict[str, torch.Tensor]): Edge-level attributes of the
            outgoing cut edges (same keys as :obj:`edge_attrs`), first
            dimension :math:`E_{out}`.
        owned_level (torch.Tensor): int8 :math:`[N_{own}]`, importance level
            :math:`0..3` of every owned *boundary* node (a node some other rank
            receives as a halo row), ``-1`` for the others: the quartile of its
            global in-degree among all boundary nodes of the graph (SYLVIE §IV-A:
            :math:`k_v = \lceil 4 p_v \rceil - 1`, :math:`p_v` the fraction of
            boundary nodes whose in-degree is :math:`\le d_v`). Sender and receiver
            of a row both know its level, so per-node bit widths need no
            communication.
        halo_level (torch.Tensor): int8 :math:`[N_{halo}]`, the level of every
            halo node (same definition).
    """
    rank: int
    num_parts: int
    num_nodes: int
    num_edges: int
    owned_ids: Tensor
    halo_ids: Tensor
    halo_counts: Tensor
    send_index: Tensor
    send_counts: Tensor
    edge_index: Tensor
    edge_ids: Tensor
    node_attrs: Dict[str, Tensor] = field(default_factory=dict)
    edge_attrs: Dict[str, Tensor] = field(default_factory=dict)
    global_counts: Dict[str, int] = field(default_factory=dict)
    fingerprint: str = ""
    options: Dict[str, Any] = field(default_factory=dict)
    in_pre: Optional[Tensor] = None
    out_edge_ids: Optional[Tensor] = None
    out_src: Optional[Tensor] = None
    out_dst: Optional[Tensor] = None
    out_dst_rank: Optional[Tensor] = None
    out_pre: Optional[Tensor] = None
    out_dst_in_degree: Optional[Tensor] = None
    out_edge_attrs: Dict[str, Tensor] = field(default_factory=dict)
    owned_level: Optional[Tensor] = None
    halo_level: Optional[Tensor] = None
    _plans: Dict[str, AggregationPlan] = field(default_factory=dict, init=False,
                                               repr=False, compare=False)

    def plan(self, mode: str = "post") -> AggregationPlan:
        r"""The :class:`~.plan.AggregationPlan` of this rank in :obj:`mode`
        (``"post"``, ``"pre"`` or ``"hybrid"``); derived on first use from the
        stored per-edge decisions, then cached."""
        found = self._plans.get(mode)
        if found is None:
            found = self._plans[mode] = build_plan(self, mode)
        return found

    @property
    def num_out_edges(self) -> int:
        r"""Number of outgoing cut edges :math:`E_{out}`."""
        return 0 if self.out_edge_ids is None else int(self.out_edge_ids.numel())

    @property
    def num_owned(self) -> int:
        r"""Number of owned nodes :math:`N_{own}`."""
        return int(self.owned_ids.numel())

    @property
    def num_halo(self) -> int:
        r"""Number of halo nodes :math:`N_{halo}`."""
        return int(self.halo_ids.numel())

    @property
    def num_local_edges(self) -> int:
        r"""Number of local edges :math:`E_{local}`."""
        return int(self.edge_ids.numel())

    def to_data(self):
        r"""Returns the local graph as a :class:`torch_geometric.data.Data`.

        Contains the node attributes, :obj:`edge_index`, the edge attributes and
        ``n_id`` (global ids of owned nodes); ``num_nodes`` is :math:`N_{own}`.
        Sources of :obj:`edge_index` may reach up to :math:`N_{own} + N_{halo}`
        on purpose, so the object must not be passed to ``Data.validate``.
        """
        from torch_geometric.data import Data

        data = Data(edge_index=self.edge_index, n_id=self.owned_ids)
        for key, value in self.node_attrs.items():
            data[key] = value
        for key, value in self.edge_attrs.items():
            data[key] = value
        data.num_nodes = self.num_owned
        return data

    def to_dict(self) -> Dict[str, Any]:
        r"""Serializes to plain containers, loadable with ``weights_only=True``."""
        out: Dict[str, Any] = {"format_version": LOCAL_FORMAT_VERSION}
        for name in _INT_FIELDS:
            out[name] = int(getattr(self, name))
        for name in _TENSOR_FIELDS:
            out[name] = getattr(self, name)
        out["node_attrs"] = dict(self.node_attrs)
        out["edge_attrs"] = dict(self.edge_attrs)
        out["out_edge_attrs"] = dict(self.out_edge_attrs)
        out["global_counts"] = {k: int(v) for k, v in self.global_counts.items()}
        out["fingerprint"] = str(self.fingerprint)
        out["options"] = dict(self.options)
        return out

    @classmethod
    def from_dict(cls, state: Dict[str, Any]) -> "LocalPartition":
        r"""Inverse of :meth:`to_dict`.

        Raises:
            ValueError: If the dict has another format version or misses keys.
        """
        version = state.get("format_version")
        if version != LOCAL_FORMAT_VERSION:
            raise ValueError(f"unsupported local partition format version {version!r} "
                             f"(this library reads version {LOCAL_FORMAT_VERSION}); "
                             f"re-partition the graph")
        missing = [k for k in _INT_FIELDS + _TENSOR_FIELDS if k not in state]
        if missing:
            raise ValueError(f"local partition is missing fields {missing}")
        return cls(
            **{k: int(state[k]) for k in _INT_FIELDS},
            **{k: state[k] for k in _TENSOR_FIELDS},
            node_attrs=dict(state.get("node_attrs", {})),
            edge_attrs=dict(state.get("edge_attrs", {})),
            out_edge_attrs=dict(state.get("out_edge_attrs", {})),
            global_counts={k: int(v) for k, v in state.get("global_counts", {}).items()},
            fingerprint=str(state.get("fingerprint", "")),
            options=dict(state.get("options", {})),
        )

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(rank={self.rank}/{self.num_parts}, "
                f"owned={self.num_owned}, halo={self.num_halo}, "
                f"edges={self.num_local_edges}, out_edges={self.num_out_edges}, "
                f"send={int(self.send_index.numel())}, "
                f"node_attrs={sorted(self.node_attrs)}, edge_attrs={sorted(self.edge_attrs)})")


def split_attr_keys(data) -> Tuple[List[str], List[str]]:
    r"""Splits the tensor attributes of :obj:`data` into node- and edge-level.

    A tensor is edge-level if its first dimension equals the number of edges
    and either its name contains ``"edge"`` or it cannot be node-level; it is
    node-level if its first dimension equals the number of nodes. Everything
    else (graph-level scalars, ``edge_index`` itself) is skipped.

    Returns:
        (List[str], List[str]): Node-level keys and edge-level keys, sorted.
    """
    num_nodes = int(data.num_nodes)
    num_edges = int(data.edge_index.size(1))
    node_keys, edge_keys = [], []
    for key in sorted(data.keys()):
        value = data[key]
        if key == "edge_index" or not isinstance(value, Tensor) or value.dim() == 0:
            continue
        size = value.size(0)
        if size == num_edges and ("edge" in key or size != num_nodes):
            edge_keys.append(key)
        elif size == num_nodes:
            node_keys.append(key)
    return node_keys, edge_keys


class _Plan:
    r"""Global, vectorised bookkeeping shared by all ranks (O(N + E) memory)."""

    def __init__(self, edge_index: Tensor, parts: Tensor, num_parts: int,
                 level_percentiles: Optional[Sequence[float]] = None):
        N, P = parts.numel(), num_parts
        self.N, self.P = N, P
        self.src, self.dst = edge_index[0], edge_index[1]
        self.parts = parts

        # Owned nodes: a stable sort by part keeps ascending global ids per part.
        self.order = torch.argsort(parts, stable=True)
        sizes = torch.bincount(parts, minlength=P)
        self.owned_ptr = _ptr(sizes)
        self.local_pos = torch.empty(N, dtype=torch.long)
        self.local_pos[self.order] = torch.arange(N) - self.owned_ptr[parts[self.order]]

        # Local edges: a *stable* sort by the target's part keeps global order.
        edge_part = parts[self.dst]
        self.edge_perm = torch.argsort(edge_part, stable=True)
        self.edge_ptr = _ptr(torch.bincount(edge_part, minlength=P))

        # Halo pairs (receiving rank, owner, node), deduplicated. Keys sort by
        # receiver, then owner, then global id == the required halo order.
        src_part = parts[self.src]
        cut = edge_part != src_part
        key = (edge_part[cut] * P + src_part[cut]) * N + self.src[cut]
        del edge_part, src_part, cut
        key = torch.unique(key)  # sorted
        receiver, rest = key // (P * N), key % (P * N)
        owner, node = rest // N, rest % N
        del key, rest
        self.halo_node = node
        self.halo_ptr = _ptr(torch.bincount(receiver, minlength=P))
        # comm[r, s] = rows that rank r receives from rank s.
        self.comm = torch.bincount(receiver * P + owner, minlength=P * P).view(P, P)

        # Send side: the same pairs ordered by (owner, receiver, node), so each
        # owner's block is contiguous and follows the receivers' halo order.
        send_key = (owner * P + receiver) * N + node
        send_key = torch.sort(send_key).values
        send_node = send_key % N
        self.send_local = self.local_pos[send_node]
        self.send_ptr = _ptr(torch.bincount(send_key // (P * N), minlength=P))
        del send_key, send_node, receiver, owner, node

        # Outgoing cut edges grouped by the source's part, in global order.
        src_part = parts[self.src]
        out = (src_part != parts[self.dst]).nonzero().flatten()
        out_part = src_part[out]
        del src_part
        self.out_perm = out[torch.argsort(out_part, stable=True)]
        self.out_ptr = _ptr(torch.bincount(out_part, minlength=P))
        self.in_degree = torch.bincount(self.dst, minlength=N)
        self.level = boundary_levels(self.in_degree, self.halo_node,
                                     percentiles=level_percentiles)


def check_level_percentiles(percentiles: Optional[Sequence[float]]) -> Tuple[float, ...]:
    r"""The percentile cut points of the importance levels, validated: :obj:`None` gives
    the quartiles; otherwise ``NUM_LEVELS - 1`` increasing fractions in (0, 1)."""
    if percentiles is None:
        return QUARTILES
    try:
        cuts = tuple(float(p) for p in percentiles)
    except (TypeError, ValueError):
        raise ValueError(f"level_percentiles must be {NUM_LEVELS - 1} numbers, got "
                         f"{percentiles!r}") from None
    if len(cuts) != NUM_LEVELS - 1 or not all(0 < c < 1 for c in cuts) \
            or any(a >= b for a, b in zip(cuts, cuts[1:])):
        raise ValueError(
            f"level_percentiles must be {NUM_LEVELS - 1} increasing fractions in (0, 1) "
            f"(the in-degree percentiles where levels 1, 2 and 3 start; default "
            f"{QUARTILES}), got {percentiles!r}")
    return cuts


def boundary_levels(in_degree: Tensor, boundary: Tensor, levels: int = NUM_LEVELS,
                    percentiles: Optional[Sequence[float]] = None) -> Tensor:
    r"""Importance level of every node: the quantile (of :obj:`levels`) of its global
    in-degree among the boundary nodes, ``-1`` for nodes that are never sent.

    Args:
        in_degree (torch.Tensor): Global in-degree of every node :math:`[N]`.
        boundary (torch.Tensor): Ids of the boundary nodes (any order, repeats allowed).
        levels (int): Number of levels (4: quartiles).
        percentiles (Sequence[float], optional): ``levels - 1`` increasing cut points in
            (0, 1): node :math:`v` gets the number of cut points below its percentile
            :math:`p_v`. Default: evenly spaced (quartiles for 4 levels), SYLVIE's rule.
            Skewed cut points (e.g. ``(0.5, 0.8, 0.95)``) put fewer nodes on the wide
            levels, so per-node bit widths send fewer bytes.

    Returns:
        int8 :math:`[N]`; equal in-degrees get equal levels, the largest gets
        ``levels - 1``.
    """
    out = torch.full((in_degree.numel(), ), -1, dtype=torch.int8)
    nodes = torch.unique(boundary)
    if nodes.numel() == 0:
        return out
    pool = torch.sort(in_degree[nodes]).values
    # p_v = |{u in pool: d_u <= d_v}| / |pool|  (the empirical CDF; max degree -> 1)
    p = torch.searchsorted(pool, in_degree[nodes], right=True).double() / pool.numel()
    if percentiles is None:  # evenly spaced: quartiles for 4 levels
        percentiles = [k / levels for k in range(1, levels)]
    cuts = torch.tensor([float(c) for c in percentiles], dtype=torch.float64)
    if cuts.numel() != levels - 1:
        raise ValueError(f"{levels} levels need {levels - 1} percentiles, got {cuts.numel()}")
    # Level = the number of cut points strictly below p_v.
    out[nodes] = torch.searchsorted(cuts, p, right=False).clamp(0, levels - 1).to(torch.int8)
    return out


def _ptr(counts: Tensor) -> Tensor:
    ptr = torch.zeros(counts.numel() + 1, dtype=torch.long)
    torch.cumsum(counts, dim=0, out=ptr[1:])
    return ptr


def _check_inputs(data, parts: Tensor) -> Tuple[Tensor, Tensor, int]:
    edge_index = getattr(data, "edge_index", None)
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError("data.edge_index must be a tensor of shape [2, num_edges]")
    num_nodes = int(data.num_nodes)
    parts = torch.as_tensor(parts).detach().cpu().to(torch.long).reshape(-1)
    if parts.numel() != num_nodes:
        raise ValueError(f"parts has {parts.numel()} entries but the graph has "
                         f"{num_nodes} nodes")
    if num_nodes == 0:
        raise ValueError("cannot partition an empty graph")
    if int(parts.min()) < 0:
        raise ValueError("part ids must be non-negative")
    edge_index = edge_index.detach().cpu().to(torch.long)
    if edge_index.numel() > 0 and (int(edge_index.min()) < 0
                                   or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index contains node ids outside [0, {num_nodes})")
    return edge_index, parts, int(parts.max()) + 1


def iter_local_partitions(data, parts: Tensor, *, num_parts: Optional[int] = None,
                          ranks: Optional[Sequence[int]] = None,
                          fingerprint: Optional[str] = None,
                          options: Optional[Dict[str, Any]] = None,
                          cover: Optional[CutCover] = None,
                          level_percentiles: Optional[Sequence[float]] = None
                          ) -> Iterator[LocalPartition]:
    r"""Yields :class:`LocalPartition` objects one rank at a time.

    Only the global plan (:math:`O(N + E)` integers) plus one rank's slices are
    alive at a time, so callers that write each rank to disk right away never
    hold all partitions in memory.

    Args:
        data (torch_geometric.data.Data): The global graph (flow
            ``source_to_target``: ``edge_index[1]`` is the target).
        parts (torch.Tensor): Part id per node, shape :math:`[N]`.
        num_parts (int, optional): Number of parts; defaults to
            ``parts.max() + 1``. Parts without nodes are allowed here (they give
            empty ranks) but :func:`~.metis_partition` never produces them.
        ranks (Sequence[int], optional): Ranks to build (default: all).
        fingerprint (str, optional): Graph fingerprint to store; computed with
            :func:`~.graph_fingerprint` when :obj:`None`.
        options (Dict[str, Any], optional): JSON-able options to store.
        cover (CutCover, optional): The hybrid pre/post decisions of
            :func:`~.cover.cut_cover` for these parts (computed when
            :obj:`None`; pass it to share one computation with
            :func:`~.partition_stats`).
        level_percentiles (Sequence[float], optional): Cut points of the boundary nodes'
            importance levels (:func:`boundary_levels`; default quartiles).
    """
    edge_index, parts, inferred = _check_inputs(data, parts)
    P = inferred if num_parts is None else int(num_parts)
    if P < inferred:
        raise ValueError(f"parts contains part id {inferred - 1} but num_parts={P}")
    if fingerprint is None:
        from .fingerprint import graph_fingerprint
        fingerprint = graph_fingerprint(data)
    node_keys, edge_keys = split_attr_keys(data)
    global_counts = {k: int(data[k].sum()) for k in node_keys if data[k].dtype == torch.bool}
    num_nodes, num_edges = int(data.num_nodes), int(edge_index.size(1))

    if cover is None:
        cover = cut_cover(edge_index, parts, P)
    elif cover.num_parts != P or cover.pre.numel() != edge_index.size(1):
        raise ValueError(f"cover was computed for {cover.num_parts} parts and "
                         f"{cover.pre.numel()} edges, not {P} parts and "
                         f"{edge_index.size(1)} edges")
    plan = _Plan(edge_index, parts, P, level_percentiles)
    for r in (range(P) if ranks is None else ranks):
        r = int(r)
        owned = plan.order[plan.owned_ptr[r]:plan.owned_ptr[r + 1]]
        n_own = owned.numel()
        eids = plan.edge_perm[plan.edge_ptr[r]:plan.edge_ptr[r + 1]]
        src, dst = plan.src[eids], plan.dst[eids]
        halo_ids = plan.halo_node[plan.halo_ptr[r]:plan.halo_ptr[r + 1]]

        src_part = parts[src]
        local_src = plan.local_pos[src]  # correct for owned sources
        remote = (src_part != r).nonzero().flatten()
        if remote.numel() > 0:
            # (owner, id) keys are ascending along halo_ids -> binary search.
            halo_key = parts[halo_ids] * num_nodes + halo_ids
            query = src_part[remote] * num_nodes + src[remote]
            local_src[remote] = n_own + torch.searchsorted(halo_key, query)
        local_edge_index = torch.stack([local_src, plan.local_pos[dst]], dim=0)
        out_ids = plan.out_perm[plan.out_ptr[r]:plan.out_ptr[r + 1]]
        out_dst = plan.dst[out_ids]

        yield LocalPartition(
            rank=r, num_parts=P, num_nodes=num_nodes, num_edges=num_edges,
            owned_ids=owned.clone(), halo_ids=halo_ids.clone(),
            halo_counts=plan.comm[r].clone(),
            send_index=plan.send_local[plan.send_ptr[r]:plan.send_ptr[r + 1]].clone(),
            send_counts=plan.comm[:, r].clone(),
            edge_index=local_edge_index, edge_ids=eids.clone(),
            node_attrs={k: data[k][owned] for k in node_keys},
            edge_attrs={k: data[k][eids] for k in edge_keys},
            global_counts=dict(global_counts), fingerprint=fingerprint,
            options=dict(options or {}),
            in_pre=cover.pre[eids],
            out_edge_ids=out_ids.clone(), out_src=plan.local_pos[plan.src[out_ids]],
            out_dst=out_dst, out_dst_rank=parts[out_dst], out_pre=cover.pre[out_ids],
            out_dst_in_degree=plan.in_degree[out_dst],
            out_edge_attrs={k: data[k][out_ids] for k in edge_keys},
            owned_level=plan.level[owned], halo_level=plan.level[halo_ids],
        )


def build_local_partitions(data, parts: Tensor, *, num_parts: Optional[int] = None,
                           fingerprint: Optional[str] = None,
                           options: Optional[Dict[str, Any]] = None,
                           cover: Optional[CutCover] = None
                           ) -> List[LocalPartition]:
    r"""Builds the :class:`LocalPartition` of every rank.

    Fully vectorised (sorts, ``unique``, ``searchsorted``); the only Python
    loop runs over ranks. See :func:`iter_local_partitions` for the arguments
    and a streaming variant.

    Returns:
        List[LocalPartition]: One entry per rank, index == rank.
    """
    return list(iter_local_partitions(data, parts, num_parts=num_parts,
                                      fingerprint=fingerprint, options=options,
                                      cover=cover))
