r"""Post rows and pre partials in one buffer per peer: one collective per direction.

A hybrid (or pre) layer used to make two collectives per direction: the post channel's source
rows before its aggregation, and the pre channel's partial aggregates after it.  The partials
depend only on the sender's own rows and the edge values both ends hold (the message of a
:data:`~.aggregation.PRE_LAYERS` layer is a source row times an edge scalar), so the sender can
compute them *before* the aggregation, from the same rows it sends.  Both then travel in one
``all_to_all_single``: for each peer its post rows, then its partials.  The receiver aggregates
its in-edges over ``[owned; halo]`` and adds the partials it received into their destinations
afterwards.  The backward is its mirror: the gradients of the halo rows and of the partials
received go back in one buffer.

Exactness: the partials are the sums the pre channel sent, over the same edges and values, so
the result equals the two-collective exchange (and single-process PyG) to floating-point
rounding (the pre edges' terms are summed apart from the in-edges'); the exactness suite runs
it in every lossless mode.

A lossy codec that gives every row the same width (``"int2"``, ``"int2-compact"``,
``"bf16"``, ...) encodes the buffer as it would encode either channel: it quantizes row by row,
so a partial is coded as the pre channel would code it, and each peer's share of the wire is
its rows times the codec's bytes per row, which the receiver knows from the plan.  A per-node
codec (``"adaptive"``) widens the post rows by their own levels, which the partials do not have;
it keeps two collectives.

It is taken where, in each direction, both channels share one such codec, and during training
no halo cache, pipeline or boundary sampling runs (stages that treat the two channels
differently): conditions the same on every rank, so all ranks make the same collectives.
Otherwise the layer keeps the two collectives.
"""
import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .codecs import IdentityCodec

__all__ = ["OneBufferPlan", "PreEdges", "one_buffer_applies", "exchange_one_buffer",
           "start_one_buffer", "pre_partials", "Received"]


class PreEdges(NamedTuple):
    r"""A rank's outgoing pre edges, as the one-buffer exchange uses them.

    Args:
        edges (torch.Tensor): ``[owned source; pre slot]``, :math:`[2, E_{pre}]`.
        reversed (torch.Tensor): ``[pre slot; position in sources]``: the partials'
            gradients aggregate back over it into :obj:`sources`' rows only (not into every
            owned row, most of which have no pre edge).
        sources (torch.Tensor): The owned rows with a pre edge, ascending.
    """
    edges: Tensor
    reversed: Tensor
    sources: Tensor

    @classmethod
    def of(cls, edges: Tensor) -> "PreEdges":
        sources, position = torch.unique(edges[0], sorted=True, return_inverse=True)
        return cls(edges, torch.stack([edges[1], position]), sources)


@dataclass
class OneBufferPlan:
    r"""Where each row sits in the one-buffer exchange of a :class:`~.exchange.HaloExchange`.

    Args:
        send_counts (List[int]): Rows sent to each peer (post rows plus partials).
        recv_counts (List[int]): Rows received from each peer.
        post_dest (torch.Tensor): Wire row of each post row sent (``plan.post.send_index``
            order).
        pre_dest (torch.Tensor): Wire row of each partial sent (pre slot order).
        halo_pos (torch.Tensor): Wire rows received that are halo rows, in halo order.
        pre_pos (torch.Tensor): Wire rows received that are partials, in the pre channel's
            receive order (``plan.pre.recv_index`` gives their destinations).
    """
    send_counts: List[int]
    recv_counts: List[int]
    post_dest: Tensor
    pre_dest: Tensor
    halo_pos: Tensor
    pre_pos: Tensor
    #: Per peer ``(post rows, partials)`` sent and received: the wire is, peer after peer,
    #: a slice of post rows then a slice of partials, which :func:`_pack` and
    #: :func:`_add_grads` fill and read slice by slice (no gathered copy in between).
    sent: List[Tuple[int, int]] = ()
    received: List[Tuple[int, int]] = ()

    @classmethod
    def of(cls, post_send: List[int], post_recv: List[int], pre_send: List[int],
           pre_recv: List[int], device: torch.device) -> "OneBufferPlan":
        post_dest, pre_dest, halo, pre = [], [], [], []
        send_at, recv_at = 0, 0
        for a, b, c, d in zip(post_send, pre_send, post_recv, pre_recv):
            post_dest.append(torch.arange(send_at, send_at + a))
            pre_dest.append(torch.arange(send_at + a, send_at + a + b))
            halo.append(torch.arange(recv_at, recv_at + c))
            pre.append(torch.arange(recv_at + c, recv_at + c + d))
            send_at, recv_at = send_at + a + b, recv_at + c + d
        cat = lambda parts: torch.cat(parts).to(device)  # noqa: E731
        return cls([a + b for a, b in zip(post_send, pre_send)],
                   [c + d for c, d in zip(post_recv, pre_recv)], cat(post_dest), cat(pre_dest),
                   cat(halo), cat(pre), list(zip(map(int, post_send), map(int, pre_send))),
                   list(zip(map(int, post_recv), map(int, pre_recv))))


