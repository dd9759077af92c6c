r"""Moving wire rows between ranks: one ``all_to_all_single`` on a process group (or two).

:class:`Transport` knows nothing about graphs.  It takes a 2-D wire tensor (one row per
message, any dtype) with row counts per peer, or a flat byte tensor with byte counts per peer
(variable-width rows), exchanges it synchronously or asynchronously, counts the bytes on every
path and times the exchange correctly on asynchronous devices (CUDA events, not the host clock).

Device rules: tensors stay on their device when the backend can move them (NCCL: CUDA; gloo:
CPU).  gloo with CUDA tensors is staged through host memory; half-precision rows travel as
their bytes (uint8) on gloo (it has no int16, and its bf16/fp16 support is unreliable), bit
for bit.

gloo carries one direction of a pair's connection at a time: in one ``all_to_all_single``
two ranks' rows to each other take turns, and a bulk exchange between two machines gets half
their links' rate (``python -m benchmarks link_sizes``).  With ``duplex=True`` the transport
sends each exchange's two directions at once, on two groups of the same ranks: rows to this
rank and higher ones on the group, to lower ones on a second group (the same bytes into the
same places: exact; two collectives instead of one).

Transfers that stay in flight beyond the collectives issued after them (the asynchronous
pipeline's: started in one step, completed in the next) go on a second group of the same
ranks, the *background* group, where the transport has one (``background=True``).  A process
group runs its collectives in the order they were issued: on one group, the step's gradient
all-reduce, the evaluation's exchanges and every agreement would each wait for the transfers
still in flight, and the pipeline would hide nothing past the next collective.
"""
import math
import time
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from .errors import guarded
from .stats import CommStats

__all__ = ["Transport", "PendingExchange"]

_HALF = (torch.float16, torch.bfloat16)


@dataclass
class PendingExchange:
    r"""An exchange in flight; :meth:`wait` returns the received tensor.

    The receive buffer must not be read before :meth:`wait`.  Bytes and rows are counted when
    the transfer starts, the seconds a caller spends blocked in :meth:`wait` when it returns
    (once, however often it is called), together with the seconds between the transfer's start
    and the call of :meth:`wait`: what the caller computed while the rows were in flight.
    """

    recv: Tensor
    _work: Any = None
    _finish: Optional[Callable[[Tensor], Tensor]] = None
    _on_done: Optional[Callable[[], None]] = None
    _done: bool = field(default=False)
    # Gets the seconds blocked in wait() and the seconds in flight before it was called.
    on_wait: Optional[Callable[[float, float], None]] = None
    _started: float = field(default_factory=time.perf_counter)

    def wait(self) -> Tensor:
        if not self._done:
            start = time.perf_counter()
            if self._work is not None:
                self._work.wait()
            self.recv = self._finish(self.recv) if self._finish is not None else self.recv
            if self._on_done is not None:
                self._on_done()
            if self.on_wait is not None:
                self.on_wait(time.perf_counter() - start, start - self._started)
            self._done = True
        return self.recv

    def is_completed(self) -> bool:
        return self._done or self._work is None or bool(self._work.is_completed())


