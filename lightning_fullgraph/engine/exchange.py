r"""The halo exchange of one rank: plan + transport + policy, as autograd functions.

An :class:`~lightning_fullgraph.partition.AggregationPlan` (built at partition time) says which
rows go from which rank to which on two channels:

* **post** (source rows): the owner of a boundary source sends its row; the receiver appends
  it after its owned rows (:meth:`HaloExchange.extend`, ``[N_own, *] -> [N_own + N_halo, *]``),
  and in backward returns the halo gradients to the owner, which adds them to its own;
* **pre** (partial aggregates, SuperGCN): a sender aggregates its own sources into *pre slots*
  of remote destinations; :meth:`HaloExchange.reduce` sends the slots to the destinations'
  owners, which add them into their rows (``[N_own + S_pre, *] -> [N_own, *]``); backward sends
  the owners' gradients back to the slots.

Every transfer goes through :class:`~.transport.Transport` (counted, timed, device-aware) with
the codec the :class:`~.policy.ExchangePolicy` assigns to the exchange point and direction.
The public entry points are excluded from ``torch.compile`` tracing (a graph break), so a
compiled model exchanges rows exactly as an eager one.
"""
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from .cache import (CacheState, HaloCache, mask_bytes, pack_mask, per_peer, row_change,
                    select_rows, unpack_mask)
from .codecs import Codec, IdentityCodec, WireContext
from .codecs.registry import wire_bits
from .one_buffer import OneBufferPlan
from .pipeline import AsyncPipeline, PipeState
from ..kernels.split import SplitRows, split_accepted
from .context import current_layer
from .file_pages import release_consumed
from .policy import ExchangePolicy
from .stats import CommStats
from .transport import Transport

_IDENTITY = IdentityCodec()  # the graph's structure (degrees) travels exact

__all__ = ["HaloExchange", "STATIC_STEP", "static_draws"]

#: The step whose draws a kept (static) aggregation's exchanges use, whatever step computes it.
STATIC_STEP = -1
_static_draws = [0]  # nesting depth of static_draws()


@contextmanager
def static_draws() -> Iterator[None]:
    r"""Inside, every exchange's codec draws as for :data:`STATIC_STEP` instead of the
    current step.

    An aggregation of a static input is exchanged once and then kept for every later step
    (:mod:`.static`); the step that first computes it depends on where training started (the
    first step, or the step a resumed run starts from), so its codec rounding must not: a
    resumed run then keeps the very aggregate the uninterrupted run kept.
    """
    _static_draws[0] += 1
    try:
        yield
    finally:
        _static_draws[0] -= 1


def _counts(t: Tensor) -> List[int]:
    return [int(c) for c in t.tolist()]


