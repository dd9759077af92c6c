r"""Per-row min-max quantization: the wire format, its random numbers, and the pure-PyTorch
reference that the C++ (``csrc/quantize.cpp``) and Triton
(:mod:`lightning_fullgraph.kernels.triton_quantize`) kernels reproduce bit for bit.

**Wire row** (``uint8``, :math:`W = H + \lceil F b / 8 \rceil` bytes, little-endian; the
header takes :math:`H = 8` bytes, or 4 with the compact ``"bfloat16"`` header below):

======  ===============================================================================
bytes   content
======  ===============================================================================
0-3     zero point :math:`Z` = the row's minimum, float32 (``-0.0`` written as ``+0.0``)
4-7     scale :math:`S = (\max - \min) / (2^b - 1)`, float32 (``0`` for a constant row)
8-      codes :math:`q_j \in [0, 2^b - 1]`, :math:`P = 8 / b` per byte, code :math:`j` in
        byte :math:`8 + \lfloor j / P \rfloor` at bit :math:`b\,(j \bmod P)` (first code in
        the low bits); the unused high bits of the last byte are zero
======  ===============================================================================

The decoded row is :math:`\hat x_j = Z + q_j S`, computed in float32 as a product then a sum
(two roundings, never a fused multiply-add), then cast to the context's dtype.  Where that
overflows with :math:`Z, S` finite (a wide row, below), it is computed in quarters instead:
:math:`\hat x_j = \min(\max(4\,(q_j (S / 4) + Z / 4), -F_{max}), F_{max})`, :math:`F_{max}`
the largest float32.  The decoder must rebuild exactly the :math:`Z, S` the encoder used, so
the header holds the very values the codes were computed against.

**Compact header** (``header="bfloat16"``, :math:`H = 4`): bytes 0-1 hold :math:`Z'` and
bytes 2-3 :math:`S'` as bfloat16 (the high 16 bits of their float32 patterns).  With a narrow
row the header is most of the wire (7 features at 2 bits: 2 bytes of codes, 8 of header),
and halving it is worth more than any code width.  A bfloat16 *cast* of :math:`Z, S` would
not do: a row far from zero would lose values below the rounded zero point, or above
:math:`Z + L S`.  Instead the encoder rounds **outwards** and then quantizes against the
rounded values: :math:`Z' = \lfloor Z \rfloor_{bf16}` (the largest bfloat16 :math:`\le Z`),
:math:`S' = \lceil (\max x - Z') / L \rceil_{bf16}`, so the grid
:math:`Z' + q S'` still covers the row, every bound below holds with :math:`S'`, and
:math:`S' \le (S + 2^{-7} |Z| / L)(1 + 2^{-7})`: the zero point's rounding widens the step
only for rows whose magnitude far exceeds their range, which matters at 8 bits, hardly at 1-4.
Zero rows, and constant rows whose value is a bfloat16, still decode exactly; other constant
rows decode to :math:`\lfloor x \rfloor_{bf16}`.  A zero point that rounds past the largest
bfloat16 :math:`B_{max} \approx 3.39 \cdot 10^{38}` is clamped to :math:`-B_{max}` (values
below it get code 0: the nearest the format holds), and a scale to :math:`B_{max}`.

**Encoding** of a row :math:`x` (float32; other dtypes are cast first), with
:math:`L = 2^b - 1`, every step one IEEE float32 operation:

* :math:`Z = \min x + 0`, :math:`S = (\max x + 0 - Z) / L`; :math:`S < 2^{-126}` (a constant
  row, or a range so small that :math:`1/S` would overflow) becomes :math:`S = 0`; with the
  compact header :math:`Z \leftarrow \max(\lfloor Z \rfloor_{bf16}, -B_{max})` first, and a
  non-zero :math:`S \leftarrow \lceil S \rceil_{bf16}` last (directed roundings of the bit
  pattern); then :math:`S \leftarrow \min(S, F_{max})` (:math:`B_{max}` with the compact
  header);
* :math:`\mathrm{inv} = 1 / S` (:math:`0` when :math:`S = 0`); :math:`t_j = \max((x_j - Z)\,
  \mathrm{inv}, 0)`; :math:`f_j = t_j - \lfloor t_j \rfloor` (exact);
* a **wide** row, finite but with :math:`\max x - Z` overflowing float32 (e.g. :math:`-3
  \cdot 10^{38}` and :math:`3 \cdot 10^{38}`), is computed in quarters, every scaling by 4
  exact: :math:`S = ((\max x / 4 - Z / 4) / L) \cdot 4`, :math:`\mathrm{inv} = 1 / (S / 4)`,
  :math:`t_j = \max((x_j / 4 - Z / 4)\, \mathrm{inv}, 0)` (the reciprocal stays a normal
  float).  At 1 bit its step exceeds :math:`F_{max}`: the clamped :math:`S` leaves the values
  above :math:`Z + F_{max}` at the top code;
* stochastic: :math:`q_j = \lfloor t_j \rfloor + [u_j < f_j]`, so :math:`E[q_j] = t_j` up to
  :math:`2^{-24}`; nearest: :math:`q_j = \lfloor t_j \rfloor + [f_j \ge 1/2]`; then
  :math:`q_j` is clamped to :math:`[0, L]` (rounding can push :math:`t_j` past :math:`L`).

So :math:`|\hat x - x| \le S` (stochastic) or :math:`\le S / 2` (nearest), up to float32
rounding, and constant rows (zero rows too) decode exactly; every finite row decodes to finite
values (the clamps above are the only other exceptions to the bound).  A row holding NaN or
:math:`\pm\infty` is sent as ``Z = S = NaN`` (bits ``0x7FC00000``; ``0x7FC0`` in a compact
header) with zero codes: it decodes to a row of NaN instead of silently finite values.

**Random numbers** (counter-based, so every implementation computes the same :math:`u_j`
without sharing generator state): the stream key :math:`(k_0, k_1)` is the low and high 32
bits of the seed of :meth:`WireContext.generator`, a hash of ``(seed, step, key, direction,
rank)``.  For row :math:`r` (its index in the encoded tensor) and column :math:`c`, in
wrapping 32-bit arithmetic with :math:`h` = MurmurHash3's ``fmix32`` finalizer:

.. math::

    \rho_r = h(r \cdot \mathtt{0x9E3779B9} + k_0) \oplus k_1, \qquad
    u_{rc} = \lfloor h(\rho_r \oplus c \cdot \mathtt{0x7FEB352D}) / 2^8 \rfloor \cdot 2^{-24}.

Mixing the column in with XOR under the hash (not a shared Weyl increment) keeps the
streams of two rows from being shifted copies of each other.  Only 32-bit multiplies, so the
C++ loop vectorizes and the Triton kernel stays in 32-bit registers.
"""
from typing import Tuple

