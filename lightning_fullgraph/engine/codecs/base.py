r"""The codec contract and the context both ends of an exchange share."""
import hashlib
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

__all__ = ["Codec", "WireContext"]


@dataclass(frozen=True)
class WireContext:
    r"""What both ends of one exchange know without communicating.

    Args:
        key (str): Exchange point (layer, call and argument), e.g. ``"conv1.propagate0.x"``.
        direction (str): ``"forward"`` (rows) or ``"backward"`` (gradients).
        step (int): Training step (the engine counts forward passes).
        rank (int): Rank that *encodes* (the sender).
        num_features (int): Width :math:`F` of a decoded row.
        dtype (torch.dtype): dtype of the decoded rows.
        seed (int): Seed shared by all ranks (for stochastic codecs).
    """

    key: str
    direction: str
    step: int
    rank: int
    num_features: int
    dtype: torch.dtype
    seed: int = 0

    def generator(self, device: Optional[torch.device] = None) -> torch.Generator:
        r"""A generator seeded by ``(seed, step, key, direction, rank)``: the same draws for
        a given run, rank and step however often it is asked for, on every process."""
        text = f"{self.seed}|{self.step}|{self.key}|{self.direction}|{self.rank}".encode()
        value = int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")
        gen = torch.Generator(device=device if device is not None else "cpu")
        gen.manual_seed(value & ((1 << 63) - 1))
        return gen


class Codec:
    r"""Base class of wire codecs.

    Rows are always 2-D (``[rows, features]``; the exchange flattens trailing dimensions).
    A wire row may have any dtype and width, but one wire row encodes one row, and
    :meth:`decode` must rebuild rows from the wire rows and the shared
    :class:`WireContext` alone.
    """

    #: ``True`` when :meth:`decode` of :meth:`encode` returns the input bit for bit.
    lossless: bool = True

    def encode(self, rows: Tensor, ctx: WireContext) -> Tensor:
        r"""Encodes rows for sending.

        Args:
            rows (torch.Tensor): Rows to send, shape :math:`[S, F]`.
            ctx (WireContext): The exchange being encoded.

        Returns:
            Wire rows, shape :math:`[S, W]` (any dtype).
        """
        raise NotImplementedError  # abstract: subclasses define the wire format

    def decode(self, wire: Tensor, ctx: WireContext) -> Tensor:
        r"""Decodes received wire rows :math:`[R, W]` into rows :math:`[R, F]`."""
        raise NotImplementedError  # abstract: subclasses define the wire format

    def wire_bytes(self, num_rows: int, num_features: int, dtype: torch.dtype) -> int:
        r"""Bytes on the wire for :obj:`num_rows` rows of :obj:`num_features` (for planning)."""
        probe = self.encode(torch.zeros(1, num_features, dtype=dtype),
                            WireContext("probe", "forward", 0, 0, num_features, dtype))
        return num_rows * probe[0].numel() * probe.element_size()