class HaloExchange:
    r"""Halo rows and partial aggregates of one rank, for one aggregation plan.

    Args:
        plan (AggregationPlan): This rank's plan (``partition.plan(mode)``).
        transport (Transport, optional): Moves the wire rows (default: the world group).
        policy (ExchangePolicy or Codec, optional): How each exchange point crosses the wire
            (default: exact).
        seed (int): Seed shared by all ranks, for stochastic codecs.
    """

    def __init__(self, plan: Any, transport: Optional[Transport] = None,
                 policy: Any = None, seed: int = 0) -> None:
        self.plan = plan
        self.transport = transport if transport is not None else Transport()
        self.policy = ExchangePolicy.of(policy)
        self.seed = int(seed)
        self.step = 0  # advanced by the engine once per training step
        # Overlap (synchronous mode): hand the kernels owned rows now and the halo rows
        # when they arrive (extend), so the owned-source edges aggregate meanwhile.
        self.overlap = False
        self._sample_memo: Optional[tuple] = None  # this step's boundary sample (_sampled)
        world = self.transport.world_size
        for name, channel in (("post", plan.post), ("pre", plan.pre)):
            if channel.send_counts.numel() != world or channel.recv_counts.numel() != world:
                raise ValueError(
                    f"exchange plan was built for {channel.send_counts.numel()} ranks but the "
                    f"process group has {world}; re-partition for {world} parts")
            if int(channel.send_counts.sum()) != channel.send_index.numel() \
                    or int(channel.recv_counts.sum()) != channel.recv_index.numel():
                raise ValueError(f"the {name} channel's counts do not add up to its indices")
        self.num_owned = int(plan.num_owned)
        self.num_halo = int(plan.halo_ids.numel())
        self.num_pre_slots = int(plan.num_pre_slots)
        if self.num_pre_slots and not torch.equal(
                plan.pre.send_index.cpu(),
                torch.arange(self.num_owned, self.num_owned + self.num_pre_slots)):
            raise ValueError("pre-channel rows must be the pre slots in order "
                             "(N_own ... N_own + S_pre - 1)")
        self._post_send, self._post_recv = _counts(plan.post.send_counts), \
            _counts(plan.post.recv_counts)
        self._pre_send, self._pre_recv = _counts(plan.pre.send_counts), \
            _counts(plan.pre.recv_counts)
        self.mode = getattr(plan, "mode", "post")
        # A channel the mode leaves empty on every rank needs no collective at all (in "pre"
        # mode no source row crosses the wire, in "post" no partial aggregate).
        self.post_empty = self.mode == "pre"
        self.pre_empty = self.mode == "post"
        # Importance levels of the post channel's rows (set_levels), for per-node widths.
        self.send_levels: Optional[Tensor] = None
        self.halo_levels: Optional[Tensor] = None
        # The adaptive halo cache's state per (channel, exchange point, direction).
        self._cache_states: dict = {}
        # The asynchronous pipeline's state, keyed the same way.
        self._pipes: dict = {}
        # The one-buffer exchange's row positions, per device (one_buffer_plan), and the
        # kernels' backend its partial aggregates run on (None: PyTorch's; the engine sets
        # it with the layers' kernels).
        self._one_buffer: dict = {}
        self.partials_backend: Optional[str] = None
        # Global node ids of the post channel's send slots, and of the destinations of the
        # pre channel's received rows (boundary sampling draws by them).
        self.send_ids: Optional[Tensor] = None
        self.pre_recv_ids: Optional[Tensor] = None
        # Ranks this rank exchanges anything with (named when a collective fails).
        self.peers = tuple(r for r in range(world) if r != self.rank and (
            self._post_send[r] or self._post_recv[r] or self._pre_send[r] or self._pre_recv[r]))

    @classmethod
    def from_partition(cls, partition, mode: str = "post", group: Optional[Any] = None,
                       policy: Any = None, timeout: Optional[Any] = None,
                       transport: Optional[Transport] = None, seed: int = 0) -> "HaloExchange":
        r"""The exchange of a :class:`~lightning_fullgraph.partition.LocalPartition` in
        aggregation :obj:`mode` (``"post"``, ``"pre"`` or ``"hybrid"``)."""
        if transport is None:
            # A pipeline's transfers get a group of their own (see transport.py).
            pipelined = ExchangePolicy.of(policy).pipeline is not None
            transport = Transport(group, timeout=timeout, background=pipelined)
        return cls(partition.plan(mode), transport, policy, seed)

    # -- properties --------------------------------------------------------------------------
    @property
    def stats(self) -> CommStats:
        return self.transport.stats

    @property
    def group(self) -> Optional[Any]:
        return self.transport.group

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def world_size(self) -> int:
        return self.transport.world_size

    @property
    def timeout(self) -> Optional[Any]:
        return self.transport.timeout

    @property
    def num_local(self) -> int:
        r"""Rows of an extended source tensor: owned plus halo."""
        return self.num_owned + self.num_halo

    @property
    def num_targets(self) -> int:
        r"""Rows of an extended aggregation: owned plus pre slots."""
        return self.num_owned + self.num_pre_slots

    def to(self, device) -> "HaloExchange":
        r"""Moves the plan's index tensors to :obj:`device` (where the rows live)."""
        for channel in (self.plan.post, self.plan.pre):
            channel.send_index = channel.send_index.to(device)
            channel.recv_index = channel.recv_index.to(device)
        self._sample_memo = None
        return self

    def set_levels(self, send_levels: Tensor, halo_levels: Tensor) -> "HaloExchange":
        r"""The importance level of every post-channel row: of the rows sent
        (:math:`[S]`, in ``plan.post.send_index`` order) and of the halo rows received
        (:math:`[H]`); a codec with per-node widths sizes each row by it."""
        if send_levels.numel() != self.plan.post.num_send or \
                halo_levels.numel() != self.num_halo:
            raise ValueError(f"levels for {send_levels.numel()} sent and {halo_levels.numel()} "
                             f"halo rows, but the plan has {self.plan.post.num_send} and "
                             f"{self.num_halo}")
        self.send_levels, self.halo_levels = send_levels, halo_levels
        return self

    @staticmethod
    def _training() -> bool:
        r"""Whether this exchange belongs to a training step (a layer in training mode with
        gradients on): only those may use cached rows; evaluation always sees fresh ones."""
        active = current_layer()
        return torch.is_grad_enabled() and active is not None and bool(active.training)

    def one_buffer_plan(self, device: torch.device) -> OneBufferPlan:
        r"""Where post rows and partials sit in the one-buffer exchange (:mod:`.one_buffer`),
        with its indices on :obj:`device`."""
        plan = self._one_buffer.get(device)
        if plan is None:
            plan = OneBufferPlan.of(self._post_send, self._post_recv, self._pre_send,
                                    self._pre_recv, device)
            self._one_buffer[device] = plan
        return plan

    # -- the two channels ----------------------------------------------------------------------
    @torch.compiler.disable
    def extend(self, x: Tensor, key: str = "x", dim: int = 0, exact: bool = False) -> Tensor:
        r"""Appends the halo rows to a tensor of owned rows (post channel).

        Args:
            x (torch.Tensor): Owned rows, :math:`N_{own}` along :obj:`dim`.
            key (str): Name of the exchange point, for statistics and codecs.
            dim (int): The node dimension.
            exact (bool): The graph's structure (e.g. degrees), not features: sent as they
                are, past the codec, the halo cache, the pipeline and boundary sampling (a
                normalization computed once from a sampled or rounded degree would be
                wrong for every later step).

        Returns:
            :math:`[N_{own} + N_{halo}, *]` along :obj:`dim`; differentiable.
        """
        dim = dim % x.dim()
        if x.size(dim) != self.num_owned:
            raise ValueError(
                f"halo exchange '{key}': expected {self.num_owned} owned rows along "
                f"dim {dim}, got {x.size(dim)}")
        if exact:
            return _HaloRows.apply(x.movedim(dim, 0), self, key, False, True).movedim(0, dim)
        training = self._training()
        if dim != 0:
            return _HaloRows.apply(x.movedim(dim, 0), self, key, training).movedim(0, dim)
        if self.overlap and split_accepted():
            split = self._extend_split(x, key, training)
            if split is not None:
                return split
        return _HaloRows.apply(x, self, key, training)

    def _extend_split(self, x: Tensor, key: str, training: bool) -> Optional[SplitRows]:
        r"""Starts the post channel's transfer and returns the owned rows with a function
        that completes it (the overlap), or ``None`` where a policy needs the synchronous
        path (halo cache, pipeline).  Boundary sampling overlaps too: its kept rows travel
        while the owned part aggregates, and their gradients while the owned part's
        backward runs.  Either way the same collectives run with the same sizes, so ranks
        may decide differently."""
        if self.post_empty or x.dim() != 2:
            return None
        if training and (self.policy.pipeline is not None
                         or self.policy.cache(key, "forward") is not None
                         or self.policy.cache(key, "backward") is not None):
            return None
        sampled = self._sampled() if training else None
        send = x.index_select(0, self.plan.post.send_index)
        if sampled is None:
            complete = self._transfer_async(send.detach(), self._post_send, self._post_recv,
                                            key, "forward", self._post_levels("forward"))
        else:
            complete = self._start_sampled(send.detach(), sampled, key, "forward")
        # Backward overlap: the halo rows' gradients start back to their owners as soon as
        # they are computed (the halo part's backward runs first), and the owned part's
        # backward runs while they travel; _OwnedGrad waits for them and adds them in.
        handoff = _GradHandoff() if x.requires_grad and torch.is_grad_enabled() else None
        local = _OwnedGrad.apply(x, self, handoff) if handoff is not None else x
        return SplitRows(local, lambda: _HaloRecv.apply(send, self, key, training, complete,
                                                        handoff, sampled), self.num_halo)

    @torch.compiler.disable
    def reduce(self, aggregated: Tensor, key: str = "x.pre", in_place: bool = False) -> Tensor:
        r"""Adds the partial aggregates of the pre slots into their owners' rows (pre channel).

        Every rank must call it for the same exchange points in the same order, also with
        no slots of its own.

        Args:
            aggregated (torch.Tensor): :math:`[N_{own} + S_{pre}, *]`: owned rows, then this
                rank's pre slots.
            key (str): Name of the exchange point.
            in_place (bool, optional): Add into :obj:`aggregated`'s owned rows instead of a
                copy of them (the result then lives on its storage). For a fresh aggregation
                output that nothing else reads (the partitioned layers' case): it saves an
                :math:`[N_{own}, *]` copy. A leaf that requires a gradient is never modified.
                (default: :obj:`False`)

        Returns:
            :math:`[N_{own}, *]`; differentiable.
        """
        if aggregated.size(0) != self.num_targets:
            raise ValueError(f"pre-aggregation '{key}': expected {self.num_targets} rows "
                             f"(owned + pre slots), got {aggregated.size(0)}")
        return _PreRows.apply(aggregated, self, key, self._training(), in_place)

    @torch.compiler.disable
    def to_slots(self, owned: Tensor, key: str) -> Tensor:
        r"""The owners' rows of every pre slot's destination, e.g. degrees (no autograd).

        The transpose of :meth:`reduce`: ``[N_own, *] -> [S_pre, *]``.
        """
        rows = owned.index_select(0, self.plan.pre.recv_index)
        return self._send(rows, self._pre_recv, self._pre_send, key, "forward", exact=True)

    # -- one transfer ------------------------------------------------------------------------------
    def _send(self, rows: Tensor, send_counts: List[int], recv_counts: List[int], key: str,
              direction: str, levels: Optional[Tuple[Tensor, Tensor]] = None,
              training: bool = False, channel: str = "post", exact: bool = False,
              into: Optional[Tensor] = None) -> Tensor:
        r"""Encodes, exchanges and decodes rows.  :obj:`levels` (of the rows sent, of the
        rows received) lets a per-node codec give each row its own width: the rows then
        travel as one byte stream whose per-peer sizes both ends compute from the levels.
        :obj:`training` (an exchange of a training step) lets the policy's
        :class:`~.cache.HaloCache` skip rows the receivers hold closely enough, or its
        :class:`~.pipeline.AsyncPipeline` hand out the previous step's rows.  :obj:`exact`
        rows (the graph's structure) skip the codec.  :obj:`into` (contiguous, the rows
        received's shape) receives the rows and is returned: rows sent as they are arrive
        there directly, others are decoded and copied there."""
        shape = rows.shape[1:]
        flat = rows.reshape(rows.size(0), math.prod(shape))
        if into is not None:
            plain = not training or (self.policy.cache(key, direction) is None
                                     and self.policy.pipeline is None)
            direct = into.dtype == rows.dtype and (exact or (plain and isinstance(
                self.policy.codec(key, direction), IdentityCodec)))
            if direct:
                self._transfer(flat, send_counts, recv_counts, key, direction, exact=exact,
                               into=into.view(into.size(0), flat.size(1)))
                return into
            into.copy_(self._send(rows, send_counts, recv_counts, key, direction, levels,
                                  training, channel, exact))
            return into
        if exact:
            out, _ = self._transfer(flat, send_counts, recv_counts, key, direction, exact=True)
            return out.reshape((out.size(0), ) + tuple(shape))
        cache = self.policy.cache(key, direction) if training else None
        pipeline = self.policy.pipeline if training else None
        if cache is not None:  # then the pipeline, if any, carries the cache's rows
            out = self._send_cached(flat, send_counts, recv_counts, key, direction, levels,
                                    cache, channel, pipeline=pipeline)
        elif pipeline is not None:
            out = self._send_pipelined(flat, send_counts, recv_counts, key, direction, levels,
                                       pipeline, channel)
        else:
            out, _ = self._transfer(flat, send_counts, recv_counts, key, direction, levels)
        return out.reshape((out.size(0), ) + tuple(shape))

    def _context(self, key: str, direction: str, flat: Tensor) -> WireContext:
        r"""The codec's context of one transfer (its step :data:`STATIC_STEP` inside
        :func:`static_draws`)."""
        step = STATIC_STEP if _static_draws[0] else self.step
        return WireContext(key, direction, step, self.rank, flat.size(1), flat.dtype, self.seed)

    def _transfer(self, flat: Tensor, send_counts: List[int], recv_counts: List[int], key: str,
                  direction: str, levels: Optional[Tuple[Tensor, Tensor]] = None,
                  echo: bool = False, exact: bool = False,
                  into: Optional[Tensor] = None) -> Tuple[Tensor, Optional[Tensor]]:
        r"""The rows received and, with :obj:`echo`, the rows sent as the receivers decode
        them (the sender decoding its own wire: bit for bit what arrives); :obj:`exact`:
        without the codec; :obj:`into`: where an identity wire is received (the caller
        checked the codec)."""
        codec: Codec = _IDENTITY if exact else self.policy.codec(key, direction)
        ctx = self._context(key, direction, flat)
        self._record_wire(codec, flat, key, direction, levels)
        if levels is not None and getattr(codec, "per_node", False):
            sent, received_levels = levels
            f = flat.size(1)
            stream = codec.encode_rows(flat, sent, ctx)
            received = self.transport.exchange(
                stream, codec.split_bytes(sent, send_counts, f),
                codec.split_bytes(received_levels, recv_counts, f), key=key,
                direction=direction, unit="bytes", rows=(sum(send_counts), sum(recv_counts)))
            echoed = codec.decode_rows(stream, sent, ctx) if echo else None
            return codec.decode_rows(received, received_levels, ctx), echoed
        wire = codec.encode(flat, ctx)
        received = self.transport.exchange(wire, send_counts, recv_counts, key=key,
                                           direction=direction, out=into)
        return codec.decode(received, ctx), (codec.decode(wire, ctx) if echo else None)

    def _transfer_async(self, flat: Tensor, send_counts: List[int], recv_counts: List[int],
                        key: str, direction: str,
                        levels: Optional[Tuple[Tensor, Tensor]] = None, echo: bool = False,
                        background: bool = False):
        r"""Starts a transfer; returns the function that completes and decodes it (and, with
        :obj:`echo`, also the rows sent as the receivers will decode them, at once).
        :obj:`background`: the pipeline's, completed a step later, on the transport's
        background group (other collectives do not queue behind it)."""
        codec: Codec = self.policy.codec(key, direction)
        ctx = self._context(key, direction, flat)
        self._record_wire(codec, flat, key, direction, levels)
        if levels is not None and getattr(codec, "per_node", False):
            sent, received_levels = levels
            f = flat.size(1)
            stream = codec.encode_rows(flat, sent, ctx)
            pending = self.transport.exchange(
                stream, codec.split_bytes(sent, send_counts, f),
                codec.split_bytes(received_levels, recv_counts, f), key=key,
                direction=direction, unit="bytes", rows=(sum(send_counts), sum(recv_counts)),
                async_op=True, background=background)
            finish = lambda: codec.decode_rows(pending.wait(), received_levels, ctx)  # noqa
            return (finish, codec.decode_rows(stream, sent, ctx)) if echo else finish
        wire = codec.encode(flat, ctx)
        pending = self.transport.exchange(wire, send_counts, recv_counts, key=key,
                                          direction=direction, async_op=True,
                                          background=background)
        finish = lambda: codec.decode(pending.wait(), ctx)  # noqa: E731
        return (finish, codec.decode(wire, ctx)) if echo else finish

    def _record_wire(self, codec: Codec, flat: Tensor, key: str, direction: str,
                     levels: Optional[Tuple[Tensor, Tensor]]) -> None:
        r"""Counts the feature values encoded and their payload bits: a per-node codec's
        widths from the sent rows' levels, else the codec's width for every row."""
        rows, f = flat.size(0), (flat.size(1) if flat.dim() > 1 else 1)
        if levels is not None and getattr(codec, "per_node", False):
            bits = int(codec.row_bits(levels[0]).sum()) * f if rows else 0
        else:
            bits = int(wire_bits(codec, flat.element_size() * 8) * rows * f)
        self.stats.record_wire(key, direction, features=rows * f, bits=bits)

    def _send_pipelined(self, flat: Tensor, send_counts: List[int], recv_counts: List[int],
                        key: str, direction: str, levels: Optional[Tuple[Tensor, Tensor]],
                        pipeline: AsyncPipeline, channel: str) -> Tensor:
        r"""One training exchange of the asynchronous pipeline (:mod:`~.pipeline`): start
        this step's transfer, return what arrived during the previous step."""
        return self._pipelined(
            (channel, key, direction), (sum(recv_counts), flat.size(1)), pipeline,
            lambda: self._transfer_async(flat, send_counts, recv_counts, key, direction,
                                         levels, background=True),
            lambda: self._transfer(flat, send_counts, recv_counts, key, direction, levels)[0],
            key, direction)

    def _pipelined(self, sk: Tuple[str, str, str], shape: Tuple[int, int],
                   pipeline: AsyncPipeline, start: Callable[[], Callable[[], Tensor]],
                   now: Callable[[], Tensor], key: str, direction: str) -> Tensor:
        r"""The pipeline's rule for one exchange point and direction :obj:`sk`: hand out the
        rows of the transfer started last step and :obj:`start` this step's (it returns the
        function that completes it), or exchange synchronously with :obj:`now` (the first
        exchange, a bound reached, sync mode).  :obj:`shape` is what either returns."""
        state = self._pipes.get(sk)
        if state is not None and tuple(state.last.shape) != tuple(shape):
            state.drain()
            state = None
        bound = pipeline.max_async_epochs
        if pipeline.mode == "async" and state is not None and (bound == 0 or state.run < bound):
            state.drain()  # the previous step's rows: in flight since then
            stale = state.last
            state.inflight = start()
            state.run += 1
            self.stats.record_pipeline(key, direction, stale=True)
            return stale
        if state is not None:
            state.drain()  # keep the collectives in order before the synchronous one
        received = now()
        self._pipes[sk] = PipeState(last=received)
        self.stats.record_pipeline(key, direction, stale=False)
        return received

    def set_node_ids(self, send_ids: Tensor,
                     owned_ids: Optional[Tensor] = None) -> "HaloExchange":
        r"""The global node id of every post-channel send slot (:math:`[S]`, in
        ``plan.post.send_index`` order), which boundary sampling draws by, and optionally
        those of the owned rows (:math:`[N_{own}]`), by which it samples the partial
        aggregates this rank receives."""
        if send_ids.numel() != self.plan.post.num_send:
            raise ValueError(f"{send_ids.numel()} send ids for {self.plan.post.num_send} send "
                             "slots")
        self.send_ids, self._sample_memo = send_ids, None
        if owned_ids is not None:
            if owned_ids.numel() != self.num_owned:
                raise ValueError(f"{owned_ids.numel()} owned ids for {self.num_owned} owned "
                                 "rows")
            self.pre_recv_ids = owned_ids.to(self.plan.pre.recv_index.device)[
                self.plan.pre.recv_index]
        return self

    def _sampled(self) -> Optional[Tuple[Tensor, Tensor]]:
        r"""This step's kept send slots and halo rows under the policy's boundary sampling
        (``None`` without it, or at rate 1)."""
        sampling = self.policy.sampling
        if sampling is None or sampling.rate == 1.0:
            return None
        if self.send_ids is None:
            raise RuntimeError("boundary sampling needs the send slots' node ids "
                               "(HaloExchange.set_node_ids; FullGraphEngine sets them)")
        # One draw per step: every layer exchanging through this plan in the step keeps the
        # same rows (the draw is a function of seed, step and node), so it is made once.
        memo = self._sample_memo
        if memo is not None and memo[0] == (sampling.rate, self.seed, self.step):
            return memo[1]
        send = sampling.kept_slots(self.send_ids, self._post_send, self.seed, self.step)
        recv = sampling.kept(self.plan.halo_ids, self.rank, self.seed, self.step)
        device = self.plan.post.send_index.device
        kept = (send.to(device), recv.to(device))
        self._sample_memo = ((sampling.rate, self.seed, self.step), kept)
        return kept

    def _sampled_pre(self) -> Optional[Tuple[Tensor, Tensor]]:
        r"""This step's kept pre slots (sent) and partial-aggregate rows (received) under
        the policy's boundary sampling (``None`` without it, at rate 1, or with
        ``pre=False``)."""
        sampling = self.policy.sampling
        if sampling is None or sampling.rate == 1.0 or not sampling.pre or self.pre_empty:
            return None
        if self.pre_recv_ids is None:
            raise RuntimeError("boundary sampling of partial aggregates needs the owned rows' "
                               "node ids (HaloExchange.set_node_ids(send_ids, owned_ids); "
                               "FullGraphEngine sets them)")
        send = sampling.kept_partials(self.plan.pre_slot_ids, self._pre_send, self.rank, True,
                                      self.seed, self.step)
        recv = sampling.kept_partials(self.pre_recv_ids, self._pre_recv, self.rank, False,
                                      self.seed, self.step)
        device = self.plan.pre.recv_index.device
        return send.to(device), recv.to(device)

    def _start_sampled(self, rows: Tensor, sampled: Tuple[Tensor, Tensor], key: str,
                       direction: str) -> Callable[[], Any]:
        r"""Starts :meth:`_send_sampled`'s transfer of the post channel (no halo cache, no
        pipeline) and returns the function that completes it (the overlap): halo rows
        forward, the :class:`_KeptRows` of the send slots backward."""
        return self._send_sampled(rows, sampled, key, direction, start_only=True,
                                  compact=direction == "backward")

    def _send_sampled(self, rows: Tensor, sampled: Tuple[Tensor, Tensor], key: str,
                      direction: str, channel: str = "post", start_only: bool = False,
                      compact: bool = False):
        r"""Rows (forward) or gradients (backward) of the kept send slots only, scaled by
        :math:`1/p`; the other rows arrive as zeros.  :obj:`sampled` is ``(kept send slots,
        kept received rows)`` of the :obj:`channel` (``"post"``: source rows and halo rows;
        ``"pre"``: pre slots and the partial aggregates received).  :obj:`start_only` (no
        halo cache, no pipeline): start the transfer and return the function that completes
        it instead.  :obj:`compact`, for a caller that adds the rows into others: the
        :class:`_KeptRows` received, without the zero rows (a buffer of every row, nine in
        ten of them zeros at rate 0.1, written and then added for nothing); ignored with
        the halo cache or the pipeline."""
        send_kept, recv_kept = sampled
        sends, recvs = (self._post_send, self._post_recv) if channel == "post" \
            else (self._pre_send, self._pre_recv)
        if direction == "forward":
            mine, theirs, counts_out, counts_in = send_kept, recv_kept, sends, recvs
        else:
            mine, theirs, counts_out, counts_in = recv_kept, send_kept, recvs, sends
        levels = self._post_levels(direction) if channel == "post" else None
        scale = 1.0 / self.policy.sampling.rate
        flat = rows.reshape(rows.size(0), -1)
        cache = self.policy.cache(key, direction)
        if cache is not None:
            # The cache decides among the kept rows; unkept rows stay in the receiver's copy
            # for later steps but reach the layer as zeros, like every unkept row.
            held = self._send_cached(flat, counts_out, counts_in, key, direction, levels,
                                     cache, channel, kept=(mine, theirs))
            out = flat.new_zeros((theirs.numel(), flat.size(1)))
            out[theirs] = held[theirs].to(out.dtype) * scale
            return out.reshape((out.size(0), ) + tuple(rows.shape[1:]))
        if levels is not None:
            levels = (levels[0].to(mine.device)[mine], levels[1].to(theirs.device)[theirs])
        # Positions, not masks: a gather and a scatter of the kept rows by index are several
        # times faster than by a boolean mask of every row.
        mine_at, theirs_at = mine.nonzero().squeeze(1), theirs.nonzero().squeeze(1)
        payload = flat.index_select(0, mine_at)
        if direction == "backward":
            payload = payload * scale
        sends_kept, recvs_kept = per_peer(mine, counts_out), per_peer(theirs, counts_in)
        compact = compact and self.policy.pipeline is None

        def placed(received: Tensor) -> Any:
            # The rows of the kept slots in place, zeros elsewhere: with the pipeline, the
            # slots its transfer was drawn for (this closure's step), not the next step's.
            if direction == "forward":
                received = received * scale
            if compact:
                return _KeptRows(theirs_at, received.to(flat.dtype))
            out = flat.new_zeros((theirs.numel(), flat.size(1)))
            return out.index_copy_(0, theirs_at, received.to(out.dtype))

        def start() -> Callable[[], Tensor]:
            finish = self._transfer_async(payload, sends_kept, recvs_kept, key, direction,
                                          levels, background=True)
            return lambda: placed(finish())

        def now() -> Tensor:
            return placed(self._transfer(payload, sends_kept, recvs_kept, key, direction,
                                         levels)[0])

        self.stats.record_cache(key, direction, eligible=mine.numel(),
                                skipped=mine.numel() - int(mine.sum()))
        shape = tuple(rows.shape[1:])

        def shaped(out: Any) -> Any:
            if isinstance(out, _KeptRows):
                return _KeptRows(out.index, out.rows.reshape((out.rows.size(0), ) + shape))
            return out.reshape((out.size(0), ) + shape)

        if start_only:  # overlapped: the caller completes the transfer
            finish = self._transfer_async(payload, sends_kept, recvs_kept, key, direction,
                                          levels)
            return lambda: shaped(placed(finish()))
        pipeline = self.policy.pipeline
        if pipeline is not None:  # the previous step's sample, one step stale
            out = self._pipelined((channel, key, direction), (theirs.numel(), flat.size(1)),
                                  pipeline, start, now, key, direction)
        else:
            out = now()
        return shaped(out)

    def set_policy(self, policy: Any) -> None:
        r"""Exchanges from now on follow :obj:`policy`.  Transfers in flight complete first;
        a change of pipeline drops its rows (its next exchange is synchronous); cached rows
        stay (sender and receivers hold the same copy).  Every rank at the same point."""
        policy = ExchangePolicy.of(policy)
        self.drain()
        if policy.pipeline is not self.policy.pipeline:
            self._pipes.clear()
        self.policy = policy

    def restart_pipeline(self) -> None:
        r"""Drops the pipeline's rows (after transfers in flight complete): the next training
        exchange of each point is synchronous.  Cached rows stay (sender and receivers hold
        the same copy).  Every rank at the same point: when exchange points move to another
        exchange (the aggregation mode changes), the rows pipelined here grow staler than
        one step."""
        self.drain()
        self._pipes.clear()

    def drain(self) -> None:
        r"""Completes every asynchronous transfer still in flight (before evaluation that
        must not overlap it, a checkpoint, or tearing the process group down)."""
        for state in self._pipes.values():
            state.drain()

    def _send_cached(self, flat: Tensor, send_counts: List[int], recv_counts: List[int],
                     key: str, direction: str, levels: Optional[Tuple[Tensor, Tensor]],
                     cache: HaloCache, channel: str,
                     kept: Optional[Tuple[Tensor, Tensor]] = None,
                     pipeline: Optional[AsyncPipeline] = None) -> Tensor:
        r"""One training exchange through the adaptive cache (:mod:`~.cache`): a bitmask of
        the rows that go, then those rows (or their deltas), then the receiver's copy.

        :obj:`kept` (boundary sampling: the send slots and received rows of this step's
        sample, known to both ends) limits the rows that may go to the kept ones, and the
        bitmask to their bits; a kept row the receiver never got always goes.

        With :obj:`pipeline` the cache's rows travel while the step computes and the
        receiver's copy takes them in at the next exchange: the rows handed out are the
        copy as of the previous step (the pipeline's staleness of one step, on the cache's
        approximation).  The sender's mirror is updated when it sends: the receiver applies
        the same updates in the same order, one step later, so both still hold the same
        copy whenever the sender selects."""
        n_send, n_recv, f = flat.size(0), sum(recv_counts), flat.size(1)
        state = self._cache_states.get((channel, key, direction))
        if state is None or not state.matches(n_send, n_recv, f, flat.dtype):
            state = CacheState(n_send, n_recv, f, flat.dtype, flat.device)
            self._cache_states[(channel, key, direction)] = state
        codec = self.policy.codec(key, direction)
        if pipeline is not None:
            # The first exchange, a bound reached or sync mode run the synchronous cached
            # exchange; otherwise this step's starts and the previous step's copy is used.
            return self._pipelined(
                (channel, key, direction), (n_recv, f), pipeline,
                lambda: self._cached_transfer(flat, send_counts, recv_counts, key, direction,
                                              levels, cache, state, codec, kept,
                                              asynchronous=True),
                lambda: self._cached_transfer(flat, send_counts, recv_counts, key, direction,
                                              levels, cache, state, codec, kept)(),
                key, direction)
        if cache.budgeted and not state.fresh and state.budget is not None and kept is None \
                and f and not cache.lossless and not getattr(codec, "per_node", False):
            return self._send_budgeted(flat, send_counts, recv_counts, key, direction, state,
                                       cache, codec)
        return self._cached_transfer(flat, send_counts, recv_counts, key, direction, levels,
                                     cache, state, codec, kept)()

    def _cached_transfer(self, flat: Tensor, send_counts: List[int], recv_counts: List[int],
                         key: str, direction: str, levels: Optional[Tuple[Tensor, Tensor]],
                         cache: HaloCache, state: CacheState, codec: Codec,
                         kept: Optional[Tuple[Tensor, Tensor]],
                         asynchronous: bool = False) -> Callable[[], Tensor]:
        r"""Selects the rows that go (the bitmask's collective), sends them and updates the
        sender's mirror; returns the function that receives them into the receiver's copy
        and returns that copy (at once, or later with :obj:`asynchronous`)."""
        n_send, n_recv = flat.size(0), sum(recv_counts)
        mine, theirs = kept if kept is not None else (None, None)
        if state.fresh:  # both ends know: every (kept) row goes, no bitmask
            sel = torch.ones(n_send, dtype=torch.bool, device=flat.device) if mine is None \
                else mine.clone()
            recv_sel = torch.ones(n_recv, dtype=torch.bool, device=flat.device) \
                if theirs is None else theirs.clone()
        else:
            sel = select_rows(flat, state.mirror, state.age, cache.epsilon, cache.max_age)
            mask_send, mask_recv = send_counts, recv_counts
            if mine is not None:
                sel = (sel | ~state.known) & mine
                mask_send, mask_recv = per_peer(mine, send_counts), per_peer(theirs, recv_counts)
            packed = self.transport.exchange(pack_mask(sel if mine is None else sel[mine],
                                                       mask_send),
                                             mask_bytes(mask_send), mask_bytes(mask_recv),
                                             key=key, direction=direction, unit="bytes",
                                             rows=(0, 0))
            recv_sel = unpack_mask(packed, mask_recv)
            if theirs is not None:
                among_kept, recv_sel = recv_sel, torch.zeros(n_recv, dtype=torch.bool,
                                                             device=flat.device)
                recv_sel[theirs] = among_kept
        lossless = codec.lossless
        payload = flat[sel] if lossless else (flat - state.mirror)[sel]
        if levels is not None:
            levels = (levels[0].to(sel.device)[sel], levels[1].to(recv_sel.device)[recv_sel])
        sends, recvs = per_peer(sel, send_counts), per_peer(recv_sel, recv_counts)
        if asynchronous:
            started = self._transfer_async(payload, sends, recvs, key, direction, levels,
                                           echo=not lossless, background=True)
            finish, echoed = started if not lossless else (started, None)
        else:
            received, echoed = self._transfer(payload, sends, recvs, key, direction, levels,
                                              echo=not lossless)
            finish = lambda: received  # noqa: E731
        if lossless:
            state.mirror[sel] = payload
        else:
            state.mirror[sel] += echoed.to(state.mirror.dtype)
        state.age += 1
        state.age[sel] = 0
        state.known |= sel
        if state.fresh and kept is None and cache.budgeted:
            # Every row went: the next exchange may send up to all of them (budgets that
            # both ends know without a word; later ones are announced a step ahead).
            state.budget, state.expect = list(send_counts), list(recv_counts)
        state.fresh = False
        self.stats.record_cache(key, direction, eligible=n_send,
                                skipped=n_send - int(sel.sum()))

        def take_in() -> Tensor:
            rows = finish().to(state.held.dtype)
            if lossless:
                state.held[recv_sel] = rows
            else:
                state.held[recv_sel] += rows
            return state.held.clone()  # autograd keeps the output; the copy changes later
        return take_in

    def _send_budgeted(self, flat: Tensor, send_counts: List[int], recv_counts: List[int],
                       key: str, direction: str, state: CacheState, cache: HaloCache,
                       codec: Codec) -> Tensor:
        r"""A cached exchange in one collective: the bitmask, the rows and the next budget in
        one byte buffer per peer.

        The receiver must know how many bytes arrive before they do, and a threshold decides
        the rows only when they are there: a second collective (the bitmask first, as in
        :meth:`_send_cached`'s other path) costs a round trip per exchange.  Instead each
        sender sends every peer exactly the number of rows it announced in the previous
        exchange (its *budget*), the rows that changed most: those that reached
        :attr:`HaloCache.max_age`, were never sent or are not finite first, then by relative
        change.  It announces the next budget as the rows over the threshold now plus the
        rows about to reach the age bound.  Cost: a row over the threshold may wait one
        exchange when more rows changed than the budget allows (never a row the age bound
        forces, as those are budgeted ahead), a budget larger than needed sends the next
        most-changed rows (no error, some bytes), and four bytes per peer.  Per peer the
        buffer holds ``[next budget: int32][bitmask][budget rows on the codec's wire]``."""
        n_send, n_recv, f = flat.size(0), sum(recv_counts), flat.size(1)
        diff, change, scale = row_change(flat, state.mirror)
        finite = torch.isfinite(change)
        forced = (state.age >= cache.max_age) | ~finite | ~state.known
        over = forced | (change > cache.epsilon * scale)
        score = torch.where(forced, torch.full_like(change, math.inf),
                            torch.where(finite, change / scale, torch.zeros_like(change)))
        sel = torch.zeros(n_send, dtype=torch.bool, device=flat.device)
        start = 0
        for n, k in zip(send_counts, state.budget):
            if k > 0:
                sel[start + torch.topk(score[start:start + n], min(k, n)).indices] = True
            start += n
        ageing = ~sel & (state.age + 1 >= cache.max_age)
        upcoming = [min(n, a + b) for n, a, b in zip(
            send_counts, per_peer(over, send_counts), per_peer(ageing, send_counts))]
        lossless = codec.lossless
        payload = flat[sel] if lossless else diff[sel]
        wire_dtype, row_shape, row_bytes = self._wire_format(codec, key, direction, flat)
        ctx = self._context(key, direction, flat)
        self._record_wire(codec, payload, key, direction, None)
        wire = codec.encode(payload, ctx) if payload.size(0) else None
        sent_rows = per_peer(sel, send_counts)
        masks = pack_mask(sel, send_counts).split(mask_bytes(send_counts))
        rows = (wire.contiguous().view(torch.uint8).reshape(-1) if wire is not None
                else torch.zeros(0, dtype=torch.uint8, device=flat.device)).split(
                    [k * row_bytes for k in sent_rows])
        heads = torch.tensor(upcoming, dtype=torch.int32).view(torch.uint8).view(-1, 4)
        pieces = [t for j in range(len(send_counts))
                  for t in (heads[j].to(flat.device), masks[j], rows[j])]
        recv_masks = mask_bytes(recv_counts)
        received = self.transport.exchange(
            torch.cat(pieces), [4 + m + k * row_bytes for m, k in zip(mask_bytes(send_counts),
                                                                       sent_rows)],
            [4 + m + k * row_bytes for m, k in zip(recv_masks, state.expect)],
            key=key, direction=direction, unit="bytes",
            rows=(int(sel.sum()), sum(state.expect)))
        parts = received.split([4 + m + k * row_bytes
                                for m, k in zip(recv_masks, state.expect)])
        expect = [int(p[:4].cpu().clone().view(torch.int32)) for p in parts]
        recv_sel = unpack_mask(torch.cat([p[4:4 + m] for p, m in zip(parts, recv_masks)]),
                               recv_counts)
        got = per_peer(recv_sel, recv_counts)
        if got != state.expect:  # both ends follow the same rule: a bug, never a user's error
            raise RuntimeError(f"exchange '{key}' ({direction}): the cache's bitmasks hold "
                               f"{got} rows per peer, the budgets announced {state.expect}")
        if sum(got):
            wire_in = torch.cat([p[4 + m:] for p, m in zip(parts, recv_masks)]).view(
                wire_dtype).view((sum(got), ) + row_shape)
            values = codec.decode(wire_in, ctx)
        else:
            values = flat.new_zeros(0, f)
        if lossless:
            state.mirror[sel] = payload
            state.held[recv_sel] = values.to(state.held.dtype)
        else:
            echoed = codec.decode(wire, ctx) if wire is not None else flat.new_zeros(0, f)
            state.mirror[sel] += echoed.to(state.mirror.dtype)
            state.held[recv_sel] += values.to(state.held.dtype)
        state.age += 1
        state.age[sel] = 0
        state.known |= sel
        state.budget, state.expect = upcoming, expect
        self.stats.record_cache(key, direction, eligible=n_send, skipped=n_send - int(sel.sum()))
        return state.held.clone()  # autograd keeps the output; the cache changes next step

    def _wire_format(self, codec: Codec, key: str, direction: str,
                     flat: Tensor) -> Tuple[torch.dtype, Tuple[int, ...], int]:
        r"""dtype, shape and bytes of one row of :obj:`codec`'s wire for rows like
        :obj:`flat` (a fixed-width codec: the same for every row)."""
        probe = codec.encode(flat.new_zeros(1, flat.size(1)),
                             self._context(key, direction, flat))
        return probe.dtype, tuple(probe.shape[1:]), probe[0].numel() * probe.element_size()

    def clear_cache(self) -> None:
        r"""Forgets every cached row and pipelined transfer: the next training exchange of
        each point sends all rows and is synchronous (every rank must clear at the same point
        of training)."""
        self.drain()
        self._cache_states.clear()
        self._pipes.clear()

    def _post_levels(self, direction: str) -> Optional[Tuple[Tensor, Tensor]]:
        if self.send_levels is None:
            return None
        if direction == "forward":
            return self.send_levels, self.halo_levels
        return self.halo_levels, self.send_levels  # gradients flow back to the owners