import torch
from torch import Tensor

from .base import WireContext

__all__ = ["BITS", "HEADER_BYTES", "HEADERS", "ROUNDINGS", "header_bytes", "wire_width",
           "packed_bytes", "stream_key", "uniforms", "bf16_down", "bf16_up", "quantize",
           "dequantize", "read_header"]

#: Supported code widths.
BITS = (1, 2, 4, 8)
#: Rounding modes.
ROUNDINGS = ("stochastic", "nearest")
#: Bytes of the per-row header: float32 zero point and float32 scale.
HEADER_BYTES = 8
#: Header formats and their bytes: float32 ``(Z, S)``, or the compact bfloat16 one.
HEADERS = {"float32": 8, "bfloat16": 4}

_M32 = 0xFFFFFFFF
#: Multipliers of the hash (shared with the C++ and Triton kernels).
ROW_MUL, COL_MUL, FMIX_1, FMIX_2 = 0x9E3779B9, 0x7FEB352D, 0x85EBCA6B, 0xC2B2AE35
#: Smallest normal float32: scales below it are treated as zero (1/S would overflow).
MIN_SCALE = 2.0 ** -126
#: The NaN written into the header of a non-finite row (its high half in a compact header).
NAN_BITS = 0x7FC00000
#: The largest finite float32, and bfloat16 (``0x7F7F0000``): the largest scale of a header.
FLT_MAX = 3.4028234663852886e38
BF16_MAX = 3.3895313892515355e38
#: Elements per chunk of the reference (bounds its int64 temporaries).
_CHUNK = 1 << 20


