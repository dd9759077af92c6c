r"""Measuring the :class:`~.link.LinkModel` of a process group.

:func:`calibrate` runs a short size sweep of ``all_to_all_single`` -- the one collective the
halo exchange uses (:class:`~lightning_fullgraph.engine.Transport`) -- on the group that trains:
for every size, timed repetitions (the sizes taking turns; a bulk size, above 8 MiB, only in
the last few), each one entered the way the
engine enters its exchanges in training: after some compute, the ranks arriving at different
times (every rank busy-waits a uniformly drawn ``[0, skew_s]`` seconds before it, from a
generator seeded by its rank).  Every rank's times are all-gathered; a repetition counts the
time of its *fastest* rank (the one that arrived last, so it waited for no one's compute: the
exchange alone, the way the engine's counters are read in training), and a size counts the
**mean** over repetitions.  All ranks compute these numbers from the same gathered times, so
they hold the same model (and, from it, take the same decisions).

Why this protocol: a rank that waited for its peers finds them asleep in the transport,
and where ranks share cores (4 processes on 2 here) their wake-up is sometimes a
scheduler tick of milliseconds.  Exchanges in training are therefore heavy-tailed, and an
epoch's exchange time is a sum of them: its expectation needs the mean of a single
exchange, tails included, measured with peers that were waiting rather than woken together
by a barrier.  The former protocol (a barrier before each exchange, the maximum over ranks
of a per-rank median of 7) measured the hot path only and moved the latency of 4 ranks on 2
cores between 195 and 1,332 us/peer from run to run; exchanges in training took 2-4x its
predictions there.  ``skew_s=0`` restores the barrier (the hot path), for comparison.

The latency is the mean time of an exchange of zero bytes divided by
the number of peers; the bandwidth is the least-squares slope of the remaining sizes through
that intercept, which the largest size dominates: the default sweep ends with a bulk exchange
of 32 MiB a rank, because a short exchange is carried faster than the long ones of a large
graph's layers (a link's burst and queue; gloo carrying one direction of a pair at a time).
The codec's cost is the median time of ``encode`` + ``decode`` of two blocks
of as many values, in wide rows and in narrow ones (:func:`calibrate_codec_costs`): a bytes
term and a row term, because a codec that writes a header per row pays per row too (the
identity codec by default, which is nearly free).

Without a process group (or with one rank) the exchange is what
:class:`~lightning_fullgraph.engine.Transport` does then: a copy of the send buffer.
:func:`calibrate_local` measures a group of local gloo processes it spawns, for tools (the
``plan`` command) that run outside a training job.
"""
import math
import random
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from .link import LinkModel

__all__ = ["calibrate", "calibrate_codec", "calibrate_codec_costs", "calibrate_contention",
           "calibrate_queue_wait", "calibrate_duplex", "calibrate_local", "DEFAULT_SIZES"]

#: Values per row of the narrow block :func:`calibrate_codec_costs` times beside the wide one
#: (the rows of a layer whose outputs are a handful of classes).
NARROW_WIDTH = 8

#: Bytes one rank sends per exchange in the sweep: latency-bound to bandwidth-bound.  The
#: last is a bulk exchange: on four emulated machines with 1 Gbit/s links (``python -m
#: benchmarks link_sizes``) an exchange of 1 MiB a rank got 94-95 % of the line rate and one of
#: 64 MiB 73-81 %; a sweep ending at 8 MiB read 1.29-1.44x the 64 MiB exchange's bandwidth,
#: this one 1.04-1.15x (and 1.05x the link fitted to a GraphSAGE run's exchanges).
DEFAULT_SIZES = (0, 1 << 16, 1 << 20, 1 << 23, 1 << 25)

#: Sizes above this many bytes are bulk: timed at most ``bulk_repeats`` times (:func:`calibrate`).
BULK_BYTES = 1 << 23


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _group_info(group: Optional[Any]):
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(group), dist.get_rank(group), str(dist.get_backend(group))
    return 1, 0, "none"


