"""Triton twins of the quantization kernels (``csrc/quantize.cpp``), for CUDA tensors.

Same wire bytes and decoded rows as the pure-PyTorch reference
(:mod:`lightning_fullgraph.engine.codecs.quantize`, which specifies the format, the rounding
and the counter-based random numbers): every float step is the same single IEEE float32
operation (divisions with :func:`tl.math.div_rn`, correctly rounded, where ``/`` would be an
approximate division on CUDA), and the kernels are launched with ``enable_fp_fusion=False``
so ``Z + q * S`` is never fused into a multiply-add.

One program quantizes ``BLOCK_R`` rows: a first loop over feature blocks finds each row's
min / max / NaN, a second one computes the codes of a ``[BLOCK_R, BLOCK_B, P]`` tile (``P =
8 / bits`` codes of each of ``BLOCK_B`` bytes) and ORs each byte's codes together (a sum of
disjoint bit fields).  Bytes are written one by one: a wire row of ``H + ceil(F b / 8)``
bytes has no alignment to vectorize on.  Decoding gives each output element its own lane
(coalesced float stores); the ``P`` lanes of one byte read it each, from cache.

Without a GPU the kernels run under the Triton interpreter (``TRITON_INTERPRET=1`` set
before ``triton`` is imported) on CPU tensors, which is how the tests check them.  Known
difference on CUDA: libdevice's ``div_rn`` flushes subnormal results, which only matters for
a row whose scale exceeds :math:`2^{126}` (its reciprocal is subnormal), i.e. a 1-bit row
spanning more than about ``8.5e37``.
"""
from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["quantize", "dequantize", "is_available"]

#: Header bytes per format (the reference's ``HEADERS``).
_HEADERS = {"float32": 8, "bfloat16": 4}
#: The largest finite float32 and bfloat16 (the reference's ``FLT_MAX``, ``BF16_MAX``).
_FLT_MAX = tl.constexpr(3.4028234663852886e38)
_BF16_MAX = tl.constexpr(3.3895313892515355e38)