class _KeptRows(NamedTuple):
    r"""Rows boundary sampling kept, received without the zero rows of the others:
    :obj:`rows` belong at :obj:`index` among every row received."""
    index: Tensor
    rows: Tensor


def _add_received(into: Tensor, at: Tensor, received: Any, in_place: bool = False) -> Tensor:
    r""":obj:`into` with the rows received added at positions :obj:`at` (``index_add``; of
    :class:`_KeptRows`, only the kept rows: the others are zeros)."""
    add = into.index_add_ if in_place else into.index_add
    if isinstance(received, _KeptRows):
        return add(0, at.index_select(0, received.index), received.rows.to(into.dtype))
    return add(0, at, received.to(into.dtype))


class _HaloRows(torch.autograd.Function):
    r"""``[N_own, *] -> [N_own + N_halo, *]``; backward returns halo gradients to owners."""

    @staticmethod
    def forward(ctx, x_own: Tensor, ex: HaloExchange, key: str, training: bool,
                exact: bool = False) -> Tensor:
        ctx.ex, ctx.key, ctx.training, ctx.exact = ex, key, training, exact
        if ex.post_empty:
            return x_own.clone()
        sampled = ex._sampled() if training else None
        ctx.sampled = sampled
        send = x_own.index_select(0, ex.plan.post.send_index)
        # [owned; halo] is one buffer the halo rows are received into (no separate halo
        # buffer and concatenation: at P = 4 on the 1M-node graph, 72 MiB less at the peak).
        rows = x_own.new_empty((x_own.size(0) + ex.num_halo, ) + tuple(x_own.shape[1:]))
        rows[:x_own.size(0)].copy_(x_own)
        release_consumed(x_own)  # features a kept aggregation reads once (file_pages.py)
        halo = rows[x_own.size(0):]
        if exact:
            ex._send(send, ex._post_send, ex._post_recv, key, "forward", exact=True, into=halo)
        elif sampled is None:
            ex._send(send, ex._post_send, ex._post_recv, key, "forward",
                     ex._post_levels("forward"), training, into=halo)
        else:
            received = ex._send_sampled(send, sampled, key, "forward", compact=True)
            if isinstance(received, _KeptRows):  # received into the buffer itself
                halo.zero_().index_copy_(0, received.index, received.rows.to(halo.dtype))
            else:
                halo.copy_(received)
        return rows

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        ex: HaloExchange = ctx.ex
        if ex.post_empty:
            return grad_out, None, None, None, None
        grad_own = grad_out[:ex.num_owned].clone()
        grad_rows = grad_out[ex.num_owned:].contiguous()
        if ctx.exact:
            grad_halo = ex._send(grad_rows, ex._post_recv, ex._post_send, ctx.key, "backward",
                                 exact=True)
        elif ctx.sampled is None:
            grad_halo = ex._send(grad_rows, ex._post_recv, ex._post_send, ctx.key, "backward",
                                 ex._post_levels("backward"), ctx.training)
        else:
            grad_halo = ex._send_sampled(grad_rows, ctx.sampled, ctx.key, "backward",
                                         compact=True)
        return _add_received(grad_own, ex.plan.post.send_index, grad_halo, in_place=True), \
            None, None, None, None