def packed_bytes(num_features: int, bits: int) -> int:
    r"""Bytes of packed codes of one row: :math:`\lceil F b / 8 \rceil`."""
    return (num_features * bits + 7) // 8


def header_bytes(header: str = "float32") -> int:
    r"""Bytes of a row's header in format :obj:`header` (one of :data:`HEADERS`)."""
    if header not in HEADERS:
        raise ValueError(f"header must be one of {tuple(HEADERS)}, got {header!r}")
    return HEADERS[header]


def wire_width(num_features: int, bits: int, header: str = "float32") -> int:
    r"""Bytes of one wire row: the header plus the packed codes."""
    return header_bytes(header) + packed_bytes(num_features, bits)


def stream_key(ctx: WireContext) -> Tuple[int, int]:
    r"""The 32-bit words :math:`(k_0, k_1)` of the rounding stream of :obj:`ctx`.

    Taken from the seed of :meth:`WireContext.generator`, so the stream depends on exactly
    ``(seed, step, key, direction, rank)``, like every other draw of the exchange.
    """
    seed = ctx.generator().initial_seed()
    return seed & _M32, (seed >> 32) & _M32


def _mul32(x: Tensor, c: int) -> Tensor:
    # x (int64 in [0, 2^32)) times a 32-bit constant, modulo 2^32, without int64 overflow:
    # the two 16-bit halves of c keep every product below 2^48.
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _fmix32(h: Tensor) -> Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, FMIX_1)
    h = h ^ (h >> 13)
    h = _mul32(h, FMIX_2)
    return h ^ (h >> 16)


def _row_keys(rows: Tensor, k0: int, k1: int) -> Tensor:
    return _fmix32((_mul32(rows & _M32, ROW_MUL) + k0) & _M32) ^ k1


def uniforms(row0: int, num_rows: int, num_features: int, key: Tuple[int, int],
             device=None) -> Tensor:
    r"""The rounding draws :math:`u_{rc}` of rows ``row0 ... row0 + num_rows - 1``.

    Args:
        row0 (int): Index of the first row in the encoded tensor.
        num_rows (int): Rows.
        num_features (int): Columns :math:`F`.
        key (Tuple[int, int]): :func:`stream_key`.
        device (torch.device, optional): Where to compute them.

    Shapes:
        - **output:** :math:`[num\_rows, F]`, float32 in :math:`[0, 1)`, multiples of
          :math:`2^{-24}`.
    """
    k0, k1 = key
    r = torch.arange(row0, row0 + num_rows, dtype=torch.int64, device=device)
    c = torch.arange(num_features, dtype=torch.int64, device=device)
    h = _fmix32(_row_keys(r, k0, k1).unsqueeze(1) ^ _mul32(c, COL_MUL).unsqueeze(0))
    return (h >> 8).to(torch.float32) * (2.0 ** -24)


def _bits(x: Tensor) -> Tensor:
    # The float32 pattern as an int64 in [0, 2^32) (no sign extension).
    return x.view(torch.int32).to(torch.int64) & _M32


def _float(b: Tensor) -> Tensor:
    # An int64 pattern in [0, 2^32) back to float32.
    return torch.where(b >= 1 << 31, b - (1 << 32), b).to(torch.int32).view(torch.float32)


def bf16_down(x: Tensor) -> Tensor:
    r"""The largest bfloat16 :math:`\le x` (float32 in, float32 out; NaN stays NaN)."""
    b = _bits(x)
    cut = b & 0xFFFF0000
    # Truncating the pattern rounds towards zero: down for x >= 0, up for x < 0, where one
    # more unit of magnitude rounds down (-inf past the largest bfloat16).
    neg = (b >> 31) == 1
    return _float(torch.where(neg & ((b & 0xFFFF) != 0) & ~torch.isnan(x), cut + 0x10000, cut))


def bf16_up(x: Tensor) -> Tensor:
    r"""The smallest bfloat16 :math:`\ge x` for :math:`x \ge 0` (+inf past the largest)."""
    b = _bits(x)
    cut = b & 0xFFFF0000
    return _float(torch.where(((b & 0xFFFF) != 0) & ~torch.isnan(x), cut + 0x10000, cut))