def _default_device(backend: str) -> torch.device:
    if backend == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _buffers(nbytes: int, world: int, rank: int, device: torch.device):
    r"""Send/receive buffers and splits for an exchange in which every rank sends about
    :obj:`nbytes` bytes, spread evenly over its peers."""
    elements = max(0, int(nbytes) // 4)
    if world > 1:
        per_peer = elements // (world - 1)
        splits = [0 if r == rank else per_peer for r in range(world)]
        send = torch.ones(per_peer * (world - 1), dtype=torch.float32, device=device)
    else:
        splits = None
        send = torch.ones(elements, dtype=torch.float32, device=device)
    return send, torch.empty_like(send), splits


def _busy(seconds: float) -> None:
    r"""Spins for :obj:`seconds` (stands for the compute before an exchange in training)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _time_once(send, recv, splits, world: int, group: Optional[Any],
               device: torch.device, before: float) -> float:
    r"""Seconds of one ``all_to_all_single`` (a copy for one rank), entered after
    :obj:`before` seconds of busy-waiting, or after a barrier if that is ``0``."""
    if world > 1 and before <= 0:
        dist.barrier(group=group)
    else:
        _busy(before)
    _sync(device)
    t0 = time.perf_counter()
    if world > 1:
        dist.all_to_all_single(recv, send, output_split_sizes=splits, input_split_sizes=splits,
                               group=group)
    elif send.numel():
        recv.copy_(send)
    _sync(device)
    return time.perf_counter() - t0


def _sweep(sizes: Sequence[int], world: int, rank: int, group: Optional[Any],
           device: torch.device, repeats: int, warmup: int, skew_s: float,
           bulk_repeats: int) -> torch.Tensor:
    r"""This rank's seconds, ``[repeats, len(sizes)]`` (float64, CPU).  The sizes take turns
    within every repetition, so that a passing disturbance (another job on the machine)
    touches all of them alike instead of one size's samples.  Sizes above
    :data:`BULK_BYTES` take part in the last ``min(repeats, bulk_repeats)`` repetitions only
    (and in at most one warm-up); their other entries are NaN.  Every rank runs the same
    exchanges: the counts depend on the arguments alone."""
    buffers = [_buffers(s, world, rank, device) for s in sizes]
    bulk = max(1, min(repeats, int(bulk_repeats)))
    first = warmup + repeats - bulk  # the bulk sizes' first timed turn
    draws = random.Random(rank)
    times = torch.full((repeats, len(sizes)), math.nan, dtype=torch.float64)
    for i in range(warmup + repeats):
        for j, (send, recv, splits) in enumerate(buffers):
            if sizes[j] > BULK_BYTES:
                if i < first - min(warmup, 1):  # at most one warm-up, right before
                    continue
                timed = i >= first
            else:
                timed = i >= warmup
            before = draws.uniform(0.0, skew_s) if skew_s > 0 else 0.0
            t = _time_once(send, recv, splits, world, group, device, before)
            if timed:
                times[i - warmup, j] = t
    return times


def _fastest_rank_means(times: torch.Tensor, world: int, backend: str,
                        group: Optional[Any], device: torch.device) -> List[float]:
    r"""Per size, the mean over repetitions of the fastest rank's time (identical on every
    rank: computed from the all-gathered times)."""
    if world > 1:
        local = times.to(device) if backend == "nccl" else times
        gathered = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(gathered, local, group=group)
        times = torch.stack([g.cpu() for g in gathered]).min(dim=0).values
    return times.nanmean(dim=0).tolist()  # NaN: a bulk size's untimed turns, on every rank


def calibrate_codec(codec: Any = None, *, rows: int = 4096, width: int = 128,
                    repeats: int = 5, dtype: torch.dtype = torch.float32,
                    device: Optional[torch.device] = None) -> float:
    r"""Median seconds of ``encode`` + ``decode`` of a block of rows on this process.

    Args:
        codec (Codec, optional): The codec (default: the identity codec).
        rows (int): Rows in the block.
        width (int): Values per row.
        repeats (int): Timed repetitions (one more runs untimed first).
        dtype (torch.dtype): dtype of the rows.
        device (torch.device, optional): Where the rows live (default: CPU).

    Returns:
        float: Median seconds for :math:`rows \times width` values (positive).
    """
    from ..engine.codecs import IdentityCodec, WireContext
    codec = codec if codec is not None else IdentityCodec()
    device = torch.device(device) if device is not None else torch.device("cpu")
    # Its own generator: a calibration at fit start must not move the training's random state.
    x = torch.randn(int(rows), int(width), dtype=dtype, device=device,
                    generator=torch.Generator(device).manual_seed(0))
    ctx = WireContext("calibrate", "forward", 0, 0, int(width), dtype)
    times = []
    for i in range(int(repeats) + 1):
        _sync(device)
        t0 = time.perf_counter()
        out = codec.decode(codec.encode(x, ctx), ctx)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    del out
    return max(statistics.median(times), 1e-9)


def calibrate_codec_costs(codec: Any = None, *, rows: int = 4096, width: int = 128,
                          narrow: int = NARROW_WIDTH, repeats: int = 5,
                          dtype: torch.dtype = torch.float32,
                          device: Optional[torch.device] = None) -> Tuple[float, float]:
    r"""Bytes per second and seconds per row of ``encode`` + ``decode`` on this process.

    Times a block of :obj:`rows` rows of :obj:`width` values and a block of as many values in
    rows of :obj:`narrow` (:func:`calibrate_codec`), and solves
    :math:`t = n_{rows} (t_{row} + b \, w / TH)` for both: a codec that writes a header per row
    (:class:`~lightning_fullgraph.engine.codecs.QuantizedCodec`) costs several times more per
    byte on a 5-class layer's rows than on 256-wide ones, which one throughput cannot tell.

    Args:
        codec (Codec, optional): The codec (default: the identity codec).
        rows (int): Rows of the wide block.
        width (int): Values per row of the wide block.
        narrow (int): Values per row of the narrow block (:obj:`width` or more: the bytes
            alone are measured). (default: :obj:`8`)
        repeats (int): Timed repetitions of each block.
        dtype (torch.dtype): dtype of the rows.
        device (torch.device, optional): Where the rows live (default: CPU).

    Returns:
        Tuple[float, float]: ``(throughput, row_seconds)``: bytes per second (positive) and
        seconds per row (``>= 0``), as :class:`~.link.LinkModel` holds them.
    """
    wide_s = calibrate_codec(codec, rows=rows, width=width, repeats=repeats, dtype=dtype,
                             device=device)
    if narrow >= width:
        return _codec_costs(rows, width, wide_s, 0, narrow, 0.0, dtype)
    narrow_rows = max(1, rows * width // narrow)
    narrow_s = calibrate_codec(codec, rows=narrow_rows, width=narrow, repeats=repeats,
                               dtype=dtype, device=device)
    return _codec_costs(rows, width, wide_s, narrow_rows, narrow, narrow_s, dtype)


def _codec_costs(rows: int, width: int, wide_s: float, narrow_rows: int, narrow: int,
                 narrow_s: float, dtype: torch.dtype) -> Tuple[float, float]:
    r"""``(throughput, row_seconds)`` through the two blocks' times (the wide block's bytes
    alone where the narrow one was not measured or the two disagree: timing noise)."""
    size = torch.empty((), dtype=dtype).element_size()
    bytes_only = (rows * width * size / wide_s, 0.0)
    if narrow_rows <= 0:
        return bytes_only
    per_wide, per_narrow = wide_s / rows, narrow_s / narrow_rows
    per_value = (per_wide - per_narrow) / (width - narrow)
    row_s = per_narrow - per_value * narrow
    if not per_value > 0 or not row_s >= 0:
        return bytes_only
    return size / per_value, row_s


def _dense_rounds(rounds: int, a: torch.Tensor, w: torch.Tensor,
                  work: Any = None) -> Optional[float]:
    r"""Runs :obj:`rounds` dense products (a GNN layer's kind of compute, on the rank's
    threads); with an asynchronous :obj:`work` in flight, the seconds from the start at which
    it was first seen complete (``None``: still in flight at the end)."""
    t0, done = time.perf_counter(), None
    for _ in range(rounds):
        torch.mm(a, w)
        if work is not None and done is None and work.is_completed():
            done = time.perf_counter() - t0
    return done


def calibrate_contention(group: Optional[Any] = None, *, beta: float, repeats: int = 5,
                         block_s: float = 0.2, max_bytes: int = 1 << 26) -> float:
    r"""The fraction of its compute a rank loses while its link is busy with its own
    transfers: :attr:`~.link.LinkModel.contention`.

    Overlap hides a transfer behind compute, but moving the bytes is work too (the transport's
    threads, the kernel's network stack, copies) and it runs on the same cores: on four
    emulated four-core machines, the asynchronous pipeline's GraphSAGE step, its transfers in
    flight throughout, computed 4.6 s where exact post without overlap computed 2.4 s.  Timed
    here as it happens: a block of dense products
    (about :obj:`block_s` seconds alone) runs alone, then while an asynchronous
    ``all_to_all_single`` of about twice the block's worth of bytes at :obj:`beta` is in
    flight, in both orders, :obj:`repeats` times; the contention is the extra compute time over
    the seconds the transfer overlapped it, median over repetitions, mean over ranks
    (all-reduced: the same on every rank).  CPU tensors only (gloo); ``0.0`` for one rank.

    Every rank of the group must call it at the same point.

    Args:
        group (ProcessGroup, optional): The group (default: the world).
        beta (float): The group's bandwidth in bytes per second (sizes the transfer).
        repeats (int): Timed repetitions.
        block_s (float): Seconds of the compute block alone.
        max_bytes (int): Most bytes one rank sends in the transfer.

    Returns:
        float: In ``[0, 0.95]``: the compute seconds lost per second of transfer in flight.
    """
    world, rank, _ = _group_info(group)
    if world < 2:
        return 0.0
    # Its own generator: a calibration at fit start must not move the training's random state.
    gen = torch.Generator().manual_seed(rank)
    a = torch.randn(4096, 256, generator=gen)
    w = torch.randn(256, 256, generator=gen)
    _dense_rounds(2, a, w)
    t0 = time.perf_counter()
    _dense_rounds(8, a, w)
    per_round = max((time.perf_counter() - t0) / 8, 1e-6)
    # Every rank runs the same number of rounds (the largest over ranks' estimates is agreed
    # first: a rank that computed less would start its next collective early).
    rounds = torch.tensor([max(4, int(block_s / per_round))], dtype=torch.float64)
    dist.all_reduce(rounds, op=dist.ReduceOp.MAX, group=group)
    rounds = int(rounds.item())
    nbytes = min(int(max_bytes), int(2 * block_s * beta))
    send, recv, splits = _buffers(nbytes, world, rank, torch.device("cpu"))
    shares = []
    for i in range(int(repeats)):
        times = {}
        for loaded in ((False, True) if i % 2 == 0 else (True, False)):
            dist.barrier(group=group)
            work = dist.all_to_all_single(recv, send, output_split_sizes=splits,
                                          input_split_sizes=splits, group=group,
                                          async_op=True) if loaded else None
            t0 = time.perf_counter()
            done = _dense_rounds(rounds, a, w, work)
            seconds = time.perf_counter() - t0
            if work is not None:
                work.wait()
                times["overlap"] = seconds if done is None else done
            times[loaded] = seconds
        if times["overlap"] > 0:
            shares.append(max(0.0, times[True] - times[False]) / times["overlap"])
    share = torch.tensor([statistics.median(shares) if shares else 0.0], dtype=torch.float64)
    dist.all_reduce(share, op=dist.ReduceOp.SUM, group=group)
    return min(0.95, float(share.item()) / world)



def calibrate_queue_wait(group: Optional[Any] = None, *, beta: float, repeats: int = 3,
                         fill_s: float = 0.2, timed: int = 3, max_bytes: int = 1 << 26,
                         timeout: Optional[Any] = None) -> float:
    r"""The seconds a small synchronous collective waits longer while a transfer of the
    rank's own, on another process group, keeps its link busy:
    :attr:`~.link.LinkModel.queue_wait`.

    A transfer left in flight past the training step (the asynchronous pipeline's, on a group
    of its own) fills the link's queue, and every message of the step's own collectives (the
    gradient all-reduce, the signal agreement) queues behind its bytes: on four emulated
    four-core machines at 1 Gbit/s, a 0.8 MB all-reduce took 0.081 s on an idle link and
    0.430 s beside such a transfer (``python -m benchmarks busy_link``).  Timed here as it
    happens: an all-reduce of 256 values on :obj:`group` alone, and again :obj:`fill_s`
    seconds after an asynchronous ``all_to_all_single`` on a second group (created here over
    the same ranks, as the pipeline creates its own, and given back after) started with enough
    bytes at :obj:`beta` to outlast it, :obj:`timed` of them each time, :obj:`repeats` times;
    the queue wait is the median excess per all-reduce, mean over ranks (all-reduced: the
    same on every rank).  CPU tensors only (gloo); ``0.0`` for one rank.

    Every rank of the group must call it at the same point.

    Args:
        group (ProcessGroup, optional): The group (default: the world).
        beta (float): The group's bandwidth in bytes per second (sizes the transfer).
        repeats (int): Timed repetitions.
        fill_s (float): Seconds the transfer runs before the timed all-reduces (its bytes
            fill the link's queue first).
        timed (int): All-reduces timed per repetition.
        max_bytes (int): Most bytes one rank sends in the transfer.
        timeout (float or timedelta, optional): The collective timeout of the second group
            (default: torch's); give the group's own.

    Returns:
        float: Seconds per collective, at least ``0``.
    """
    world, rank, _ = _group_info(group)
    if world < 2:
        return 0.0
    from ..engine.transport import _release_sibling, _sibling_group
    side = _sibling_group(group, timeout)
    done = False
    try:
        small = torch.zeros(256)

        def collectives() -> float:
            t0 = time.perf_counter()
            for _ in range(int(timed)):
                dist.all_reduce(small, group=group)
            return (time.perf_counter() - t0) / int(timed)

        collectives()  # warm-up: the connections exist before anything is timed
        # Long enough to run through the wait, the timed collectives and a margin.
        nbytes = min(int(max_bytes), int(beta * (fill_s + 1.0)))
        send, recv, splits = _buffers(nbytes, world, rank, torch.device("cpu"))
        idle, busy = [], []
        for _ in range(int(repeats)):
            dist.barrier(group=group)
            idle.append(collectives())
            dist.barrier(group=group)
            work = dist.all_to_all_single(recv, send, output_split_sizes=splits,
                                          input_split_sizes=splits, group=side, async_op=True)
            time.sleep(fill_s)
            busy.append(collectives())
            work.wait()
        done = True
    finally:
        _release_sibling(group, side, reuse=done)
    wait = torch.tensor([max(0.0, statistics.median(busy) - statistics.median(idle))],
                        dtype=torch.float64)
    dist.all_reduce(wait, op=dist.ReduceOp.SUM, group=group)
    return float(wait.item()) / world


def calibrate_duplex(group: Optional[Any] = None, *, nbytes: int = 1 << 25, repeats: int = 4,
                     timeout: Optional[Any] = None) -> float:
    r"""How many times faster a bulk exchange runs with its two directions at once, on two
    groups of the same ranks, than as one ``all_to_all_single``:
    :attr:`~.link.LinkModel.duplex_gain` (what ``ExchangeConfig(duplex=True)`` buys).

    gloo carries one direction of a pair's connection at a time; between two emulated machines
    at 1 Gbit/s a bulk exchange ran 1.99x faster with both at once, between four 1.27x
    (``python -m benchmarks link_sizes``).  Timed here as the transport sends it: an exchange
    of :obj:`nbytes` a rank, one way then the other, after one warm-up of each, :obj:`repeats`
    times, each from a barrier; each way counts the mean over repetitions of the slowest
    rank's time (all-reduced: the same on every rank), because the step waits for the rank
    that leaves the exchange last, and with one direction at a time the ranks leave it far
    apart: on four emulated two-core machines at 32 MiB a rank, the fastest rank's times
    gained 1.06-1.07x, the slowest rank's 1.20-1.25x, and exact post's training exchanges
    blocked 0.79-0.82x as long with duplex (``python -m benchmarks cluster``'s duplex rows,
    docs/benchmarks.md).  The second group is made here over the same ranks and given back
    after.  ``1.0`` for one rank or another backend than gloo (NCCL moves both directions
    at once already).

    Every rank of the group must call it at the same point.

    Args:
        group (ProcessGroup, optional): The group (default: the world).
        nbytes (int): Bytes one rank sends per exchange (a bulk size: a short one is carried
            faster than the long ones of a large graph's layers).
        repeats (int): Timed repetitions of each way.
        timeout (float or timedelta, optional): The collective timeout of the second group
            (default: torch's); give the group's own.

    Returns:
        float: The one-collective time over the two-group time.
    """
    world, rank, backend = _group_info(group)
    if world < 2 or backend != "gloo":
        return 1.0
    if int(repeats) < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    from ..engine.transport import _both_directions, _release_sibling, _sibling_group
    send, recv, splits = _buffers(int(nbytes), world, rank, torch.device("cpu"))
    side = _sibling_group(group, timeout)
    done = False
    try:
        def once(split: bool) -> float:
            dist.barrier(group=group)
            t0 = time.perf_counter()
            if split:
                _both_directions(recv, send, splits, splits, rank, group, side).wait()
            else:
                dist.all_to_all_single(recv, send, output_split_sizes=splits,
                                       input_split_sizes=splits, group=group)
            return time.perf_counter() - t0

        once(False), once(True)  # warm-up: both groups' connections exist before timing
        times = torch.tensor([[once(False), once(True)] for _ in range(int(repeats))],
                             dtype=torch.float64)
        done = True
    finally:
        _release_sibling(group, side, reuse=done)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)  # per repetition, the slowest
    one, two = times.mean(dim=0).tolist()
    return one / two if two > 0 else 1.0


def _fit(sizes: Sequence[int], seconds: Sequence[float], world: int):
    r"""``(alpha, beta)`` from the sweep: zero-size intercept, slope through it."""
    pairs = list(zip(sizes, seconds))
    t0 = next(t for s, t in pairs if s == 0)
    num = sum(s * (t - t0) for s, t in pairs if s > 0)
    den = sum(s * s for s, _ in pairs if s > 0)
    inv_beta = num / den if den else 0.0
    # A slope at or below zero is noise on a link faster than the sweep can tell apart.
    beta = 1.0 / inv_beta if inv_beta > 0 else 1e15
    alpha = max(t0, 1e-9) / max(world - 1, 1)
    return alpha, beta


def calibrate(group: Optional[Any] = None, *, sizes: Sequence[int] = DEFAULT_SIZES,
              repeats: int = 60, warmup: int = 2, skew_s: float = 2e-3,
              bulk_repeats: int = 4, device: Optional[torch.device] = None,
              codec: Any = None, codec_rows: int = 4096, codec_width: int = 128,
              contention: bool = False, duplex: bool = False,
              timeout: Optional[Any] = None) -> LinkModel:
    r"""Measures latency, bandwidth and codec throughput on :obj:`group` (and, asked for, what
    transfers in flight cost: the contention of compute with them, and the queue wait of a
    collective behind them).

    Every rank of the group must call it at the same point (it runs barriers and
    ``all_to_all_single`` collectives, then one ``all_gather`` and one ``all_reduce``).  The
    result is identical on all ranks: each size counts the mean over repetitions of the
    fastest rank's time; the codec, the slowest rank's median.

    Args:
        group (ProcessGroup, optional): The group (default: the world; without an initialized
            process group, this process alone).
        sizes (Sequence[int]): Bytes one rank sends per exchange; ``0`` is always measured
            (the latency).
        repeats (int): Timed repetitions per size (the mean over them of the fastest
            rank's time counts; the codec is timed ``min(repeats, 7)`` times).
        warmup (int): Untimed repetitions per size before those.
        skew_s (float): Each rank busy-waits a uniformly drawn ``[0, skew_s]`` seconds before
            every exchange, so that ranks arrive at different times as in training; ``0``
            puts a barrier there instead.
        bulk_repeats (int): Timed repetitions of the sizes above :data:`BULK_BYTES` (8 MiB),
            at most :obj:`repeats`, after at most one warm-up: long exchanges vary little,
            and on four machines at 1 Gbit/s the default's 32 MiB took 0.34 s
            (``python -m benchmarks link_sizes``).
        device (torch.device, optional): Device of the buffers (default: the current CUDA
            device with NCCL, else CPU).
        codec (Codec, optional): Codec whose cost is measured (default: identity).
        codec_rows (int): Rows of the codec's wide block.
        codec_width (int): Values per row of the codec's wide block (a block of as many
            values in rows of 8 is timed too: :func:`calibrate_codec_costs`).
        contention (bool): Also measure :attr:`~.link.LinkModel.contention`
            (:func:`calibrate_contention`: ten compute blocks of 0.2 s and the transfers
            beside five of them) and :attr:`~.link.LinkModel.queue_wait`
            (:func:`calibrate_queue_wait`: three transfers of about 1.2 s); CPU tensors only,
            else left at 0.
        duplex (bool): Also measure :attr:`~.link.LinkModel.duplex_gain`
            (:func:`calibrate_duplex`, at the largest size, :obj:`bulk_repeats` times); gloo
            only, else left at 1.
        timeout (float or timedelta, optional): The group's collective timeout, for the
            second group the queue wait and the duplex gain are measured on (default:
            torch's).

    Returns:
        LinkModel
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    sizes = sorted({0, *(int(s) for s in sizes)})
    if sizes[0] < 0:
        raise ValueError(f"sizes must be >= 0, got {sizes}")
    world, rank, backend = _group_info(group)
    device = torch.device(device) if device is not None else _default_device(backend)
    if skew_s < 0:
        raise ValueError(f"skew_s must be >= 0, got {skew_s}")
    if bulk_repeats < 1:
        raise ValueError(f"bulk_repeats must be >= 1, got {bulk_repeats}")
    times = _sweep(sizes, world, rank, group, device, repeats, warmup, float(skew_s),
                   bulk_repeats)
    means = _fastest_rank_means(times, world, backend, group, device)
    # The codec's wide and narrow blocks (calibrate_codec_costs), each the slowest rank's:
    # every rank must hold the same numbers.
    narrow = min(NARROW_WIDTH, codec_width)
    narrow_rows = codec_rows * codec_width // narrow if narrow < codec_width else 0
    codec_s = torch.tensor([calibrate_codec(codec, rows=codec_rows, width=codec_width,
                                            repeats=min(repeats, 7), device=device),
                            calibrate_codec(codec, rows=narrow_rows, width=narrow,
                                            repeats=min(repeats, 7), device=device)
                            if narrow_rows else 0.0], dtype=torch.float64)
    if world > 1:
        buf = codec_s.to(device) if backend == "nccl" else codec_s
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
        codec_s = buf.cpu()
    throughput, row_s = _codec_costs(codec_rows, codec_width, float(codec_s[0]), narrow_rows,
                                     narrow, float(codec_s[1]), torch.float32)
    if world > 1:  # bytes actually sent: whole floats, evenly over the peers
        sent = [(s // 4 // (world - 1)) * (world - 1) * 4 for s in sizes]
    else:
        sent = [s // 4 * 4 for s in sizes]
    alpha, beta = _fit(sent, means, world)
    measure = contention and world > 1 and device.type == "cpu"
    share = calibrate_contention(group, beta=beta) if measure else 0.0
    queue = calibrate_queue_wait(group, beta=beta, timeout=timeout) if measure else 0.0
    gain = calibrate_duplex(group, nbytes=max(sizes[-1], BULK_BYTES), repeats=bulk_repeats,
                            timeout=timeout) if duplex else 1.0
    return LinkModel(alpha=alpha, beta=beta, codec_throughput=throughput,
                     codec_row_seconds=row_s,
                     world_size=world, backend=backend, device=str(device),
                     samples=list(zip(sent, means)),
                     codec=type(codec).__name__ if codec is not None else "IdentityCodec",
                     contention=share, queue_wait=queue, duplex_gain=gain)


def _calibrate_worker(rank: int, world_size: int, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    return calibrate(**kwargs).to_dict()


def calibrate_local(world_size: int = 2, *, timeout_s: float = 120.0, **kwargs: Any) -> LinkModel:
    r"""Spawns :obj:`world_size` local gloo processes and runs :func:`calibrate` on them.

    For tools that run outside a training job (``lightning-fullgraph plan``); a training job
    calibrates its own group with :func:`calibrate`.  Takes a few seconds, most of it the
    processes' start-up.

    Args:
        world_size (int): Processes (at least 2).
        timeout_s (float): Collective timeout and overall deadline.
        **kwargs: Passed to :func:`calibrate` (picklable values only).

    Returns:
        LinkModel: The group's model (identical on every rank).
    """
    if world_size < 2:
        raise ValueError(f"calibrate_local needs at least 2 processes, got {world_size}")
    from ..testing import run_distributed
    results = run_distributed(_calibrate_worker, int(world_size), kwargs, timeout_s=timeout_s)
    return LinkModel.from_dict(results[0])