class _GradHandoff:
    r"""Between the two backward halves of an overlapped exchange: the gradients' transfer
    started by :class:`_HaloRecv` and completed by :class:`_OwnedGrad`."""

    __slots__ = ("pending", "owned_done")

    def __init__(self) -> None:
        self.pending = None  # completes the transfer: -> [S, F] gradients of the send rows
        self.owned_done = False

    def add_into(self, ex: "HaloExchange", grad: Tensor, pending: Callable[[], Any]) -> Tensor:
        r""":obj:`grad` of the owned rows plus the send rows' gradients that came back."""
        return _add_received(grad, ex.plan.post.send_index, pending())


class _HaloRecv(torch.autograd.Function):
    r"""``[S, F]`` rows sent -> ``[N_halo, F]`` rows received, the transfer started before
    (overlap); backward returns the halo gradients to the owners' send rows: started here
    and added by :class:`_OwnedGrad` after the owned part's backward (backward overlap), or
    here at once when that part's backward already ran."""

    @staticmethod
    def forward(ctx, send: Tensor, ex: HaloExchange, key: str, training: bool,
                complete, handoff: Optional[_GradHandoff] = None,
                sampled: Optional[Tuple[Tensor, Tensor]] = None) -> Tensor:
        ctx.ex, ctx.key, ctx.training, ctx.handoff = ex, key, training, handoff
        ctx.sampled = sampled  # the forward's draw: the gradients travel the same rows
        return complete().to(send.dtype)

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        ex: HaloExchange = ctx.ex
        handoff: Optional[_GradHandoff] = ctx.handoff
        grad_halo = grad_halo.contiguous()
        nones = (None, ) * 6
        if handoff is not None and not handoff.owned_done:
            if ctx.sampled is not None:
                handoff.pending = ex._start_sampled(grad_halo, ctx.sampled, ctx.key,
                                                    "backward")
            else:
                handoff.pending = ex._transfer_async(grad_halo, ex._post_recv, ex._post_send,
                                                     ctx.key, "backward",
                                                     ex._post_levels("backward"))
            return (None, ) + nones
        if ctx.sampled is not None:
            grad_send = ex._send_sampled(grad_halo, ctx.sampled, ctx.key, "backward")
        else:
            grad_send = ex._send(grad_halo, ex._post_recv, ex._post_send, ctx.key, "backward",
                                 ex._post_levels("backward"), ctx.training)
        return (grad_send.to(grad_halo.dtype), ) + nones


