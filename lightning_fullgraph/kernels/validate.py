"""Cheap validation of a CSR at the op boundary for the Python backends (torch, Triton).

The kernels read ``x[col[e]]`` for ``e`` in ``[rowptr[r], rowptr[r + 1])``; the Triton
kernels do so without bounds checks, so a hand-built CSR that breaks an invariant reads
out of bounds. :func:`check_csr` verifies, before anything is launched:

* ``rowptr`` is 1-D int64 with ``N_dst + 1 >= 1`` entries, ``col`` 1-D int32/int64, all on
  ``x``'s device;
* ``rowptr[0] == 0`` and ``rowptr[-1] == nnz == col.numel()``;
* ``rowptr`` is non-decreasing;
* every ``col`` entry lies in ``[0, N_src)``, ``N_src`` = rows of the source features.

The same invariants, with the same messages and exception types (``ValueError`` for the
structure, ``IndexError`` for out-of-range columns), are checked by the C++ kernels in
``csrc/aggregate.cpp``. The reductions run with torch ops on the tensors' device and come
back in a single host transfer; only on a violation is the first offending position
searched for.

That transfer synchronises a GPU, and the pass reads the index arrays once, so pairs that
were already validated are remembered (:data:`MEMO_SIZE` of them, in a
:class:`~lightning_fullgraph.memo.TensorMemo`): a pair is recognised by the identity of both
tensor objects (followed weakly: nothing is kept alive), their storage, offset, shape, strides,
dtype, device and *version counter*, which every in-place op bumps, also through views. Any difference validates again. Writes that PyTorch does not track
(``.numpy()``, ``.data``, DLPack, raw pointers) are not seen; :func:`set_memo_size` ``(0)``
validates on every call. Inference tensors have no version counter and are never cached.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..memo import TensorMemo

__all__ = ["check_aggregation", "check_edge_dot", "check_csr", "check_weight", "check_features", "check_index_range",
           "set_memo_size", "clear_memo", "memo_info", "MEMO_SIZE"]

MEMO_SIZE = 8

#: Validated index tensors (a CSR pair, or one index) and the range their entries span.
_memo = TensorMemo(MEMO_SIZE)


def set_memo_size(n: int) -> None:
    """Number of validated pairs remembered; ``0`` validates on every call."""
    _memo.set_size(n)


def clear_memo() -> None:
    """Forget all validated pairs (and reset the counters of :func:`memo_info`)."""
    _memo.clear()


def memo_info() -> dict:
    """``{"hits", "misses", "size", "capacity"}`` of the validation memo."""
    return {"hits": _memo.hits, "misses": _memo.misses, "size": len(_memo),
            "capacity": _memo.size}


def _cacheable(*ts: Tensor) -> bool:
    return _memo.size != 0 and not any(t.is_inference() for t in ts)


def _lookup(a: Tensor, b: Optional[Tensor], bound: int) -> bool:
    span = _memo.get((id(a), id(b)), (a, b), count=False)
    hit = span is not None and span[0] >= 0 and span[1] < bound  # fewer source rows now:
    # validate (and raise) again
    if hit:
        _memo.hits += 1
    else:
        _memo.misses += 1
    return hit


def _insert(a: Tensor, b: Optional[Tensor], lo: int, hi: int) -> None:
    _memo.put((id(a), id(b)), (a, b), (lo, hi))


def _index_dtype_ok(rowptr: Tensor, col: Tensor, op: str) -> None:
    if rowptr.dtype != torch.int64:
        raise ValueError(f"{op}: rowptr must be int64, got {rowptr.dtype}")
    if col.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{op}: col must be int32 or int64, got {col.dtype}")
    if rowptr.dim() != 1 or col.dim() != 1:
        raise ValueError(f"{op}: rowptr and col must be 1-D, got {rowptr.dim()}-D and {col.dim()}-D")


def _col_error(op: str, col: Tensor, num_src: int, lo: int, hi: int, name: str = "col") -> IndexError:
    bad = torch.nonzero((col < 0) | (col >= num_src))[0, 0]
    first = int(bad)
    return IndexError(f"{op}: invalid CSR: {name} entries must lie in [0, N_src) = [0, {num_src}) where N_src = "
                      f"rows of the source features; first offending position {name}[{first}] = {int(col[first])} "
                      f"({name} min {lo}, max {hi})")


def check_csr(op: str, rowptr: Tensor, col: Tensor, num_src: int, device: Optional[torch.device] = None) -> None:
    """Raise unless ``(rowptr, col)`` is a valid CSR over ``num_src`` source rows.

    Args:
        op: Op name for the messages.
        rowptr: ``[N_dst + 1]`` int64 row offsets.
        col: ``[E]`` int32/int64 source of each edge.
        num_src: Rows of the source features; columns must lie in ``[0, num_src)``.
        device: Device the kernel runs on (``x``'s); all index tensors must be there.

    Raises:
        ValueError: bad dtype/shape/device, ``rowptr[0] != 0``, ``rowptr[-1] != nnz`` or a
            decreasing ``rowptr`` (the message names the first violation).
        IndexError: a column outside ``[0, num_src)`` (the message names the first one).
    """
    _index_dtype_ok(rowptr, col, op)
    if device is not None and (rowptr.device != device or col.device != device):
        raise ValueError(f"{op}: rowptr ({rowptr.device}) and col ({col.device}) must be on the device of x ({device})")
    if rowptr.numel() < 1:
        raise ValueError(f"{op}: invalid CSR: rowptr must have N_dst + 1 >= 1 entries, got 0")
    cache = _cacheable(rowptr, col)
    if cache and _lookup(rowptr, col, num_src):
        return
    n, nnz = rowptr.numel() - 1, col.numel()
    parts = [rowptr[0], rowptr[-1]]
    mono = rowptr[1:] < rowptr[:-1] if n > 0 else None
    parts.append(mono.any().to(torch.int64) if mono is not None else rowptr.new_zeros(()))
    if nnz > 0:
        lo_t, hi_t = torch.aminmax(col)
        parts += [lo_t.to(torch.int64), hi_t.to(torch.int64)]
    first, last, decreasing, *lohi = torch.stack(parts).tolist()  # the one host transfer
    lo, hi = lohi if lohi else (0, -1)
    if first != 0:
        raise ValueError(f"{op}: invalid CSR: rowptr[0] must be 0, got {first}")
    if last != nnz:
        raise ValueError(f"{op}: invalid CSR: rowptr[-1] = rowptr[{n}] must equal nnz = col.numel() = {nnz}, "
                         f"got {last}")
    if decreasing:
        i = int(torch.nonzero(mono)[0, 0])
        raise ValueError(f"{op}: invalid CSR: rowptr must be non-decreasing; first violation at rowptr[{i}] = "
                         f"{int(rowptr[i])} > rowptr[{i + 1}] = {int(rowptr[i + 1])}")
    if nnz > 0 and (lo < 0 or hi >= num_src):
        raise _col_error(op, col, num_src, lo, hi)
    if cache:
        _insert(rowptr, col, lo, hi)


def check_index_range(op: str, index: Tensor, bound: int, name: str, what: str) -> None:
    """Raise ``IndexError`` unless every entry of ``index`` lies in ``[0, bound)`` (cached like :func:`check_csr`).

    Args:
        op: Op name for the message.
        index: Integer tensor.
        bound: Exclusive upper bound.
        name: Name of ``index`` in the message.
        what: What ``bound`` counts, for the message.
    """
    if index.numel() == 0:
        return
    cache = _cacheable(index)
    if cache and _lookup(index, None, bound):
        return
    lo, hi = torch.stack([t.to(torch.int64) for t in torch.aminmax(index)]).tolist()
    if lo < 0 or hi >= bound:
        flat = index.reshape(-1)
        first = int(torch.nonzero((flat < 0) | (flat >= bound))[0, 0])
        raise IndexError(f"{op}: {name} entries must lie in [0, {bound}) ({what}); first offending position "
                         f"{name}[{first}] = {int(flat[first])} ({name} min {lo}, max {hi})")
    if cache:
        _insert(index, None, lo, hi)


def check_weight(op: str, weight: Optional[Tensor], nnz: int, device: torch.device) -> None:
    """Raise ``ValueError`` unless ``weight`` is ``None`` or has one entry per edge on ``device``."""
    if weight is None:
        return
    if weight.numel() != nnz:
        raise ValueError(f"{op}: weight must have one entry per edge: nnz = col.numel() = {nnz}, "
                         f"got weight.numel() = {weight.numel()}")
    if weight.device != device:
        raise ValueError(f"{op}: weight ({weight.device}) must be on the device of x ({device})")


def check_features(op: str, x: Tensor, name: str = "x") -> None:
    """Raise ``ValueError`` unless ``x`` is 2-D ``[N, F]``."""
    if x.dim() != 2:
        raise ValueError(f"{op}: {name} must be 2-D [N_src, F], got {x.dim()}-D")


def check_aggregation(op: str, rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor) -> None:
    """All checks of ``csr_sum``/``csr_max(rowptr, col, weight, x)`` before a launch."""
    check_features(op, x)
    _index_dtype_ok(rowptr, col, op)
    check_weight(op, weight, col.numel(), x.device)
    check_csr(op, rowptr, col, x.size(0), x.device)


def check_edge_dot(op: str, rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor) -> None:
    """All checks of ``csr_edge_dot(rowptr, col, a, b)`` before a launch (``a``: ``[N_dst, F]``)."""
    check_features(op, b, "b")
    if a.dim() != 2 or a.dtype != b.dtype or a.device != b.device:
        raise ValueError(f"{op}: a must be a 2-D tensor of b's dtype and device")
    check_csr(op, rowptr, col, b.size(0), b.device)
    if a.size(0) != rowptr.numel() - 1 or a.size(1) != b.size(1):
        raise ValueError(f"{op}: a must be [N_dst, F] = [rowptr.numel() - 1, b.size(1)] = "
                         f"[{rowptr.numel() - 1}, {b.size(1)}], got [{a.size(0)}, {a.size(1)}]")
