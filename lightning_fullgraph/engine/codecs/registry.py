r"""Codecs by name, as the strategy, the engine and the CLI accept them (``codec="int2"``).

============  =============================================================  ===========
name          codec                                                          exact
============  =============================================================  ===========
``fp32``      rows as they are (also ``"identity"``, ``"exact"``, ``None``)   yes
``bf16``      :class:`~.bfloat16.BFloat16Codec`                              no
``int8``      :class:`~.quantized.QuantizedCodec` ``(bits=8)``, stochastic   no
``int4``      ``QuantizedCodec(bits=4)``                                     no
``int2``      ``QuantizedCodec(bits=2)``                                     no
``int1``      ``QuantizedCodec(bits=1)``                                     no
``adaptive``  :class:`~.node_adaptive.NodeAdaptiveCodec` ``(bits=1)``:       no
              per-node widths from importance levels (SYLVIE)
``adaptive2`` ``NodeAdaptiveCodec(bits=2)``: the same with a 2-bit floor       no
============  =============================================================  ===========

Suffixes, in any order: ``-nearest`` (``"int2-nearest"``) rounds to the nearest level
instead of stochastically; ``-compact`` (``"int2-compact"``, ``"adaptive-compact"``) sends the
4-byte bfloat16 header instead of the 8-byte float32 one (``header="bfloat16"`` of
:class:`~.quantized.QuantizedCodec`: fewer bytes for narrow rows).
"""
from typing import Any, Optional, Tuple

from .base import Codec
from .identity import IdentityCodec

__all__ = ["CODEC_NAMES", "codec_from_name", "wire_bits"]

#: The names :func:`codec_from_name` accepts (without the ``-nearest`` suffix).
CODEC_NAMES: Tuple[str, ...] = ("fp32", "bf16", "int8", "int4", "int2", "int1", "adaptive",
                                  "adaptive2")
_EXACT = ("fp32", "identity", "exact", "none")


def codec_from_name(name: str) -> Optional[Codec]:
    r"""The codec called :obj:`name` (``None`` for the exact default).

    Raises:
        ValueError: For an unknown name, listing the known ones.
    """
    text = name.strip().lower()
    base, *suffixes = text.split("-")
    rounding = [x for x in suffixes if x in ("nearest", "stochastic")]
    compact = [x for x in suffixes if x == "compact"]
    valid = len(rounding) <= 1 and len(compact) <= 1 \
        and len(rounding) + len(compact) == len(suffixes)
    if base in _EXACT and not suffixes:
        return None
    if base == "bf16" and not suffixes:
        from .bfloat16 import BFloat16Codec
        return BFloat16Codec()
    options = dict(rounding=rounding[0] if rounding else "stochastic",
                   header="bfloat16" if compact else "float32")
    if base in ("adaptive", "adaptive2") and valid:
        from .node_adaptive import NodeAdaptiveCodec
        # The digit is the base width b_t: the floor of every node's width.
        return NodeAdaptiveCodec(2 if base == "adaptive2" else 1, **options)
    if base.startswith("int") and base[3:] in ("1", "2", "4", "8") and valid:
        from .quantized import QuantizedCodec
        return QuantizedCodec(int(base[3:]), **options)
    raise ValueError(f"unknown codec {name!r}: expected one of {', '.join(CODEC_NAMES)} "
                     "(int* and adaptive* also with the suffixes '-nearest' and '-compact', "
                     "e.g. 'int2-nearest', 'int2-compact'), a Codec or an ExchangePolicy")


def wire_bits(codec: Any, dtype_bits: int = 32) -> float:
    r"""Bits per feature a codec puts on the wire (headers aside): its ``bits``, 16 for
    bfloat16, the row dtype's width for the exact codec."""
    if codec is None or isinstance(codec, IdentityCodec):
        return float(dtype_bits)
    bits = getattr(codec, "bits", None)
    if bits is not None:
        return float(bits)
    from .bfloat16 import BFloat16Codec
    return 16.0 if isinstance(codec, BFloat16Codec) else float(dtype_bits)
