r"""Adaptive halo cache (CDFGNN, Alg. 2, translated to the edge-cut halo exchange).

Every exchange point keeps, per direction, what the other ranks hold of the rows it sends
(the sender's *mirror*) and the rows it holds of theirs (the receiver's *cache*).  In training,
a row is sent again only when it moved by more than :math:`\epsilon` relative to its size,

.. math::
    e_k = \frac{\lVert x_k - R_k \rVert_\infty}{\max(\lVert x_k \rVert_\infty, 10^{-12})}
    > \epsilon,

or when it has not been sent for :obj:`max_age` exchanges (CDFGNN's staleness is unbounded;
the design spec, §C4.4, bounds it).  The first exchange of a point sends every row.  A lossless
codec sends the row itself and the receiver overwrites its copy; a lossy codec sends the
*delta* :math:`x_k - R_k` and both ends add what the wire carried (error feedback: the sender
decodes its own wire, so its mirror equals the receiver's cache bit for bit and the quantization
error is resent, not accumulated).  Layers use the cache for every halo row as if it were
current (straight-through); its gradients still reach the owner.

Which rows travel is the sender's decision alone; the receiver learns it from a bitmask
(:math:`\lceil n/8 \rceil` bytes per peer for :math:`n` rows, counted with the other bytes)
sent before the rows, so ranks may skip different numbers of rows, zero included, and every
collective still matches.  Evaluation and prediction (no gradient, or a layer in eval mode)
always exchange fresh rows and leave the cache as it is.  With :math:`\epsilon = 0` only rows
that did not change at all are skipped: training stays exact.
"""
import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

__all__ = ["HaloCache", "CacheState", "select_rows", "row_change", "pack_mask", "unpack_mask",
           "mask_bytes", "per_peer"]

DIRECTIONS = ("forward", "backward")


class HaloCache:
    r"""Settings of the adaptive halo cache of an :class:`~.policy.ExchangePolicy`.

    Args:
        epsilon (float): Relative change (infinity norm) above which a row is sent again;
            ``0`` sends every row that changed (exact).  A callback
            (:class:`~lightning_fullgraph.callbacks.AdaptiveCacheThreshold`) may change it
            between epochs, the same on every rank.
        max_age (int): A row is sent at the latest after this many exchanges without it
            (bounded staleness).
        directions (Sequence[str]): ``"forward"`` (rows), ``"backward"`` (gradients) or both.
        budgeted (bool): One collective per exchange instead of two: each rank sends each
            peer exactly the number of rows it announced in the previous exchange, the most
            changed ones, with the bitmask and the next budget in the same buffer
            (:meth:`~.exchange.HaloExchange._send_budgeted`).  It saves the bitmask's round
            trip; in exchange a row over the threshold may wait while more rows moved than
            the budget allows (:obj:`max_age` still bounds every row).  Lossy caches
            (:math:`\epsilon > 0`) with fixed-width codecs and without boundary sampling; the
            others keep the bitmask's own collective. (default: :obj:`False`)
    """

    def __init__(self, epsilon: float = 0.01, max_age: int = 20,
                 directions: Sequence[str] = DIRECTIONS, budgeted: bool = False) -> None:
        self.budgeted = bool(budgeted)
        self.epsilon = epsilon
        if int(max_age) < 1:
            raise ValueError(f"HaloCache: max_age must be at least 1, got {max_age}")
        self.max_age = int(max_age)
        directions = tuple(directions)
        if not directions or any(d not in DIRECTIONS for d in directions):
            raise ValueError(f"HaloCache: directions must be taken from {DIRECTIONS}, got "
                             f"{directions}")
        self.directions = directions

    @property
    def epsilon(self) -> float:
        return self._epsilon

    @epsilon.setter
    def epsilon(self, value: float) -> None:
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"HaloCache: epsilon must be a finite number >= 0, got {value}")
        self._epsilon = value

    @classmethod
    def of(cls, value: Union[None, bool, str, float, "HaloCache"]) -> Optional["HaloCache"]:
        r"""A cache from ``None``/``False``/``"none"`` (no cache), ``True``/``"adaptive"``
        (the defaults), a number (:obj:`epsilon`) or a :class:`HaloCache`."""
        if value is None or value is False:
            return None
        if isinstance(value, HaloCache):
            return value
        if value is True:
            return cls()
        if isinstance(value, str):
            text = value.strip().lower()
            if text in ("none", "off", "no"):
                return None
            if text in ("adaptive", "on", "yes"):
                return cls()
            if text == "budgeted":
                return cls(budgeted=True)
            try:
                return cls(float(text))
            except ValueError:
                raise ValueError(f"unknown cache {value!r}: expected 'none', 'adaptive', a "
                                 "threshold epsilon >= 0 or a HaloCache") from None
        if isinstance(value, (int, float)):
            return cls(float(value))
        raise TypeError(f"expected a HaloCache, a threshold or 'adaptive', got "
                        f"{type(value).__name__}")

    @property
    def lossless(self) -> bool:
        r"""Whether layers see exactly the current rows (:math:`\epsilon = 0`)."""
        return self.epsilon == 0.0

    def applies(self, direction: str) -> bool:
        return direction in self.directions

    def state_dict(self) -> dict:
        return {"epsilon": self.epsilon, "max_age": self.max_age,
                "directions": list(self.directions), "budgeted": self.budgeted}

    def __repr__(self) -> str:
        return f"HaloCache(epsilon={self.epsilon:g}, max_age={self.max_age}, " \
               f"directions={self.directions})"


