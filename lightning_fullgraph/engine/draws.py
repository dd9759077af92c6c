r"""Random draws that are pure functions of global node ids: every rank, whatever it owns, and
every device draws the same for the same node, seed and step, with no communication.

A node is drawn when :math:`h(\text{key}, v) < \text{rate} \cdot 2^{32}` for a 32-bit
counter-based hash :math:`h` keyed by a text (e.g. ``"masked-label|seed|step"``), so every node
is drawn independently with probability :obj:`rate` (to :math:`2^{-32}`).  Integer arithmetic
only, in int64 without overflow, so CPU and GPU agree bit for bit.
"""
import hashlib
from typing import Tuple

from torch import Tensor

__all__ = ["node_draws"]

_M32 = 0xFFFFFFFF


def _mul32(x: Tensor, c: int) -> Tensor:
    # (x * c) mod 2^32 for x in [0, 2^32) without int64 overflow (whose wrapping is undefined in
    # C++ and so not promised by every backend): c is split into 16-bit halves.
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _mix32(x: Tensor) -> Tensor:
    # "lowbias32" (C. Wellons' hash prospector): a bijection of 32-bit integers with good
    # avalanche, so neighbouring node ids get unrelated draws.
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _keys(key: str) -> Tuple[int, int]:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest[:4], "little"), int.from_bytes(digest[4:], "little")


def node_draws(ids: Tensor, rate: float, key: str) -> Tensor:
    r"""Which of the nodes :obj:`ids` (global ids :math:`\ge 0`) are drawn under :obj:`key`,
    each with probability :obj:`rate` in :math:`[0, 1]`; a boolean mask like :obj:`ids`."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    k1, k2 = _keys(key)
    ids = ids.long()
    h = _mix32((ids & _M32) ^ k1)
    h = _mix32(h ^ ((ids >> 32) & _M32) ^ k2)
    return h < int(round(rate * (1 << 32)))
