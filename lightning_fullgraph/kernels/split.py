"""Aggregation over source rows that arrive in two parts: owned rows now, halo rows later.

A partitioned layer's sources are the rank's own rows followed by the halo rows other ranks
send.  Aggregating the edges with owned sources first and the halo edges once the halo
arrives lets the exchange run while the first part computes (the overlap of synchronous
training), and avoids concatenating ``[owned; halo]`` into one more ``N x F`` tensor.

:class:`SplitRows` stands for such a source; a producer (the distributed engine's halo
exchange) hands one out only while :func:`split_accepted` is true, which the kernels'
``propagate`` wrapper sets around the layer's pre-hooks when it can aggregate it
(:func:`aggregate_split`, sum or mean aggregation).  Anything else gets :meth:`SplitRows.materialize`.

A layer may hand the next split aggregation more work that does not need the halo
(:func:`while_in_flight`: ``SAGEConv``'s root term ``x_r @ W_r^T``): it runs after the owned
part, before the wait, so the exchange also hides a dense product, not only the owned sum.
Created between the transfer's start and its completion, its backward also runs while the
halo's gradients travel back (the autograd engine runs the nodes created later first).  The
same holds for the weight gradient of the map a layer applies to the aggregation
(:func:`deferring`, :mod:`.deferred_weight`: ``SAGEConv``'s ``lin_l``), whose node is made
here, before the halo's receive.

The split graph (edges with owned sources, edges with halo sources renumbered from 0) is
built once per graph and cached with the CSR structures (:func:`~.csr.get_split_csr`).
Sums run in a different order than over the whole graph (owned sources first), so results
equal the one-pass aggregation to floating-point rounding, not bit for bit.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Optional

from torch import Tensor

if TYPE_CHECKING:
    from .deferred_weight import DeferredWeightGrad

__all__ = ["SplitRows", "accepting_split", "split_accepted", "aggregate_split", "InFlight",
           "while_in_flight", "deferring"]

_state = threading.local()


class SplitRows:
    r"""Source rows given as owned rows and a function that completes the halo rows.

    Args:
        local (torch.Tensor): :math:`[N_{own}, F]` owned rows.
        complete (Callable[[], torch.Tensor]): Returns the :math:`[N_{halo}, F]` halo rows
            (waits for the exchange); called once.
        num_halo (int): :math:`N_{halo}`.
    """

    def __init__(self, local: Tensor, complete: Callable[[], Tensor], num_halo: int) -> None:
        self.local = local
        self._complete = complete
        self._halo: Optional[Tensor] = None
        self.num_halo = int(num_halo)

    @property
    def num_rows(self) -> int:
        return self.local.size(0) + self.num_halo

    def halo(self) -> Tensor:
        r"""The halo rows (completing the exchange on the first call)."""
        if self._halo is None:
            self._halo = self._complete()
            self._complete = None
        return self._halo

    def materialize(self) -> Tensor:
        r"""``[owned; halo]`` as one tensor, for code that cannot aggregate the parts."""
        import torch

        return torch.cat([self.local, self.halo().to(self.local.dtype)], dim=0)


@contextmanager
def accepting_split(enabled: bool = True) -> Iterator[None]:
    r"""While active (and :obj:`enabled`), producers may hand out :class:`SplitRows`."""
    previous = getattr(_state, "accepted", False)
    _state.accepted = bool(enabled)
    try:
        yield
    finally:
        _state.accepted = previous


class InFlight:
    r"""Work that needs no halo rows, run by the next split aggregation while its halo is in
    flight (:func:`while_in_flight`), or by its owner after the aggregation otherwise.

    Args:
        work (Callable[[], torch.Tensor]): Computes the result (called at most once).
    """

    __slots__ = ("_work", "result")

    def __init__(self, work: Callable[[], Tensor]) -> None:
        self._work: Optional[Callable[[], Tensor]] = work
        self.result: Optional[Tensor] = None

    @property
    def ran(self) -> bool:
        r"""Whether the work has run (:attr:`result` holds its output)."""
        return self._work is None

    def run(self) -> Tensor:
        r"""Runs the work unless it ran; its result."""
        if self._work is not None:
            work, self._work = self._work, None
            self.result = work()
        return self.result


@contextmanager
def while_in_flight(work: InFlight) -> Iterator[InFlight]:
    r"""While active, the first :func:`aggregate_split` runs :obj:`work` between its owned
    part and the wait for the halo (once; a nested or later aggregation does not see it).
    Where no split aggregation runs (no overlap), :obj:`work` has not run on exit."""
    previous = getattr(_state, "in_flight", None)
    _state.in_flight = work
    try:
        yield work
    finally:
        _state.in_flight = previous


@contextmanager
def deferring(weight_grad: Optional["DeferredWeightGrad"]) -> Iterator[None]:
    r"""While active, the first :func:`aggregate_split` starts :obj:`weight_grad`
    (:meth:`~.deferred_weight.DeferredWeightGrad.start`) after its in-flight work, before it
    waits for the halo: the map applied to its output then gets its weight's gradient while
    the halo's gradients travel back.  Where no split aggregation runs it is not started."""
    previous = getattr(_state, "deferred", None)
    _state.deferred = weight_grad
    try:
        yield
    finally:
        _state.deferred = previous


