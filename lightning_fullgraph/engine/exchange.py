"""Halo exchange: fills the halo rows of a node tensor from their owners.

Every rank owns ``N_own`` nodes and needs the rows of ``N_halo`` further nodes
(in-neighbours owned elsewhere).  :class:`HaloExchange` turns a tensor of owned
rows ``[N_own, *]`` into ``[N_own + N_halo, *]`` with one
``all_to_all_single`` (forward) and routes the halo gradients back to their
owners with the transposed ``all_to_all_single`` (backward), where they are added
to the owners' own gradients.  Rows cross the wire through a :class:`Codec`, and
every call is counted in :class:`CommStats`.

Every collective is :func:`~.errors.guarded`: a dead or stuck peer raises a
:class:`~.errors.CollectiveError` naming the exchange point, the peers and the timeout.
:meth:`HaloExchange.extend` is excluded from ``torch.compile`` tracing (a graph break), so a
compiled model exchanges halo rows exactly as an eager one.
"""
import math
import time
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from .codec import Codec, IdentityCodec
from .errors import guarded
from .stats import CommStats

__all__ = ["HaloExchange"]


class HaloExchange:
    r"""Exchange plan of one rank plus the collectives that execute it.

    Args:
        num_owned (int): Number of nodes this rank owns (:math:`N_{own}`).
        send_index (torch.Tensor): Local indices of owned rows to send,
            concatenated by destination rank, shape :math:`[S]`.
        send_counts (torch.Tensor): Rows sent to each rank, shape :math:`[P]`.
        halo_counts (torch.Tensor): Halo rows received from each rank, shape
            :math:`[P]`; received rows are laid out by source rank, which is the
            order of the rank's halo.
        group (ProcessGroup, optional): Process group (default: the world).
        codec (Codec, optional): Wire codec (default: :class:`IdentityCodec`).
        timeout (float or timedelta, optional): The group's collective timeout, named in
            error messages (the group itself enforces it).
    """

    def __init__(self, num_owned: int, send_index: Tensor, send_counts: Tensor,
                 halo_counts: Tensor, group: Optional[Any] = None,
                 codec: Optional[Codec] = None, timeout: Optional[Any] = None) -> None:
        world = dist.get_world_size(group) if dist.is_initialized() else 1
        if send_counts.numel() != world or halo_counts.numel() != world:
            raise ValueError(
                f"exchange plan was built for {send_counts.numel()} ranks but the "
                f"process group has {world}; re-partition for {world} parts")
        if int(send_counts.sum()) != send_index.numel():
            raise ValueError("send_counts do not add up to the length of send_index")
        self.num_owned = int(num_owned)
        self.num_halo = int(halo_counts.sum())
        self.send_index = send_index.long()
        self.send_counts = [int(c) for c in send_counts]
        self.halo_counts = [int(c) for c in halo_counts]
        self.group = group
        self.world_size = world
        self.rank = dist.get_rank(group) if dist.is_initialized() else 0
        self.timeout = timeout
        self.codec = codec if codec is not None else IdentityCodec()
        self.stats = CommStats()
        # Ranks this rank exchanges rows with (named when a collective fails).
        self.peers = tuple(r for r in range(world)
                           if self.send_counts[r] > 0 or self.halo_counts[r] > 0)

    @classmethod
    def from_partition(cls, partition, group: Optional[Any] = None,
                       codec: Optional[Codec] = None,
                       timeout: Optional[Any] = None) -> "HaloExchange":
        r"""Builds the exchange of a :class:`~lightning_fullgraph.partition.LocalPartition`."""
        return cls(partition.num_owned, partition.send_index, partition.send_counts,
                   partition.halo_counts, group=group, codec=codec, timeout=timeout)

    @property
    def num_local(self) -> int:
        r"""Rows of an extended tensor: owned plus halo."""
        return self.num_owned + self.num_halo

    @torch.compiler.disable
    def extend(self, x: Tensor, key: str = "x", dim: int = 0) -> Tensor:
        r"""Appends the halo rows to a tensor of owned rows.

        Args:
            x (torch.Tensor): Owned rows, :math:`N_{own}` along :obj:`dim`.
            key (str): Name of the exchange point, for statistics and codecs.
            dim (int): The node dimension.

        Returns:
            :math:`[N_{own} + N_{halo}, *]` along :obj:`dim`; differentiable.
        """
        dim = dim % x.dim()
        if x.size(dim) != self.num_owned:
            raise ValueError(
                f"halo exchange '{key}': expected {self.num_owned} owned rows along "
                f"dim {dim}, got {x.size(dim)}")
        if dim != 0:
            return _Extend.apply(x.movedim(dim, 0), self, key).movedim(0, dim)
        return _Extend.apply(x, self, key)

    # The two directions of the wire ------------------------------------------------
    def _all_to_all(self, rows: Tensor, in_splits, out_splits, key: str,
                    direction: str) -> Tensor:
        shape = rows.shape[1:]
        flat = rows.reshape(rows.size(0), math.prod(shape))
        start = time.perf_counter()
        wire, ctx = self.codec.encode(flat, key)
        wire = wire.contiguous()
        n_out = sum(out_splits)
        recv = wire.new_empty((n_out, ) + tuple(wire.shape[1:]))
        if self.world_size > 1:
            with guarded(f"halo exchange '{key}' ({direction})", self.rank, self.peers,
                         self.timeout):
                dist.all_to_all_single(recv, wire, output_split_sizes=out_splits,
                                       input_split_sizes=in_splits, group=self.group)
        out = self.codec.decode(recv, ctx, flat.size(1), key)
        row_bytes = math.prod(wire.shape[1:]) * wire.element_size()
        self.stats.record(key, direction, bytes_sent=sum(in_splits) * row_bytes,
                          bytes_received=n_out * row_bytes, rows_sent=sum(in_splits),
                          rows_received=n_out, seconds=time.perf_counter() - start)
        return out.reshape((n_out, ) + tuple(shape))

    def _forward_rows(self, x_own: Tensor, key: str) -> Tensor:
        send = x_own.index_select(0, self.send_index)
        return self._all_to_all(send, self.send_counts, self.halo_counts, key, "forward")

    def _backward_rows(self, grad_halo: Tensor, key: str) -> Tensor:
        return self._all_to_all(grad_halo, self.halo_counts, self.send_counts, key,
                                "backward")


class _Extend(torch.autograd.Function):
    r"""``[N_own, *] -> [N_own + N_halo, *]``; backward returns halo gradients to owners."""

    @staticmethod
    def forward(ctx, x_own: Tensor, exchange: HaloExchange, key: str) -> Tensor:
        ctx.exchange = exchange
        ctx.key = key
        halo = exchange._forward_rows(x_own, key)
        return torch.cat([x_own, halo.to(x_own.dtype)], dim=0)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        ex: HaloExchange = ctx.exchange
        grad_own = grad_out[:ex.num_owned].clone()
        grad_send = ex._backward_rows(grad_out[ex.num_owned:].contiguous(), ctx.key)
        grad_own.index_add_(0, ex.send_index, grad_send.to(grad_own.dtype))
        return grad_own, None, None
