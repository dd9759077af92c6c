r"""A lossy codec: rows cross the wire as bfloat16, 2 bytes per element."""
import torch
from torch import Tensor

from .base import Codec, WireContext

__all__ = ["BFloat16Codec"]


class BFloat16Codec(Codec):
    r"""Rounds rows to bfloat16 (round to nearest even; NaN and :math:`\pm\infty` are kept)
    and decodes them back to the context's dtype.

    The wire rows are the bfloat16 bits as ``uint8`` (2 bytes per element, little-endian):
    a byte tensor crosses every backend as is, where gloo has no int16 and its bfloat16
    support is unreliable.  float64 rows are rounded to float32 first (torch's conversion),
    so their result is the float32 value's nearest bfloat16.

    Shapes:
        - **encode:** :math:`[S, F]` -> :math:`[S, 2F]` uint8
        - **decode:** :math:`[R, 2F]` uint8 -> :math:`[R, F]` of ``ctx.dtype``
    """

    lossless = False

    def __repr__(self) -> str:
        return "BFloat16Codec()"

    def encode(self, rows: Tensor, ctx: WireContext) -> Tensor:
        if rows.dim() != 2:
            raise ValueError(f"BFloat16Codec encodes 2-D rows, got {tuple(rows.shape)}")
        half = rows.detach().to(torch.bfloat16).contiguous()
        return half.view(torch.uint8)

    def decode(self, wire: Tensor, ctx: WireContext) -> Tensor:
        if wire.dim() != 2 or wire.dtype != torch.uint8 or wire.size(1) != 2 * ctx.num_features:
            raise ValueError(f"BFloat16Codec: expected uint8 wire rows of "
                             f"{2 * ctx.num_features} bytes, got {tuple(wire.shape)} {wire.dtype}")
        return wire.contiguous().view(torch.bfloat16).to(ctx.dtype)

    def wire_bytes(self, num_rows: int, num_features: int, dtype: torch.dtype) -> int:
        return 2 * num_rows * num_features
