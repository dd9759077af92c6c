"""Wire codecs: what a halo row looks like while it crosses the network.

The exchange never sends a tensor directly; it asks its codec to *encode* the rows
it is about to send and to *decode* what arrived.  The identity codec keeps rows as
they are (exact training).  Lossy codecs (quantization with stochastic rounding and
bit packing) implement the same two methods and plug in without touching the
exchange.  The only rule is that a codec maps ``[rows, width]`` to a wire tensor
that still has one row per halo row, so that ``all_to_all_single`` split sizes
(counted in rows) stay valid.
"""
from typing import Any, Tuple

from torch import Tensor

__all__ = ["Codec", "IdentityCodec"]


class Codec:
    r"""Base class of wire codecs.

    A codec turns the rows a rank sends into a wire tensor and back.  Rows are
    always 2-D (``[rows, features]``); the exchange flattens trailing dimensions.
    """

    #: ``True`` when :meth:`decode` of :meth:`encode` returns the input bit for bit.
    lossless: bool = True

    def encode(self, rows: Tensor, key: str) -> Tuple[Tensor, Any]:
        r"""Encodes rows for sending.

        Args:
            rows (torch.Tensor): Rows to send, shape :math:`[S, F]`.
            key (str): Name of the exchange point (layer and argument); codecs
                with per-layer state (bit width, error feedback) key on it.

        Returns:
            The wire tensor of shape :math:`[S, W]` (any dtype) and a context
            object passed back to :meth:`decode` on the receiving side.
        """
        raise NotImplementedError  # abstract: subclasses define the wire format

    def decode(self, wire: Tensor, ctx: Any, num_features: int, key: str) -> Tensor:
        r"""Decodes received wire rows of shape :math:`[R, W]` into :math:`[R, F]`."""
        raise NotImplementedError  # abstract: subclasses define the wire format


class IdentityCodec(Codec):
    r"""Sends rows unchanged (exact, the default)."""

    lossless = True

    def encode(self, rows: Tensor, key: str) -> Tuple[Tensor, Any]:
        return rows, None

    def decode(self, wire: Tensor, ctx: Any, num_features: int, key: str) -> Tensor:
        return wire