def one_buffer_applies(policy, key: str, pre_key: str, training: bool) -> bool:
    r"""Whether the :class:`~.policy.ExchangePolicy` lets both channels of this exchange
    point travel in one buffer: in each direction the rows and the partials share one codec
    that gives every row the same width (the identity or a quantizer; a per-node codec widens
    the post rows by their own levels, not the partials), and during training no halo cache,
    pipeline or boundary sampling treats the two channels differently.  The same answer on
    every rank: it reads the policy and the training flag only."""
    for direction in ("forward", "backward"):
        codec = policy.codec(key, direction)
        if not _same_codec(codec, policy.codec(pre_key, direction)) \
                or getattr(codec, "per_node", False):
            return False
        for point in (key, pre_key):
            if training and policy.cache(point, direction) is not None:
                return False
    if training and (policy.pipeline is not None or (
            policy.sampling is not None and policy.sampling.rate < 1.0)):
        return False
    return True


def _same_codec(a, b) -> bool:
    r"""Whether two codecs write the same wire (one object, or both the identity)."""
    return a is b or (isinstance(a, IdentityCodec) and isinstance(b, IdentityCodec))


def _backend(requested: Optional[str], t: Tensor) -> str:
    r"""The kernels' backend the layers run on (the engine's choice, fixed for a run), else
    PyTorch's index operations."""
    if requested is None:
        return "torch"
    from ..kernels.backend import resolve
    return resolve(requested, t.device) or "torch"


def pre_partials(own: Tensor, edges: Tensor, value: Optional[Tensor], num_slots: int,
                 backend: Optional[str] = None) -> Tensor:
    r"""The pre slots' partial aggregates: :math:`p_s = \sum_{(j, s)} w_{js} x_j` over this
    rank's outgoing pre edges ``edges`` (``[owned source; pre slot]``) with edge scalars
    ``value`` (:obj:`None` for 1), promoted as PyG's messages are (bfloat16 rows, fp32
    weights give fp32)."""
    from ..kernels.functional import aggregate
    rows = own if value is None else own.to(torch.promote_types(own.dtype, value.dtype))
    return aggregate(rows, edges, value, "sum", num_slots, backend=_backend(backend, own))


def exchange_one_buffer(ex, own: Tensor, pre: PreEdges, weight: Optional[Tensor],
                        key: str) -> Tuple[Tensor, Tensor]:
    r"""``[owned; halo]`` rows and the partials this rank receives, in one collective per
    direction (:class:`_OneBuffer`); the partials are computed from :obj:`own` over the
    rank's outgoing :obj:`pre` edges with edge scalars :obj:`weight` (aligned with
    ``pre.edges``), which must not require a gradient."""
    return _OneBuffer.apply(own, ex, key, pre, weight)


def _add_grads(ex, plan: OneBufferPlan, grad_own: Tensor, back: Tensor, pre: PreEdges,
               weight: Optional[Tensor]) -> Tensor:
    r""":obj:`grad_own` (``[N_own, *]``) plus the gradients that came back: of the post rows
    sent, and through the partials (:math:`\partial p_s / \partial x_j = w_{js}`: the
    partials' gradients aggregated back over the reversed pre edges)."""
    from ..kernels.functional import aggregate
    n, width = grad_own.size(0), math.prod(grad_own.shape[1:])
    back = back.to(grad_own.dtype)
    out = grad_own.reshape(n, width).clone()
    index = ex.plan.post.send_index
    at = post_at = 0
    for posts, partials in plan.sent:  # each peer's slice of post rows, added where they came from
        if posts:
            out.index_add_(0, index[post_at:post_at + posts], back[at:at + posts])
        at, post_at = at + posts + partials, post_at + posts
    if plan.pre_dest.numel():
        grad_partials = back.index_select(0, plan.pre_dest)
        through = aggregate(grad_partials if weight is None else grad_partials.to(
            torch.promote_types(grad_partials.dtype, weight.dtype)), pre.reversed, weight,
            "sum", pre.sources.numel(), backend=_backend(ex.partials_backend, grad_own))
        out.index_add_(0, pre.sources, through.to(out.dtype))
    return out