class CacheState:
    r"""One exchange point's cache on one rank, for one direction.

    Args:
        num_send (int): Rows this rank sends (its mirror's rows).
        num_recv (int): Rows it receives (its cache's rows).
        num_features (int): Width of a row.
        dtype, device: Of the rows.
    """

    def __init__(self, num_send: int, num_recv: int, num_features: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.mirror = torch.zeros(num_send, num_features, dtype=dtype, device=device)
        self.age = torch.zeros(num_send, dtype=torch.long, device=device)
        self.held = torch.zeros(num_recv, num_features, dtype=dtype, device=device)
        # Rows the receiver holds (all after the first exchange, unless boundary sampling
        # kept some out of every exchange so far).
        self.known = torch.zeros(num_send, dtype=torch.bool, device=device)
        self.fresh = True  # nothing exchanged yet: every row goes
        # Rows this rank sends each peer in the next exchange, and receives from each (the
        # budgets of a one-collective exchange, announced a step ahead; None: not in use).
        self.budget: Optional[List[int]] = None
        self.expect: Optional[List[int]] = None

    def matches(self, num_send: int, num_recv: int, num_features: int,
                dtype: torch.dtype) -> bool:
        return (self.mirror.shape == (num_send, num_features)
                and self.held.shape == (num_recv, num_features) and self.mirror.dtype == dtype)


def select_rows(rows: Tensor, mirror: Tensor, age: Tensor, epsilon: float,
                max_age: int) -> Tensor:
    r"""Which rows to send: those that moved by more than :obj:`epsilon` (relative, infinity
    norm) from what the receiver holds, reached :obj:`max_age`, or are not finite (a NaN is
    sent, never hidden behind an old copy)."""
    if rows.size(1) == 0:
        return torch.ones(rows.size(0), dtype=torch.bool, device=rows.device)
    _, change, size = row_change(rows, mirror)
    return (change > epsilon * size) | (age >= max_age) | ~torch.isfinite(change)


def row_change(rows: Tensor, mirror: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    r"""``(rows - mirror, its infinity norm per row, the row's own)``, the last at least
    ``1e-12`` (an all-zero row, dead after a ReLU, divides by it): what :func:`select_rows`
    compares with :math:`\epsilon`."""
    diff = rows - mirror
    return diff, diff.abs().amax(dim=1), rows.abs().amax(dim=1).clamp_min(1e-12)


def mask_bytes(counts: Sequence[int]) -> List[int]:
    r"""Bytes of the bitmask of every peer's :obj:`counts` rows."""
    return [(int(c) + 7) // 8 for c in counts]


def _positions(counts: Sequence[int], device: torch.device) -> Tuple[Tensor, Tensor]:
    r"""Byte and bit of every row of a per-peer bitmask (each peer's bits start a byte)."""
    counts_t = torch.tensor([int(c) for c in counts], dtype=torch.long, device=device)
    starts = torch.cumsum(counts_t, 0) - counts_t
    byte_starts = torch.cumsum(torch.tensor(mask_bytes(counts), dtype=torch.long,
                                            device=device), 0)
    byte_starts = byte_starts - torch.tensor(mask_bytes(counts), dtype=torch.long, device=device)
    peer = torch.repeat_interleave(torch.arange(len(counts), device=device), counts_t)
    pos = torch.arange(int(counts_t.sum()), device=device) - starts[peer]
    return byte_starts[peer] + pos // 8, pos % 8


def pack_mask(mask: Tensor, counts: Sequence[int]) -> Tensor:
    r"""A boolean mask of rows (:obj:`counts` per peer, in order) as per-peer bit fields
    (least significant bit first), :func:`mask_bytes` bytes per peer."""
    out = torch.zeros(sum(mask_bytes(counts)), dtype=torch.int32, device=mask.device)
    if mask.numel():
        byte, bit = _positions(counts, mask.device)
        out.index_add_(0, byte, mask.to(torch.int32) << bit.to(torch.int32))
    return out.to(torch.uint8)


def unpack_mask(packed: Tensor, counts: Sequence[int]) -> Tensor:
    r"""The inverse of :func:`pack_mask`."""
    if sum(int(c) for c in counts) == 0:
        return torch.zeros(0, dtype=torch.bool, device=packed.device)
    byte, bit = _positions(counts, packed.device)
    return ((packed.to(torch.int32)[byte] >> bit.to(torch.int32)) & 1).bool()


def per_peer(mask: Tensor, counts: Sequence[int]) -> List[int]:
    r"""How many rows of each peer's segment the mask keeps."""
    if not mask.numel():
        return [0] * len(counts)
    ends = torch.cumsum(torch.tensor([0] + [int(c) for c in counts]), 0)
    total = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(mask.long().cpu(), 0)])
    return (total[ends[1:]] - total[ends[:-1]]).tolist()