class _OwnedGrad(torch.autograd.Function):
    r"""Identity on the owned rows of an overlapped exchange.  Its backward runs after the
    owned part's (which consumes its output) and so after :class:`_HaloRecv`'s, which the
    autograd engine runs first (created later): it completes the gradients' transfer
    started there and adds them in (the handoff's :meth:`add_into`; the one-buffer exchange
    hands over its own)."""

    @staticmethod
    def forward(ctx, x: Tensor, ex: HaloExchange, handoff: _GradHandoff) -> Tensor:
        ctx.ex, ctx.handoff = ex, handoff
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        handoff: _GradHandoff = ctx.handoff
        pending, handoff.pending = handoff.pending, None
        handoff.owned_done = True
        if pending is None:  # the halo part's backward has not run: it sends synchronously
            return grad, None, None
        return handoff.add_into(ctx.ex, grad, pending), None, None


def _owned_rows(aggregated: Tensor, n: int) -> Tensor:
    r"""The first :obj:`n` rows of a fresh aggregation output, to be added into in place.

    A contiguous output is reused: the result is a new tensor (its own version counter, not
    an autograd view) on the same storage, so adding the pre slots needs no copy of the
    owned rows (at scale the largest transient of the pre channel).  The caller vouches that
    nothing else reads the output (the partitioned layers pass the aggregation module's,
    which the result replaces); no backward reads it (sum aggregation and this reduction
    both ignore their outputs).  Anything else (a leaf that requires a gradient, a view of
    another tensor, a strided output) is copied.
    """
    if (aggregated.is_leaf and aggregated.requires_grad) or aggregated._base is not None \
            or not aggregated.is_contiguous():
        return aggregated[:n].clone()
    return aggregated.new_empty(0).set_(aggregated.untyped_storage(),
                                        aggregated.storage_offset(),
                                        (n, ) + tuple(aggregated.shape[1:]),
                                        aggregated.stride())