class Transport:
    r"""``all_to_all_single`` on one process group, with accounting.

    Args:
        group (ProcessGroup, optional): The group (default: the world).
        stats (CommStats, optional): Where bytes, rows and seconds are counted.
        timeout (float or timedelta, optional): The group's timeout, named in errors.
        ranks_per_host (int, optional): Processes per host, ranks numbered host-major (as
            Lightning numbers them across nodes): bytes to and from other hosts are also
            counted apart (default: one host).
        background (bool): Create a second group of the same ranks for transfers that stay
            in flight across other collectives (``exchange(..., background=True)``; see the
            module docstring).  Creating it is collective: every rank of :obj:`group`
            constructs its transport at the same point. (default: :obj:`False`)
        duplex (bool): On gloo with more than one rank, create a second group of the same
            ranks and send every exchange's two directions at once, one on each (see the
            module docstring; background transfers stay one collective on their group).
            Collective like :obj:`background`; other backends ignore it.
            (default: :obj:`False`)
    """

    def __init__(self, group: Optional[Any] = None, stats: Optional[CommStats] = None,
                 timeout: Optional[Any] = None, ranks_per_host: Optional[int] = None,
                 background: bool = False, duplex: bool = False) -> None:
        initialized = dist.is_available() and dist.is_initialized()
        self.group = group
        self.world_size = dist.get_world_size(group) if initialized else 1
        self.rank = dist.get_rank(group) if initialized else 0
        self.backend = dist.get_backend(group) if initialized else "none"
        self.stats = stats if stats is not None else CommStats()
        self.timeout = timeout
        per = int(ranks_per_host) if ranks_per_host is not None else self.world_size
        if per < 1:
            raise ValueError(f"ranks_per_host must be positive, got {ranks_per_host}")
        self.ranks_per_host = per
        # Peers on other hosts (group ranks; the group is assumed host-major like the world).
        self._remote = [r // per != self.rank // per for r in range(self.world_size)]
        self.background_group = _sibling_group(group, timeout) \
            if background and self.world_size > 1 else None
        self.duplex_group = _sibling_group(group, timeout) \
            if duplex and self.world_size > 1 and self.backend == "gloo" else None
        self._split = True

    @property
    def duplex(self) -> bool:
        r"""Whether exchanges now send their two directions on two groups: the transport
        has a duplex group, and it is not set aside (``transport.duplex = False``, as
        :class:`~.step_aside.StepAside` does where it does not shorten the step; every
        rank sets it at the same point)."""
        return self.duplex_group is not None and self._split

    @duplex.setter
    def duplex(self, on: bool) -> None:
        self._split = bool(on)

    def close(self) -> None:
        r"""Releases the background and duplex groups (their sockets and threads), once
        nothing is in flight on them; the transport then runs every transfer on
        :attr:`group`.  Every rank calls it at the same point (gloo destroys a group locally,
        but some NCCL versions abort a communicator collectively).  Where :attr:`group` is a
        subgroup, they are kept for its next transport instead of destroyed (torch would
        give a new one the destroyed one's name: see :func:`_release_sibling`)."""
        groups = (self.background_group, self.duplex_group)
        self.background_group = self.duplex_group = None
        for sibling in groups:
            if sibling is not None:
                _release_sibling(self.group, sibling)

    # -- the one collective ---------------------------------------------------------------
    def exchange(self, send: Tensor, send_counts: Sequence[int], recv_counts: Sequence[int],
                 *, key: str, direction: str, unit: str = "rows",
                 async_op: bool = False, rows: Optional[Sequence[int]] = None,
                 out: Optional[Tensor] = None, background: bool = False):
        r"""Sends ``send`` split by :obj:`send_counts`, receives by :obj:`recv_counts`.

        Args:
            send (torch.Tensor): ``[S, W]`` wire rows (``unit="rows"``) or a flat ``[B]``
                byte tensor (``unit="bytes"``).
            send_counts, recv_counts: Per peer, in rows or bytes.
            key (str): Exchange point, for statistics and errors.
            direction (str): ``"forward"`` or ``"backward"``.
            unit (str): ``"rows"`` or ``"bytes"``.
            async_op (bool): Return a :class:`PendingExchange` instead of the result.
            rows (Sequence[int], optional): ``(rows sent, rows received)`` when the unit is
                bytes (for the row counters).
            out (torch.Tensor, optional): Where the received rows go (synchronous calls): a
                contiguous tensor of the received shape and of ``send``'s dtype and device,
                e.g. the tail of a larger buffer; the backend writes into it directly when
                it takes the dtype as it is, else the rows are copied there.
            background (bool): On the background group, where there is one (an
                asynchronous transfer that other collectives must not queue behind).

        Returns:
            The received tensor, or a :class:`PendingExchange` if :obj:`async_op`.
        """
        if unit not in ("rows", "bytes"):
            raise ValueError(f"unit must be 'rows' or 'bytes', got {unit!r}")
        send_counts, recv_counts = [int(c) for c in send_counts], [int(c) for c in recv_counts]
        if len(send_counts) != self.world_size or len(recv_counts) != self.world_size:
            raise ValueError(f"exchange '{key}': {len(send_counts)} send and {len(recv_counts)} "
                             f"receive counts for a group of {self.world_size}")
        if sum(send_counts) != send.size(0):
            raise ValueError(f"exchange '{key}': send counts add up to {sum(send_counts)} but "
                             f"{send.size(0)} {unit} are given")
        if unit == "bytes" and (send.dim() != 1 or send.dtype != torch.uint8):
            raise ValueError("unit='bytes' needs a flat uint8 tensor")
        wire, restore = self._for_backend(send.contiguous())
        n_recv = sum(recv_counts)
        if out is not None:
            if async_op:
                raise ValueError("out= is for synchronous exchanges")
            if (out.shape != (n_recv, ) + tuple(send.shape[1:]) or out.dtype != send.dtype
                    or out.device != send.device or not out.is_contiguous()):
                raise ValueError(f"exchange '{key}': out must be a contiguous "
                                 f"{(n_recv, ) + tuple(send.shape[1:])} {send.dtype} tensor on "
                                 f"{send.device}, got {tuple(out.shape)} {out.dtype} on "
                                 f"{out.device}")
        if out is not None and restore is None:
            recv = out  # received in place: no second buffer of the halo rows
        else:
            recv = wire.new_empty((n_recv, ) + tuple(wire.shape[1:]))
        row_bytes = math.prod(wire.shape[1:]) * wire.element_size()
        bytes_sent, bytes_received = sum(send_counts) * row_bytes, n_recv * row_bytes
        rows_sent, rows_received = (rows if rows is not None else (sum(send_counts), n_recv))
        inter_sent = row_bytes * sum(c for c, far in zip(send_counts, self._remote) if far)
        inter_received = row_bytes * sum(c for c, far in zip(recv_counts, self._remote) if far)
        timer = _Timer(send.device)
        work = None
        if self.world_size > 1:
            with guarded(f"halo exchange '{key}' ({direction})", self.rank, self._peers(
                    send_counts, recv_counts), self.timeout):
                group = self.background_group if background \
                    and self.background_group is not None else self.group
                if self.duplex and not background:
                    work = _both_directions(recv, wire, send_counts, recv_counts, self.rank,
                                            group, self.duplex_group)
                    if not async_op:
                        work = work.wait()  # within the guard: a timeout names the peers
                else:
                    work = dist.all_to_all_single(recv, wire, output_split_sizes=recv_counts,
                                                  input_split_sizes=send_counts, group=group,
                                                  async_op=async_op)
        elif n_recv:
            recv.copy_(wire)  # one process: what it sends is what it receives

        def record():
            self.stats.record(key, direction, bytes_sent=bytes_sent, bytes_received=bytes_received,
                              rows_sent=rows_sent, rows_received=rows_received,
                              seconds=timer.elapsed(), inter_host_bytes_sent=inter_sent,
                              inter_host_bytes_received=inter_received, started=timer.wall)

        finish = (lambda t: restore(t).to(send.device, non_blocking=True)) \
            if restore is not None else None
        if async_op:
            # Bytes count when the transfer starts (so an epoch counts what it sent); the
            # seconds are the time a caller is blocked in wait(), the exposed exchange time.
            self.stats.record(key, direction, bytes_sent=bytes_sent,
                              bytes_received=bytes_received, rows_sent=rows_sent,
                              rows_received=rows_received, seconds=0.0,
                              inter_host_bytes_sent=inter_sent,
                              inter_host_bytes_received=inter_received)

            def exposed(waited: float, in_flight: float) -> None:
                self.stats.add_seconds(key, direction, waited, in_flight=in_flight,
                                       background=background)
            return PendingExchange(recv, work, finish, None, on_wait=exposed)
        received = PendingExchange(recv, None, finish, record).wait()
        if out is not None and received is not out:
            out.copy_(received)  # the backend needed another dtype or device: one copy
            return out
        return received

    # -- device and dtype handling ----------------------------------------------------------
    def _for_backend(self, wire: Tensor):
        r"""Returns the tensor to hand to the backend and how to turn what arrives back."""
        restore = None
        dtype = wire.dtype
        if self.backend == "gloo" and wire.device.type == "cuda":
            wire = wire.cpu()  # gloo moves host memory; staged copy
            restore = (lambda t: t)
        if self.backend == "gloo" and dtype in _HALF:
            # Same bits as bytes: gloo has no int16 ("Invalid scalar type") and its bf16/fp16
            # support is unreliable.  A row of W values becomes 2W bytes (a 1-D tensor first
            # gets a trailing dimension, so that the row splits stay what they were).
            flat = wire.dim() == 1
            wire = (wire.unsqueeze(-1) if flat else wire).view(torch.uint8)
            prev = restore

            def restore(t, prev=prev, flat=flat):
                t = (prev(t) if prev else t).view(dtype)
                return t.squeeze(-1) if flat else t
        return wire, restore

    def _peers(self, send_counts: List[int], recv_counts: List[int]) -> List[int]:
        return [r for r in range(self.world_size)
                if r != self.rank and (send_counts[r] > 0 or recv_counts[r] > 0)]


class _BothWork:
    r"""The two halves of a duplex exchange, waited for as one."""

    def __init__(self, *works: Any) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def _both_directions(recv: Tensor, wire: Tensor, send_counts: List[int],
                     recv_counts: List[int], rank: int, group: Any, other: Any) -> _BothWork:
    r"""One exchange as two asynchronous ``all_to_all_single``: the rows to this rank and the
    higher ones on :obj:`group`, to the lower ones on :obj:`other`.  Rows are ordered by
    peer rank on both sides, so each half is a contiguous slice of the send and the receive
    buffers: to (from) the lower ranks first, then this rank's own, then the higher ranks'.
    Every pair's rows one way travel on one group, the other way on the other."""
    none = [0] * len(send_counts)
    low_send = sum(send_counts[:rank])
    low_recv = sum(recv_counts[:rank]) + recv_counts[rank]  # from lower ranks and itself
    up = dist.all_to_all_single(recv[:low_recv], wire[low_send:],
                                output_split_sizes=recv_counts[:rank + 1] + none[rank + 1:],
                                input_split_sizes=none[:rank] + send_counts[rank:],
                                group=group, async_op=True)
    down = dist.all_to_all_single(recv[low_recv:], wire[:low_send],
                                  output_split_sizes=none[:rank + 1] + recv_counts[rank + 1:],
                                  input_split_sizes=send_counts[:rank] + none[rank:],
                                  group=other, async_op=True)
    return _BothWork(up, down)


def _sibling_group(group: Optional[Any], timeout: Optional[Any]) -> Any:
    r"""A new process group of :obj:`group`'s ranks and backend (collective over them).

    Give it back with :func:`_release_sibling`, on every rank at the same point."""
    kwargs: dict = dict(backend=dist.get_backend(group))
    if timeout is not None:
        kwargs["timeout"] = timeout if isinstance(timeout, timedelta) \
            else timedelta(seconds=float(timeout))
    ranks = dist.get_process_group_ranks(group if group is not None else dist.group.WORLD)
    if len(ranks) == dist.get_world_size():
        return dist.new_group(**kwargs)
    spare = _SPARE_SIBLINGS.get(group, [])
    spare[:] = [sibling for sibling in spare if _alive(sibling)]
    for i, sibling in enumerate(spare):
        if _MADE_WITH.get(sibling) == kwargs.get("timeout"):
            return spare.pop(i)
    # A subgroup: only its ranks take part (the others never construct this transport).
    sibling = dist.new_group(ranks=ranks, use_local_synchronization=True, **kwargs)
    _MADE_WITH[sibling] = kwargs.get("timeout")
    return sibling


def _release_sibling(group: Optional[Any], sibling: Any, reuse: bool = True) -> None:
    r"""Gives back a group made by :func:`_sibling_group` for :obj:`group`, once nothing is
    in flight on it (:obj:`reuse=False` after a failure: destroyed whatever its state).

    A sibling of the whole world is destroyed.  A sibling of a subgroup is kept for the next
    transport of that subgroup instead: torch names a group made with local synchronization
    after its ranks and the number of groups alive, so one made after destroying another of
    the same ranks gets the destroyed one's name, and its rendezvous reads the destroyed one's
    addresses from the store and fails (``connectFullMesh ... Connection refused``, after the
    timeout).  So a subgroup keeps at most as many siblings as it ever had in use at
    once (two per transport, one while a calibration runs), until the world is destroyed."""
    if not (dist.is_available() and dist.is_initialized()) or not _alive(sibling):
        return  # already gone with the world (destroy_process_group())
    whole = dist.get_world_size(sibling) == dist.get_world_size()
    if reuse and not whole:
        _SPARE_SIBLINGS.setdefault(group, []).append(sibling)
        return
    try:
        dist.destroy_process_group(sibling)
    except ValueError:
        pass


#: Siblings of subgroups no transport uses now, by subgroup (see :func:`_release_sibling`).
_SPARE_SIBLINGS: "weakref.WeakKeyDictionary[Any, List[Any]]" = weakref.WeakKeyDictionary()
#: The collective timeout each sibling of a subgroup was made with (a spare serves only a
#: transport with the same one).
_MADE_WITH: "weakref.WeakKeyDictionary[Any, Optional[timedelta]]" = weakref.WeakKeyDictionary()


def _alive(group: Any) -> bool:
    try:
        dist.get_process_group_ranks(group)
    except (KeyError, ValueError, RuntimeError):
        return False
    return True


class _Timer:
    r"""Wall time of an exchange; on CUDA measured by events on the current stream."""

    def __init__(self, device: torch.device) -> None:
        # The start on the wall clock, which ranks share (one host's, or hosts' kept within
        # milliseconds by NTP): when the last rank arrived at the exchange, across ranks.
        self.wall = time.time()
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.end = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.start.elapsed_time(self.end) / 1e3
        return time.perf_counter() - self.t0