def is_available() -> bool:
    """Triton usable here: a CUDA device, or the interpreter on CPU."""
    import os

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def _fmix32(h):
    # MurmurHash3's finalizer on uint32 (wrapping multiplies, logical shifts).
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _store_word(ptr, word, mask):
    # Four little-endian bytes of a uint32 per row (wire rows are not 4-byte aligned).
    tl.store(ptr, (word & 0xFF).to(tl.uint8), mask=mask)
    tl.store(ptr + 1, ((word >> 8) & 0xFF).to(tl.uint8), mask=mask)
    tl.store(ptr + 2, ((word >> 16) & 0xFF).to(tl.uint8), mask=mask)
    tl.store(ptr + 3, ((word >> 24) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def _store_half(ptr, word, mask):
    # The high 16 bits of a uint32, as two little-endian bytes (a compact header field).
    tl.store(ptr, ((word >> 16) & 0xFF).to(tl.uint8), mask=mask)
    tl.store(ptr + 1, ((word >> 24) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def _load_half(ptr, mask):
    # Two little-endian bytes as the high half of a uint32 (a bfloat16's float32 pattern).
    b0 = tl.load(ptr, mask=mask, other=0).to(tl.uint32)
    b1 = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint32)
    return (b0 << 16) | (b1 << 24)


@triton.jit
def _bf16_down(x):
    # The largest bfloat16 <= x (see the reference's bf16_down).
    b = x.to(tl.uint32, bitcast=True)
    cut = b & 0xFFFF0000
    more = ((b >> 31) == 1) & ((b & 0xFFFF) != 0) & (x == x)
    return tl.where(more, cut + 0x10000, cut).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_up(x):
    # The smallest bfloat16 >= x, for x >= 0.
    b = x.to(tl.uint32, bitcast=True)
    cut = b & 0xFFFF0000
    more = ((b & 0xFFFF) != 0) & (x == x)
    return tl.where(more, cut + 0x10000, cut).to(tl.float32, bitcast=True)


@triton.jit
def _load_word(ptr, mask):
    b0 = tl.load(ptr, mask=mask, other=0).to(tl.uint32)
    b1 = tl.load(ptr + 1, mask=mask, other=0).to(tl.uint32)
    b2 = tl.load(ptr + 2, mask=mask, other=0).to(tl.uint32)
    b3 = tl.load(ptr + 3, mask=mask, other=0).to(tl.uint32)
    return b0 | (b1 << 8) | (b2 << 16) | (b3 << 24)


@triton.jit(do_not_specialize=["k0", "k1"])
def _encode_kernel(x_ptr, wire_ptr, R, F, W, k0, k1, BITS: tl.constexpr, STOCH: tl.constexpr,
                   HEAD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_B: tl.constexpr):
    COMPACT: tl.constexpr = HEAD == 4
    PER: tl.constexpr = 8 // BITS
    BLOCK_F: tl.constexpr = BLOCK_B * PER
    LEVELS: tl.constexpr = (1 << BITS) - 1
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    rows64 = rows.to(tl.int64)
    xrow = x_ptr + rows64 * F
    wrow = wire_ptr + rows64 * W

    # Pass 1: min, max and NaN of every row.
    lo = tl.full([BLOCK_R], float("inf"), tl.float32)
    hi = tl.full([BLOCK_R], float("-inf"), tl.float32)
    nan = tl.zeros([BLOCK_R], tl.int32)
    for c0 in range(0, F, BLOCK_F):
        cols = c0 + tl.arange(0, BLOCK_F)
        m = rmask[:, None] & (cols < F)[None, :]
        v = tl.load(xrow[:, None] + cols[None, :], mask=m, other=0.0)
        lo = tl.minimum(lo, tl.min(tl.where(m, v, float("inf")), axis=1))
        hi = tl.maximum(hi, tl.max(tl.where(m, v, float("-inf")), axis=1))
        nan = nan | tl.max((v != v).to(tl.int32), axis=1)
    zero = lo + 0.0  # -0.0 -> +0.0, as the reference
    top = hi + 0.0
    bad = (nan != 0) | ~(tl.abs(zero) < float("inf")) | ~(tl.abs(top) < float("inf"))
    if COMPACT:  # the grid starts at the bfloat16 below the minimum, at least -B_max
        zero = _bf16_down(zero)
        zero = tl.where(zero < -_BF16_MAX, -_BF16_MAX, zero)
    span = top - zero
    wide = ~bad & ~(tl.abs(span) < float("inf"))  # the range overflows: in quarters
    levels = tl.full([BLOCK_R], LEVELS, tl.float32)
    span = tl.where(wide, top * 0.25 - zero * 0.25, span)
    scale = tl.math.div_rn(span, levels)
    scale = tl.where(wide, scale * 4.0, scale)
    scale = tl.where(scale < 1.1754943508222875e-38, 0.0, scale)  # below 2^-126: constant
    if COMPACT:
        scale = _bf16_up(scale)
        scale = tl.where(scale > _BF16_MAX, _BF16_MAX, scale)
    else:
        scale = tl.where(scale > _FLT_MAX, _FLT_MAX, scale)  # a 1-bit wide row's step
    step = tl.where(wide, scale * 0.25, scale)
    pos = step > 0.0
    inv = tl.math.div_rn(tl.full([BLOCK_R], 1.0, tl.float32), tl.where(pos, step, 1.0))
    inv = tl.where(pos & ~bad, inv, 0.0)
    zero_c = tl.where(bad, 0.0, tl.where(wide, zero * 0.25, zero))
    zbits = tl.where(bad, 0x7FC00000, zero.to(tl.uint32, bitcast=True))
    sbits = tl.where(bad, 0x7FC00000, scale.to(tl.uint32, bitcast=True))
    if COMPACT:
        _store_half(wrow, zbits, rmask)
        _store_half(wrow + 2, sbits, rmask)
    else:
        _store_word(wrow, zbits, rmask)
        _store_word(wrow + 4, sbits, rmask)

    # Pass 2: codes, BLOCK_B bytes of PER codes at a time.
    row_key = _fmix32(rows.to(tl.uint32) * 0x9E3779B9 + k0.to(tl.uint32, bitcast=True))
    row_key = row_key ^ k1.to(tl.uint32, bitcast=True)
    kb = tl.arange(0, BLOCK_B)
    ii = tl.arange(0, PER)
    nbytes = W - HEAD
    for b0 in range(0, nbytes, BLOCK_B):
        byte_idx = b0 + kb
        cols = (byte_idx[:, None] * PER + ii[None, :])[None, :, :]
        m = rmask[:, None, None] & (cols < F)
        v = tl.load(xrow[:, None, None] + cols, mask=m, other=0.0)
        v = tl.where(wide[:, None, None], v * 0.25, v)
        t = (v - zero_c[:, None, None]) * inv[:, None, None]
        t = tl.where(m & ~bad[:, None, None], t, 0.0)  # an infinite entry times 0 is NaN
        t = tl.where(t > 0.0, t, 0.0)  # below a compact zero point clamped to -B_max
        q = t.to(tl.int32)  # t >= 0: truncation is floor
        frac = t - q.to(tl.float32)
        if STOCH:
            h = _fmix32(row_key[:, None, None] ^ (cols.to(tl.uint32) * 0x7FEB352D))
            u = (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24
            q = q + (u < frac).to(tl.int32)
        else:
            q = q + (frac >= 0.5).to(tl.int32)
        q = tl.minimum(q, LEVELS)
        packed = tl.sum(q << (ii * BITS)[None, None, :], axis=2)
        bm = rmask[:, None] & (byte_idx < nbytes)[None, :]
        tl.store(wrow[:, None] + HEAD + byte_idx[None, :], packed.to(tl.uint8), mask=bm)


@triton.jit
def _decode_kernel(wire_ptr, out_ptr, R, F, W, BITS: tl.constexpr, HEAD: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
    PER: tl.constexpr = 8 // BITS
    LEVELS: tl.constexpr = (1 << BITS) - 1
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < R
    rows64 = rows.to(tl.int64)
    wrow = wire_ptr + rows64 * W
    orow = out_ptr + rows64 * F
    if HEAD == 4:  # the compact header
        zero = _load_half(wrow, rmask).to(tl.float32, bitcast=True)
        scale = _load_half(wrow + 2, rmask).to(tl.float32, bitcast=True)
    else:
        zero = _load_word(wrow, rmask).to(tl.float32, bitcast=True)
        scale = _load_word(wrow + 4, rmask).to(tl.float32, bitcast=True)
    finite = (tl.abs(zero) < float("inf")) & (tl.abs(scale) < float("inf"))
    for c0 in range(0, F, BLOCK_F):
        # One lane per output element (coalesced stores); the PER lanes that share a byte
        # load it each, from cache.
        cols = c0 + tl.arange(0, BLOCK_F)
        m = rmask[:, None] & (cols < F)[None, :]
        byte = tl.load(wrow[:, None] + HEAD + (cols // PER)[None, :], mask=m, other=0)
        q = (byte.to(tl.int32) >> ((cols % PER) * BITS)[None, :]) & LEVELS
        qf = q.to(tl.float32)
        prod = qf * scale[:, None]
        val = prod + zero[:, None]  # no FMA: launched with enable_fp_fusion=False
        # Where Z + q S overflows with Z, S finite: in quarters, clamped (the reference).
        quarter = (qf * (scale * 0.25)[:, None] + (zero * 0.25)[:, None]) * 4.0
        quarter = tl.where(quarter > _FLT_MAX, _FLT_MAX, quarter)
        quarter = tl.where(quarter < -_FLT_MAX, -_FLT_MAX, quarter)
        over = (tl.abs(val) == float("inf")) & finite[:, None]
        val = tl.where(over, quarter, val)
        tl.store(orow[:, None] + cols[None, :], val, mask=m)


#: Warps per program.  Small tiles on 2 warps measured fastest on an H100 (200k x 128 rows,
#: every width: encode within 10 % of a clone of the input, decode faster than one).
_NUM_WARPS = 2


def _blocks(num_features: int, bits: int) -> Tuple[int, int]:
    r"""``(BLOCK_R, BLOCK_B)``: tiles of about 1K elements, at most 1K features wide."""
    per = 8 // bits
    nbytes = max(1, (num_features + per - 1) // per)
    block_b = min(triton.next_power_of_2(nbytes), max(1, 1024 // per))
    block_r = max(1, min(64, 1024 // (block_b * per)))
    return block_r, block_b


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _header_bytes(header: str) -> int:
    if header not in _HEADERS:
        raise ValueError(f"header must be one of {tuple(_HEADERS)}, got {header!r}")
    return _HEADERS[header]


def quantize(rows: Tensor, bits: int, stochastic: bool, key: Tuple[int, int],
             header: str = "float32") -> Tensor:
    r"""Encodes float32 rows into wire rows (see the reference,
    :func:`lightning_fullgraph.engine.codecs.quantize.quantize`).

    Args:
        rows (torch.Tensor): float32 rows (made contiguous).
        bits (int): Code width: 1, 2, 4 or 8.
        stochastic (bool): Stochastic rounding (else nearest).
        key (Tuple[int, int]): The stream key :math:`(k_0, k_1)`.
        header (str): ``"float32"`` (8 bytes) or the compact ``"bfloat16"`` (4).

    Shapes:
        - **rows:** :math:`[R, F]`
        - **output:** :math:`[R, H + \lceil F b / 8 \rceil]` uint8, :math:`H` the header
    """
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
    if rows.dim() != 2 or rows.dtype != torch.float32:
        raise ValueError(f"expected 2-D float32 rows, got {tuple(rows.shape)} {rows.dtype}")
    head = _header_bytes(header)
    x = rows.contiguous()
    n, f = x.shape
    width = head + (f * bits + 7) // 8
    wire = torch.empty(n, width, dtype=torch.uint8, device=x.device)
    if n == 0:
        return wire
    if f == 0:
        return wire.zero_()
    block_r, block_b = _blocks(f, bits)
    grid = (triton.cdiv(n, block_r), )
    _encode_kernel[grid](x, wire, n, f, width, _signed32(key[0]), _signed32(key[1]),
                         BITS=bits, STOCH=bool(stochastic), HEAD=head,
                         BLOCK_R=block_r, BLOCK_B=block_b,
                         enable_fp_fusion=False, num_warps=_NUM_WARPS)
    return wire


def dequantize(wire: Tensor, bits: int, num_features: int, header: str = "float32") -> Tensor:
    r"""Decodes wire rows into float32 rows (see the reference,
    :func:`lightning_fullgraph.engine.codecs.quantize.dequantize`).

    Shapes:
        - **wire:** :math:`[R, H + \lceil F b / 8 \rceil]` uint8
        - **output:** :math:`[R, F]` float32
    """
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
    head = _header_bytes(header)
    width = head + (num_features * bits + 7) // 8
    if wire.dim() != 2 or wire.dtype != torch.uint8 or wire.size(1) != width:
        raise ValueError(f"expected uint8 wire rows of {width} bytes ({num_features} features "
                         f"at {bits} bits), got {tuple(wire.shape)} {wire.dtype}")
    w = wire.contiguous()
    n = w.size(0)
    out = torch.empty(n, num_features, dtype=torch.float32, device=w.device)
    if n == 0 or num_features == 0:
        return out
    block_r, block_b = _blocks(num_features, bits)
    grid = (triton.cdiv(n, block_r), )
    _decode_kernel[grid](w, out, n, num_features, width, BITS=bits, HEAD=head,
                         BLOCK_R=block_r,
                         BLOCK_F=block_b * (8 // bits), enable_fp_fusion=False,
                         num_warps=_NUM_WARPS)
    return out