class _PreRows(torch.autograd.Function):
    r"""``[N_own + S_pre, *] -> [N_own, *]``: pre slots added into their owners' rows."""

    @staticmethod
    def forward(ctx, aggregated: Tensor, ex: HaloExchange, key: str, training: bool,
                in_place: bool) -> Tensor:
        ctx.ex, ctx.key, ctx.training = ex, key, training
        n = ex.num_owned
        if ex.pre_empty:
            return aggregated[:n].clone()
        sampled = ex._sampled_pre() if training else None
        ctx.sampled = sampled
        if sampled is None:
            received = ex._send(aggregated[n:].contiguous(), ex._pre_send, ex._pre_recv, key,
                                "forward", training=training, channel="pre")
        else:
            received = ex._send_sampled(aggregated[n:].contiguous(), sampled, key, "forward",
                                        channel="pre", compact=True)
        out = _owned_rows(aggregated, n) if in_place else aggregated[:n].clone()
        return _add_received(out, ex.plan.pre.recv_index, received, in_place=True)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        ex: HaloExchange = ctx.ex
        if ex.pre_empty:
            return grad_out, None, None, None, None  # no pre slots in this mode
        grad_rows = grad_out.index_select(0, ex.plan.pre.recv_index)
        if ctx.sampled is None:
            grad_slots = ex._send(grad_rows, ex._pre_recv, ex._pre_send, ctx.key, "backward",
                                  training=ctx.training, channel="pre")
        else:
            grad_slots = ex._send_sampled(grad_rows, ctx.sampled, ctx.key, "backward",
                                          channel="pre")
        return torch.cat([grad_out, grad_slots.to(grad_out.dtype)], dim=0), None, None, None, None
