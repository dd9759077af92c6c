r"""Per-node bit widths (SYLVIE's data-adaptive quantization, §IV-A, with its time-adaptive
base width, §V-A).

Every boundary node has an importance level :math:`k_v \in \{0, 1, 2, 3\}`: the quartile of
its global in-degree among all boundary nodes (or its level between the partition's
``level_percentiles``, e.g. 50/80/95 for fewer wide rows), fixed at partition time and stored
on both ends of every row (:attr:`LocalPartition.owned_level` for the sender,
:attr:`LocalPartition.halo_level` for the receiver).  With the base width :math:`b_t` (set per
epoch, e.g. by :class:`~lightning_fullgraph.callbacks.AdaptiveBitWidth`) node :math:`v`'s rows
and gradients cross the wire with

.. math::
    b_v = \max(b_t, (1, 2, 4, 8)[k_v])   \quad\text{or, with ``combine="scale"``,}\quad
    b_v = \min(8, b_t \cdot 2^{k_v})

bits (seed-specs B1 "joint orchestration": both rules meet the paper's two end points).
Rows of different widths travel as one byte stream whose per-peer byte counts both ends compute
from the levels and :math:`F` (no extra message); within it rows keep their plan order, each
row a :class:`~.quantized.QuantizedCodec` wire row of its own width.  Exchanges without levels
(partial aggregates of pre-aggregation, degrees) use :math:`b_t` for every row.
"""
from typing import List, Sequence, Tuple

import torch
from torch import Tensor

from . import quantize as ref
from .base import WireContext
from .quantized import QuantizedCodec

__all__ = ["NodeAdaptiveCodec"]

LEVEL_BITS = (1, 2, 4, 8)


class NodeAdaptiveCodec(QuantizedCodec):
    r"""Quantization whose width follows each node's importance level.

    Args:
        bits (int): The base width :math:`b_t` (1, 2, 4 or 8); a callback may change it
            between epochs (every rank the same).
        combine (str): ``"max"`` (:math:`\max(b_t, (1,2,4,8)[k_v])`) or ``"scale"``
            (:math:`\min(8, b_t 2^{k_v})`).
        rounding (str): ``"stochastic"`` or ``"nearest"``.
        backend (str): As :class:`~.quantized.QuantizedCodec`.
        header (str): As :class:`~.quantized.QuantizedCodec` (``"adaptive-compact"``).

    Shapes:
        - **encode_rows:** rows :math:`[S, F]`, levels :math:`[S]` -> bytes
          :math:`[\sum_v H + \lceil F b_v / 8 \rceil]` uint8
        - **decode_rows:** bytes, levels :math:`[R]` -> rows :math:`[R, F]`
    """

    #: Tells the exchange to send this codec's rows as a variable-width byte stream.
    per_node = True

    def __init__(self, bits: int = 1, combine: str = "max", rounding: str = "stochastic",
                 backend: str = "auto", header: str = "float32") -> None:
        super().__init__(bits, rounding, backend, header)
        if combine not in ("max", "scale"):
            raise ValueError(f"NodeAdaptiveCodec: combine must be 'max' or 'scale', got "
                             f"{combine!r}")
        self.combine = combine

    def __repr__(self) -> str:
        extra = "" if self.header == "float32" else f", header={self.header!r}"
        return f"NodeAdaptiveCodec(bits={self.bits}, combine={self.combine!r}{extra})"

    def row_bits(self, levels: Tensor) -> Tensor:
        r"""Bits of every row from its node's level (``-1``, a node never sent, counts as
        level 0)."""
        k = levels.to(torch.long).clamp(0, len(LEVEL_BITS) - 1)
        if self.combine == "max":
            table = torch.tensor(LEVEL_BITS, device=levels.device)
            return torch.clamp(table[k], min=self.bits)
        return torch.clamp(self.bits * torch.pow(2, k), max=8)

    def row_bytes(self, levels: Tensor, num_features: int) -> Tensor:
        r"""Wire bytes of every row."""
        bits = self.row_bits(levels)
        return ref.header_bytes(self.header) + (num_features * bits + 7) // 8

    def split_bytes(self, levels: Tensor, counts: Sequence[int], num_features: int) -> List[int]:
        r"""Bytes per peer of rows sent (or received) in plan order, :obj:`counts` rows each."""
        per_row = self.row_bytes(levels, num_features).cpu()
        ends = torch.cumsum(torch.tensor([0] + list(counts)), 0)
        total = torch.cat([torch.zeros(1, dtype=per_row.dtype), torch.cumsum(per_row, 0)])
        return (total[ends[1:]] - total[ends[:-1]]).tolist()

    def _groups(self, levels: Tensor) -> List[Tuple[int, Tensor]]:
        bits = self.row_bits(levels)
        return [(int(b), (bits == b).nonzero().flatten()) for b in torch.unique(bits).tolist()]

    def _offsets(self, levels: Tensor, num_features: int) -> Tensor:
        per_row = self.row_bytes(levels, num_features)
        return torch.cumsum(per_row, 0) - per_row

    def encode_rows(self, rows: Tensor, levels: Tensor, ctx: WireContext) -> Tensor:
        r"""Rows -> one byte stream, each row at its width, in row order."""
        x = rows.detach().to(torch.float32)
        levels = levels.to(x.device)
        offsets = self._offsets(levels, x.size(1))
        total = int(self.row_bytes(levels, x.size(1)).sum()) if levels.numel() else 0
        out = torch.empty(total, dtype=torch.uint8, device=x.device)
        for bits, index in self._groups(levels):
            quantize, _ = self.kernels(x.device)
            # One random stream per width class (a distinct key), so classes are independent.
            key = ref.stream_key(_with_suffix(ctx, bits))
            wire = quantize(x.index_select(0, index).contiguous(), bits, self.stochastic, key)
            width = wire.size(1)
            where = offsets[index].unsqueeze(1) + torch.arange(width, device=x.device)
            out[where.reshape(-1)] = wire.reshape(-1)
        return out

    def decode_rows(self, stream: Tensor, levels: Tensor, ctx: WireContext) -> Tensor:
        r"""The inverse of :meth:`encode_rows` for rows whose levels the receiver knows."""
        f = ctx.num_features
        levels = levels.to(stream.device)
        offsets = self._offsets(levels, f)
        out = torch.empty(levels.numel(), f, dtype=torch.float32, device=stream.device)
        for bits, index in self._groups(levels):
            width = ref.wire_width(f, bits, self.header)
            where = offsets[index].unsqueeze(1) + torch.arange(width, device=stream.device)
            wire = stream[where.reshape(-1)].view(-1, width)
            _, dequantize = self.kernels(stream.device)
            out[index] = dequantize(wire.contiguous(), bits, f)
        return out if ctx.dtype == torch.float32 else out.to(ctx.dtype)


def _with_suffix(ctx: WireContext, bits: int) -> WireContext:
    return WireContext(f"{ctx.key}#b{bits}", ctx.direction, ctx.step, ctx.rank,
                       ctx.num_features, ctx.dtype, ctx.seed)