def _pack(ex, plan: OneBufferPlan, own: Tensor, partials: Tensor, width: int) -> Tensor:
    r"""The wire rows: for each peer its post rows, then its partials (each gathered or
    copied straight into its slice)."""
    wire = own.new_empty((sum(plan.send_counts), width))
    rows = own.reshape(own.size(0), width)
    partials = partials.to(own.dtype).reshape(-1, width)
    index = ex.plan.post.send_index
    at = post_at = pre_at = 0
    for posts, slots in plan.sent:  # pre slots are numbered peer by peer
        if posts:
            torch.index_select(rows, 0, index[post_at:post_at + posts], out=wire[at:at + posts])
        if slots:
            wire[at + posts:at + posts + slots].copy_(partials[pre_at:pre_at + slots])
        at, post_at, pre_at = at + posts + slots, post_at + posts, pre_at + slots
    return wire


def _pack_grad(plan: OneBufferPlan, grad_halo: Tensor, grad_received: Optional[Tensor],
               width: int) -> Tensor:
    r"""The backward's wire rows: the gradients of the rows received, in their places (halo
    rows and partials are received peer by peer: each peer's are one slice)."""
    wire = grad_halo.new_empty((sum(plan.recv_counts), width))
    grad_halo = grad_halo.reshape(-1, width)
    if grad_received is not None:
        grad_received = grad_received.reshape(-1, width).to(wire.dtype)
    at = halo_at = pre_at = 0
    for halo, partials in plan.received:
        wire[at:at + halo].copy_(grad_halo[halo_at:halo_at + halo])
        if partials:
            part = wire[at + halo:at + halo + partials]
            if grad_received is None:
                part.zero_()
            else:
                part.copy_(grad_received[pre_at:pre_at + partials])
        at, halo_at, pre_at = at + halo + partials, halo_at + halo, pre_at + partials
    return wire


class _OneBuffer(torch.autograd.Function):
    r"""``own [N_own, *] -> ([N_own + N_halo, *], [R_pre, *])``: rows and partials out, halo
    rows and partials in."""

    @staticmethod
    def forward(ctx, own: Tensor, ex, key: str, pre: PreEdges, weight: Optional[Tensor]):
        ctx.ex, ctx.key, ctx.pre = ex, key, (pre, weight)
        plan: OneBufferPlan = ex.one_buffer_plan(own.device)
        shape = tuple(own.shape[1:])
        width = math.prod(shape)
        partials = pre_partials(own, pre.edges, weight, ex.num_pre_slots, ex.partials_backend)
        received, _ = ex._transfer(_pack(ex, plan, own, partials, width), plan.send_counts,
                                   plan.recv_counts, key, "forward")
        rows = own.new_empty((own.size(0) + ex.num_halo, ) + shape)
        rows[:own.size(0)].copy_(own)
        torch.index_select(received, 0, plan.halo_pos,
                           out=rows[own.size(0):].view(ex.num_halo, width))
        return rows, received.index_select(0, plan.pre_pos).reshape((-1, ) + shape)

    @staticmethod
    def backward(ctx, grad_rows: Tensor, grad_received: Optional[Tensor]):
        ex = ctx.ex
        plan: OneBufferPlan = ex.one_buffer_plan(grad_rows.device)
        n = ex.num_owned
        shape = tuple(grad_rows.shape[1:])
        wire = _pack_grad(plan, grad_rows[n:], grad_received, math.prod(shape))
        back, _ = ex._transfer(wire, plan.recv_counts, plan.send_counts, ctx.key, "backward")
        grad_own = _add_grads(ex, plan, grad_rows[:n], back, *ctx.pre)
        return grad_own.reshape((n, ) + shape), None, None, None, None