def split_accepted() -> bool:
    r"""Whether the caller will aggregate a :class:`SplitRows` source (consumed once)."""
    accepted = getattr(_state, "accepted", False)
    _state.accepted = False  # one source per propagate call
    return accepted


def aggregate_split(src: SplitRows, edge_index: Tensor, weight: Optional[Tensor],
                    num_dst: int, backend: Optional[str] = "auto",
                    reduce: str = "sum") -> Tensor:
    r"""Sum (or mean) aggregation over :obj:`src`: the owned-source edges, then the halo
    edges.

    Args:
        src (SplitRows): The source rows; its halo is completed between the two parts.
        edge_index (torch.Tensor): ``[2, E]``, sources in ``[0, N_own + N_halo)``.
        weight (torch.Tensor, optional): ``[E]`` edge scalars in ``edge_index`` order.
        num_dst (int): Destination rows.
        backend (str, optional): As :func:`~.functional.aggregate`.
        reduce (str, optional): ``"sum"`` or ``"mean"`` (the sum divided by every
            destination's in-degree over both parts; 0 without edges, as PyG's mean).

    Returns:
        ``[num_dst, F]``, differentiable with respect to both parts and the weights.
    """
    from .csr import get_split_csr
    from .functional import aggregate

    n_own = src.local.size(0)
    split = get_split_csr(edge_index, n_own, src.num_rows, num_dst)
    w_own = w_halo = None
    if weight is not None:
        w_own = weight.index_select(0, split.own_pos)
        w_halo = weight.index_select(0, split.halo_pos)
    out = aggregate(src.local, split.own, w_own, "sum", num_dst, backend=backend)
    work = getattr(_state, "in_flight", None)
    if work is not None:  # the caller's halo-free work, while the halo is still in flight
        _state.in_flight = None
        work.run()
    deferred = getattr(_state, "deferred", None)
    if deferred is not None:  # created before the halo's receive: its backward runs after
        _state.deferred = None
        deferred.start()
    halo = src.halo().to(src.local.dtype)
    # Also without halo edges: the halo must stay in the autograd graph, whose backward
    # runs the gradients' exchange that every rank takes part in.  In place: the sum's
    # backward needs no saved output, and this saves an N x F copy.
    out.add_(aggregate(halo, split.halo, w_halo, "sum", num_dst, backend=backend))
    if reduce == "mean":
        out.div_(split.in_degree.clamp_min(1).to(out.dtype).view(-1, *([1] * (out.dim() - 1))))
    elif reduce != "sum":
        raise ValueError(f"aggregate_split: reduce must be 'sum' or 'mean', got {reduce!r}")
    return out
