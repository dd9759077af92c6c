r"""A lossy codec: per-row min-max quantization to 1, 2, 4 or 8 bits (SuperGCN §2.4, SYLVIE
Eqs. 3-4), with the row's zero point and scale inside its wire row.

The wire format, the rounding rule and the random numbers are specified in
:mod:`.quantize`; this module picks the implementation: C++ for CPU tensors (the pure-PyTorch
reference when the extension cannot be built), Triton for CUDA tensors.  All three write the
same bytes, so which one a sender used never matters to a receiver.
"""
from typing import Callable, Tuple

import torch
from torch import Tensor

from . import quantize as ref
from .base import Codec, WireContext

__all__ = ["QuantizedCodec", "BACKENDS"]

#: Implementations: ``"auto"`` (C++ on CPU, Triton on CUDA), or one of them by name.
BACKENDS = ("auto", "cpp", "triton", "torch")


def _cpp():
    from ...kernels import cpp_quantize
    return cpp_quantize.load()


def _triton():
    try:
        from ...kernels import triton_quantize
    except ImportError:  # triton not installed
        return None
    return triton_quantize


class QuantizedCodec(Codec):
    r"""Per-row min-max quantization with packed codes.

    Each wire row is ``uint8``: the row's zero point and scale (the header: 8 bytes of
    float32, or 4 of bfloat16 rounded outwards), then its :math:`F` codes of :obj:`bits` bits
    packed :math:`8 / b` to a byte (:func:`~.quantize.wire_width`).  Stochastic rounding is
    unbiased and draws from a counter-based hash of ``(seed, step, key, direction, rank, row,
    column)``, so the same context always gives the same bytes, and the receiver needs only the
    wire rows.

    Args:
        bits (int): Code width, 1, 2, 4 or 8.
        rounding (str): ``"stochastic"`` (unbiased, :math:`|\hat x - x| \le S`) or
            ``"nearest"`` (:math:`|\hat x - x| \le S / 2`, biased).
        backend (str): ``"auto"`` (C++ for CPU tensors, else the reference; Triton for CUDA
            tensors), ``"cpp"``, ``"triton"`` or ``"torch"`` (the reference).
        header (str): ``"float32"`` (:math:`H = 8` bytes, the exact min-max grid) or
            ``"bfloat16"`` (:math:`H = 4`: the zero point rounded down and the scale up to
            bfloat16, the codes computed against them; the step widens by at most
            :math:`2^{-7} |Z| / L` plus :math:`2^{-7}` of itself).  Worth it for narrow rows
            at 1-4 bits, where the header is most of the wire: a 7-class GCN's int2 rows
            shrink from 10 to 6 bytes.  Codec names ``"int2-compact"`` etc.

    Shapes:
        - **encode:** :math:`[S, F]` (any floating dtype, computed in float32) ->
          :math:`[S, H + \lceil F b / 8 \rceil]` uint8
        - **decode:** :math:`[R, H + \lceil F b / 8 \rceil]` uint8 -> :math:`[R, F]` of
          ``ctx.dtype``

    Rows holding NaN or :math:`\pm\infty` decode to rows of NaN.
    """

    lossless = False

    def __init__(self, bits: int = 2, rounding: str = "stochastic", backend: str = "auto",
                 header: str = "float32") -> None:
        if bits not in ref.BITS:
            raise ValueError(f"QuantizedCodec: bits must be one of {ref.BITS}, got {bits!r}")
        if rounding not in ref.ROUNDINGS:
            raise ValueError(f"QuantizedCodec: rounding must be one of {ref.ROUNDINGS}, got "
                             f"{rounding!r}")
        if backend not in BACKENDS:
            raise ValueError(f"QuantizedCodec: backend must be one of {BACKENDS}, got "
                             f"{backend!r}")
        if header not in ref.HEADERS:
            raise ValueError(f"QuantizedCodec: header must be one of {tuple(ref.HEADERS)}, got "
                             f"{header!r}")
        self.bits = int(bits)
        self.rounding = rounding
        self.backend = backend
        self.header = header

    def __repr__(self) -> str:
        extra = "" if self.header == "float32" else f", header={self.header!r}"
        return f"QuantizedCodec(bits={self.bits}, rounding={self.rounding!r}{extra})"

    @property
    def stochastic(self) -> bool:
        return self.rounding == "stochastic"

    def kernels(self, device: torch.device) -> Tuple[Callable, Callable]:
        r"""``(quantize, dequantize)`` of the implementation used for tensors on
        :obj:`device`, with the reference's signatures, :attr:`header` bound."""
        quantize, dequantize = self._kernels(device)
        header = self.header
        return (lambda x, bits, stochastic, key: quantize(x, bits, stochastic, key, header),
                lambda wire, bits, f: dequantize(wire, bits, f, header))

    def _kernels(self, device: torch.device) -> Tuple[Callable, Callable]:
        backend = self.backend
        if backend == "auto":
            backend = {"cpu": "cpp", "cuda": "triton"}.get(device.type, "torch")
        if backend == "cpp":
            if device.type != "cpu":
                raise ValueError(f"QuantizedCodec(backend='cpp') needs CPU tensors, got {device}")
            ext = _cpp()  # None (after one warning) when it cannot be built
            if ext is not None:
                return (lambda x, bits, stochastic, key, header:
                        ext.quantize(x.contiguous(), bits, stochastic, key[0], key[1],
                                     header == "bfloat16")), \
                    (lambda wire, bits, f, header:
                        ext.dequantize(wire, bits, f, header == "bfloat16"))
        elif backend == "triton":
            module = _triton()
            if module is not None:
                return module.quantize, module.dequantize
            if self.backend == "triton":
                raise RuntimeError("QuantizedCodec(backend='triton') needs triton installed")
        return ref.quantize, ref.dequantize

    def encode(self, rows: Tensor, ctx: WireContext) -> Tensor:
        if rows.dim() != 2:
            raise ValueError(f"QuantizedCodec encodes 2-D rows, got {tuple(rows.shape)}")
        x = rows.detach()
        if x.dtype != torch.float32:
            x = x.to(torch.float32)
        quantize, _ = self.kernels(x.device)
        return quantize(x, self.bits, self.stochastic, ref.stream_key(ctx))

    def decode(self, wire: Tensor, ctx: WireContext) -> Tensor:
        width = ref.wire_width(ctx.num_features, self.bits, self.header)
        if wire.dim() != 2 or wire.dtype != torch.uint8 or wire.size(1) != width:
            raise ValueError(f"QuantizedCodec: expected uint8 wire rows of {width} bytes "
                             f"({ctx.num_features} features at {self.bits} bits), got "
                             f"{tuple(wire.shape)} {wire.dtype}")
        _, dequantize = self.kernels(wire.device)
        out = dequantize(wire.contiguous(), self.bits, ctx.num_features)
        return out if ctx.dtype == torch.float32 else out.to(ctx.dtype)

    def wire_bytes(self, num_rows: int, num_features: int, dtype: torch.dtype) -> int:
        return num_rows * ref.wire_width(num_features, self.bits, self.header)