# -- overlapped: the owned edges aggregate while the buffer travels -------------------------------
class Received:
    r"""The partials an overlapped exchange receives, set when its halo rows complete."""

    __slots__ = ("rows", )

    def __init__(self) -> None:
        self.rows: Optional[Tensor] = None


class _Handoff:
    r"""Between the two backward halves of an overlapped one-buffer exchange (as the post
    channel's :class:`~.exchange._GradHandoff`), with what the partials' backward needs."""

    __slots__ = ("pending", "owned_done", "pre")

    def __init__(self, pre: PreEdges, weight: Optional[Tensor]) -> None:
        self.pending = None
        self.owned_done = False
        self.pre = (pre, weight)

    def add_into(self, ex, grad_own: Tensor, pending) -> Tensor:
        r""":obj:`grad_own` plus what came back (``pending``: the started transfer)."""
        plan, finish = pending
        return _add_grads(ex, plan, grad_own, finish(), *self.pre).reshape(grad_own.shape)


def start_one_buffer(ex, own: Tensor, pre: PreEdges, weight: Optional[Tensor], key: str):
    r"""Starts the one-buffer exchange and returns ``(owned rows, complete, received)``:
    ``complete()`` waits and returns the halo rows (for a
    :class:`~lightning_fullgraph.kernels.split.SplitRows`), after which ``received.rows``
    holds the partials received.  The backward overlaps too: the gradients start back as
    soon as the halo part's backward has run, and are added when the owned part's has.
    :obj:`weight` must not require a gradient (it is not returned)."""
    plan: OneBufferPlan = ex.one_buffer_plan(own.device)
    shape = tuple(own.shape[1:])
    width = math.prod(shape)
    with torch.no_grad():
        partials = pre_partials(own, pre.edges, weight, ex.num_pre_slots, ex.partials_backend)
        finish = ex._transfer_async(_pack(ex, plan, own, partials, width), plan.send_counts,
                                    plan.recv_counts, key, "forward")
    grads = own.requires_grad and torch.is_grad_enabled()
    handoff = _Handoff(pre, weight) if grads else None
    from .exchange import _OwnedGrad  # (the exchange module imports this one)
    local = _OwnedGrad.apply(own, ex, handoff) if handoff is not None else own
    received = Received()

    def complete() -> Tensor:
        halo, received.rows = _RemotePart.apply(own, ex, key, finish, handoff)
        return halo

    return local, complete, received


class _RemotePart(torch.autograd.Function):
    r"""``own -> (halo rows, partials received)``, the transfer started before; backward
    starts the gradients back (completed by the exchange's ``_OwnedGrad``), or sends them at
    once when the owned part's backward already ran."""

    @staticmethod
    def forward(ctx, own: Tensor, ex, key: str, finish, handoff: Optional[_Handoff]):
        ctx.ex, ctx.key, ctx.handoff = ex, key, handoff
        ctx.shape = tuple(own.shape)
        plan: OneBufferPlan = ex.one_buffer_plan(own.device)
        flat = finish().to(own.dtype)
        rest = tuple(own.shape[1:])
        return flat.index_select(0, plan.halo_pos).reshape((-1, ) + rest), \
            flat.index_select(0, plan.pre_pos).reshape((-1, ) + rest)

    @staticmethod
    def backward(ctx, grad_halo: Optional[Tensor], grad_received: Optional[Tensor]):
        ex, handoff = ctx.ex, ctx.handoff
        like = grad_halo if grad_halo is not None else grad_received
        plan: OneBufferPlan = ex.one_buffer_plan(like.device)
        width = math.prod(ctx.shape[1:])
        if grad_halo is None:
            grad_halo = like.new_zeros((plan.halo_pos.numel(), ) + ctx.shape[1:])
        wire = _pack_grad(plan, grad_halo, grad_received, width)
        if handoff is not None and not handoff.owned_done:
            handoff.pending = (plan, ex._transfer_async(wire, plan.recv_counts,
                                                        plan.send_counts, ctx.key, "backward"))
            return None, None, None, None, None
        back, _ = ex._transfer(wire, plan.recv_counts, plan.send_counts, ctx.key, "backward")
        grad_own = like.new_zeros(ctx.shape)
        if handoff is None:  # no gradient of own was expected: nothing to add it to
            return None, None, None, None, None
        return _add_grads(ex, plan, grad_own, back, *handoff.pre).reshape(ctx.shape), None, \
            None, None, None