def _header(rows: Tensor, bits: int, compact: bool = False):
    r"""Zero points, scales, the codes' zero points and reciprocals, and the non-finite and
    wide masks of float32 rows (see the module doc)."""
    levels = float((1 << bits) - 1)
    # + 0.0 turns a -0.0 minimum into +0.0: implementations that meet -0.0 and +0.0 in a
    # different order would otherwise write different header bytes.
    zero = rows.amin(1) + 0.0
    top = rows.amax(1) + 0.0
    bad = ~torch.isfinite(zero) | ~torch.isfinite(top)  # a NaN (amin propagates it) or inf
    if compact:  # the grid starts at the bfloat16 below the minimum (see the module doc)
        zero = bf16_down(zero).clamp_min(-BF16_MAX)
    span = top - zero
    # A finite row whose range overflows float32: its grid is computed in quarters.
    wide = torch.isinf(span) & ~bad
    scale = span / levels
    if bool(wide.any()):
        scale = torch.where(wide, (top * 0.25 - zero * 0.25) / levels * 4.0, scale)
    scale = torch.where(scale < MIN_SCALE, torch.zeros_like(scale), scale)
    if compact:
        scale = bf16_up(scale)
    # A 1-bit wide row's step exceeds every finite header value: the largest one instead.
    scale = scale.clamp_max(BF16_MAX if compact else FLT_MAX)
    step = torch.where(wide, scale * 0.25, scale)
    safe = torch.where(step > 0, step, torch.ones_like(step))
    inv = torch.where(step > 0, torch.ones_like(step) / safe, torch.zeros_like(step))
    nan = torch.tensor(NAN_BITS, dtype=torch.int32, device=rows.device).view(torch.float32)
    head_zero = torch.where(bad, nan, zero)
    head_scale = torch.where(bad, nan, scale)
    code_zero = torch.where(wide, zero * 0.25, zero)
    code_zero = torch.where(bad, torch.zeros_like(zero), code_zero)
    inv = torch.where(bad, torch.zeros_like(inv), inv)
    return code_zero, inv, bad, wide, head_zero, head_scale


def _pack(codes: Tensor, bits: int) -> Tensor:
    per = 8 // bits
    if per == 1:
        return codes
    n, f = codes.shape
    pad = (-f) % per
    if pad:
        codes = torch.cat([codes, codes.new_zeros(n, pad)], 1)
    shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=codes.device)
    # The fields are disjoint, so the sum of the shifted codes is their bitwise OR.
    return (codes.view(n, -1, per).to(torch.int32) << shifts).sum(2).to(torch.uint8)


def _unpack(packed: Tensor, bits: int, num_features: int) -> Tensor:
    per = 8 // bits
    if per == 1:
        return packed[:, :num_features]
    shifts = torch.arange(0, 8, bits, dtype=torch.int32, device=packed.device)
    codes = (packed.to(torch.int32).unsqueeze(2) >> shifts) & ((1 << bits) - 1)
    return codes.reshape(packed.size(0), -1)[:, :num_features]


