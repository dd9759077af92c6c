r"""Per-mode aggregation plans: which rows cross the wire and which edges each
rank aggregates, for post-, pre- and hybrid (minimum vertex cover) aggregation.

Every cut edge :math:`u \to v` (``owner(u) = s != d = owner(v)``) is either

* **post**: :math:`s` sends the row of :math:`u` (once per destination rank),
  :math:`d` aggregates the edge -- the halo exchange of today; or
* **pre**: :math:`s` aggregates the edge into a *pre slot* of :math:`v` (one
  per (destination rank, :math:`v`)) and sends that partial aggregate, which
  :math:`d` adds into the row of :math:`v`.

A mode decides this for all cut edges: ``"post"`` (all post), ``"pre"`` (all
pre) or ``"hybrid"`` (the exact minimum vertex cover of every rank pair's
remote graph, :mod:`~.cover`). Per layer a rank then computes::

    x_src   = cat([x_owned, post_exchange(x_owned[post.send_index])])  # [N_own + H]
    agg_ext = scatter_sum(w[e] * x_src[edge_index[0]], edge_index[1])   # [N_own + S_pre]
    agg     = agg_ext[:N_own].index_add(0, pre.recv_index,
                                        pre_exchange(agg_ext[pre.send_index]))

and ``agg`` equals the single-process aggregation of the owned nodes. The edge
tensor ``w`` of a mode is ``cat([w_in[plan.in_edges], w_out[plan.out_edges]])``
with ``w_in`` aligned with :attr:`LocalPartition.edge_index` and ``w_out`` with
the partition's outgoing cut edges (:attr:`LocalPartition.out_edge_attrs`).

Plans are derived from the stored per-edge decisions when first asked for
(:meth:`LocalPartition.plan`): a few sorts over the rank's edges.
"""
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from .cover import MODES

if TYPE_CHECKING:  # pragma: no cover
    from .local import LocalPartition

__all__ = ["MODES", "ChannelPlan", "AggregationPlan", "build_plan", "build_reverse_plan"]


@dataclass
class ChannelPlan:
    r"""One all-to-all channel of an aggregation plan.

    Attributes:
        send_index (torch.Tensor): int64 :math:`[S]`, local rows to send,
            concatenated by destination rank ascending.
        send_counts (torch.Tensor): int64 :math:`[P]`, rows sent to each rank.
        recv_index (torch.Tensor): int64 :math:`[R]`, local row each received
            row belongs to, concatenated by source rank ascending.
        recv_counts (torch.Tensor): int64 :math:`[P]`, rows received from each
            rank.
    """
    send_index: Tensor
    send_counts: Tensor
    recv_index: Tensor
    recv_counts: Tensor

    @property
    def num_send(self) -> int:
        return int(self.send_index.numel())

    @property
    def num_recv(self) -> int:
        return int(self.recv_index.numel())


@dataclass
class AggregationPlan:
    r"""What one rank sends, receives and aggregates in one mode.

    Attributes:
        mode (str): ``"post"``, ``"pre"`` or ``"hybrid"``.
        num_owned (int): :math:`N_{own}`.
        halo_ids (torch.Tensor): int64 :math:`[H]`, global ids of this mode's
            halo rows (sources of the mode's post cut edges), grouped by owner
            rank ascending, ascending within a group.
        num_pre_slots (int): :math:`S_{pre}`, partial-aggregate rows this rank
            computes for other ranks.
        pre_slot_ids (torch.Tensor): int64 :math:`[S_{pre}]`, global id of the
            destination of each pre slot, grouped by destination rank
            ascending, ascending within a group.
        post (ChannelPlan): Source rows. ``send_index``: owned local indices;
            the block for rank :math:`d` is ordered like :math:`d`'s
            :obj:`halo_ids` block from this rank. ``recv_index`` =
            ``arange(N_own, N_own + H)``.
        pre (ChannelPlan): Partial aggregates. ``send_index`` =
            ``arange(N_own, N_own + S_pre)``; ``recv_index``: owned local index
            of the destination of every received row (a destination may
            receive rows from several ranks), the block of source :math:`s`
            ordered by global destination id.
        edge_index (torch.Tensor): int64 :math:`[2, E_m]`; sources index
            ``[0, N_own + H)``, targets ``[0, N_own + S_pre)``. (a) the
            in-edges whose source is owned or that are post in this mode (in
            :attr:`LocalPartition.edge_index` order), then (b) this rank's
            outgoing pre cut edges (owned source to pre slot), in global edge
            order. A mode that keeps every in-edge and has no part (b) (always
            ``"post"``) shares :attr:`LocalPartition.edge_index` instead of a copy.
        in_edges (torch.Tensor): int32 (int64 beyond :math:`2^{31}` edges)
            :math:`[E_a]`, position in :attr:`LocalPartition.edge_index` of every
            edge of part (a).
        out_edges (torch.Tensor): int64 :math:`[E_b]`, position in the
            outgoing-cut-edge list (:attr:`LocalPartition.out_edge_ids`) of
            every edge of part (b).
        looped (torch.Tensor, optional): int64 :math:`[2, E_m + N_{own}]`, the storage
            :attr:`edge_index` is the first :math:`E_m` columns of, followed by one
            self-loop :math:`(i, i)` per owned node (``gcn_norm``'s looped edge list
            without a copy); ``None`` where :attr:`edge_index` is shared.
    """
    mode: str
    num_owned: int
    halo_ids: Tensor
    num_pre_slots: int
    pre_slot_ids: Tensor
    post: ChannelPlan
    pre: ChannelPlan
    edge_index: Tensor
    in_edges: Tensor
    out_edges: Tensor
    looped: Optional[Tensor] = None

    @property
    def num_halo(self) -> int:
        r""":math:`H`, rows received on the post channel."""
        return int(self.halo_ids.numel())

    @property
    def rows_sent(self) -> int:
        r"""Rows this rank sends per exchange (post + pre channel)."""
        return self.post.num_send + self.pre.num_send

    @property
    def rows_received(self) -> int:
        r"""Rows this rank receives per exchange (post + pre channel)."""
        return self.post.num_recv + self.pre.num_recv


