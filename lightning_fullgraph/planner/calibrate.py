r"""Measuring the :class:`~.link.LinkModel` of a process group.

:func:`calibrate` runs a short size sweep of ``all_to_all_single`` -- the one collective the
halo exchange uses (:class:`~lightning_fullgraph.engine.Transport`) -- on the group that trains:
for every size, a few timed repetitions after a barrier (the sizes taking turns), their median;
then the medians of all ranks are reduced with ``MAX`` so that every rank holds the same numbers (and, from them, takes
the same decisions).  The latency is the median time of an exchange of zero bytes divided by
the number of peers; the bandwidth is the least-squares slope of the remaining sizes through
that intercept.  The codec throughput is the median time of ``encode`` + ``decode`` of a block
of rows (the identity codec by default, which is nearly free).

Without a process group (or with one rank) the exchange is what
:class:`~lightning_fullgraph.engine.Transport` does then: a copy of the send buffer.
:func:`calibrate_local` measures a group of local gloo processes it spawns, for tools (the
``plan`` command) that run outside a training job.
"""
import statistics
import time
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

from .link import LinkModel

__all__ = ["calibrate", "calibrate_codec", "calibrate_local", "DEFAULT_SIZES"]

#: Bytes one rank sends per exchange in the sweep: latency-bound to bandwidth-bound.
DEFAULT_SIZES = (0, 1 << 16, 1 << 20, 1 << 23)


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


def _time_once(send, recv, splits, world: int, group: Optional[Any],
               device: torch.device) -> float:
    r"""Seconds of one ``all_to_all_single`` after a barrier (a copy for one rank)."""
    if world > 1:
        dist.barrier(group=group)
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
           device: torch.device, repeats: int, warmup: int) -> List[float]:
    r"""Median seconds per size.  The sizes take turns within every repetition, so that a
    passing disturbance (another job on the machine) touches all of them alike instead of
    one size's samples."""
    buffers = [_buffers(s, world, rank, device) for s in sizes]
    times: List[List[float]] = [[] for _ in sizes]
    for i in range(warmup + repeats):
        for j, (send, recv, splits) in enumerate(buffers):
            t = _time_once(send, recv, splits, world, group, device)
            if i >= warmup:
                times[j].append(t)
    return [statistics.median(t) for t in times]


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
    x = torch.randn(int(rows), int(width), dtype=dtype, device=device)
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
              repeats: int = 7, warmup: int = 2, device: Optional[torch.device] = None,
              codec: Any = None, codec_rows: int = 4096, codec_width: int = 128) -> LinkModel:
    r"""Measures latency, bandwidth and codec throughput on :obj:`group`.

    Every rank of the group must call it at the same point (it runs barriers and
    ``all_to_all_single`` collectives, then one ``all_reduce``).  The result is identical on
    all ranks: each size's median is the maximum over ranks.

    Args:
        group (ProcessGroup, optional): The group (default: the world; without an initialized
            process group, this process alone).
        sizes (Sequence[int]): Bytes one rank sends per exchange; ``0`` is always measured
            (the latency).
        repeats (int): Timed repetitions per size (their median counts).
        warmup (int): Untimed repetitions per size before those.
        device (torch.device, optional): Device of the buffers (default: the current CUDA
            device with NCCL, else CPU).
        codec (Codec, optional): Codec whose throughput is measured (default: identity).
        codec_rows (int): Rows of the codec block.
        codec_width (int): Values per row of the codec block.

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
    medians = _sweep(sizes, world, rank, group, device, repeats, warmup)
    codec_s = calibrate_codec(codec, rows=codec_rows, width=codec_width, repeats=repeats,
                              device=device)
    values = torch.tensor(medians + [codec_s], dtype=torch.float64)
    if world > 1:
        buf = values.to(device) if backend == "nccl" else values
        dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=group)
        values = buf.cpu()
    medians, codec_s = values[:-1].tolist(), float(values[-1])
    if world > 1:  # bytes actually sent: whole floats, evenly over the peers
        sent = [(s // 4 // (world - 1)) * (world - 1) * 4 for s in sizes]
    else:
        sent = [s // 4 * 4 for s in sizes]
    alpha, beta = _fit(sent, medians, world)
    codec_bytes = codec_rows * codec_width * 4
    return LinkModel(alpha=alpha, beta=beta, codec_throughput=codec_bytes / codec_s,
                     world_size=world, backend=backend, device=str(device),
                     samples=list(zip(sent, medians)),
                     codec=type(codec).__name__ if codec is not None else "IdentityCodec")


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

