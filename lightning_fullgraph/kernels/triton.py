"""Triton GPU kernels with the same signatures as the C++ ones (CSR row-split, feature-blocked).

One program per (destination row, feature block): it walks the row's edges in tiles of
``BLOCK_E``, gathers a ``[BLOCK_E, BLOCK_F]`` tile of source rows and reduces it in
registers, so every output element is written once without atomics. Backward of sum/mean
reuses :func:`csr_sum` on the transposed CSR; the weight gradient uses :func:`csr_edge_dot`.

On a machine without a GPU the kernels run under the Triton interpreter
(``TRITON_INTERPRET=1`` set before ``triton`` is imported) on plain CPU tensors - that is
how CI checks correctness. Import this module lazily: it imports ``triton``.

The kernels do not bounds-check: every entry point validates the CSR first
(:mod:`.validate`, one host transfer; pairs already validated and unchanged are skipped).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import reference, validate

__all__ = ["csr_sum", "csr_max", "csr_edge_dot", "is_available"]


def is_available() -> bool:
    """Triton usable here: a CUDA device, or the interpreter on CPU."""
    import os

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _sum_kernel(rowptr, col, w, x, out, F, HAS_W: tl.constexpr, MEAN: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    row = tl.program_id(0)
    fb = tl.program_id(1)
    offs_f = fb * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = offs_f < F
    start = tl.load(rowptr + row)
    end = tl.load(rowptr + row + 1)
    acc = tl.zeros([BLOCK_F], dtype=tl.float32)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < end
        c = tl.load(col + offs_e, mask=mask_e, other=0).to(tl.int64)
        tile = tl.load(x + c[:, None] * F + offs_f[None, :], mask=mask_e[:, None] & mask_f[None, :], other=0.0)
        tile = tile.to(tl.float32)
        if HAS_W:
            we = tl.load(w + offs_e, mask=mask_e, other=0.0).to(tl.float32)
            tile = tile * we[:, None]
        acc += tl.sum(tile, axis=0)
    if MEAN:
        deg = (end - start).to(tl.float32)
        acc = acc / tl.maximum(deg, 1.0)
    tl.store(out + row.to(tl.int64) * F + offs_f, acc.to(out.dtype.element_ty), mask=mask_f)


@triton.jit
def _max_kernel(rowptr, col, w, x, out, arg, F, HAS_W: tl.constexpr,
                BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    row = tl.program_id(0)
    fb = tl.program_id(1)
    offs_f = fb * BLOCK_F + tl.arange(0, BLOCK_F)
    mask_f = offs_f < F
    start = tl.load(rowptr + row)
    end = tl.load(rowptr + row + 1)
    best = tl.full([BLOCK_F], float("-inf"), dtype=tl.float32)
    best_e = tl.full([BLOCK_F], -1, dtype=tl.int64)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < end
        c = tl.load(col + offs_e, mask=mask_e, other=0).to(tl.int64)
        tile = tl.load(x + c[:, None] * F + offs_f[None, :], mask=mask_e[:, None] & mask_f[None, :], other=0.0)
        tile = tile.to(tl.float32)
        if HAS_W:
            we = tl.load(w + offs_e, mask=mask_e, other=0.0).to(tl.float32)
            tile = tile * we[:, None]
        tile = tl.where(mask_e[:, None], tile, float("-inf"))
        tmax = tl.max(tile, axis=0)
        # first edge of this tile reaching the tile maximum
        big = tl.full([BLOCK_E, BLOCK_F], 2**62, dtype=tl.int64)
        pos = tl.where(mask_e[:, None] & (tile == tmax[None, :]), offs_e.to(tl.int64)[:, None] + tl.zeros([BLOCK_E, BLOCK_F], dtype=tl.int64), big)
        tpos = tl.min(pos, axis=0)
        take = (tmax > best) | ((best_e < 0) & (tpos < 2**62))
        best = tl.where(take, tmax, best)
        best_e = tl.where(take, tpos, best_e)
    res = tl.where(best_e >= 0, best, 0.0)
    base = row.to(tl.int64) * F + offs_f
    tl.store(out + base, res.to(out.dtype.element_ty), mask=mask_f)
    tl.store(arg + base, best_e, mask=mask_f)


@triton.jit
def _edge_dot_kernel(rowptr, col, a, b, out, F, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
    row = tl.program_id(0)
    start = tl.load(rowptr + row)
    end = tl.load(rowptr + row + 1)
    for e0 in range(start, end, BLOCK_E):
        offs_e = e0 + tl.arange(0, BLOCK_E)
        mask_e = offs_e < end
        c = tl.load(col + offs_e, mask=mask_e, other=0).to(tl.int64)
        acc = tl.zeros([BLOCK_E], dtype=tl.float32)
        for f0 in range(0, F, BLOCK_F):
            offs_f = f0 + tl.arange(0, BLOCK_F)
            mask_f = offs_f < F
            ar = tl.load(a + row.to(tl.int64) * F + offs_f, mask=mask_f, other=0.0).to(tl.float32)
            tile = tl.load(b + c[:, None] * F + offs_f[None, :], mask=mask_e[:, None] & mask_f[None, :], other=0.0)
            acc += tl.sum(tile.to(tl.float32) * ar[None, :], axis=1)
        tl.store(out + offs_e, acc.to(out.dtype.element_ty), mask=mask_e)


def _blocks(f: int) -> Tuple[int, int]:
    block_f = min(128, max(16, triton.next_power_of_2(f)))
    return 32, block_f


def _plain(t: Optional[Tensor]) -> Optional[Tensor]:
    # The interpreter needs plain tensors (not EdgeIndex or other subclasses).
    if t is None:
        return None
    return t.as_subclass(Tensor).contiguous() if type(t) is not Tensor else t.contiguous()


def csr_sum(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor, mean: bool,
            out_dtype: Optional[torch.dtype] = None) -> Tensor:
    """Triton version of :func:`lightning_fullgraph.kernels.reference.csr_sum` (sums in
    float32; float32 and 16-bit outputs)."""
    validate.check_aggregation("csr_sum", rowptr, col, weight, x)
    out_dtype = out_dtype or reference.sum_dtype(x, weight)
    rowptr, col, weight, x = _plain(rowptr), _plain(col), _plain(weight), _plain(x)
    n, f = rowptr.numel() - 1, x.size(1)
    out = x.new_empty(n, f, dtype=out_dtype)
    if n == 0 or f == 0:
        return out
    be, bf = _blocks(f)
    # Weights are read as they are (the kernel multiplies in float32), not rounded to x's dtype.
    w = weight if weight is not None else x  # dummy pointer when unused
    _sum_kernel[(n, triton.cdiv(f, bf))](rowptr, col, w, x, out, f, HAS_W=weight is not None,
                                         MEAN=bool(mean), BLOCK_E=be, BLOCK_F=bf)
    return out


def csr_max(rowptr: Tensor, col: Tensor, weight: Optional[Tensor], x: Tensor) -> Tuple[Tensor, Tensor]:
    """Triton version of :func:`lightning_fullgraph.kernels.reference.csr_max`."""
    validate.check_aggregation("csr_max", rowptr, col, weight, x)
    rowptr, col, weight, x = _plain(rowptr), _plain(col), _plain(weight), _plain(x)
    n, f = rowptr.numel() - 1, x.size(1)
    out = x.new_empty(n, f)
    arg = torch.empty(n, f, dtype=torch.long, device=x.device)
    if n == 0 or f == 0:
        return out, arg
    be, bf = _blocks(f)
    w = weight.to(x.dtype) if weight is not None else x
    _max_kernel[(n, triton.cdiv(f, bf))](rowptr, col, w, x, out, arg, f, HAS_W=weight is not None,
                                         BLOCK_E=be, BLOCK_F=bf)
    return out, arg


def csr_edge_dot(rowptr: Tensor, col: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Triton version of :func:`lightning_fullgraph.kernels.reference.csr_edge_dot`."""
    validate.check_edge_dot("csr_edge_dot", rowptr, col, a, b)
    rowptr, col, a, b = _plain(rowptr), _plain(col), _plain(a), _plain(b)
    n, f = rowptr.numel() - 1, b.size(1)
    out = b.new_empty(col.numel())
    if n == 0 or col.numel() == 0:
        return out
    be, bf = _blocks(f)
    _edge_dot_kernel[(n,)](rowptr, col, a, b, out, f, BLOCK_E=be, BLOCK_F=bf)
    return out