def _position_dtype(n: int) -> torch.dtype:
    # Edge positions as int32 when they fit: half the memory of int64 on large ranks
    # (index_select takes either).
    return torch.int32 if n < 2**31 else torch.long


def _keys_unique(key: Tensor) -> Tensor:
    return torch.unique(key, sorted=True) if key.numel() else key


def build_plan(part: "LocalPartition", mode: str) -> AggregationPlan:
    r"""Derives the :class:`AggregationPlan` of :obj:`part` for :obj:`mode`.

    Fully vectorised (``unique``, ``searchsorted``, ``cumsum`` over the rank's
    in-edges and outgoing cut edges). Two ranks' plans agree with each other
    because both are derived from the same per-edge decisions stored at
    partition time.
    """
    if mode not in MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {MODES}")
    if part.out_edge_ids is None or part.in_pre is None:
        raise ValueError("this partition has no outgoing-cut-edge data (built by an old "
                         "version?); re-partition the graph")
    P, n_own, N = part.num_parts, part.num_owned, part.num_nodes
    long = torch.long
    src_l, dst_l = part.edge_index[0], part.edge_index[1]
    halo_owner = torch.repeat_interleave(torch.arange(P), part.halo_counts)
    is_cut_in = src_l >= n_own
    n_out = int(part.out_edge_ids.numel())
    if mode == "post":
        in_pre = torch.zeros_like(is_cut_in)
        out_pre = torch.zeros(n_out, dtype=torch.bool)
    elif mode == "pre":
        in_pre = is_cut_in
        out_pre = torch.ones(n_out, dtype=torch.bool)
    else:
        in_pre = part.in_pre.to(torch.bool)
        out_pre = part.out_pre.to(torch.bool)

    # (a) In-edges kept on this rank, halo renumbered to this mode's halo.
    keeps_all = not bool(in_pre.any())
    in_edges = (~in_pre).nonzero().flatten().to(_position_dtype(src_l.numel()))
    if keeps_all:  # every in-edge, every halo node (the halo is their sources): no copy
        a_src, a_dst = src_l, dst_l
        used = torch.ones(part.num_halo, dtype=torch.bool)
    else:
        a_src, a_dst = src_l[in_edges], dst_l[in_edges]
        used = torch.zeros(part.num_halo, dtype=torch.bool)
        a_halo = a_src >= n_own
        used[a_src[a_halo] - n_own] = True
        new_pos = torch.cumsum(used.to(long), 0) - 1
        a_src[a_halo] = n_own + new_pos[a_src[a_halo] - n_own]
    halo_ids = part.halo_ids[used]
    H = int(halo_ids.numel())
    post_recv_counts = torch.bincount(halo_owner[used], minlength=P)

    # Post send: distinct (destination rank, owned source) of post out-edges;
    # local order == global id order (owned ids ascending).
    stride = max(n_own, 1)
    post_out = (~out_pre).nonzero().flatten()
    key = _keys_unique(part.out_dst_rank[post_out] * stride + part.out_src[post_out])
    post_send_index = key % stride
    post_send_counts = torch.bincount(key // stride, minlength=P)

    # Pre send: one slot per distinct (destination rank, destination id).
    out_edges = out_pre.nonzero().flatten()
    b_key = part.out_dst_rank[out_edges] * N + part.out_dst[out_edges]
    slot_key = _keys_unique(b_key)
    pre_slot_ids = slot_key % N
    pre_send_counts = torch.bincount(slot_key // N, minlength=P)
    S_pre = int(pre_slot_ids.numel())
    b_src = part.out_src[out_edges]
    b_dst = n_own + torch.searchsorted(slot_key, b_key)

    # Pre receive: distinct (source rank, owned destination) of pre in-edges.
    pre_in = in_pre.nonzero().flatten()
    r_key = _keys_unique(halo_owner[src_l[pre_in] - n_own] * stride + dst_l[pre_in])
    pre_recv_index = r_key % stride
    pre_recv_counts = torch.bincount(r_key // stride, minlength=P)

    looped = None
    if keeps_all and b_src.numel() == 0:
        # The mode's edges are the in-edge list itself: share it (post, or nothing cut).
        edge_index = part.edge_index
    else:
        # One buffer for the edges and, after them, a self-loop per owned node: gcn_norm's
        # looped edge list is then this buffer, not a second copy of every edge (38 MiB a
        # rank on 1M nodes at P = 4), as long as the edges have no self-loops of their own.
        e_a, e_b = int(a_src.numel()), int(b_src.numel())
        looped = torch.empty(2, e_a + e_b + n_own, dtype=torch.long)
        torch.cat([a_src, b_src], out=looped[0, :e_a + e_b])
        torch.cat([a_dst, b_dst], out=looped[1, :e_a + e_b])
        looped[:, e_a + e_b:] = torch.arange(n_own)
        edge_index = looped[:, :e_a + e_b]
    return AggregationPlan(
        mode=mode, num_owned=n_own, halo_ids=halo_ids, num_pre_slots=S_pre,
        pre_slot_ids=pre_slot_ids,
        post=ChannelPlan(send_index=post_send_index, send_counts=post_send_counts,
                         recv_index=torch.arange(n_own, n_own + H),
                         recv_counts=post_recv_counts),
        pre=ChannelPlan(send_index=torch.arange(n_own, n_own + S_pre),
                        send_counts=pre_send_counts, recv_index=pre_recv_index,
                        recv_counts=pre_recv_counts),
        edge_index=edge_index, in_edges=in_edges, out_edges=out_edges, looped=looped)


def build_reverse_plan(part: "LocalPartition") -> AggregationPlan:
    r"""The post-aggregation plan of the **reversed** graph (every edge flipped), for layers
    that also aggregate over out-edges (``DirGNNConv``).

    In the reversed graph the in-edges of an owned node :math:`u` are its out-edges: those
    inside the partition (in-edges with an owned source) and its outgoing cut edges, whose
    destinations become this plan's halo.  The owner of such a destination :math:`v` sends its
    row; it knows which rows from its own in-edges whose source is a halo node of this rank.
    Both sides order a rank pair's rows by global id, so no communication is needed.

    Returns:
        A ``"post"`` :class:`AggregationPlan` whose :attr:`~AggregationPlan.edge_index` holds
        the reversed in-edges of the owned nodes: (a) the in-edges with owned sources, flipped,
        in :attr:`LocalPartition.edge_index` order (:attr:`~AggregationPlan.in_edges`), then
        (b) the outgoing cut edges, flipped, in global edge order
        (:attr:`~AggregationPlan.out_edges`).
    """
    if part.out_edge_ids is None:
        raise ValueError("this partition has no outgoing-cut-edge data (built by an old "
                         "version?); re-partition the graph")
    P, n_own, N = part.num_parts, part.num_owned, part.num_nodes
    src_l, dst_l = part.edge_index[0], part.edge_index[1]

    # Halo: distinct destinations of the outgoing cut edges, by owner rank then global id.
    key = part.out_dst_rank * N + part.out_dst
    halo_key = _keys_unique(key)
    halo_ids = halo_key % N
    recv_counts = torch.bincount(halo_key // N, minlength=P)
    H = int(halo_ids.numel())

    # Send: owned targets of in-edges from each rank's nodes, by rank then global id.
    cut = (src_l >= n_own).nonzero().flatten()
    halo_owner = torch.repeat_interleave(torch.arange(P), part.halo_counts)
    owner = halo_owner[src_l[cut] - n_own]
    send_key = _keys_unique(owner * N + part.owned_ids[dst_l[cut]])
    send_ids = send_key % N
    local_of = torch.searchsorted(part.owned_ids, send_ids)  # owned ids ascending
    send_counts = torch.bincount(send_key // N, minlength=P)

    inside = (src_l < n_own).nonzero().flatten()
    out_edges = torch.arange(int(part.out_edge_ids.numel()))
    edge_index = torch.stack([
        torch.cat([dst_l[inside], n_own + torch.searchsorted(halo_key, key)]),
        torch.cat([src_l[inside], part.out_src])])
    empty = torch.zeros(0, dtype=torch.long)
    none = torch.zeros(P, dtype=torch.long)
    return AggregationPlan(
        mode="post", num_owned=n_own, halo_ids=halo_ids, num_pre_slots=0, pre_slot_ids=empty,
        post=ChannelPlan(send_index=local_of, send_counts=send_counts,
                         recv_index=torch.arange(n_own, n_own + H), recv_counts=recv_counts),
        pre=ChannelPlan(send_index=empty, send_counts=none, recv_index=empty, recv_counts=none),
        edge_index=edge_index, in_edges=inside, out_edges=out_edges)