def quantize(rows: Tensor, bits: int, stochastic: bool, key: Tuple[int, int],
             header: str = "float32") -> Tensor:
    r"""Encodes rows into wire rows (the pure-PyTorch reference).

    Args:
        rows (torch.Tensor): Rows, any floating dtype (computed in float32).
        bits (int): Code width, one of :data:`BITS`.
        stochastic (bool): Stochastic rounding with :func:`uniforms` (else nearest).
        key (Tuple[int, int]): :func:`stream_key` (unused when not stochastic).
        header (str): ``"float32"`` (8 bytes) or ``"bfloat16"`` (4, rounded outwards).

    Shapes:
        - **rows:** :math:`[R, F]`
        - **output:** :math:`[R, W]` uint8, :math:`W` = :func:`wire_width`.
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    hb = header_bytes(header)
    x = rows.detach().to(torch.float32)
    n, f = x.shape
    out = torch.zeros(n, wire_width(f, bits, header), dtype=torch.uint8, device=x.device)
    if n == 0 or f == 0:
        return out  # F = 0: an all-zero header (Z = S = 0), nothing else
    levels = (1 << bits) - 1
    step = max(1, _CHUNK // f)
    for r0 in range(0, n, step):
        xs = x[r0:r0 + step]
        zero, inv, bad, wide, head_zero, head_scale = _header(xs, bits, hb == 4)
        if bool(wide.any()):  # a select, not a product by 1, leaves the other rows alone
            xs = torch.where(wide.unsqueeze(1), xs * 0.25, xs)
        t = (xs - zero.unsqueeze(1)) * inv.unsqueeze(1)
        t = t.masked_fill_(bad.unsqueeze(1), 0.0)  # non-finite rows: zero codes
        t = t.clamp_min_(0.0)  # below a compact zero point clamped to -BF16_MAX
        low = torch.floor(t)
        frac = t - low  # exact: t >= 0 and floor(t) share the exponent range
        if stochastic:
            up = uniforms(r0, xs.size(0), f, key, x.device) < frac
        else:
            up = frac >= 0.5
        codes = (low + up.to(torch.float32)).clamp_(0, levels).to(torch.uint8)
        head = torch.stack([head_zero, head_scale], 1)
        if hb == 4:  # the high halves: exact, both values are bfloat16 (or the NaN)
            head = (head.view(torch.int32) >> 16).to(torch.int16)
        out[r0:r0 + step, :hb] = head.view(torch.uint8)
        out[r0:r0 + step, hb:] = _pack(codes, bits)
    return out


def read_header(wire: Tensor, header: str = "float32") -> Tuple[Tensor, Tensor]:
    r"""The float32 zero points and scales of wire rows :math:`[R, W]`."""
    hb = header_bytes(header)
    # A fresh copy: the header of a row that starts at an odd byte is not aligned for float32,
    # and .contiguous() would keep the stride (and offset) of a one-row slice.
    head = torch.empty(wire.size(0), hb, dtype=torch.uint8, device=wire.device)
    head.copy_(wire[:, :hb])
    if hb == 4:
        head = head.view(torch.int16).to(torch.int32).bitwise_left_shift(16)
    head = head.view(torch.float32)
    return head[:, 0], head[:, 1]


def dequantize(wire: Tensor, bits: int, num_features: int, header: str = "float32") -> Tensor:
    r"""Decodes wire rows into float32 rows (the pure-PyTorch reference).

    Args:
        wire (torch.Tensor): Wire rows from :func:`quantize` (of any sender).
        bits (int): Code width.
        num_features (int): :math:`F`.
        header (str): The header format the rows were encoded with.

    Shapes:
        - **wire:** :math:`[R, W]` uint8
        - **output:** :math:`[R, F]` float32
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    hb = header_bytes(header)
    width = wire_width(num_features, bits, header)
    if wire.dim() != 2 or wire.dtype != torch.uint8 or wire.size(1) != width:
        raise ValueError(f"expected uint8 wire rows of {width} bytes ({num_features} features "
                         f"at {bits} bits, {header} header), got {tuple(wire.shape)} "
                         f"{wire.dtype}")
    n = wire.size(0)
    out = torch.empty(n, num_features, dtype=torch.float32, device=wire.device)
    if n == 0 or num_features == 0:
        return out
    step = max(1, _CHUNK // num_features)
    for r0 in range(0, n, step):
        ws = wire[r0:r0 + step]
        zero, scale = read_header(ws, header)
        codes = _unpack(ws[:, hb:], bits, num_features).to(torch.float32)
        # A product, then a sum: the kernels round the same two times (no fused multiply-add).
        out[r0:r0 + step] = _decode_rows(codes, zero, scale)
    return out


def _decode_rows(codes: Tensor, zero: Tensor, scale: Tensor) -> Tensor:
    r""":math:`Z + q S`, in quarters where it overflows (see the module doc)."""
    out = codes * scale.unsqueeze(1) + zero.unsqueeze(1)
    over = torch.isinf(out) & (torch.isfinite(zero) & torch.isfinite(scale)).unsqueeze(1)
    if bool(over.any()):
        quarter = (codes * (scale * 0.25).unsqueeze(1) + (zero * 0.25).unsqueeze(1)) * 4.0
        out = torch.where(over, quarter.clamp(-FLT_MAX, FLT_MAX), out)
    return out
