r"""Wire codecs: what a row looks like while it crosses the network.

A codec turns the rows a rank sends into *self-describing* wire rows and back: everything the
receiver needs to decode (scales, zero points, bit widths) travels inside the wire rows or
follows from the :class:`WireContext` that both ends share (exchange point, direction, step,
seed).  Nothing computed by the sender's ``encode`` is handed to the receiver's ``decode``.
"""
from .base import Codec, WireContext
from .bfloat16 import BFloat16Codec
from .identity import IdentityCodec
from .quantized import QuantizedCodec

__all__ = ["Codec", "WireContext", "IdentityCodec", "QuantizedCodec", "BFloat16Codec"]
